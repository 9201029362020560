"""Two JAX processes on loopback train the tiny config through launch/train.py.

`launch/multihost_local.sh` starts 2 processes with 2 CPU devices each; they
form one (data=2, fsdp=2) mesh through `jax.distributed`, run two warm-start
and two Agentic GRPO steps, and checkpoint with Orbax from both processes.
Checked: both exit 0 and log the same metrics (losses equal to float32
rounding: every process computes the same global step), metrics are written
once, and the checkpoints restore in this (single) process with the
training visible in them. Bounded: the processes get a time limit, and
whatever is left is killed.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

from absl.testing import absltest
import jax
import numpy as np
import orbax.checkpoint as ocp

ROOT = pathlib.Path(__file__).resolve().parent.parent
_LIMIT_S = 420  # per process; the test waits a minute longer before killing

_OVERRIDES = (
    "--config.warmstart.steps=2", "--config.warmstart.batch_size=8",
    "--config.rl.num_steps=2", "--config.rl.tasks_per_batch=2", "--config.rl.group_size=4",
    "--config.rl.rows_per_update=8", "--config.rl.batches_in_flight=1",
    "--config.replay.skip_zero_advantage=False",
    "--config.task.eval_size=2", "--config.eval.num_samples=0", "--config.eval.k=1",
    "--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.mlp_dim=64",
    "--config.log.progress_bar=False", "--config.log.tensorboard=False",
    "--config.log.plot=False", "--config.checkpoint.every=1",
    "--config.checkpoint.max_to_keep=4",
    "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=1",
    "--verbosity=1",  # each process logs its metrics rows
)


def _metrics_rows(log_path: pathlib.Path) -> list[dict]:
  rows = []
  for line in log_path.read_text().splitlines():
    if " metrics {" in line:
      rows.append(json.loads(line.split(" metrics ", 1)[1]))
  return rows


def _restore_state(step_dir: pathlib.Path):
  """The learner state of one checkpoint, onto this process's first device."""
  item = step_dir / "state"
  meta = ocp.StandardCheckpointer().metadata(item).item_metadata
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          meta)
  return ocp.StandardCheckpointer().restore(item, abstract)["state"]


class MultihostTest(absltest.TestCase):

  def test_two_processes_train_agree_and_checkpoint_restores(self):
    tmp = pathlib.Path(self.create_tempdir().full_path)
    workdir, logs = tmp / "workdir", tmp / "logs"
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("XLA_FLAGS", None)  # the script gives each process its own 2 devices
    cmd = ["bash", str(ROOT / "launch" / "multihost_local.sh"), "-n", "2", "-d", "2",
           "-t", str(_LIMIT_S), "-l", str(logs), "--", f"--workdir={workdir}", *_OVERRIDES]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
      out, _ = proc.communicate(timeout=_LIMIT_S + 60)
    except subprocess.TimeoutExpired:
      out = ""
    finally:
      if proc.poll() is None:  # the script's trap stops its processes on SIGTERM
        os.killpg(proc.pid, signal.SIGTERM)
        try:
          proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
          os.killpg(proc.pid, signal.SIGKILL)
          proc.communicate()

    tails = "\n".join(f"--- process {i}:\n" + (logs / f"process_{i}.log").read_text()[-3000:]
                      for i in range(2) if (logs / f"process_{i}.log").exists())
    self.assertEqual(proc.returncode, 0, f"{out}\n{tails}")

    rows = [_metrics_rows(logs / f"process_{i}.log") for i in range(2)]
    self.assertEqual([r["step"] for r in rows[0]], [1, 2, 3, 4])
    self.assertEqual([r["step"] for r in rows[1]], [1, 2, 3, 4])
    for r0, r1 in zip(*rows):
      losses = sorted(k for k in r0 if "loss" in k and isinstance(r0[k], float))
      self.assertNotEmpty(losses)
      for k in losses:
        np.testing.assert_allclose(r1[k], r0[k], rtol=1e-6, err_msg=f"step {r0['step']} {k}")
    self.assertEqual([r["phase"] for r in rows[0]], ["warmstart"] * 2 + ["rl"] * 2)
    self.assertTrue(np.isfinite(rows[0][-1]["loss/loss"]))
    # Metrics written once (process 0), not once per process.
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    self.assertEqual([json.loads(l)["step"] for l in lines], [1, 2, 3, 4])

    # The checkpoints both processes wrote restore here, in one process.
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    self.assertEqual(steps, [1, 2, 3, 4])
    ws1, ws2, rl2 = (_restore_state(workdir / "checkpoints" / str(s)) for s in (1, 2, 4))
    self.assertEqual([int(s["step"]) for s in (ws1, ws2, rl2)], [1, 2, 2])
    p1, p2 = jax.tree.leaves(ws1["params"]), jax.tree.leaves(ws2["params"])
    self.assertTrue(any(not np.array_equal(a, b) for a, b in zip(p1, p2)))  # a step trained
    self.assertTrue(all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(rl2)))


if __name__ == "__main__":
  absltest.main()
