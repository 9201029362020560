"""The stdin/stdout judge: competitive-programming programs, their tests and verdicts.

A `StdioProgram` is a whole Python program that reads a test's input on
stdin and writes its answer on stdout. The sandbox runs it once per test,
each time in a fresh process and working directory, under the problem's time
and memory limits, and sends back only what it printed. Expected outputs
never enter the sandbox: `SandboxPool` compares the output with the expected
one here, in the trusted parent, token by token (whitespace-separated tokens,
so spaces, tabs, line breaks and trailing blanks do not matter), optionally
ignoring ASCII case, and optionally comparing tokens that are both numbers by
value (with an absolute and relative tolerance, or exactly: `outputs_match`).

Typical use::

  program = StdioProgram("a, b = map(int, input().split())\\nprint(a + b)",
                         tests=(StdioTest("1 2\\n", "3\\n"),), time_seconds=1.0)
  with SandboxPool(4) as pool:
    [result] = pool.map([program])   # StdioResult; result.verdicts[0] == "passed"
"""

from __future__ import annotations

import dataclasses
import enum
import marshal
import math
import os
import re
from typing import Sequence

from agentic_grpo.sandbox import runner

# The wall-clock deadline of one test: `WALL_FACTOR * time_seconds + WALL_SLACK`
# (a process blocked on nothing but sleep uses no CPU time).
WALL_FACTOR = 2.0
WALL_SLACK = 1.0


class StdioVerdict(enum.StrEnum):
  """Outcome of one test (or of a program: its first test that did not pass).

  PASSED: exited normally and printed the expected tokens. WRONG_ANSWER:
  exited normally, other tokens. TIMEOUT: CPU or wall-clock limit.
  MEMORY_LIMIT: MemoryError, or killed by a signal near the address-space cap.
  RUNTIME_ERROR: an exception, a non-zero exit, a signal, a program that does
  not compile, or a sandbox failure (`StdioResult.error` says which).
  OUTPUT_LIMIT: stdout plus stderr over `output_bytes`.
  SKIPPED: not run: an earlier test ended in an error and the program asked
  `stop_on_error`, or the program's `budget_seconds` ran out first. A skipped
  test counts as not passed.
  """
  PASSED = "passed"
  WRONG_ANSWER = "wrong_answer"
  TIMEOUT = "timeout"
  MEMORY_LIMIT = "memory_limit"
  RUNTIME_ERROR = "runtime_error"
  OUTPUT_LIMIT = "output_limit"
  SKIPPED = "skipped"


@dataclasses.dataclass(frozen=True)
class StdioTest:
  """One stdin/stdout test.

  Attributes:
    input: the bytes (or UTF-8 text) written to the program's stdin.
    expected: the expected output (UTF-8 text); it never enters the sandbox.
  """
  input: str | bytes
  expected: str

  def __post_init__(self):
    if not isinstance(self.input, (str, bytes)):
      raise ValueError(f"StdioTest.input must be str or bytes, got {type(self.input).__name__}")
    if not isinstance(self.expected, str):
      raise ValueError(f"StdioTest.expected must be a str, got {type(self.expected).__name__}")


