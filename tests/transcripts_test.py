"""Sample transcripts of a run (`log.transcripts_every`): transcripts.jsonl and TensorBoard text;
the Weights & Biases writer (`log.wandb`), run offline."""

import glob
import json
import os
import sys
import time
import types
from unittest import mock

from absl.testing import absltest

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.train import metrics as metrics_lib
from experiments import tiny_codegen
from tests.fixtures import micro_run


def _micro(**log) -> config_lib.TrainConfig:
  c = tiny_codegen.get_config()
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64,
                 max_seq_len=256)
  c.task.eval_size = 2
  c.workflow.max_new_tokens = 12
  c.rl.update(tasks_per_batch=1, group_size=2, rows_per_update=4, buckets=(128,),
              batches_in_flight=2, num_steps=3)
  c.warmstart.update(steps=1, batch_size=4, seq_len=128)
  c.eval.update(every=0, num_samples=0)
  micro_run.pin_rl_levers(c)  # a random model's groups tie: still take steps
  c.checkpoint.every = 0
  c.log.update(progress_bar=False, **log)
  c.mesh.data = 1
  return config_lib.from_config_dict(c)


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class TranscriptsTest(absltest.TestCase):

  def test_a_run_writes_transcripts_every_n_updates(self):
    workdir = self.create_tempdir().full_path
    cfg = _micro(transcripts_every=1, transcripts=2)
    with sandbox.SandboxPool(max_workers=2) as pool:
      result = train.run(cfg, workdir, pool=pool)
    rows = _rows(os.path.join(workdir, "transcripts.jsonl"))
    self.assertNotEmpty(rows)
    steps = sorted({r["step"] for r in rows})
    self.assertLessEqual(steps[-1], result["step"])
    self.assertGreater(steps[0], cfg.warmstart.steps)  # RL updates only
    for r in rows:
      self.assertContainsSubset({"task_id", "prompt", "stages", "final_reward", "tests_passed",
                                 "num_tests", "policy_version"}, r)
      self.assertNotEmpty(r["prompt"])
      self.assertEqual([s["stage"] for s in r["stages"]], list(cfg.workflow.stages))
      for s in r["stages"]:
        self.assertIsInstance(s["output"], str)
        self.assertBetween(s["reward"], 0.0, 1.0)
      self.assertBetween(r["final_reward"], 0.0, 1.0)
      self.assertBetween(r["tests_passed"], 0, r["num_tests"])
    self.assertTrue(all(sum(r["step"] == s for r in rows) <= 2 for s in steps))
    events = b"".join(open(os.path.join(workdir, "tb", n), "rb").read()
                      for n in os.listdir(os.path.join(workdir, "tb")))
    self.assertIn(b"transcripts", events)

  def test_off_by_default(self):
    self.assertEqual(config_lib.TrainConfig().log.transcripts_every, 0)
    with self.assertRaisesRegex(ValueError, "config.log.transcripts_every must be >= 0"):
      config_lib.from_config_dict({"log": {"transcripts_every": -1}})

  def test_writer_keeps_no_transcript_past_the_restored_step_and_renders_markdown(self):
    workdir = self.create_tempdir().full_path
    cfg = config_lib.from_config_dict({"log": {"progress_bar": False, "tensorboard": False}})
    t = {"task_id": "t/1", "prompt": "f(x)->?", "stages": [
        {"stage": "code", "output": "```def f(x): return x```", "reward": 1.0, "parsed": True,
         "valid": True}], "final_reward": 1.0, "tests_passed": 3, "num_tests": 3,
         "policy_version": 4}
    writer = metrics_lib.MetricsWriter(workdir, cfg, 10, 0)
    writer.write_transcripts(3, [t])
    writer.write_transcripts(5, [t, t])
    writer.write_transcripts(6, [])
    writer.close()
    self.assertEqual([r["step"] for r in _rows(os.path.join(workdir, "transcripts.jsonl"))],
                     [3, 5, 5])
    metrics_lib.MetricsWriter(workdir, cfg, 10, 4).close()  # resumed at step 4
    self.assertEqual([r["step"] for r in _rows(os.path.join(workdir, "transcripts.jsonl"))],
                     [3])
    text = metrics_lib.transcript_markdown({"step": 3, **t})
    self.assertIn("**t/1**", text)
    self.assertIn("*code* output (reward 1.0, parsed True, counted True):", text)
    self.assertIn("hidden tests passed 3/3", text)
    self.assertNotIn("```def", text)  # a fence inside an output cannot close the block


