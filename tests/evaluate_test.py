"""Tests for evaluation without training (`agentic_grpo.train.eval_only`, `launch/evaluate.py`).

A micro run (two warm-start steps, two RL updates) is evaluated from its checkpoints: with the
run's settings the numbers are the run's own evaluations of those steps (greedy pass@1, stage
rewards, sampled pass@k, the paired gain over the warm-start). A tiny random Qwen2-style chat
checkpoint (`tests/fixtures/chat_checkpoint.py`) is evaluated as loaded, and matches the
evaluation a training run makes of it before its first update.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import exit_codes
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import run_lock
from agentic_grpo.train import eval_only
from experiments import tiny_codegen
from tests.fixtures import chat_checkpoint
from tests.fixtures import micro_run
from tests.fixtures import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Wall-clock numbers differ between two evaluations of the same parameters.
_WALL_CLOCK = ("eval/seconds",)


LuckyWorkflow = micro_run.LuckyWorkflow  # passes by the parity of the sampled tokens


def _micro_config(**eval_section) -> config_lib.TrainConfig:
  """The embedded default shrunk to a micro model: 2 warm-start steps, 2 RL updates."""
  c = tiny_codegen.get_config()
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64,
                 max_seq_len=256)
  c.task.eval_size = 3
  c.workflow.max_new_tokens = 12
  c.rl.update(tasks_per_batch=1, group_size=2, rows_per_update=4, buckets=(128,),
              batches_in_flight=2, num_steps=2)
  c.warmstart.update(steps=2, batch_size=4, seq_len=128)
  c.eval.update(every=0, num_samples=2, k=(1, 2), temperature=1.0, **eval_section)
  micro_run.pin_rl_levers(c)  # a random model's groups tie: still take steps
  c.checkpoint.update(every=1, max_to_keep=8)
  c.log.progress_bar = False
  c.mesh.data = 1
  return config_lib.from_config_dict(c)


def _rows(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _evals(metrics: dict) -> dict:
  return {k: v for k, v in metrics.items() if k.startswith("eval/") and k not in _WALL_CLOCK}


def _launch(*args: str) -> subprocess.CompletedProcess:
  env = xla_flags.child_env(PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-m", "launch.evaluate", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


class CheckpointEvaluationTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2)
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.workdir = os.path.join(cls.tmp, "run")
    cls.result = train.run(_micro_config(), cls.workdir, pool=cls.pool,
                           workflow_factory=LuckyWorkflow)

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    shutil.rmtree(cls.tmp)
    super().tearDownClass()

  def test_latest_checkpoint_scores_as_the_runs_final_evaluation(self):
    record = eval_only.evaluate_checkpoint(self.workdir, pool=self.pool,
                                           workflow_factory=LuckyWorkflow)
    self.assertEqual((record["step"], self.result["step"]), (4, 4))
    final = _evals(self.result["last_eval"])
    self.assertIn("eval/pass_at_2_sampled", final)
    self.assertIn("eval/pass_at_1_gain", final)  # the warm-start's results are in the meta
    self.assertGreater(final["eval/pass_at_2_sampled"], 0.0)  # a check that can fail
    self.assertEqual(_evals(record["metrics"]), final)
    self.assertLen(record["passed"], 3)
    self.assertLen(set(record["task_ids"]), 3)
    self.assertAlmostEqual(np.mean(record["passed"]), final["eval/pass_at_1"])

    # eval/step_4.json, and one metrics.jsonl row named eval_only/..., after the run's rows.
    with open(os.path.join(self.workdir, "eval", "step_4.json")) as f:
      self.assertEqual(json.load(f), record)
    row = _rows(self.workdir)[-1]
    self.assertEqual((row["step"], row["phase"]), (4, "eval_only"))
    self.assertEqual(row["eval_only/pass_at_2_sampled"], final["eval/pass_at_2_sampled"])
    self.assertFalse(any(k.startswith("eval/") for k in row))
    self.assertIn("greedy pass@1", eval_only.summary(record))

  def test_warmstart_checkpoint_scores_as_the_warmstart_evaluation(self):
    warm = next(r for r in _rows(self.workdir)
                if r.get("phase") == "warmstart" and "eval/pass_at_1" in r)
    record = eval_only.evaluate_checkpoint(self.workdir, 2, pool=self.pool,
                                           workflow_factory=LuckyWorkflow)
    self.assertEqual(record["step"], 2)
    self.assertGreater(warm["eval/pass_at_2_sampled"], 0.0)
    self.assertEqual(_evals(record["metrics"]), _evals(warm))

  def test_overrides_change_the_evaluation(self):
    cfg = eval_only.with_overrides(eval_only.saved_config(self.workdir), num_samples=3,
                                   k=(1, 3), eval_size=2, temperature=0.5)
    self.assertEqual((cfg.eval.num_samples, cfg.eval.k, cfg.task.eval_size,
                      cfg.eval.temperature), (3, (1, 3), 2, 0.5))
    record = eval_only.evaluate_checkpoint(self.workdir, 3, cfg=cfg, pool=self.pool)
    self.assertLen(record["passed"], 2)
    self.assertIn("eval/pass_at_3_sampled", record["metrics"])
    self.assertNotIn("eval/pass_at_2_sampled", record["metrics"])
    # The warm-start was evaluated on 3 tasks: no paired gain on 2.
    self.assertNotIn("eval/pass_at_1_gain", record["metrics"])
    with self.assertRaisesRegex(ValueError, r"config\.eval\.k must be in \[1, num_samples=2\]"):
      eval_only.with_overrides(cfg, num_samples=2)

  def test_errors_name_what_is_missing(self):
    with self.assertRaisesRegex(checkpointer.MissingCheckpointError,
                                r"no checkpoint at step 99 .*steps there: \[1, 2, 3, 4\]"):
      eval_only.evaluate_checkpoint(self.workdir, 99, pool=self.pool)
    missing = os.path.join(self.create_tempdir().full_path, "nope")
    with self.assertRaisesRegex(eval_only.WorkdirError, r"workdir .*nope does not exist"):
      eval_only.evaluate_checkpoint(missing, pool=self.pool)
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(eval_only.WorkdirError, r"no config\.json"):
      eval_only.evaluate_checkpoint(empty, pool=self.pool)
    with open(os.path.join(empty, "config.json"), "w") as f:
      json.dump(config_lib.to_dict(_micro_config()), f)
    with self.assertRaisesRegex(checkpointer.MissingCheckpointError, r"no checkpoint in"):
      eval_only.evaluate_checkpoint(empty, pool=self.pool)
    with self.assertRaisesRegex(eval_only.WorkdirError, r"holds a run's checkpoints"):
      eval_only.evaluate_model(_micro_config(), self.workdir, pool=self.pool)

  def test_damaged_newest_checkpoint_falls_back_and_a_named_one_errors(self):
    copy = os.path.join(self.create_tempdir().full_path, "run")
    shutil.copytree(self.workdir, copy, ignore=shutil.ignore_patterns("eval", ".run.lock"))
    newest = pathlib.Path(copy, "checkpoints", "4")
    data = max((p for p in newest.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])
    self.assertEqual(eval_only.checkpoint_step(copy, None), 3)  # the newest intact one
    with self.assertRaisesRegex(checkpointer.CheckpointIntegrityError, r"damaged checkpoint"):
      eval_only.evaluate_checkpoint(copy, 4, pool=self.pool)
    self.assertTrue(newest.is_dir())  # a named step's evaluation moves nothing aside

  def test_saved_config_from_another_version_or_damaged(self):
    tmp = self.create_tempdir().full_path
    saved = config_lib.to_dict(_micro_config())
    del saved["eval"]["temperature"]  # written before the field existed: its default
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(saved, f)
    self.assertEqual(eval_only.saved_config(tmp).eval.temperature,
                     config_lib.TrainConfig().eval.temperature)
    saved["eval"]["retired_knob"] = 1  # a field this version does not know: named
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(saved, f)
    with self.assertRaisesRegex(ValueError, r"eval\.retired_knob"):
      eval_only.saved_config(tmp)
    for text in ('{"model": {', "[1, 2]", "\udcff"):  # cut short, not an object, not UTF-8
      with open(os.path.join(tmp, "config.json"), "w", errors="surrogateescape") as f:
        f.write(text)
      with self.assertRaisesRegex(eval_only.WorkdirError, r"config\.json (is not readable "
                                  r"JSON|holds a list)"):
        eval_only.saved_config(tmp)

  def test_model_evaluation_refuses_a_live_runs_workdir(self):
    workdir = self.create_tempdir().full_path
    with run_lock.WorkdirLock(workdir):  # a run that has not checkpointed yet
      with self.assertRaisesRegex(eval_only.WorkdirError, r"in use by another run"):
        eval_only.evaluate_model(_micro_config(), workdir, pool=self.pool)
    self.assertFalse(os.path.exists(os.path.join(workdir, "config.json")))

  def test_command_line(self):
    proc = _launch(f"--workdir={self.workdir}", "--step=3", "--num_samples=3", "--k=1,3",
                   "--eval_size=2", "--temperature=0.5")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertRegex(proc.stdout, r"eval: checkpoint 3 of .* on 2 held-out synthetic tasks: "
                     r"greedy pass@1 .*; sampled \(n=3, T=0.5\): pass@1 .*, pass@3 ")
    with open(os.path.join(self.workdir, "eval", "step_3.json")) as f:
      record = json.load(f)
    self.assertEqual((record["step"], record["eval"]["k"], len(record["passed"])), (3, [1, 3], 2))
    self.assertIn((3, "eval_only"), [(r["step"], r["phase"]) for r in _rows(self.workdir)])

  def test_command_line_exit_codes(self):
    proc = _launch(f"--workdir={self.workdir}", "--step=99")
    self.assertEqual(proc.returncode, exit_codes.CHECKPOINT_DAMAGED, proc.stderr)
    self.assertRegex(proc.stderr, r"error: no checkpoint at step 99 .*steps there: \[1, 2, 3, 4\]")
    proc = _launch("--workdir=/nonexistent/run")
    self.assertEqual(proc.returncode, exit_codes.CONFIG_ERROR, proc.stderr)
    self.assertRegex(proc.stderr, r"error: workdir /nonexistent/run does not exist")
    proc = _launch()
    self.assertEqual(proc.returncode, exit_codes.CONFIG_ERROR, proc.stderr)
    self.assertIn("error: --workdir is required", proc.stderr)
    proc = _launch(f"--workdir={self.workdir}", "--config.rl.group_size=4")
    self.assertEqual(proc.returncode, exit_codes.CONFIG_ERROR, proc.stderr)
    self.assertIn("holds a run's checkpoints", proc.stderr)
    proc = _launch(f"--workdir={self.workdir}", "--k=1,5")
    self.assertEqual(proc.returncode, exit_codes.CONFIG_ERROR, proc.stderr)
    self.assertIn("config.eval.k must be in [1, num_samples=2]", proc.stderr)
    proc = _launch(f"--workdir={self.workdir}", "--config.eval.nm_samples=3")
    self.assertEqual(proc.returncode, exit_codes.CONFIG_ERROR, proc.stderr)
    self.assertIn("did you mean config.eval.num_samples?", proc.stderr)


class ModelEvaluationTest(absltest.TestCase):

  def test_hf_checkpoint_as_loaded_scores_as_a_runs_first_evaluation(self):
    tmp = self.create_tempdir().full_path
    problems = chat_checkpoint.humaneval_problems()
    data = os.path.join(tmp, "humaneval.jsonl")
    with open(data, "w") as f:
      f.writelines(json.dumps(p) + "\n" for p in problems)
    model_dir = os.path.join(tmp, "model")
    chat_checkpoint.write_checkpoint(
        model_dir, [p["prompt"] + p["canonical_solution"] for p in problems])
    cfg = config_lib.from_config_dict({
        "model": {"source": "hf", "path": model_dir},
        "task": {"source": "humaneval", "path": data, "heldout_fraction": 0.5, "eval_size": 2},
        "workflow": {"prompt_format": "chat", "stages": ("code",), "max_new_tokens": 12},
        "rl": {"tasks_per_batch": 1, "group_size": 2, "rows_per_update": 4, "buckets": (512,),
               "batches_in_flight": 1, "num_steps": 1},
        "warmstart": {"steps": 0},
        "eval": {"every": 0, "num_samples": 2, "k": (1, 2)},
        "replay": {"skip_zero_advantage": False},
        "log": {"progress_bar": False, "tensorboard": False}, "mesh": {"data": 1}})
    with sandbox.SandboxPool(max_workers=2) as pool:
      record = eval_only.evaluate_model(cfg, os.path.join(tmp, "eval"), pool=pool,
                                        workflow_factory=LuckyWorkflow)
      # A run evaluates its initial policy (no warm-start) at step 0, before any update.
      run_dir = os.path.join(tmp, "run")
      train.run(cfg, run_dir, pool=pool, stop_after=1, workflow_factory=LuckyWorkflow)
    first = next(r for r in _rows(run_dir) if r["step"] == 0)
    self.assertEqual((record["step"], record["source"]), (0, "model"))
    self.assertGreater(record["metrics"]["eval/pass_at_2_sampled"], 0.0)
    self.assertEqual(_evals(record["metrics"]), _evals(first))
    self.assertEqual(record["task_ids"][0][:10], "HumanEval/")
    # The evaluated config is saved next to the result, as a run saves its own.
    saved = eval_only.saved_config(os.path.join(tmp, "eval"))
    self.assertEqual(saved, cfg)
    self.assertTrue(os.path.exists(os.path.join(tmp, "eval", "eval", "step_0.json")))


if __name__ == "__main__":
  absltest.main()