@dataclasses.dataclass(frozen=True)
class StdioProgram:
  """A program judged on stdin/stdout.

  Attributes:
    source: Python source, run as `__main__` once per test.
    tests: the tests, in order.
    time_seconds: CPU seconds per test (RLIMIT_CPU, rounded up to whole
      seconds; the wall-clock deadline is `WALL_FACTOR * time_seconds +
      WALL_SLACK`).
    memory_bytes: address-space cap per test (RLIMIT_AS), at least 64 MiB.
    output_bytes: stdout plus stderr per test.
    abs_tol, rel_tol: tolerance for output tokens that are both decimal
      numbers, not both integers (`outputs_match`); 0 and 0 compare every
      token exactly (unless `numbers_by_value`).
    ignore_case: compare tokens ignoring ASCII case (`YES` is `yes`).
    numbers_by_value: compare tokens that are both numbers by value even with
      no tolerance (`1.50` is `1.5`; integers still exactly).
    stop_on_error: after a test that timed out, crashed or hit a limit, skip
      the rest (they get SKIPPED); wrong answers never stop the run (the
      sandbox never sees expected outputs). For an all-or-nothing score: it
      changes `num_passed` only of a program that fails anyway.
    budget_seconds: wall-clock seconds for all tests together, or None (each
      test has only its own deadline, so a program that loops costs about
      `len(tests) * wall_seconds`). A test still running when the budget ends
      is killed (TIMEOUT); the tests after it are SKIPPED. A budget under
      `wall_seconds` counts as `wall_seconds` (the first test always gets its
      whole limit): see `budget`.
  """
  source: str
  tests: Sequence[StdioTest]
  time_seconds: float = 2.0
  memory_bytes: int = 256 * 2**20
  output_bytes: int = 2**20
  abs_tol: float = 0.0
  rel_tol: float = 0.0
  ignore_case: bool = False
  numbers_by_value: bool = False
  stop_on_error: bool = False
  budget_seconds: float | None = None

  def __post_init__(self):
    if not isinstance(self.source, str):
      raise ValueError(f"StdioProgram.source must be a str, got {type(self.source).__name__}")
    tests = tuple(self.tests)
    for i, t in enumerate(tests):
      if not isinstance(t, StdioTest):
        raise ValueError(f"StdioProgram.tests[{i}] must be a StdioTest, got {type(t).__name__}")
    if not tests:
      raise ValueError("StdioProgram.tests must not be empty")
    object.__setattr__(self, "tests", tests)
    for name in ("time_seconds", "abs_tol", "rel_tol"):
      value = getattr(self, name)
      if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (
          name == "time_seconds" and value == 0):
        raise ValueError(f"StdioProgram.{name} must be a finite number >= 0 (> 0 for "
                         f"time_seconds), got {value!r}")
    for name in ("ignore_case", "numbers_by_value"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"StdioProgram.{name} must be a bool, got {getattr(self, name)!r}")
    if not isinstance(self.memory_bytes, int) or self.memory_bytes < 64 * 2**20:
      raise ValueError(f"StdioProgram.memory_bytes must be an int >= 64 MiB, got "
                       f"{self.memory_bytes!r}")
    if not isinstance(self.output_bytes, int) or self.output_bytes <= 0:
      raise ValueError(f"StdioProgram.output_bytes must be a positive int, got "
                       f"{self.output_bytes!r}")
    budget = self.budget_seconds
    if budget is not None and (not isinstance(budget, (int, float)) or isinstance(budget, bool)
                               or not math.isfinite(budget) or budget <= 0):
      raise ValueError(f"StdioProgram.budget_seconds must be None or a finite number > 0, "
                       f"got {budget!r}")

  @property
  def wall_seconds(self) -> float:
    """The wall-clock deadline of one test."""
    return WALL_FACTOR * self.time_seconds + WALL_SLACK

  @property
  def budget(self) -> float | None:
    """The job's wall-clock budget in force: `max(budget_seconds, wall_seconds)`, or None."""
    if self.budget_seconds is None:
      return None
    return max(float(self.budget_seconds), self.wall_seconds)

  @property
  def job_seconds(self) -> float:
    """The longest the whole job may run: every test's deadline, or the budget."""
    total = self.wall_seconds * len(self.tests)
    return total if self.budget is None else min(total, self.budget)


@dataclasses.dataclass(frozen=True)
class StdioResult:
  """What one stdin/stdout program run produced.

  Attributes:
    verdict: PASSED if every test passed, else the verdict of the first test
      that did not.
    verdicts: per test.
    num_passed: tests that passed.
    num_tests: len(tests).
    cpu_seconds: per test (0 where skipped).
    wall_seconds: from submission to the sandbox until its report, all tests.
    error: the first error message (exception, exit status, limit), or None.
    output_tail: the last few KiB of stderr of the first test that did not
      pass (or of the last test).
  """
  verdict: StdioVerdict
  verdicts: tuple[StdioVerdict, ...]
  num_passed: int
  num_tests: int
  cpu_seconds: tuple[float, ...]
  wall_seconds: float
  error: str | None
  output_tail: str

  @property
  def passed(self) -> tuple[bool, ...]:
    return tuple(v == StdioVerdict.PASSED for v in self.verdicts)


# ------------------------------------------------------------ comparison
# A decimal number as judges print them (`float()` also takes `1_000`, `inf`, `nan`, padding).
_NUMBER = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(rb"[+-]?\d+")


