"""Tests of experiments/warmstart_control: a micro run (three warm-start steps, two RL updates,
one checkpoint kept by rotation besides the warm-start's), then its control of two more
warm-start steps from the kept checkpoint: the plan, the continued steps, the report's fields
and numbers, and a rerun that trains and evaluates nothing."""

import contextlib
import io
import json
import os
import shutil
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest

from agentic_grpo import config as config_lib
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.train import eval_only
from experiments import warmstart_control as control
from tests.fixtures import micro_run

WS, RL = 3, 2
LuckyWorkflow = micro_run.LuckyWorkflow


def _micro() -> config_lib.TrainConfig:
  return micro_run.micro_config(WS, RL)


_rows = micro_run.rows


def _losses(workdir: str) -> dict[int, float]:
  return {r["step"]: r["warmstart/loss"] for r in _rows(workdir) if r["phase"] == "warmstart"}


class WarmstartControlTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2)
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.run_dir = os.path.join(cls.tmp, "run")
    cls.cfg = _micro()
    micro_run.train_finished(cls.run_dir, cls.pool, WS, RL, cfg=cls.cfg)

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    shutil.rmtree(cls.tmp)
    super().tearDownClass()

  def _control(self, **kwargs):
    return control.run_control(self.run_dir, pool=self.pool, workflow_factory=LuckyWorkflow,
                               **kwargs)

  def test_the_runs_warmstart_checkpoint_is_kept(self):
    ck = checkpointer.Checkpointer(os.path.join(self.run_dir, "checkpoints"))
    self.assertEqual(ck.all_steps(), [WS, WS + RL])
    self.assertEqual(ck.read_meta(WS)["phase"], "warmstart")

  def test_steps_follow_the_rl_phase_seconds(self):
    rows = _rows(self.run_dir)
    p = control.plan(self.run_dir, self.cfg)
    warm = [r for r in rows if r["phase"] == "warmstart"]
    self.assertEqual([r["step"] for r in warm], [1, 2, 3])
    # Intervals 1 -> 2 and 2 -> 3 (the first row holds the start-up and compilation).
    self.assertAlmostEqual(p.warmstart_seconds_per_step, (warm[2]["seconds"] -
                                                          warm[0]["seconds"]) / 2)
    self.assertEqual(p.rl_seconds, [r for r in rows if r["phase"] == "rl"][-1]["rl/seconds"])
    self.assertEqual(p.steps, max(1, round(p.rl_seconds / p.warmstart_seconds_per_step)))
    self.assertEqual((p.ws, p.rl_step, p.steps_from), (WS, WS + RL, "budget"))
    self.assertEqual(control.plan(self.run_dir, self.cfg, 7).steps, 7)
    # An interval across a resume (the clock restarted) is left out.
    resumed = [{"step": 1, "seconds": 10.0}, {"step": 2, "seconds": 11.0},
               {"step": 3, "seconds": 2.0}, {"step": 5, "seconds": 5.0}]
    self.assertAlmostEqual(control.seconds_per_step(resumed), (1.0 + 3.0) / 3)
    self.assertIsNone(control.seconds_per_step(resumed[:1]))

  def test_learning_rate_schedules(self):
    final = control.control_config(self.cfg, WS, 2, "final").warmstart
    w = self.cfg.warmstart
    self.assertEqual((final.steps, final.warmup_steps, final.final_lr_fraction), (WS + 2, 0, 1.0))
    self.assertAlmostEqual(final.learning_rate, w.learning_rate * w.final_lr_fraction)
    stretched = control.control_config(self.cfg, WS, 2, "stretched")
    self.assertEqual(stretched.warmstart, w.__class__(**{**w.__dict__, "steps": WS + 2}))
    self.assertEqual(stretched.rl.num_steps, 0)
    with self.assertRaisesRegex(control.ControlError, "warm-up"):
      control.control_config(self.cfg, 1, 2, "final")  # ended within its warm-up step

  def test_a_run_without_its_warmstart_checkpoint_is_refused(self):
    rotated = os.path.join(self.create_tempdir().full_path, "run")
    shutil.copytree(self.run_dir, rotated, ignore=shutil.ignore_patterns(control.OUT_NAME))
    shutil.rmtree(os.path.join(rotated, "checkpoints", str(WS)))
    with self.assertRaisesRegex(control.ControlError, "keep_warmstart"):
      control.plan(rotated, self.cfg, 2)

  def test_control_continues_the_warmstart_and_reports_beside_rl(self):
    out = os.path.join(self.run_dir, control.OUT_NAME)
    result = self._control(steps=2)
    self.assertFalse(result["skipped"])
    with open(os.path.join(out, control.REPORT)) as f:
      saved = json.load(f)
    self.assertEqual(saved, {k: v for k, v in result.items() if k != "skipped"})
    self.assertTrue(os.path.exists(os.path.join(out, control.DONE)))
    self.assertEqual((saved["warmstart_step"], saved["control_step"], saved["rl_step"]),
                     (WS, WS + 2, WS + RL))
    self.assertEqual((saved["steps"], saved["steps_from"], saved["schedule"]),
                     (2, "flag", "final"))
    self.assertGreater(saved["rl_seconds"], 0.0)
    self.assertGreater(saved["control_seconds_per_step"], 0.0)

    # The control's history: the run's warm-start rows, then steps 4 and 5 continued from the
    # kept checkpoint (the loss carries on from the run's, far below a fresh model's).
    rows = [r for r in _rows(out) if r["phase"] == "warmstart"]
    self.assertEqual([r["step"] for r in rows], [1, 2, 3, 4, 5])
    self.assertEqual(rows[:3], [r for r in _rows(self.run_dir) if r["phase"] == "warmstart"])
    run_loss, loss = _losses(self.run_dir), _losses(out)
    drop = run_loss[1] - run_loss[3]
    self.assertGreater(drop, 0.0)
    self.assertLess(abs(loss[4] - run_loss[3]), drop / 2)
    self.assertLess(loss[5], run_loss[1] - drop / 2)
    ck = checkpointer.Checkpointer(os.path.join(out, "checkpoints"))
    self.assertEqual(ck.latest_step(), WS + 2)
    self.assertEqual(ck.read_meta()["phase"], "warmstart")
    with open(os.path.join(out, "config.json")) as f:
      cfg = json.load(f)
    self.assertEqual((cfg["warmstart"]["steps"], cfg["rl"]["num_steps"]), (WS + 2, 0))

    # The same held-out tasks, three records; the numbers are the runs' own evaluations.
    for name, (wd, step) in {"warmstart": (self.run_dir, WS), "control": (out, WS + 2),
                             "rl": (self.run_dir, WS + RL)}.items():
      path = os.path.join(wd, "eval", f"step_{step}.json")
      self.assertEqual(saved["records"][name], os.path.abspath(path))
      with open(path) as f:
        self.assertEqual(json.load(f)["task_ids"], saved["task_ids"])
    self.assertLen(saved["task_ids"], 4)
    by_step = {(r["phase"], r["step"]): r for r in _rows(self.run_dir)}
    p, g = saved["pass_at_1"], saved["gain"]
    self.assertAlmostEqual(p["warmstart"], by_step["warmstart", WS]["eval/pass_at_1"])
    self.assertAlmostEqual(p["rl"], by_step["rl", WS + RL]["eval/pass_at_1"])
    self.assertAlmostEqual(p["control"], rows[-1]["eval/pass_at_1"])
    self.assertAlmostEqual(g["control"]["gain"], p["control"] - p["warmstart"])
    self.assertAlmostEqual(g["rl"]["gain"], p["rl"] - p["warmstart"])
    self.assertAlmostEqual(g["rl_minus_control"]["gain"], p["rl"] - p["control"])
    for v in g.values():
      self.assertGreaterEqual(v["stderr"], 0.0)
    logged = by_step["rl", WS + RL]
    self.assertEqual(saved["rl_gain_logged"], {"gain": logged["eval/pass_at_1_gain"],
                                               "stderr": logged["eval/pass_at_1_gain_stderr"]})
    self.assertAlmostEqual(g["rl"]["gain"], logged["eval/pass_at_1_gain"])
    self.assertAlmostEqual(g["rl"]["stderr"], logged["eval/pass_at_1_gain_stderr"])
    table = control.markdown(saved)
    for line in (f"| warm-start | {WS} | {p['warmstart']:.3f} | |",
                 f"| control: 2 more warm-start steps | {WS + 2} | {p['control']:.3f} |",
                 f"| RL | {WS + RL} | {p['rl']:.3f} |", "RL minus control (paired): ",
                 "RL's gain as its run logged it"):
      self.assertIn(line, table)

    # A rerun trains and evaluates nothing; so does one after the report was lost.
    no_work = mock.patch.object(train, "run", side_effect=AssertionError("trained again"))
    no_eval = mock.patch.object(eval_only, "evaluate_checkpoint",
                                side_effect=AssertionError("evaluated again"))
    with no_work, no_eval:
      again = self._control(steps=2)
      self.assertTrue(again["skipped"])
      self.assertEqual({k: v for k, v in again.items() if k != "skipped"}, saved)
      os.remove(os.path.join(out, control.DONE))
      os.remove(os.path.join(out, control.REPORT))
      self.assertEqual({k: v for k, v in self._control(steps=2).items() if k != "skipped"},
                       saved)
      with self.assertRaisesRegex(control.ControlError, "another --out"):
        self._control(steps=3)
      flag_values = flags.FlagValues()  # the program's flags, apart from the test process's
      control.define_flags(flag_values)
      flag_values(["warmstart_control", f"--run={self.run_dir}", "--steps=2"])
      with contextlib.redirect_stdout(io.StringIO()) as printed:
        control.main(["warmstart_control"])
    self.assertIn(table, printed.getvalue())

    # The other schedule from the same checkpoint: step 4's loss (before its update) is the
    # same, a function of the kept parameters and batch 3 only; step 5's differs.
    stretched = os.path.join(self.create_tempdir().full_path, "stretched")
    other = self._control(steps=2, out=stretched, schedule="stretched")
    self.assertEqual(other["schedule"], "stretched")
    self.assertEqual(_losses(stretched)[4], loss[4])
    self.assertNotEqual(_losses(stretched)[5], loss[5])
    self.assertEqual(other["pass_at_1"]["rl"], p["rl"])  # the run's records read back


if __name__ == "__main__":
  absltest.main()
