"""Sandboxed execution of untrusted Python programs, with typed verdicts.

Rewards come from running model-written code, so the code runs outside the
trainer process, under OS limits, and is judged on evidence it cannot fake:

* **I/O tests** (`IOTest`): only the arguments enter the sandbox. It calls the
  entry point and reports the return value, encoded in the sandbox only if it
  is a plain literal of exact builtin types; the trusted parent decodes it
  and compares with the expected value type-strictly (`1 != 1.0 != True`).
  An object with a rigged `__eq__` never leaves the sandbox.
* **Script tests** (HumanEval's `check(candidate)`, MBPP's `assert` lines):
  a pass needs positive evidence, a report line tagged with a per-run nonce
  that the harness writes only after the test code returned. Exit status 0,
  `sys.exit(0)` or `os._exit(0)` before that count as errors. The candidate
  handed to the test must return plain literals, and the test runs with a
  pristine copy of the builtins.

Each program runs in a forked child of a per-worker server process
(`sandbox_runner.py`), which, where the OS allows, is PID 1 of new PID,
network, mount, IPC and UTS namespaces (util-linux `unshare`; a user namespace
as well when not root). The child gets: a new session; a fresh working
directory on a size-capped tmpfs; a scrubbed environment; rlimits on CPU
seconds, address space, file size, open files and processes; a per-worker uid
when running as root; and a PEP 578 audit hook that refuses file access
outside its working directory, sockets, exec/spawn, ctypes and frame or gc
introspection. The server enforces the wall-clock deadline and the output
caps, then kills every process the job left (all of its namespace, or all of
its uid) before it reports. Without namespaces the audit hook is the only
network and file barrier (best effort) and `fork` is refused unless the
process count can be bounded per sandbox.

Typical use::

  programs = [Program(source, "add", io_tests=(IOTest((1, 2), 3),))]
  with SandboxPool(max_workers=4) as pool:
    results = pool.map(programs)      # list[RunResult], in order
  results[0].verdict                  # Verdict.PASSED

The pool's threads only wait on pipes, so the pool overlaps with device work
in the trainer process. A failure of the sandbox machinery itself becomes a
`RunResult` with verdict `ERROR`; `map` and futures never raise for it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import json
import marshal
import math
import os
import queue
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Sequence
import weakref

from agentic_grpo.agent import sandbox_runner

_RUNNER_PATH = os.path.abspath(sandbox_runner.__file__)
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_OPEN_FILES = 64
# Extra seconds the parent waits for a server beyond a job's wall limit before
# it declares the server dead (its cleanup takes milliseconds).
_SAFETY_SECONDS = 10.0
_START_SECONDS = 60.0
_MAX_SLOTS = 1024
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)
# Run by /bin/sh as PID 1 of the new namespaces, before the server starts.
# $1: tmpfs size for /tmp (the working directories). $2, $3: when the Python
# installation ($2) sits below a directory other users cannot enter ($3, e.g.
# a 0700 home), cover $3 with an empty tmpfs and bind $2 back at its path, so
# that the sandbox uid can import the standard library and sees nothing else.
_MOUNT_SCRIPT = """\
mount -t tmpfs -o "size=$1,mode=1777,nosuid,nodev,noexec" agentic-sandbox /tmp || exit 97
for d in /var/tmp /dev/shm; do
  [ -d "$d" ] && mount -t tmpfs -o size=1m,mode=1777,nosuid,nodev,noexec agentic-sandbox "$d"
done 2>/dev/null
if [ -n "$3" ]; then
  mkdir /tmp/.prefix && mount --bind "$2" /tmp/.prefix &&
  mount -t tmpfs -o size=1m,mode=0755,nosuid,nodev agentic-sandbox "$3" &&
  mkdir -p "$2" && mount --move /tmp/.prefix "$2" && rmdir /tmp/.prefix || exit 98
fi
shift 3
exec "$@"
"""


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
  """
  cpu_seconds: float = 2.0
  wall_seconds: float = 5.0
  memory_bytes: int = 512 * 2**20
  file_size_bytes: int = 2**20
  max_processes: int = 8
  output_bytes: int = 64 * 2**10
  result_bytes: int = 2**20

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
    if self.memory_bytes < 64 * 2**20:
      raise ValueError(f"Limits.memory_bytes must be at least 64 MiB (the interpreter "
                       f"needs it), got {self.memory_bytes!r}")


