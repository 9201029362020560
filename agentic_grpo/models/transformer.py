"""Decoder-only transformer of the Llama / Qwen2 / Qwen3 family in Flax NNX.

Architecture (Touvron et al., 2023, "LLaMA"; Qwen2 technical report, 2024;
Qwen3 technical report, 2025): pre-norm blocks with RMSNorm (Zhang & Sennrich,
2019), rotary position embeddings (Su et al., 2021, "RoFormer") in the
"rotate half" layout used by Hugging Face checkpoints, grouped-query attention
(Ainslie et al., 2023), optional q/k/v biases (Qwen2), optional per-head
RMSNorm of queries and keys before the rotary embedding (Qwen3), a SwiGLU MLP
(Shazeer, 2020) and tied or untied input/output embeddings.

The module is used functionally: `init_model` splits it once into a static
`graphdef` and a `params` state; `apply(graphdef, params, ...)` is a pure
function to call under `jax.jit`. Every parameter carries its logical axis
names (`vocab`, `embed`, `mlp`, `heads`, `kv_heads`, `head_dim`) as the NNX
variable metadata `out_sharding`, so `nnx.get_partition_spec(params)` under
`nnx.logical_axis_rules(...)` yields mesh partition specs; no mesh axis
appears here and nothing needs an active mesh.

Attention masking is by storage order plus validity: a query attends to keys
stored at or before its own slot whose `segment_mask` entry is True. Positions
only drive the rotary embedding, so right-padded rows, ragged prompts in a KV
cache and empty cache slots all use the same rule. A packed learner row
(`branches`, `core.packing`) adds one more: a query sees only its own tree's
shared prefix and its own suffix.
"""

import dataclasses
import math
from typing import Any, NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import logprobs as logprobs_lib
from agentic_grpo.core import packing
from agentic_grpo.core import types as core_types
from agentic_grpo.models import attention

