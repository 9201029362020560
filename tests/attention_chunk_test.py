"""Query-chunked attention (`ModelConfig.attention_chunk`) and causal blocks
(`ModelConfig.causal_block`) of the training forward and of a prefill that fills its cache: the
same logits, gradients and cache as the whole `[T, T]` attention, in float32."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo.models import presets
from agentic_grpo.models import sources
from agentic_grpo.models import transformer


def _config(chunk, block=0):
  return presets.get_model_config("tiny", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  head_dim=8, mlp_dim=64, max_seq_len=64,
                                  attention_chunk=chunk, causal_block=block)


def _loss_and_grads(graphdef, params, tokens, positions, segment_mask, weights):
  """`(loss, logits off the mask zeroed, grads)` of a weighted sum of the valid logits."""
  def loss(p):
    logits, _ = transformer.apply(graphdef, p, tokens, positions, segment_mask=segment_mask)
    return jnp.sum(jnp.where(segment_mask[..., None], logits, 0.0) * weights), logits
  (l, logits), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return l, np.where(segment_mask[..., None], logits, 0), g


def _assert_matches_whole(config, seed, length, scaled_atol=True):
  """`config`'s logits, loss and gradients equal the whole `[T, T]` attention's (T = 20; rows
  of 20, `length` and 1 valid tokens). `scaled_atol`: gradients to 1e-5 of each leaf's scale
  (sums rounded in another order), else to 1e-5 absolute."""
  t = 20
  graphdef, params = transformer.init_model(_config(64), 0)
  other_graph, _ = transformer.init_model(config, 0)
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, 200, (3, t)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (3, t))
  segment_mask = jnp.asarray(np.arange(t)[None] < np.array([[t], [length], [1]]))
  weights = jnp.asarray(rng.normal(size=(3, t, 1)), jnp.float32)
  l0, logits0, g0 = _loss_and_grads(graphdef, params, tokens, positions, segment_mask, weights)
  l1, logits1, g1 = _loss_and_grads(other_graph, params, tokens, positions, segment_mask,
                                    weights)
  np.testing.assert_allclose(logits1, logits0, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
    scale = max(1.0, float(np.abs(b).max())) if scaled_atol else 1.0
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


class AttentionChunkTest(parameterized.TestCase):

  def test_auto_chunk(self):
    c = _config(0)
    self.assertEqual(c.query_chunk(256), 256)
    self.assertEqual(c.query_chunk(2 * transformer.AUTO_ATTENTION_CHUNK),
                     2 * transformer.AUTO_ATTENTION_CHUNK)
    self.assertEqual(c.query_chunk(2 * transformer.AUTO_ATTENTION_CHUNK + 1),
                     transformer.AUTO_ATTENTION_CHUNK)
    self.assertEqual(_config(8).query_chunk(20), 8)
    self.assertEqual(_config(64).query_chunk(20), 20)
    with self.assertRaisesRegex(ValueError, "attention_chunk"):
      _config(-1)

  @parameterized.parameters(8, 5, 20)  # dividing T, not dividing it (padded), and T itself
  def test_logits_and_grads_match_unchunked(self, chunk):
    _assert_matches_whole(_config(chunk), seed=0, length=12, scaled_atol=False)

  def test_chunked_forward_holds_one_chunk_of_scores(self):
    """The chunked forward's largest f32 buffer of scores is one chunk's, `[N, K, G, C, T]`."""
    t, chunk = 64, 8
    graphdef, params = transformer.init_model(_config(chunk), 0)
    tokens = jnp.zeros((1, t), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (1, t))
    jaxpr = str(jax.make_jaxpr(
        lambda p: transformer.apply(graphdef, p, tokens, positions)[0])(params))
    self.assertNotIn(f"f32[1,2,2,{t},{t}]", jaxpr)  # the whole [T, T] scores of all heads
    self.assertIn(f"f32[1,2,2,{chunk},{t}]", jaxpr)
    unchunked, _ = transformer.init_model(dataclasses.replace(_config(chunk),
                                                              attention_chunk=t), 0)
    self.assertIn(f"f32[1,2,2,{t},{t}]", str(jax.make_jaxpr(
        lambda p: transformer.apply(unchunked, p, tokens, positions)[0])(params)))


  @parameterized.parameters(8, 5)  # dividing T, and not (a short last chunk)
  def test_causal_chunks_match_whole_attention(self, chunk):
    """Chunks with `causal_block` on: each chunk of queries against the keys up to its last
    slot, recomputed in the backward pass; the same logits and gradients."""
    _assert_matches_whole(_config(chunk, block=4), seed=2, length=11)

  def test_causal_chunks_score_keys_up_to_their_last_query_only(self):
    """T = 24 in chunks of 8 with `causal_block` on: scores `[8, 8]`, `[8, 16]`, `[8, 24]` per
    head, never `[8, 24]` for every chunk (what the chunks without it compute), nor `[24, 24]`;
    each chunk's attention is recomputed in the backward pass (a `checkpoint` per chunk)."""
    t, chunk = 24, 8
    tokens = jnp.zeros((1, t), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (1, t))

    def jaxpr(block):
      graphdef, params = transformer.init_model(_config(chunk, block), 0)
      return str(jax.make_jaxpr(
          lambda p: transformer.apply(graphdef, p, tokens, positions)[0])(params))

    causal = jaxpr(4)  # any block below T
    for keys in (8, 16, 24):
      self.assertIn(f"f32[1,2,2,{chunk},{keys}]", causal)
    self.assertNotIn(f"f32[1,2,2,{t},{t}]", causal)
    self.assertEqual(causal.count("remat"), 2 * (t // chunk))  # 2 layers
    self.assertEqual(jaxpr(t).count("remat"), 2)  # a block of T or more: off
    plain = jaxpr(0)  # `lax.map` over chunks, each against all T keys
    self.assertIn(f"f32[1,2,2,{chunk},{t}]", plain)
    self.assertNotIn(f"f32[1,2,2,{chunk},16]", plain)
    self.assertEqual(plain.count("remat"), 2)  # one checkpointed body per layer


class CausalBlockTest(parameterized.TestCase):

  def test_validation_and_default(self):
    self.assertEqual(presets.get_model_config("tiny").causal_block, 128)
    for bad in (-1, True, 2.0):
      with self.assertRaisesRegex(ValueError, "causal_block"):
        _config(0, bad)

  @parameterized.parameters(4, 5, 10)  # dividing T, not dividing it (a short last block), T/2
  def test_logits_and_grads_match_whole_attention(self, block):
    _assert_matches_whole(_config(64, block), seed=1, length=13)

  def test_blocks_score_only_keys_up_to_their_last_query(self):
    """With blocks of 4 over T = 12 the scores are `[4, 4]`, `[4, 8]` and `[4, 12]` per head:
    never the whole `[12, 12]`; below 2 blocks (T = 7) they are."""
    graphdef, params = transformer.init_model(_config(64, 4), 0)

    def scores_shapes(t):
      tokens = jnp.zeros((1, t), jnp.int32)
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (1, t))
      return str(jax.make_jaxpr(
          lambda p: transformer.apply(graphdef, p, tokens, positions)[0])(params))

    jaxpr = scores_shapes(12)
    for keys in (4, 8, 12):
      self.assertIn(f"f32[1,2,2,4,{keys}]", jaxpr)
    self.assertNotIn("f32[1,2,2,12,12]", jaxpr)
    self.assertIn("f32[1,2,2,7,7]", scores_shapes(7))

  def _prefill(self, block, t, slots, index=0, seed=2):
    """A prefill of `t` tokens (rows of t, 9 and 1 valid) into a cache of `slots` slots at
    `index`: `(logits, cache)`, and the jaxpr of the call."""
    graphdef, params = transformer.init_model(_config(64, block), 0)
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, 200, (3, t)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (3, t))
    segment_mask = jnp.asarray(np.arange(t)[None] < np.array([[t], [9], [1]]))
    cache = transformer.init_cache(_config(64, block), 3, slots)._replace(
        index=jnp.int32(index))

    def run(p):
      return transformer.apply(graphdef, p, tokens, positions, cache, segment_mask)

    return jax.jit(run)(params), str(jax.make_jaxpr(run)(params))

  @parameterized.parameters(4, 5)
  def test_a_prefill_filling_its_cache_scores_blocks(self, block):
    """A prefill of T = 12 tokens into a cache of 12 slots scores blocks (`[4, 4]`, `[4, 8]`,
    `[4, 12]` for blocks of 4), with the logits, keys and values of the blockless prefill;
    into a longer cache (T < S: its slots past T are not causal in slot order) it scores all
    S keys at once."""
    (logits, cache), jaxpr = self._prefill(block, 12, 12)
    (logits0, cache0), jaxpr0 = self._prefill(0, 12, 12)
    if block == 4:
      for keys in (4, 8, 12):
        self.assertIn(f"f32[3,2,2,4,{keys}]", jaxpr)
    self.assertNotIn("f32[3,2,2,12,12]", jaxpr)
    self.assertIn("f32[3,2,2,12,12]", jaxpr0)
    valid = np.asarray(cache0.valid)
    np.testing.assert_array_equal(np.asarray(cache.valid), valid)
    np.testing.assert_allclose(np.where(valid[..., None], logits, 0),
                               np.where(valid[..., None], logits0, 0), rtol=1e-5, atol=1e-5)
    for a, b in zip(cache.k + cache.v, cache0.k + cache0.v, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    self.assertEqual(int(cache.index), 12)
    _, longer = self._prefill(block, 12, 16)
    self.assertIn("f32[3,2,2,12,16]", longer)

  def test_a_prefill_filling_its_cache_writes_from_slot_zero(self):
    """T = S tokens fill the cache from slot 0 whatever its index (the slice update's start is
    clamped there): the same logits and cache as at index 0, and the mask agrees with it."""
    (logits, cache), _ = self._prefill(4, 12, 12, index=5)
    (logits0, cache0), _ = self._prefill(4, 12, 12, index=0)
    np.testing.assert_allclose(logits, logits0, rtol=1e-6, atol=1e-6)
    for a, b in zip(cache.k + cache.v, cache0.k + cache0.v, strict=True):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(int(cache.index), 12)

  def test_training_config_reaches_the_model(self):
    c = config_lib.TrainConfig()
    self.assertEqual(sources.open_model(c.model).model_config.causal_block, 128)
    section = dataclasses.replace(c.model, causal_block=32)
    self.assertEqual(sources.open_model(section).model_config.causal_block, 32)


if __name__ == "__main__":
  absltest.main()
