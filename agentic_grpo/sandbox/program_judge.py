"""The judge of a `Program`: the job a worker runs for it and the verdict from the report.

`job` is what the server reads: the source, the I/O tests' arguments (never their expected
values), the script test, the limits and a per-run nonce. `assemble` reads the server's report
back in the trusted parent: only lines tagged with the nonce count (anything else was written
by the program, or cut off), a return value is decoded only as a plain literal
(`values.decode`) and compared here with the expected one (`IOTest.equality`), and the
verdict follows from the report, the server's reason and the exit status, in a fixed order of
precedence (syntax, output limit, time, memory, harness failure, load error, missing entry
point, early end, pass or fail). `stdio` is the same judge for a `StdioProgram`.
"""

from __future__ import annotations

import math
import os
from typing import Any

from agentic_grpo.sandbox import isolation as isolation_lib
from agentic_grpo.sandbox import runner
from agentic_grpo.sandbox import values
from agentic_grpo.sandbox import worker as worker_lib
from agentic_grpo.sandbox.types import Limits, Program, RunResult, Verdict
from agentic_grpo.tasks import literals

_OPEN_FILES = 64


def nproc(limits: Limits, plan: isolation_lib.Plan) -> int:
  """RLIMIT_NPROC of a job's processes (-1: leave it)."""
  if plan.drop_privileges:
    return limits.max_processes
  if plan.user_namespace:
    return limits.max_processes + 2  # unshare and the server share the count
  return -1  # unbounded per sandbox: fork is refused instead


def job(program: Program, limits: Limits, plan: isolation_lib.Plan, nonce: bytes) -> dict:
  """The job dict the server reads (marshal): the program, its test inputs and limits."""
  max_procs = nproc(limits, plan)
  return {
      "nonce": nonce,
      "source": program.source,
      "entry_point": program.entry_point,
      "io_args": [t.args for t in program.io_tests],
      "script_test": program.script_test,
      "check_function": program.check_function,
      "script_context": program.script_context,
      "result_chars": limits.result_bytes,
      "env": dict(isolation_lib.ENV),
      "limits": {
          "cpu": max(1, math.ceil(limits.cpu_seconds)),
          "wall": float(limits.wall_seconds),
          "memory": limits.memory_bytes,
          "fsize": limits.file_size_bytes,
          "nproc": max_procs,
          "nofile": _OPEN_FILES,
          "output": limits.output_bytes,
          "report": limits.result_bytes + 4096 + 1024 * len(program.io_tests),
      },
  }


def _equal(value: Any, test) -> bool:
  """Whether a decoded return value passes `test` (see `IOTest.equality`)."""
  if test.equality == "python":
    try:
      return bool(value == test.expected)
    except RecursionError:
      return False
  return literals.values_equal(value, test.expected)