def _float_token(token: bytes) -> float | None:
  """The value of a decimal number token (`_NUMBER`), None for anything else or non-finite."""
  if _NUMBER.fullmatch(token) is None:
    return None
  value = float(token)
  return value if math.isfinite(value) else None


def _integer_key(token: bytes) -> tuple[bool, bytes]:
  """(negative, digits without leading zeros) of an integer token: equal keys, equal values
  (exact at any length: no `int()`, which refuses over 4300 digits)."""
  digits = token.lstrip(b"+-").lstrip(b"0") or b"0"
  return token.startswith(b"-") and digits != b"0", digits


def _tokens_close(a: bytes, e: bytes, abs_tol: float, rel_tol: float) -> bool:
  """Whether two unequal tokens match under the tolerance: integers exactly, else numbers."""
  if _INTEGER.fullmatch(a) is not None and _INTEGER.fullmatch(e) is not None:
    return _integer_key(a) == _integer_key(e)
  fa, fe = _float_token(a), _float_token(e)
  return fa is not None and fe is not None and math.isclose(fa, fe, rel_tol=rel_tol,
                                                            abs_tol=abs_tol)


def outputs_match(actual: bytes, expected: str, abs_tol: float = 0.0,
                  rel_tol: float = 0.0, *, ignore_case: bool = False,
                  numbers_by_value: bool = False) -> bool:
  """Whether `actual` has the tokens of `expected` (whitespace-separated).

  Args:
    actual: what the program printed (bytes; not decoded, so invalid UTF-8
      simply fails to match).
    expected: the expected output.
    abs_tol, rel_tol: with either > 0, two tokens that are both decimal numbers
      (`[+-]digits[.digits][e[+-]digits]`, finite) match when `math.isclose(a,
      e, rel_tol=rel_tol, abs_tol=abs_tol)`, except that two integers must be
      equal (a tolerance is for real-valued answers: `10**18 + 1` is not
      `10**18`); any other pair of tokens must be byte-equal.
    ignore_case: tokens equal but for ASCII case match (`YES`, `yes`).
    numbers_by_value: two number tokens match when their values are equal
      even with no tolerance (`1.50` and `1.5`, `3.0` and `3`), as with a
      tolerance of 0.

  Returns:
    True when the token sequences have the same length and match pairwise.
  """
  got, want = actual.split(), expected.encode("utf-8").split()
  if len(got) != len(want):
    return False
  tolerant = abs_tol > 0 or rel_tol > 0 or numbers_by_value
  for a, e in zip(got, want):
    if a == e or (ignore_case and a.lower() == e.lower()):
      continue
    if not tolerant:
      return False
    if not _tokens_close(a, e, abs_tol, rel_tol):
      return False
  return True


# ----------------------------------------------------- job and verdicts
def job(program: StdioProgram, nproc: int, env: dict, nonce: bytes) -> dict:
  """The job dict the server reads (marshal): source, inputs and limits, no outputs."""
  return {
      "kind": "stdio",
      "nonce": nonce,
      "source": program.source,
      "inputs": [t.input.encode("utf-8") if isinstance(t.input, str) else bytes(t.input)
                 for t in program.tests],
      "stop_on_error": bool(program.stop_on_error),
      "budget": program.budget,
      "env": env,
      "limits": {
          "cpu": max(1, math.ceil(program.time_seconds)),
          "wall": float(program.wall_seconds),
          "memory": program.memory_bytes,
          "fsize": 2**20,
          "nproc": nproc,
          "nofile": 64,
          "output": program.output_bytes,
          "report": 8192,
      },
  }


def _report(raw: bytes, nonce: bytes) -> tuple[str | None, bytes | None, str | None, bool]:
  """(syntax message, exception kind, exception message, done) from authenticated lines."""
  syntax = kind = message = None
  done = False
  prefix = nonce + b" "
  for line in raw.split(b"\n"):
    if not line.startswith(prefix):
      continue
    parts = line[len(prefix):].split(b" ")
    try:
      if parts[0] == b"S":
        syntax = _unhex(parts[1])
      elif parts[0] in (b"L", b"I"):
        kind = parts[1] if parts[0] == b"L" else b"E"
        message = _unhex(parts[-1])
      elif parts[0] == b"D":
        done = True
    except IndexError:
      continue
  return syntax, kind, message, done


