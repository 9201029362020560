"""Two JAX processes on loopback train the tiny config through launch/train.py, stop and resume.

`launch/multihost_local.sh` starts 2 processes with 2 CPU devices each; they form one
(data=2, fsdp=2) mesh through `jax.distributed`, run two warm-start steps and one Agentic GRPO
step (a provisional update after the first of two stages), checkpoint and stop with that
episode batch in flight (`--stop_after=3`); a second launch on the same workdir resumes and
runs the last three GRPO steps, finishing that batch and starting the next. Each process draws its own tasks (stream positions p, p + 2, ...),
runs its own episodes and replay, and contributes half of every global batch.

Checked: every launch exits 0; both processes log the same metrics rows (every number but
wall-clock times: losses come from one global step, rewards, counts and evaluation are
gathered from both processes); metrics are written once; the processes drew disjoint tasks
and, after the restart, each continued its own stream exactly where it stopped; both resumed
from the checkpoint, which holds one host-state row per process and whose learner state
restores in this (single) process with the training visible in it. Bounded: the processes get
a time limit, and whatever is left is killed. Both launches share a persistent compilation
cache, so the second one compiles little.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

from absl.testing import absltest
import jax
import numpy as np
import orbax.checkpoint as ocp

from agentic_grpo.checkpoint import host_rows as checkpoint_host_rows
from agentic_grpo.train import metric_rows
from tests.fixtures import micro_run
from tests.fixtures import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
_LIMIT_S = 300  # per launch and process; the test waits a minute longer before killing

_OVERRIDES = (
    "--config.warmstart.steps=2", "--config.warmstart.batch_size=8",
    "--config.rl.num_steps=4", "--config.rl.tasks_per_batch=2", "--config.rl.group_size=4",
    "--config.rl.rows_per_update=16", "--config.rl.batches_in_flight=1",
    # Final rewards land a harvest after their batch's last stage, from judges whose waits are
    # drawn apart on each process: they arrive at different times, the processes keep step.
    "--config.rl.final_reward_lag=1", "--config.workflow.final_reward_jitter_s=0.2",
    "--config.workflow.stages=('hypothesis','code')",
    *micro_run.PINNED_RL_LEVER_FLAGS,
    "--config.task.eval_size=3", "--config.eval.num_samples=0", "--config.eval.k=1",
    "--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.mlp_dim=64",
    "--config.log.progress_bar=False", "--config.log.tensorboard=False",
    "--config.log.plot=False", "--config.checkpoint.every=1",
    "--config.checkpoint.max_to_keep=6",
    "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=1",
    "--verbosity=1",  # each process logs its metrics rows and the tasks it draws
)
# Wall-clock numbers differ between processes; everything else must not.
_TIMES = metric_rows.WALL_CLOCK
_TAKES = re.compile(r"agent loop: shard (\d+) batch \d+ takes stream positions (\[[^\]]*\]) "
                    r"task ids (\[[^\]]*\])")


def _metrics_rows(log: str) -> list[dict]:
  return [json.loads(line.split(" metrics ", 1)[1]) for line in log.splitlines()
          if " metrics {" in line]


def _takes(log: str) -> tuple[list[int], list[int], list[str]]:
  """(shard indices, stream positions, task ids) of the batches a process started."""
  shards, positions, ids = [], [], []
  for m in _TAKES.finditer(log):
    shards.append(int(m.group(1)))
    positions += json.loads(m.group(2))
    ids += json.loads(m.group(3))
  return shards, positions, ids


def _restore(item: pathlib.Path):
  """One checkpoint item of arrays, onto this process's first device."""
  meta = ocp.StandardCheckpointer().metadata(item).item_metadata
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          meta)
  return ocp.StandardCheckpointer().restore(item, abstract)


