"""Query-chunked attention of the training forward (`ModelConfig.attention_chunk`): the same
logits and gradients as the unchunked path, in float32."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.models import transformer


def _config(chunk):
  return transformer.get_model_config("tiny", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                      head_dim=8, mlp_dim=64, max_seq_len=64,
                                      attention_chunk=chunk)


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
    t = 20
    graphdef, params = transformer.init_model(_config(64), 0)
    chunked_graph, _ = transformer.init_model(_config(chunk), 0)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 200, (3, t)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (3, t))
    segment_mask = jnp.asarray(np.arange(t)[None] < np.array([[t], [12], [1]]))
    weights = jnp.asarray(rng.normal(size=(3, t, 1)), jnp.float32)

    def loss(p, graph):
      logits, _ = transformer.apply(graph, p, tokens, positions, segment_mask=segment_mask)
      return jnp.sum(jnp.where(segment_mask[..., None], logits, 0.0) * weights), logits

    (l0, logits0), g0 = jax.jit(jax.value_and_grad(
        lambda p: loss(p, graphdef), has_aux=True))(params)
    (l1, logits1), g1 = jax.jit(jax.value_and_grad(
        lambda p: loss(p, chunked_graph), has_aux=True))(params)
    np.testing.assert_allclose(np.where(segment_mask[..., None], logits1, 0),
                               np.where(segment_mask[..., None], logits0, 0),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

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


if __name__ == "__main__":
  absltest.main()
