"""Tests for agentic_grpo.models.transformer."""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import logprobs as logprobs_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.models import presets
from agentic_grpo.models import transformer

_AXES = {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim"}

# Small configs covering the architecture options.
_SMALL = {
    "tied_gqa": transformer.ModelConfig(
        vocab_size=37, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
        mlp_dim=48, max_seq_len=64),
    "untied_bias_mha": transformer.ModelConfig(
        vocab_size=37, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=16,
        mlp_dim=48, qkv_bias=True, tie_embeddings=False, rope_theta=1e6, max_seq_len=64),
    "llama3_rope_mqa": transformer.ModelConfig(
        vocab_size=37, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=8,
        mlp_dim=48, max_seq_len=64,
        rope_scaling=transformer.Llama3RopeScaling(8.0, 1.0, 4.0, 16)),
    # Qwen3: per-head q/k norm, 3 query heads over 1 kv head, head_dim unrelated to d_model.
    "qk_norm_odd_heads": transformer.ModelConfig(
        vocab_size=37, d_model=32, n_layers=2, n_heads=3, n_kv_heads=1, head_dim=10,
        mlp_dim=48, qk_norm=True, max_seq_len=64),
}

# Published parameter counts (model cards), in millions.
_PUBLISHED_M = {
    "qwen2_0_5b": 494, "qwen2_1_5b": 1544, "qwen2_7b": 7616,
    "qwen3_0_6b": 596, "qwen3_8b": 8191, "llama3_2_1b": 1236, "llama3_2_3b": 3213,
}


def _randomise(params, seed):
  """Random values for every parameter (biases and norms start as 0/1)."""
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda x: x + 0.1 * rng.standard_normal(x.shape).astype(x.dtype), params)


@functools.lru_cache(maxsize=None)
def _model(name):
  config = _SMALL[name]
  graphdef, params = transformer.init_model(config, jax.random.key(0))
  return config, graphdef, _randomise(params, 1)


_apply = jax.jit(transformer.apply, static_argnums=0)
_sequence_logprobs = jax.jit(transformer.sequence_logprobs, static_argnums=(0, 5))


def _positions(n, t):
  return np.broadcast_to(np.arange(t, dtype=np.int32), (n, t))


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(_PUBLISHED_M))
  def test_preset_parameter_counts_match_published(self, name):
    config = presets.get_model_config(name)
    # Shapes of a 1- and a 2-layer copy give embeddings + per-layer counts
    # without tracing the full depth.
    one, two = (transformer.param_count(transformer.abstract_model(
        dataclasses.replace(config, n_layers=k))[1]) for k in (1, 2))
    count = one + (config.n_layers - 1) * (two - one)
    self.assertAlmostEqual(count / 1e6 / _PUBLISHED_M[name], 1.0, delta=0.005)

  def test_tiny_preset_is_small(self):
    config = presets.get_model_config("tiny")
    _, abstract = transformer.abstract_model(config)
    self.assertBetween(transformer.param_count(abstract), 500_000, 3_000_000)
    self.assertEqual(config.max_seq_len, 512)

  def test_unknown_preset(self):
    with self.assertRaisesRegex(ValueError, "unknown model preset name 'gpt5'"):
      presets.get_model_config("gpt5")

  def test_overrides(self):
    config = presets.get_model_config("tiny", vocab_size=300)
    self.assertEqual(config.vocab_size, 300)
    with self.assertRaisesRegex(ValueError, "overrides"):
      presets.get_model_config("tiny", width=3)

  @parameterized.parameters(
      dict(field="n_kv_heads", value=3, match="multiple of n_kv_heads"),
      dict(field="head_dim", value=7, match="head_dim must be even"),
      dict(field="d_model", value=0, match="d_model must be a positive int"),
      dict(field="dtype", value=jnp.int32, match="dtype must be a float"),
  )
  def test_invalid_config(self, field, value, match):
    with self.assertRaisesRegex(ValueError, match):
      dataclasses.replace(presets.get_model_config("tiny"), **{field: value})


class ParamsTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(_SMALL))
  def test_logical_axis_names(self, name):
    config = _SMALL[name]
    _, params = transformer.init_model(config, 0)
    flat = nnx.to_flat_state(params)
    self.assertNotEmpty(flat)
    for path, var in flat:
      axes = var.get_metadata()["out_sharding"]
      self.assertLen(axes, var[...].ndim, path)
      self.assertContainsSubset(set(axes), _AXES, path)
    # Logical names map to mesh axes through rules; without rules they pass through.
    rules = [("vocab", "tensor"), ("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"),
             ("kv_heads", "tensor"), ("head_dim", None)]
    with nnx.logical_axis_rules(rules):
      specs = nnx.get_partition_spec(params)
    self.assertEqual(tuple(specs["embed"].get_value()), ("tensor", "fsdp"))
    self.assertEqual(tuple(nnx.get_partition_spec(params)["embed"].get_value()),
                     ("vocab", "embed"))
    has_head = "lm_head" in params
    self.assertEqual(has_head, not config.tie_embeddings)
    self.assertEqual("q_bias" in params["layers"][0]["attn"], config.qkv_bias)
    self.assertEqual("q_norm" in params["layers"][0]["attn"], config.qk_norm)
    if config.qk_norm:
      scale = params["layers"][0]["attn"]["k_norm"]["scale"]
      self.assertEqual(scale.get_metadata()["out_sharding"], ("head_dim",))
      self.assertEqual(scale[...].shape, (config.head_dim,))

  def test_init_is_deterministic_in_rng(self):
    config = _SMALL["tied_gqa"]
    _, a = transformer.init_model(config, 3)
    _, b = transformer.init_model(config, jax.random.key(3))
    _, c = transformer.init_model(config, 4)
    chex.assert_trees_all_equal(a, b)
    self.assertFalse(np.allclose(a["embed"][...], c["embed"][...]))

  def test_param_dtype(self):
    config = dataclasses.replace(_SMALL["tied_gqa"], param_dtype=jnp.bfloat16,
                                 dtype=jnp.bfloat16)
    graphdef, params = transformer.init_model(config, 0)
    for leaf in jax.tree.leaves(params):
      self.assertEqual(leaf.dtype, jnp.bfloat16)
    logits, _ = _apply(graphdef, params, jnp.zeros((1, 4), jnp.int32), _positions(1, 4))
    self.assertEqual(logits.dtype, jnp.float32)
    self.assertTrue(np.all(np.isfinite(logits)))


