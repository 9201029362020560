"""Tests for agentic_grpo.core.logprobs (the shared sampling transform)."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import logprobs
from agentic_grpo.core import types as core_types

_T = core_types.SamplingTransform


class TransformLogitsTest(parameterized.TestCase):

  def test_temperature_example_from_issue(self):
    # Logits [2, 1, 0] at temperature 0.5 are [4, 2, 0].
    lp = logprobs.token_logprobs(jnp.array([[2.0, 1.0, 0.0]]), jnp.array([0]),
                                 _T(temperature=0.5))
    expected = jax.nn.log_softmax(jnp.array([4.0, 2.0, 0.0]))[0]
    np.testing.assert_allclose(lp[0], expected, rtol=1e-6)

  def test_identity_transform_is_log_softmax(self):
    logits = np.random.RandomState(0).standard_normal((3, 5, 11)).astype(np.float32)
    targets = np.random.RandomState(1).randint(0, 11, (3, 5)).astype(np.int32)
    lp = logprobs.token_logprobs(logits, targets)
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(lp, ref, atol=1e-6)
    self.assertEqual(lp.dtype, jnp.float32)

  def test_top_k_keeps_k_and_renormalises(self):
    logits = jnp.array([[3.0, 1.0, 2.0, 0.0, -1.0]])
    x = logprobs.transform_logits(logits, _T(top_k=2))
    kept = np.asarray(x[0] > logprobs.MASKED_LOGIT / 2)
    np.testing.assert_array_equal(kept, [True, False, True, False, False])
    p = jax.nn.softmax(x[0])
    np.testing.assert_allclose(p[0], np.exp(3) / (np.exp(3) + np.exp(2)), rtol=1e-6)
    np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-6)

  def test_top_k_keeps_ties(self):
    x = logprobs.transform_logits(jnp.array([1.0, 2.0, 2.0, 0.0]), _T(top_k=1))
    np.testing.assert_array_equal(np.asarray(x > logprobs.MASKED_LOGIT / 2),
                                  [False, True, True, False])

  def test_top_p_nucleus(self):
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    logits = jnp.log(jnp.asarray(probs))
    # Sorted: 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95.
    x = logprobs.transform_logits(logits, _T(top_p=0.7))
    kept = np.asarray(x > logprobs.MASKED_LOGIT / 2)
    np.testing.assert_array_equal(kept, [False, True, False, True])
    lp = logprobs.token_logprobs(logits[None], jnp.array([1]), _T(top_p=0.7))
    np.testing.assert_allclose(lp[0], np.log(0.5 / 0.8), rtol=1e-5)

  def test_top_p_always_keeps_most_likely(self):
    x = logprobs.transform_logits(jnp.array([0.0, 5.0, 1.0]), _T(top_p=1e-6))
    np.testing.assert_array_equal(np.asarray(x > logprobs.MASKED_LOGIT / 2),
                                  [False, True, False])

  def test_top_k_then_top_p_on_tempered_distribution(self):
    logits = jnp.array([4.0, 3.0, 2.0, 1.0, 0.0])
    x = logprobs.transform_logits(logits, _T(temperature=2.0, top_k=3, top_p=0.5))
    # After T=2 and top-3: [2, 1.5, 1] -> probs .506, .307, .186: only the first.
    np.testing.assert_array_equal(np.asarray(x > logprobs.MASKED_LOGIT / 2),
                                  [True, False, False, False, False])

  def test_traced_arguments_match_static(self):
    logits = np.random.RandomState(2).standard_normal((4, 7, 19)).astype(np.float32) * 3
    targets = np.random.RandomState(3).randint(0, 19, (4, 7)).astype(np.int32)

    @jax.jit
    def traced(logits, targets, t, p):
      return logprobs.token_logprobs(logits, targets, _T(temperature=t, top_k=5, top_p=p))

    static = logprobs.token_logprobs(logits, targets, _T(temperature=0.6, top_k=5, top_p=0.9))
    np.testing.assert_allclose(traced(logits, targets, 0.6, 0.9), static, atol=1e-6)

  def test_masked_target_has_finite_value_and_gradient(self):
    logits = jnp.array([[5.0, 0.0, -5.0]])

    def f(l):
      return logprobs.token_logprobs(l, jnp.array([2]), _T(top_k=1)).sum()

    value, grad = jax.value_and_grad(f)(logits)
    self.assertLess(float(value), -1e20)
    self.assertTrue(np.all(np.isfinite(grad)))

  @parameterized.parameters(
      dict(kwargs=dict(temperature=0.0), match="temperature"),
      dict(kwargs=dict(temperature=-1.0), match="temperature"),
      dict(kwargs=dict(top_k=-1), match="top_k"),
      dict(kwargs=dict(top_k=1.5), match="top_k"),
      dict(kwargs=dict(top_p=0.0), match="top_p"),
      dict(kwargs=dict(top_p=1.5), match="top_p"),
      dict(kwargs=dict(vocab_limit=-1), match="vocab_limit"),
      dict(kwargs=dict(vocab_limit=2.0), match="vocab_limit"),
      dict(kwargs=dict(vocab_limit=True), match="vocab_limit"),
  )
  def test_invalid_arguments(self, kwargs, match):
    with self.assertRaisesRegex(ValueError, match):
      logprobs.transform_logits(jnp.zeros((2, 3)), _T(**kwargs))

  def test_transform_must_be_a_sampling_transform(self):
    with self.assertRaisesRegex(ValueError, "SamplingTransform"):
      logprobs.transform_logits(jnp.zeros((2, 3)), (1.0, 0, 1.0))

  def test_transform_is_hashable_by_value(self):
    self.assertEqual(hash(_T(0.5, 3, 0.9)), hash(_T(0.5, 3, 0.9)))
    self.assertEqual({_T(0.5, 3, 0.9): 1}[_T(temperature=0.5, top_k=3, top_p=0.9)], 1)
    self.assertNotEqual(_T(0.5), _T(0.6))

  def test_target_shape_mismatch(self):
    with self.assertRaisesRegex(ValueError, "targets shape"):
      logprobs.token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))

  def test_distribution_normalised_under_filters(self):
    logits = np.random.RandomState(4).standard_normal((16, 33)).astype(np.float32) * 4
    for kw in (dict(temperature=0.6), dict(top_k=7), dict(top_p=0.9),
               dict(temperature=1.3, top_k=10, top_p=0.8)):
      p = jax.nn.softmax(logprobs.transform_logits(logits, _T(**kw)), axis=-1)
      chex.assert_trees_all_close(p.sum(-1), jnp.ones(16), atol=1e-5)
      # The argmax always survives.
      top = jnp.argmax(logits, -1)
      self.assertTrue(bool(jnp.all(jnp.take_along_axis(p, top[:, None], -1) > 0)))


class VocabLimitTest(parameterized.TestCase):
  """Ids at or past `vocab_limit` (a padded embedding's rows) carry no probability, under every
  transform, and the other ids' distribution is that of the first `vocab_limit` logits alone."""

  _LIMIT = 20

  def _logits(self):
    x = np.random.RandomState(5).standard_normal((6, 32)).astype(np.float32) * 3
    x[:, self._LIMIT:] += 20.0  # the padded rows would win every draw
    return x

  @parameterized.named_parameters(
      ("identity", dict()),
      ("temperature", dict(temperature=0.6)),
      ("top_k", dict(top_k=5)),
      ("top_p", dict(top_p=0.9)),
      ("all", dict(temperature=1.3, top_k=10, top_p=0.8)),
      ("top_k_above_limit", dict(top_k=25)),
  )
  def test_padded_ids_masked_and_rest_as_without_them(self, kw):
    logits = self._logits()
    x = logprobs.transform_logits(logits, _T(vocab_limit=self._LIMIT, **kw))
    np.testing.assert_array_equal(np.asarray(x[:, self._LIMIT:]),
                                  np.float32(logprobs.MASKED_LOGIT))
    p = np.asarray(jax.nn.softmax(x, axis=-1))
    np.testing.assert_array_equal(p[:, self._LIMIT:], 0.0)
    # The sampleable ids get what the transform gives the first `vocab_limit` logits alone.
    alone = jax.nn.softmax(logprobs.transform_logits(logits[:, :self._LIMIT], _T(**kw)), -1)
    np.testing.assert_allclose(p[:, :self._LIMIT], alone, atol=1e-6)
    # The greedy choice is the argmax over the sampleable ids.
    np.testing.assert_array_equal(np.argmax(np.asarray(x), -1),
                                  np.argmax(logits[:, :self._LIMIT], -1))

  def test_token_logprobs_normalised_over_sampleable_ids(self):
    logits = self._logits()
    targets = np.arange(6, dtype=np.int32)
    lp = logprobs.token_logprobs(logits, targets, _T(vocab_limit=self._LIMIT))
    ref = jax.nn.log_softmax(logits[:, :self._LIMIT], -1)[np.arange(6), targets]
    np.testing.assert_allclose(lp, ref, atol=1e-5)
    padded = logprobs.token_logprobs(logits, np.full(6, 25, np.int32),
                                     _T(vocab_limit=self._LIMIT))
    self.assertTrue(np.all(np.asarray(padded) < -1e20))

  @parameterized.parameters(0, 32, 40)
  def test_limit_of_whole_vocabulary_or_zero_is_no_limit(self, limit):
    logits = self._logits()
    np.testing.assert_array_equal(logprobs.transform_logits(logits, _T(vocab_limit=limit)),
                                  logprobs.transform_logits(logits, _T()))

  def test_limit_is_part_of_the_transform_value(self):
    self.assertNotEqual(_T(vocab_limit=20), _T())
    self.assertEqual(hash(_T(0.5, 3, 0.9, 20)), hash(_T(0.5, 3, 0.9, vocab_limit=20)))


if __name__ == "__main__":
  absltest.main()
