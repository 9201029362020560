"""Guarded, batched sandbox runs of the workflow: one pool call per stage, errors counted.

Parsers, rewards and the sandbox pool never raise out of the workflow: `Guard` turns an
exception of a per-episode callable into a default value and an error count, and
`run_programs` turns a failed pool call into `None` results (counted once per program).

The one place that knows how a task's kind is judged (`Task.kind`): `program` builds the
sandbox job of code on examples (a `sandbox.Program` calling the entry point of a `function`
task; a `sandbox.StdioProgram` of a `stdio` task, under its limits, the run's sandbox limits by
default), `hidden_program` the final reward's, and `failure_details` reads a result of either
kind for the debug stage's observation. `reference_failures` checks tasks' reference solutions
against their own tests (the loaders' optional check at load time).
"""

import ast
import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

from absl import logging

from agentic_grpo import sandbox
from agentic_grpo.sandbox import check_split
from agentic_grpo.tasks import python_ast
from agentic_grpo.tasks import task as task_lib


class Guard:
  """Runs per-episode callables, turning exceptions into a default and an error count.

  Attributes:
    name: the stage name the errors are counted under (`counts[name]`).
    counts: the shared `Counter` of errors by stage name.
    errors: exceptions caught by this guard.
  """

  def __init__(self, name: str, counts: collections.Counter):
    self.name, self.counts, self.errors = name, counts, 0

  def __call__(self, fn: Callable[[], Any], default: Any) -> Any:
    try:
      return fn()
    except Exception:  # pylint: disable=broad-except
      logging.exception("workflow stage %s: exception in parser/reward", self.name)
      self.counts[self.name] += 1
      self.errors += 1
      return default


def run_programs(pool, programs: Sequence[Optional[sandbox.Program]], guard: Guard
                 ) -> list[Optional[sandbox.RunResult]]:
  """One pool call for the non-None programs; None results where there was no program or the
  pool failed (counted once per program).

  Args:
    pool: anything with `map(programs) -> list[RunResult]` (a `sandbox.SandboxPool`).
    programs: N programs, None where there is nothing to run.
    guard: counts pool failures under its stage name.

  Returns:
    N results, None where there was no program or the pool failed.
  """
  idx = [i for i, p in enumerate(programs) if p is not None]
  out: list[Optional[sandbox.RunResult]] = [None] * len(programs)
  if not idx:
    return out
  try:
    results = pool.map([programs[i] for i in idx])
    if len(results) != len(idx):
      raise RuntimeError(f"pool returned {len(results)} results for {len(idx)} programs")
  except Exception:  # pylint: disable=broad-except
    logging.exception("workflow stage %s: sandbox pool failed", guard.name)
    guard.counts[guard.name] += len(idx)
    guard.errors += len(idx)
    return out
  for i, r in zip(idx, results):
    out[i] = r
  return out


def stdio_tests(examples: Sequence[task_lib.Example]) -> tuple[sandbox.StdioTest, ...]:
  """The stdin/stdout tests of a `stdio` task's examples (`((INPUT,), OUTPUT)`)."""
  return tuple(sandbox.StdioTest(e.args[0], e.expected) for e in examples)


def program(task: task_lib.Task, source: str, examples: Sequence[task_lib.Example], pool=None,
            *, all_or_nothing: bool = False) -> sandbox.Program | sandbox.StdioProgram:
  """The sandbox job of `source` on `examples` of `task`, by the task's kind.

  A `function` task gives a `sandbox.Program` of I/O tests of its entry point; a `stdio` task a
  `sandbox.StdioProgram` of stdin/stdout tests under the task's time and memory limits (those
  it leaves None from `pool.limits`: the run's `config.sandbox`; `sandbox.Limits()` without
  one) and float tolerance. Expected values stay in the trusted parent either way.

  What a program that loops costs is bounded by the way the job is scored (a stdio job runs
  one process per test, each under its own deadline, so without a rule a looping program
  would cost a deadline per test):

  * `all_or_nothing=True` (`reward_mode='all_pass'`, reference checks): `stop_on_error`; the
    first test that times out, crashes or hits a limit ends the job (the rest are SKIPPED).
    The score is 0 either way, so no reward changes; only `num_passed` of a failing program
    may be smaller.
  * a fraction of tests (the default): the job's wall clock is capped at
    `pool.limits.stdio_budget_seconds` (`config.sandbox.job_budget_s`; at least one test's
    deadline); the tests not run count as failed.

  A `Program` (function task) needs neither: its tests share one process under one deadline
  (`Limits.wall_seconds`), whatever their number.

  Raises:
    ValueError: from the program's constructor (e.g. no examples for a stdio task).
  """
  if task.stdio is None:
    return sandbox.Program(source, task.entry_point, io_tests=io_tests(examples))
  spec = task.stdio
  limits = getattr(pool, "limits", None) or sandbox.Limits()
  return sandbox.StdioProgram(
      source, stdio_tests(examples),
      time_seconds=spec.time_seconds if spec.time_seconds is not None else limits.cpu_seconds,
      memory_bytes=spec.memory_bytes if spec.memory_bytes is not None else limits.memory_bytes,
      abs_tol=spec.abs_tol, rel_tol=spec.rel_tol, ignore_case=spec.ignore_case,
      numbers_by_value=spec.numbers_by_value, stop_on_error=all_or_nothing,
      budget_seconds=None if all_or_nothing else limits.stdio_budget_seconds)


