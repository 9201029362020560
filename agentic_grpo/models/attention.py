"""Scaled dot-product attention of grouped-query heads, for `models.transformer`.

Queries come heads-major as `[N, K, G, T, Dh]` (K key/value heads, G query heads per key head:
grouped-query attention, Ainslie et al., 2023), keys and values as `[N, K, S, Dh]`, and a
boolean `mask [N, T, S]` says which keys each query sees (the transformer's storage-order rule:
causal slots, valid keys, a packed row's tree). The output is `[N, K, G, T, Dh]` float32.

* `attend`: every query against every key.
* `causal_blocks`: a cache-less forward's (or a prefill's that fills its cache from slot 0), whose
  mask is causal in storage order: blocks of queries, each against the keys up to its own last
  slot, so that the all-masked score blocks above the diagonal are never computed.
* `chunked`: chunks of queries one at a time, each recomputed in the backward pass, so that the
  float32 scores held at once are one chunk's.

`ModelConfig.attention_backward` picks how the gradient of `attend` is computed, the forward
being the same bit for bit: "autodiff" (JAX's), or "explicit", a custom VJP (`_attend_explicit`)
that writes the backward out over the G query heads of a key head merged with the queries
(`[N, K, G·T, Dh]`, a free reshape), so that each of its products contracts one axis: with `P`
the probabilities and `O` the output, `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP −
rowsum(dO ∘ O))` (the row sum over the head dimension instead of the softmax's over the keys,
as in Dao et al., 2022, "FlashAttention", appendix B.2), `dQ = dS K`, `dK = dSᵀ Q`, each times
the score scale. Autodiff's backward contracts the heads and the queries of `dS` together,
which XLA:CPU lays out with copies, and reduces over the keys. The gradients agree up to float
rounding (`attention_test`); the speed is measured in docs/benchmarks.md.
"""

import functools

import jax
import jax.numpy as jnp

# Finite "minus infinity" for masked attention scores: a fully masked query row (padding) gets a
# uniform softmax instead of NaNs, and its output is never read.
MASK_VALUE = -1e30


def scores_causal_blocks(t: int, causal_block: int) -> bool:
  """Whether an unchunked attention over `t` queries that start at slot 0 (a cache-less
  forward, or a prefill that fills its cache) is scored in `causal_block` blocks
  (`ModelConfig.causal_block`: on, and at least two blocks)."""
  return bool(causal_block) and t >= 2 * causal_block


def _scores(q, k, mask, dt):
  """Masked, scaled scores `[N, K, G, T, S]` float32 of `q [N, K, G, T, Dh]`, `k [N, K, S,
  Dh]`, `mask [N, T, S]`."""
  dh = q.shape[-1]
  if q.shape[3] == 1:
    # Decode step: a fused multiply-reduce over Dh (float32 products, exact for bfloat16
    # inputs), as the value product below. XLA:CPU's batched matmul with M = G rows spent
    # about 40% of the `tiny` decode's time here (docs/benchmarks.md, "The decode's scores").
    scores = jnp.sum(q[:, :, :, :, None, :].astype(jnp.float32)
                     * k[:, :, None, None].astype(dt).astype(jnp.float32), axis=-1)
  else:
    scores = jnp.einsum("nkgtd,nksd->nkgts", q, k.astype(dt),
                        preferred_element_type=jnp.float32)
  return jnp.where(mask[:, None, None], scores * (dh ** -0.5), MASK_VALUE)


def _attend(q, k, v, mask, dt):
  """`attend`'s forward, differentiated by autodiff: `(out, probs)`."""
  probs = jax.nn.softmax(_scores(q, k, mask, dt), axis=-1)
  if q.shape[3] == 1:
    # Decode step: a fused multiply-reduce beats a batched matmul with M = G.
    return jnp.sum(probs[..., None] * v[:, :, None, None].astype(jnp.float32), axis=-2), probs
  return jnp.einsum("nkgts,nksd->nkgtd", probs.astype(dt), v.astype(dt),
                    preferred_element_type=jnp.float32), probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attend_explicit(q, k, v, mask, dt):
  """`_attend`'s output, with the backward written out (module docstring)."""
  return _attend(q, k, v, mask, dt)[0]


def _attend_explicit_fwd(q, k, v, mask, dt):
  out, probs = _attend(q, k, v, mask, dt)
  return out, (q, k, v, mask, probs, out)


