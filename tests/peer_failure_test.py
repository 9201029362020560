"""A peer process that dies mid-run ends the survivor, bounded in time, and a restart resumes.

Two JAX processes on loopback (2 CPU devices each, as `launch/multihost_local.sh` starts them,
but launched here so that no script stops the survivor for us) train the tiny config with
`--config.mesh.collective_timeout_s=15`. Once the first checkpoints are written, process 1 is
killed (SIGKILL). Checked: process 0 exits non-zero within a bound (the timeout, the time to ask
the coordination service who failed, and slack for a loaded machine) with a message that names
process 1; the checkpoints left behind restore: a second launch of both processes resumes from
the latest one and finishes with status 0. Bounded: every wait has a limit, and whatever is left
is killed.
"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

from absl.testing import absltest

from agentic_grpo import parallel
from agentic_grpo.checkpoint import integrity as checkpoint_integrity
from tests.fixtures import micro_run
from tests.fixtures import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
_TIMEOUT_S = 15  # config.mesh.collective_timeout_s of the run whose peer is killed
# The restart only checks that the run resumes: a generous timeout (a field that may change on
# resume) keeps a loaded machine's slow start from reading as a dead peer.
_RESTART_TIMEOUT_S = 120
_EXIT_BOUND_S = 90  # process 0 must be gone this long after process 1 is killed
_RUN_LIMIT_S = 300  # per launch

_OVERRIDES = (
    "--config.warmstart.steps=2", "--config.warmstart.batch_size=8",
    "--config.rl.num_steps=4", "--config.rl.tasks_per_batch=2", "--config.rl.group_size=4",
    "--config.rl.rows_per_update=16", "--config.rl.batches_in_flight=1",
    "--config.workflow.stages=('hypothesis','code')",
    *micro_run.PINNED_RL_LEVER_FLAGS,
    "--config.task.eval_size=2", "--config.eval.num_samples=0", "--config.eval.k=1",
    "--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.mlp_dim=64",
    "--config.log.progress_bar=False", "--config.log.tensorboard=False",
    "--config.log.plot=False", "--config.checkpoint.every=1",
    "--config.checkpoint.max_to_keep=10",
    "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=1",
)
# Our message (process 1 not at the collective, or stopped inside it: its heartbeat stopped),
# or JAX's when its heartbeat check ends the process first (outside a collective).
_NAMES_PROCESS_1 = re.compile(
    r"Not at this collective \(stuck or dead\): process 1 |"
    r"stopped in it \(no heartbeat for [0-9.]+ s: dead or stuck\): process 1\b|"
    r"tasks are unhealthy \(stopped sending heartbeats\):\s*1\b")


def _newest_intact(ckpts: pathlib.Path) -> int:
  """The newest checkpoint step whose files match its integrity manifest (what a restart restores).

  A step directory can exist without being complete: a process killed mid-save leaves one whose
  manifest is missing (the restart moves it aside and restores the one before).
  """
  steps = sorted((int(p.name) for p in ckpts.iterdir() if p.name.isdigit()), reverse=True)
  for step in steps:
    if not checkpoint_integrity.verify(ckpts / str(step)):
      return step
  raise AssertionError(f"no intact checkpoint among {steps} in {ckpts}")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class PeerFailureTest(absltest.TestCase):

  def _start(self, tmp: pathlib.Path, name: str, timeout_s: int = _TIMEOUT_S
             ) -> list[tuple[subprocess.Popen, pathlib.Path]]:
    port = _free_port()
    procs = []
    for i in range(2):
      env = xla_flags.child_env(
          2, AGENTIC_GRPO_DISTRIBUTED="1", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
          JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i),
          JAX_COMPILATION_CACHE_DIR=str(tmp / "jax_cache"),
          JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
      log = tmp / f"{name}_{i}.log"
      with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch.train", f"--workdir={tmp / 'workdir'}", *_OVERRIDES,
             f"--config.mesh.collective_timeout_s={timeout_s}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
      procs.append((proc, log))
      self.addCleanup(self._kill, proc)
    return procs

  @staticmethod
  def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()

  def _wait(self, proc: subprocess.Popen, limit_s: float) -> int:
    try:
      return proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
      self._kill(proc)
      return None

  def test_killed_peer_ends_survivor_with_message_and_restart_resumes(self):
    tmp = pathlib.Path(self.create_tempdir().full_path)
    ckpts = tmp / "workdir" / "checkpoints"
    (p0, log0), (p1, log1) = self._start(tmp, "first")
    deadline = time.time() + _RUN_LIMIT_S
    # Warm-start steps 1-2 and the first RL step committed: the manifest is written last.
    while not (ckpts / "3" / checkpoint_integrity.MANIFEST).is_file():
      self.assertIsNone(p0.poll(), log0.read_text()[-3000:])
      self.assertIsNone(p1.poll(), log1.read_text()[-3000:])
      self.assertLess(time.time(), deadline, "no checkpoint 3 in time")
      time.sleep(0.5)
    os.killpg(p1.pid, signal.SIGKILL)
    killed = time.time()
    rc = self._wait(p0, _EXIT_BOUND_S)
    took = time.time() - killed
    text = log0.read_text()
    self.assertIsNotNone(rc, f"process 0 still running {_EXIT_BOUND_S} s after its peer died:\n"
                         f"{text[-3000:]}")
    self.assertNotEqual(rc, 0, text[-3000:])
    self.assertRegex(text, _NAMES_PROCESS_1)
    if rc == parallel.EXIT_PEER_FAILURE:  # ended by the watchdog: the whole message
      self.assertIn("restart the run to resume from its last checkpoint", text)
    print(f"process 0 exited with status {rc} {took:.1f} s after process 1 was killed: "
          f"{_NAMES_PROCESS_1.search(text).group(0)!r}")

    # A restart resumes from the newest intact checkpoint (3, or a later one committed before
    # the kill; one cut off mid-save is moved aside) and finishes.
    last = _newest_intact(ckpts)
    self.assertGreaterEqual(last, 3)
    procs = self._start(tmp, "second", timeout_s=_RESTART_TIMEOUT_S)
    for proc, log in procs:
      self.assertEqual(self._wait(proc, _RUN_LIMIT_S), 0, log.read_text()[-3000:])
    for _, log in procs:
      self.assertIn(f"at global step {last}", log.read_text())
    self.assertEqual(max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()), 6)


if __name__ == "__main__":
  absltest.main()