@dataclasses.dataclass(frozen=True)
class Isolation:
  """How strongly programs are isolated; the defaults take what the OS allows.

  Attributes:
    namespaces: run each pool worker in new PID, network, mount, IPC and UTS
      namespaces (plus a user namespace when not root). None: when available;
      True: required (`SandboxPool` raises RuntimeError if unavailable).
    drop_privileges: run programs under a per-worker uid without groups.
      None: when running as root outside a user namespace; True: required.
    disk_bytes: size of the tmpfs holding a worker's working directories
      (used when a mount namespace is available).
    python: interpreter for the sandbox (default `sys.executable`).
  """
  namespaces: bool | None = None
  drop_privileges: bool | None = None
  disk_bytes: int = 64 * 2**20
  python: str | None = None

  def __post_init__(self):
    for name in ("namespaces", "drop_privileges"):
      value = getattr(self, name)
      if value not in (None, True, False):
        raise ValueError(f"Isolation.{name} must be None, True or False, got {value!r}")
    if not isinstance(self.disk_bytes, int) or self.disk_bytes < 2**20:
      raise ValueError(f"Isolation.disk_bytes must be an int >= 1 MiB, got {self.disk_bytes!r}")


@dataclasses.dataclass(frozen=True)
class IOTest:
  """One call test: `entry_point(*args)` must return `expected`.

  Attributes:
    args: positional arguments, plain literals (None, bool, int, float,
      complex, str, bytes, list, tuple, set, frozenset, dict; no subclasses).
    expected: the expected return value, a plain literal; it never enters
      the sandbox. Compared type-strictly; floats with
      `math.isclose(rel_tol=1e-9, abs_tol=1e-12)`, NaN equal to NaN.
  """
  args: tuple
  expected: Any

  def __post_init__(self):
    if isinstance(self.args, list):
      object.__setattr__(self, "args", tuple(self.args))
    if type(self.args) is not tuple:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(f"IOTest.args must be a tuple, got {type(self.args).__name__}")
    _check_plain(self.args, "IOTest.args")
    _check_plain(self.expected, "IOTest.expected")


@dataclasses.dataclass(frozen=True)
class Program:
  """An untrusted program and its tests.

  Attributes:
    source: Python source defining `entry_point` (and anything else).
    entry_point: name of the function under test.
    io_tests: call tests, see `IOTest`.
    script_test: trusted test code run after the I/O tests in a namespace
      holding the program's names (the entry point wrapped so that it must
      return plain literals) and pristine builtins. It passes when it runs to
      the end and, if `check_function` is set, `check_function(candidate)`
      returns.
    check_function: name of the function `script_test` must define and that
      is called with the candidate (HumanEval: "check"). None for assert-only
      tests (MBPP). Any same-named object from the program is removed first.
  """
  source: str
  entry_point: str
  io_tests: Sequence[IOTest] = ()
  script_test: str | None = None
  check_function: str | None = "check"

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


# --------------------------------------------------------- plain literals
def _check_plain(value, where, depth=0):
  """Raises ValueError unless `value` is a plain literal of exact builtin types."""
  t = type(value)
  if t in _PLAIN_TYPES:
    return
  if depth > sandbox_runner.MAX_DEPTH:
    raise ValueError(f"{where} is nested more than {sandbox_runner.MAX_DEPTH} deep")
  if t in (list, tuple, set, frozenset):
    for x in value:
      _check_plain(x, where, depth + 1)
  elif t is dict:
    for k, x in value.items():
      _check_plain(k, where, depth + 1)
      _check_plain(x, where, depth + 1)
  else:
    raise ValueError(f"{where} must hold only plain literals, found {t.__name__}: {value!r:.80}")