class MultihostTest(absltest.TestCase):

  def _launch(self, tmp: pathlib.Path, name: str, *extra: str,
              module: str = "launch.train") -> list[str]:
    """Runs the 2 processes of `module` to the end; returns their logs. `launch.train` gets
    the test's config overrides, another module only `--workdir` and `extra`."""
    logs = tmp / name
    # The script gives each process its own 2 devices (prepended to the compile flags).
    env = xla_flags.child_env(PYTHON=sys.executable, TRAIN_MODULE=module,
                              JAX_COMPILATION_CACHE_DIR=str(tmp / "jax_cache"),
                              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    cmd = ["bash", str(ROOT / "launch" / "multihost_local.sh"), "-n", "2", "-d", "2",
           "-t", str(_LIMIT_S), "-l", str(logs), "--", f"--workdir={tmp / 'workdir'}",
           *(_OVERRIDES if module == "launch.train" else ()), *extra]
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
    texts = [(logs / f"process_{i}.log").read_text() if (logs / f"process_{i}.log").exists()
             else "" for i in range(2)]
    tails = "\n".join(f"--- process {i}:\n{t[-3000:]}" for i, t in enumerate(texts))
    self.assertEqual(proc.returncode, 0, f"{name}: {out}\n{tails}")
    return texts

  def test_two_processes_train_on_own_tasks_agree_and_resume(self):
    tmp = pathlib.Path(self.create_tempdir().full_path)
    workdir = tmp / "workdir"
    first = self._launch(tmp, "first", "--stop_after=3")
    second = self._launch(tmp, "second")

    # Both processes log the same rows: steps 1-3, then 4 after the restart.
    for logs, steps in ((first, [1, 2, 3]), (second, [4, 5, 6])):
      rows = [_metrics_rows(log) for log in logs]
      for r in rows:
        self.assertEqual([x["step"] for x in r], steps)
      for r0, r1 in zip(*rows):
        self.assertEqual(sorted(r0), sorted(r1))
        losses = [k for k in r0 if "loss" in k and isinstance(r0[k], float)]
        self.assertNotEmpty(losses)
        for k in r0:
          if isinstance(r0[k], str):
            self.assertEqual(r1[k], r0[k])
          elif k not in _TIMES:
            np.testing.assert_allclose(r1[k], r0[k], rtol=1e-6, err_msg=f"step {r0['step']} {k}")
    last = _metrics_rows(second[0])[-1]
    self.assertEqual(last["phase"], "rl")
    self.assertTrue(np.isfinite(last["loss/loss"]))
    self.assertIn("eval/pass_at_1", last)  # the final evaluation, gathered from both processes
    self.assertIn("reward/hypothesis", _metrics_rows(first[0])[-1])  # gathered rewards
    self.assertGreaterEqual(last["final/latency_versions_mean"], 0.0)  # final rewards landed
    # Metrics written once (process 0), not once per process, and kept over the restart.
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    self.assertEqual([json.loads(l)["step"] for l in lines], [1, 2, 3, 4, 5, 6])

    # Each process drew its own tasks: positions p, p + 2, ..., continued after the restart.
    drawn = []
    for p in range(2):
      shards, positions, ids = (sum(x, []) for x in zip(_takes(first[p]), _takes(second[p]),
                                                        strict=True))
      self.assertNotEmpty(_takes(second[p])[1])  # training went on with new tasks
      self.assertEqual(set(shards), {p})
      self.assertEqual(positions, [p + 2 * k for k in range(len(positions))])
      drawn.append((set(positions), set(ids)))
      self.assertIn("resumed rl at global step 3", second[p])
    self.assertEmpty(drawn[0][0] & drawn[1][0])
    self.assertEmpty(drawn[0][1] & drawn[1][1])

    # Checkpoints: one host-state row per process; the learner state restores here.
    ckpts = workdir / "checkpoints"
    steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
    self.assertEqual(steps, [1, 2, 3, 4, 5, 6])
    meta = json.loads((ckpts / "3" / "meta" / "metadata").read_text())
    self.assertEqual(meta["process_count"], 2)
    rows = np.asarray(_restore(ckpts / "3" / "host_rows")["rows"])
    own = [checkpoint_host_rows.decode_row(r) for r in rows]
    self.assertEqual([m["step"] for _, m in own], [3, 3])
    for p, (host, m) in enumerate(own):
      self.assertGreater(m["data_position"], 0)
      for group in ("replay", "loop"):
        self.assertTrue(any(k.startswith(group + "/") for k in host), sorted(host))
      slots = [s for s in m["loop"]["slots"] if s]
      self.assertTrue(all(q % 2 == p for s in slots for q in s["positions"]))
    # Some RL checkpoint held a batch scored to its last stage, its final reward pending.
    pending = [len(m["loop"]["finals"]) for step in steps[2:]
               for _, m in map(checkpoint_host_rows.decode_row,
                               np.asarray(_restore(ckpts / str(step) / "host_rows")["rows"]))]
    self.assertTrue(any(pending), pending)
    ws1, ws2, rl4 = (_restore(ckpts / str(s) / "state")["state"] for s in (1, 2, 6))
    self.assertEqual([int(s["step"]) for s in (ws1, ws2, rl4)], [1, 2, 4])
    p1, p2 = jax.tree.leaves(ws1["params"]), jax.tree.leaves(ws2["params"])
    # A step trained.
    self.assertTrue(any(not np.array_equal(a, b) for a, b in zip(p1, p2, strict=True)))
    self.assertTrue(all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(rl4)))

    # Both processes evaluate the last checkpoint, each reading only its parameters' shards
    # (`Checkpointer.restore(only=...)`): the run's own final evaluation, exactly.
    logs = self._launch(tmp, "evaluate", "--step=6",
                        module="launch.evaluate")
    self.assertIn("greedy pass@1", logs[0])
    report = json.loads((workdir / "eval" / "step_6.json").read_text())
    self.assertEqual(report["metrics"]["eval/pass_at_1"], last["eval/pass_at_1"])


if __name__ == "__main__":
  absltest.main()