_TRANSCRIPT = {"task_id": "t/1", "prompt": "f(x)->?", "stages": [
    {"stage": "code", "output": "return x", "reward": 1.0, "parsed": True, "valid": True}],
               "final_reward": 1.0, "tests_passed": 3, "num_tests": 3, "policy_version": 4}


class WandbTest(absltest.TestCase):

  def _cfg(self, **log):
    return config_lib.from_config_dict({"log": {"progress_bar": False, "tensorboard": False,
                                                "wandb": True, **log}})

  def test_offline_run_beside_the_metrics(self):
    workdir = self.create_tempdir().full_path
    with mock.patch.dict(os.environ, {"WANDB_SILENT": "true", "WANDB_DIR": workdir}):
      writer = metrics_lib.MetricsWriter(workdir, self._cfg(wandb_mode="offline"), 10, 0)
      writer.write({"step": 1, "phase": "rl", "eval/pass_at_1": 0.25, "loss/kl": float("nan")})
      writer.write_transcripts(1, [_TRANSCRIPT])
      writer.close()
    runs = glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))
    self.assertLen(runs, 1)
    # W&B's service writes the run file after `finish` returns: wait for its records.
    deadline = time.monotonic() + 60
    while True:
      with open(runs[0], "rb") as f:
        data = f.read()
      if b"transcripts" in data or time.monotonic() > deadline:
        break
      time.sleep(0.2)
    self.assertIn(b"eval/pass_at_1", data)
    self.assertIn(b"transcripts", data)
    self.assertTrue(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "files", "media",
                                           "html", "transcripts_1_*.html")))

  def test_rows_go_at_their_step_and_the_id_follows_the_workdir(self):
    calls = []

    class Run:
      def log(self, values, step):
        calls.append((values, step))

      def finish(self):
        calls.append("finish")

    fake = types.SimpleNamespace(Html=lambda text: ("html", text), inits=[])
    fake.init = lambda **kw: (fake.inits.append(kw), Run())[1]
    workdir = self.create_tempdir().full_path
    with mock.patch.dict(sys.modules, {"wandb": fake}):
      writer = metrics_lib.MetricsWriter(workdir, self._cfg(wandb_project="p"), 10, 0)
      writer.write({"step": 2, "phase": "rl", "reward/final": 0.5, "flag": True,
                    "loss/kl": float("inf")})
      writer.write_transcripts(2, [_TRANSCRIPT])
      writer.close()
      metrics_lib.MetricsWriter(workdir, self._cfg(wandb_project="p"), 10, 2).close()
    self.assertEqual(calls[0], ({"reward/final": 0.5}, 2))
    self.assertEqual(calls[1][1], 2)
    self.assertIn("hidden tests passed 3/3", calls[1][0]["transcripts"][1])
    self.assertEqual(calls[2], "finish")
    first, resumed = fake.inits
    self.assertEqual((first["project"], first["resume"], first["mode"]), ("p", "allow", None))
    self.assertEqual(first["id"], resumed["id"])  # a resume continues the same W&B run
    self.assertEqual(first["config"]["log"]["wandb"], True)

  def test_without_the_package_an_input_error(self):
    with mock.patch.dict(sys.modules, {"wandb": None}):
      with self.assertRaisesRegex(errors.InputError, "config.log.wandb=True needs the wandb"):
        metrics_lib.MetricsWriter(self.create_tempdir().full_path, self._cfg(), 10, 0)
    with self.assertRaisesRegex(ValueError, "config.log.wandb_mode"):
      self._cfg(wandb_mode="cloud")


if __name__ == "__main__":
  absltest.main()
