"""The replay's credit math, one jitted call per batch of groups (or per learner batch).

The replay readies items for groups that complete a stage or finish (`replay.credit`) and judges
staleness when the learner takes a batch (`replay.batching`). Each of those is one call here, a
jitted composition of `core.advantages` and `core.correction`, instead of their dozens of eager
operations:

* `stage_advantages`: the provisional advantages of one stage of B groups;
* `outcome_credit`: the targets `A*` and corrections `Δ = A* − Â_applied` of B finished groups;
* `staleness_table`: the staleness weights of a batch's distinct policy versions;
* `tied_groups`: which of B groups' rewards tie (no learning signal), for the agent loop's
  `signal/...` metrics.

Group counts, stage counts and version counts are padded to powers of two (padding groups and
stages are invalid, so they touch no statistic of a real group or earlier stage; padding versions
are the current one), and the stage is a traced argument, so each call compiles for a few shapes
only: `stage_advantages` once for every stage of a workflow of up to four. The numbers are those
of the eager functions (`tests/batched_test.py`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import advantages as advantages_lib
from agentic_grpo.core import correction as correction_lib


# Stage counts of `stage_advantages`'s rewards are padded to a power of two, at least this.
_MIN_STAGES = 4


def _pow2(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def _pad_groups(x: np.ndarray, b: int, value) -> np.ndarray:
  """`[B, ...]` to `[b, ...]`, new rows filled with `value`."""
  out = np.full((b,) + x.shape[1:], value, x.dtype)
  out[:x.shape[0]] = x
  return out


@functools.partial(jax.jit, static_argnames=("scale", "baseline", "negative_weight"))
def _stage_advantages(rewards, valid, stage, *, scale, baseline, negative_weight):
  # `stage` traced: one program for every stage of a shape (the stages' advantages are
  # computed together either way).
  adv = jnp.take(advantages_lib.provisional_advantages(rewards, valid, scale=scale,
                                                       baseline=baseline), stage, axis=-1)
  return advantages_lib.weight_negatives(adv, negative_weight)


def stage_advantages(stage_rewards: np.ndarray, valid: np.ndarray, stage: int, *, scale: str,
                     baseline: str, negative_weight: float = 1.0) -> np.ndarray:
  """`core.advantages.provisional_advantages(...)[..., stage]`, negatives weighted by
  `negative_weight` (`core.advantages.weight_negatives`), in one jitted call.

  Args:
    stage_rewards: `[B, G, K]` float32 rewards of stages `0..K-1` (`K > stage`; later stages
      than `stage` are ignored).
    valid: `[B, G, K]` bool.
    stage: the stage whose advantages are returned.
    scale, baseline: as in `provisional_advantages`.
    negative_weight: as in `weight_negatives` (1: unchanged).

  Returns:
    `[B, G]` float32 NumPy.

  Raises:
    ValueError: shapes that differ or are not `[B, G, K]` with `K > stage`, or an unknown option.
  """
  stage_rewards = np.asarray(stage_rewards, np.float32)
  valid = np.asarray(valid, bool)
  if stage_rewards.ndim != 3 or valid.shape != stage_rewards.shape:
    raise ValueError(f"stage_rewards and valid must both be [B, G, K], got "
                     f"{stage_rewards.shape} and {valid.shape}")
  if not 0 <= stage < stage_rewards.shape[2]:
    raise ValueError(f"stage must be in [0, {stage_rewards.shape[2]}), got {stage}")
  b, _, k = stage_rewards.shape
  # Stages past `stage` are padding (invalid, reward 0), which no earlier stage's advantage
  # reads: every stage of a workflow of up to `_MIN_STAGES` stages shares one program.
  pad = ((0, 0), (0, 0), (0, max(_MIN_STAGES, _pow2(k)) - k))
  out = _stage_advantages(_pad_groups(np.pad(stage_rewards, pad), _pow2(b), 0.0),
                          _pad_groups(np.pad(valid, pad), _pow2(b), False), np.int32(stage),
                          scale=scale, baseline=baseline,
                          negative_weight=float(negative_weight))
  return np.asarray(out)[:b]


@functools.partial(jax.jit, static_argnames=("mode", "gamma", "beta", "scale", "baseline",
                                             "negative_weight"))
def _outcome_credit(rewards, final, valid, applied, *, mode, gamma, beta, scale, baseline,
                    negative_weight):
  target = advantages_lib.target_advantages(rewards, final, mode=mode, gamma=gamma, beta=beta,
                                            valid=valid, scale=scale, baseline=baseline)
  target = advantages_lib.weight_negatives(target, negative_weight)
  return target, correction_lib.correction_advantages(applied, target)


def outcome_credit(stage_rewards: np.ndarray, final_rewards: np.ndarray, valid: np.ndarray,
                   applied: np.ndarray, *, mode: str, gamma: float, beta: float, scale: str,
                   baseline: str, negative_weight: float = 1.0
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Targets (`core.advantages.target_advantages`, negatives weighted by `negative_weight`:
  `weight_negatives`) and corrections (`core.correction.correction_advantages`) of finished
  groups, in one jitted call.

  Args:
    stage_rewards: `[B, G, S]` float32.
    final_rewards: `[B, G]` float32.
    valid: `[B, G, S]` bool.
    applied: `[B, G, S]` float32, the provisional advantage each segment received (0 if none;
      already weighted, `stage_advantages`).
    mode, gamma, beta, scale, baseline: as in `target_advantages`.
    negative_weight: as in `weight_negatives` (1: unchanged).

  Returns:
    `(target, delta)`, both `[B, G, S]` float32 NumPy.

  Raises:
    ValueError: mismatched shapes or an unknown option (from the `core` functions).
  """
  stage_rewards = np.asarray(stage_rewards, np.float32)
  applied = np.asarray(applied, np.float32)
  valid = np.asarray(valid, bool)
  final_rewards = np.asarray(final_rewards, np.float32)
  if not stage_rewards.shape == valid.shape == applied.shape or stage_rewards.ndim != 3:
    raise ValueError(f"stage_rewards, valid and applied must be [B, G, S] alike, got "
                     f"{stage_rewards.shape}, {valid.shape}, {applied.shape}")
  b = stage_rewards.shape[0]
  p = _pow2(b)
  target, delta = _outcome_credit(
      _pad_groups(stage_rewards, p, 0.0), _pad_groups(final_rewards, p, 0.0),
      _pad_groups(valid, p, False), _pad_groups(applied, p, 0.0), mode=mode,
      gamma=float(gamma), beta=float(beta), scale=scale, baseline=baseline,
      negative_weight=float(negative_weight))
  return np.asarray(target)[:b], np.asarray(delta)[:b]


