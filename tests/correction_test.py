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

  @parameterized.named_parameters(
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
