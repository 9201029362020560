"""Tests for the whole-phase RL keys and the end-of-run summary (agentic_grpo.train.metric_rows:
`rl_phase_totals`, `run_summary`, `summary_line`)."""

from absl.testing import absltest

from agentic_grpo.train import metric_rows


def _history():
  return [
      {"step": 3, "phase": "warmstart", "warmstart/loss": 1.0},
      {"step": 4, "phase": "warmstart", "eval/pass_at_1": 0.25,
       "headroom/heldout_pass_at_1": 0.2, "headroom/heldout_pass_at_G": 0.5,
       "headroom/train_pass_at_1": 0.3, "headroom/train_pass_at_G": 0.6},
      {"step": 5, "phase": "rl", "loss/entropy": 0.9, "rl/episodes_per_s": 3.0},
      {"step": 6, "phase": "rl", "rl/episodes_per_s": 5.0},  # no update in this row
      {"step": 7, "phase": "rl", "loss/entropy": 0.7, "rl/episodes_per_s": 4.0,
       "rl/episodes_per_s_phase": 4.5, "signal/tied_groups_final_phase": 0.625,
       "headroom/heldout_pass_at_1": 0.25, "headroom/heldout_pass_at_G": 0.45},
  ]


class RunSummaryTest(absltest.TestCase):

  def test_phase_totals(self):
    # 48 episodes in groups of 8 = 6 groups, 3 of them tied; 12 s.
    row = {"loop/episodes": 48.0, "loop/tied_groups_final": 3.0}
    self.assertEqual(metric_rows.rl_phase_totals(row, 12.0, 8),
                     {"rl/seconds": 12.0, "rl/episodes_per_s_phase": 4.0,
                      "signal/tied_groups_final_phase": 0.5})
    # No episode finished: a rate of 0 and no share.
    self.assertEqual(metric_rows.rl_phase_totals({}, 0.0, 8),
                     {"rl/seconds": 0.0, "rl/episodes_per_s_phase": 0.0})
    for key in ("rl/seconds", "rl/episodes_per_s_phase", "rl/episodes_per_s"):
      self.assertIn(key, metric_rows.RL_TIMES)

  def test_summary_of_a_history(self):
    summary = metric_rows.run_summary(_history())
    self.assertEqual(summary, {
        "warmstart/heldout_pass_at_1": 0.2, "warmstart/heldout_pass_at_G": 0.5,
        "warmstart/train_pass_at_1": 0.3, "warmstart/train_pass_at_G": 0.6,
        "final/heldout_pass_at_1": 0.25, "final/heldout_pass_at_G": 0.45,
        "entropy_first": 0.9, "entropy_last": 0.7, "tied_groups_final": 0.625,
        "episodes_per_s": 4.5})
    self.assertEqual(metric_rows.run_summary([]), {})

  def test_summary_line(self):
    line = metric_rows.summary_line(metric_rows.run_summary(_history()), group_size=8,
                                    temperature=0.5)
    self.assertEqual(line, "RL: headroom (held-out pass@1 -> pass@8 at T=0.5): warm-start "
                           "0.200 -> 0.500, end 0.250 -> 0.450; tied groups (final reward) "
                           "0.625; entropy 0.900 -> 0.700 nats; RL 4.5 episodes/s")
    only_ws = metric_rows.run_summary(_history()[:2])
    self.assertEqual(metric_rows.summary_line(only_ws, group_size=4, temperature=1.0),
                     "RL: headroom (held-out pass@1 -> pass@4 at T=1): warm-start "
                     "0.200 -> 0.500")
    self.assertEqual(metric_rows.summary_line({}, group_size=8, temperature=0.5), "")

  def test_final_reward_latency_over_processes_and_in_the_summary(self):
    def process(latency):
      return {"harvest": {}, "stats": [], "counts": {}, "loop": {}, "position": 0, "epoch": 0,
              "replay": {k: 0 for k in metric_rows.REPLAY_TOTALS}, "final_latency": latency}

    def latency(s_mean, s_p95, v_mean, v_p95):
      return {"final/latency_s_mean": s_mean, "final/latency_s_p95": s_p95,
              "final/latency_versions_mean": v_mean, "final/latency_versions_p95": v_p95}

    # Means averaged over the processes that have one, p95 the highest.
    row = metric_rows.rl_row([process(latency(1.0, 2.0, 3.0, 4.0)),
                              process(latency(3.0, 5.0, 1.0, 2.0)), process({})], [])
    self.assertEqual({k: v for k, v in row.items() if k.startswith("final/")},
                     latency(2.0, 5.0, 2.0, 4.0))
    self.assertNotIn("final/latency_s_mean", metric_rows.rl_row([process({})], []))
    history = _history()
    history[-1].update(latency(2.0, 5.0, 2.0, 4.0))
    summary = metric_rows.run_summary(history)
    self.assertEqual(summary["final_latency_versions_p95"], 4.0)
    line = metric_rows.summary_line(summary, group_size=8, temperature=0.5)
    self.assertTrue(line.endswith("; RL 4.5 episodes/s; final reward 2.00 s (p95 5.00 s), "
                                  "2.0 versions (p95 4.0) after the last stage"), line)
    # A resumed process has the versions of earlier landings but no seconds yet.
    versions_only = {k: v for k, v in latency(1.0, 2.0, 3.0, 4.0).items() if "versions" in k}
    row = metric_rows.rl_row([process(versions_only), process(latency(3.0, 5.0, 1.0, 2.0))], [])
    self.assertEqual({k: v for k, v in row.items() if k.startswith("final/")},
                     latency(3.0, 5.0, 2.0, 4.0))
    row = metric_rows.rl_row([process(versions_only)], [])
    self.assertEqual({k: v for k, v in row.items() if k.startswith("final/")}, versions_only)
    history[-1] = {k: v for k, v in history[-1].items() if not k.startswith("final/latency_s")}
    line = metric_rows.summary_line(metric_rows.run_summary(history), group_size=8,
                                    temperature=0.5)
    self.assertTrue(line.endswith("; final reward 2.0 versions (p95 4.0) after the last stage"),
                    line)
    # Seconds are wall-clock keys; versions are not.
    self.assertIn("final/latency_s_p95", metric_rows.WALL_CLOCK)
    self.assertNotIn("final/latency_versions_p95", metric_rows.WALL_CLOCK)


if __name__ == "__main__":
  absltest.main()
