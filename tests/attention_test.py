"""`models.attention`: the explicit backward (`ModelConfig.attention_backward='explicit'`) gives
the same forward bit for bit and autodiff's gradients up to float rounding, for the attention
alone, its causal blocks and chunks, a sharded call, and the whole transformer on packed rows."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import parallel
from agentic_grpo.models import attention
from agentic_grpo.models import presets
from agentic_grpo.models import sources
from agentic_grpo.models import transformer


def _inputs(seed, n=3, kv=2, g=2, t=12, s=12, dh=8, causal=True):
  """Random `q [n, kv, g, t, dh]`, `k, v [n, kv, s, dh]`, a `[n, t, s]` mask (causal with
  per-row padding; row 1's queries past its length see no key) and an output cotangent."""
  rng = np.random.default_rng(seed)
  q, ct = (jnp.asarray(rng.normal(size=(n, kv, g, t, dh)), jnp.float32) for _ in range(2))
  k, v = (jnp.asarray(rng.normal(size=(n, kv, s, dh)), jnp.float32) for _ in range(2))
  lengths = np.array([s, s // 2, 1] + [s] * (n - 3))[:n]
  mask = np.arange(s)[None, None, :] < lengths[:, None, None]  # valid keys
  if causal:
    mask = mask & (np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t))[None]
  mask[1, t // 2:] = False  # queries that see no key
  return q, k, v, jnp.asarray(np.broadcast_to(mask, (n, t, s))), ct


def _value_and_grads(fn, q, k, v, mask, ct):
  def loss(q, k, v):
    out = fn(q, k, v, mask)
    return jnp.sum(out * ct), out
  (value, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      q, k, v)
  return value, out, grads


def _assert_grads_close(got, want, rtol=1e-5, atol=1e-5):
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=rtol, atol=atol)


class AttendTest(parameterized.TestCase):

  @parameterized.product(g=(1, 2, 4), causal=(True, False))
  def test_explicit_backward_matches_autodiff(self, g, causal):
    q, k, v, mask, ct = _inputs(g, g=g, causal=causal)
    value0, out0, grads0 = _value_and_grads(
        lambda *a: attention.attend(*a, jnp.float32), q, k, v, mask, ct)
    value1, out1, grads1 = _value_and_grads(
        lambda *a: attention.attend(*a, jnp.float32, "explicit"), q, k, v, mask, ct)
    np.testing.assert_array_equal(out1, out0)  # the same forward, bit for bit
    np.testing.assert_allclose(value1, value0, rtol=1e-6)
    _assert_grads_close(grads1, grads0)
    # A query that sees no key passes no gradient to the keys and values (row 1 below).
    mask_none = mask.at[1].set(False)
    _, _, grads = _value_and_grads(
        lambda *a: attention.attend(*a, jnp.float32, "explicit"), q, k, v, mask_none, ct)
    np.testing.assert_array_equal(grads[0][1], 0.0)
    np.testing.assert_array_equal(grads[1][1], 0.0)

  def test_queries_after_a_longer_cache(self):
    # Fewer queries than keys (a prefill chunk after cached slots): the mask's offset.
    q, k, v, mask, ct = _inputs(3, t=5, s=12)
    _, _, grads0 = _value_and_grads(
        lambda *a: attention.attend(*a, jnp.float32), q, k, v, mask, ct)
    _, _, grads1 = _value_and_grads(
        lambda *a: attention.attend(*a, jnp.float32, "explicit"), q, k, v, mask, ct)
    _assert_grads_close(grads1, grads0)

  def test_bfloat16_products(self):
    q, k, v, mask, ct = _inputs(4)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    _, out0, grads0 = _value_and_grads(
        lambda *a: attention.attend(*a, jnp.bfloat16), q, k, v, mask, ct)
    _, out1, grads1 = _value_and_grads(
        lambda *a: attention.attend(*a, jnp.bfloat16, "explicit"), q, k, v, mask, ct)
    np.testing.assert_array_equal(out1, out0)
    self.assertEqual([x.dtype for x in grads1], [jnp.bfloat16] * 3)
    _assert_grads_close(grads1, grads0, rtol=5e-2, atol=5e-2)

  @parameterized.parameters(jnp.float32, jnp.bfloat16)
  def test_decode_step_matches_a_float64_reference(self, dtype):
    q, k, v, mask, _ = _inputs(9, t=1, s=9, g=4)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    got = attention.attend(q, k, v, mask, dtype)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = np.einsum("nkgtd,nksd->nkgts", q64, k64) / np.sqrt(q.shape[-1])
    scores = np.where(np.asarray(mask)[:, None, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = np.nan_to_num(probs / probs.sum(-1, keepdims=True))
    want = np.einsum("nkgts,nksd->nkgtd", probs, v64)
    seen = np.asarray(mask).any(-1)[:, None, None, :, None]  # rows that see a key
    self.assertEqual(got.dtype, jnp.float32)
    np.testing.assert_allclose(np.where(seen, got, 0), np.where(seen, want, 0),
                               rtol=1e-5, atol=1e-5)

  def test_decode_step_is_unchanged(self):
    q, k, v, mask, _ = _inputs(5, t=1, s=9)
    np.testing.assert_array_equal(attention.attend(q, k, v, mask, jnp.float32, "explicit"),
                                  attention.attend(q, k, v, mask, jnp.float32))

  @parameterized.parameters((4, False), (4, True), (5, False))
  def test_causal_blocks(self, block, remat):
    q, k, v, mask, ct = _inputs(6, t=12, s=12)
    def blocks(backward):
      return lambda *a: attention.causal_blocks(*a, block, jnp.float32, remat=remat,
                                                backward=backward)
    _, out0, grads0 = _value_and_grads(blocks("autodiff"), q, k, v, mask, ct)
    _, out1, grads1 = _value_and_grads(blocks("explicit"), q, k, v, mask, ct)
    np.testing.assert_array_equal(out1, out0)
    _assert_grads_close(grads1, grads0)

  def test_chunks(self):
    q, k, v, mask, ct = _inputs(7, t=12, s=12)
    _, _, grads0 = _value_and_grads(
        lambda *a: attention.chunked(*a, 5, jnp.float32), q, k, v, mask, ct)
    _, _, grads1 = _value_and_grads(
        lambda *a: attention.chunked(*a, 5, jnp.float32, "explicit"), q, k, v, mask, ct)
    _assert_grads_close(grads1, grads0)

  @parameterized.parameters(((8, 1, 1),), ((2, 2, 2),))
  def test_sharded_rows_and_heads(self, shape):
    q, k, v, mask, ct = _inputs(8, n=8)
    fn = lambda *a: attention.attend(*a, jnp.float32, "explicit")
    _, _, want = _value_and_grads(fn, q, k, v, mask, ct)
    mesh = parallel.make_mesh(shape)
    rows = P(("data", "fsdp"), "tensor")  # rows over the batch axes, key heads over tensor
    placed = [jax.device_put(x, NamedSharding(mesh, rows)) for x in (q, k, v)]
    mask = jax.device_put(mask, NamedSharding(mesh, P(("data", "fsdp"))))
    ct = jax.device_put(ct, NamedSharding(mesh, rows))
    _, _, got = _value_and_grads(fn, *placed, mask, ct)
    _assert_grads_close(got, want, atol=2e-5)
    self.assertTrue(got[1].sharding.is_equivalent_to(placed[1].sharding, 4))


def _tiny(backward):
  return presets.get_model_config("tiny", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  head_dim=8, mlp_dim=64, max_seq_len=64, causal_block=8,
                                  attention_backward=backward)


class TransformerTest(parameterized.TestCase):

  def test_packed_rows_gradients_match_autodiff(self):
    # Two packed rows of 24 slots: a tree (prefix of 5, suffixes of 6 and 4) and a single row,
    # then padding.
    t = 24
    branches = np.zeros((2, t), np.int32)
    positions = np.zeros((2, t), np.int32)
    branches[0, 5:11], branches[0, 11:15] = 1, 2
    positions[0, :5] = np.arange(5)
    positions[0, 5:11] = 5 + np.arange(6)
    positions[0, 11:15] = 5 + np.arange(4)
    positions[0, 15:21] = np.arange(6)  # a second tree of one row
    positions[1, :18] = np.arange(18)
    segment_mask = np.zeros((2, t), bool)
    segment_mask[0, :21] = True
    segment_mask[1, :18] = True
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 200, (2, t)), jnp.int32)
    weights = jnp.asarray(rng.normal(size=(2, t, 1)), jnp.float32)
    graphdef, params = transformer.init_model(_tiny("autodiff"), 0)
    results = []
    for backward in attention.BACKWARDS:
      g, _ = transformer.init_model(_tiny(backward), 0)
      def loss(p, g=g):
        logits, _ = transformer.apply(g, p, tokens, jnp.asarray(positions),
                                      segment_mask=jnp.asarray(segment_mask),
                                      branches=jnp.asarray(branches))
        return jnp.sum(jnp.where(segment_mask[..., None], logits, 0.0) * weights)
      results.append(jax.jit(jax.value_and_grad(loss))(params))
    (l0, g0), (l1, g1) = results
    self.assertEqual(float(l1), float(l0))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())))

  def test_bad_value_raises(self):
    with self.assertRaisesRegex(ValueError, "attention_backward must be one of"):
      _tiny("flash")

  def test_config_field_reaches_the_model(self):
    c = config_lib.TrainConfig()
    self.assertEqual(sources.open_model(c.model).model_config.attention_backward, "autodiff")
    section = dataclasses.replace(c.model, attention_backward="explicit")
    self.assertEqual(sources.open_model(section).model_config.attention_backward, "explicit")
    with self.assertRaisesRegex(ValueError, "attention_backward"):
      dataclasses.replace(c.model, attention_backward="fast").validate("model")


if __name__ == "__main__":
  absltest.main()