def _decode(node):
  """Tagged JSON from the sandbox -> Python value; ValueError if malformed."""
  if type(node) is not list or not node or type(node[0]) is not str:
    raise ValueError("malformed value")
  tag = node[0]
  if len(node) == 1:
    if tag == "N":
      return None
    if tag == "T":
      return True
    if tag == "F":
      return False
    raise ValueError("malformed value")
  if len(node) != 2:
    raise ValueError("malformed value")
  body = node[1]
  if type(body) is str:
    if tag == "i":
      return int(body)
    if tag == "f":
      return float(body)
    if tag == "c":
      return complex(body)
    if tag == "s":
      return bytes.fromhex(body).decode("utf-8", "surrogatepass")
    if tag == "b":
      return bytes.fromhex(body)
    raise ValueError("malformed value")
  if type(body) is not list:
    raise ValueError("malformed value")
  if tag == "l":
    return [_decode(x) for x in body]
  if tag == "t":
    return tuple(_decode(x) for x in body)
  if tag == "S":
    return {_decode(x) for x in body}
  if tag == "Z":
    return frozenset(_decode(x) for x in body)
  if tag == "d":
    out = {}
    for pair in body:
      if type(pair) is not list or len(pair) != 2:
        raise ValueError("malformed value")
      out[_decode(pair[0])] = _decode(pair[1])
    return out
  raise ValueError("malformed value")


def _canon(x):
  """Exact, hashable, type-tagged form of a plain literal (for sets and keys)."""
  t = type(x)
  if t is float:
    return ("float", "nan" if math.isnan(x) else x)
  if t is complex:
    return ("complex", _canon(x.real), _canon(x.imag))
  if t in (list, tuple):
    return (t.__name__,) + tuple(_canon(v) for v in x)
  if t in (set, frozenset):
    return (t.__name__, frozenset(_canon(v) for v in x))
  if t is dict:
    return ("dict", frozenset((_canon(k), _canon(v)) for k, v in x.items()))
  return (t.__name__, x)


def _float_equal(a, b):
  if math.isnan(a) or math.isnan(b):
    return math.isnan(a) and math.isnan(b)
  return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def values_equal(actual, expected) -> bool:
  """Type-strict equality of plain literals, as used for I/O tests.

  Types must match exactly at every level (`True != 1`, `1 != 1.0`,
  `(1,) != [1]`); floats (and complex parts) compare with
  `math.isclose(rel_tol=1e-9, abs_tol=1e-12)` and NaN equals NaN; set
  elements and dict keys compare exactly.
  """
  ta = type(actual)
  if ta is not type(expected):
    return False
  if ta is float:
    return _float_equal(actual, expected)
  if ta is complex:
    return _float_equal(actual.real, expected.real) and _float_equal(actual.imag, expected.imag)
  if ta in (list, tuple):
    return len(actual) == len(expected) and all(
        values_equal(a, e) for a, e in zip(actual, expected))
  if ta in (set, frozenset):
    return {_canon(v) for v in actual} == {_canon(v) for v in expected}
  if ta is dict:
    if len(actual) != len(expected):
      return False
    exp = {_canon(k): v for k, v in expected.items()}
    for k, v in actual.items():
      ck = _canon(k)
      if ck not in exp or not values_equal(v, exp[ck]):
        return False
    return True
  return actual == expected


# -------------------------------------------------------- isolation plan
@dataclasses.dataclass(frozen=True)
class _Plan:
  prefix: tuple[str, ...]   # unshare (and mount script) command prefix
  namespaces: bool
  user_namespace: bool
  mount: bool
  drop_privileges: bool
  allow_fork: bool
  python: str


_PLANS: dict[Isolation, _Plan] = {}
_PLANS_LOCK = threading.Lock()


def _probe(cmd):
  try:
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=_ENV, timeout=20,
                          check=False).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def _under_tmp(path):
  path = os.path.realpath(path)
  return any(path == d or path.startswith(d + "/") for d in ("/tmp", "/var/tmp", "/dev/shm"))


def _closed_ancestor(path: str) -> str:
  """Topmost proper ancestor of `path` that others cannot traverse, or ''."""
  parts = path.strip("/").split("/")
  for i in range(1, len(parts)):
    ancestor = "/" + "/".join(parts[:i])
    try:
      if not os.stat(ancestor).st_mode & 0o001:
        return ancestor
    except OSError:
      return ""
  return ""