# Queries per attention chunk of the training forward when `ModelConfig.attention_chunk` is 0
# (auto), used once a sequence is longer than twice this: the tiny default (T <= 512) never
# chunks.
AUTO_ATTENTION_CHUNK = 512


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """Llama 3.1+ rotary frequency scaling (`rope_type: llama3` in HF configs).

  Low frequencies (wavelength above `original_max_position /
  low_freq_factor`) are divided by `factor`, high frequencies are kept and the
  band in between is interpolated smoothly.
  """
  factor: float = 32.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer.

  Attributes:
    vocab_size: number of token ids.
    d_model: residual stream width.
    n_layers: number of transformer blocks.
    n_heads: query heads.
    n_kv_heads: key/value heads (grouped-query attention); divides `n_heads`.
    head_dim: width of one attention head.
    mlp_dim: hidden width of the SwiGLU MLP.
    rope_theta: rotary embedding base.
    qkv_bias: whether q/k/v projections have biases (Qwen2).
    qk_norm: RMSNorm of each query and key head over `head_dim` (learned
      `[head_dim]` scales shared by the heads) before the rotary embedding
      (Qwen3).
    tie_embeddings: output projection is the transposed input embedding.
    norm_eps: RMSNorm epsilon.
    max_seq_len: longest position the model is used with.
    dtype: compute dtype of activations (logits are always float32).
    param_dtype: storage dtype of parameters.
    rope_scaling: optional Llama 3 frequency scaling.
    attention_chunk: queries per chunk of the cache-less (training) forward's attention: with
      T queries above it, the float32 `[T, T]` scores are made one chunk of queries at a time
      and recomputed in the backward pass, never for all queries at once. 0 = auto
      (`AUTO_ATTENTION_CHUNK` queries, once T exceeds twice that); to turn it off, set it to
      `max_seq_len` or more.
    causal_block: queries per causal block of the unchunked attention of a cache-less forward
      and of a prefill that fills its whole cache (T = S): with T >= 2 * causal_block
      queries, each block of queries is scored against the keys up to its own last slot only,
      so the all-masked score blocks above the diagonal are never computed (T = 512 in blocks
      of 128: 10 of 16 blocks). The same logits and cache up to float
      rounding; one more matmul pair per block to compile. When the attention is chunked
      (`attention_chunk`), a value below T makes each chunk of queries attend to the keys up
      to its own last slot the same way (the chunks unrolled, each recomputed in the backward
      pass). 0 (or T or more) = off (every query against all T keys).
    attention_backward: how the attention's gradient is computed (`models.attention`):
      "autodiff" (JAX's), or "explicit" (a custom VJP over merged query heads, the softmax's
      backward reduced over the head dimension: about 10% off an update step of `tiny` on
      XLA:CPU). The same forward bit for bit; gradients equal up to float rounding.
  """
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = True
  norm_eps: float = 1e-6
  max_seq_len: int = 2048
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  rope_scaling: Optional[Llama3RopeScaling] = None
  attention_chunk: int = 0
  causal_block: int = 128
  attention_backward: str = "autodiff"

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                 "head_dim", "mlp_dim", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
          f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of "
          f"n_kv_heads ({self.n_kv_heads})")
    for name, zero in (("attention_chunk", "auto"), ("causal_block", "off")):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"ModelConfig.{name} must be an int >= 0 (0 = {zero}), got "
                         f"{value!r}")
    if self.attention_backward not in attention.BACKWARDS:
      raise ValueError(f"ModelConfig.attention_backward must be one of {attention.BACKWARDS}, "
                       f"got {self.attention_backward!r}")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, "
                       f"got {self.head_dim}")
    if not self.rope_theta > 0:
      raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")
    if not self.norm_eps > 0:
      raise ValueError(f"ModelConfig.norm_eps must be > 0, got {self.norm_eps!r}")
    for name in ("dtype", "param_dtype"):
      dt = jnp.dtype(getattr(self, name))
      if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"ModelConfig.{name} must be a float dtype, got {dt}")
      object.__setattr__(self, name, dt)

  @property
  def group_size(self) -> int:
    """Query heads per key/value head."""
    return self.n_heads // self.n_kv_heads

  def query_chunk(self, t: int) -> int:
    """Queries per attention chunk for a cache-less forward of `t` tokens (`t` = no chunks)."""
    if self.attention_chunk:
      return min(self.attention_chunk, t)
    return AUTO_ATTENTION_CHUNK if t > 2 * AUTO_ATTENTION_CHUNK else t


class KVCache(NamedTuple):
  """Key/value cache of all layers.

  Attributes:
    k: per layer `[N, n_kv_heads, S, head_dim]` keys (rotary applied).
    v: per layer `[N, n_kv_heads, S, head_dim]` values.
    valid: `[N, S]` bool, slots holding a real token.
    index: int32, next slot to write: a scalar (the same slot for all rows: the static
      sampler), or `[N]` (each row at its own slot: decode slots of continuous batching,
      `models.continuous`).
  """
  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  valid: jax.Array
  index: jax.Array


def init_cache(config: ModelConfig, batch_size: int, max_len: int) -> KVCache:
  """An empty cache for `batch_size` rows and `max_len` slots (config dtype)."""
  if batch_size <= 0 or max_len <= 0:
    raise ValueError(f"batch_size and max_len must be positive, got {batch_size}, {max_len}")
  shape = (batch_size, config.n_kv_heads, max_len, config.head_dim)
  zeros = tuple(jnp.zeros(shape, config.dtype) for _ in range(config.n_layers))
  zeros_v = tuple(jnp.zeros(shape, config.dtype) for _ in range(config.n_layers))
  return KVCache(k=zeros, v=zeros_v, valid=jnp.zeros((batch_size, max_len), jnp.bool_),
                 index=jnp.zeros((), jnp.int32))


def extend_cache(cache: KVCache, extra: int) -> KVCache:
  """The same cache with `extra` empty slots appended (one copy of the cache).

  Lets a prefill attend over exactly the prompt slots and decoding continue in
  a longer cache.
  """
  if extra < 0:
    raise ValueError(f"extra must be >= 0, got {extra}")
  pad = ((0, 0), (0, 0), (0, extra), (0, 0))
  return KVCache(k=tuple(jnp.pad(x, pad) for x in cache.k),
                 v=tuple(jnp.pad(x, pad) for x in cache.v),
                 valid=jnp.pad(cache.valid, ((0, 0), (0, extra))), index=cache.index)


# ---------------------------------------------------------------- parameters


def _param(rngs, init, shape, axes, dtype) -> nnx.Param:
  """A parameter with logical axis names; no eager sharding (no mesh needed)."""
  return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=axes, eager_sharding=False)


def _normal(stddev):
  """Normal initialiser truncated at two standard deviations.

  Under a trace (`jax.jit`, `nnx.eval_shape`) values come from
  `jax.random.truncated_normal`. Eagerly they come from NumPy seeded with the
  key's bits: as deterministic in the key, but without compiling a random
  number program per parameter shape, which costs seconds on a small CPU.
  """
  def init(key, shape, dtype):
    if isinstance(key, jax.core.Tracer):
      return (stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
              ).astype(dtype)
    gen = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    x = gen.standard_normal(shape, dtype=np.float32)
    bad = np.abs(x) > 2.0
    while bad.any():  # resample outside [-2, 2]: a truncated normal
      x[bad] = gen.standard_normal(int(bad.sum()), dtype=np.float32)
      bad = np.abs(x) > 2.0
    return jnp.asarray(stddev * x, dtype)
  return init


def _ones(key, shape, dtype):
  del key
  return jnp.ones(shape, dtype)


def _zeros(key, shape, dtype):
  del key
  return jnp.zeros(shape, dtype)


def _dense(x, w, dtype, n_in: int = 1):
  """`x [..., *I] · w [*I, *O] -> [..., *O]` (`dtype`, float32 accumulation): the last `n_in`
  axes of `x` contracted with the first `n_in` of `w`, as one 2-D matmul over `x`'s flattened
  leading axes. On XLA's CPU backend the backward pass of the equivalent multi-axis einsum
  copies its activation gradients through transposes; the 2-D form does not (an update step
  of the `tiny` model about 30% faster: `docs/benchmarks.md`, "Dense layers as 2-D matmuls")."""
  lead = x.shape[:x.ndim - n_in]
  k = math.prod(x.shape[x.ndim - n_in:])
  y = jnp.dot(x.reshape(-1, k), w.astype(dtype).reshape(k, -1),
              preferred_element_type=jnp.float32)
  return y.astype(dtype).reshape(*lead, *w.shape[n_in:])


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis computed in float32, scaled by a learned weight.

  The weight is `[D]` (`embed` axis) by default, or `[head_dim]` for the
  per-head query/key norms (`axis="head_dim"`).
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, axis: str = "embed"):
    self.eps = config.norm_eps
    size = config.d_model if axis == "embed" else config.head_dim
    self.scale = _param(rngs, _ones, (size,), (axis,), config.param_dtype)

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (self.scale[...].astype(jnp.float32) * x32.astype(x.dtype).astype(jnp.float32)
            ).astype(x.dtype)


def rope_frequencies(config: ModelConfig) -> np.ndarray:
  """Inverse rotary frequencies `[head_dim // 2]` float32 (with Llama 3 scaling)."""
  dim = config.head_dim
  inv = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  s = config.rope_scaling
  if s is not None:
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    inv = np.where(medium, smoothed, scaled)
  return inv.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotary embedding, rotate-half layout. x `[N, T, H, Dh]`, positions `[N, T]`."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [N, T, Dh/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _write_slots(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """Writes `new [N, K, T, Dh]` into `cache [N, K, S, Dh]` at slot `index` (scalar: every
  row; `[N]`: each row at its own slot)."""
  if index.ndim == 0:
    return jax.lax.dynamic_update_slice(cache, new, (0, 0, index, 0))
  return jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (0, i, 0)))(
      cache, new, index)


class Attention(nnx.Module):
  """Grouped-query self-attention with rotary embeddings, optional q/k/v bias and q/k norm."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    d, h, kv, dh = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
    pd = c.param_dtype
    self.q = _param(rngs, _normal(d ** -0.5), (d, h, dh), ("embed", "heads", "head_dim"), pd)
    self.k = _param(rngs, _normal(d ** -0.5), (d, kv, dh), ("embed", "kv_heads", "head_dim"), pd)
    self.v = _param(rngs, _normal(d ** -0.5), (d, kv, dh), ("embed", "kv_heads", "head_dim"), pd)
    self.o = _param(rngs, _normal((h * dh * 2 * c.n_layers) ** -0.5), (h, dh, d),
                    ("heads", "head_dim", "embed"), pd)
    if c.qkv_bias:
      self.q_bias = _param(rngs, _zeros, (h, dh), ("heads", "head_dim"), pd)
      self.k_bias = _param(rngs, _zeros, (kv, dh), ("kv_heads", "head_dim"), pd)
      self.v_bias = _param(rngs, _zeros, (kv, dh), ("kv_heads", "head_dim"), pd)
    else:
      self.q_bias = self.k_bias = self.v_bias = None
    if c.qk_norm:
      self.q_norm = RMSNorm(c, rngs=rngs, axis="head_dim")
      self.k_norm = RMSNorm(c, rngs=rngs, axis="head_dim")
    else:
      self.q_norm = self.k_norm = None

  def __call__(self, x, positions, mask, layer_cache=None, index=None, queries=None):
    """x `[N, T, D]`; mask `[N, T, S]` bool; layer_cache (k, v) with S slots. `queries`:
    None, or `[N, L]` int32 slots of `x`: keys and values from every slot, queries at those
    slots only (`Transformer`'s `query_slots`); the output is then `[N, L, D]`."""
    c = self.config
    dt = c.dtype
    x_q, q_positions = x, positions
    if queries is not None:
      x_q = jnp.take_along_axis(x, queries[:, :, None], axis=1)
      q_positions = jnp.take_along_axis(positions, queries, axis=1)
      mask = jnp.take_along_axis(mask, queries[:, :, None], axis=1)
    q = _dense(x_q, self.q[...], dt)
    k = _dense(x, self.k[...], dt)
    v = _dense(x, self.v[...], dt)
    if self.q_bias is not None:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    if self.q_norm is not None:  # per head, over head_dim: [N, T, H, Dh]
      q = self.q_norm(q)
      k = self.k_norm(k)
    inv_freq = rope_frequencies(c)
    q = apply_rope(q, q_positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    # Keys and values are kept heads-major, [N, K, S, Dh], so that attention
    # over a long cache needs no transpose of the cache at each decode step.
    k = k.transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    new_cache = None
    if layer_cache is not None:
      ck, cv = layer_cache
      k = _write_slots(ck, k.astype(ck.dtype), index)
      v = _write_slots(cv, v.astype(cv.dtype), index)
      new_cache = (k, v)
    n, t = q.shape[:2]
    kv, g, dh = c.n_kv_heads, c.group_size, c.head_dim
    # [N, K, G, T, Dh]: explicit transposes keep the batched matmuls below in
    # XLA's fast layout (several times faster on CPU than transposing inside).
    q = q.reshape(n, t, kv, g, dh).transpose(0, 2, 3, 1, 4)
    chunk = c.query_chunk(t) if layer_cache is None else t
    bwd = c.attention_backward
    if queries is not None:
      # Queries at chosen slots: no causal order among them, so no causal blocks; chunked over
      # the keys' full width when there are many.
      out = (attention.chunked(q, k, v, mask, chunk, dt, bwd) if chunk < t
             else attention.attend(q, k, v, mask, dt, bwd))
    elif chunk < t and 0 < c.causal_block < t:
      # Chunks of queries, each against the keys up to its last slot (about half the work of
      # whole chunks), each recomputed in the backward pass.
      out = attention.causal_blocks(q, k, v, mask, chunk, dt, remat=True, backward=bwd)
    elif chunk < t:
      out = attention.chunked(q, k, v, mask, chunk, dt, bwd)
    elif ((layer_cache is None or t == k.shape[2])  # no cache, or one filled from slot 0
          and attention.scores_causal_blocks(t, c.causal_block)):
      out = attention.causal_blocks(q, k, v, mask, c.causal_block, dt, backward=bwd)
    else:
      out = attention.attend(q, k, v, mask, dt, bwd)
    # [N, K, G, T, Dh] -> [N, T, H, Dh] (a decode step's T = 1 makes it a reshape).
    out = out.astype(dt).transpose(0, 3, 1, 2, 4).reshape(n, t, c.n_heads, dh)
    return _dense(out, self.o[...], dt, 2), new_cache


class MLP(nnx.Module):
  """SwiGLU MLP: `down(silu(gate(x)) * up(x))`."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, f, pd = config.d_model, config.mlp_dim, config.param_dtype
    self.dtype = config.dtype
    self.gate = _param(rngs, _normal(d ** -0.5), (d, f), ("embed", "mlp"), pd)
    self.up = _param(rngs, _normal(d ** -0.5), (d, f), ("embed", "mlp"), pd)
    self.down = _param(rngs, _normal((f * 2 * config.n_layers) ** -0.5), (f, d),
                       ("mlp", "embed"), pd)

  def __call__(self, x):
    dt = self.dtype
    h = jax.nn.silu(_dense(x, self.gate[...], dt)) * _dense(x, self.up[...], dt)
    return _dense(h, self.down[...], dt)


class Block(nnx.Module):
  """Pre-norm transformer block."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(config, rngs=rngs)
    self.attn = Attention(config, rngs=rngs)
    self.mlp_norm = RMSNorm(config, rngs=rngs)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, x, positions, mask, layer_cache=None, index=None, keep=None):
    """`keep`: None; `[N, L]` int32 slots, the output then `[N, L, D]` at those slots only,
    whose queries alone the attention computes and the MLP runs on; or `[N]`, one slot per
    row (`[N, 1, D]`). The cache still gets every slot's keys and values."""
    if keep is not None:
      keep = keep[:, None] if keep.ndim == 1 else keep
      h, new_cache = self.attn(self.attn_norm(x), positions, mask, layer_cache, index,
                               queries=keep)
      x = jnp.take_along_axis(x, keep[:, :, None], axis=1) + h
      return x + self.mlp(self.mlp_norm(x)), new_cache
    h, new_cache = self.attn(self.attn_norm(x), positions, mask, layer_cache, index)
    x = x + h
    x = x + self.mlp(self.mlp_norm(x))
    return x, new_cache


