"""Named model shapes (`get_model_config`): the byte-level `tiny` default and the shapes of the
published checkpoints the Hugging Face import reads (`config.model.preset`)."""

import dataclasses

import jax.numpy as jnp

from agentic_grpo.models import transformer

_PRESETS = {
    # Byte-level CPU default (~1M params): vocab = ByteTokenizer() default
    # (256 bytes + <pad>, <bos>, <eos> + 10 stage delimiters).
    "tiny": transformer.ModelConfig(
        vocab_size=269, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
        head_dim=32, mlp_dim=512, rope_theta=10_000.0, qkv_bias=False,
        tie_embeddings=True, norm_eps=1e-6, max_seq_len=512),
    # Shapes of the published checkpoints (config.json of each model).
    "qwen2_0_5b": transformer.ModelConfig(
        vocab_size=151_936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
        head_dim=64, mlp_dim=4864, rope_theta=1_000_000.0, qkv_bias=True,
        tie_embeddings=True, norm_eps=1e-6, max_seq_len=32_768,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    "qwen2_1_5b": transformer.ModelConfig(
        vocab_size=151_936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2,
        head_dim=128, mlp_dim=8960, rope_theta=1_000_000.0, qkv_bias=True,
        tie_embeddings=True, norm_eps=1e-6, max_seq_len=32_768,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    "qwen2_7b": transformer.ModelConfig(
        vocab_size=152_064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
        head_dim=128, mlp_dim=18_944, rope_theta=1_000_000.0, qkv_bias=True,
        tie_embeddings=False, norm_eps=1e-6, max_seq_len=32_768,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    "qwen3_0_6b": transformer.ModelConfig(
        vocab_size=151_936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
        head_dim=128, mlp_dim=3072, rope_theta=1_000_000.0, qk_norm=True,
        tie_embeddings=True, norm_eps=1e-6, max_seq_len=40_960,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    "qwen3_8b": transformer.ModelConfig(
        vocab_size=151_936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
        head_dim=128, mlp_dim=12_288, rope_theta=1_000_000.0, qk_norm=True,
        tie_embeddings=False, norm_eps=1e-6, max_seq_len=40_960,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    "llama3_2_1b": transformer.ModelConfig(
        vocab_size=128_256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
        head_dim=64, mlp_dim=8192, rope_theta=500_000.0, qkv_bias=False,
        tie_embeddings=True, norm_eps=1e-5, max_seq_len=131_072,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
        rope_scaling=transformer.Llama3RopeScaling(32.0, 1.0, 4.0, 8192)),
    "llama3_2_3b": transformer.ModelConfig(
        vocab_size=128_256, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8,
        head_dim=128, mlp_dim=8192, rope_theta=500_000.0, qkv_bias=False,
        tie_embeddings=True, norm_eps=1e-5, max_seq_len=131_072,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
        rope_scaling=transformer.Llama3RopeScaling(32.0, 1.0, 4.0, 8192)),
}

PRESETS = tuple(_PRESETS)


def get_model_config(name: str, **overrides) -> transformer.ModelConfig:
  """Returns a preset `ModelConfig`, optionally with fields replaced.

  Args:
    name: one of `PRESETS` (`tiny`, `qwen2_0_5b`, `qwen2_1_5b`, `qwen2_7b`,
      `qwen3_0_6b`, `qwen3_8b`, `llama3_2_1b`, `llama3_2_3b`). Only `tiny` is meant to be initialised
      randomly; the others give the shapes of the published checkpoints.
    **overrides: `ModelConfig` fields to replace (e.g. `vocab_size=`).

  Raises:
    ValueError: unknown `name` or invalid override.
  """
  if name not in _PRESETS:
    raise ValueError(f"unknown model preset name {name!r}; known: {list(_PRESETS)}")
  try:
    return dataclasses.replace(_PRESETS[name], **overrides)
  except TypeError as e:
    raise ValueError(f"invalid overrides {sorted(overrides)} for ModelConfig: {e}") from e
