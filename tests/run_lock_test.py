"""Tests for agentic_grpo.checkpoint.run_lock, with real second processes."""

import fcntl
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from unittest import mock

from absl.testing import absltest

from agentic_grpo.checkpoint import run_lock

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Takes the lock, says so, then waits (to be killed) or raises (argv[2] == "raise").
_CHILD = textwrap.dedent("""
    import sys, time
    from agentic_grpo.checkpoint import run_lock
    with run_lock.WorkdirLock(sys.argv[1]):
      print("LOCKED", flush=True)
      if sys.argv[2] == "raise":
        raise RuntimeError("boom")
      time.sleep(600)
""")


def _start(workdir: str, mode: str) -> subprocess.Popen:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  child = subprocess.Popen([sys.executable, "-c", _CHILD, workdir, mode], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  return child


class RunLockTest(absltest.TestCase):

  def _locked_child(self, workdir):
    child = _start(workdir, "wait")
    self.addCleanup(lambda: (child.poll() is None and child.kill(), child.wait(),
                             child.stdout.close()))
    self.assertEqual(child.stdout.readline().strip(), "LOCKED")
    return child

  def test_second_process_is_refused_with_the_holder_named(self):
    workdir = self.create_tempdir().full_path
    child = self._locked_child(workdir)
    with self.assertRaises(run_lock.WorkdirLockedError) as ctx:
      run_lock.WorkdirLock(workdir).acquire()
    message = str(ctx.exception)
    self.assertIn(f"pid {child.pid}", message)
    self.assertIn(f"host {socket.gethostname()}", message)
    self.assertRegex(message, r"started \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
    self.assertEqual(ctx.exception.holder["pid"], child.pid)

  def test_lock_of_a_killed_process_is_taken_over(self):
    for sig in (signal.SIGKILL, signal.SIGTERM):
      workdir = self.create_tempdir().full_path
      child = self._locked_child(workdir)
      child.send_signal(sig)
      child.wait(timeout=30)
      # The dead holder is still written in the file, but holds no lock.
      self.assertEqual(run_lock.read_holder(os.path.join(workdir, run_lock.LOCK_FILE))["pid"],
                       child.pid)
      with self.assertLogs(level="WARNING") as logs:
        lock = run_lock.WorkdirLock(workdir).acquire()
      self.assertTrue(any(f"pid {child.pid}" in line for line in logs.output), logs.output)
      self.assertTrue(lock.held)
      holder = run_lock.read_holder(lock.path)
      self.assertEqual(holder["pid"], os.getpid())
      lock.release()

  def test_train_run_refuses_a_workdir_held_by_another_process(self):
    from agentic_grpo import train  # pylint: disable=g-import-not-at-top
    from experiments import tiny_codegen  # pylint: disable=g-import-not-at-top
    workdir = self.create_tempdir().full_path
    child = self._locked_child(workdir)
    with self.assertRaisesRegex(run_lock.WorkdirLockedError, f"pid {child.pid}"):
      train.run(tiny_codegen.get_config(), workdir)
    self.assertEqual(sorted(os.listdir(workdir)), [run_lock.LOCK_FILE])  # nothing written

  def test_released_on_exception(self):
    workdir = self.create_tempdir().full_path
    child = _start(workdir, "raise")
    out, _ = child.communicate(timeout=60)
    self.assertEqual(out.strip(), "LOCKED")
    self.assertEqual(child.returncode, 1)
    self.assertFalse(os.path.exists(os.path.join(workdir, run_lock.LOCK_FILE)))
    with run_lock.WorkdirLock(workdir) as lock:
      self.assertTrue(lock.held)

  def test_in_process_context_manager(self):
    workdir = self.create_tempdir().full_path
    with self.assertRaisesRegex(ValueError, "inside"):
      with run_lock.WorkdirLock(workdir) as lock:
        holder = json.loads(pathlib.Path(lock.path).read_text())
        self.assertEqual(holder["pid"], os.getpid())
        # A second lock in the same process is refused too (flock is per open file).
        with self.assertRaises(run_lock.WorkdirLockedError):
          run_lock.WorkdirLock(workdir).acquire()
        raise ValueError("inside")
    self.assertFalse(lock.held)
    # Nothing but the lock was written: the lock file goes; the workdir existed, so it stays.
    self.assertEqual(os.listdir(workdir), [])
    run_lock.WorkdirLock(workdir).acquire().release()

  def test_release_keeps_a_workdir_that_holds_a_run_and_deletes_the_lock_file(self):
    root = self.create_tempdir().full_path
    for workdir in (root, os.path.join(root, "created")):  # existing, or created by the lock
      with run_lock.WorkdirLock(workdir) as lock:
        pathlib.Path(workdir, "metrics.jsonl").write_text("{}\n")
      self.assertFalse(lock.held)
      self.assertEqual(os.listdir(workdir), ["metrics.jsonl"])

  def test_release_never_deletes_a_lock_file_that_replaced_its_own(self):
    workdir = self.create_tempdir().full_path
    lock = run_lock.WorkdirLock(workdir).acquire()
    os.unlink(lock.path)  # removed under the run, and another run took the path meanwhile
    other = run_lock.WorkdirLock(workdir).acquire()
    lock.release()
    self.assertTrue(os.path.exists(other.path))
    with self.assertRaises(run_lock.WorkdirLockedError):
      run_lock.WorkdirLock(workdir).acquire()
    other.release()
    self.assertEqual(os.listdir(workdir), [])

  def test_release_of_a_workdir_removed_under_the_run(self):
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    lock = run_lock.WorkdirLock(workdir).acquire()
    shutil.rmtree(workdir)
    lock.release()  # does not raise (it would mask the run's own error)
    self.assertFalse(lock.held)
    run_lock.WorkdirLock(workdir).acquire().release()

  def test_a_refused_run_leaves_no_workdir_it_created(self):
    workdir = os.path.join(self.create_tempdir().full_path, "fresh", "run")
    run_lock.WorkdirLock(workdir).acquire().release()
    self.assertFalse(os.path.exists(workdir))
    self.assertTrue(os.path.isdir(os.path.dirname(workdir)))  # only the workdir itself goes

  def test_a_lock_file_deleted_between_open_and_flock_is_not_held(self):
    # The holder releases an otherwise empty workdir (deleting the lock file) after a second
    # run opened the file and before it locks it: the second run must lock the path's new
    # file, not the deleted one (else a third run could hold the path's file at the same time).
    workdir = self.create_tempdir().full_path
    first = run_lock.WorkdirLock(workdir).acquire()
    real, calls = fcntl.flock, []

    def flock(fd, op):
      if op & fcntl.LOCK_EX:
        calls.append(fd)
        if len(calls) == 1:
          first.release()
      return real(fd, op)

    with mock.patch.object(run_lock.fcntl, "flock", flock):
      second = run_lock.WorkdirLock(workdir).acquire()
    self.assertLen(calls, 2)  # the first locked a deleted file, and was started over
    self.assertTrue(second.held)
    self.assertEqual(os.fstat(second._fd).st_ino, os.stat(second.path).st_ino)
    with self.assertRaises(run_lock.WorkdirLockedError):
      run_lock.WorkdirLock(workdir).acquire()
    second.release()

  def test_disabled_and_remote_locks_do_nothing(self):
    workdir = self.create_tempdir().full_path
    with run_lock.WorkdirLock(workdir, enabled=False) as lock:
      self.assertFalse(lock.held)
    self.assertFalse(os.path.exists(os.path.join(workdir, run_lock.LOCK_FILE)))
    with self.assertLogs(level="WARNING"):
      self.assertFalse(run_lock.WorkdirLock("gs://bucket/run").acquire().held)


if __name__ == "__main__":
  absltest.main()
