"""Ready items and learner batches: one row per segment or per packed episode, bucketed rows.

Packing. When every segment of an episode is a prefix of the last one (the agent loop's contexts
are built that way), the episode's corrections fit in one row with per-token advantages: the
same per-token loss terms as one row per segment, at a fraction of the compute. The replay packs
only when the caller says the loss is additive over a row's segments
(`core.losses.segments_additive`): with GSPO's sequence-level ratio, or a per-row token mean, a
packed row's loss is not the sum of its segments' losses.

Taking. `take` pops the oldest ready items that fit one length bucket into a fixed-shape
`core.types.UpdateBatch`, judging staleness with one jitted `core.correction.staleness_weights`
call for the whole batch (`core.batched.staleness_table`). The clipped surrogate is positively
homogeneous in the advantage, so a staleness weight `w >= 0` is folded into the per-token
advantage exactly. The batch's row count is the caller's: `row_buckets` are the counts an
update uses (a flush before a sample phase carries few rows; it is not padded to a full
update).

Shared-prefix packing (`PrefixPacking`, tree attention: `core.packing`). The items of a group
repeat its task prompt (and a correction row its whole episode's context up to the first loss
token). With packing, `take` pops the same items and lays them out differently: items whose
rows share a prefix go into one row `[prefix | suffix_1 | suffix_2 | ...]`, each suffix
attending to the prefix and itself at the positions of its own row, so each token's log-prob is
its unpacked row's. The prefix ends before every packed item's first loss token, so no loss
token is shared, and the per-token loss terms (advantages, behaviour log-probs, masks,
staleness weights, per segment through the `token_segment` owners) are carried over token by
token. Only for a loss additive over a row's tokens (`core.losses.segments_additive`): the
caller decides, as for corrections. Items are found by their tokens, not their group: sorted
by token row, runs of neighbours that share a prefix are packed into the fewest trees that fit
a row (`plan_packs`), and the trees into the fewest rows, several side by side (`place_trees`,
`core.packing`: a tree attends only within itself), of the one packed row length of the items'
length bucket (`PrefixPacking.lengths`: a batch's shape is a row bucket times that length, so
packing compiles no more update steps than one row per item). Which items an update takes, and
therefore every update's loss, is unchanged.
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np

from agentic_grpo.core import batched
from agentic_grpo.core import types as core_types
from agentic_grpo.replay import records


def chains(segments: Sequence[records.Segment], seg_ids: Sequence[int]) -> bool:
  """True when each used segment's row is a prefix of the last used segment's row and no later
  segment claims an earlier one's loss tokens (so they pack into the last row)."""
  last = segments[seg_ids[-1]].tokens
  for k in seg_ids[:-1]:
    t = segments[k].tokens
    if t.shape[0] > last.shape[0] or not np.array_equal(t, last[:t.shape[0]]):
      return False
    for j in seg_ids:
      if j > k and np.any(segments[j].loss_mask[:t.shape[0]] & segments[k].loss_mask):
        return False
  return True


def segment_item(kind: str, episode: int, stage: int, s: records.Segment,
                 adv: float) -> records.Item:
  """One segment as a ready row with advantage `adv`."""
  return records.Item(kind, s.tokens, s.loss_mask, s.behaviour_logprobs,
                      np.where(s.loss_mask, 0, -1).astype(np.int32),
                      np.array([episode]), np.array([stage]), np.array([s.version]),
                      np.array([adv], np.float32))


def packed_item(kind: str, episode: int, segments: Sequence[records.Segment],
                seg_ids: Sequence[int], seg_adv: Sequence[float]) -> records.Item:
  """Segments `seg_ids` of one episode (they must `chains`) as one row, in the last one's."""
  last = segments[seg_ids[-1]]
  n = last.tokens.shape[0]
  mask = np.zeros(n, bool)
  blp = np.zeros(n, np.float32)
  owner = np.full(n, -1, np.int32)
  for j, k in enumerate(seg_ids):
    s = segments[k]
    span = s.tokens.shape[0]
    mask[:span] |= s.loss_mask
    blp[:span] = np.where(s.loss_mask, s.behaviour_logprobs, blp[:span])
    owner[:span] = np.where(s.loss_mask, j, owner[:span])
  return records.Item(kind, last.tokens, mask, blp, owner,
                      np.full(len(seg_ids), episode), np.array(seg_ids),
                      np.array([segments[k].version for k in seg_ids]),
                      np.array(seg_adv, np.float32))


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  """The smallest of `buckets` that holds `length` tokens.

  Raises:
    ValueError: when `length` exceeds every bucket.
  """
  fits = [b for b in sorted(buckets) if b >= length]
  if not fits:
    raise ValueError(f"a ready item has {length} tokens, more than the largest "
                     f"bucket {max(buckets)}")
  return fits[0]


