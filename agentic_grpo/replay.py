"""Staged replay: provisional items per completed stage, corrections once the outcome is known.

Host-side store between the agent loop and the learner (DESIGN.md §1, §3). A *segment* is one
stage of one episode: the token row the policy saw and produced (`context + generated`), its loss
mask (True on the tokens the policy generated in that stage), the behaviour log-probs recorded at
sampling time, the policy version that sampled it, and the stage reward.

* `add_stage` stores segments; when every member of a group has reported a stage, the group's
  provisional advantages `Â[:, k] = norm_group(r[:, k])` are computed (`core.advantages`) and one
  *provisional* item per segment becomes ready for the learner.
* `finish` takes the final rewards; once every member of a group has finished, the target
  advantages `A*` are computed (`core.advantages.target_advantages`) and every segment receives
  `Δ = A* − Â_applied` (`core.correction.correction_advantages`), where `Â_applied` is the
  provisional advantage actually handed to the learner (0 if none was). Segments that got a
  provisional update receive a *correction*; segments that did not (stage rewards off, or a
  zero provisional advantage) receive their target in full (a *final* item — with stage rewards
  off this is exactly outcome-only GRPO). So provisional + correction = target, per segment.
* `take` hands the learner a fixed-shape batch and applies the staleness rule
  (`core.correction.staleness_weights`): segments older than `max_staleness` policy versions are
  dropped (mode `drop`) or down-weighted (mode `linear`), and counted.

When every segment of an episode is a prefix of the next one (the agent loop's contexts are built
that way), an episode's corrections are packed into one row with per-token advantages — the same
per-token loss terms as one row per segment, at a fraction of the compute. The clipped surrogate
is positively homogeneous in the advantage, so a staleness weight `w >= 0` is folded into the
per-token advantage exactly.

Capacity: at most `capacity` segments are held (episodes awaiting their outcome plus ready rows,
a packed row counting once per segment). When full, `when_full="evict_oldest"` evicts the oldest
ready items (counted as `evicted_segments`); `"error"` raises. Episodes in progress are never
evicted: if they alone exceed the capacity, `add_stage` raises `RuntimeError`.

The whole state round-trips through `state_dict` / `load_state_dict` (numpy arrays plus a JSON
dict), for checkpoints.
"""

import collections
import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from agentic_grpo.core import advantages as advantages_lib
from agentic_grpo.core import correction as correction_lib

KINDS = ("provisional", "correction", "final")
WHEN_FULL = ("evict_oldest", "error")


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
    kind: one of `KINDS`.
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
  """A fixed-shape learner batch; padding rows have an all-False mask and weight 0.

  Attributes:
    tokens: `[N, T]` int32.
    loss_mask: `[N, T]` bool (dropped stale segments are masked out).
    behaviour_logprobs: `[N, T]` float32.
    advantages: `[N, T]` float32 per-token advantage, staleness weight folded in.
    sample_weights: `[N]` float32, 1 for real rows and 0 for padding rows.
    kinds: list of the `kind` of each real row.
    segments: `(episode, stage, advantage)` of every segment in the batch, advantage with its
      staleness weight applied (0 for a dropped segment).
    stats: host-side counts for metrics (ints and floats).
  """
  tokens: np.ndarray
  loss_mask: np.ndarray
  behaviour_logprobs: np.ndarray
  advantages: np.ndarray
  sample_weights: np.ndarray
  kinds: list[str]
  segments: list[tuple[int, int, float]]
  stats: dict[str, float]

  @property
  def num_rows(self) -> int:
    return len(self.kinds)


@dataclasses.dataclass
class _Group:
  episodes: list[int]
  stages_reported: list[int]  # per stage: how many members have reported it
  finished: int = 0


@dataclasses.dataclass
class _Episode:
  group: int
  member: int
  segments: list[Optional[Segment]]
  final_reward: Optional[float] = None


def _check_choice(name, value, allowed):
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