@functools.partial(jax.jit, static_argnames=("max_staleness", "mode"))
def _staleness(versions, current, *, max_staleness, mode):
  return correction_lib.staleness_weights(versions, current, max_staleness=max_staleness,
                                          mode=mode)


def staleness_table(versions, current_version: int, *, max_staleness: int,
                    mode: str) -> dict[int, float]:
  """`{version: core.correction.staleness_weights weight}` for each distinct version, in one
  jitted call (the distinct versions padded to a power of two with `current_version`).

  Args:
    versions: iterable of int policy versions (repeats allowed).
    current_version: the learner's version now (>= 0).
    max_staleness, mode: as in `staleness_weights`.

  Raises:
    ValueError: an unknown mode or a bad `max_staleness` (from `staleness_weights`).
  """
  distinct = sorted({int(v) for v in versions})
  if not distinct:
    return {}
  padded = np.full(_pow2(len(distinct)), current_version, np.int64)
  padded[:len(distinct)] = distinct
  w = np.asarray(_staleness(padded, np.int64(current_version), max_staleness=max_staleness,
                            mode=mode), np.float32)
  return dict(zip(distinct, w[:len(distinct)]))


@jax.jit
def _tied_groups(rewards, valid):
  return advantages_lib.tied_groups(rewards, valid)


def tied_groups(rewards: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """`core.advantages.tied_groups` of B groups in one jitted call.

  Args:
    rewards: `[B, G]` float32 rewards (one stage's, or the final ones).
    valid: `[B, G]` bool; False excludes a member.

  Returns:
    `[B]` bool NumPy: True where the group's valid rewards are all equal (or fewer than two
    members are valid), i.e. its group-relative advantages are all 0.

  Raises:
    ValueError: shapes that differ or are not `[B, G]`.
  """
  rewards = np.asarray(rewards, np.float32)
  valid = np.asarray(valid, bool)
  if rewards.ndim != 2 or valid.shape != rewards.shape:
    raise ValueError(f"rewards and valid must both be [B, G], got {rewards.shape} and "
                     f"{valid.shape}")
  b = rewards.shape[0]
  out = _tied_groups(_pad_groups(rewards, _pow2(b), 0.0), _pad_groups(valid, _pow2(b), False))
  return np.asarray(out)[:b]