def row_buckets(max_rows: int, granule: int = 1) -> tuple[int, ...]:
  """The row counts an update batch may have: `granule · 2^k` below `max_rows`, and `max_rows`.

  A flush before a sample phase carries a few rows; padding them to the next of these instead
  of `max_rows` leaves less than half the rows padding, and the update step compiles once per
  row count used (at most `log2(max_rows / granule) + 2` of them per length bucket).

  Args:
    max_rows: rows of a full update (>= 1).
    granule: every row count is a multiple of it (e.g. so that micro-batches divide it), >= 1.

  Raises:
    ValueError: a count below 1, or `max_rows` not a multiple of `granule`.
  """
  if max_rows < 1 or granule < 1 or max_rows % granule:
    raise ValueError(f"max_rows ({max_rows}) must be a positive multiple of granule "
                     f"({granule})")
  sizes, n = [], granule
  while n < max_rows:
    sizes.append(n)
    n *= 2
  return tuple(sizes) + (max_rows,)


def row_bucket(rows: int, max_rows: int, granule: int = 1) -> int:
  """The smallest of `row_buckets(max_rows, granule)` that holds `rows` (`1 <= rows <=
  max_rows`).

  Raises:
    ValueError: `rows` outside `[1, max_rows]`, or bad `max_rows` / `granule` (`row_buckets`).
  """
  if not 1 <= rows <= max_rows:
    raise ValueError(f"rows must be in [1, {max_rows}], got {rows}")
  return next(n for n in row_buckets(max_rows, granule) if n >= rows)


@dataclasses.dataclass(frozen=True)
class PrefixPacking:
  """Shared-prefix packing of a batch's items (module docstring).

  Attributes:
    lengths: `{length bucket: packed row length}`, each packed length at least its bucket (a
      mapping, or pairs): a batch of the items of one length bucket is packed into rows of
      exactly its packed length, so that the packed batches have no more shapes than the
      unpacked ones (one row length per length bucket, the row counts of `row_buckets`).
    row_granule: the packed batch's row count is a multiple of it (`row_buckets`).
  """
  lengths: Any
  row_granule: int = 1

  def __post_init__(self):
    pairs = tuple(sorted((int(b), int(n)) for b, n in dict(self.lengths).items()))
    if not pairs or any(n < b or b < 1 for b, n in pairs):
      raise ValueError(f"PrefixPacking.lengths must map each length bucket to a packed row "
                       f"length at least as long, got {self.lengths}")
    if self.row_granule < 1:
      raise ValueError(f"PrefixPacking.row_granule must be >= 1, got {self.row_granule}")
    object.__setattr__(self, "lengths", pairs)

  def length_for(self, bucket: int) -> int:
    """The packed row length of a batch of items of length bucket `bucket`.

    Raises:
      ValueError: `bucket` has no packed length.
    """
    for b, n in self.lengths:
      if b == bucket:
        return n
    raise ValueError(f"length bucket {bucket} has no packed row length (PrefixPacking.lengths "
                     f"{dict(self.lengths)})")


def take(ready: collections.deque, max_rows: int, current_version: int,
         buckets: Sequence[int], *, max_staleness: int, staleness_mode: str,
         on_taken: Callable[[records.Item, float], None],
         packing: Optional[PrefixPacking] = None) -> tuple[Optional[records.Batch],
                                                            collections.Counter]:
  """Pops up to `max_rows` items of `ready` into a `Batch` (see `StagedReplay.take`).

  `on_taken(item, w)` is called for every popped provisional item with its staleness weight.
  `packing`: lay the items out with shared-prefix packing (module docstring); the same items
  are popped either way.

  Returns:
    `(batch or None, stats)`: None when no popped item kept a loss token.
  """
  stats = collections.Counter()
  if not ready:
    return None, stats
  bucket = bucket_for(ready[0].length, buckets)
  table = batched.staleness_table(
      [v for item in ready if item.length <= bucket for v in item.seg_version], current_version,
      max_staleness=max_staleness, mode=staleness_mode)
  chosen: list[tuple[records.Item, np.ndarray]] = []
  i = 0
  while i < len(ready) and len(chosen) < max_rows:
    item = ready[i]
    if item.length > bucket:
      i += 1
      continue
    del ready[i]
    w = np.array([table[int(v)] for v in item.seg_version], np.float32)
    stats["stale_dropped_segments"] += int(np.sum(w == 0.0))
    stats["stale_downweighted_segments"] += int(np.sum((w > 0.0) & (w < 1.0)))
    stats["staleness_sum"] += float(np.sum(current_version - item.seg_version))
    stats["segments"] += item.num_segments
    if item.kind == "provisional":
      on_taken(item, float(w[0]))
    if np.all(w == 0.0):
      continue
    chosen.append((item, w))
  if not chosen:
    return None, stats
  if packing is not None:
    return _assemble_packed(chosen, int(max_rows), packing.length_for(int(bucket)),
                            packing.row_granule, stats), stats
  return _assemble(chosen, int(max_rows), int(bucket), stats), stats


