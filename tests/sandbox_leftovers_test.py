"""A killed run's sandbox host directories are removed by the next pool (`sandbox.pool`).

A pool removes its host directory when closed or at exit; a process killed with SIGKILL
cannot, so every pool first sweeps the directories of owners that are gone
(`pool.sweep_stale_roots`). Tested with a real pool in a child process that is SIGKILLed, and
with planted directories (a dead owner, a reused pid, a live owner, no owner).
"""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap

from absl.testing import absltest

from agentic_grpo import sandbox
from agentic_grpo.sandbox import pool as pool_lib


def _dead_pid() -> int:
  """The pid of a process that has exited (and been reaped)."""
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


class SweepTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path

  def _root(self, owner: str | None) -> str:
    path = tempfile.mkdtemp(prefix=pool_lib.ROOT_PREFIX, dir=self.tmp)
    os.makedirs(os.path.join(path, "w0"))
    if owner is not None:
      with open(os.path.join(path, ".owner"), "w") as f:
        f.write(owner)
    return path

  def test_removes_only_roots_of_owners_that_are_gone(self):
    me = os.getpid()
    start = pool_lib._start_time(me)
    ns = pool_lib._pid_namespace()
    self.assertNotEqual(ns, "-")  # Linux: the namespace can be read
    dead_pid = _dead_pid()
    dead = self._root(f"{dead_pid} - {ns}\n")
    reused = self._root(f"{me} 1 {ns}\n") if start not in (None, "1") else None
    alive = self._root(f"{me} {start or '-'} {ns}\n")
    # Another container's pool: its pid means nothing in this namespace.
    elsewhere = self._root(f"{dead_pid} - pid:[1]\n")
    unknown_ns = self._root(f"{dead_pid} - -\n")
    unowned = self._root(None)
    garbled = self._root("not a pid\n")
    removed = pool_lib.sweep_stale_roots(self.tmp)
    self.assertCountEqual(removed, [dead] + ([reused] if reused else []))
    for path in (alive, elsewhere, unknown_ns, unowned, garbled):
      self.assertTrue(os.path.isdir(path), path)
    self.assertFalse(os.path.exists(dead))

  def test_a_missing_directory_is_nothing_to_sweep(self):
    self.assertEqual(pool_lib.sweep_stale_roots(os.path.join(self.tmp, "absent")), [])

  def test_a_killed_pools_root_goes_with_the_next_pool(self):
    script = textwrap.dedent(f"""
        import sys, tempfile, time
        tempfile.tempdir = {self.tmp!r}
        from agentic_grpo import sandbox
        pool = sandbox.SandboxPool(max_workers=1)
        pool.start()
        print(pool._host_root, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
      root = proc.stdout.readline().strip()
      self.assertTrue(os.path.isdir(root), root)
      self.assertTrue(os.path.isfile(os.path.join(root, ".owner")))
    finally:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
    self.assertTrue(os.path.isdir(root))  # a killed process leaves it behind
    old = tempfile.tempdir
    tempfile.tempdir = self.tmp
    try:
      with sandbox.SandboxPool(max_workers=1) as pool:
        mine = pool._host_root
        self.assertFalse(os.path.exists(root))
        self.assertTrue(os.path.isdir(mine))
    finally:
      tempfile.tempdir = old
    self.assertFalse(os.path.exists(mine))  # closed: removed as before


if __name__ == "__main__":
  absltest.main()