class StagedReplay:
  """Replay of staged episodes for Agentic GRPO (see module docstring)."""

  def __init__(
      self,
      *,
      group_size: int,
      num_stages: int,
      stage_rewards: bool = True,
      correction: bool = True,
      target_mode: str = "outcome",
      gamma: float = 1.0,
      beta: float = 0.0,
      scale: str = "std",
      baseline: str = "none",
      max_staleness: int = 4,
      staleness_mode: str = "drop",
      capacity: int = 4096,
      when_full: str = "evict_oldest",
      skip_zero_advantage: bool = True,
      pack_corrections: bool = True,
  ):
    """Creates an empty replay.

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
      max_staleness: policy versions after which a segment is dropped / weighs 0.
      staleness_mode: `drop` or `linear` (`core.correction.staleness_weights`).
      capacity: most segments held at once (>= group_size * num_stages).
      when_full: `evict_oldest` or `error`.
      skip_zero_advantage: do not emit rows whose advantage is exactly 0 on every segment (they
        carry no policy-gradient signal); their segments then count as not provisionally updated.
      pack_corrections: pack an episode's correction segments into one row when they chain.

    Raises:
      ValueError: naming the first bad argument.
    """
    if group_size < 1:
      raise ValueError(f"group_size must be >= 1, got {group_size}")
    if num_stages < 1:
      raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    _check_choice("target_mode", target_mode, advantages_lib.TARGET_MODES)
    _check_choice("scale", scale, advantages_lib.SCALES)
    _check_choice("baseline", baseline, advantages_lib.BASELINES)
    _check_choice("staleness_mode", staleness_mode, correction_lib.STALENESS_MODES)
    _check_choice("when_full", when_full, WHEN_FULL)
    if max_staleness < 0:
      raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    if not 0.0 <= gamma <= 1.0:
      raise ValueError(f"gamma must be in [0, 1], got {gamma}")
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
    self.max_staleness = int(max_staleness)
    self.staleness_mode = staleness_mode
    self.capacity = int(capacity)
    self.when_full = when_full
    self.skip_zero_advantage = bool(skip_zero_advantage)
    self.pack_corrections = bool(pack_corrections)
    self._groups: dict[int, _Group] = {}
    self._episodes: dict[int, _Episode] = {}
    self._ready: collections.deque[Item] = collections.deque()
    self.counters: collections.Counter = collections.Counter()

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
    self._groups[int(group_id)] = _Group(episode_ids, [0] * self.num_stages)
    for member, e in enumerate(episode_ids):
      self._episodes[e] = _Episode(int(group_id), member, [None] * self.num_stages)

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
      ep.segments[stage] = Segment(row, mask & ok, np.where(mask & ok, blp, 0.0).astype(np.float32),
                                   int(versions[i]), float(rewards[i]) if ok else 0.0, ok)
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
    seen = [[self._episodes[e].segments[:stage + 1] for e in eps] for eps in members]
    r = np.array([[[s.reward for s in ep] for ep in row] for row in seen], np.float32)
    v = np.array([[[s.valid for s in ep] for ep in row] for row in seen], bool)
    adv = np.asarray(advantages_lib.provisional_advantages(
        r, v, scale=self.scale, baseline=self.baseline)[..., stage], np.float32)
    segs = [[ep[stage] for ep in row] for row in seen]
    made = 0
    for eps, row, adv_row in zip(members, segs, adv):
      for e, s, a in zip(eps, row, adv_row):
        if not s.valid or (self.skip_zero_advantage and a == 0.0):
          continue
        s.applied = float(a)
        self._ready.append(self._segment_item("provisional", e, stage, s, float(a)))
        made += 1
    self.counters["provisional_items"] += made
    return made

  def finish(self, episode_ids: Sequence[int], final_rewards) -> int:
    """Records final rewards; emits corrections for every group whose members all finished.

    Args:
      episode_ids: `[M]` ids of registered episodes whose every stage has been reported.
      final_rewards: `[M]` finite floats (e.g. fraction of hidden tests passed).

    Returns:
      The number of items (correction or final rows) made ready by this call.

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
    field = lambda fn, dt: np.array([[[fn(s) for s in ep.segments] for ep in row]
                                     for row in eps], dt)
    r = field(lambda s: s.reward, np.float32)
    valid = field(lambda s: s.valid, bool)
    applied = field(lambda s: s.applied, np.float32)
    final = np.array([[ep.final_reward for ep in row] for row in eps], np.float32)
    target = advantages_lib.target_advantages(
        r, final, mode=self.target_mode, gamma=self.gamma, beta=self.beta, valid=valid,
        scale=self.scale, baseline=self.baseline)
    delta = np.asarray(correction_lib.correction_advantages(applied, target), np.float32)
    target = np.asarray(target, np.float32)
    made = 0
    for e, ep, d_row, t_row in zip(sum(ids, []), sum(eps, []), delta.reshape(-1, self.num_stages),
                                   target.reshape(-1, self.num_stages)):
      seg_ids, seg_adv, kinds = [], [], []
      for k, s in enumerate(ep.segments):
        if not s.valid:
          continue
        had_provisional = s.applied != 0.0
        if had_provisional:
          if np.sign(t_row[k]) != np.sign(s.applied):
            self.counters["sign_reversals"] += 1
          if not self.correction:
            continue
        if self.skip_zero_advantage and d_row[k] == 0.0:
          continue
        if had_provisional:
          self.counters["corrections"] += 1
        seg_ids.append(k)
        seg_adv.append(float(d_row[k]))
        kinds.append("correction" if had_provisional else "final")
      if not seg_ids:
        continue
      kind = "correction" if "correction" in kinds else "final"
      if self.pack_corrections and self._chains(ep, seg_ids):
        self._ready.append(self._packed_item(kind, e, ep, seg_ids, seg_adv))
        made += 1
      else:
        for k, a, kd in zip(seg_ids, seg_adv, kinds):
          self._ready.append(self._segment_item(kd, e, k, ep.segments[k], a))
          made += 1
    self.counters["correction_items"] += made
    self._enforce_capacity()
    return made

  @staticmethod
  def _chains(ep: _Episode, seg_ids: list[int]) -> bool:
    """True when each used segment's row is a prefix of the last used segment's row."""
    last = ep.segments[seg_ids[-1]].tokens
    for k in seg_ids[:-1]:
      t = ep.segments[k].tokens
      if t.shape[0] > last.shape[0] or not np.array_equal(t, last[:t.shape[0]]):
        return False
      # Later segments must not claim this segment's loss tokens.
      for j in seg_ids:
        if j > k and np.any(ep.segments[j].loss_mask[:t.shape[0]] & ep.segments[k].loss_mask):
          return False
    return True

  @staticmethod
  def _segment_item(kind, episode, stage, s: Segment, adv: float) -> Item:
    return Item(kind, s.tokens, s.loss_mask, s.behaviour_logprobs,
                np.where(s.loss_mask, 0, -1).astype(np.int32),
                np.array([episode]), np.array([stage]), np.array([s.version]),
                np.array([adv], np.float32))

  @staticmethod
  def _packed_item(kind, episode, ep: _Episode, seg_ids, seg_adv) -> Item:
    last = ep.segments[seg_ids[-1]]
    n = last.tokens.shape[0]
    mask = np.zeros(n, bool)
    blp = np.zeros(n, np.float32)
    owner = np.full(n, -1, np.int32)
    for j, k in enumerate(seg_ids):
      s = ep.segments[k]
      span = s.tokens.shape[0]
      mask[:span] |= s.loss_mask
      blp[:span] = np.where(s.loss_mask, s.behaviour_logprobs, blp[:span])
      owner[:span] = np.where(s.loss_mask, j, owner[:span])
    return Item(kind, last.tokens, mask, blp, owner,
                np.full(len(seg_ids), episode), np.array(seg_ids),
                np.array([ep.segments[k].version for k in seg_ids]),
                np.array(seg_adv, np.float32))

  def _record_applied(self, item: Item, weight: float) -> None:
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

  def take(self, max_rows: int, current_version: int, buckets: Sequence[int]) -> Optional[Batch]:
    """Pops up to `max_rows` ready items into a fixed-shape batch `[max_rows, T]`.

    The bucket `T` is the smallest of `buckets` that holds the oldest ready item; the oldest
    items that fit in `T` fill the batch (FIFO otherwise). Staleness is judged against
    `current_version`: segments whose weight is 0 are masked out (and counted as
    `stale_dropped_segments`), others have their weight folded into their advantage (counted as
    `stale_downweighted_segments` when below 1). Items left with no loss token are discarded.

    Args:
      max_rows: N, rows of the batch (>= 1).
      current_version: the learner's policy version now.
      buckets: increasing allowed row lengths.

    Returns:
      A `Batch`, or None when no item with a loss token is ready.

    Raises:
      ValueError: `max_rows < 1`, empty `buckets`, or an item longer than every bucket.
    """
    if max_rows < 1:
      raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    buckets = sorted(int(b) for b in buckets)
    if not buckets:
      raise ValueError("buckets must not be empty")
    stats = collections.Counter()
    chosen: list[tuple[Item, np.ndarray]] = []
    bucket = None
    i = 0
    while i < len(self._ready) and len(chosen) < max_rows:
      item = self._ready[i]
      if bucket is None:
        fits = [b for b in buckets if b >= item.length]
        if not fits:
          raise ValueError(f"a ready item has {item.length} tokens, more than the largest "
                           f"bucket {buckets[-1]}")
        bucket = fits[0]
      if item.length > bucket:
        i += 1
        continue
      del self._ready[i]
      w = np.asarray(correction_lib.staleness_weights(
          item.seg_version, current_version, max_staleness=self.max_staleness,
          mode=self.staleness_mode), np.float32)
      stats["stale_dropped_segments"] += int(np.sum(w == 0.0))
      stats["stale_downweighted_segments"] += int(np.sum((w > 0.0) & (w < 1.0)))
      stats["staleness_sum"] += float(np.sum(current_version - item.seg_version))
      stats["segments"] += item.num_segments
      if item.kind == "provisional":
        self._record_applied(item, float(w[0]))
      if np.all(w == 0.0):
        continue
      chosen.append((item, w))
    self.counters.update({k: v for k, v in stats.items() if k.startswith("stale_")})
    if not chosen:
      return None
    n, t = int(max_rows), int(bucket)
    tokens = np.zeros((n, t), np.int32)
    mask = np.zeros((n, t), bool)
    blp = np.zeros((n, t), np.float32)
    adv = np.zeros((n, t), np.float32)
    weights = np.zeros(n, np.float32)
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
    stats["loss_tokens"] = int(mask.sum())
    stats["padding_fraction"] = 1.0 - float(mask.sum()) / float(n * t)
    return Batch(tokens, mask, blp, adv, weights, kinds, segments, dict(stats))

  # ------------------------------------------------------------------ state

  def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The whole state as `(arrays, meta)`: flat numpy arrays and a JSON-serialisable dict.

    Pending episodes (with their provisional advantages, i.e. pending corrections), ready items
    in order, and counters are all included; `load_state_dict` restores them exactly.
    """
    rows = []  # (tokens, mask, blp, owner) per stored row, in a fixed order
    episodes_meta, items_meta = [], []
    for e, ep in self._episodes.items():
      segs = []
      for s in ep.segments:
        if s is None:
          segs.append(None)
          continue
        rows.append((s.tokens, s.loss_mask, s.behaviour_logprobs,
                     np.full(s.tokens.shape, -1, np.int32)))
        segs.append([len(rows) - 1, s.version, s.reward, s.valid, s.applied])
      episodes_meta.append([e, ep.group, ep.member, ep.final_reward, segs])
    for item in self._ready:
      rows.append((item.tokens, item.loss_mask, item.behaviour_logprobs, item.token_segment))
      items_meta.append([item.kind, len(rows) - 1, item.seg_episode.tolist(),
                         item.seg_stage.tolist(), item.seg_version.tolist(),
                         [float(a) for a in item.seg_advantage]])
    lengths = np.array([r[0].shape[0] for r in rows], np.int64)
    cat = lambda j, dt: (np.concatenate([r[j] for r in rows]).astype(dt) if rows
                         else np.zeros((0,), dt))
    arrays = {
        "lengths": lengths,
        "tokens": cat(0, np.int32),
        "loss_mask": cat(1, np.bool_),
        "behaviour_logprobs": cat(2, np.float32),
        "token_segment": cat(3, np.int32),
    }
    meta = {
        "groups": [[g, grp.episodes, grp.stages_reported, grp.finished]
                   for g, grp in self._groups.items()],
        "episodes": episodes_meta,
        "items": items_meta,
        "counters": dict(self.counters),
    }
    return arrays, meta

  def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Replaces the state with one from `state_dict` (same construction options assumed)."""
    lengths = np.asarray(arrays["lengths"], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    def row(i):
      sl = slice(int(starts[i]), int(starts[i + 1]))
      return (np.asarray(arrays["tokens"][sl], np.int32),
              np.asarray(arrays["loss_mask"][sl], bool),
              np.asarray(arrays["behaviour_logprobs"][sl], np.float32),
              np.asarray(arrays["token_segment"][sl], np.int32))
    self._groups = {int(g): _Group([int(e) for e in eps], [int(c) for c in rep], int(fin))
                    for g, eps, rep, fin in meta["groups"]}
    self._episodes = {}
    for e, g, member, final, segs in meta["episodes"]:
      segments = []
      for s in segs:
        if s is None:
          segments.append(None)
          continue
        idx, version, reward, ok, applied = s
        t, m, b, _ = row(idx)
        segments.append(Segment(t, m, b, int(version), float(reward), bool(ok), float(applied)))
      self._episodes[int(e)] = _Episode(int(g), int(member), segments,
                                        None if final is None else float(final))
    self._ready = collections.deque()
    for kind, idx, seg_e, seg_s, seg_v, seg_a in meta["items"]:
      t, m, b, owner = row(idx)
      self._ready.append(Item(kind, t, m, b, owner, np.array(seg_e, np.int64),
                              np.array(seg_s, np.int64), np.array(seg_v, np.int64),
                              np.array(seg_a, np.float32)))
    self.counters = collections.Counter({k: v for k, v in meta["counters"].items()})