def _make_plan(isolation: Isolation) -> _Plan:
  """Decides (and probes once) what isolation this machine supports."""
  python = isolation.python or sys.executable
  root = os.geteuid() == 0
  prefix: tuple[str, ...] = ()
  namespaces = mount = False
  unshare = shutil.which("unshare", path=_ENV["PATH"])
  if isolation.namespaces is not False and unshare:
    base = (unshare, "--fork", "--pid", "--kill-child", "--net", "--ipc", "--uts")
    if not root:
      base += ("--user", "--map-root-user")
    prefix_dir = os.path.realpath(sys.base_prefix)
    with_mount = base + ("--mount", "/bin/sh", "-c", _MOUNT_SCRIPT, "sandbox-init",
                         str(isolation.disk_bytes), prefix_dir,
                         _closed_ancestor(prefix_dir) if root else "")
    paths_ok = not any(_under_tmp(p) for p in (python, _RUNNER_PATH, sys.base_prefix))
    if paths_ok and _probe(with_mount + ("true",)):
      prefix, namespaces, mount = with_mount, True, True
    elif _probe(base + ("true",)):
      prefix, namespaces = base, True
  if isolation.namespaces and not namespaces:
    raise RuntimeError("Isolation(namespaces=True) but `unshare` cannot create namespaces here")
  user_ns = namespaces and not root
  drop = isolation.drop_privileges
  if drop is None:
    drop = root
  elif drop and not root:
    raise RuntimeError("Isolation(drop_privileges=True) needs the trainer to run as root")
  return _Plan(prefix=prefix, namespaces=namespaces, user_namespace=user_ns, mount=mount,
               drop_privileges=drop, allow_fork=drop or user_ns, python=python)


def _plan_for(isolation: Isolation) -> _Plan:
  with _PLANS_LOCK:
    if isolation not in _PLANS:
      _PLANS[isolation] = _make_plan(isolation)
    return _PLANS[isolation]


# ------------------------------------------------------------ uid slots
_SLOTS_LOCK = threading.Lock()
_FREE_SLOTS: list[int] = []
_NEXT_SLOT = [0]


def _acquire_slot() -> int:
  with _SLOTS_LOCK:
    if _FREE_SLOTS:
      return _FREE_SLOTS.pop()
    if _NEXT_SLOT[0] >= _MAX_SLOTS:
      raise RuntimeError(f"more than {_MAX_SLOTS} sandbox workers in one process")
    _NEXT_SLOT[0] += 1
    return _NEXT_SLOT[0] - 1


def _release_slot(slot: int):
  with _SLOTS_LOCK:
    _FREE_SLOTS.append(slot)


def _slot_uid(slot: int) -> int:
  # Distinct per (process, worker) so that concurrent trainers or test
  # processes on one machine never share a sandbox uid (RLIMIT_NPROC counts
  # per uid, and cleanup may kill every process of the uid).
  return 0x40000000 + ((os.getpid() & 0xFFFFF) << 10) + slot


# --------------------------------------------------------------- worker
class _WorkerFailure(Exception):
  pass


@dataclasses.dataclass
class _Raw:
  status: int
  cpu: float
  reason: str
  out_total: int
  tail: bytes
  report: bytes
  message: str


