"""Tests of experiments/rl_sweep: two micro runs (seeds 0 and 1: three warm-start steps, two RL
updates), then a sweep of two arms from their kept warm-start checkpoints: each arm-seed
starts from its run's warm-start and trains its own RL phase, the report's numbers are the
arms' final evaluations and their differences from the runs' own, a rerun trains nothing, and
malformed arms are refused."""

import json
import os
import shutil
import tempfile
import threading
from unittest import mock

from absl import app
from absl import flags
from absl.testing import absltest

from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import run_lock
from experiments import rl_sweep
from experiments import warmstart_control
from tests.fixtures import micro_run

WS, RL = 3, 2
ARMS = ("fast: optim.learning_rate=0.05", "longer: rl.num_steps=3 optim.schedule=constant")


_rows = micro_run.rows


class RlSweepTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2)
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.runs = []
    for seed in (0, 1):
      run = os.path.join(cls.tmp, f"run{seed}")
      micro_run.train_finished(run, cls.pool, WS, RL, seed)
      cls.runs.append(run)
    cls.root = os.path.join(cls.tmp, "sweep")
    cls.arms = [rl_sweep.parse_arm(a) for a in ARMS]
    cls.report = rl_sweep.sweep(cls.runs, cls.root, cls.arms, pool=cls.pool,
                                workflow_factory=micro_run.LuckyWorkflow)

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    shutil.rmtree(cls.tmp)
    super().tearDownClass()

  def test_each_arm_starts_from_its_runs_warmstart(self):
    for arm, steps in (("fast", RL), ("longer", 3)):
      for seed, run in enumerate(self.runs):
        wd = rl_sweep.workdir(self.root, arm, seed)
        rows = _rows(wd)
        warm = [r for r in rows if r["phase"] == "warmstart"]
        self.assertEqual(warm, [r for r in _rows(run) if r["phase"] == "warmstart"])
        rl = [r for r in rows if r["phase"] == "rl"]
        self.assertEqual([r["step"] for r in rl], list(range(WS + 1, WS + steps + 1)))
        ck = checkpointer.Checkpointer(os.path.join(wd, "checkpoints"))
        try:
          self.assertEqual(ck.all_steps(), [WS, WS + steps])
        finally:
          ck.close()
        with open(os.path.join(wd, "config.json")) as f:
          cfg = json.load(f)
        self.assertEqual(cfg["seed"], seed)
        # The same parameters and seed as the run's RL phase began with: the same first batch.
        first = [r for r in _rows(run) if r["phase"] == "rl"][0]
        self.assertEqual(rl[0]["generated_tokens"], first["generated_tokens"])
        if arm == "fast":
          self.assertEqual((cfg["optim"]["learning_rate"], cfg["rl"]["num_steps"]), (0.05, RL))
        else:
          self.assertEqual((cfg["optim"]["schedule"], cfg["rl"]["num_steps"]), ("constant", 3))

  def test_the_report_holds_each_runs_final_evaluation(self):
    results = self.report["results"]
    self.assertEqual(set(results), {"run", "fast", "longer"})
    for arm in results:
      for seed, run in enumerate(self.runs):
        wd = run if arm == "run" else rl_sweep.workdir(self.root, arm, seed)
        final = [r for r in _rows(wd) if r["phase"] == "rl" and "eval/pass_at_1" in r][-1]
        got = results[arm][str(seed)]
        self.assertEqual(got["pass_at_1"], final["eval/pass_at_1"])
        self.assertEqual((got["gain"], got["stderr"]),
                         (final["eval/pass_at_1_gain"], final["eval/pass_at_1_gain_stderr"]))
        self.assertEqual(got["step"], final["step"])
    with open(os.path.join(self.root, "sweep.json")) as f:
      self.assertEqual(json.load(f), self.report)
    with open(os.path.join(self.root, "sweep.md")) as f:
      self.assertEqual(f.read(), self.report["markdown"])

  def test_summary_is_over_seeds_and_paired_by_seed(self):
    results = {"run": {0: {"pass_at_1": 0.25, "gain": 0.0, "stderr": 0.1, "warmstart": 0.25},
                       1: {"pass_at_1": 0.5, "gain": 0.25, "stderr": 0.1, "warmstart": 0.25}},
               "a": {0: {"pass_at_1": 0.5, "gain": 0.25, "stderr": 0.1, "warmstart": 0.25},
                     1: {"pass_at_1": 1.0, "gain": 0.75, "stderr": 0.1, "warmstart": 0.25}}}
    s = rl_sweep.summarise(results)
    self.assertAlmostEqual(s["a"]["gain"], 0.5)
    self.assertAlmostEqual(s["a"]["gain_se"], 0.25)  # std(ddof=1) 0.354 / sqrt(2)
    self.assertAlmostEqual(s["a"]["diff"], 0.375)  # differences 0.25 and 0.5
    self.assertAlmostEqual(s["a"]["diff_se"], 0.125)
    self.assertEqual((s["run"]["diff"], s["run"]["diff_se"]), (0.0, 0.0))
    one = rl_sweep.summarise({k: {0: v[0]} for k, v in results.items()})
    self.assertIsNone(one["a"]["gain_se"])
    table = rl_sweep.markdown(results, [rl_sweep.Arm("a", ("optim.learning_rate=1.0",))])
    self.assertIn("| a | optim.learning_rate=1.0 | 0.500 (+0.250 ± 0.100) | 1.000 (+0.750 ± "
                  "0.100) | +0.500 ± 0.250 | +0.375 ± 0.125 |", table)

  def test_a_rerun_trains_nothing(self):
    with mock.patch.object(train, "run", side_effect=AssertionError("trained again")):
      again = rl_sweep.sweep(self.runs, self.root, self.arms)
    self.assertEqual(again["results"], self.report["results"])
    other = rl_sweep.Arm("fast", ("optim.learning_rate=1e-3",))
    with self.assertRaisesRegex(rl_sweep.SweepError, "holds arm"):
      rl_sweep.run_arm(self.runs[0], self.root, other)

  def test_program_prints_the_report(self):
    root = os.path.join(self.create_tempdir().full_path, "sweep")
    shutil.copytree(self.root, root)
    fv = flags.FlagValues()
    rl_sweep.define_flags(fv)
    fv([__file__, f"--runs={','.join(self.runs)}", f"--root={root}",
        f"--arm={ARMS[0]}"])
    with mock.patch.object(rl_sweep, "_RUNS", fv["runs"]), \
         mock.patch.object(rl_sweep, "_ROOT", fv["root"]), \
         mock.patch.object(rl_sweep, "_ARMS", fv["arm"]), \
         mock.patch.object(train, "run", side_effect=AssertionError("trained again")), \
         mock.patch("builtins.print") as printed:
      rl_sweep.main(["rl_sweep"])
    text = printed.call_args_list[0].args[0]
    self.assertIn("| fast | optim.learning_rate=0.05 |", text)
    self.assertNotIn("| longer |", text)

  def test_a_seeded_workdir_of_another_arm_is_refused_and_a_locked_run_named(self):
    root = self.create_tempdir().full_path
    wd = rl_sweep.workdir(root, "fast", 0)
    os.makedirs(wd)
    with open(os.path.join(wd, rl_sweep.ARM), "w") as f:  # seeded by another "fast", unfinished
      json.dump({"overrides": ["optim.learning_rate=1e-3"],
                 "run": os.path.realpath(self.runs[0])}, f)
    with mock.patch.object(train, "run", side_effect=AssertionError("trained")):
      with self.assertRaisesRegex(rl_sweep.SweepError, "holds arm"):
        rl_sweep.run_arm(self.runs[0], root, self.arms[0])
    with open(os.path.join(rl_sweep.workdir(self.root, "fast", 0), rl_sweep.ARM)) as f:
      self.assertEqual(json.load(f), {"overrides": list(self.arms[0].overrides),
                                      "run": os.path.realpath(self.runs[0])})
    fv = flags.FlagValues()
    rl_sweep.define_flags(fv)
    fv([__file__, f"--runs={self.runs[0]}", f"--root={self.create_tempdir().full_path}",
        f"--arm={ARMS[0]}"])
    locked = run_lock.WorkdirLockedError(self.runs[0], {"pid": 1})
    with mock.patch.object(rl_sweep, "_RUNS", fv["runs"]), \
         mock.patch.object(rl_sweep, "_ROOT", fv["root"]), \
         mock.patch.object(rl_sweep, "_ARMS", fv["arm"]), \
         mock.patch.object(rl_sweep, "_run_locked", side_effect=locked):
      with self.assertRaisesRegex(app.UsageError, "rerun the sweep"):
        rl_sweep.main(["rl_sweep"])

  def test_the_runs_lock_is_waited_for_then_refused(self):
    holder = run_lock.WorkdirLock(self.runs[1]).acquire()
    timer = threading.Timer(0.5, holder.release)
    timer.start()
    try:
      with rl_sweep._run_locked(self.runs[1], wait_s=30.0):  # pylint: disable=protected-access
        with self.assertRaises(run_lock.WorkdirLockedError):  # held now, by the sweep
          run_lock.WorkdirLock(self.runs[1]).acquire()
    finally:
      timer.join()
    with run_lock.WorkdirLock(self.runs[1]):
      with self.assertRaises(run_lock.WorkdirLockedError):
        with rl_sweep._run_locked(self.runs[1], wait_s=0.0):  # pylint: disable=protected-access
          pass

  def test_runs_must_be_finished_with_their_warmstart_kept_and_seeds_distinct(self):
    with self.assertRaisesRegex(rl_sweep.SweepError, "different seeds"):
      rl_sweep.sweep([self.runs[0], self.runs[0]], self.root, self.arms)
    rotated = os.path.join(self.create_tempdir().full_path, "run")
    shutil.copytree(self.runs[0], rotated)
    shutil.rmtree(os.path.join(rotated, "checkpoints", str(WS)))
    with self.assertRaisesRegex(warmstart_control.ControlError, "keep_warmstart"):
      rl_sweep.run_arm(rotated, self.create_tempdir().full_path, self.arms[0])
    with open(os.path.join(rotated, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in _rows(self.runs[0]) if r["phase"] != "rl")
    with self.assertRaisesRegex(rl_sweep.SweepError, "has not finished its RL phase"):
      rl_sweep.sweep([rotated], self.root, [])

  def test_runs_must_be_seeds_of_one_config(self):
    other = os.path.join(self.create_tempdir().full_path, "run")
    shutil.copytree(self.runs[1], other)
    path = os.path.join(other, "config.json")
    with open(path) as f:
      cfg = json.load(f)
    cfg["optim"]["learning_rate"] *= 2
    cfg["log"]["progress_bar"] = not cfg["log"]["progress_bar"]
    with open(path, "w") as f:
      json.dump(cfg, f)
    with self.assertRaisesRegex(rl_sweep.SweepError,
                                r"differs from .* in optim\.learning_rate \(") as e:
      rl_sweep.sweep([self.runs[0], other], self.create_tempdir().full_path, [])
    self.assertNotIn("progress_bar", str(e.exception))  # how a run reports may differ


class ParseArmTest(absltest.TestCase):

  def test_parses_name_and_overrides(self):
    arm = rl_sweep.parse_arm(" g16 : rl.group_size=16  rl.tasks_per_batch=8 ")
    self.assertEqual(arm, rl_sweep.Arm("g16", ("rl.group_size=16", "rl.tasks_per_batch=8")))

  def test_malformed_arms_are_refused(self):
    for text, message in (("optim.learning_rate=1e-3", "NAME: SECTION"),
                          (": optim.learning_rate=1e-3", "plain word"),
                          ("run: optim.learning_rate=1e-3", "plain word"),
                          ("a/b: optim.learning_rate=1e-3", "plain word"),
                          ("lr:", "no overrides"),
                          ("lr: optim.learning_rate", "SECTION.FIELD=VALUE"),
                          ("s: seed=3", "refused"),
                          ("w: warmstart.steps=10", "refused"),
                          ("t: task.eval_size=8", "refused"),
                          ("m: model.n_layers=2", "refused"),
                          ("b: sandbox.cpu_s=9", "refused"),
                          ("n: workflow.max_new_tokens=8", "refused")):
      with self.subTest(text=text), self.assertRaisesRegex(rl_sweep.SweepError, message):
        rl_sweep.parse_arm(text)

  def test_how_rl_credits_the_episodes_may_change(self):
    arm = rl_sweep.parse_arm("outcome: workflow.stage_rewards=False workflow.reward_mode=all_pass")
    self.assertFalse(rl_sweep.arm_config(micro_run.micro_config(WS, RL), arm)
                     .workflow.stage_rewards)

  def test_overrides_are_checked_against_the_config(self):
    cfg = micro_run.micro_config(WS, RL)
    self.assertEqual(rl_sweep.arm_config(cfg, rl_sweep.parse_arm("a: rl.group_size=4"))
                     .rl.group_size, 4)
    for text in ("a: rl.no_such_field=1", "a: rl.group_size=0", "a: rl.group_size=big"):
      with self.subTest(text=text), self.assertRaisesRegex(rl_sweep.SweepError, "arm 'a'"):
        rl_sweep.arm_config(cfg, rl_sweep.parse_arm(text))


if __name__ == "__main__":
  absltest.main()