def _unhex(text: bytes) -> str:
  try:
    return bytes.fromhex(text.decode("ascii")).decode("utf-8", "replace")
  except (ValueError, UnicodeDecodeError):
    return "<malformed message>"


def _judge(program: StdioProgram, test: StdioTest, t: dict,
           nonce: bytes) -> tuple[StdioVerdict, str | None]:
  """The verdict of one test from the server's dict for it."""
  reason, status = t["reason"], t["status"]
  if reason == runner.REASON_OUTPUT:
    return StdioVerdict.OUTPUT_LIMIT, f"output exceeded {program.output_bytes} bytes"
  if reason == runner.REASON_BUDGET:
    return StdioVerdict.TIMEOUT, (f"the job's budget of {program.budget:g}s for all "
                                  f"{len(program.tests)} tests ran out")
  if reason in (runner.REASON_DEADLINE, runner.REASON_CPU):
    return StdioVerdict.TIMEOUT, (f"time limit of {program.time_seconds:g}s exceeded"
                                  f" ({'wall clock' if reason == runner.REASON_DEADLINE else 'CPU'})")
  if reason == runner.REASON_SPAWN:
    return StdioVerdict.RUNTIME_ERROR, "sandbox could not start the program"
  syntax, kind, message, done = _report(t["report"], nonce)
  if syntax is not None:
    return StdioVerdict.RUNTIME_ERROR, syntax
  if kind == runner.KIND_MEMORY.encode():
    return StdioVerdict.MEMORY_LIMIT, message
  if kind == runner.KIND_OUTPUT.encode():
    return StdioVerdict.OUTPUT_LIMIT, message
  if kind is not None:
    return StdioVerdict.RUNTIME_ERROR, message
  if os.WIFSIGNALED(status):
    if t["maxrss"] * 1024 >= 0.8 * program.memory_bytes:
      return StdioVerdict.MEMORY_LIMIT, f"killed by signal {os.WTERMSIG(status)} near the cap"
    return StdioVerdict.RUNTIME_ERROR, f"killed by signal {os.WTERMSIG(status)}"
  if not (done or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)):
    return StdioVerdict.RUNTIME_ERROR, f"exit status {os.waitstatus_to_exitcode(status)}"
  if outputs_match(t["stdout"], test.expected, program.abs_tol, program.rel_tol,
                   ignore_case=program.ignore_case, numbers_by_value=program.numbers_by_value):
    return StdioVerdict.PASSED, None
  return StdioVerdict.WRONG_ANSWER, "wrong answer"


def assemble(program: StdioProgram, report: bytes, nonce: bytes, wall: float) -> StdioResult:
  """Turns the server's RESULT report (marshal list of per-test dicts) into a result.

  Raises:
    ValueError: if the report is malformed (the caller turns it into an error result).
  """
  tests = marshal.loads(report)
  if not isinstance(tests, list) or len(tests) > len(program.tests):
    raise ValueError("malformed stdio report")
  verdicts, cpus = [], []
  error = tail = None
  for test, t in zip(program.tests, tests):
    verdict, message = _judge(program, test, t, nonce)
    verdicts.append(verdict)
    cpus.append(float(t["cpu"]))
    if verdict != StdioVerdict.PASSED and error is None:
      error, tail = message, t["tail"]
  skipped = len(program.tests) - len(tests)
  verdicts += [StdioVerdict.SKIPPED] * skipped
  cpus += [0.0] * skipped
  if tail is None:
    tail = tests[-1]["tail"] if tests else b""
  return _result(verdicts, cpus, wall, error, tail.decode("utf-8", "replace"))


def _result(verdicts, cpus, wall, error, tail) -> StdioResult:
  first = next((v for v in verdicts if v != StdioVerdict.PASSED), StdioVerdict.PASSED)
  return StdioResult(verdict=first, verdicts=tuple(verdicts),
                     num_passed=sum(v == StdioVerdict.PASSED for v in verdicts),
                     num_tests=len(verdicts), cpu_seconds=tuple(cpus), wall_seconds=wall,
                     error=error, output_tail=tail)


def error_result(program: StdioProgram, message: str, wall: float) -> StdioResult:
  """Every test RUNTIME_ERROR: the sandbox itself failed."""
  n = len(program.tests)
  return _result([StdioVerdict.RUNTIME_ERROR] * n, [0.0] * n, wall, message, "")
