"""Intake of staged episodes: groups, episodes, their stored segments, capacity and eviction.

`StagedReplay` is the host-side store between the agent loop and the learner
(docs/design.md §1, §3). A *segment* is one stage of one episode: the token row the policy saw
and produced (`context + generated`), its loss mask (True on the tokens the policy generated in
that stage), the behaviour log-probs recorded at sampling time, the policy version that sampled
it, and the stage reward.

* `add_stage` stores segments; when every member of a group has reported a stage, its
  provisional items become ready (`credit.provisional_items`).
* `finish` takes the final rewards; once every member of a group has finished, its corrections
  and final items become ready (`credit.correction_items`).
* `stage_credit="post_hoc"` holds a group's provisional items until its final rewards, then
  readies them ahead of its corrections (`credit.held_items`): dense stage credit without
  immediacy (arm 2 of DESIGN.md §7). The default `"immediate"` readies them at once.
* `supersede_queued`: when a group finishes, its provisional items still waiting in the queue
  are withdrawn and their segments get their targets in full in the outcome rows instead
  (`_supersede`): a provisional update the learner has not yet made when the outcome is known
  would be offset by its correction an update or more later, and with the final reward landing
  in the same harvest as the last stage (`rl.final_reward_lag=0`) its row is the outcome row's
  context computed a second time.
* `drop_tied_groups` (DAPO's dynamic sampling) readies nothing from a group's stage whose
  advantages are all 0, nor from a finished group without any non-zero advantage, and counts
  the latter; `pass_rate_band` withdraws the credit of finished groups whose pass rate lies
  outside the band (`credit`'s module docstring has both).
* `take` hands the learner a fixed-shape batch (`batching.take`), applying the staleness rule
  (`core.correction.staleness_weights`): segments older than `max_staleness` policy versions are
  dropped (mode `drop`) or down-weighted (mode `linear`), and counted.

Capacity: at most `capacity` segments are held (episodes awaiting their outcome plus ready rows,
a packed row counting once per segment). When full, `when_full="evict_oldest"` evicts the oldest
ready items (counted as `evicted_segments`); `"error"` raises. Episodes in progress are never
evicted: if they alone exceed the capacity, `add_stage` raises `RuntimeError`.

The whole state round-trips through `state_dict` / `load_state_dict` (numpy arrays plus a JSON
dict, encoded by `snapshot`), for checkpoints.
"""

import collections
from typing import Any, Optional, Sequence

import numpy as np

from agentic_grpo.core import advantages as advantages_lib
from agentic_grpo.core import correction as correction_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.replay import batching
from agentic_grpo.replay import credit
from agentic_grpo.replay import records
from agentic_grpo.replay import sections
from agentic_grpo.replay import snapshot

WHEN_FULL = sections.WHEN_FULL
# One set of defaults: the keyword defaults below are the config sections'.
_CORRECTION = sections.CorrectionSection()
_STORAGE = sections.ReplaySection()