# Long by design: one pass over the server's report records, each checked against the nonce and the
# program's tests in order; splitting it would spread the trust checks over several functions.
def assemble(program: Program, limits: Limits, raw: worker_lib.Raw, nonce: bytes,
             wall: float) -> RunResult:
  """Turns the server's raw report into a RunResult (all checks happen here)."""
  n_io = len(program.io_tests)
  passed = [False] * n_io
  outputs: list[Any] = [None] * n_io
  test_errors: list[str | None] = [None] * n_io
  seen = [False] * n_io
  syntax = load_error = entry_error = internal = None
  kinds = set()
  script_passed = None if program.script_test is None else False
  script_error = None
  done = False
  prefix = nonce + b" "
  for line in raw.report.split(b"\n"):
    if not line.startswith(prefix):
      continue  # Unauthenticated: written by the program, or cut off.
    parts = line[len(prefix):].split(b" ")
    tag = parts[0]
    try:
      if tag == b"S":
        syntax = worker_lib.unhex(parts[1])
      elif tag == b"L":
        kinds.add(parts[1].decode())
        load_error = worker_lib.unhex(parts[2])
      elif tag == b"N":
        entry_error = worker_lib.unhex(parts[1])
      elif tag == b"I":
        internal = worker_lib.unhex(parts[1])
      elif tag in (b"R", b"X"):
        i = int(parts[1])
        if not 0 <= i < n_io or seen[i]:
          continue
        seen[i] = True
        if tag == b"R":
          value = values.decode(parts[2])
          outputs[i] = value
          passed[i] = _equal(value, program.io_tests[i])
        else:
          kind = parts[2].decode()
          kinds.add(kind)
          test_errors[i] = worker_lib.unhex(parts[3])
      elif tag == b"C":
        script_passed = program.script_test is not None
      elif tag == b"F":
        kinds.add(parts[1].decode())
        script_error = worker_lib.unhex(parts[2])
      elif tag == b"D":
        done = True
    except (IndexError, ValueError, UnicodeDecodeError, RecursionError, TypeError) as e:
      internal = internal or f"malformed report line: {e}"
  num_passed = sum(passed) + bool(script_passed)
  num_tests = n_io + (program.script_test is not None)
  first_test_error = next((e for e in test_errors if e is not None), None)
  status = raw.status
  if os.WIFSIGNALED(status):
    exit_text = f"killed by signal {os.WTERMSIG(status)}"
  elif os.WIFEXITED(status):
    exit_text = f"exit status {os.WEXITSTATUS(status)}"
  else:
    exit_text = f"wait status {status}"
  error = None
  if syntax is not None:
    verdict, error = Verdict.SYNTAX_ERROR, syntax
  elif raw.reason in (runner.REASON_OUTPUT, runner.REASON_REPORT):
    verdict = Verdict.OUTPUT_LIMIT
    error = ("output exceeded %d bytes" % limits.output_bytes
             if raw.reason == runner.REASON_OUTPUT else
             "reported results exceeded %d bytes" % limits.result_bytes)
  elif runner.KIND_OUTPUT in kinds:
    verdict = Verdict.OUTPUT_LIMIT
    error = "file size limit of %d bytes exceeded" % limits.file_size_bytes
  elif raw.reason == runner.REASON_DEADLINE:
    verdict, error = Verdict.TIMEOUT, "wall-clock limit of %gs exceeded" % limits.wall_seconds
  elif raw.reason == runner.REASON_CPU:
    verdict, error = Verdict.TIMEOUT, "CPU limit of %gs exceeded" % limits.cpu_seconds
  elif runner.KIND_MEMORY in kinds:
    verdict = Verdict.MEMORY_LIMIT
    error = load_error or script_error or first_test_error or "MemoryError"
  elif raw.reason == runner.REASON_SPAWN:
    verdict, error = Verdict.ERROR, "sandbox could not start the program: " + raw.message
  elif internal is not None:
    verdict, error = Verdict.ERROR, "sandbox harness failed: " + internal
  elif load_error is not None:
    verdict, error = Verdict.ERROR, load_error
  elif entry_error is not None:
    verdict, error = Verdict.ERROR, entry_error
  elif not done:
    verdict = Verdict.ERROR
    error = f"the program ended before its tests finished ({exit_text})"
  elif num_passed == num_tests:
    verdict = Verdict.PASSED
  else:
    verdict = Verdict.FAILED
    error = first_test_error or script_error
  return RunResult(
      verdict=verdict,
      passed=tuple(passed),
      num_passed=num_passed,
      num_tests=num_tests,
      outputs=tuple(outputs),
      output_tail=raw.tail.decode("utf-8", "replace"),
      wall_seconds=wall,
      error=error,
      script_passed=script_passed,
      test_errors=tuple(test_errors),
      cpu_seconds=raw.cpu,
  )


def error_result(program: Program, message: str, wall: float) -> RunResult:
  """The ERROR result of a program the sandbox machinery failed to run (`message` says why)."""
  n_io = len(program.io_tests)
  return RunResult(
      verdict=Verdict.ERROR, passed=(False,) * n_io, num_passed=0,
      num_tests=n_io + (program.script_test is not None), outputs=(None,) * n_io,
      output_tail="", wall_seconds=wall, error=message,
      script_passed=None if program.script_test is None else False,
      test_errors=(None,) * n_io)
