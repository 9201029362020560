"""Tests of experiments/ablation: arm configs, seeding an arm from the warm-start, and the quick
ablation end to end (every arm on both tasks runs and is reported)."""

import json
import os
import tempfile
from unittest import mock

from absl.testing import absltest
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import train
from agentic_grpo.checkpoint import run_lock
from agentic_grpo.replay import intake
from experiments import ablation
from experiments import ablation_report


class AblationTest(absltest.TestCase):

  def test_arms_differ_only_in_stage_credit(self):
    for task in ablation.TASKS:
      cfgs = {arm: config_lib.to_dict(config_lib.from_config_dict(
          ablation.arm_config(task, arm, 0))) for arm in ablation.ARMS}
      for arm, c in cfgs.items():
        spec = ablation.ARMS[arm]
        self.assertEqual(c["workflow"]["stage_rewards"], spec["stage_rewards"])
        self.assertEqual(c["correction"]["enabled"], spec["correction"])
        self.assertEqual(c["correction"]["stage_credit"], spec["stage_credit"])
        for section in ("workflow", "correction"):
          c[section] = {k: v for k, v in c[section].items()
                        if k not in ("stage_rewards", "enabled", "stage_credit")}
      first = cfgs["outcome"]
      for c in cfgs.values():
        self.assertEqual(c, first)  # same budget, model, tasks and optimiser
      # Every stage's provisional update is made (the default task supersedes queued ones).
      self.assertFalse(first["correction"]["supersede_queued"])
      # Nor does an arm drop tied groups from its episode budget, or pay a KL term.
      self.assertFalse(first["rl"]["dynamic_sampling"])
      self.assertEqual(first["loss"]["kl_beta"], 0.0)
      self.assertGreater(first["rl"]["episode_budget"], 0)
    with self.assertRaisesRegex(ValueError, "arm"):
      ablation.arm_config("default", "oracle", 0)

  def test_long_horizon_piece_advantages_follow_the_pieces_own_rewards(self):
    # A group of 3 on 4 pieces. Piece 2 is passed by every member: no signal on it, whatever
    # piece 1 did. A piece above its group's mean gets a positive provisional advantage, one
    # below a negative one. Outcome GRPO's target is the normalised outcome on every piece.
    # With the previous-stage baseline the replay credited piece k with r_k - r_(k-1).
    rewards = np.array([[1, 1, 0, 1], [0, 1, 1, 1], [0, 1, 0, 0]], np.float32)  # member x piece
    final = np.array([1.0, 0.0, 0.0], np.float32)
    for arm in sorted(ablation.ARMS, key=lambda a: a == "outcome"):  # the stage arms first
      cfg = config_lib.from_config_dict(ablation.arm_config("long_horizon", arm, 0))
      replay = intake.StagedReplay.from_sections(
          group_size=3, num_stages=4, correction=cfg.correction, storage=cfg.replay,
          stage_rewards=cfg.workflow.stage_rewards)
      replay.add_group(0, [0, 1, 2])
      row = lambda k, m: np.arange(2 + 3 * k, dtype=np.int32) + 10 * m
      for k in range(4):
        rows = [row(k, m) for m in range(3)]
        masks = [np.arange(len(r)) >= len(r) - 3 for r in rows]
        replay.add_stage([0, 1, 2], k, rows, masks, [np.zeros(len(r), np.float32) for r in rows],
                         0, rewards[:, k])
      # The agent loop stores the stage rewards in every arm (the outcome arm's targets see
      # them); the stage arms ready provisional items, `post_hoc` once the group finishes.
      # Every item readied, none taken yet (`correction.supersede_queued` withdraws the
      # agentic arm's queued provisional items at the outcome: they are read before it).
      before = list(replay._ready)
      replay.finish([0, 1, 2], final)
      ready = before + [i for i in replay._ready if all(i is not b for b in before)]
      provisional = {(int(i.seg_episode[0]), int(i.seg_stage[0])): float(i.seg_advantage[0])
                     for i in ready if i.kind == "provisional"}
      if cfg.workflow.stage_rewards:
        self.assertNotIn(1, {k for _, k in provisional}, arm)  # piece 2 (index 1): tied
        for (e, k), a in provisional.items():
          self.assertEqual(np.sign(a), np.sign(rewards[e, k] - rewards[:, k].mean()),
                           (arm, e, k))
        self.assertLen(provisional, 9, arm)  # pieces 1, 3, 4 of the 3 members
      else:
        self.assertEmpty(provisional)
        outcome = (final - final.mean()) / final.std()
        targets = [(int(e), int(k), float(a)) for i in ready
                   for e, k, a in zip(i.seg_episode, i.seg_stage, i.seg_advantage, strict=True)]
        self.assertLen(targets, 12)  # every piece of every member
        for e, k, a in targets:
          self.assertAlmostEqual(a, outcome[e], places=4, msg=(arm, e, k))

  def test_seeding_replaces_a_half_copy_left_by_a_killed_seeding(self):
    root = self.create_tempdir().full_path
    warm, wd = os.path.join(root, "warm"), os.path.join(root, "arm")
    os.makedirs(os.path.join(warm, "checkpoints", "3"))
    for name, text in (("metrics.jsonl", "{}\n"), (os.path.join("checkpoints", "3", "x"), "3")):
      with open(os.path.join(warm, name), "w") as f:
        f.write(text)
    os.makedirs(os.path.join(wd, "checkpoints.tmp", "1"))  # the killed copy
    ablation._seed_from(warm, wd)
    self.assertEqual(sorted(os.listdir(wd)), ["checkpoints", "metrics.jsonl"])
    self.assertEqual(os.listdir(os.path.join(wd, "checkpoints")), ["3"])
    with open(os.path.join(wd, "checkpoints", "3", "x")) as f:
      self.assertEqual(f.read(), "3")

  def test_an_arm_finished_meanwhile_by_another_invocation_is_not_run_again(self):
    root = self.create_tempdir().full_path
    other = ablation.workdir(root, "default", "outcome", 0)

    def warm_start(train, root_, task, seed, options):
      del train, root_, task, seed, options
      os.makedirs(other)  # another invocation on the same root finishes `outcome` meanwhile
      with open(os.path.join(other, ablation.DONE), "w") as f:
        f.write("{}")
      return os.path.join(root, "warm")

    ran, rates = [], []
    fake_run = lambda cfg, wd: ran.append(wd) or rates.append(cfg.optim.learning_rate) or \
        os.makedirs(wd, exist_ok=True) or {
            "step": 1, "final_pass_at_1": 0.0, "warmstart_pass_at_1": 0.0}  # as train.run writes
    seed_from = lambda warm, wd: os.makedirs(wd, exist_ok=True)
    with mock.patch.object(ablation, "_warm_start", warm_start), \
         mock.patch.object(ablation, "_seed_from", seed_from), \
         mock.patch.object(train, "run", fake_run):
      got = ablation.run_all(root, ["default"], ["outcome", "agentic"], [0], quick=True,
                             overrides=["optim.learning_rate=3e-4"])
    want = [ablation.workdir(root, "default", "agentic", 0)]
    self.assertEqual(ran, want)
    self.assertEqual(got, want)
    self.assertEqual(rates, [3e-4])  # the override reaches the arm's run

  def test_an_arm_another_invocation_is_running_is_skipped_untouched(self):
    root = self.create_tempdir().full_path
    busy = ablation.workdir(root, "default", "agentic", 0)
    seeded, ran = [], []
    fake_run = lambda cfg, wd: ran.append(wd) or os.makedirs(wd, exist_ok=True) or {
        "step": 1, "final_pass_at_1": 0.0, "warmstart_pass_at_1": 0.0}  # as train.run writes
    # flock locks belong to an open file: a second WorkdirLock conflicts even in one process.
    with run_lock.WorkdirLock(busy), \
         mock.patch.object(ablation, "_warm_start", lambda *a: os.path.join(root, "warm")), \
         mock.patch.object(ablation, "_seed_from", lambda warm, wd: seeded.append(wd)), \
         mock.patch.object(train, "run", fake_run):
      got = ablation.run_all(root, ["default"], ["agentic", "outcome"], [0], quick=True)
    want = [ablation.workdir(root, "default", "outcome", 0)]
    self.assertEqual((seeded, ran, got), (want, want, want))
    self.assertFalse(os.path.exists(os.path.join(busy, ablation.DONE)))

  def test_a_warm_start_another_invocation_is_training_is_waited_for(self):
    root = self.create_tempdir().full_path
    calls = []

    def fake_run(cfg, wd, stop_after=None):
      del cfg, stop_after
      calls.append(wd)
      if len(calls) == 1:
        raise run_lock.WorkdirLockedError(wd, {"host": "h", "pid": 1})
      os.makedirs(wd)
      return {"step": 1}

    with mock.patch.object(ablation, "_WAIT_S", 0.0), mock.patch.object(train, "run", fake_run):
      warm = ablation._warm_start(train, root, "default", 0, dict(quick=True))
    self.assertEqual(calls, [warm, warm])
    self.assertTrue(os.path.exists(os.path.join(warm, ablation.DONE)))

  def test_report_counts_sampled_episodes_and_only_finished_runs(self):
    root = self.create_tempdir().full_path
    rows = [{"step": 3, "phase": "warmstart", "seconds": 5.0, "eval/pass_at_1": 0.25},
            # The first RL evaluation comes before any episode has finished: the stage arms
            # already updated on 2 batches of 4 tasks x G = 8 sampled episodes.
            {"step": 4, "phase": "rl", "seconds": 1.0, "loop/data_position": 8.0,
             "loss/grad_norm": 1.0},
            {"step": 4, "phase": "rl", "seconds": 1.0, "loop/data_position": 8.0,
             "eval/pass_at_1": 0.5},  # an evaluation row of its own: not an update
            {"step": 5, "phase": "rl", "seconds": 2.0, "loop/data_position": 12.0,
             "loop/episodes": 32.0, "eval/pass_at_1": 0.75}]
    for arm, done in (("outcome", True), ("agentic", True), ("post_hoc", False)):
      wd = ablation.workdir(root, "default", arm, 0)
      os.makedirs(wd)
      with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
      with open(os.path.join(wd, "config.json"), "w") as f:
        json.dump({"rl": {"group_size": 8}}, f)
      if done:
        with open(os.path.join(wd, ablation.DONE), "w") as f:
          f.write("{}")
    run = ablation_report.load_run(ablation.workdir(root, "default", "agentic", 0))
    self.assertEqual([(e, p) for e, _, p in run["curve"]], [(0.0, 0.25), (64.0, 0.5),
                                                           (96.0, 0.75)])
    self.assertEqual(run["updates"], 1)
    text = ablation_report.write(root, ["default"], ["outcome", "post_hoc", "agentic"], [0])
    self.assertIn("| post_hoc | 0 | n/a", text)  # unfinished: left out
    self.assertIn("| agentic | 1 | 0.750 | +0.500 |", text)  # gain vs its warm-start
    self.assertIn("held-out pass@1 0.250.", text)
    self.assertNotIn("at or below", text)

  def test_sign_reversal_share_counts_provisional_updates_that_reached_the_learner(self):
    # 10 provisional items, 4 of them withdrawn at the outcome (`supersede_queued`) before the
    # learner took them: 3 reversals among the 6 that were applied.
    root = self.create_tempdir().full_path
    rows = [{"step": 1, "phase": "warmstart", "seconds": 1.0, "eval/pass_at_1": 0.0},
            {"step": 2, "phase": "rl", "seconds": 2.0, "loss/grad_norm": 1.0,
             "eval/pass_at_1": 0.5, "replay/total_provisional_items": 10.0,
             "replay/total_superseded_provisional_items": 4.0,
             "replay/total_sign_reversals": 3.0}]
    wd = ablation.workdir(root, "default", "agentic", 0)
    os.makedirs(wd)
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))
    self.assertAlmostEqual(ablation_report.load_run(wd)["sign_reversal_share"], 0.5)

  def test_stage_table_reports_the_share_that_passes_all_checks(self):
    # Two pieces, one passing all its examples and one 2 of 3: a pass share of 0.5, a mean
    # fraction of 0.833. The pass share is the stage reward the arms are trained on
    # (`reward_mode='all_pass'`); the table once showed the fraction under its name.
    root = self.create_tempdir().full_path
    warm = {"eval/pass_at_1": 0.0, "eval/reward/g1": 1.0, "eval/reward/g2": 2 / 3,
            "eval/stage_pass/g1": 1.0, "eval/stage_pass/g2": 0.0}
    end = {"eval/pass_at_1": 0.0, "eval/reward/g1": 1.0, "eval/reward/g2": 1.0,
           "eval/stage_pass/g1": 1.0, "eval/stage_pass/g2": 1.0}
    rows = [{"step": 3, "phase": "warmstart", "seconds": 5.0, **warm},
            {"step": 4, "phase": "rl", "seconds": 1.0, "loss/grad_norm": 1.0, **end}]
    wd = ablation.workdir(root, "long_horizon", "outcome", 0)
    os.makedirs(wd)
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))
    with open(os.path.join(wd, ablation.DONE), "w") as f:
      f.write("{}")
    run = ablation_report.load_run(wd)
    self.assertEqual((run["stage_warm"], run["stage_final"]), (0.5, 1.0))
    self.assertAlmostEqual(run["fraction_warm"], 5 / 6)
    text = ablation_report.write(root, ["long_horizon"], ["outcome"], [0])
    self.assertIn("| outcome | 1 | 0.500 → 1.000 | — | 0.833 → 1.000 |", text)

  def test_quick_ablation_end_to_end_and_rerun_skips(self):
    root = tempfile.mkdtemp()
    tasks, arms = list(ablation.TASKS), list(ablation.ARMS)
    ran = ablation.run_all(root, tasks, arms, [0], quick=True)
    self.assertLen(ran, len(tasks) * len(arms))
    text = ablation_report.write(root, tasks, arms, [0])
    for task in tasks:
      self.assertIn(f"## {task}", text)
      for arm in arms:
        wd = ablation.workdir(root, task, arm, 0)
        self.assertTrue(os.path.exists(os.path.join(wd, ablation.DONE)))
        run = ablation_report.load_run(wd)
        self.assertIsNotNone(run)
        self.assertGreaterEqual(run["curve"][-1][0], 8)  # the episode budget was spent
        self.assertBetween(run["final"], 0.0, 1.0)
      # Every arm starts from the shared warm-start (same evaluation at 0 episodes).
      starts = {arm: ablation_report.load_run(ablation.workdir(root, task, arm, 0))["curve"][0]
                for arm in arms}
      self.assertLen(set(starts.values()), 1)
      self.assertEqual(starts[arms[0]][:2], (0.0, 0.0))
    for arm in arms:
      # Two tables per task: the results, then updates and stage checks.
      self.assertEqual(sum(line.startswith(f"| {arm} |") for line in text.splitlines()), 4)
    self.assertEqual(text.count("| arm | RL updates (mean) | stage pass share"), len(tasks))
    self.assertTrue(os.path.exists(os.path.join(root, "results.md")))
    self.assertGreater(os.path.getsize(os.path.join(root, "curves.png")), 1000)
    # A second pass finds every run finished.
    self.assertEmpty(ablation.run_all(root, tasks, arms, [0], quick=True))


  def test_shared_warmstart_serves_every_seed(self):
    root = tempfile.mkdtemp()
    ran = ablation.run_all(root, ["default"], ["agentic"], [0, 1], quick=True,
                           shared_warmstart=True)
    self.assertLen(ran, 2)
    warm = os.path.join(root, "default", "warmstart")
    self.assertEqual(sorted(os.listdir(warm)), ["seed0"])
    runs = [ablation_report.load_run(ablation.workdir(root, "default", "agentic", s))
            for s in (0, 1)]
    self.assertEqual(runs[0]["curve"][0], runs[1]["curve"][0])  # the same warm-start
    for run in runs:
      self.assertGreaterEqual(run["curve"][-1][0], 8)


if __name__ == "__main__":
  absltest.main()