class StagedReplay:
  """Replay of staged episodes for Agentic GRPO (see module docstring)."""

  def __init__(
      self,
      *,
      group_size: int,
      num_stages: int,
      stage_rewards: bool = True,
      correction: bool = _CORRECTION.enabled,
      target_mode: str = _CORRECTION.target,
      gamma: float = _CORRECTION.gamma,
      beta: float = _CORRECTION.beta,
      scale: str = _CORRECTION.scale,
      baseline: str = _CORRECTION.baseline,
      negative_weight: float = _CORRECTION.negative_weight,
      max_staleness: int = _CORRECTION.max_staleness,
      staleness_mode: str = _CORRECTION.staleness_mode,
      capacity: int = _STORAGE.capacity,
      when_full: str = _STORAGE.when_full,
      skip_zero_advantage: bool = _STORAGE.skip_zero_advantage,
      pack_corrections: bool = _STORAGE.pack_corrections,
      stage_credit: str = _CORRECTION.stage_credit,
      supersede_queued: bool = _CORRECTION.supersede_queued,
      drop_tied_groups: bool = False,
      pass_rate_band: Optional[Sequence[float]] = None,
      prefix_packing: Optional[batching.PrefixPacking] = None,
  ):
    """Creates an empty replay. The keyword defaults are those of `sections.CorrectionSection`
    and `sections.ReplaySection` (a run builds its replay with `from_sections`).

    Args:
      group_size: G, members per group (>= 1).
      num_stages: S, stages per episode (>= 1).
      stage_rewards: emit provisional items from stage rewards; False = outcome-only updates.
      correction: emit corrections `A* − Â` for segments that got a provisional update; False
        leaves them with their provisional update only.
      target_mode: `core.advantages.target_advantages` mode (`outcome`, `return`, `mixed`).
      gamma: discount for `return`.
      beta: provisional share for `mixed`.
      scale: group normalisation, `std` or `none`.
      baseline: per-stage baseline subtracted before normalising, provisional and target alike
        (`core.advantages.stage_baselines`): `none` or `previous_stage`.
      negative_weight: the weight of negative advantages, provisional and target alike
        (`core.advantages.weight_negatives`), >= 0; 1 leaves them unchanged.
      max_staleness: policy versions after which a segment is dropped / weighs 0.
      staleness_mode: `drop` or `linear` (`core.correction.staleness_weights`).
      capacity: most segments held at once (>= group_size * num_stages).
      when_full: `evict_oldest` or `error`.
      skip_zero_advantage: do not emit rows whose advantage is exactly 0 on every segment (they
        carry no policy-gradient signal); their segments then count as not provisionally updated.
      pack_corrections: pack an episode's correction segments into one row when they chain. Pass
        True only for a loss that is additive over a row's segments
        (`core.losses.segments_additive`).
      stage_credit: when provisional items become ready, from `credit.STAGE_CREDIT`:
        `immediate` (when the group completes the stage) or `post_hoc` (held until the group's
        final rewards, then released).
      supersede_queued: when a group finishes, withdraw its provisional items not yet taken by
        the learner; their segments then count as not provisionally updated and get their
        targets in full (`final` advantages, packed into the episode's outcome row when the
        segments chain). Each segment's total advantage is its target either way (provisional
        + correction = target). Acts only with `correction`, `stage_rewards` and `immediate`
        stage credit: without a correction a provisionally updated segment keeps `Â` and never
        gets `A*`, and withdrawing its row would hand it `A*` instead; post-hoc credit holds its
        items outside the queue. The whole credit then rides in the outcome row, so under
        `staleness_mode="drop"` a stale outcome row leaves the segment with 0, not `Â`. Counted
        as `counters["superseded_provisional_items"]` (`finish` returns the items it added;
        the queue may have shrunk by these).
      drop_tied_groups: ready no item from a group's stage whose provisional advantages are
        all 0, nor from a finished group whose every advantage (provisional and target) is 0,
        even when `skip_zero_advantage` is False; count such groups
        (`counters["dynamic_sampling_dropped_groups"]`). DAPO's dynamic sampling (Yu et al.,
        2025, §3.2) at the level of rows; the trainer keeps the updates full
        (`train.rl_phase`).
      pass_rate_band: `(lo, hi)` with `0 <= lo <= hi <= 1`, or None (off): a finished group
        whose pass rate (mean final reward) lies outside `[lo, hi]` gets the target advantage 0
        on every segment: no final or held item, and corrections that withdraw the provisional
        updates it received (with `correction`); counted
        (`counters["pass_rate_filtered_groups"]`).
      prefix_packing: lay out `take`'s batches with shared-prefix packing (`batching`'s
        module docstring), or None (one row per item). Pass it only for a loss that is
        additive over a row's tokens (`core.losses.segments_additive`). The items taken, and
        the state (`state_dict`), are the same either way.

    Raises:
      ValueError: naming the first bad argument.
    """
    if group_size < 1:
      raise ValueError(f"group_size must be >= 1, got {group_size}")
    if num_stages < 1:
      raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    core_types.check_choice("target_mode", target_mode, advantages_lib.TARGET_MODES)
    core_types.check_choice("scale", scale, advantages_lib.SCALES)
    core_types.check_choice("baseline", baseline, advantages_lib.BASELINES)
    core_types.check_choice("staleness_mode", staleness_mode, correction_lib.STALENESS_MODES)
    core_types.check_choice("when_full", when_full, WHEN_FULL)
    core_types.check_choice("stage_credit", stage_credit, credit.STAGE_CREDIT)
    if max_staleness < 0:
      raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    if not 0.0 <= gamma <= 1.0:
      raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not 0.0 <= negative_weight < float("inf"):  # NaN fails too
      raise ValueError(f"negative_weight must be finite and >= 0, got {negative_weight}")
    if pass_rate_band is not None:
      band = tuple(float(v) for v in pass_rate_band)
      if len(band) != 2 or not 0.0 <= band[0] <= band[1] <= 1.0:
        raise ValueError(f"pass_rate_band must be (lo, hi) with 0 <= lo <= hi <= 1, got "
                         f"{pass_rate_band}")
      pass_rate_band = band
    if capacity < group_size * num_stages:
      raise ValueError(f"capacity must be >= group_size * num_stages = "
                       f"{group_size * num_stages}, got {capacity}")
    self.group_size = int(group_size)
    self.num_stages = int(num_stages)
    self.stage_rewards = bool(stage_rewards)
    self.correction = bool(correction)
    self.target_mode = target_mode
    self.gamma = float(gamma)
    self.beta = float(beta)
    self.scale = scale
    self.baseline = baseline
    self.negative_weight = float(negative_weight)
    self.max_staleness = int(max_staleness)
    self.staleness_mode = staleness_mode
    self.capacity = int(capacity)
    self.when_full = when_full
    self.skip_zero_advantage = bool(skip_zero_advantage)
    self.pack_corrections = bool(pack_corrections)
    self.stage_credit = stage_credit
    self.supersede_queued = bool(supersede_queued)
    self.drop_tied_groups = bool(drop_tied_groups)
    self.pass_rate_band = pass_rate_band
    self.prefix_packing = prefix_packing
    self._groups: dict[int, records.PendingGroup] = {}
    self._episodes: dict[int, records.PendingEpisode] = {}
    self._ready: collections.deque[records.Item] = collections.deque()
    self.counters: collections.Counter = collections.Counter()

  @classmethod
  def from_sections(cls, *, group_size: int, num_stages: int,
                    correction: sections.CorrectionSection,
                    storage: sections.ReplaySection, loss_additive: bool = True,
                    **options: Any) -> "StagedReplay":
    """A replay from the config's `correction` and `replay` sections.

    Args:
      group_size: G (`rl.group_size`).
      num_stages: S, stages per episode.
      correction: the `correction` section: `enabled`, `target`, `gamma`, `beta`, `scale`,
        `baseline`, `negative_weight`, `max_staleness`, `staleness_mode`, `stage_credit`,
        `supersede_queued`.
      storage: the `replay` section: `capacity`, `when_full`, `skip_zero_advantage`,
        `pack_corrections`.
      loss_additive: the loss is additive over a row's segments
        (`core.losses.segments_additive`); correction packing needs it.
      **options: the constructor's other keywords (`stage_rewards`, `drop_tied_groups`,
        `pass_rate_band`, `prefix_packing`).

    Raises:
      ValueError: as the constructor, naming the first bad argument.
    """
    return cls(
        group_size=group_size, num_stages=num_stages, correction=correction.enabled,
        target_mode=correction.target, gamma=correction.gamma, beta=correction.beta,
        scale=correction.scale, baseline=correction.baseline,
        negative_weight=correction.negative_weight,
        max_staleness=correction.max_staleness, staleness_mode=correction.staleness_mode,
        stage_credit=correction.stage_credit, supersede_queued=correction.supersede_queued,
        capacity=storage.capacity,
        when_full=storage.when_full, skip_zero_advantage=storage.skip_zero_advantage,
        pack_corrections=storage.pack_corrections and loss_additive, **options)

  # ------------------------------------------------------------------ sizes

  @property
  def num_ready(self) -> int:
    """Ready items (learner rows) waiting."""
    return len(self._ready)

  @property
  def num_pending_episodes(self) -> int:
    """Episodes registered and not yet released by `finish`."""
    return len(self._episodes)

  def num_segments(self) -> int:
    """Segments held: stored segments of pending episodes plus segments of ready rows."""
    held = sum(s is not None for e in self._episodes.values() for s in e.segments)
    return held + sum(item.num_segments for item in self._ready)

  def ready_fitting(self, buckets: Sequence[int]) -> list[int]:
    """Per length bucket, how many ready items fit in it (at most that many tokens)."""
    lengths = np.array(self.ready_lengths(), np.int64)
    return [int(np.sum(lengths <= b)) for b in buckets]

  def ready_lengths(self) -> list[int]:
    """Token lengths of the ready items, oldest first."""
    return [item.length for item in self._ready]

  # ------------------------------------------------------------------ intake

  def add_group(self, group_id: int, episode_ids: Sequence[int]) -> None:
    """Registers a group of `group_size` episodes (one task, G attempts).

    Raises:
      ValueError: if `group_id` or an episode id is already in use, or the number of episodes is
        not `group_size`.
    """
    episode_ids = [int(e) for e in episode_ids]
    if group_id in self._groups:
      raise ValueError(f"group_id {group_id} is already registered")
    if len(episode_ids) != self.group_size or len(set(episode_ids)) != len(episode_ids):
      raise ValueError(f"episode_ids must be {self.group_size} distinct ids, got {episode_ids}")
    for e in episode_ids:
      if e in self._episodes:
        raise ValueError(f"episode id {e} is already registered")
    self._groups[int(group_id)] = records.PendingGroup(episode_ids, [0] * self.num_stages)
    for member, e in enumerate(episode_ids):
      self._episodes[e] = records.PendingEpisode(int(group_id), member, [None] * self.num_stages)

  def add_stage(
      self,
      episode_ids: Sequence[int],
      stage: int,
      tokens: Sequence[np.ndarray],
      loss_mask: Sequence[np.ndarray],
      behaviour_logprobs: Sequence[np.ndarray],
      policy_version,
      rewards,
      valid=None,
  ) -> int:
    """Stores stage `stage` of some episodes; readies provisional items of completed groups.

    Args:
      episode_ids: `[M]` ids of registered episodes.
      stage: stage index in `[0, num_stages)`.
      tokens: M rows, each `[L_m]` int (lengths may differ).
      loss_mask: M rows `[L_m]` bool.
      behaviour_logprobs: M rows `[L_m]` float32.
      policy_version: int, or `[M]` ints: version of the params that sampled each row.
      rewards: `[M]` float stage rewards (finite; a skipped stage should hold 0).
      valid: optional `[M]` bool; False for a stage an episode skipped.

    Returns:
      The number of provisional items made ready by this call.

    Raises:
      ValueError: unknown episode, repeated stage, bad stage index, mismatched lengths or
        non-finite rewards.
      RuntimeError: the replay is full (see class docstring).
    """
    m = len(episode_ids)
    if not 0 <= stage < self.num_stages:
      raise ValueError(f"stage must be in [0, {self.num_stages}), got {stage}")
    rewards = np.asarray(rewards, np.float32).reshape(-1)
    versions = np.broadcast_to(np.asarray(policy_version, np.int64), (m,))
    valid = np.ones(m, bool) if valid is None else np.asarray(valid, bool).reshape(-1)
    for name, seq in (("tokens", tokens), ("loss_mask", loss_mask),
                      ("behaviour_logprobs", behaviour_logprobs), ("rewards", rewards),
                      ("valid", valid)):
      if len(seq) != m:
        raise ValueError(f"{name} must have {m} rows (one per episode id), got {len(seq)}")
    if not np.all(np.isfinite(rewards)):
      raise ValueError(f"rewards must be finite, got {rewards.tolist()}")
    touched = []
    for i, e in enumerate(episode_ids):
      e = int(e)
      if e not in self._episodes:
        raise ValueError(f"episode id {e} is not registered (add_group first)")
      ep = self._episodes[e]
      if ep.segments[stage] is not None:
        raise ValueError(f"episode {e} already reported stage {stage}")
      row = np.asarray(tokens[i], np.int32).reshape(-1)
      mask = np.asarray(loss_mask[i], bool).reshape(-1)
      blp = np.asarray(behaviour_logprobs[i], np.float32).reshape(-1)
      if not row.shape == mask.shape == blp.shape:
        raise ValueError(f"episode {e}: tokens, loss_mask and behaviour_logprobs must have the "
                         f"same length, got {row.shape[0]}, {mask.shape[0]}, {blp.shape[0]}")
      ok = bool(valid[i])
      ep.segments[stage] = records.Segment(row, mask & ok,
                                           np.where(mask & ok, blp, 0.0).astype(np.float32),
                                           int(versions[i]), float(rewards[i]) if ok else 0.0,
                                           ok)
      self._groups[ep.group].stages_reported[stage] += 1
      touched.append(ep.group)
    done = [g for g in dict.fromkeys(touched)
            if self._groups[g].stages_reported[stage] == self.group_size]
    made = self._emit_provisional(done, stage) if done else 0
    self._enforce_capacity()
    return made

  def _emit_provisional(self, group_ids: list[int], stage: int) -> int:
    """Readies the stage-`stage` items of groups that all reported it (one advantage call)."""
    if not self.stage_rewards:
      return 0
    members = [self._groups[g].episodes for g in group_ids]
    # Stages 0..stage of every member, `[B, G, stage + 1]`: the baseline may look back.
    grid = [[self._episodes[e].segments[:stage + 1] for e in eps] for eps in members]
    items = credit.provisional_items(grid, members, stage, scale=self.scale,
                                     baseline=self.baseline,
                                     skip_zero_advantage=self.skip_zero_advantage,
                                     drop_tied=self.drop_tied_groups,
                                     negative_weight=self.negative_weight)
    if self.stage_credit == "post_hoc":
      return 0  # held: `applied` is recorded on the segments, released by `_emit_corrections`
    self._ready.extend(items)
    self.counters["provisional_items"] += len(items)
    return len(items)

  def finish(self, episode_ids: Sequence[int], final_rewards) -> int:
    """Records final rewards; emits corrections for every group whose members all finished.

    Args:
      episode_ids: `[M]` ids of registered episodes whose every stage has been reported.
      final_rewards: `[M]` finite floats (e.g. fraction of hidden tests passed).

    Returns:
      The number of items (correction or final rows, and the held provisional rows of
      `post_hoc` stage credit) made ready by this call.

    Raises:
      ValueError: unknown episode, missing stages, repeated finish, or non-finite rewards.
    """
    final_rewards = np.asarray(final_rewards, np.float32).reshape(-1)
    if len(final_rewards) != len(episode_ids):
      raise ValueError(f"final_rewards must have {len(episode_ids)} entries, "
                       f"got {len(final_rewards)}")
    if not np.all(np.isfinite(final_rewards)):
      raise ValueError(f"final_rewards must be finite, got {final_rewards.tolist()}")
    touched = []
    for e, r in zip(episode_ids, final_rewards):
      e = int(e)
      if e not in self._episodes:
        raise ValueError(f"episode id {e} is not registered")
      ep = self._episodes[e]
      missing = [k for k, s in enumerate(ep.segments) if s is None]
      if missing:
        raise ValueError(f"episode {e} has not reported stages {missing}")
      if ep.final_reward is not None:
        raise ValueError(f"episode {e} already finished")
      ep.final_reward = float(r)
      self._groups[ep.group].finished += 1
      touched.append(ep.group)
    done = [g for g in dict.fromkeys(touched) if self._groups[g].finished == self.group_size]
    return self._emit_corrections(done) if done else 0

  def _emit_corrections(self, group_ids: list[int]) -> int:
    """Releases finished groups, readying their corrections (one advantage call for all)."""
    ids = [self._groups.pop(g).episodes for g in group_ids]
    eps = [[self._episodes.pop(e) for e in row] for row in ids]
    if (self.supersede_queued and self.correction and self.stage_rewards
        and self.stage_credit == "immediate"):
      self._supersede({e: ep for row_ids, row in zip(ids, eps) for e, ep in zip(row_ids, row)})
    grid = [[ep.segments for ep in row] for row in eps]
    final = np.array([[ep.final_reward for ep in row] for row in eps], np.float32)
    # The group filters (off: None, and everything below is as without them).
    stage_tied = filtered = drop = None
    if self.drop_tied_groups:
      stage_tied = (credit.stage_ties(grid, scale=self.scale, baseline=self.baseline)
                    if self.stage_rewards else np.ones((len(ids), self.num_stages), bool))
      drop = stage_tied
    if self.pass_rate_band is not None:
      filtered = credit.outside_band(final, self.pass_rate_band)
      drop = filtered[:, None] if drop is None else drop | filtered[:, None]
    held = []
    if self.stage_credit == "post_hoc" and self.stage_rewards:
      held = credit.held_items(grid, ids, skip_zero_advantage=self.skip_zero_advantage,
                               drop=None if drop is None else np.broadcast_to(
                                   drop, (len(ids), self.num_stages)))
      self._ready.extend(held)
      self.counters["provisional_items"] += len(held)
      if filtered is not None:  # held items never released: nothing to withdraw
        for row in (r for r, f in zip(grid, filtered) if f):
          for segment in (s for ep in row for s in ep):
            segment.applied = 0.0
    items = credit.correction_items(
        grid, final, ids,
        target_mode=self.target_mode, gamma=self.gamma, beta=self.beta, scale=self.scale,
        baseline=self.baseline, correction=self.correction,
        negative_weight=self.negative_weight,
        skip_zero_advantage=self.skip_zero_advantage, pack=self.pack_corrections,
        counters=self.counters, stage_tied=stage_tied, filtered=filtered)
    self._ready.extend(items)
    self.counters["correction_items"] += len(items)
    self._enforce_capacity()
    return len(held) + len(items)

  def _supersede(self, finishing: dict[int, records.PendingEpisode]) -> None:
    """Withdraws the queued provisional items of `finishing` episodes (`supersede_queued`),
    zeroing their segments' `applied` so that `credit.correction_items` gives them their
    targets in full."""
    kept: collections.deque[records.Item] = collections.deque()
    withdrawn = 0
    for item in self._ready:
      ep = finishing.get(int(item.seg_episode[0])) if item.kind == "provisional" else None
      if ep is None:
        kept.append(item)
        continue
      ep.segments[int(item.seg_stage[0])].applied = 0.0
      withdrawn += 1
    if withdrawn:
      self._ready = kept
      self.counters["superseded_provisional_items"] += withdrawn

  def _record_applied(self, item: records.Item, weight: float) -> None:
    """A provisional item left the queue with `weight`: its segment got `weight · Â`."""
    ep = self._episodes.get(int(item.seg_episode[0]))
    if ep is not None:
      ep.segments[int(item.seg_stage[0])].applied = weight * float(item.seg_advantage[0])

  def _enforce_capacity(self) -> None:
    over = self.num_segments() - self.capacity
    if over <= 0:
      return
    if self.when_full == "error":
      raise RuntimeError(f"replay full: {self.num_segments()} segments held, capacity "
                         f"{self.capacity} (when_full='error')")
    while over > 0 and self._ready:
      item = self._ready.popleft()
      if item.kind == "provisional":
        self._record_applied(item, 0.0)
      over -= item.num_segments
      self.counters["evicted_segments"] += item.num_segments
    if over > 0:
      raise RuntimeError(f"replay full: episodes in progress alone hold more than capacity "
                         f"{self.capacity} segments; raise replay.capacity or lower the number "
                         f"of episodes in flight")

  # ------------------------------------------------------------------ output

  def take(self, max_rows: int, current_version: int,
           buckets: Sequence[int]) -> Optional[records.Batch]:
    """Pops up to `max_rows` ready items into a fixed-shape batch `[max_rows, T]` (with
    `prefix_packing`: the same items in at most `max_rows` packed rows of a packed bucket).

    The bucket `T` is the smallest of `buckets` that holds the oldest ready item; the oldest
    items that fit in `T` fill the batch (FIFO otherwise). Staleness is judged against
    `current_version` (one `core.correction.staleness_weights` call per batch): segments whose
    weight is 0 are masked out (and counted as `stale_dropped_segments`), others have their
    weight folded into their advantage (counted as `stale_downweighted_segments` when below 1).
    Items left with no loss token are discarded.

    Args:
      max_rows: N, rows of the batch (>= 1).
      current_version: the learner's policy version now.
      buckets: allowed row lengths.

    Returns:
      A `Batch` (its `update` a `core.types.UpdateBatch`), or None when no item with a loss
      token is ready.

    Raises:
      ValueError: `max_rows < 1`, empty `buckets`, or an item longer than every bucket.
    """
    if max_rows < 1:
      raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    buckets = sorted(int(b) for b in buckets)
    if not buckets:
      raise ValueError("buckets must not be empty")
    batch, stats = batching.take(
        self._ready, max_rows, current_version, buckets, max_staleness=self.max_staleness,
        staleness_mode=self.staleness_mode, on_taken=self._record_applied,
        packing=self.prefix_packing)
    self.counters.update({k: v for k, v in stats.items() if k.startswith("stale_")})
    return batch

  # ------------------------------------------------------------------ state

  def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The whole state as `(arrays, meta)`: flat numpy arrays and a JSON-serialisable dict.

    Pending episodes (with their provisional advantages, i.e. pending corrections), ready items
    in order, and counters are all included (`snapshot.encode`); `load_state_dict` restores
    them exactly.
    """
    return snapshot.encode(self._groups, self._episodes, self._ready, self.counters)

  def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Replaces the state with one from `state_dict` (same construction options assumed)."""
    self._groups, self._episodes, self._ready, self.counters = snapshot.decode(arrays, meta)
