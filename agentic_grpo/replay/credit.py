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

Two group filters (`StagedReplay`'s `drop_tied_groups` and `pass_rate_band`, the run config's
`rl.dynamic_sampling` and `rl.pass_rate_filter`):

* *no-signal groups* (DAPO's dynamic sampling, Yu et al., 2025, §3.2): a stage whose
  provisional advantages are all 0 in the group (`stage_ties`) readies no provisional item, and
  a finished group whose every advantage, provisional and target, is 0 readies nothing at all
  and is counted (`dynamic_sampling_dropped_groups`), whether or not zero-advantage rows are
  skipped one by one;
* *pass-rate filter* (`outside_band`): a finished group whose pass rate (mean final reward)
  lies outside `[lo, hi]` gets the target 0 on every segment: no final item, no held item, and
  a provisional update it already received is withdrawn by its correction `0 − Â_applied`, so
  that provisional + correction = 0 for it (counted, `pass_rate_filtered_groups`).
"""

import collections
from typing import Optional, Sequence

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
                      scale: str, baseline: str, skip_zero_advantage: bool,
                      drop_tied: bool = False,
                      negative_weight: float = 1.0) -> list[records.Item]:
  """Provisional items of stage `stage` of groups that all reported it (one advantage call).

  Sets `applied` on every segment that gets an item.

  Args:
    grid: `[B][G][stage + 1]` segments of stages `0..stage` of each member.
    episode_ids: `[B][G]` episode ids.
    stage: the completed stage.
    scale, baseline: `core.advantages.provisional_advantages` options.
    skip_zero_advantage: emit no item for an advantage of exactly 0.
    drop_tied: emit no item for a group whose advantages of this stage are all 0.
    negative_weight: `core.advantages.weight_negatives`'s weight (1: unchanged).
  """
  adv = batched.stage_advantages(_field(grid, lambda s: s.reward, np.float32),
                                 _field(grid, lambda s: s.valid, bool), stage, scale=scale,
                                 baseline=baseline, negative_weight=negative_weight)
  items = []
  for eps, row, adv_row in zip(episode_ids, grid, adv):
    if drop_tied and not np.any(adv_row):
      continue
    for e, ep, a in zip(eps, row, adv_row):
      s = ep[stage]
      if not s.valid or (skip_zero_advantage and a == 0.0):
        continue
      s.applied = float(a)
      items.append(batching.segment_item("provisional", e, stage, s, float(a)))
  return items


def held_items(grid: SegmentGrid, episode_ids: Sequence[Sequence[int]], *,
               skip_zero_advantage: bool,
               drop: Optional[np.ndarray] = None) -> list[records.Item]:
  """The provisional items `provisional_items` would have readied, for post-hoc release.

  Their advantages were computed (and recorded as `applied`) when each stage completed.

  Args:
    grid: `[B][G][S]` segments of every member of finished groups.
    episode_ids: `[B][G]` episode ids.
    skip_zero_advantage: as in `provisional_items`.
    drop: optional `[B, S]` bool: group stages that release nothing (tied stages of
      `drop_tied`, every stage of a group the pass-rate filter rejected).
  """
  items = []
  for b, (eps, row) in enumerate(zip(episode_ids, grid)):
    for e, segments in zip(eps, row):
      for k, s in enumerate(segments):
        if drop is not None and drop[b, k]:
          continue
        if s.valid and (s.applied != 0.0 or not skip_zero_advantage):
          items.append(batching.segment_item("provisional", e, k, s, s.applied))
  return items


def correction_items(grid: SegmentGrid, final_rewards: np.ndarray,
                     episode_ids: Sequence[Sequence[int]], *, target_mode: str, gamma: float,
                     beta: float, scale: str, baseline: str, correction: bool,
                     skip_zero_advantage: bool, pack: bool,
                     counters: collections.Counter,
                     stage_tied: Optional[np.ndarray] = None,
                     filtered: Optional[np.ndarray] = None,
                     negative_weight: float = 1.0) -> list[records.Item]:
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
      without reversing it) and `corrections` added; with `stage_tied`,
      `dynamic_sampling_dropped_groups`; with `filtered`, `pass_rate_filtered_groups`.
    stage_tied: optional `[B, S]` bool (`stage_ties`; all True for outcome-only runs, which
      give no provisional advantage): with it, a group whose stages are all tied and whose
      targets are all 0 carries no signal and readies nothing (dynamic sampling).
    filtered: optional `[B]` bool (`outside_band`): groups whose target is 0 on every segment
      (the pass-rate filter); they ready only the withdrawals of applied provisional updates.
    negative_weight: `core.advantages.weight_negatives`'s weight of the targets (1:
      unchanged); the applied provisional advantages were weighted alike.
  """
  applied = _field(grid, lambda s: s.applied, np.float32)
  target, delta = batched.outcome_credit(
      _field(grid, lambda s: s.reward, np.float32), final_rewards,
      _field(grid, lambda s: s.valid, bool), applied,
      mode=target_mode, gamma=gamma, beta=beta, scale=scale, baseline=baseline,
      negative_weight=negative_weight)
  num_groups, group_size, num_stages = delta.shape
  silent = np.zeros(num_groups, bool)  # groups that ready nothing
  if stage_tied is not None:
    silent = np.all(stage_tied, axis=1) & ~np.any(target.reshape(num_groups, -1), axis=1)
    counters["dynamic_sampling_dropped_groups"] += int(silent.sum())
  quiet = np.zeros(num_groups, bool)  # groups that ready only non-zero corrections
  if filtered is not None:
    quiet = np.asarray(filtered, bool)
    counters["pass_rate_filtered_groups"] += int(quiet.sum())
    target = np.where(quiet[:, None, None], np.float32(0.0), target)
    delta = np.where(quiet[:, None, None], -applied, delta)
  items = []
  for e, segments, d_row, t_row, g in zip(sum(map(list, episode_ids), []),
                                          [ep for row in grid for ep in row],
                                          delta.reshape(-1, num_stages),
                                          target.reshape(-1, num_stages),
                                          np.repeat(np.arange(num_groups), group_size)):
    if silent[g]:
      continue
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
      if (skip_zero_advantage or quiet[g]) and d_row[k] == 0.0:
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


def stage_ties(grid: SegmentGrid, *, scale: str, baseline: str) -> np.ndarray:
  """`[B, S]` bool: the stages of finished groups whose provisional advantages are all 0 (one
  `core.batched.stage_advantages` call per stage: the advantages `provisional_items` gave).

  Args:
    grid: `[B][G][S]` segments of every member.
    scale, baseline: as in `provisional_items`.
  """
  rewards = _field(grid, lambda s: s.reward, np.float32)
  valid = _field(grid, lambda s: s.valid, bool)
  return np.stack([~np.any(batched.stage_advantages(rewards[..., :k + 1], valid[..., :k + 1], k,
                                                    scale=scale, baseline=baseline), axis=1)
                   for k in range(rewards.shape[2])], axis=1)


def outside_band(final_rewards: np.ndarray, band: Sequence[float]) -> np.ndarray:
  """`[B]` bool: groups whose pass rate, the mean of their `[B, G]` final rewards, lies
  outside the closed interval `band = (lo, hi)`."""
  lo, hi = band
  rate = np.mean(np.asarray(final_rewards, np.float64), axis=1)
  return (rate < lo) | (rate > hi)