def _attend_explicit_bwd(dt, residuals, d_out):
  q, k, v, mask, probs, out = residuals
  n, kv, g, t, dh = q.shape
  s = k.shape[2]
  # The G query heads of a key head merged with the queries (free reshapes): each product
  # below contracts one axis.
  probs = probs.reshape(n, kv, g * t, s)
  out = out.reshape(n, kv, g * t, dh)
  d_out = d_out.astype(jnp.float32).reshape(n, kv, g * t, dh)
  d_v = jnp.einsum("nkqs,nkqd->nksd", probs.astype(dt), d_out.astype(dt),
                   preferred_element_type=jnp.float32)
  d_probs = jnp.einsum("nkqd,nksd->nkqs", d_out.astype(dt), v.astype(dt),
                       preferred_element_type=jnp.float32)
  # rowsum(dP ∘ P) = rowsum(dO ∘ O): over Dh instead of S.
  row = jnp.sum(d_out * out, axis=-1, keepdims=True)
  # A query that sees no key (padding) has a uniform softmax of constant scores: no gradient.
  sees = jnp.broadcast_to(jnp.any(mask, axis=-1)[:, None, None, :], (n, 1, g, t))
  scale = jnp.where(sees.reshape(n, 1, g * t, 1), dh ** -0.5, 0.0)
  d_scores = probs * (d_probs - row) * scale
  d_q = jnp.einsum("nkqs,nksd->nkqd", d_scores.astype(dt), k.astype(dt),
                   preferred_element_type=jnp.float32)
  d_k = jnp.einsum("nkqs,nkqd->nksd", d_scores.astype(dt),
                   q.reshape(n, kv, g * t, dh).astype(dt), preferred_element_type=jnp.float32)
  return (d_q.reshape(q.shape).astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype),
          None)


_attend_explicit.defvjp(_attend_explicit_fwd, _attend_explicit_bwd)

BACKWARDS = ("autodiff", "explicit")


def attend(q, k, v, mask, dt, backward="autodiff"):
  """Every query against every key: `q [N, K, G, T, Dh]`, `k, v [N, K, S, Dh]`, `mask [N, T,
  S]` bool -> `[N, K, G, T, Dh]` float32. Products in `dt` with float32 accumulation, the
  softmax in float32. `backward` (`ModelConfig.attention_backward`): "autodiff", or
  "explicit" (module docstring; the same forward, bit for bit)."""
  if backward == "explicit" and q.shape[3] > 1:
    return _attend_explicit(q, k, v, mask, dt)
  return _attend(q, k, v, mask, dt)[0]


def chunked(q, k, v, mask, chunk, dt, backward="autodiff"):
  """`attend` over chunks of `chunk` queries, one at a time (`lax.map`), each recomputed in the
  backward pass (`jax.checkpoint`): the f32 scores held at once are `[N, K, G, chunk, S]`, not
  `[N, K, G, T, S]`. Queries are padded to a multiple of `chunk` (all-masked rows, dropped)."""
  n, kv, g, t, dh = q.shape
  chunks = -(-t // chunk)
  pad = chunks * chunk - t
  if pad:
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
    mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
  qs = q.reshape(n, kv, g, chunks, chunk, dh).transpose(3, 0, 1, 2, 4, 5)
  ms = mask.reshape(n, chunks, chunk, mask.shape[-1]).transpose(1, 0, 2, 3)
  body = jax.checkpoint(lambda xs: attend(xs[0], k, v, xs[1], dt, backward))
  out = jax.lax.map(body, (qs, ms))  # [chunks, N, K, G, chunk, Dh]
  out = out.transpose(1, 2, 3, 0, 4, 5).reshape(n, kv, g, chunks * chunk, dh)
  return out[:, :, :, :t]


def causal_blocks(q, k, v, mask, block, dt, remat=False, backward="autodiff"):
  """`attend` of a cache-less forward (`ModelConfig.causal_block`), whose mask is causal in
  storage order (no query sees a key stored after it): one block of `block` queries at a time,
  each against the keys up to its own last slot, so the all-masked score blocks above the
  diagonal are never computed. The blocks are unrolled (static shapes, T / block of them).
  With `remat` each block is recomputed in the backward pass (`jax.checkpoint`), so that the
  f32 scores held at once are one block's, as `chunked`'s."""
  t = q.shape[3]
  run = functools.partial(attend, backward=backward)
  run = jax.checkpoint(run, static_argnums=(4,)) if remat else run
  outs = []
  for start in range(0, t, block):
    end = min(start + block, t)
    outs.append(run(q[:, :, :, start:end], k[:, :, :end], v[:, :, :end],
                    mask[:, start:end, :end], dt))
  return jnp.concatenate(outs, axis=3)
