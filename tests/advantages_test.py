"""Tests for agentic_grpo.core.advantages."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import advantages


class GroupAdvantagesTest(parameterized.TestCase):

  def test_known_values(self):
    adv = advantages.group_advantages(jnp.array([1.0, 0.0, 0.0, 1.0]), eps=0.0 + 1e-9)
    np.testing.assert_allclose(adv, [1.0, -1.0, -1.0, 1.0], atol=1e-6)

  def test_matches_numpy_formula(self):
    r = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    expected = (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(advantages.group_advantages(r), expected, rtol=1e-5, atol=1e-6)

  def test_scale_none_is_centering(self):
    r = jnp.array([[3.0, 1.0, 2.0]])
    np.testing.assert_allclose(advantages.group_advantages(r, scale="none"), [[1.0, -1.0, 0.0]])

  def test_valid_excludes_members(self):
    r = jnp.array([1.0, 0.0, 100.0, 1.0, 0.0])
    valid = jnp.array([True, True, False, True, True])
    adv = advantages.group_advantages(r, valid)
    self.assertEqual(float(adv[2]), 0.0)
    expected = advantages.group_advantages(jnp.array([1.0, 0.0, 1.0, 0.0]))
    np.testing.assert_allclose(adv[jnp.array([0, 1, 3, 4])], expected, atol=1e-6)

  @parameterized.named_parameters(
      ("f32_equal", np.float32, [0.7, 0.7, 0.7, 0.7]),
      ("bf16_equal", jnp.bfloat16, [0.7, 0.7, 0.7, 0.7]),
      ("f32_rounding", np.float32, [0.1 + 0.2, 0.3, 0.3, 0.1 + 0.2]),
      ("bf16_rounding", jnp.bfloat16, [0.3, 0.30078125, 0.3, 0.3]),
      ("f32_large_rounding", np.float32, [1e6 + 0.0625, 1e6, 1e6, 1e6]),
      ("zeros", np.float32, [0.0, 0.0, 0.0, 0.0]),
  )
  def test_equal_groups_are_exactly_zero(self, dtype, values):
    r = jnp.asarray(np.array(values), dtype=dtype)
    for scale in advantages.SCALES:
      adv = advantages.group_advantages(r, scale=scale)
      np.testing.assert_array_equal(np.asarray(adv), np.zeros(4, np.float32))
      grad = jax.grad(lambda x: advantages.group_advantages(x, scale=scale).sum())(
          r.astype(jnp.float32))
      self.assertTrue(np.all(np.isfinite(grad)))

  def test_single_and_no_valid_member(self):
    r = jnp.array([[1.0, 5.0, 2.0], [1.0, 5.0, 2.0]])
    valid = jnp.array([[False, True, False], [False, False, False]])
    adv = advantages.group_advantages(r, valid)
    np.testing.assert_array_equal(np.asarray(adv), np.zeros((2, 3)))
    grad = jax.grad(lambda x: advantages.group_advantages(x, valid).sum())(r)
    np.testing.assert_array_equal(np.asarray(grad), np.zeros((2, 3)))

  def test_distinct_rewards_are_not_degenerate(self):
    adv = advantages.group_advantages(jnp.array([0.0, 0.001, 0.0, 0.0]))
    self.assertGreater(float(adv[1]), 1.0)

  def test_tied_groups_are_the_zero_advantage_groups(self):
    r = jnp.array([[0.7, 0.7, 0.7], [0.1 + 0.2, 0.3, 0.3], [1.0, 0.0, 1.0], [1.0, 5.0, 2.0],
                   [0.0, 1.0, 0.0]])
    valid = jnp.array([[True] * 3, [True] * 3, [True] * 3, [False, True, False],
                       [True, False, True]])
    tied = advantages.tied_groups(r, valid)
    np.testing.assert_array_equal(np.asarray(tied), [True, True, False, True, True])
    adv = np.asarray(advantages.group_advantages(r, valid))
    np.testing.assert_array_equal(np.asarray(tied), np.all(adv == 0.0, axis=-1))
    np.testing.assert_array_equal(np.asarray(advantages.tied_groups(r[2])), False)
    with self.assertRaisesRegex(ValueError, "valid must have shape"):
      advantages.tied_groups(r, valid[:, :2])

  def test_jit_and_batch_axes(self):
    r = jax.random.uniform(jax.random.PRNGKey(0), (2, 3, 4))
    jitted = jax.jit(advantages.group_advantages, static_argnames=("scale",))
    chex.assert_trees_all_close(jitted(r), advantages.group_advantages(r), atol=1e-6)
    np.testing.assert_allclose(jitted(r).mean(-1), 0.0, atol=1e-5)

  @hypothesis.settings(max_examples=40, deadline=None)
  @hypothesis.given(
      g=st.integers(1, 9),
      data=st.data(),
      scale=st.sampled_from(advantages.SCALES),
  )
  def test_finite_values_and_gradients(self, g, data, scale):
    reward = st.one_of(st.sampled_from([0.0, 1.0, 0.5]),
                       st.floats(-1e4, 1e4, allow_nan=False, width=32))
    r = jnp.array(data.draw(st.lists(reward, min_size=g, max_size=g)), jnp.float32)
    valid = jnp.array(data.draw(st.lists(st.booleans(), min_size=g, max_size=g)))
    adv, grad = jax.value_and_grad(
        lambda x: advantages.group_advantages(x, valid, scale=scale).sum())(r)
    self.assertTrue(np.all(np.isfinite(advantages.group_advantages(r, valid, scale=scale))))
    self.assertTrue(np.isfinite(adv))
    self.assertTrue(np.all(np.isfinite(grad)))

  @parameterized.named_parameters(
      ("scale", dict(scale="mad"), "scale"),
      ("eps", dict(eps=0.0), "eps"),
      ("valid_shape", dict(valid=jnp.ones((3,), bool)), "valid"),
      ("valid_dtype", dict(valid=jnp.ones((4,), jnp.float32)), "valid"),
  )
  def test_rejects_bad_arguments(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      advantages.group_advantages(jnp.zeros((4,)), **kwargs)

  def test_rejects_int_rewards(self):
    with self.assertRaisesRegex(ValueError, "rewards"):
      advantages.group_advantages(jnp.zeros((4,), jnp.int32))


class TargetAdvantagesTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(1)
    self.r = jnp.asarray(rng.integers(0, 2, size=(2, 4, 3)).astype(np.float32))
    self.final = jnp.asarray(rng.uniform(size=(2, 4)).astype(np.float32))

  def test_outcome_broadcasts_group_normalised_final_reward(self):
    target = advantages.target_advantages(self.r, self.final, mode="outcome")
    expected = advantages.group_advantages(self.final)
    for k in range(3):
      np.testing.assert_allclose(target[..., k], expected, atol=1e-6)

  def test_return_matches_hand_computed_returns(self):
    gamma = 0.5
    r = np.asarray(self.r)
    final = np.asarray(self.final)
    returns = np.zeros_like(r)
    for k in range(3):
      returns[..., k] = sum(gamma**(j - k) * r[..., j] for j in range(k, 3)) + gamma**(3 - k) * final
    np.testing.assert_allclose(
        advantages.discounted_returns(self.r, self.final, gamma), returns, atol=1e-6)
    target = advantages.target_advantages(self.r, self.final, mode="return", gamma=gamma)
    for k in range(3):
      np.testing.assert_allclose(target[..., k], advantages.group_advantages(returns[..., k]),
                                 atol=1e-5)

  def test_mixed_adds_beta_times_provisional(self):
    beta = 0.3
    target = advantages.target_advantages(self.r, self.final, mode="mixed", beta=beta)
    outcome = advantages.target_advantages(self.r, self.final, mode="outcome")
    provisional = advantages.provisional_advantages(self.r)
    np.testing.assert_allclose(target, outcome + beta * provisional, atol=1e-6)

  def test_provisional_normalises_each_stage_within_group(self):
    provisional = advantages.provisional_advantages(self.r)
    for k in range(3):
      np.testing.assert_allclose(provisional[..., k], advantages.group_advantages(self.r[..., k]),
                                 atol=1e-6)

  def test_previous_stage_baseline_matches_hand_computed_values(self):
    # One group of 4, stages (code, debug): the debug stage is credited with what it changed.
    r = jnp.asarray([[[1, 1], [0, 1], [0, 0], [1, 0]]], jnp.float32)
    final = jnp.asarray([[1, 1, 0, 0]], jnp.float32)
    np.testing.assert_allclose(
        advantages.stage_baselines(r, jnp.ones(r.shape, bool), "previous_stage"),
        [[[0, 1], [0, 0], [0, 0], [0, 1]]])
    # Debug deltas r_1 - r_0 = (0, 1, 0, -1); code stage keeps its own reward.
    np.testing.assert_allclose(
        advantages.provisional_advantages(r, scale="none", baseline="previous_stage"),
        [[[.5, 0], [-.5, 1], [-.5, 0], [.5, -1]]], atol=1e-6)
    # Targets R - b: stage 0 (1, 1, 0, 0), stage 1 (0, 1, 0, -1).
    np.testing.assert_allclose(
        advantages.target_advantages(r, final, mode="outcome", scale="none",
                                     baseline="previous_stage"),
        [[[.5, 0], [.5, 1], [-.5, 0], [-.5, -1]]], atol=1e-6)

  @parameterized.parameters("outcome", "return", "mixed")
  def test_no_baseline_is_the_default(self, mode):
    np.testing.assert_allclose(
        advantages.target_advantages(self.r, self.final, mode=mode, gamma=0.9, beta=0.3),
        advantages.target_advantages(self.r, self.final, mode=mode, gamma=0.9, beta=0.3,
                                     baseline="none"), atol=1e-6)

  def test_invalid_stages_get_zero(self):
    valid = jnp.ones((2, 4, 3), bool).at[0, 1, 2].set(False)
    for mode in advantages.TARGET_MODES:
      for baseline in advantages.BASELINES:
        target = advantages.target_advantages(self.r, self.final, mode=mode, valid=valid,
                                              baseline=baseline)
        self.assertEqual(float(target[0, 1, 2]), 0.0, mode)
        self.assertTrue(np.all(np.isfinite(target)))

  def test_jit(self):
    fn = jax.jit(advantages.target_advantages, static_argnames=("mode", "scale"))
    chex.assert_trees_all_close(
        fn(self.r, self.final, mode="return", gamma=0.9),
        advantages.target_advantages(self.r, self.final, mode="return", gamma=0.9), atol=1e-6)

  @parameterized.named_parameters(
      ("mode", dict(mode="hindsight"), "mode"),
      ("gamma", dict(mode="return", gamma=1.5), "gamma"),
      ("scale", dict(mode="outcome", scale="max"), "scale"),
      ("baseline", dict(mode="outcome", baseline="critic"), "baseline"),
  )
  def test_rejects_bad_options(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      advantages.target_advantages(self.r, self.final, **kwargs)

  def test_rejects_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, "final_rewards"):
      advantages.target_advantages(self.r, self.final[:, :3], mode="outcome")
    with self.assertRaisesRegex(ValueError, "stage_rewards"):
      advantages.target_advantages(self.r[0], self.final, mode="outcome")


class WeightNegativesTest(parameterized.TestCase):

  def test_scales_negatives_only(self):
    a = jnp.array([[-2.0, -0.5, 0.0, 0.25, 3.0]])
    np.testing.assert_array_equal(advantages.weight_negatives(a, 0.25),
                                  [[-0.5, -0.125, 0.0, 0.25, 3.0]])
    np.testing.assert_array_equal(advantages.weight_negatives(a, 1.0), a)
    np.testing.assert_array_equal(advantages.weight_negatives(a, 0.0), [[0, 0, 0, 0.25, 3.0]])

  def test_a_weighted_group_sums_to_its_positive_share(self):
    # One success in eight, std-normalised: +2.47 against -0.35 each; the weighted group's
    # advantages no longer sum to 0 but to (1 - w) times the successes' total.
    r = jnp.array([[1.0, 0, 0, 0, 0, 0, 0, 0]])
    a = advantages.group_advantages(r)
    w = advantages.weight_negatives(a, 0.5)
    self.assertAlmostEqual(float(w.sum()), 0.5 * float(a[0, 0]), places=5)

  def test_jit_and_bad_weight(self):
    a = jnp.array([-1.0, 1.0])
    f = jax.jit(advantages.weight_negatives, static_argnums=1)
    np.testing.assert_array_equal(f(a, 0.5), [-0.5, 1.0])
    for bad in (-0.1, float("nan"), float("inf")):
      with self.assertRaisesRegex(ValueError, "negative_weight"):
        advantages.weight_negatives(a, bad)


if __name__ == "__main__":
  absltest.main()