def _assemble(chosen: list[tuple[records.Item, np.ndarray]], n: int, t: int,
              stats: collections.Counter) -> records.Batch:
  """The `[n, t]` batch of the chosen items and their per-segment weights."""
  update = core_types.UpdateBatch.padding(n, t)
  tokens, mask, blp, adv, weights = update[:5]
  kinds, segments = [], []
  for r, (item, w) in enumerate(chosen):
    length = item.length
    owner = item.token_segment
    seg_w = np.where(owner >= 0, w[np.maximum(owner, 0)], 0.0)
    seg_a = np.where(owner >= 0, item.seg_advantage[np.maximum(owner, 0)], 0.0)
    tokens[r, :length] = item.tokens
    mask[r, :length] = item.loss_mask & (seg_w > 0.0)
    blp[r, :length] = np.where(mask[r, :length], item.behaviour_logprobs, 0.0)
    adv[r, :length] = np.where(mask[r, :length], seg_a * seg_w, 0.0)
    weights[r] = 1.0
    kinds.append(item.kind)
    segments.extend((int(e), int(k), float(a * wk)) for e, k, a, wk in
                    zip(item.seg_episode, item.seg_stage, item.seg_advantage, w))
    stats[f"rows_{item.kind}"] += 1
  stats["rows"] = len(chosen)
  stats["row_slots"] = n
  stats["token_slots"] = n * t
  stats["loss_tokens"] = int(mask.sum())
  stats["padding_fraction"] = 1.0 - float(mask.sum()) / float(n * t)
  return records.Batch(update, kinds, segments, dict(stats))


# ------------------------------------------------------------------ shared-prefix packing


