"""Credit for stored segments: provisional advantages per stage, corrections at the outcome.

Both go through `core` in one jitted call per completed set of groups (never per segment;
`core.batched`):

* `provisional_items`: when every member of some groups has reported stage `k`, their
  provisional advantages `Â[:, k] = norm_group(r[:, k] - b[:, k])` (`core.advantages.
  provisional_advantages`, which may look back at earlier stages for the baseline), one
  *provisional* item per segment with a non-zero advantage.
* `held_items`: with post-hoc stage credit (`STAGE_CREDIT`), the provisional items of finished
  groups, computed when their stages completed and released only now, with their corrections.
* `correction_items`: when every member of some groups has finished, the targets `A*`
  (`core.advantages.target_advantages`) and `Δ = A* − Â_applied` (`core.correction.
  correction_advantages`), with `Â_applied` the provisional advantage actually handed to the
  learner (0 if none was). A segment that got a provisional update receives a *correction*; one
  that did not (stage rewards off, or a zero provisional advantage) receives its target in full
  (a *final* item; with stage rewards off this is exactly outcome-only GRPO). So provisional +
  correction = target, per segment.
"""

import collections
from typing import Sequence

import numpy as np

from agentic_grpo.core import batched
from agentic_grpo.replay import batching
from agentic_grpo.replay import records

KINDS = ("provisional", "correction", "final")
# When provisional items reach the learner: as soon as the group completes the stage (Agentic
# GRPO), or held until the group's final rewards (dense stage credit without immediacy: the
# turn-level credit of MT-GRPO / GiGPO-style methods, arm 2 of DESIGN.md §7).
STAGE_CREDIT = ("immediate", "post_hoc")

# `[B][G][S]` stored segments of B groups of G episodes (None for a stage not yet reported).
SegmentGrid = Sequence[Sequence[Sequence[records.Segment]]]


def _field(grid: SegmentGrid, fn, dtype) -> np.ndarray:
  return np.array([[[fn(s) for s in ep] for ep in row] for row in grid], dtype)


def provisional_items(grid: SegmentGrid, episode_ids: Sequence[Sequence[int]], stage: int, *,
                      scale: str, baseline: str,
                      skip_zero_advantage: bool) -> list[records.Item]:
  """Provisional items of stage `stage` of groups that all reported it (one advantage call).

  Sets `applied` on every segment that gets an item.

  Args:
    grid: `[B][G][stage + 1]` segments of stages `0..stage` of each member.
    episode_ids: `[B][G]` episode ids.
    stage: the completed stage.
    scale, baseline: `core.advantages.provisional_advantages` options.
    skip_zero_advantage: emit no item for an advantage of exactly 0.
  """
  adv = batched.stage_advantages(_field(grid, lambda s: s.reward, np.float32),
                                 _field(grid, lambda s: s.valid, bool), stage, scale=scale,
                                 baseline=baseline)
  items = []
  for eps, row, adv_row in zip(episode_ids, grid, adv):
    for e, ep, a in zip(eps, row, adv_row):
      s = ep[stage]
      if not s.valid or (skip_zero_advantage and a == 0.0):
        continue
      s.applied = float(a)
      items.append(batching.segment_item("provisional", e, stage, s, float(a)))
  return items


def held_items(grid: SegmentGrid, episode_ids: Sequence[Sequence[int]], *,
               skip_zero_advantage: bool) -> list[records.Item]:
  """The provisional items `provisional_items` would have readied, for post-hoc release.

  Their advantages were computed (and recorded as `applied`) when each stage completed.

  Args:
    grid: `[B][G][S]` segments of every member of finished groups.
    episode_ids: `[B][G]` episode ids.
    skip_zero_advantage: as in `provisional_items`.
  """
  items = []
  for eps, row in zip(episode_ids, grid):
    for e, segments in zip(eps, row):
      for k, s in enumerate(segments):
        if s.valid and (s.applied != 0.0 or not skip_zero_advantage):
          items.append(batching.segment_item("provisional", e, k, s, s.applied))
  return items


def correction_items(grid: SegmentGrid, final_rewards: np.ndarray,
                     episode_ids: Sequence[Sequence[int]], *, target_mode: str, gamma: float,
                     beta: float, scale: str, baseline: str, correction: bool,
                     skip_zero_advantage: bool, pack: bool,
                     counters: collections.Counter) -> list[records.Item]:
  """Correction and final items of finished groups (one target call for all).

  Args:
    grid: `[B][G][S]` segments of every member.
    final_rewards: `[B, G]` float32.
    episode_ids: `[B][G]` episode ids.
    target_mode, gamma, beta, scale, baseline: `core.advantages.target_advantages` options.
    correction: emit corrections for provisionally updated segments (False: leave them with
      their provisional update).
    skip_zero_advantage: emit nothing for a segment whose advantage is exactly 0.
    pack: pack an episode's segments into one row when they chain (`batching.chains`).
    counters: gets `sign_reversals` (segments whose target and applied provisional advantage
      have strictly opposite signs; a target of exactly 0 withdraws the provisional update
      without reversing it) and `corrections` added.
  """
  target, delta = batched.outcome_credit(
      _field(grid, lambda s: s.reward, np.float32), final_rewards,
      _field(grid, lambda s: s.valid, bool), _field(grid, lambda s: s.applied, np.float32),
      mode=target_mode, gamma=gamma, beta=beta, scale=scale, baseline=baseline)
  items = []
  num_stages = delta.shape[-1]
  for e, segments, d_row, t_row in zip(sum(map(list, episode_ids), []),
                                       [ep for row in grid for ep in row],
                                       delta.reshape(-1, num_stages),
                                       target.reshape(-1, num_stages)):
    seg_ids, seg_adv, kinds = [], [], []
    for k, s in enumerate(segments):
      if not s.valid:
        continue
      had_provisional = s.applied != 0.0
      if had_provisional:
        if t_row[k] * s.applied < 0.0:  # strictly opposite signs (a zero target is none)
          counters["sign_reversals"] += 1
        if not correction:
          continue
      if skip_zero_advantage and d_row[k] == 0.0:
        continue
      if had_provisional:
        counters["corrections"] += 1
      seg_ids.append(k)
      seg_adv.append(float(d_row[k]))
      kinds.append("correction" if had_provisional else "final")
    if not seg_ids:
      continue
    if pack and batching.chains(segments, seg_ids):
      kind = "correction" if "correction" in kinds else "final"
      items.append(batching.packed_item(kind, e, segments, seg_ids, seg_adv))
    else:
      items.extend(batching.segment_item(kd, e, k, segments[k], a)
                   for k, a, kd in zip(seg_ids, seg_adv, kinds))
  return items