class _Worker:
  """One sandbox server process (see sandbox_runner.py) and its channel."""

  def __init__(self, plan: _Plan, slot: int, host_root: str, tag: str):
    self.plan = plan
    self.slot = slot
    self.uid = _slot_uid(slot) if plan.drop_privileges else -1
    self.tag = tag
    self.host_root = host_root
    self.proc: subprocess.Popen | None = None
    self.buf = bytearray()
    self.log_path = os.path.join(host_root, f"server-{slot}.log")
    self.ready_info = ""

  # -- process management
  def _alive(self) -> bool:
    if self.proc is None:
      return False
    try:
      return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
      return False

  def start(self):
    if self._alive():
      return
    self.stop()
    root = "/tmp/jobs" if self.plan.mount else os.path.join(self.host_root, f"w{self.slot}")
    cmd = list(self.plan.prefix) + [
        self.plan.python, "-S", "-s", "-B", "-P", _RUNNER_PATH, "--serve", "--root", root,
        "--uid", str(self.uid), "--allow-fork", str(int(self.plan.allow_fork)),
        "--tag", self.tag]
    with open(self.log_path, "ab") as log:
      self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=log, env=_ENV, cwd="/", start_new_session=True,
                                   bufsize=0)
    self.buf.clear()
    line = self._read_line(time.monotonic() + _START_SECONDS)
    if not line.startswith(b"READY"):
      raise _WorkerFailure(f"sandbox server did not start: {line!r} {self._log_tail()}")
    self.ready_info = line.decode("ascii", "replace")

  def stop(self):
    proc, self.proc = self.proc, None
    if proc is None:
      return
    for stream in (proc.stdin, proc.stdout):
      try:
        stream.close()
      except OSError:
        pass
    end = time.monotonic() + 5.0
    while time.monotonic() < end:  # End of input makes the server exit.
      try:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
          break
      except ChildProcessError:
        break
      time.sleep(0.005)
    try:  # The leader is not reaped yet, so its group id cannot be reused.
      os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
      pass
    proc.wait()

  def _log_tail(self) -> str:
    try:
      with open(self.log_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 1000))
        return f.read().decode("utf-8", "replace")
    except OSError:
      return ""

  # -- channel
  def _fill(self, deadline: float):
    fd = self.proc.stdout.fileno()
    timeout = deadline - time.monotonic()
    if timeout <= 0:
      raise _WorkerFailure("sandbox server did not answer in time")
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
      raise _WorkerFailure("sandbox server did not answer in time")
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      raise _WorkerFailure(f"sandbox server exited. {self._log_tail()}")
    self.buf.extend(chunk)

  def _read_line(self, deadline: float) -> bytes:
    while b"\n" not in self.buf:
      if len(self.buf) > 4096:
        raise _WorkerFailure("sandbox server sent a malformed header")
      self._fill(deadline)
    i = self.buf.index(b"\n")
    line = bytes(self.buf[:i])
    del self.buf[:i + 1]
    return line

  def _read_exact(self, n: int, deadline: float) -> bytes:
    while len(self.buf) < n:
      self._fill(deadline)
    data = bytes(self.buf[:n])
    del self.buf[:n]
    return data

  def run(self, job: dict, wall: float) -> _Raw:
    """Runs one job; raises _WorkerFailure (after killing the server) on trouble."""
    try:
      self.start()
      payload = marshal.dumps(job)
      data = b"JOB %d\n" % len(payload) + payload
      fd = self.proc.stdin.fileno()
      view = memoryview(data)
      while view:
        view = view[os.write(fd, view):]
      deadline = time.monotonic() + wall + _SAFETY_SECONDS
      header = self._read_line(deadline).decode("ascii").split(" ")
      if len(header) != 8 or header[0] != "RESULT":
        raise _WorkerFailure(f"sandbox server sent a malformed header: {header!r:.200}")
      status, cpu, reason = int(header[1]), float(header[2]), header[3]
      out_total, tail_len, report_len = int(header[4]), int(header[5]), int(header[6])
      body = self._read_exact(tail_len + report_len, deadline)
      message = "" if header[7] == "-" else _unhex(header[7])
      return _Raw(status, cpu, reason, out_total, body[:tail_len], body[tail_len:], message)
    except (_WorkerFailure, OSError, ValueError) as e:
      self.stop()
      if isinstance(e, _WorkerFailure):
        raise
      raise _WorkerFailure(f"sandbox server failed: {e!r}") from e


def _unhex(text) -> str:
  try:
    return bytes.fromhex(text.decode("ascii") if isinstance(text, bytes) else text).decode(
        "utf-8", "replace")
  except (ValueError, UnicodeDecodeError):
    return "<malformed message>"


# ------------------------------------------------------------- verdicts
def _job(program: Program, limits: Limits, plan: _Plan, nonce: bytes) -> dict:
  if plan.drop_privileges:
    nproc = limits.max_processes
  elif plan.user_namespace:
    nproc = limits.max_processes + 2  # unshare and the server share the count
  else:
    nproc = -1  # unbounded per sandbox: fork is refused instead
  return {
      "nonce": nonce,
      "source": program.source,
      "entry_point": program.entry_point,
      "io_args": [t.args for t in program.io_tests],
      "script_test": program.script_test,
      "check_function": program.check_function,
      "result_chars": limits.result_bytes,
      "env": dict(_ENV),
      "limits": {
          "cpu": max(1, math.ceil(limits.cpu_seconds)),
          "wall": float(limits.wall_seconds),
          "memory": limits.memory_bytes,
          "fsize": limits.file_size_bytes,
          "nproc": nproc,
          "nofile": _OPEN_FILES,
          "output": limits.output_bytes,
          "report": limits.result_bytes + 4096 + 1024 * len(program.io_tests),
      },
  }