class ApplyTest(parameterized.TestCase):

  def test_causal_and_padding(self):
    config, graphdef, params = _model("tied_gqa")
    seq = np.random.RandomState(5).randint(0, config.vocab_size, (14,)).astype(np.int32)
    junk = np.full((14,), 7, np.int32)
    # Row 0: the sequence; row 1: its first 11 tokens left-padded by 3 (masked);
    # row 2: its first 9 tokens, then junk that is not masked (right side).
    tokens = np.stack([seq, np.concatenate([junk[:3], seq[:11]]),
                       np.concatenate([seq[:9], junk[9:]])])
    positions = np.stack([np.arange(14), np.maximum(np.arange(14) - 3, 0),
                          np.arange(14)]).astype(np.int32)
    mask = np.stack([np.ones(14, bool), np.arange(14) >= 3, np.ones(14, bool)])
    logits, _ = _apply(graphdef, params, tokens, positions, segment_mask=mask)
    logits = np.asarray(logits)
    self.assertTrue(np.all(np.isfinite(logits)))
    np.testing.assert_allclose(logits[1, 3:], logits[0, :11], atol=1e-5)
    np.testing.assert_allclose(logits[2, :9], logits[0, :9], atol=1e-5)
    # The junk after position 9 changes later logits (the test can fail).
    self.assertGreater(float(np.abs(logits[2, 9:] - logits[0, 9:]).max()), 1e-3)

  @parameterized.parameters("untied_bias_mha", "llama3_rope_mqa", "qk_norm_odd_heads")
  def test_kv_cache_decode_matches_full_forward_at_every_step(self, name):
    config, graphdef, params = _model(name)
    n, prompt, total = 3, 6, 14
    tokens = np.random.RandomState(7).randint(0, config.vocab_size, (n, total)).astype(np.int32)
    lengths = np.array([6, 2, 4])  # ragged prompts, right-padded to 6
    # Each row's real sequence (its prompt, then the decoded tokens),
    # right-padded, in one full forward pass.
    tokens = np.asarray(tokens)
    full_tokens = np.zeros((n, total), np.int32)
    for i in range(n):
      seq = np.concatenate([tokens[i, :lengths[i]], tokens[i, prompt:]])
      full_tokens[i, :seq.shape[0]] = seq
    full, _ = _apply(graphdef, params, full_tokens, _positions(n, total))
    full = np.asarray(full)
    full_rows = [full[i, lengths[i] - 1:lengths[i] + total - prompt] for i in range(n)]
    cache = transformer.init_cache(config, n, total)
    mask = np.arange(prompt)[None] < lengths[:, None]
    logits, cache = _apply(graphdef, params, tokens[:, :prompt], _positions(n, prompt),
                           cache, mask)
    steps = [np.asarray(logits)[np.arange(n), lengths - 1]]
    for t in range(prompt, total):
      pos = (lengths + t - prompt)[:, None].astype(np.int32)
      logits, cache = _apply(graphdef, params, tokens[:, t:t + 1], pos, cache)
      steps.append(np.asarray(logits)[:, 0])
    decoded = np.stack(steps, axis=1)
    for i in range(n):
      np.testing.assert_allclose(decoded[i], full_rows[i], atol=2e-5, rtol=1e-5)
    self.assertEqual(int(cache.index), total)

  @parameterized.parameters("tied_gqa", "untied_bias_mha", "qk_norm_odd_heads")
  def test_logits_at_selects_one_token_per_row(self, name):
    config, graphdef, params = _model(name)
    n, t = 3, 9
    tokens = np.random.RandomState(8).randint(0, config.vocab_size, (n, t)).astype(np.int32)
    mask = np.arange(t)[None] < np.array([9, 4, 6])[:, None]
    at = np.array([8, 3, 5], np.int32)
    full, full_cache = _apply(graphdef, params, tokens, _positions(n, t),
                              transformer.init_cache(config, n, t + 2), mask)
    some, some_cache = _apply(graphdef, params, tokens, _positions(n, t),
                              transformer.init_cache(config, n, t + 2), mask, at)
    chex.assert_shape(some, (n, 1, config.vocab_size))
    np.testing.assert_allclose(np.asarray(some)[:, 0], np.asarray(full)[np.arange(n), at],
                               atol=1e-5, rtol=1e-5)
    # The cache is the same as without the selection: every slot's keys and values.
    chex.assert_trees_all_equal(some_cache, full_cache)

  def test_shape_errors(self):
    config, graphdef, params = _model("tied_gqa")
    with self.assertRaisesRegex(ValueError, "logits_at must be"):
      transformer.apply(graphdef, params, jnp.zeros((2, 4), jnp.int32), _positions(2, 4),
                        logits_at=jnp.zeros((3,), jnp.int32))
    with self.assertRaisesRegex(ValueError, "tokens must be"):
      transformer.apply(graphdef, params, jnp.zeros((4,), jnp.int32), jnp.zeros((4,)))
    with self.assertRaisesRegex(ValueError, "positions shape"):
      transformer.apply(graphdef, params, jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 3)))
    with self.assertRaisesRegex(ValueError, "segment_mask shape"):
      transformer.apply(graphdef, params, jnp.zeros((2, 4), jnp.int32), _positions(2, 4),
                        segment_mask=jnp.ones((2, 5), bool))
    with self.assertRaisesRegex(ValueError, "cache batch"):
      transformer.apply(graphdef, params, jnp.zeros((2, 4), jnp.int32), _positions(2, 4),
                        transformer.init_cache(config, 3, 8))


class SequenceLogprobsTest(parameterized.TestCase):

  def test_alignment(self):
    transform = core_types.SamplingTransform(temperature=0.6, top_k=5, top_p=0.9)
    config, graphdef, params = _model("untied_bias_mha")
    tokens = np.random.RandomState(8).randint(0, config.vocab_size, (2, 7)).astype(np.int32)
    mask = jnp.array([[True] * 7, [True] * 5 + [False] * 2])
    lp = _sequence_logprobs(graphdef, params, tokens, _positions(2, 7), mask,
                            transform)
    chex.assert_shape(lp, (2, 7))
    logits, _ = _apply(graphdef, params, tokens, _positions(2, 7), segment_mask=mask)
    x = logprobs_lib.transform_logits(logits[:, :-1], transform)
    expected = np.take_along_axis(np.asarray(jax.nn.log_softmax(x)),
                                  np.asarray(tokens)[:, 1:, None], axis=-1)[..., 0]
    expected = np.concatenate([np.zeros((2, 1)), expected], axis=1)
    expected = np.where(mask, expected, 0.0)
    np.testing.assert_allclose(lp, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(lp)[:, 0], 0.0)
    np.testing.assert_array_equal(np.asarray(lp)[1, 5:], 0.0)

if __name__ == "__main__":
  absltest.main()
