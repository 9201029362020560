"""Tests for agentic_grpo.core.batched: the jitted credit calls give the eager `core` numbers."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentic_grpo.core import advantages
from agentic_grpo.core import batched
from agentic_grpo.core import correction


def _inputs(b, g=4, s=3, seed=0):
  rng = np.random.default_rng(seed)
  rewards = rng.integers(0, 3, (b, g, s)).astype(np.float32) / 2
  valid = rng.random((b, g, s)) < 0.85
  final = rng.random((b, g)).astype(np.float32)
  applied = np.where(valid, rng.normal(size=(b, g, s)), 0.0).astype(np.float32)
  return rewards, valid, final, applied


class BatchedTest(parameterized.TestCase):

  @parameterized.product(b=(1, 3, 5), scale=("std", "none"),
                         baseline=("none", "previous_stage"))
  def test_stage_advantages_equal_eager(self, b, scale, baseline):
    rewards, valid, _, _ = _inputs(b, seed=b)
    eager = np.asarray(advantages.provisional_advantages(rewards, valid, scale=scale,
                                                         baseline=baseline))
    for stage in range(3):
      got = batched.stage_advantages(rewards[..., :stage + 1], valid[..., :stage + 1], stage,
                                     scale=scale, baseline=baseline)
      self.assertEqual(got.shape, (b, 4))
      np.testing.assert_allclose(got, eager[..., stage], rtol=1e-6, atol=1e-7)

  def test_stage_advantages_compile_once_for_every_stage(self):
    """The stage is traced and later stages are padding: stages 0..3 of 5 groups (rewards of
    the stages so far, as the replay gives them) share one program."""
    rewards, valid, _, _ = _inputs(5, s=4, seed=7)
    eager = np.asarray(advantages.provisional_advantages(rewards, valid, scale="std",
                                                         baseline="previous_stage"))
    before = batched._stage_advantages._cache_size()
    for stage in range(4):
      got = batched.stage_advantages(rewards[..., :stage + 1], valid[..., :stage + 1], stage,
                                     scale="std", baseline="previous_stage")
      np.testing.assert_allclose(got, eager[..., stage], rtol=1e-6, atol=1e-7)
    self.assertEqual(batched._stage_advantages._cache_size() - before, 1)

  @parameterized.product(b=(1, 3), mode=("outcome", "return", "mixed"),
                         baseline=("none", "previous_stage"))
  def test_outcome_credit_equals_eager(self, b, mode, baseline):
    rewards, valid, final, applied = _inputs(b, seed=10 + b)
    kw = dict(mode=mode, gamma=0.9, beta=0.5, scale="std", baseline=baseline)
    target = np.asarray(advantages.target_advantages(rewards, final, valid=valid, **kw))
    delta = np.asarray(correction.correction_advantages(applied, target))
    got_t, got_d = batched.outcome_credit(rewards, final, valid, applied, **kw)
    self.assertEqual(got_t.shape, (b, 4, 3))
    np.testing.assert_allclose(got_t, target, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got_d, delta, rtol=1e-6, atol=1e-7)

  @parameterized.parameters(0.0, 0.5, 1.0)
  def test_negative_weight_applies_to_provisional_and_target_alike(self, w):
    rewards, valid, final, _ = _inputs(3, seed=30)
    kw = dict(scale="std", baseline="previous_stage")
    eager = advantages.provisional_advantages(rewards, valid, **kw)
    applied = np.stack([batched.stage_advantages(rewards[..., :k + 1], valid[..., :k + 1], k,
                                                 negative_weight=w, **kw) for k in range(3)], -1)
    np.testing.assert_allclose(applied, advantages.weight_negatives(eager, w), atol=1e-7)
    target, delta = batched.outcome_credit(rewards, final, valid, applied, mode="outcome",
                                           gamma=1.0, beta=0.0, negative_weight=w, **kw)
    unweighted = advantages.target_advantages(rewards, final, valid=valid, mode="outcome", **kw)
    np.testing.assert_allclose(target, advantages.weight_negatives(unweighted, w), atol=1e-7)
    # A provisional update and its correction sum to the weighted target's.
    np.testing.assert_allclose(applied + delta, target, atol=1e-6)
    if w < 1:
      self.assertTrue(np.any(target != unweighted))

  @parameterized.parameters("drop", "linear")
  def test_staleness_table_equals_eager(self, mode):
    versions = [3, 9, 5, 9, 10, 0, 12]
    table = batched.staleness_table(versions, 10, max_staleness=4, mode=mode)
    distinct = sorted(set(versions))
    eager = np.asarray(correction.staleness_weights(np.array(distinct), 10, max_staleness=4,
                                                    mode=mode))
    self.assertEqual(list(table), distinct)
    np.testing.assert_array_equal([table[v] for v in distinct], eager)
    self.assertEqual(batched.staleness_table([], 3, max_staleness=4, mode=mode), {})

  @parameterized.parameters(1, 3, 5)
  def test_tied_groups_equal_eager(self, b):
    rewards, valid, _, _ = _inputs(b, s=1, seed=20 + b)
    rewards, valid = rewards[..., 0], valid[..., 0]
    rewards[0] = 0.5  # one group tied for certain
    got = batched.tied_groups(rewards, valid)
    self.assertEqual(got.shape, (b,))
    self.assertTrue(got[0])
    np.testing.assert_array_equal(got, np.asarray(advantages.tied_groups(rewards, valid)))
    with self.assertRaisesRegex(ValueError, "must both be"):
      batched.tied_groups(rewards, valid[:, :2])

  def test_bad_inputs(self):
    rewards, valid, final, applied = _inputs(2)
    with self.assertRaisesRegex(ValueError, "stage must be in"):
      batched.stage_advantages(rewards, valid, 3, scale="std", baseline="none")
    with self.assertRaisesRegex(ValueError, "must both be"):
      batched.stage_advantages(rewards, valid[..., :2], 0, scale="std", baseline="none")
    with self.assertRaisesRegex(ValueError, "alike"):
      batched.outcome_credit(rewards, final, valid, applied[..., :2], mode="outcome", gamma=1.0,
                             beta=0.0, scale="std", baseline="none")
    with self.assertRaisesRegex(ValueError, "mode"):
      batched.staleness_table([1], 2, max_staleness=4, mode="bogus")


if __name__ == "__main__":
  absltest.main()
