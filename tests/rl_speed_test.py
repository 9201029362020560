"""The side-by-side RL speed benchmark's checks: the two sides' configs, and the rate it reads."""

from absl.testing import absltest

from benchmarks import rl_speed


def _row(step, episodes, wall, phase="rl"):
  return {"step": step, "phase": phase, "loop/episodes": episodes,
          "pipeline/wall_seconds": wall, "pipeline/learner_busy_fraction": 0.5,
          "pipeline/sampler_busy_fraction": 0.25, "pipeline/sandbox_busy_fraction": 0.25,
          "pipeline/token_slots_provisional": 100.0}


class CompareConfigsTest(absltest.TestCase):

  def test_equal_configs_agree(self):
    cfg = {"rl.temperature": 0.5, "optim.learning_rate": 1e-4}
    self.assertEqual(rl_speed.compare_configs(cfg, dict(cfg)), [])

  def test_a_different_field_is_named(self):
    bad = rl_speed.compare_configs({"rl.temperature": 0.5, "rl.group_size": 8},
                                   {"rl.temperature": 1.0, "rl.group_size": 8})
    self.assertLen(bad, 1)
    self.assertIn("rl.temperature", bad[0])

  def test_speed_fields_may_differ_or_be_new(self):
    base = {"rl.temperature": 0.5}
    ours = {"rl.temperature": 0.5, "rl.pack_prefix": True, "rl.packed_buckets": [384],
            "rl.sampler": "continuous"}
    self.assertEqual(rl_speed.compare_configs(base, ours), [])

  def test_a_new_field_must_hold_the_baselines_behaviour(self):
    base = {"rl.temperature": 0.5}
    self.assertEqual(rl_speed.compare_configs(
        base, {**base, "workflow.reference_error_rate": 0.0}), [])
    bad = rl_speed.compare_configs(base, {**base, "workflow.reference_error_rate": 0.6})
    self.assertLen(bad, 1)
    self.assertIn("workflow.reference_error_rate", bad[0])
    bad = rl_speed.compare_configs(base, {**base, "rl.brand_new": 1})
    self.assertIn("rl.brand_new", bad[0])

  def test_a_field_only_the_baseline_has_is_named(self):
    bad = rl_speed.compare_configs({"rl.old": 1, "rl.temperature": 0.5},
                                   {"rl.temperature": 0.5})
    self.assertLen(bad, 1)
    self.assertIn("rl.old", bad[0])


class SummariseTest(absltest.TestCase):

  def test_rates(self):
    rows = [{"step": 1, "phase": "warmstart"}, _row(2, 0, 10.0), _row(3, 128, 2.0),
            _row(4, 256, 2.0)]
    got = rl_speed.summarise(rows, settle=1)
    self.assertEqual(got["updates"], 3)
    self.assertAlmostEqual(got["episodes_per_s"], 256 / 14.0, places=3)
    # After the first update (its compilations): 256 episodes in 4 s.
    self.assertAlmostEqual(got["settled_episodes_per_s"], 64.0)
    self.assertAlmostEqual(got["learner_s"], 7.0)
    self.assertEqual(got["token_slots"], 300.0)

  def test_a_row_without_the_episode_counter_carries_the_last(self):
    rows = [_row(2, 0, 10.0), _row(3, 128, 2.0), _row(4, 128, 2.0), _row(5, 256, 2.0)]
    del rows[2]["loop/episodes"]  # an update row logged between two harvests
    got = rl_speed.summarise(rows, settle=3)
    self.assertAlmostEqual(got["settled_episodes_per_s"], 128 / 2.0)
    self.assertEqual(got["episodes"], 256.0)

  def test_seconds_to_episodes_counts_up_to_the_row_that_reached_them(self):
    rows = [{"step": 1, "phase": "warmstart"}, _row(2, 0, 10.0), _row(3, 128, 2.0),
            _row(4, 128, 3.0), _row(5, 256, 4.0)]
    del rows[3]["loop/episodes"]  # a row between two harvests
    self.assertAlmostEqual(rl_speed.seconds_to_episodes(rows, 128), 12.0)
    self.assertAlmostEqual(rl_speed.seconds_to_episodes(rows, 200), 19.0)
    self.assertAlmostEqual(rl_speed.seconds_to_episodes(rows, 0), 10.0)
    with self.assertRaisesRegex(ValueError, "never finished 384"):
      rl_speed.seconds_to_episodes(rows, 384)

  def test_no_rl_row_is_an_error(self):
    with self.assertRaisesRegex(ValueError, "no RL row"):
      rl_speed.summarise([{"step": 1, "phase": "warmstart"}], settle=0)

  def test_unknown_task_and_bad_speed_setting(self):
    with self.assertRaisesRegex(ValueError, "tasks must be"):
      rl_speed.run("HEAD", ("nope",))
    with self.assertRaisesRegex(ValueError, "speed settings"):
      rl_speed.run("HEAD", ("default",), speed=("optim.learning_rate=1",))


if __name__ == "__main__":
  absltest.main()
