"""A workdir lock: one live run per workdir.

Two runs on one workdir (a job restarted while its old copy still runs, a typo in a launch
script) would interleave checkpoints and metrics. `WorkdirLock` takes an exclusive
`fcntl.flock` on `<workdir>/.run.lock` and writes its holder (host, pid, start time, command)
into it; a second run stops at once with `WorkdirLockedError` naming that holder.

Release: on `release()` / leaving the `with` block (also on an exception), and, because the
kernel drops a process's `flock` locks when the process ends, on every other exit too: a signal
(SIGTERM, SIGKILL), a crash, `os._exit`. A lock file left by a process that is gone is
therefore never held, and the next run takes it over (logging the previous holder). On release
the file is deleted (a workdir whose run ended cleanly holds no lock file), and so is the
workdir if the lock created it and nothing else was written there (a run refused before it
wrote anything: a bad model checkpoint, a config drift), so a refused run leaves nothing
behind. A run that opened the file before that deletion and locks it after finds the path gone
or replaced and starts over, so two runs never hold different files of one path.

Supported workdirs: local file systems and NFSv4 (Linux emulates `flock` with NFS byte-range
locks; the server frees the lock of a client that died when its lease ends, about 90 s).
Not supported: NFSv3 without a lock daemon (`flock` then fails with ENOLCK, and the run stops
with a message) and object stores (`gs://...`), which have no locks: there the lock is skipped
with a warning, and the job scheduler must ensure one run per workdir.

In a multi-process run, process 0 alone holds the lock (the others share its workdir).
"""

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from typing import Any, Optional

from absl import logging

from agentic_grpo import exit_codes

LOCK_FILE = ".run.lock"


class WorkdirLockedError(RuntimeError):
  """The workdir is locked by another live run (the message names its host, pid and start)."""
  exit_code = exit_codes.WORKDIR_LOCKED

  def __init__(self, workdir: str, holder: dict[str, Any]):
    self.workdir = workdir
    self.holder = holder
    super().__init__(f"workdir {workdir} is in use by another run: {describe(holder)}. Stop "
                     f"that run or use another --workdir.")


def describe(holder: dict[str, Any]) -> str:
  """`host H, pid P, started T` from a lock file's contents (`unknown holder` if empty)."""
  if not holder:
    return "unknown holder (empty lock file)"
  return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started "
          f"{holder.get('started', '?')}")


def read_holder(path: str) -> dict[str, Any]:
  """The holder recorded in lock file `path` ({} when empty, missing or unreadable)."""
  try:
    with open(path) as f:
      text = f.read()
    return json.loads(text) if text.strip() else {}
  except (OSError, ValueError):
    return {}


def _same_file(fd: int, path: str) -> bool:
  """Whether the open file `fd` is the file at `path` now (not deleted or replaced)."""
  try:
    here, there = os.fstat(fd), os.stat(path)
  except FileNotFoundError:
    return False
  return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


class WorkdirLock:
  """An exclusive lock on a workdir, held from `acquire()` (or `with`) to `release()`.

  Args:
    workdir: the run's output directory (created if missing).
    enabled: False makes the lock a no-op (processes other than 0 of a multi-process run).

  Raises (from `acquire`):
    WorkdirLockedError: another live process holds the lock.
    OSError: the file system refuses locks (e.g. NFSv3 without a lock daemon: ENOLCK).
  """

  def __init__(self, workdir: str, *, enabled: bool = True):
    self.workdir = str(workdir)
    self.enabled = enabled
    self.path = os.path.join(self.workdir, LOCK_FILE)
    self._fd: Optional[int] = None
    self._created_dir = False

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self) -> "WorkdirLock":
    if not self.enabled or self._fd is not None:
      return self
    if "://" in self.workdir:
      logging.warning("workdir %s is on an object store, which has no locks: running without "
                      "a workdir lock", self.workdir)
      return self
    created = False
    while True:
      if not os.path.isdir(self.workdir):
        os.makedirs(self.workdir, exist_ok=True)
        created = True
      try:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      except FileNotFoundError:  # a releasing holder removed the (empty) workdir meanwhile
        continue
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
          raise WorkdirLockedError(self.workdir, read_holder(self.path)) from None
        raise OSError(e.errno, f"cannot lock workdir {self.workdir} ({self.path}): "
                      f"{e.strerror}; its file system does not support flock (see "
                      f"agentic_grpo/checkpoint/run_lock.py)") from e
      if _same_file(fd, self.path):
        break
      os.close(fd)  # locked a file its holder deleted on release: lock the path's file
    self._created_dir = created
    previous = read_holder(self.path)
    if previous:  # a holder that ended without releasing (killed): the kernel freed its lock
      logging.warning("taking over the workdir lock of %s, which has ended", describe(previous))
    holder = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "argv": sys.argv}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    os.fsync(fd)
    self._fd = fd
    return self

  def release(self) -> None:
    """Deletes the lock file and unlocks it (idempotent); removes the workdir too if `acquire`
    created it and nothing else was written there (a refused run leaves nothing behind)."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      # Not a file that replaced ours, nor one of a workdir removed under the run (whose
      # release must not raise: it would mask the run's own error).
      if _same_file(fd, self.path):
        os.unlink(self.path)  # still locked: a run that opened it will find it gone
        if self._created_dir:
          try:
            os.rmdir(self.workdir)
          except OSError:  # it holds the run, or another run's lock file created meanwhile
            pass
      fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
      os.close(fd)

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()
