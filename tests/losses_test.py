"""Tests for agentic_grpo.core.losses."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import logprobs as logprobs_lib
from agentic_grpo.core import losses
from agentic_grpo.core import types as core_types

# A hand-computed padded batch: row 0 has 3 loss tokens, row 1 has 2, the rest is padding.
MASK = np.array([[True, True, True, False], [True, True, False, False]])
VALUES = np.array([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]], np.float32)
GOLDEN_AGGREGATE = {
    "token_mean": 15.0 / 5.0,
    "seq_mean_token_mean": (6.0 / 3.0 + 9.0 / 2.0) / 2.0,
    "seq_mean_token_sum_norm": 15.0 / (2 * 4),
}
# Policy loss at ratio 1 with per-row advantages [1, -2]: per-token loss -A.
GOLDEN_POLICY = {
    "token_mean": (-3.0 + 4.0) / 5.0,
    "seq_mean_token_mean": (-1.0 + 2.0) / 2.0,
    "seq_mean_token_sum_norm": (-3.0 + 4.0) / 8.0,
}


def _poison(x, mask, value=1e9):
  return np.where(mask, x, value).astype(np.float32)


def _pad(x, extra, value=0.0):
  return np.pad(x, ((0, 0), (0, extra)), constant_values=value)


class AggregateTest(parameterized.TestCase):

  @parameterized.parameters(*losses.AGGREGATIONS)
  def test_golden_values(self, mode):
    out = losses.aggregate(jnp.asarray(VALUES), jnp.asarray(MASK), mode, max_tokens=4)
    np.testing.assert_allclose(out, GOLDEN_AGGREGATE[mode], rtol=1e-6)

  @parameterized.parameters(*losses.AGGREGATIONS)
  def test_masked_slots_and_padding_do_not_matter(self, mode):
    ref = losses.aggregate(VALUES, MASK, mode, max_tokens=4)
    poisoned = losses.aggregate(_poison(VALUES, MASK), MASK, mode, max_tokens=4)
    padded = losses.aggregate(_pad(VALUES, 3, 1e9), _pad(MASK, 3, False), mode, max_tokens=4)
    np.testing.assert_allclose(poisoned, ref, rtol=1e-6)
    np.testing.assert_allclose(padded, ref, rtol=1e-6)

  def test_sample_weights_scale_rows(self):
    out = losses.aggregate(VALUES, MASK, "token_mean", sample_weights=jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(out, 6.0 / 5.0, rtol=1e-6)

  def test_empty_mask_gives_zero(self):
    for mode in losses.AGGREGATIONS:
      out = losses.aggregate(VALUES, np.zeros_like(MASK), mode, max_tokens=4)
      self.assertEqual(float(out), 0.0)

  @parameterized.named_parameters(
      ("mode", dict(mode="sum"), "mode"),
      ("max_tokens", dict(mode="seq_mean_token_sum_norm", max_tokens=None), "max_tokens"),
      ("mask_dtype", dict(mode="token_mean", loss_mask=MASK.astype(np.float32)), "loss_mask"),
      ("mask_shape", dict(mode="token_mean", loss_mask=MASK[:, :3]), "loss_mask"),
      ("weights", dict(mode="token_mean", sample_weights=np.ones(3)), "sample_weights"),
  )
  def test_rejects_bad_arguments(self, kwargs, name):
    kwargs = dict(dict(values=VALUES, loss_mask=MASK), **kwargs)
    with self.assertRaisesRegex(ValueError, name):
      losses.aggregate(**kwargs)


class PolicyLossTest(parameterized.TestCase):

  @parameterized.product(mode=losses.AGGREGATIONS, ratio_level=losses.RATIO_LEVELS)
  def test_golden_values_at_ratio_one(self, mode, ratio_level):
    lp = np.full_like(VALUES, -1.3)
    loss, metrics = losses.policy_loss(lp, lp, jnp.array([1.0, -2.0]), MASK, aggregation=mode,
                                       ratio_level=ratio_level, max_tokens=4)
    np.testing.assert_allclose(loss, GOLDEN_POLICY[mode], rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, rtol=1e-6)
    self.assertEqual(float(metrics["clip_fraction"]), 0.0)
    self.assertEqual(float(metrics["loss_tokens"]), 5.0)

  @parameterized.product(mode=losses.AGGREGATIONS, ratio_level=losses.RATIO_LEVELS)
  def test_masked_slots_and_padding_do_not_matter(self, mode, ratio_level):
    rng = np.random.default_rng(0)
    lp = rng.normal(size=VALUES.shape).astype(np.float32) - 2.0
    blp = lp + 0.1 * rng.normal(size=VALUES.shape).astype(np.float32)
    adv = rng.normal(size=VALUES.shape).astype(np.float32)
    fn = functools.partial(losses.policy_loss, aggregation=mode, ratio_level=ratio_level,
                           max_tokens=4)
    grad_fn = jax.grad(lambda x, *a: fn(x, *a)[0])
    ref = fn(lp, blp, adv, MASK)[0]
    ref_grad = grad_fn(lp, blp, adv, MASK)
    poisoned = [_poison(x, MASK) for x in (lp, blp, adv)]
    np.testing.assert_allclose(fn(*poisoned, MASK)[0], ref, rtol=1e-5)
    grad = grad_fn(*poisoned, MASK)
    np.testing.assert_allclose(np.where(MASK, grad, 0.0), ref_grad, rtol=1e-5, atol=1e-7)
    self.assertTrue(np.all(np.isfinite(grad)))
    padded = [_pad(x, 2, 1e9) for x in (lp, blp, adv)]
    np.testing.assert_allclose(fn(*padded, _pad(MASK, 2, False))[0], ref, rtol=1e-5)

  @parameterized.product(mode=losses.AGGREGATIONS, ratio_level=losses.RATIO_LEVELS)
  def test_gradient_accumulation_invariance(self, mode, ratio_level):
    rng = np.random.default_rng(1)
    n, t = 7, 6
    mask = rng.uniform(size=(n, t)) < 0.6
    mask[3] = False  # A row without loss tokens.
    lp = rng.normal(size=(n, t)).astype(np.float32) - 1.0
    blp = lp + 0.3 * rng.normal(size=(n, t)).astype(np.float32)
    adv = rng.normal(size=(n,)).astype(np.float32)
    weights = rng.uniform(size=(n,)).astype(np.float32)

    def loss_fn(x, sl):
      return losses.policy_loss(x, blp[sl], adv[sl], mask[sl], aggregation=mode,
                                ratio_level=ratio_level, max_tokens=t, sample_weights=weights[sl],
                                eps_low=0.2, eps_high=0.28)[0]

    full = jax.grad(loss_fn)(lp, slice(0, n))
    slices = [slice(0, 2), slice(2, 3), slice(3, 7)]
    denominators = [float(losses.aggregate_denominator(mask[sl], mode, t)) for sl in slices]
    total = sum(denominators)
    accumulated = np.zeros_like(lp)
    for sl, d in zip(slices, denominators, strict=True):
      accumulated[sl] += np.asarray(jax.grad(loss_fn)(lp[sl], sl)) * d / total
    np.testing.assert_allclose(accumulated, full, rtol=1e-5, atol=1e-7)
    self.assertGreater(np.abs(full).max(), 1e-3)

  @parameterized.parameters(*losses.RATIO_LEVELS)
  def test_clipped_token_gets_zero_gradient(self, ratio_level):
    blp = np.full((1, 3), -2.0, np.float32)
    mask = np.array([[True, True, True]])
    shift = np.log(1.65)

    def loss_fn(lp):
      return losses.policy_loss(lp, blp, jnp.array([1.0]), mask, eps_low=0.2, eps_high=0.2,
                                ratio_level=ratio_level)

    lp = blp + shift  # Ratio 1.65 on every token (and for the sequence).
    (_, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(lp)
    np.testing.assert_array_equal(np.asarray(grad), np.zeros((1, 3)))
    self.assertGreater(float(metrics["clip_fraction"]), 0.0)
    np.testing.assert_allclose(metrics["ratio_mean"], 1.65, rtol=1e-5)
    (_, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(blp)
    np.testing.assert_allclose(grad, np.full((1, 3), -1.0 / 3.0), rtol=1e-6)
    self.assertEqual(float(metrics["clip_fraction"]), 0.0)

  def test_negative_advantage_clips_below(self):
    blp = np.full((1, 2), -1.0, np.float32)
    lp = blp + np.log(0.5)
    grad = jax.grad(lambda x: losses.policy_loss(x, blp, jnp.array([-1.0]), np.ones((1, 2), bool),
                                                 eps_low=0.2)[0])(lp)
    np.testing.assert_array_equal(np.asarray(grad), np.zeros((1, 2)))

  @parameterized.parameters(*losses.RATIO_LEVELS)
  def test_correction_identity(self, ratio_level):
    """∇L(Â) + ∇L(A* − Â) = ∇L(A*) at unchanged parameters (docs/design.md §1)."""
    key_w, key_x, key_a, key_t = jax.random.split(jax.random.PRNGKey(0), 4)
    n, t, d, v = 4, 5, 3, 7
    params = jax.random.normal(key_w, (d, v))
    features = jax.random.normal(key_x, (n, t, d))
    tokens = jax.random.randint(key_t, (n, t), 0, v)
    mask = jnp.arange(t)[None, :] < jnp.array([5, 3, 4, 1])[:, None]
    provisional, target = jax.random.normal(key_a, (2, n))

    def logprobs(w):
      logp = jax.nn.log_softmax(features @ w)
      return jnp.take_along_axis(logp, tokens[..., None], -1)[..., 0]

    behaviour = logprobs(params)

    def grad(adv):
      return jax.grad(lambda w: losses.policy_loss(logprobs(w), behaviour, adv, mask,
                                                   ratio_level=ratio_level)[0])(params)

    np.testing.assert_allclose(grad(provisional) + grad(target - provisional), grad(target),
                               rtol=1e-5, atol=1e-6)
    self.assertGreater(float(jnp.abs(grad(target)).max()), 1e-3)

  @parameterized.parameters(("seq_mean_token_sum_norm", True), ("token_mean", False),
                            ("seq_mean_token_mean", False))
  def test_correction_identity_across_batches(self, aggregation, holds):
    """The provisional update and its correction land in different learner batches.

    Segment 0 is updated provisionally on its own (a stage that just completed) and corrected
    later inside a batch with other rows (a packed finished episode). The net gradient on
    segment 0 equals the target's only when the normaliser does not depend on what else is in
    the batch: Dr. GRPO's constant `N · max_tokens` (with `N` the fixed batch rows). Per-batch
    token or row counts weigh segment 0 more in the small provisional batch than in the
    correction batch, so the correction undoes only part of the provisional step.
    """
    key_w, key_x, key_t = jax.random.split(jax.random.PRNGKey(1), 3)
    n, t, d, v = 4, 6, 3, 7
    params = jax.random.normal(key_w, (d, v))
    features = jax.random.normal(key_x, (n, t, d))
    tokens = jax.random.randint(key_t, (n, t), 0, v)
    lengths = jnp.array([2, 6, 5, 6])
    full = jnp.arange(t)[None, :] < lengths[:, None]
    alone = full & (jnp.arange(n) == 0)[:, None]  # the provisional batch: segment 0 only
    provisional, target = 1.5, -0.5
    others = jnp.array([0.0, 0.7, -1.2, 0.4])

    def logprobs(w):
      logp = jax.nn.log_softmax(features @ w)
      return jnp.take_along_axis(logp, tokens[..., None], -1)[..., 0]

    behaviour = logprobs(params)

    def grad(adv, mask):
      return jax.grad(lambda w: losses.policy_loss(
          logprobs(w), behaviour, adv, mask, aggregation=aggregation, max_tokens=t)[0])(params)

    with_seg0 = lambda a0: others.at[0].set(a0)
    net = grad(with_seg0(provisional), alone) + grad(with_seg0(target - provisional), full)
    want = grad(with_seg0(target), full)
    if holds:
      np.testing.assert_allclose(net, want, rtol=1e-5, atol=1e-6)
    else:
      self.assertGreater(float(jnp.abs(net - want).max()), 1e-2)

  @hypothesis.settings(max_examples=25, deadline=None)
  @hypothesis.given(data=st.data(), mode=st.sampled_from(losses.AGGREGATIONS),
                    ratio_level=st.sampled_from(losses.RATIO_LEVELS))
  def test_gradients_finite_for_arbitrary_inputs(self, data, mode, ratio_level):
    n = data.draw(st.integers(1, 4))
    t = data.draw(st.integers(1, 5))
    floats = st.floats(-30.0, 0.0, allow_nan=False, width=32)
    lp = np.array(data.draw(st.lists(floats, min_size=n * t, max_size=n * t)),
                  np.float32).reshape(n, t)
    blp = np.array(data.draw(st.lists(floats, min_size=n * t, max_size=n * t)),
                   np.float32).reshape(n, t)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n * t, max_size=n * t))).reshape(n, t)
    adv = np.array(data.draw(st.lists(st.floats(-10, 10, width=32), min_size=n, max_size=n)),
                   np.float32)
    (loss, metrics), grad = jax.value_and_grad(
        lambda x: losses.policy_loss(x, blp, adv, mask, aggregation=mode, ratio_level=ratio_level,
                                     max_tokens=t), has_aux=True)(lp)
    self.assertTrue(np.isfinite(loss))  # log-ratios are clamped before exp
    self.assertTrue(np.all(np.isfinite(grad)))
    self.assertTrue(np.isfinite(metrics["clip_fraction"]))

  @parameterized.named_parameters(
      ("ratio_level", dict(ratio_level="segment"), "ratio_level"),
      ("aggregation", dict(aggregation="sum"), "aggregation"),
      ("eps_low", dict(eps_low=1.0), "eps_low"),
      ("eps_high", dict(eps_high=-0.1), "eps_high"),
      ("advantages", dict(advantages=np.ones(3)), "advantages"),
      ("behaviour", dict(behaviour_logprobs=np.zeros((2, 3))), "behaviour_logprobs"),
      ("mask", dict(loss_mask=np.ones((2, 4))), "loss_mask"),
  )
  def test_rejects_bad_arguments(self, kwargs, name):
    args = dict(logprobs=VALUES, behaviour_logprobs=VALUES, advantages=np.ones(2),
                loss_mask=MASK)
    args.update(kwargs)
    with self.assertRaisesRegex(ValueError, name):
      losses.policy_loss(**args)


class DualClipTest(parameterized.TestCase):

  # Ratios 0.5, 1, 2, 5 against behaviour log-prob -1; eps 0.2, c = 3, token_mean.
  RATIOS = np.array([[0.5, 1.0, 2.0, 5.0]], np.float32)

  def _loss(self, adv, dual_clip, ratio_level="token", ratios=None):
    ratios = self.RATIOS if ratios is None else ratios
    blp = np.full(ratios.shape, -1.0, np.float32)
    fn = lambda x: losses.policy_loss(
        x, blp, jnp.array([adv], jnp.float32), np.ones(ratios.shape, bool), eps_low=0.2,
        eps_high=0.2, aggregation="token_mean", ratio_level=ratio_level, dual_clip=dual_clip)
    return jax.value_and_grad(fn, has_aux=True)(blp + np.log(ratios))

  def test_hand_computed_negative_advantage(self):
    # Per token |A| · max(ρ, clip(ρ)) = 0.8, 1, 2, 5; dual clip caps the last at c |A| = 3.
    (loss, metrics), grad = self._loss(-1.0, 3.0)
    np.testing.assert_allclose(loss, (0.8 + 1.0 + 2.0 + 3.0) / 4, rtol=1e-6)
    # d/dlogπ of |A| ρ is |A| ρ / 4 on the unclipped tokens; 0 where PPO or dual clip holds.
    np.testing.assert_allclose(grad, [[0.0, 0.25, 0.5, 0.0]], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["clip_fraction"], 0.25)
    np.testing.assert_allclose(metrics["dual_clip_fraction"], 0.25)
    (loss, metrics), grad = self._loss(-2.0, 3.0)
    np.testing.assert_allclose(loss, 2 * (0.8 + 1.0 + 2.0 + 3.0) / 4, rtol=1e-6)
    (loss, metrics), grad = self._loss(-1.0, 0.0)  # off: the PPO value 5 and gradient 5/4
    np.testing.assert_allclose(loss, (0.8 + 1.0 + 2.0 + 5.0) / 4, rtol=1e-6)
    np.testing.assert_allclose(grad, [[0.0, 0.25, 0.5, 1.25]], rtol=1e-5, atol=1e-7)
    self.assertEqual(float(metrics["dual_clip_fraction"]), 0.0)

  def test_positive_advantage_unchanged(self):
    (off, _), g_off = self._loss(1.5, 0.0)
    (on, metrics), g_on = self._loss(1.5, 3.0)
    np.testing.assert_allclose(on, off, rtol=0)
    np.testing.assert_allclose(g_on, g_off, rtol=0)
    # Per token −A · min(ρ, clip(ρ)) = −1.5 · (0.5, 1, 1.2, 1.2).
    np.testing.assert_allclose(on, -1.5 * (0.5 + 1.0 + 1.2 + 1.2) / 4, rtol=1e-6)
    self.assertEqual(float(metrics["dual_clip_fraction"]), 0.0)

  def test_sequence_level(self):
    # Sequence ratio exp(mean log ρ) = 4 for ρ = (2, 8); A = −1, c = 3: loss 3 per token.
    (loss, metrics), grad = self._loss(-1.0, 3.0, "sequence", np.array([[2.0, 8.0]], np.float32))
    np.testing.assert_allclose(loss, 3.0, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(grad), np.zeros((1, 2)))
    self.assertEqual(float(metrics["dual_clip_fraction"]), 1.0)
    (loss, _), _ = self._loss(-1.0, 0.0, "sequence", np.array([[2.0, 8.0]], np.float32))
    np.testing.assert_allclose(loss, 4.0, rtol=1e-5)

  @parameterized.parameters(0.5, 1.0, -2.0)
  def test_rejects_bound_not_above_one(self, c):
    with self.assertRaisesRegex(ValueError, "dual_clip"):
      losses.policy_loss(VALUES, VALUES, np.ones(2), MASK, dual_clip=c)


def _extreme(rng, shape, choices, scale):
  """Random entries from `choices`, half of them perturbed by `scale`-sized noise."""
  x = rng.choice(np.asarray(choices, np.float32), size=shape)
  noise = np.where(rng.random(shape) < 0.5, rng.normal(size=shape) * scale, 0.0)
  return (x + noise).astype(np.float32)


class FiniteUnderExtremeInputsTest(parameterized.TestCase):
  """Property: finite loss, gradients and metrics for any finite inputs (seeded NumPy draws)."""

  LOGPROBS = (-1e30, -1e20, -1e4, -88.0, -20.5, -5.0, -1.0, -1e-3, 0.0)
  ADVANTAGES = (-1e6, -1e3, -1.0, 0.0, 1.0, 1e3, 1e6)

  @parameterized.product(ratio_level=losses.RATIO_LEVELS, aggregation=losses.AGGREGATIONS,
                         weighted=(False, True))
  def test_policy_loss(self, ratio_level, aggregation, weighted):
    rng = np.random.default_rng(len(ratio_level) * 100 + len(aggregation) * 10 + weighted)
    for _ in range(6):
      n, t = rng.integers(1, 5), rng.integers(1, 7)
      lp = _extreme(rng, (n, t), self.LOGPROBS, 3.0)
      blp = _extreme(rng, (n, t), self.LOGPROBS, 3.0)
      adv = _extreme(rng, (n, t) if rng.random() < 0.5 else (n,), self.ADVANTAGES, 10.0)
      mask = rng.random((n, t)) < 0.7
      weights = rng.uniform(0.0, 2.0, n).astype(np.float32) if weighted else None
      for dual_clip in (0.0, 3.0):
        (loss, metrics), grad = jax.value_and_grad(
            lambda x: losses.policy_loss(x, blp, adv, mask, aggregation=aggregation,
                                         ratio_level=ratio_level, max_tokens=int(t),
                                         sample_weights=weights, dual_clip=dual_clip),
            has_aux=True)(lp)
        msg = f"lp={lp} blp={blp} adv={adv} mask={mask} dual_clip={dual_clip}"
        self.assertTrue(np.isfinite(loss), msg)
        self.assertTrue(np.all(np.isfinite(grad)), msg)
        for k, v in metrics.items():
          self.assertTrue(np.isfinite(v) or (k == "ratio_max" and not mask.any()), (k, msg))

  @parameterized.parameters(*losses.KL_ESTIMATORS)
  def test_kl_penalty(self, estimator):
    rng = np.random.default_rng(7)
    lp = _extreme(rng, (6, 9), self.LOGPROBS, 3.0)
    ref = _extreme(rng, (6, 9), self.LOGPROBS, 3.0)
    kl, grad = jax.value_and_grad(
        lambda x: losses.kl_penalty(x, ref, estimator=estimator).sum())(lp)
    self.assertTrue(np.isfinite(kl))
    self.assertTrue(np.all(np.isfinite(grad)))

  def test_entropy_of_filtered_distribution(self):
    # Top-k / top-p give removed entries the finite MASKED_LOGIT; entropy and its gradient
    # (through the filter, to the raw logits) must stay finite.
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 11)) * 10.0

    def h(x, top_k, top_p):
      y = logprobs_lib.transform_logits(
          x, core_types.SamplingTransform(temperature=0.7, top_k=top_k, top_p=top_p))
      return losses.entropy(y, jnp.ones((2, 3), bool)).sum()

    for top_k, top_p in ((1, 1.0), (3, 1.0), (0, 0.5), (4, 0.9)):
      value, grad = jax.value_and_grad(h)(logits, top_k, top_p)
      self.assertTrue(np.isfinite(value))
      self.assertTrue(np.all(np.isfinite(grad)))
    np.testing.assert_allclose(h(logits, 1, 1.0), 0.0, atol=1e-6)  # one kept entry


class KLTest(parameterized.TestCase):

  @parameterized.parameters(*losses.KL_ESTIMATORS)
  def test_zero_at_reference(self, estimator):
    lp = jax.random.normal(jax.random.PRNGKey(0), (3, 4)) - 2.0
    np.testing.assert_array_equal(np.asarray(losses.kl_penalty(lp, lp, estimator=estimator)),
                                  np.zeros((3, 4)))

  def test_k3_is_nonnegative_and_values(self):
    lp = jax.random.normal(jax.random.PRNGKey(1), (5, 6))
    ref = jax.random.normal(jax.random.PRNGKey(2), (5, 6))
    log_r = ref - lp
    self.assertTrue(np.all(losses.kl_penalty(lp, ref, estimator="k3") >= 0))
    np.testing.assert_allclose(losses.kl_penalty(lp, ref, estimator="k1"), -log_r, rtol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(lp, ref, estimator="k2"), 0.5 * log_r**2,
                               rtol=1e-6)
    np.testing.assert_allclose(losses.kl_penalty(lp, ref, estimator="k3"),
                               np.exp(log_r) - 1 - log_r, rtol=1e-5, atol=1e-6)

  @parameterized.parameters(*losses.KL_ESTIMATORS)
  def test_sgd_on_exact_expectation_lowers_kl(self, estimator):
    """β · E_π[k] as a loss pulls a categorical policy towards the reference."""
    ref_logits = jax.random.normal(jax.random.PRNGKey(3), (6,))
    ref_logp = jax.nn.log_softmax(ref_logits)
    vocab = jnp.arange(6)[None, :]

    def true_kl(theta):
      logp = jax.nn.log_softmax(theta)
      return jnp.sum(jnp.exp(logp) * (logp - ref_logp))

    def loss(theta):
      logp = jax.nn.log_softmax(theta)
      kl = losses.kl_penalty(logp[vocab], ref_logp[vocab], estimator=estimator)
      return 0.1 * jnp.sum(jnp.exp(logp) * kl[0])

    theta = jnp.zeros(6)
    before = true_kl(theta)
    for _ in range(20):
      theta = theta - 1.0 * jax.grad(loss)(theta)
    self.assertLess(float(true_kl(theta)), 0.7 * float(before))

  @parameterized.parameters("k2", "k3")
  def test_sgd_on_sampled_estimator_lowers_kl(self, estimator):
    """The way GRPO uses it: tokens sampled from π_θ, no gradient through the sampling."""
    ref_logp = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(4), (6,)) * 2)

    def true_kl(theta):
      logp = jax.nn.log_softmax(theta)
      return jnp.sum(jnp.exp(logp) * (logp - ref_logp))

    def loss(theta, tokens):
      logp = jax.nn.log_softmax(theta)[tokens]
      kl = losses.kl_penalty(logp[None], ref_logp[tokens][None], estimator=estimator)
      return losses.aggregate(kl, jnp.ones_like(kl, bool), "token_mean")

    theta = jnp.zeros(6)
    before = true_kl(theta)
    key = jax.random.PRNGKey(5)
    for _ in range(30):
      key, sub = jax.random.split(key)
      tokens = jax.random.categorical(sub, theta, shape=(512,))
      theta = theta - 0.5 * jax.grad(loss)(theta, tokens)
    self.assertLess(float(true_kl(theta)), 0.5 * float(before))

  def test_rejects_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "estimator"):
      losses.kl_penalty(VALUES, VALUES, estimator="k4")
    with self.assertRaisesRegex(ValueError, "ref_logprobs"):
      losses.kl_penalty(VALUES, VALUES[:, :2])


class EntropyTest(absltest.TestCase):

  def test_uniform_and_one_hot(self):
    logits = jnp.stack([jnp.zeros((2, 5)), jnp.array([[0.0, -jnp.inf, -jnp.inf, -jnp.inf, -jnp.inf]] * 2)])
    h = losses.entropy(logits, jnp.array([[True, False], [True, True]]))
    np.testing.assert_allclose(h, [[np.log(5), 0.0], [0.0, 0.0]], rtol=1e-6, atol=1e-7)
    self.assertTrue(np.all(np.isfinite(jax.grad(
        lambda x: losses.entropy(x, jnp.ones((2, 2), bool)).sum())(logits))))

  def test_rejects_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, "logits"):
      losses.entropy(jnp.zeros((2, 5)), jnp.ones((2,), bool))
    with self.assertRaisesRegex(ValueError, "loss_mask"):
      losses.entropy(jnp.zeros((2, 3, 5)), jnp.ones((2, 2), bool))


if __name__ == "__main__":
  absltest.main()