def _assemble(program: Program, limits: Limits, raw: _Raw, nonce: bytes,
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
        syntax = _unhex(parts[1])
      elif tag == b"L":
        kinds.add(parts[1].decode())
        load_error = _unhex(parts[2])
      elif tag == b"N":
        entry_error = _unhex(parts[1])
      elif tag == b"I":
        internal = _unhex(parts[1])
      elif tag in (b"R", b"X"):
        i = int(parts[1])
        if not 0 <= i < n_io or seen[i]:
          continue
        seen[i] = True
        if tag == b"R":
          value = _decode(json.loads(parts[2]))
          outputs[i] = value
          passed[i] = values_equal(value, program.io_tests[i].expected)
        else:
          kind = parts[2].decode()
          kinds.add(kind)
          test_errors[i] = _unhex(parts[3])
      elif tag == b"C":
        script_passed = program.script_test is not None
      elif tag == b"F":
        kinds.add(parts[1].decode())
        script_error = _unhex(parts[2])
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
  elif raw.reason in (sandbox_runner.REASON_OUTPUT, sandbox_runner.REASON_REPORT):
    verdict = Verdict.OUTPUT_LIMIT
    error = ("output exceeded %d bytes" % limits.output_bytes
             if raw.reason == sandbox_runner.REASON_OUTPUT else
             "reported results exceeded %d bytes" % limits.result_bytes)
  elif sandbox_runner.KIND_OUTPUT in kinds:
    verdict = Verdict.OUTPUT_LIMIT
    error = "file size limit of %d bytes exceeded" % limits.file_size_bytes
  elif raw.reason == sandbox_runner.REASON_DEADLINE:
    verdict, error = Verdict.TIMEOUT, "wall-clock limit of %gs exceeded" % limits.wall_seconds
  elif raw.reason == sandbox_runner.REASON_CPU:
    verdict, error = Verdict.TIMEOUT, "CPU limit of %gs exceeded" % limits.cpu_seconds
  elif sandbox_runner.KIND_MEMORY in kinds:
    verdict = Verdict.MEMORY_LIMIT
    error = load_error or script_error or first_test_error or "MemoryError"
  elif raw.reason == sandbox_runner.REASON_SPAWN:
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


def _error_result(program: Program, message: str, wall: float) -> RunResult:
  n_io = len(program.io_tests)
  return RunResult(
      verdict=Verdict.ERROR, passed=(False,) * n_io, num_passed=0,
      num_tests=n_io + (program.script_test is not None), outputs=(None,) * n_io,
      output_tail="", wall_seconds=wall, error=message,
      script_passed=None if program.script_test is None else False,
      test_errors=(None,) * n_io)


# ----------------------------------------------------------------- pool
def _shutdown(workers, idle_slots, host_root):
  for w in workers:
    try:
      w.stop()
    except Exception:  # pylint: disable=broad-except
      pass
  for slot in idle_slots:
    _release_slot(slot)
  idle_slots.clear()
  shutil.rmtree(host_root, ignore_errors=True)


class SandboxPool:
  """A bounded pool that runs programs in sandboxes, in parallel.

  Each of `max_workers` threads owns one sandbox server process (started on
  first use, or by `start()`); each program runs in its own forked child of
  that server. Threads only wait on pipes, so work overlaps with JAX in the
  calling process.

  Args:
    max_workers: programs run at once (default: the number of CPUs).
    limits: default `Limits` for programs submitted without their own.
    isolation: see `Isolation`.
    tag: label put on the command line of every sandbox process (default: a
      random one), for auditing leftovers; available as `pool.tag`.

  Raises:
    ValueError: for a bad argument.
    RuntimeError: if `isolation` requires what the machine cannot provide.
  """

  def __init__(self, max_workers: int | None = None, limits: Limits = Limits(), *,
               isolation: Isolation = Isolation(), tag: str | None = None):
    if max_workers is None:
      max_workers = os.cpu_count() or 1
    if not isinstance(max_workers, int) or isinstance(max_workers, bool) or not (
        1 <= max_workers <= _MAX_SLOTS):
      raise ValueError(f"max_workers must be an int in [1, {_MAX_SLOTS}], got {max_workers!r}")
    if not isinstance(limits, Limits):
      raise ValueError(f"limits must be a Limits, got {type(limits).__name__}")
    if not isinstance(isolation, Isolation):
      raise ValueError(f"isolation must be an Isolation, got {type(isolation).__name__}")
    if tag is None:
      tag = "agentic-grpo-sandbox-" + secrets.token_hex(6)
    if not isinstance(tag, str) or not tag or not all(c.isalnum() or c in "-_." for c in tag):
      raise ValueError(f"tag must be a non-empty string of [A-Za-z0-9._-], got {tag!r}")
    self.tag = tag
    self.limits = limits
    self._plan = _plan_for(isolation)
    self._host_root = tempfile.mkdtemp(prefix="agentic-grpo-sandbox-")
    os.chmod(self._host_root, 0o711)
    slots = []
    try:
      for _ in range(max_workers):
        slots.append(_acquire_slot())
    except RuntimeError:
      for s in slots:
        _release_slot(s)
      shutil.rmtree(self._host_root, ignore_errors=True)
      raise
    self._workers = [_Worker(self._plan, s, self._host_root, tag) for s in slots]
    self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
    for w in self._workers:
      self._idle.put(w)
    self._executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=max_workers, thread_name_prefix="sandbox")
    self._closed = False
    self._finalizer = weakref.finalize(self, _shutdown, self._workers, list(slots),
                                       self._host_root)

  @property
  def max_workers(self) -> int:
    return len(self._workers)

  @property
  def isolation_info(self) -> dict[str, bool]:
    """What isolation is in effect (namespaces, mount, privilege drop, fork)."""
    p = self._plan
    return {"namespaces": p.namespaces, "user_namespace": p.user_namespace,
            "tmpfs_workdir": p.mount, "drop_privileges": p.drop_privileges,
            "fork_allowed": p.allow_fork}

  def start(self):
    """Starts every worker's server now (otherwise each starts on first use)."""
    self._check_open()
    workers = [self._idle.get() for _ in self._workers]
    try:
      list(self._executor.map(_try_start, workers))
    finally:
      for w in workers:
        self._idle.put(w)

  def submit(self, program: Program,
             limits: Limits | None = None) -> concurrent.futures.Future[RunResult]:
    """Schedules `program`; the future's result is a RunResult (never raises).

    Raises:
      ValueError: if `program` is not a Program or `limits` not a Limits.
      RuntimeError: if the pool is closed.
    """
    self._check_open()
    if not isinstance(program, Program):
      raise ValueError(f"program must be a Program, got {type(program).__name__}")
    if limits is None:
      limits = self.limits
    if not isinstance(limits, Limits):
      raise ValueError(f"limits must be a Limits or None, got {type(limits).__name__}")
    return self._executor.submit(self._run, program, limits)

  def map(self, programs: Sequence[Program], limits: Limits | None = None) -> list[RunResult]:
    """Runs `programs` in parallel; returns their results in the same order."""
    futures = [self.submit(p, limits) for p in programs]
    return [f.result() for f in futures]

  def close(self):
    """Waits for submitted programs, stops the servers; idempotent."""
    if self._closed:
      return
    self._closed = True
    self._executor.shutdown(wait=True)
    self._finalizer()

  def __enter__(self) -> SandboxPool:
    return self

  def __exit__(self, *exc):
    self.close()

  def _check_open(self):
    if self._closed:
      raise RuntimeError("SandboxPool is closed")

  def _run(self, program: Program, limits: Limits) -> RunResult:
    start = time.monotonic()
    worker = self._idle.get()
    try:
      nonce = secrets.token_hex(16).encode("ascii")
      job = _job(program, limits, self._plan, nonce)
      raw = worker.run(job, limits.wall_seconds)
      return _assemble(program, limits, raw, nonce, time.monotonic() - start)
    except BaseException as e:  # pylint: disable=broad-except
      return _error_result(program, f"sandbox failure: {e}", time.monotonic() - start)
    finally:
      self._idle.put(worker)


def _try_start(worker: _Worker):
  try:
    worker.start()
  except _WorkerFailure:
    pass


def run_program(program: Program, limits: Limits = Limits(), *,
                isolation: Isolation = Isolation()) -> RunResult:
  """Runs one program in a fresh sandbox and blocks until it is judged.

  Starts and stops a one-worker `SandboxPool` (about 0.1-0.3 s of set-up);
  use a pool to run many programs.

  Args:
    program: the program and its tests.
    limits: resource limits.
    isolation: see `Isolation`.

  Returns:
    The RunResult; sandbox failures give verdict ERROR rather than raising.

  Raises:
    ValueError: for a bad argument.
    RuntimeError: if `isolation` requires what the machine cannot provide.
  """
  with SandboxPool(1, limits, isolation=isolation) as pool:
    return pool.submit(program).result()
