"""The records staged replay holds and hands out: segments, pending groups and episodes, ready
items, learner batches."""

import dataclasses
from typing import Optional

import numpy as np

from agentic_grpo.core import types as core_types


@dataclasses.dataclass
class Segment:
  """One stage of one episode, as stored.

  Attributes:
    tokens: `[L]` int32 token row (context + generated tokens of the stage).
    loss_mask: `[L]` bool, True on the tokens generated in this stage.
    behaviour_logprobs: `[L]` float32 log π_β of each token (0 off the mask).
    version: policy version (learner step) of the params that sampled the stage.
    reward: stage reward (float).
    valid: False for a stage the episode skipped (no tokens in the loss, no advantage).
    applied: the provisional advantage handed to the learner (0.0 when none was).
  """
  tokens: np.ndarray
  loss_mask: np.ndarray
  behaviour_logprobs: np.ndarray
  version: int
  reward: float
  valid: bool
  applied: float = 0.0


@dataclasses.dataclass
class Item:
  """A ready learner row: one segment, or one episode's packed segments.

  Attributes:
    kind: one of `credit.KINDS`.
    tokens: `[L]` int32.
    loss_mask: `[L]` bool, union of the masks of the row's segments.
    behaviour_logprobs: `[L]` float32.
    token_segment: `[L]` int32, index into the `seg_*` arrays of the segment owning each loss
      token, -1 elsewhere.
    seg_episode, seg_stage, seg_version: `[M]` int64 per segment of the row.
    seg_advantage: `[M]` float32 advantage of each segment in this item.
  """
  kind: str
  tokens: np.ndarray
  loss_mask: np.ndarray
  behaviour_logprobs: np.ndarray
  token_segment: np.ndarray
  seg_episode: np.ndarray
  seg_stage: np.ndarray
  seg_version: np.ndarray
  seg_advantage: np.ndarray

  @property
  def length(self) -> int:
    return int(self.tokens.shape[0])

  @property
  def num_segments(self) -> int:
    return int(self.seg_episode.shape[0])


@dataclasses.dataclass
class Batch:
  """A learner batch and its host-side bookkeeping.

  Attributes:
    update: the fixed-shape `core.types.UpdateBatch` `[N, T]` for the learner; padding rows
      have an all-False mask and weight 0, dropped stale segments are masked out, staleness
      weights are folded into the per-token advantages.
    kinds: list of the `kind` of each real row.
    segments: `(episode, stage, advantage)` of every segment in the batch, advantage with its
      staleness weight applied (0 for a dropped segment).
    stats: host-side counts for metrics (ints and floats).
  """
  update: core_types.UpdateBatch
  kinds: list[str]
  segments: list[tuple[int, int, float]]
  stats: dict[str, float]

  @property
  def num_rows(self) -> int:
    return len(self.kinds)



@dataclasses.dataclass
class PendingGroup:
  """A registered group not yet released by `finish`.

  Attributes:
    episodes: its G episode ids, in member order.
    stages_reported: `[S]` per stage, how many members have reported it.
    finished: members whose final reward has arrived.
  """
  episodes: list[int]
  stages_reported: list[int]
  finished: int = 0


@dataclasses.dataclass
class PendingEpisode:
  """A registered episode not yet released by `finish`.

  Attributes:
    group: its group id.
    member: its index in the group, in `[0, G)`.
    segments: `[S]` stored segments, None for a stage not yet reported.
    final_reward: the final reward, None until `finish`.
  """
  group: int
  member: int
  segments: list[Optional[Segment]]
  final_reward: Optional[float] = None
