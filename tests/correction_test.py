"""Tests for agentic_grpo.core.correction."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import advantages
from agentic_grpo.core import correction


class CorrectionAdvantagesTest(absltest.TestCase):

  def test_provisional_plus_correction_is_target(self):
    key = jax.random.PRNGKey(0)
    stage_rewards = jax.random.bernoulli(key, 0.5, (3, 4, 5)).astype(jnp.float32)
    final = jax.random.uniform(jax.random.PRNGKey(1), (3, 4))
    provisional = advantages.provisional_advantages(stage_rewards)
    for mode in advantages.TARGET_MODES:
      target = advantages.target_advantages(stage_rewards, final, mode=mode, gamma=0.9, beta=0.5)
      delta = correction.correction_advantages(provisional, target)
      np.testing.assert_allclose(provisional + delta, target, atol=1e-6)

  def test_rejects_shape_mismatch(self):
    with self.assertRaisesRegex(ValueError, "provisional and target"):
      correction.correction_advantages(jnp.zeros((2, 3)), jnp.zeros((3, 2)))


class StalenessWeightsTest(parameterized.TestCase):

  def test_drop(self):
    w = correction.staleness_weights(jnp.array([10, 9, 8, 7, 11]), 10, max_staleness=2, mode="drop")
    np.testing.assert_array_equal(np.asarray(w), [1.0, 1.0, 1.0, 0.0, 0.0])

  def test_linear(self):
    w = correction.staleness_weights(jnp.array([10, 9, 8, 7]), 10, max_staleness=2,
                                     mode="linear")
    np.testing.assert_allclose(w, [1.0, 2 / 3, 1 / 3, 0.0], rtol=1e-6)

  def test_jit_with_traced_version(self):
    fn = jax.jit(lambda v, c: correction.staleness_weights(v, c, max_staleness=1))
    np.testing.assert_array_equal(np.asarray(fn(jnp.array([3, 2, 1]), jnp.int32(3))),
                                  [1.0, 1.0, 0.0])

  @parameterized.parameters(*correction.STALENESS_MODES)
  def test_extreme_versions_give_finite_weights_in_unit_interval(self, mode):
    rng = np.random.default_rng(0)
    big = np.iinfo(np.int32).max
    for _ in range(20):
      current = int(rng.choice([0, 1, 1000, big - 1, big]))
      versions = np.concatenate([
          rng.integers(-2**31, big, 8, dtype=np.int64),
          [0, current, -2**31, big, current - 1, max(current - 1000, -2**31)]]).astype(np.int32)
      max_staleness = int(rng.choice([0, 1, 8, big]))
      w = np.asarray(correction.staleness_weights(versions, current, max_staleness=max_staleness,
                                                  mode=mode))
      self.assertTrue(np.all(np.isfinite(w)) and np.all((w >= 0) & (w <= 1)), (current, w))
      staleness = current - versions.astype(np.int64)
      fresh = (staleness >= 0) & (staleness <= max_staleness)
      self.assertFalse(np.any((w > 0) & ~fresh))  # no overflow turns a stale version fresh
      if mode == "drop":  # (linear weights of the stalest fresh entries may round to 0)
        np.testing.assert_array_equal(w > 0, fresh)

  def test_corrections_of_extreme_finite_advantages_are_finite(self):
    rng = np.random.default_rng(1)
    provisional = rng.choice([-1e6, -1.0, 0.0, 1.0, 1e6], (64,)).astype(np.float32)
    target = rng.choice([-1e6, -1.0, 0.0, 1.0, 1e6], (64,)).astype(np.float32)
    delta = np.asarray(correction.correction_advantages(provisional, target))
    self.assertTrue(np.all(np.isfinite(delta)))
    np.testing.assert_allclose(provisional + delta, target)

  @parameterized.named_parameters(
      ("huge_max_staleness", dict(max_staleness=2**31), "max_staleness"),
      ("mode", dict(mode="exp"), "mode"),
      ("max_staleness", dict(max_staleness=-1), "max_staleness"),
      ("versions", dict(segment_versions=jnp.array([1.0])), "segment_versions"),
  )
  def test_rejects_bad_arguments(self, kwargs, name):
    args = dict(segment_versions=jnp.array([1]), current_version=2, max_staleness=1)
    args.update(kwargs)
    with self.assertRaisesRegex(ValueError, name):
      correction.staleness_weights(**args)


if __name__ == "__main__":
  absltest.main()
