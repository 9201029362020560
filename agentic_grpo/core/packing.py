"""Shared-prefix packing of learner rows (tree attention): the mask and the scoring slots.

A *packed row* holds one or more *trees* side by side. A tree is several token rows that share a
prefix, held once: `[prefix | suffix_1 | suffix_2 | ...]`; or a single token row, whole. Per
token, `branches [N, T] int32` says where it belongs in its tree: 0 = the shared prefix (or the
whole of a single row), i > 0 = suffix i; `positions [N, T] int32` are its rotary positions in
its own (unpacked) row. The layout's invariants (`replay.batching` builds it, `UpdateBatch.check`
checks shapes only):

* a tree starts at a slot of branch 0 and position 0 (`tree_starts`), and only there: its
  prefix takes the tree's first `P` slots at positions `0 .. P - 1`;
* each suffix is contiguous, after its tree's prefix, at positions `P, P + 1, ...`;
* a tree of one token row is all branch 0 at positions `0 .. L - 1`: exactly an unpacked row.
  A row holding one such tree and nothing else is an unpacked row (the padding layout).

Attention (`tree_mask`): a query attends to keys at or before its slot, in its own tree, whose
branch is 0 or its own, so every token sees exactly the tokens of its unpacked row, at the same
positions: its logits equal the unpacked row's up to float reordering. Scoring
(`predictor_slots`): a token is scored from the logits of the slot before it, except the first
token of a suffix, which is scored from its tree's prefix's last slot. The prefix must end
before the first loss token of every item it holds (a token scored from inside the prefix is
fine; a loss token inside the prefix would be shared). The first token of a tree is never a
loss token (it is scored from the slot before, another tree's): rows start with a prompt.

Several trees per row let a batch fill its rows (a group's tree is rarely as long as a row),
so that an update computes real tokens, not padding; without `positions` every row is one tree
(`tree_mask(branches)`, the layout of one tree per row).
"""

import jax
import jax.numpy as jnp


def is_tree_start(positions: jax.Array, branches: jax.Array) -> jax.Array:
  """`[N, T]` bool: the slots where a tree starts (branch 0 at position 0, and slot 0). Such a
  token is never scored: its log-prob is 0, as a row's first token's."""
  slots = jnp.arange(branches.shape[1])[None, :]
  return ((branches == 0) & (positions == 0)) | (slots == 0)


def tree_starts(positions: jax.Array, branches: jax.Array) -> jax.Array:
  """`[N, T]` int32: the slot where each token's tree starts (module docstring: the last slot
  at or before it of branch 0 and position 0; slot 0 starts the row's first tree)."""
  slots = jnp.arange(branches.shape[1], dtype=jnp.int32)[None, :]
  return jax.lax.cummax(jnp.where(is_tree_start(positions, branches), slots, 0), axis=1)


def tree_mask(branches: jax.Array, positions: jax.Array | None = None) -> jax.Array:
  """`[N, T, T]` bool: query `q` may attend key `k` (`k <= q`, both in one tree, and
  `branches[k]` is 0 or `branches[q]`). Without `positions` each row is one tree."""
  t = branches.shape[1]
  causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
  bq = branches[:, :, None]
  bk = branches[:, None, :]
  mask = causal[None] & ((bk == 0) | (bk == bq))
  if positions is not None:
    tree = tree_starts(positions, branches)
    mask = mask & (tree[:, :, None] == tree[:, None, :])
  return mask


def predictor_slots(positions: jax.Array, branches: jax.Array) -> jax.Array:
  """`[N, T]` int32: the slot whose logits score each token (module docstring): `t - 1`, or
  `tree start + positions[t] - 1` (its tree's prefix's last slot) for the first token of a
  suffix; 0 at slot 0 (a row's first token is never scored)."""
  t = branches.shape[1]
  slots = jnp.maximum(jnp.arange(t, dtype=jnp.int32) - 1, 0)[None, :]
  before = jnp.concatenate([branches[:, :1], branches[:, :-1]], axis=1)
  first = (branches > 0) & (before != branches)
  prefix_end = tree_starts(positions, branches) + positions.astype(jnp.int32) - 1
  return jnp.where(first, prefix_end, slots).astype(jnp.int32)


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