def _weighted(item: records.Item, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`(loss_mask, behaviour_logprobs, advantages)` `[L]` of `item` with its per-segment
  staleness weights `w` applied (dropped segments masked out), as `_assemble` writes a row."""
  owner = item.token_segment
  seg_w = np.where(owner >= 0, w[np.maximum(owner, 0)], 0.0)
  seg_a = np.where(owner >= 0, item.seg_advantage[np.maximum(owner, 0)], 0.0)
  mask = item.loss_mask & (seg_w > 0.0)
  blp = np.where(mask, item.behaviour_logprobs, 0.0).astype(np.float32)
  adv = np.where(mask, seg_a * seg_w, 0.0).astype(np.float32)
  return mask, blp, adv


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  """Length of the longest common prefix of two token rows."""
  n = min(a.shape[0], b.shape[0])
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


def packed_length(lengths: Sequence[int], prefix: int) -> int:
  """Tokens of a packed row of items of `lengths` sharing `prefix` (one item: its length)."""
  if len(lengths) == 1:
    return int(lengths[0])
  return int(prefix + sum(n - prefix for n in lengths))


def plan_packs(tokens: Sequence[np.ndarray], first_loss: Sequence[int],
               max_length: int) -> list[tuple[list[int], int]]:
  """Groups items into the fewest packed rows of at most `max_length` tokens.

  Items are sorted by token row (rows that share a prefix become neighbours; ties keep their
  order) and the sorted list is cut into runs, each one packed row: a run's prefix is its common
  prefix, cut to end before every member's first loss token (`first_loss`, the index of an
  item's first loss token), and at least one token. Of all such cuts, one with the fewest rows
  (dynamic programming over the cut points; an item longer than `max_length` gets a row of its
  own).

  Returns:
    `[(members, prefix)]`: item indices in row order, and the shared prefix (a single item's
    `prefix` is its length: the whole row is branch 0), rows ordered by their oldest member.
  """
  n = len(tokens)
  order = sorted(range(n), key=lambda i: (tokens[i].tolist(), i))
  lengths = [int(tokens[i].shape[0]) for i in order]
  firsts = [int(first_loss[i]) for i in order]
  shared = [common_prefix(tokens[order[j - 1]], tokens[order[j]]) for j in range(1, n)]
  rows = [0] + [n + 1] * n  # rows[j]: fewest rows holding the first j sorted items
  start = [0] * (n + 1)  # where the last run of the best cut of the first j items starts
  prefix_of = [0] * (n + 1)
  for i in range(n):
    total, prefix = 0, 0
    for j in range(i, n):
      total += lengths[j]
      if j == i:
        prefix, length = firsts[j], lengths[j]
      else:
        prefix = min(prefix, shared[j - 1], firsts[j])
        length = total - (j - i) * prefix
        if prefix < 1 or length > max_length:  # only grows with j
          break
      if rows[i] + 1 < rows[j + 1]:
        rows[j + 1], start[j + 1] = rows[i] + 1, i
        prefix_of[j + 1] = prefix if j > i else lengths[j]
  packs = []
  j = n
  while j > 0:
    i = start[j]
    packs.append(([order[k] for k in range(i, j)], prefix_of[j]))
    j = i
  return sorted(packs, key=lambda pack: min(pack[0]))


def _packed_rows(rows: int, max_rows: int, granule: int) -> int:
  """The row bucket of `rows` packed rows (`row_bucket`), or `max_rows` when `granule` does
  not divide it."""
  if max_rows % granule:
    return max_rows
  return row_bucket(rows, max_rows, granule)


def place_trees(lengths: Sequence[int], row_length: int) -> list[list[tuple[int, int]]]:
  """Bins trees of `lengths` tokens (each at most `row_length`) into the fewest rows it finds:
  first fit, longest first (ties in input order).

  Returns:
    One list per row of `(tree index, slot offset)`, in slot order; rows in order of their
    first placement.

  Raises:
    ValueError: a tree longer than `row_length`.
  """
  if any(n > row_length for n in lengths):
    raise ValueError(f"a tree of {max(lengths)} tokens does not fit a row of {row_length}")
  rows: list[list[tuple[int, int]]] = []
  used: list[int] = []
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    r = next((r for r, u in enumerate(used) if u + lengths[i] <= row_length), len(rows))
    if r == len(rows):
      rows.append([])
      used.append(0)
    rows[r].append((i, used[r]))
    used[r] += lengths[i]
  return rows


def _assemble_packed(chosen: list[tuple[records.Item, np.ndarray]], n_max: int, t: int,
                     granule: int, stats: collections.Counter) -> records.Batch:
  """The packed batch of the chosen items (module docstring): trees of items that share a
  prefix (`plan_packs`), several to a row of `t` tokens (`place_trees`), at most `n_max` rows
  (fewer as trees share rows), a multiple of `granule` where it can be."""
  items = [item for item, _ in chosen]
  weighted = [_weighted(item, w) for item, w in chosen]
  first_loss = [int(np.argmax(m)) if m.any() else m.shape[0] for m, _, _ in weighted]
  packs = plan_packs([item.tokens for item in items], first_loss, t)
  tree_lengths = [packed_length([items[k].length for k in members], prefix)
                  for members, prefix in packs]
  placed = place_trees(tree_lengths, t)
  n = _packed_rows(len(placed), n_max, granule)
  update = core_types.UpdateBatch.padding(n, t, packed=True)
  kinds, segments = [], []
  shared = 0
  for r, row in enumerate(placed):
    for tree, start in row:
      members, prefix = packs[tree]
      offset = start + prefix
      for b, k in enumerate(members):
        item, (mask, blp, adv) = items[k], weighted[k]
        length = item.length
        if len(members) == 1:
          slots = start + np.arange(length)
        else:
          slots = np.concatenate([start + np.arange(prefix),
                                  offset + np.arange(length - prefix)])
          update.branches[r, offset:offset + length - prefix] = b + 1
          offset += length - prefix
        update.tokens[r, slots] = item.tokens
        update.positions[r, slots] = np.arange(length, dtype=np.int32)
        update.loss_mask[r, slots] |= mask
        update.behaviour_logprobs[r, slots] = np.where(
            mask, blp, update.behaviour_logprobs[r, slots])
        update.advantages[r, slots] = np.where(mask, adv, update.advantages[r, slots])
        kinds.append(item.kind)
        segments.extend((int(e), int(s), float(a * wk)) for e, s, a, wk in
                        zip(item.seg_episode, item.seg_stage, item.seg_advantage, chosen[k][1]))
        stats[f"rows_{item.kind}"] += 1
      if len(members) > 1:
        shared += (len(members) - 1) * prefix
        stats["packed_items"] += len(members)
    # Slots after the row's last tree keep the padding layout's positions (slot index, never 0
    # there, so no tree starts in them): branch 0 of the last tree, outside the loss.
    update.sample_weights[r] = 1.0
  mask = update.loss_mask
  stats["items"] = len(items)
  stats["rows"] = len(placed)
  stats["trees"] = len(packs)
  stats["row_slots"] = n
  stats["token_slots"] = n * t
  stats["item_tokens"] = int(sum(item.length for item in items))
  stats["shared_prefix_tokens"] = int(shared)
  stats["loss_tokens"] = int(mask.sum())
  stats["padding_fraction"] = 1.0 - float(mask.sum()) / float(n * t)
  return records.Batch(update, kinds, segments, dict(stats))
