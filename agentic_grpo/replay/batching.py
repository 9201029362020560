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
"""

import collections
from typing import Callable, Optional, Sequence

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


def take(ready: collections.deque, max_rows: int, current_version: int,
         buckets: Sequence[int], *, max_staleness: int, staleness_mode: str,
         on_taken: Callable[[records.Item, float], None]) -> tuple[Optional[records.Batch],
                                                                    collections.Counter]:
  """Pops up to `max_rows` items of `ready` into a `Batch` (see `StagedReplay.take`).

  `on_taken(item, w)` is called for every popped provisional item with its staleness weight.

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
  return _assemble(chosen, int(max_rows), int(bucket), stats), stats


def _assemble(chosen: list[tuple[records.Item, np.ndarray]], n: int, t: int,
              stats: collections.Counter) -> records.Batch:
  """The `[n, t]` batch of the chosen items and their per-segment weights."""
  update = core_types.UpdateBatch.padding(n, t)
  tokens, mask, blp, adv, weights = update
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
