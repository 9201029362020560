"""Host side of an update that scores its loss tokens only (`UpdateBatch.loss_slots`).

An update's loss reads one log-prob per loss token, but a forward computes the last block and
the output head at every slot. In the RL phase most slots are context: a stage's provisional
row recomputes the conversation so far under the current policy to score the stage's few
generated tokens (the long-horizon task's packed rows: about 24 loss tokens in 512 slots). With
`loss_slots` the learner's forward computes every block's keys and values as before but the last
block's queries, attention output and MLP, and the logits, at the slots that score a loss token
only (`models.transformer.apply`'s `query_slots`): the same loss and gradient up to float
rounding.

`slot_width` picks, for a batch (or a chunk of `learner.make_chunked_update`), the smallest of
a few widths `L` (fractions of the row length, `rl.loss_slot_fractions`) that holds its row
with the most loss tokens, so that each row length compiles a few gradient programs, not one
per count; `with_loss_slots` lays the batch's loss-token slots out at that width.
"""

from typing import Sequence

import numpy as np

from agentic_grpo.core import types as core_types

_GRANULE = 8  # widths rounded up to a multiple of this many slots


def slot_widths(length: int, fractions: Sequence[float]) -> tuple[int, ...]:
  """The widths `L` an update of rows of `length` slots may score at, increasing: each of
  `fractions` of `length` rounded up to a multiple of 8, those below `length` only.

  Raises:
    ValueError: `length` < 1 or a fraction outside (0, 1].
  """
  if length < 1:
    raise ValueError(f"length must be >= 1, got {length}")
  bad = [f for f in fractions if not 0.0 < float(f) <= 1.0]
  if bad:
    raise ValueError(f"loss slot fractions must be in (0, 1], got {tuple(fractions)}")
  widths = {-(-int(np.ceil(float(f) * length)) // _GRANULE) * _GRANULE for f in fractions}
  return tuple(sorted(w for w in widths if w < length))


def slot_width(loss_mask: np.ndarray, fractions: Sequence[float]) -> int:
  """The smallest of `slot_widths(T, fractions)` that holds every row's loss tokens of
  `loss_mask [N, T]` (bool), or 0: none does (or there are no fractions), every slot is
  scored."""
  mask = np.asarray(loss_mask, bool)
  most = int(mask.sum(axis=1).max()) if mask.size else 0
  return next((w for w in slot_widths(mask.shape[1], fractions) if w >= max(most, 1)), 0)


def with_loss_slots(batch: core_types.UpdateBatch, width: int) -> core_types.UpdateBatch:
  """`batch` (NumPy) with `loss_slots [N, width]` int32: each row's loss-token slots in
  increasing order, then 0 (`UpdateBatch.loss_slots`). `width` 0: `batch` unchanged (every
  slot scored).

  Raises:
    ValueError: a row has more than `width` loss tokens, or `width` is past the row length.
  """
  if not width:
    return batch
  mask = np.asarray(batch.loss_mask, bool)
  n, t = mask.shape
  if not 1 <= width <= t:
    raise ValueError(f"width must be in [1, T={t}] (or 0), got {width}")
  counts = mask.sum(axis=1)
  if counts.size and counts.max() > width:
    raise ValueError(f"a row has {int(counts.max())} loss tokens, more than the width {width}")
  slots = np.zeros((n, width), np.int32)
  rows, cols = np.nonzero(mask)  # row-major: each row's slots in increasing order
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  slots[rows, np.arange(rows.size) - starts[rows]] = cols
  return batch._replace(loss_slots=slots)
