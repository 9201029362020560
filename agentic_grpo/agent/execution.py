"""Guarded, batched sandbox runs of the workflow: one pool call per stage, errors counted.

Parsers, rewards and the sandbox pool never raise out of the workflow: `Guard` turns an
exception of a per-episode callable into a default value and an error count, and
`run_programs` turns a failed pool call into `None` results (counted once per program).
"""

import ast
import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

from absl import logging

from agentic_grpo.agent import check_split
from agentic_grpo.agent import sandbox
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


def io_tests(examples: Sequence[task_lib.Example]) -> tuple[sandbox.IOTest, ...]:
  """The sandbox's I/O tests for task examples."""
  return tuple(sandbox.IOTest(e.args, e.expected) for e in examples)


def _check_function(script: str) -> Optional[str]:
  """`check` if the script defines a top-level `check` (HumanEval), else None (asserts)."""
  try:
    tree = ast.parse(script)
  except SyntaxError:
    return None
  defines = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
  return "check" if defines else None


def hidden_program(task: task_lib.Task, source: str) -> sandbox.Program:
  """`source` run on the task's hidden tests (I/O tests, and its hidden script).

  A HumanEval-style `check(candidate)` script is split by
  `check_split.split_check`: its `assert candidate(...) == literal` lines
  become I/O tests compared in the trusted parent, the rest stays a script
  test (none when nothing is left).
  """
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
