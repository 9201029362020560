"""One sandbox worker: its server process (`runner.py`) and the frame channel to it."""

from __future__ import annotations

import dataclasses
import marshal
import os
import select
import signal
import subprocess
import time

from agentic_grpo.sandbox import isolation

# Extra seconds the parent waits for a server beyond a job's wall limit before
# it declares the server dead (its cleanup takes milliseconds).
SAFETY_SECONDS = 10.0
START_SECONDS = 60.0


class WorkerFailure(Exception):
  """The server process failed (died, timed out, or broke the protocol)."""


@dataclasses.dataclass
class Raw:
  """One RESULT frame of the server (see runner.py): the job's raw outcome."""
  status: int
  cpu: float
  reason: str
  out_total: int
  tail: bytes
  report: bytes
  message: str
  retire: bool = False  # the server exits after this job (it changed the mount table)


class Worker:
  """One sandbox server process (see runner.py) and its channel.

  Args:
    plan: the pool's isolation plan.
    slot: this worker's slot (`isolation.acquire_slot`), which names its uid.
    host_root: the pool's host directory (logs; job directories and the
      empty mount point of the namespace view, per worker).
    tag: put on the server's command line.
    disk_bytes: size of the view's /jobs and /tmp (namespaces).
  """

  def __init__(self, plan: isolation.Plan, slot: int, host_root: str, tag: str,
               disk_bytes: int):
    self.plan = plan
    self.slot = slot
    self.disk_bytes = disk_bytes
    self.uid = isolation.slot_uid(slot) if plan.drop_privileges else -1
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
    base = os.path.join(self.host_root, f"w{self.slot}")
    new_root, job_root = os.path.join(base, "root"), os.path.join(base, "jobs")
    for d in (base, new_root):
      os.makedirs(d, mode=0o755, exist_ok=True)
    cmd = isolation.server_command(self.plan, self.disk_bytes, new_root, job_root, self.uid,
                                   self.tag)
    with open(self.log_path, "ab") as log:
      self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=log, env=isolation.ENV, cwd="/", start_new_session=True,
                                   bufsize=0)
    self.buf.clear()
    line = self._read_line(time.monotonic() + START_SECONDS)
    if not line.startswith(b"READY"):
      raise WorkerFailure(f"sandbox server did not start: {line!r} {self._log_tail()}")
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
      raise WorkerFailure("sandbox server did not answer in time")
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
      raise WorkerFailure("sandbox server did not answer in time")
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      raise WorkerFailure(f"sandbox server exited. {self._log_tail()}")
    self.buf.extend(chunk)

  def _read_line(self, deadline: float) -> bytes:
    while b"\n" not in self.buf:
      if len(self.buf) > 4096:
        raise WorkerFailure("sandbox server sent a malformed header")
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

  def run(self, job: dict, wall: float) -> Raw:
    """Runs one job; raises WorkerFailure (after killing the server) on trouble."""
    try:
      self.start()
      payload = marshal.dumps(job)
      data = b"JOB %d\n" % len(payload) + payload
      fd = self.proc.stdin.fileno()
      view = memoryview(data)
      while view:
        view = view[os.write(fd, view):]
      deadline = time.monotonic() + wall + SAFETY_SECONDS
      header = self._read_line(deadline).decode("ascii").split(" ")
      if len(header) != 9 or header[0] != "RESULT":
        raise WorkerFailure(f"sandbox server sent a malformed header: {header!r:.200}")
      status, cpu, reason = int(header[1]), float(header[2]), header[3]
      out_total, tail_len, report_len = int(header[4]), int(header[5]), int(header[6])
      body = self._read_exact(tail_len + report_len, deadline)
      message = "" if header[7] == "-" else unhex(header[7])
      raw = Raw(status, cpu, reason, out_total, body[:tail_len], body[tail_len:], message,
                header[8] == "1")
      if raw.retire:
        self.stop()
      return raw
    except (WorkerFailure, OSError, ValueError) as e:
      self.stop()
      if isinstance(e, WorkerFailure):
        raise
      raise WorkerFailure(f"sandbox server failed: {e!r}") from e


def unhex(text) -> str:
  try:
    return bytes.fromhex(text.decode("ascii") if isinstance(text, bytes) else text).decode(
        "utf-8", "replace")
  except (ValueError, UnicodeDecodeError):
    return "<malformed message>"
