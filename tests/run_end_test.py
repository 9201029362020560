"""How `launch/train.py` runs end: preempted by SIGTERM and resumed, or ended without progress.

Runs launch/train.py as a subprocess with a micro config. SIGTERM mid-RL: the run finishes its
step, writes a checkpoint and exits with `exit_codes.PREEMPTED`, its last line saying so; a
restart on the same workdir resumes there, and the concatenated metrics history equals an
uninterrupted run's (wall-clock columns aside). A run whose RL phase stops for lack of learning
signal exits with `exit_codes.NO_PROGRESS`, its last line naming the cause. A resume that changes
a field the saved state depends on exits with `exit_codes.CONFIG_DRIFT`, naming the field's old
and new value, and leaves `config.json` as it was. Flipped bytes in the latest checkpoint: the run
names it, falls back to the previous one and resumes; with every checkpoint damaged it exits with
`exit_codes.CHECKPOINT_DAMAGED`.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl.testing import absltest

from agentic_grpo import exit_codes
from agentic_grpo.train import metric_rows
from tests.fixtures import micro_run
from tests.fixtures import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
_LIMIT_S = 600
_MICRO = (
    *micro_run.PINNED_RL_LEVER_FLAGS,
    "--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.mlp_dim=64",
    "--config.model.max_seq_len=256", "--config.task.eval_size=2",
    "--config.workflow.max_new_tokens=12", "--config.rl.tasks_per_batch=1",
    "--config.rl.group_size=2", "--config.rl.rows_per_update=4", "--config.rl.buckets=(128,)",
    "--config.rl.batches_in_flight=2", "--config.warmstart.steps=1",
    "--config.warmstart.batch_size=4", "--config.warmstart.seq_len=128",
    "--config.eval.every=0", "--config.eval.num_samples=0", "--config.eval.k=1",
    "--config.checkpoint.every=0", "--config.log.progress_bar=False",
    "--config.log.tensorboard=False", "--config.log.plot=False", "--config.mesh.data=1",
)
_WALL_CLOCK = metric_rows.WALL_CLOCK


def _command(workdir: str, *overrides: str) -> list[str]:
  return [sys.executable, "-m", "launch.train", "--workdir", workdir, *_MICRO, *overrides]


def _env() -> dict[str, str]:
  return xla_flags.child_env(PYTHONPATH=str(ROOT))


def _history(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [{k: v for k, v in r.items() if k not in _WALL_CLOCK} for r in rows]


def _last_line(text: str) -> str:
  return text.strip().splitlines()[-1]


def _flip_bytes(workdir: str, step: int) -> str:
  """Inverts 64 bytes in the middle of checkpoint `step`'s largest state file; returns its path."""
  files = [p for p in pathlib.Path(workdir, "checkpoints", str(step), "state").rglob("*")
           if p.is_file()]
  target = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(target.read_bytes())
  mid = len(data) // 2
  data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
  target.write_bytes(bytes(data))
  return str(target.relative_to(pathlib.Path(workdir, "checkpoints", str(step))))


class RunEndTest(absltest.TestCase):

  def _run(self, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=_LIMIT_S)

  def test_sigterm_mid_rl_then_restart_equals_an_uninterrupted_run(self):
    steps = ("--config.rl.num_steps=6", "--config.replay.skip_zero_advantage=False")
    full, parts = self.create_tempdir().full_path, self.create_tempdir().full_path
    done = self._run(*_command(full, *steps))
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    proc = subprocess.Popen(_command(parts, *steps), cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    metrics = pathlib.Path(parts, "metrics.jsonl")
    deadline = time.time() + _LIMIT_S
    while time.time() < deadline and proc.poll() is None:  # the first RL row: mid-RL
      if metrics.exists() and '"phase": "rl"' in metrics.read_text():
        break
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=_LIMIT_S)
    self.assertEqual(proc.returncode, exit_codes.PREEMPTED, err[-3000:])
    self.assertIn("stopped by SIGTERM at global step", _last_line(err))
    stopped = len(_history(parts))
    again = self._run(*_command(parts, *steps))
    self.assertEqual(again.returncode, 0, again.stderr[-3000:])
    self.assertIn("resumed rl at global step", again.stderr)
    self.assertLess(stopped, len(_history(full)))
    self.assertEqual(_history(parts), _history(full))

  def test_rl_without_learning_signal_exits_no_progress_naming_the_cause(self):
    proc = self._run(*_command(self.create_tempdir().full_path, "--config.rl.num_steps=50",
                               "--config.rl.max_idle_batches=2",
                               "--config.replay.skip_zero_advantage=True"))
    self.assertEqual(proc.returncode, exit_codes.NO_PROGRESS, proc.stderr[-3000:])
    last = _last_line(proc.stderr)
    self.assertIn("the RL phase ended early", last)
    self.assertIn("all advantages 0", last)

  def test_resume_with_a_changed_group_size_is_refused_and_config_json_kept(self):
    workdir = self.create_tempdir().full_path
    first = self._run(*_command(workdir, "--config.rl.num_steps=2", "--stop_after=1"))
    self.assertEqual(first.returncode, 0, first.stderr[-3000:])
    saved = pathlib.Path(workdir, "config.json").read_bytes()
    proc = self._run(*_command(workdir, "--config.rl.num_steps=2", "--config.rl.group_size=4"))
    self.assertEqual(proc.returncode, exit_codes.CONFIG_DRIFT, proc.stderr[-3000:])
    self.assertIn("rl.group_size: 2 -> 4", proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)
    self.assertEqual(pathlib.Path(workdir, "config.json").read_bytes(), saved)

  def test_damaged_latest_checkpoint_falls_back_and_none_intact_stops(self):
    workdir = self.create_tempdir().full_path
    steps = ("--config.rl.num_steps=3", "--config.checkpoint.every=1",
             "--config.checkpoint.max_to_keep=2", "--config.replay.skip_zero_advantage=False")
    first = self._run(*_command(workdir, *steps, "--stop_after=2"))
    self.assertEqual(first.returncode, 0, first.stderr[-3000:])
    damaged = _flip_bytes(workdir, 2)
    proc = self._run(*_command(workdir, *steps, "--stop_after=3"))
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn(f"damaged checkpoint 2: {damaged}: SHA-256 differs", proc.stderr)
    self.assertIn("restoring checkpoint 1 of", proc.stderr)
    self.assertIn("resumed warmstart at global step 1", proc.stderr)
    self.assertIn("done: global step 3", proc.stdout)
    self.assertTrue(pathlib.Path(workdir, "checkpoints-damaged", "2").is_dir())
    kept = sorted(int(p.name) for p in pathlib.Path(workdir, "checkpoints").iterdir()
                  if p.name.isdigit())
    self.assertEqual(kept[-1], 3)
    for step in kept:
      _flip_bytes(workdir, step)
    proc = self._run(*_command(workdir, *steps))
    self.assertEqual(proc.returncode, exit_codes.CHECKPOINT_DAMAGED, proc.stderr[-3000:])
    self.assertIn("error: no intact checkpoint in", proc.stderr)
    for step in kept:
      self.assertIn(f"checkpoint {step}: ", proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  absltest.main()
