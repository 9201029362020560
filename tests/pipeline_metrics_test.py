"""Tests for the `pipeline/...` metrics (agentic_grpo.train.metric_rows) and their reader
(benchmarks.pipeline.summarise)."""

import io
import json
import os
from unittest import mock

from absl.testing import absltest

from agentic_grpo.train import metric_rows
from benchmarks import pipeline


class PipelineMetricsTest(absltest.TestCase):

  def test_shapes_per_kind(self):
    stats = [
        # 3 provisional rows in 4 slots of 8 tokens, 6 loss tokens.
        {"rows": 3, "rows_provisional": 3, "row_slots": 4, "loss_tokens": 6, "token_slots": 32},
        # mostly corrections: a correction update.
        {"rows": 3, "rows_correction": 2, "rows_final": 1, "row_slots": 4, "loss_tokens": 8,
         "token_slots": 32},
        # final only, full.
        {"rows": 4, "rows_final": 4, "row_slots": 4, "loss_tokens": 16, "token_slots": 32},
        # a provisional update of 1 row in 2 slots.
        {"rows": 1, "rows_provisional": 1, "row_slots": 2, "loss_tokens": 2, "token_slots": 16},
    ]
    row = metric_rows.pipeline_shapes(stats)
    self.assertEqual(row["pipeline/updates_provisional"], 2)
    self.assertEqual(row["pipeline/updates_correction"], 1)
    self.assertEqual(row["pipeline/updates_final"], 1)
    self.assertEqual(row["pipeline/rows_provisional"], 4)
    self.assertAlmostEqual(row["pipeline/row_padding_provisional"], 1 - 4 / 6)
    self.assertAlmostEqual(row["pipeline/token_padding_provisional"], 1 - 8 / 48)
    self.assertAlmostEqual(row["pipeline/row_padding_correction"], 0.25)
    self.assertAlmostEqual(row["pipeline/row_padding_final"], 0.0)
    self.assertAlmostEqual(row["pipeline/row_padding_fraction"], 1 - 11 / 14)

  def test_task_config_takes_string_overrides_and_names_a_bad_one(self):
    c = pipeline.task_config("default", quick=True,
                             overrides=["rl.pack_prefix=False", "optim.learning_rate=2e-4"])
    self.assertEqual((c.rl.pack_prefix, c.optim.learning_rate, c.rl.num_steps), (False, 2e-4, 6))
    with self.assertRaisesRegex(ValueError, "override"):
      pipeline.task_config("default", quick=True, overrides=["rl.pack_prefx=False"])

  def test_shapes_of_no_update(self):
    self.assertEqual(metric_rows.pipeline_shapes([]), {})

  def test_times(self):
    row = metric_rows.pipeline_times({"learner": 1.0, "sampler": 2.0, "sandbox": 0.5}, 4.0)
    self.assertEqual(row["pipeline/wall_seconds"], 4.0)
    self.assertAlmostEqual(row["pipeline/learner_busy_fraction"], 0.25)
    self.assertAlmostEqual(row["pipeline/sampler_busy_fraction"], 0.5)
    self.assertAlmostEqual(row["pipeline/sandbox_busy_fraction"], 0.125)
    self.assertAlmostEqual(row["pipeline/learner_idle_fraction"], 0.75)
    self.assertEqual(set(row), set(metric_rows.PIPELINE_TIMES))
    # Clipped at 1.
    self.assertEqual(metric_rows.pipeline_times({"learner": 9.0}, 3.0)[
        "pipeline/learner_busy_fraction"], 1.0)

  def test_summarise_skips_the_first_row_for_times(self):
    first = dict(metric_rows.pipeline_times({"learner": 10.0}, 10.0), phase="rl")
    first.update(metric_rows.pipeline_shapes([{"rows": 1, "rows_provisional": 1, "row_slots": 4,
                                               "loss_tokens": 1, "token_slots": 8}]))
    later = dict(metric_rows.pipeline_times({"learner": 1.0, "sampler": 3.0}, 4.0), phase="rl")
    later.update(metric_rows.pipeline_shapes([{"rows": 3, "rows_provisional": 3, "row_slots": 4,
                                               "loss_tokens": 3, "token_slots": 8}]))
    s = pipeline.summarise([{"phase": "warmstart"}, first, later])
    self.assertEqual(s["rl_rows"], 2)
    self.assertAlmostEqual(s["learner_busy"], 0.25)
    self.assertAlmostEqual(s["sampler_busy"], 0.75)
    self.assertAlmostEqual(s["learner_idle"], 0.75)
    self.assertEqual(s["updates_provisional"], 2)
    self.assertEqual(s["updates_correction"], 0)
    self.assertAlmostEqual(s["rows_per_update_provisional"], 2.0)
    self.assertAlmostEqual(s["row_padding"], 0.5)
    self.assertAlmostEqual(s["token_padding_provisional"], 0.75)

  def test_read_finished_runs(self):
    row = dict(metric_rows.pipeline_times({"learner": 1.0, "sampler": 3.0}, 4.0), phase="rl")
    row.update(metric_rows.pipeline_shapes([{"rows": 3, "rows_correction": 3, "row_slots": 4,
                                             "loss_tokens": 3, "token_slots": 8}]))
    run = self.create_tempdir().full_path
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"phase": "warmstart"}) + "\n\n" + json.dumps(row) + "\n")
    with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
      got = pipeline.read([run, os.path.join(run, "metrics.jsonl")])
    self.assertLen(got, 2)
    s = got[run]
    self.assertEqual((s["rl_rows"], s["updates_correction"]), (1, 1))
    self.assertAlmostEqual(s["row_padding_correction"], 0.25)
    self.assertIn("correction", out.getvalue())
    self.assertIn("25%", out.getvalue())
    with self.assertRaises(FileNotFoundError):
      pipeline.read([self.create_tempdir().full_path])


if __name__ == "__main__":
  absltest.main()
