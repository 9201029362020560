"""The sandbox's value types: programs, tests, limits, isolation settings, verdicts."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Sequence

from agentic_grpo.sandbox import values

# Isolation levels, weakest first (see `isolation.py`).
ISOLATION_LEVELS = ("hook", "landlock", "namespaces")


class Verdict(enum.StrEnum):
  """Outcome of one program run.

  PASSED: every test passed. FAILED: it ran to the end but a test failed or
  raised. ERROR: it never ran its tests to the end (exception at module level,
  missing entry point, early exit, crash, or a sandbox failure).
  SYNTAX_ERROR: the source does not compile. TIMEOUT: wall or CPU limit.
  MEMORY_LIMIT: a MemoryError under the address-space cap. OUTPUT_LIMIT:
  stdout/stderr, the report channel or a written file exceeded its cap.
  """
  PASSED = "passed"
  FAILED = "failed"
  ERROR = "error"
  SYNTAX_ERROR = "syntax_error"
  TIMEOUT = "timeout"
  MEMORY_LIMIT = "memory_limit"
  OUTPUT_LIMIT = "output_limit"


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits for one program run (all tests together).

  Attributes:
    cpu_seconds: CPU time per process (RLIMIT_CPU, rounded up to whole
      seconds): SIGXCPU ends the process at the limit, SIGKILL one second
      later if it ignores SIGXCPU; either gives TIMEOUT.
    wall_seconds: wall-clock deadline for the whole run, from fork to exit.
    memory_bytes: address-space cap per process (RLIMIT_AS).
    file_size_bytes: largest file the program may write (RLIMIT_FSIZE).
    max_processes: processes and threads the program may have at once
      (RLIMIT_NPROC on a per-sandbox uid or user namespace).
    output_bytes: stdout plus stderr; more ends the run with OUTPUT_LIMIT.
    result_bytes: the encoded return values of all I/O tests together.
    stdio_budget_seconds: wall-clock seconds for all tests of one stdin/stdout
      job (`StdioProgram.budget_seconds`, which each test's own deadline cannot
      bound: a program that loops would cost a deadline per test), given to the
      stdio jobs scored by a fraction of tests (`sandbox.execution.program`); None:
      no budget. A `Program`'s tests share one process, so `wall_seconds` is
      already the budget of its whole job.
  """
  cpu_seconds: float = 2.0
  wall_seconds: float = 5.0
  memory_bytes: int = 512 * 2**20
  file_size_bytes: int = 2**20
  max_processes: int = 8
  output_bytes: int = 64 * 2**10
  result_bytes: int = 2**20
  stdio_budget_seconds: float | None = None

  def __post_init__(self):
    for name in ("cpu_seconds", "wall_seconds"):
      value = getattr(self, name)
      if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"Limits.{name} must be a positive finite number, got {value!r}")
    for name in ("memory_bytes", "file_size_bytes", "max_processes", "output_bytes",
                 "result_bytes"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
    budget = self.stdio_budget_seconds
    if budget is not None and (not isinstance(budget, (int, float)) or isinstance(budget, bool)
                               or not math.isfinite(budget) or budget <= 0):
      raise ValueError(f"Limits.stdio_budget_seconds must be None or a positive finite number, "
                       f"got {budget!r}")
    if self.memory_bytes < 64 * 2**20:
      raise ValueError(f"Limits.memory_bytes must be at least 64 MiB (the interpreter "
                       f"needs it), got {self.memory_bytes!r}")


@dataclasses.dataclass(frozen=True)
class Isolation:
  """How strongly programs are isolated; the defaults take what the OS allows.

  The level in force is the strongest available of `ISOLATION_LEVELS` (see
  `isolation.py`): "namespaces" (a minimal read-only root in new PID,
  network, mount, IPC and UTS namespaces), "landlock" (kernel file-system
  confinement without namespaces) or "hook" (audit hook and rlimits only).

  Attributes:
    namespaces: None: use namespaces when available; True: required
      (`SandboxPool` raises RuntimeError if unavailable); False: never (tests
      of the weaker levels).
    landlock: the same for Landlock, used when namespaces are not.
    drop_privileges: run programs under a per-worker uid without groups.
      None: when running as root outside a user namespace; True: required.
    disk_bytes: size of the tmpfs holding a worker's working directories and
      of its /tmp (namespaces; /var/tmp, /dev/shm and /run get 1/8 of it).
    python: interpreter for the sandbox (default `sys.executable`).
    min_level: the weakest level a pool accepts; a weaker machine makes
      `SandboxPool` raise RuntimeError.
    audit_hook: install the runner's audit hook (always, in production).
      False only in tests that check the OS-level confinement by itself; it
      needs "namespaces" or "landlock".
  """
  namespaces: bool | None = None
  landlock: bool | None = None
  drop_privileges: bool | None = None
  disk_bytes: int = 64 * 2**20
  python: str | None = None
  min_level: str = "hook"
  audit_hook: bool = True

  def __post_init__(self):
    for name in ("namespaces", "landlock", "drop_privileges"):
      value = getattr(self, name)
      if value not in (None, True, False):
        raise ValueError(f"Isolation.{name} must be None, True or False, got {value!r}")
    if not isinstance(self.disk_bytes, int) or self.disk_bytes < 2**20:
      raise ValueError(f"Isolation.disk_bytes must be an int >= 1 MiB, got {self.disk_bytes!r}")
    if self.min_level not in ISOLATION_LEVELS:
      raise ValueError(f"Isolation.min_level must be one of {ISOLATION_LEVELS}, got "
                       f"{self.min_level!r}")
    if self.audit_hook not in (True, False):
      raise ValueError(f"Isolation.audit_hook must be a bool, got {self.audit_hook!r}")


@dataclasses.dataclass(frozen=True)
class IOTest:
  """One call test: `entry_point(*args)` must return `expected`.

  Attributes:
    args: positional arguments, plain literals (None, bool, int, float,
      complex, str, bytes, list, tuple, set, frozenset, dict; no subclasses).
    expected: the expected return value, a plain literal; it never enters
      the sandbox.
    equality: "strict" compares with `tasks.literals.values_equal` (type-
      strict, `1 != 1.0 != True`); "python" with `==` of the decoded value,
      as the assertion `assert f(*args) == expected` it came from would (both
      sides are plain literals of builtin types, so `==` runs no untrusted
      code).
  """
  args: tuple
  expected: Any
  equality: str = "strict"

  def __post_init__(self):
    if self.equality not in ("strict", "python"):
      raise ValueError(f"IOTest.equality must be 'strict' or 'python', got {self.equality!r}")
    if isinstance(self.args, list):
      object.__setattr__(self, "args", tuple(self.args))
    if type(self.args) is not tuple:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(f"IOTest.args must be a tuple, got {type(self.args).__name__}")
    values.check_plain(self.args, "IOTest.args")
    values.check_plain(self.expected, "IOTest.expected")


@dataclasses.dataclass(frozen=True)
class Program:
  """An untrusted program and its tests.

  Attributes:
    source: Python source defining `entry_point` (and anything else).
    entry_point: name of the function under test.
    io_tests: call tests, see `IOTest`.
    script_test: trusted test code, run after the I/O tests in a separate
      process that never ran the program: fresh globals holding only the
      names `script_context` defines and `entry_point`, bound to a proxy of
      the candidate (arguments and return values must be plain literals; an
      exception in the candidate is raised again by the proxy, as the same
      builtin exception type or RuntimeError), its own builtins and its own
      modules. None of the program's names, patched builtins or patched
      modules reach it. It passes when it runs to the end and, if
      `check_function` is set, `check_function(candidate)` returns.
    check_function: name of the function `script_test` must define and that
      is called with the candidate (HumanEval: "check"). None for assert-only
      tests (MBPP).
    script_context: trusted source run in the test's globals before
      `script_test` (HumanEval: the prompt's imports and helper functions,
      such as `poly` or `encode_cyclic` that checks call), or None.
  """
  source: str
  entry_point: str
  io_tests: Sequence[IOTest] = ()
  script_test: str | None = None
  check_function: str | None = "check"
  script_context: str | None = None

  def __post_init__(self):
    if not isinstance(self.source, str):
      raise ValueError(f"Program.source must be a str, got {type(self.source).__name__}")
    if not isinstance(self.entry_point, str) or not self.entry_point.isidentifier():
      raise ValueError(f"Program.entry_point must be an identifier, got {self.entry_point!r}")
    tests = tuple(self.io_tests)
    for i, t in enumerate(tests):
      if not isinstance(t, IOTest):
        raise ValueError(f"Program.io_tests[{i}] must be an IOTest, got {type(t).__name__}")
    object.__setattr__(self, "io_tests", tests)
    if self.script_test is not None and not isinstance(self.script_test, str):
      raise ValueError(f"Program.script_test must be a str or None, got "
                       f"{type(self.script_test).__name__}")
    if self.script_context is not None and not isinstance(self.script_context, str):
      raise ValueError(f"Program.script_context must be a str or None, got "
                       f"{type(self.script_context).__name__}")
    if self.check_function is not None and (not isinstance(self.check_function, str) or
                                            not self.check_function.isidentifier()):
      raise ValueError(f"Program.check_function must be an identifier or None, got "
                       f"{self.check_function!r}")


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What one program run produced.

  Attributes:
    verdict: see `Verdict`.
    passed: per I/O test, whether it returned the expected value.
    num_passed: passed I/O tests, plus 1 if the script test passed.
    num_tests: I/O tests, plus 1 if there is a script test.
    outputs: per I/O test, the decoded return value (None where the call
      raised or its value could not be reported).
    output_tail: the last few KiB of stdout and stderr (UTF-8, replaced).
    wall_seconds: wall time from submission to the sandbox until its report.
    error: the first error message (exception at module level or in a test,
      limit hit, crash), or None.
    script_passed: whether the script test passed; None without one.
    test_errors: per I/O test, the exception the call raised, or None.
    cpu_seconds: CPU time of the program's main process.
  """
  verdict: Verdict
  passed: tuple[bool, ...]
  num_passed: int
  num_tests: int
  outputs: tuple[Any, ...]
  output_tail: str
  wall_seconds: float
  error: str | None
  script_passed: bool | None = None
  test_errors: tuple[str | None, ...] = ()
  cpu_seconds: float = 0.0
