"""Staged replay: provisional items per completed stage, corrections once the outcome is known.

The host-side store between the agent loop and the learner (docs/design.md §1, §3):

* `intake`: `StagedReplay`, groups and episodes, stored segments, capacity and eviction;
* `credit`: provisional advantages and corrections through `core.advantages` and
  `core.correction`, one call per completed set of groups;
* `batching`: packing an episode's segments into one row, length buckets, and `take` into a
  fixed-shape `core.types.UpdateBatch` (one staleness call per batch);
* `records`: `Segment`, `PendingGroup`, `PendingEpisode`, `Item`, `Batch`;
* `snapshot`: the state as numpy arrays plus a JSON dict, and back (checkpoints).
"""

from agentic_grpo.replay.credit import KINDS
from agentic_grpo.replay.credit import STAGE_CREDIT
from agentic_grpo.replay.intake import StagedReplay
from agentic_grpo.replay.intake import WHEN_FULL
from agentic_grpo.replay.records import Batch
from agentic_grpo.replay.records import Item
from agentic_grpo.replay.records import Segment

__all__ = ["Batch", "Item", "KINDS", "STAGE_CREDIT", "Segment", "StagedReplay", "WHEN_FULL"]