class Transformer(nnx.Module):
  """Decoder-only language model returning float32 logits."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    c = config
    self.embed = _param(rngs, _normal(0.02), (c.vocab_size, c.d_model), ("vocab", "embed"),
                        c.param_dtype)
    self.layers = nnx.List([Block(c, rngs=rngs) for _ in range(c.n_layers)])
    self.final_norm = RMSNorm(c, rngs=rngs)
    if c.tie_embeddings:
      self.lm_head = None
    else:
      self.lm_head = _param(rngs, _normal(c.d_model ** -0.5), (c.d_model, c.vocab_size),
                            ("embed", "vocab"), c.param_dtype)

  def __call__(self, tokens, positions, cache: Optional[KVCache] = None, segment_mask=None,
               logits_at=None, branches=None, query_slots=None):
    c = self.config
    n, t = tokens.shape
    if segment_mask is None:
      segment_mask = jnp.ones((n, t), jnp.bool_)
    x = jnp.take(self.embed[...], tokens, axis=0).astype(c.dtype)
    if cache is None:
      valid = segment_mask
      q_slots = jnp.arange(t)
      k_slots = jnp.arange(t)
      index = None
    else:
      index = cache.index
      if t == cache.valid.shape[1]:
        # T tokens fill the whole cache: written from slot 0, as the slice update's clamped
        # start is, whatever the index (so the mask is causal in slot order).
        index = jnp.zeros_like(index)
      k_slots = jnp.arange(cache.valid.shape[1])
      if index.ndim == 0:
        valid = jax.lax.dynamic_update_slice(cache.valid, segment_mask, (0, index))
        q_slots = index + jnp.arange(t)
      else:  # one slot per row
        valid = jax.vmap(lambda m, s, i: jax.lax.dynamic_update_slice(m, s, (i,)))(
            cache.valid, segment_mask, index)
        q_slots = index[:, None] + jnp.arange(t)  # [N, T]
    if q_slots.ndim == 1:
      mask = (k_slots[None, :] <= q_slots[:, None])[None] & valid[:, None, :]  # [N, T, S]
    else:
      mask = (k_slots[None, None, :] <= q_slots[:, :, None]) & valid[:, None, :]
    if branches is not None:  # shared-prefix packing (no cache): prefix or own branch only
      mask = mask & packing.tree_mask(branches, positions)
    new_k, new_v = [], []
    for i, block in enumerate(self.layers):
      layer_cache = None if cache is None else (cache.k[i], cache.v[i])
      last = i == len(self.layers) - 1
      keep = (logits_at if query_slots is None else query_slots) if last else None
      x, layer_new = block(x, positions, mask, layer_cache, index, keep)
      if layer_new is not None:
        new_k.append(layer_new[0])
        new_v.append(layer_new[1])
    x = self.final_norm(x)
    if self.lm_head is None:
      head = self.embed[...].astype(c.dtype).T
    else:
      head = self.lm_head[...].astype(c.dtype)
    logits = jnp.dot(x.reshape(-1, c.d_model), head,
                     preferred_element_type=jnp.float32).reshape(*x.shape[:-1], -1)
    new_cache = None
    if cache is not None:
      new_cache = KVCache(k=tuple(new_k), v=tuple(new_v), valid=valid, index=index + t)
    return logits, new_cache


# ---------------------------------------------------------------- functional API


def abstract_model(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """`(graphdef, params)` with `jax.ShapeDtypeStruct` leaves; allocates nothing."""
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  return nnx.split(model)


def init_params(config: ModelConfig, rng: jax.Array) -> nnx.State:
  """Random parameters as an `nnx.State` (pure; may be jitted with shardings)."""
  return nnx.split(Transformer(config, rngs=nnx.Rngs(params=rng)))[1]


def init_model(config: ModelConfig, rng) -> tuple[nnx.GraphDef, nnx.State]:
  """Builds a randomly initialised model and splits it once.

  Args:
    config: the model shape.
    rng: a `jax.random` key or an int seed.

  Returns:
    `(graphdef, params)`: the static module structure and an `nnx.State` of
    `nnx.Param`s (leaves `param_dtype`, each with `out_sharding` metadata of
    logical axis names).

  Raises:
    ValueError: `config` is not a `ModelConfig`.
  """
  if not isinstance(config, ModelConfig):
    raise ValueError(f"config must be a ModelConfig, got {type(config).__name__}")
  if isinstance(rng, int):
    rng = jax.random.key(rng)
  graphdef, _ = abstract_model(config)
  return graphdef, init_params(config, rng)


def param_count(params: nnx.State) -> int:
  """Total number of parameter scalars."""
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def _check_tokens(tokens, positions, segment_mask, branches=None):
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be [N, T], got shape {tuple(tokens.shape)}")
  if tuple(positions.shape) != tuple(tokens.shape):
    raise ValueError(f"positions shape {tuple(positions.shape)} must equal tokens shape "
                     f"{tuple(tokens.shape)}")
  if segment_mask is not None and tuple(segment_mask.shape) != tuple(tokens.shape):
    raise ValueError(f"segment_mask shape {tuple(segment_mask.shape)} must equal tokens "
                     f"shape {tuple(tokens.shape)}")
  if branches is not None and tuple(branches.shape) != tuple(tokens.shape):
    raise ValueError(f"branches shape {tuple(branches.shape)} must equal tokens shape "
                     f"{tuple(tokens.shape)}")


def apply(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens: jax.Array,
    positions: jax.Array,
    cache: Optional[KVCache] = None,
    segment_mask: Optional[jax.Array] = None,
    logits_at: Optional[jax.Array] = None,
    branches: Optional[jax.Array] = None,
    query_slots: Optional[jax.Array] = None,
) -> tuple[jax.Array, Optional[KVCache]]:
  """Forward pass; pure, to be used under `jax.jit`.

  Args:
    graphdef: from `init_model` / `load_hf_checkpoint`.
    params: the matching `nnx.State`.
    tokens: `[N, T]` int32 token ids.
    positions: `[N, T]` int32 rotary positions (0 for a row's first token).
    cache: optional `KVCache`; the T tokens are written at slots
      `cache.index .. cache.index + T - 1` (the caller keeps this within the
      cache's S slots) and attend to every valid earlier slot. A `[N]`
      `cache.index` writes each row at its own slot (continuous batching).
      T = S tokens fill the whole cache from slot 0 whatever the index (a
      prefill), with `ModelConfig.causal_block`'s blocks.
    segment_mask: optional `[N, T]` bool, False on padding; padded tokens are
      never attended to. Defaults to all True.
    logits_at: optional `[N]` int32, one token index in `[0, T)` per row: only
      that token's logits are computed (a prefill needs the last prompt
      token's), and the last block computes its query, attention output and
      MLP at that token alone (as `query_slots` with L = 1). The cache is
      filled as without it.
    branches: optional `[N, T]` int32 of a packed row (shared-prefix packing, no cache;
      `core.packing`): 0 on a tree's shared prefix, i > 0 on its suffix i, a tree starting
      at each slot of branch 0 and position 0; a query then attends only to keys at or before
      its slot, in its tree, whose branch is 0 or its own, with `positions` continuing from
      the prefix in each suffix. None (default): the plain causal mask.
    query_slots: optional `[N, L]` int32 slots in `[0, T)` (repeats allowed): only those
      slots' logits are computed, and the last block computes its queries, attention output
      and MLP at those slots alone (every slot still gives its keys and values, so each
      logit is the full forward's up to float rounding). An update whose loss reads few
      slots of long rows (`learner`'s `loss_slots`) skips most of its last block and of the
      output head. Not with `logits_at`.

  Returns:
    `(logits [N, T, V] float32, new_cache)` (`[N, 1, V]` with `logits_at`, `[N, L, V]` with
    `query_slots`);
    `new_cache` is None without a cache. Logits at padded query slots are
    finite but meaningless.

  Raises:
    ValueError: on rank or shape mismatch of `tokens`, `positions`,
      `segment_mask`, `logits_at`, `branches`, `query_slots` (or both of the last and
      `logits_at`), a cache whose batch differs from
      `tokens` or whose `index` is neither a scalar nor `[N]`, or `branches` with a cache.
  """
  _check_tokens(tokens, positions, segment_mask, branches)
  if branches is not None and cache is not None:
    raise ValueError("branches (a packed row) cannot be used with a KV cache")
  if cache is not None and cache.valid.shape[0] != tokens.shape[0]:
    raise ValueError(f"cache batch {cache.valid.shape[0]} must equal tokens batch "
                     f"{tokens.shape[0]}")
  if cache is not None and jnp.ndim(cache.index) not in (0, 1):
    raise ValueError(f"cache.index must be a scalar or [N], got shape "
                     f"{tuple(jnp.shape(cache.index))}")
  if logits_at is not None and tuple(logits_at.shape) != tokens.shape[:1]:
    raise ValueError(f"logits_at must be [N={tokens.shape[0]}], got shape "
                     f"{tuple(logits_at.shape)}")
  if query_slots is not None and (logits_at is not None or query_slots.ndim != 2
                                  or query_slots.shape[0] != tokens.shape[0]):
    raise ValueError(f"query_slots must be [N={tokens.shape[0]}, L] and not given with "
                     f"logits_at, got shape {tuple(query_slots.shape)}"
                     f"{' and logits_at' if logits_at is not None else ''}")
  model = nnx.merge(graphdef, params)
  return model(tokens.astype(jnp.int32), positions.astype(jnp.int32), cache=cache,
               segment_mask=None if segment_mask is None else segment_mask.astype(jnp.bool_),
               logits_at=None if logits_at is None else logits_at.astype(jnp.int32),
               branches=None if branches is None else branches.astype(jnp.int32),
               query_slots=None if query_slots is None else query_slots.astype(jnp.int32))


def sequence_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens: jax.Array,
    positions: jax.Array,
    segment_mask: Optional[jax.Array],
    transform: core_types.SamplingTransform = core_types.IDENTITY_TRANSFORM,
) -> jax.Array:
  """Per-token log-probs of a token row under the sampling transform.

  Entry `t` is `log p(tokens[:, t] | tokens[:, :t])` computed with
  `core.logprobs.token_logprobs` (the sampler's transform); entry 0 and
  entries where `segment_mask` is False are 0.

  Args:
    graphdef, params: the model.
    tokens: `[N, T]` int32.
    positions: `[N, T]` int32.
    segment_mask: `[N, T]` bool or None (all valid).
    transform: the sampling transform, see `core.logprobs.transform_logits`.

  Returns:
    `[N, T]` float32.

  Raises:
    ValueError: as `apply` and `core.logprobs.token_logprobs`.
  """
  logits, _ = apply(graphdef, params, tokens, positions, segment_mask=segment_mask)
  lp = logprobs_lib.token_logprobs(logits[:, :-1], tokens[:, 1:].astype(jnp.int32),
                                   transform)
  lp = jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)
  if segment_mask is not None:
    lp = jnp.where(segment_mask, lp, 0.0)
  return lp
