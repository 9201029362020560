"""Tests of experiments/habit_share: the habit judge passes the teacher's confusion and not
the program, the shares add up, and on a micro run the `right` share is the run's own pass@1."""

import dataclasses
import json
import os
import shutil
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest
import numpy as np

from agentic_grpo import sandbox
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.agent import workflow_config
from agentic_grpo.tasks import synthetic
from experiments import habit_share
from tests.fixtures import micro_run

WS, RL = 3, 2


class HabitJudgeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2)
    gen = synthetic.SyntheticTasks(synthetic.SyntheticConfig(depths=(1,)))
    cls.tasks = [gen.task("test", i) for i in range(6)]

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def _rewards(self, cls, code_of, tasks=None):
    """The final rewards of `cls` on episodes whose code is `code_of(task)`, and the habit
    verdicts a `dual_judge` of `cls` recorded of the same episodes."""
    tasks = tasks or self.tasks
    habit = {}
    wf = habit_share.dual_judge(cls, habit)(
        workflow_config.WorkflowConfig(stages=("code",), reward_mode="all_pass"), self.pool)
    episodes = wf.start(tasks)
    for ep, task in zip(episodes, tasks, strict=True):
      ep.code = task.code_context + code_of(task)
    rewards = wf.finish(episodes).rewards.tolist()
    # The episodes are left as they were judged: their tasks and codes, the task's verdict.
    self.assertEqual([ep.task for ep in episodes], list(tasks))
    self.assertEqual([ep.final_reward for ep in episodes], rewards)
    return rewards, [habit[t.task_id] for t in tasks]

  def test_one_judgement_of_the_program_and_one_of_the_habit(self):
    habit = lambda t: synthetic.teacher_confusion(t).source()
    right = lambda t: t.reference_solution
    self.assertEqual(self._rewards(workflow_lib.Workflow, right), ([1.0] * 6, [False] * 6))
    self.assertEqual(self._rewards(workflow_lib.Workflow, habit), ([0.0] * 6, [True] * 6))
    mixed = lambda t: right(t) if int(t.task_id.split("-")[-1]) % 2 else habit(t)
    rewards, habits = self._rewards(workflow_lib.Workflow, mixed)
    self.assertEqual(rewards, [0.0, 1.0] * 3)
    self.assertEqual(habits, [True, False] * 3)

  def test_a_task_without_a_program_has_no_habit(self):
    task = dataclasses.replace(self.tasks[0], metadata={})
    self.assertIsNone(habit_share.habit_task(task))
    rewards, habits = self._rewards(workflow_lib.Workflow, lambda t: t.reference_solution,
                                    [task, self.tasks[1]])
    self.assertEqual((rewards, habits), ([1.0, 1.0], [False, False]))
    confused = synthetic.teacher_confusion(self.tasks[0])
    got = habit_share.habit_task(self.tasks[0]).hidden_tests
    self.assertEqual([e.args for e in got], [e.args for e in self.tasks[0].hidden_tests])
    self.assertEqual([e.expected for e in got], [confused(e.args[0]) for e in got])

  def test_shares(self):
    s = habit_share.shares(np.array([1, 1, 0, 0, 0], bool), np.array([1, 0, 1, 0, 0], bool))
    self.assertEqual(s, {"right": 0.4, "habit": 0.4, "other": 0.4, "both": 0.2, "tasks": 5})


class MeasureTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2)
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.run_dir = os.path.join(cls.tmp, "run")
    micro_run.train_finished(cls.run_dir, cls.pool, WS, RL)

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    shutil.rmtree(cls.tmp)
    super().tearDownClass()

  def test_right_is_the_runs_pass_at_1_and_the_shares_add_up(self):
    got = habit_share.measure(self.run_dir, pool=self.pool,
                              workflow_factory=micro_run.LuckyWorkflow)
    self.assertEqual(sorted(got), [WS, WS + RL])  # the kept warm-start and the newest
    # The run's own evaluations are by the same workflow: `right` is its logged pass@1, which
    # the lucky workflow makes a coin's toss per task (not 0). Its codes are the task's
    # program or a wrong stub, never the habit.
    rows = micro_run.rows(self.run_dir)
    for step, s in got.items():
      logged = [r for r in rows if r["step"] == step and "eval/pass_at_1" in r][-1]
      self.assertEqual(s["right"], logged["eval/pass_at_1"])
      self.assertEqual(s["tasks"], 4)
      self.assertAlmostEqual(s["right"] + s["habit"] + s["other"] - s["both"], 1.0)
      self.assertEqual(s["habit"], 0.0)
    self.assertGreater(max(s["right"] for s in got.values()), 0.0)
    self.assertEqual(list(habit_share.measure(self.run_dir, [WS], pool=self.pool,
                                              workflow_factory=micro_run.LuckyWorkflow)), [WS])

  def test_program_writes_and_prints(self):
    fv = flags.FlagValues()
    habit_share.define_flags(fv)
    fv([__file__, f"--run={self.run_dir}", f"--steps={WS + RL}"])
    real = habit_share.measure
    lucky = lambda *a, **k: real(*a, workflow_factory=micro_run.LuckyWorkflow, **k)
    with mock.patch.object(habit_share, "_RUN", fv["run"]), \
         mock.patch.object(habit_share, "_STEPS", fv["steps"]), \
         mock.patch.object(habit_share, "measure", lucky), \
         mock.patch("builtins.print") as printed:
      habit_share.main(["habit_share"])
    with open(os.path.join(self.run_dir, habit_share.OUT)) as f:
      saved = json.load(f)
    self.assertEqual(list(saved), [str(WS + RL)])
    self.assertIn(f"| {WS + RL} | {saved[str(WS + RL)]['right']:.3f} |",
                  printed.call_args_list[0].args[0])

  def test_only_synthetic_runs(self):
    other = os.path.join(self.create_tempdir().full_path, "run")
    shutil.copytree(self.run_dir, other)
    with open(os.path.join(other, "config.json")) as f:
      cfg = json.load(f)
    cfg["task"]["source"] = "long_horizon"
    with open(os.path.join(other, "config.json"), "w") as f:
      json.dump(cfg, f)
    with self.assertRaisesRegex(ValueError, "synthetic"):
      habit_share.measure(other, pool=self.pool)


if __name__ == "__main__":
  absltest.main()
