"""The metrics writer's progress-bar fields (`train.metrics.MetricsWriter.postfix`).

Without a mid-run evaluation the bar's held-out pass@1 is the warm-start's all through the RL
phase; its `train` field, the training stream's pass rate over the last RL rows, moves with
the policy, and comes back with a resumed run's rows.
"""

import os
from unittest import mock

from absl.testing import absltest

from agentic_grpo import config as config_lib
from agentic_grpo.train import metrics as metrics_lib


class PostfixTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.workdir = self.create_tempdir().full_path
    self.cfg = config_lib.from_config_dict({"log": {"progress_bar": False,
                                                    "tensorboard": False}})

  def test_rl_phase_shows_the_training_pass_rate_of_the_last_rows(self):
    writer = metrics_lib.MetricsWriter(self.workdir, self.cfg, 40, 0)
    self.addCleanup(writer.close)
    writer.write({"step": 10, "phase": "warmstart", "eval/pass_at_1": 0.25})
    self.assertEqual(writer.postfix("warmstart", 1.23456),
                     {"phase": "warmstart", "loss": "1.235", "pass@1": "0.250"})
    self.assertNotIn("train", writer.postfix("rl"))  # no RL row yet
    rates = [0.01 * i for i in range(1, 13)]
    for i, rate in enumerate(rates):
      writer.write({"step": 11 + i, "phase": "rl", "train/pass_rate": rate})
    want = sum(rates[-metrics_lib._TRAIN_PASS_ROWS:]) / metrics_lib._TRAIN_PASS_ROWS
    self.assertEqual(writer.postfix("rl"),
                     {"phase": "rl", "pass@1": "0.250", "train": f"{want:.3f}"})
    writer.write({"step": 23, "phase": "rl", "eval/pass_at_1": 0.5})
    self.assertEqual(writer.postfix("rl")["pass@1"], "0.500")

  def test_a_resumed_writer_keeps_the_rows_up_to_its_step(self):
    writer = metrics_lib.MetricsWriter(self.workdir, self.cfg, 40, 0)
    for step, rate in ((11, 0.2), (12, 0.4), (13, 0.9)):
      writer.write({"step": step, "phase": "rl", "train/pass_rate": rate})
    writer.close()
    resumed = metrics_lib.MetricsWriter(self.workdir, self.cfg, 40, 12)
    self.addCleanup(resumed.close)
    self.assertEqual(resumed.postfix("rl")["train"], "0.300")
    self.assertTrue(os.path.exists(os.path.join(self.workdir, "metrics.jsonl")))

  def test_other_processes_write_nothing_and_keep_the_fields(self):
    # A multi-process run's other processes keep the rows (every one logs them), not files.
    with mock.patch.object(metrics_lib.parallel, "is_primary", return_value=False):
      writer = metrics_lib.MetricsWriter(self.workdir, self.cfg, 40, 0)
    writer.write({"step": 11, "phase": "rl", "train/pass_rate": 0.5, "eval/pass_at_1": 0.25})
    writer.progress(11, "rl")
    writer.close()
    self.assertEqual(writer.postfix("rl"), {"phase": "rl", "pass@1": "0.250", "train": "0.500"})
    self.assertFalse(os.path.exists(os.path.join(self.workdir, "metrics.jsonl")))


if __name__ == "__main__":
  absltest.main()
