"""Shared-prefix packing of learner rows (tree attention): the mask and the scoring slots.

A *packed row* holds several token rows that share a prefix once: `[prefix | suffix_1 | suffix_2
| ...]`. Per token, `branches [N, T] int32` says where it belongs: 0 = the shared prefix, i > 0
= suffix i; `positions [N, T] int32` are its rotary positions in its own (unpacked) row. The
layout's invariants (`replay.batching` builds it, `UpdateBatch.check` checks shapes only):

* the prefix is the row's first `P` slots, at positions `0 .. P - 1`;
* each suffix is contiguous, after the prefix, its positions `P, P + 1, ...`;
* a row without a shared prefix (one item, or padding) is all branch 0 at positions
  `0 .. T - 1`: exactly an unpacked row.

Attention (`tree_mask`): a query attends to keys at or before its slot whose branch is 0 or its
own, so every token sees exactly the tokens of its unpacked row, at the same positions: its
logits equal the unpacked row's up to float reordering. Scoring (`predictor_slots`): a token is
scored from the logits of the slot before it, except the first token of a suffix, which is
scored from the prefix's last slot (position `P - 1`). The prefix must end before the first
loss token of every item it holds (a token scored from inside the prefix is fine; a loss token
inside the prefix would be shared).
"""

import jax
import jax.numpy as jnp


def tree_mask(branches: jax.Array) -> jax.Array:
  """`[N, T, T]` bool: query `q` may attend key `k` (`k <= q`, and `branches[k]` is 0 or
  `branches[q]`)."""
  t = branches.shape[1]
  causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
  bq = branches[:, :, None]
  bk = branches[:, None, :]
  return causal[None] & ((bk == 0) | (bk == bq))


def predictor_slots(positions: jax.Array, branches: jax.Array) -> jax.Array:
  """`[N, T]` int32: the slot whose logits score each token (module docstring): `t - 1`, or
  `positions[t] - 1` (the prefix's last slot) for the first token of a suffix; 0 at slot 0
  (a row's first token is never scored)."""
  t = branches.shape[1]
  slots = jnp.maximum(jnp.arange(t, dtype=jnp.int32) - 1, 0)[None, :]
  before = jnp.concatenate([branches[:, :1], branches[:, :-1]], axis=1)
  first = (branches > 0) & (before != branches)
  return jnp.where(first, positions.astype(jnp.int32) - 1, slots).astype(jnp.int32)


def shifted_logits(logits: jax.Array, positions: jax.Array, branches: jax.Array) -> jax.Array:
  """The logits of a packed forward in the unpacked order: entry `t` holds the logits that
  score token `t + 1` (what `logits[:, t]` is in an unpacked row), so the plain shift
  `logits[:, :-1]` vs `tokens[:, 1:]` scores every token; the last entry is the last slot's.

  One gather over slots (`[N, T, V]`, like the shift's slice); its gradient sums the prefix's
  last slot over the suffixes it scores.
  """
  t = logits.shape[1]
  pred = predictor_slots(positions, branches)
  src = jnp.concatenate([pred[:, 1:], jnp.full_like(pred[:, :1], t - 1)], axis=1)
  return jnp.take_along_axis(logits, src[:, :, None], axis=1)