def failure_details(result) -> tuple[tuple, tuple]:
  """`(outputs, errors)` per test of a `RunResult` or `StdioResult`, for an observation: a
  stdio run shows no output (it never leaves the judge), only a failed test's verdict."""
  if isinstance(result, sandbox.StdioResult):
    return (), tuple(None if v == sandbox.StdioVerdict.PASSED else v.value
                     for v in result.verdicts)
  return tuple(result.outputs), tuple(result.test_errors)


def io_tests(examples: Sequence[task_lib.Example]) -> tuple[sandbox.IOTest, ...]:
  """The sandbox's I/O tests for task examples."""
  return tuple(sandbox.IOTest(e.args, e.expected) for e in examples)


def _check_function(script: str) -> Optional[str]:
  """`check` if the script defines a top-level `check` (HumanEval), else None (asserts)."""
  try:
    tree = python_ast.parse(script)
  except SyntaxError:
    return None
  defines = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
  return "check" if defines else None


def hidden_program(task: task_lib.Task, source: str, pool=None, *, all_or_nothing: bool = False
                   ) -> sandbox.Program | sandbox.StdioProgram:
  """`source` run on the task's hidden tests (I/O tests, and its hidden script); a `stdio`
  task's program on its hidden stdin/stdout tests (`program`, limits from `pool`, stopping
  early or under a budget by `all_or_nothing`).

  A HumanEval-style `check(candidate)` script is split by
  `check_split.split_check`: its `assert candidate(...) == literal` lines
  become I/O tests compared in the trusted parent, the rest stays a script
  test (none when nothing is left).
  """
  if task.stdio is not None:
    return program(task, source, task.hidden_tests, pool, all_or_nothing=all_or_nothing)
  script = task.hidden_script or None
  tests = io_tests(task.hidden_tests)
  check = _check_function(script) if script else None
  if check is not None:
    converted, script = check_split.split_check(script, check)
    tests += converted
  return sandbox.Program(source, task.entry_point, io_tests=tests, script_test=script,
                         check_function=check if script else None,
                         script_context=(task.code_context or None) if script else None)


def drop_failing_public_examples(tasks: Sequence[task_lib.Task], pool
                                 ) -> list[task_lib.Task]:
  """Tasks without the public examples their own reference solution fails (one pool call).

  Docstring examples of real data sets are sometimes wrong (HumanEval/47's `median` example),
  which would make the code stage's reward punish correct code. Tasks without a reference
  solution or public examples are returned unchanged; so are all tasks if the pool fails.
  """
  programs = [sandbox.Program(t.reference_solution, t.entry_point,
                              io_tests=io_tests(t.public_examples))
              if t.reference_solution is not None and t.public_examples else None
              for t in tasks]
  results = run_programs(pool, programs, Guard("public_examples", collections.Counter()))
  out = []
  for t, r in zip(tasks, results):
    if r is None or len(r.passed) != len(t.public_examples):
      out.append(t)
    else:
      kept = tuple(e for e, ok in zip(t.public_examples, r.passed) if ok)
      out.append(t if len(kept) == len(t.public_examples)
                 else dataclasses.replace(t, public_examples=kept))
  return out


def reference_failures(tasks: Sequence[task_lib.Task], pool) -> list[Optional[str]]:
  """Why each task's reference solution fails its own tests, or None (one pool call).

  A reference is run on the task's hidden tests (and, for a `stdio` task, its public ones
  too: a statement's samples are part of the problem; a function task's docstring examples
  are sometimes wrong, see `drop_failing_public_examples`). None for tasks without a reference
  and, logged, when the sandbox pool fails (the check is then inconclusive).
  """
  def job(t):  # all or nothing: a reference passes every test or its task is dropped
    if t.stdio is not None:
      return program(t, t.reference_solution, t.public_examples + t.hidden_tests, pool,
                     all_or_nothing=True)
    return hidden_program(t, t.reference_solution, pool, all_or_nothing=True)
  guard = Guard("reference_check", collections.Counter())
  programs = [guard(lambda t=t: job(t), None) if t.reference_solution is not None else None
              for t in tasks]
  results = run_programs(pool, programs, guard)
  out = []
  for r in results:
    if r is None or (r.num_tests > 0 and r.num_passed == r.num_tests):
      out.append(None)
    else:
      verdict = getattr(r.verdict, "value", str(r.verdict))
      out.append(f"reference solution fails its own tests: {r.num_passed}/{r.num_tests} "
                 f"passed ({verdict}: {_short(r.error)})")
  return out


def _short(text: Optional[str], limit: int = 120) -> str:
  """`text` (None: "") cut to `limit` characters."""
  text = "" if text is None else str(text)
  return text if len(text) <= limit else text[:limit] + "..."
