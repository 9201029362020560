"""The sandbox pool: runs programs on workers and turns their reports into verdicts.

Rewards come from running model-written code, so the code runs outside the
trainer process, under OS limits, and is judged on evidence it cannot fake:

* **I/O tests** (`IOTest`): only the arguments enter the sandbox. It calls the
  entry point and reports the return value, encoded in the sandbox only if it
  is a plain literal of exact builtin types; the trusted parent decodes it
  and compares with the expected value type-strictly (`1 != 1.0 != True`).
  An object with a rigged `__eq__` never leaves the sandbox.
* **Script tests** (HumanEval's `check(candidate)`, MBPP's `assert` lines):
  a pass needs positive evidence, a report line tagged with a per-run nonce
  that the check process writes only after the test code returned. The test
  runs in a process the program never ran in, against a proxy of the
  candidate that takes and returns plain literals, so names, builtins or
  modules the program redefines or patches cannot reach it. Exit status 0,
  `sys.exit(0)` or `os._exit(0)` of the program count as errors.

Each program runs in forked children of a per-worker server process
(`runner.py`). Where the OS allows, the server is PID 1 of new PID, network,
mount, IPC and UTS namespaces whose root is a minimal read-only view (the
interpreter and its standard library) with private tmpfs working
directories, /tmp, /var/tmp, /dev/shm and /run that are emptied after every
job; otherwise Landlock confines it, or else only the audit hook does (see
`isolation.py`; the level in force is logged and `Isolation.min_level` can
require one). The children get: a new session; a fresh working directory; a
scrubbed environment; rlimits on CPU seconds, address space, file size, open
files and processes; a per-worker uid when running as root; and a PEP 578
audit hook that refuses file access outside their working directory,
sockets, exec/spawn, ctypes and frame or gc introspection. The server
enforces the wall-clock deadline and the output caps, then kills every
process the job left (all of its namespace, or all of its uid) before it
reports.

Typical use::

  programs = [Program(source, "add", io_tests=(IOTest((1, 2), 3),))]
  with SandboxPool(max_workers=4) as pool:
    results = pool.map(programs)      # list[RunResult], in order
  results[0].verdict                  # Verdict.PASSED

The pool starts and recycles the workers and hands each program to one; what
a worker runs and how its report becomes a verdict is the judge's
(`program_judge` for a `Program`, `stdio` for a `StdioProgram`).

The pool's threads only wait on pipes, so the pool overlaps with device work
in the trainer process. A failure of the sandbox machinery itself becomes a
`RunResult` with verdict `ERROR`; `map` and futures never raise for it.

Leftovers. A pool removes its host directory (`agentic-grpo-sandbox-*` in the
temporary directory) when closed or at interpreter exit; a process that is
killed (SIGKILL, the out-of-memory killer, `os._exit` after a peer failure)
cannot. Each host directory names its owner (pid, start time and PID namespace, `.owner`),
and every new pool first removes the directories of owners that are gone
(`sweep_stale_roots`), so killed runs do not fill the disk.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import secrets
import shutil
import tempfile
import time
from typing import Any, Sequence
import weakref

from agentic_grpo.sandbox import isolation as isolation_lib
from agentic_grpo.sandbox import program_judge
from agentic_grpo.sandbox import stdio
from agentic_grpo.sandbox import worker as worker_lib
from agentic_grpo.sandbox.types import Isolation, Limits, Program, RunResult

# ----------------------------------------------------------------- leftovers
ROOT_PREFIX = "agentic-grpo-sandbox-"
_OWNER_FILE = ".owner"


def _start_time(pid: int) -> str | None:
  """The kernel's start time of process `pid` (clock ticks since boot, `/proc/<pid>/stat`
  field 22), or None where there is no `/proc` or no such process: it tells a reused pid
  from its first owner."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      # The command name (field 2) may hold spaces and parentheses: split after its ')'.
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int, start: str | None) -> bool:
  """Whether process `pid` exists and, where start times can be read, is the one that started
  at `start`."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # another user's process: it exists
  now = _start_time(pid)
  return start is None or now is None or now == start


def _pid_namespace() -> str:
  """This process's PID namespace (`/proc/self/ns/pid`, e.g. `pid:[4026531836]`), or `-` where
  it cannot be read: pids name processes only within one namespace."""
  try:
    return os.readlink("/proc/self/ns/pid")
  except OSError:
    return "-"


def _write_owner(root: str) -> None:
  with open(os.path.join(root, _OWNER_FILE), "w", encoding="ascii") as f:
    f.write(f"{os.getpid()} {_start_time(os.getpid()) or '-'} {_pid_namespace()}\n")


def sweep_stale_roots(tmpdir: str | None = None) -> list[str]:
  """Removes the host directories of pools whose owner process is gone (module docstring).

  A directory counts as stale only when its `.owner` file names a process of this PID
  namespace that no longer exists, or a pid now held by another process (a different start
  time); directories without one (a pool being created, or made by an older version), and
  those of another PID namespace (another container sharing the temporary directory, whose
  pids mean nothing here), are left alone.

  Args:
    tmpdir: where to look (default: `tempfile.gettempdir()`, where pools make them).

  Returns:
    The paths removed.
  """
  tmpdir = tmpdir or tempfile.gettempdir()
  removed = []
  try:
    names = [n for n in os.listdir(tmpdir) if n.startswith(ROOT_PREFIX)]
  except OSError:
    return removed
  for name in names:
    path = os.path.join(tmpdir, name)
    try:
      with open(os.path.join(path, _OWNER_FILE), encoding="ascii") as f:
        pid_text, start, namespace = f.read().split()
      pid = int(pid_text)
    except (OSError, ValueError):
      continue
    if namespace == "-" or namespace != _pid_namespace():
      continue
    if pid <= 0 or _alive(pid, None if start == "-" else start):
      continue
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.exists(path):
      removed.append(path)
  return removed


# ----------------------------------------------------------------- pool
def _shutdown(workers, idle_slots, host_root):
  """Stops the workers, frees their slots and removes the pool's host directory."""
  for w in workers:
    try:
      w.stop()
    except Exception:  # pylint: disable=broad-except
      pass
  for slot in idle_slots:
    isolation_lib.release_slot(slot)
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
        1 <= max_workers <= isolation_lib.MAX_SLOTS):
      raise ValueError(f"max_workers must be an int in [1, {isolation_lib.MAX_SLOTS}], got "
                       f"{max_workers!r}")
    if not isinstance(limits, Limits):
      raise ValueError(f"limits must be a Limits, got {type(limits).__name__}")
    if not isinstance(isolation, Isolation):
      raise ValueError(f"isolation must be an Isolation, got {type(isolation).__name__}")
    if tag is None:
      tag = ROOT_PREFIX + secrets.token_hex(6)
    if not isinstance(tag, str) or not tag or not all(c.isalnum() or c in "-_." for c in tag):
      raise ValueError(f"tag must be a non-empty string of [A-Za-z0-9._-], got {tag!r}")
    self.tag = tag
    self.limits = limits
    self._plan = isolation_lib.plan_for(isolation)
    sweep_stale_roots()
    self._host_root = tempfile.mkdtemp(prefix=ROOT_PREFIX)
    os.chmod(self._host_root, 0o711)
    _write_owner(self._host_root)
    slots = []
    try:
      for _ in range(max_workers):
        slots.append(isolation_lib.acquire_slot())
    except RuntimeError:
      for s in slots:
        isolation_lib.release_slot(s)
      shutil.rmtree(self._host_root, ignore_errors=True)
      raise
    self._workers = [worker_lib.Worker(self._plan, s, self._host_root, tag, isolation.disk_bytes)
                     for s in slots]
    self._idle: queue.SimpleQueue[worker_lib.Worker] = queue.SimpleQueue()
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
  def isolation_info(self) -> dict[str, Any]:
    """What isolation is in effect: `level` (one of `ISOLATION_LEVELS`), namespaces,
    user namespace, privilege drop, fork, audit hook."""
    p = self._plan
    return {"level": p.level, "namespaces": p.namespaces, "user_namespace": p.user_namespace,
            "drop_privileges": p.drop_privileges, "fork_allowed": p.allow_fork,
            "audit_hook": p.audit_hook}

  def start(self):
    """Starts every worker's server now (otherwise each starts on first use)."""
    self._check_open()
    workers = [self._idle.get() for _ in self._workers]
    try:
      list(self._executor.map(_try_start, workers))
    finally:
      for w in workers:
        self._idle.put(w)

  def submit(self, program: Program | stdio.StdioProgram, limits: Limits | None = None
             ) -> concurrent.futures.Future[RunResult | stdio.StdioResult]:
    """Schedules `program`; the future's result never raises.

    A `Program` gives a RunResult; a `stdio.StdioProgram` a `stdio.StdioResult`
    (all its tests run in this one job, under the program's own time, memory
    and output limits; of `limits` only `max_processes` applies).

    Raises:
      ValueError: if `program` is neither or `limits` not a Limits.
      RuntimeError: if the pool is closed.
    """
    self._check_open()
    if not isinstance(program, (Program, stdio.StdioProgram)):
      raise ValueError(f"program must be a Program or StdioProgram, got "
                       f"{type(program).__name__}")
    if limits is None:
      limits = self.limits
    if not isinstance(limits, Limits):
      raise ValueError(f"limits must be a Limits or None, got {type(limits).__name__}")
    return self._executor.submit(self._run, program, limits)

  def map(self, programs: Sequence[Program | stdio.StdioProgram],
          limits: Limits | None = None) -> list[RunResult | stdio.StdioResult]:
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

  def _run(self, program, limits: Limits):
    if isinstance(program, stdio.StdioProgram):
      return self._run_stdio(program, limits)
    start = time.monotonic()
    worker = self._idle.get()
    try:
      nonce = secrets.token_hex(16).encode("ascii")
      job = program_judge.job(program, limits, self._plan, nonce)
      raw = worker.run(job, limits.wall_seconds)
      return program_judge.assemble(program, limits, raw, nonce, time.monotonic() - start)
    except BaseException as e:  # pylint: disable=broad-except
      return program_judge.error_result(program, f"sandbox failure: {e}",
                                        time.monotonic() - start)
    finally:
      self._idle.put(worker)


  def _run_stdio(self, program: stdio.StdioProgram, limits: Limits) -> stdio.StdioResult:
    start = time.monotonic()
    worker = self._idle.get()
    try:
      nonce = secrets.token_hex(16).encode("ascii")
      job = stdio.job(program, program_judge.nproc(limits, self._plan), dict(isolation_lib.ENV),
                      nonce)
      raw = worker.run(job, program.job_seconds + 2.0)
      return stdio.assemble(program, raw.report, nonce, time.monotonic() - start)
    except BaseException as e:  # pylint: disable=broad-except
      return stdio.error_result(program, f"sandbox failure: {e}", time.monotonic() - start)
    finally:
      self._idle.put(worker)


def _try_start(worker: worker_lib.Worker):
  try:
    worker.start()
  except worker_lib.WorkerFailure:
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
