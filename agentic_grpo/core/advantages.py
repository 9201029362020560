"""Group-relative advantages: GRPO's normalisation, stage-wise and in hindsight.

GRPO (Shao et al., 2024, "DeepSeekMath", §4.1) samples a *group* of `G` answers per prompt and uses
the group-normalised reward `(r - mean_G r) / std_G r` as the advantage of every token of an answer.
Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training") drops the division by the std.

Agentic GRPO scores every *stage* of an episode. `provisional_advantages` normalises stage rewards
within the group, stage by stage (the advantage applied right after a stage completes);
`target_advantages` gives the advantage each stage should have had once the final reward is
known (docs/design.md §2: modes `outcome`, `return`, `mixed`). Both can subtract a per-stage
baseline first (`stage_baselines`): with `previous_stage`, a stage is credited with what it
changed, not with the score the episode already had when it began.

All functions are pure and jit-able; option strings are static.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from agentic_grpo.core import types as core_types

SCALES = ("std", "none")
TARGET_MODES = ("outcome", "return", "mixed")
BASELINES = ("none", "previous_stage")

# A group whose rewards span less than this many ulps (of the input dtype, relative to the
# rewards' magnitude) counts as all-equal and gets advantage exactly 0.
_EQUAL_ULPS = 8.0


def _check_valid(valid: Optional[jax.Array], shape: tuple[int, ...], name: str = "valid"):
  if valid is None:
    return jnp.ones(shape, dtype=bool)
  if tuple(valid.shape) != tuple(shape):
    raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(valid.shape)}")
  if valid.dtype != jnp.bool_:
    raise ValueError(f"{name} must be bool, got dtype {valid.dtype}")
  return valid


def _check_rewards(rewards) -> jax.Array:
  rewards = jnp.asarray(rewards)
  if rewards.ndim < 1:
    raise ValueError(f"rewards must have a group axis, got shape {tuple(rewards.shape)}")
  if not jnp.issubdtype(rewards.dtype, jnp.floating):
    raise ValueError(f"rewards must be a float array, got dtype {rewards.dtype}")
  return rewards


def tied_groups(rewards: jax.Array, valid: Optional[jax.Array] = None) -> jax.Array:
  """Which groups carry no learning signal: their valid rewards are all equal.

  The degenerate groups of `group_advantages` (which gives them advantage exactly 0): valid
  rewards equal up to a few ulps of the input dtype (relative to their magnitude), a single
  valid member, or none.

  Args:
    rewards: `[..., G]` float (f32, bf16 or f16); the group is the last axis.
    valid: optional `[..., G]` bool; False excludes a member.

  Returns:
    `[...]` bool, True for a tied group (no gradient).

  Raises:
    ValueError: for a non-float or scalar `rewards`, or a `valid` of another shape or dtype.
  """
  rewards = _check_rewards(rewards)
  return _degenerate(rewards, _check_valid(valid, rewards.shape))[..., 0]


def _degenerate(rewards: jax.Array, valid: jax.Array) -> jax.Array:
  """`[..., 1]` bool: `tied_groups` with the group axis kept (inputs checked)."""
  ulp = float(jnp.finfo(rewards.dtype).eps)
  r = rewards.astype(jnp.float32)
  count = valid.sum(-1, keepdims=True)
  big = jnp.finfo(jnp.float32).max
  r_max = jnp.where(valid, r, -big).max(-1, keepdims=True)
  r_min = jnp.where(valid, r, big).min(-1, keepdims=True)
  magnitude = jnp.maximum(jnp.maximum(jnp.abs(r_max), jnp.abs(r_min)), 1.0)
  spread = jax.lax.stop_gradient(r_max - r_min)
  return (count < 2) | (spread <= _EQUAL_ULPS * ulp * jax.lax.stop_gradient(magnitude))


def group_advantages(
    rewards: jax.Array,
    valid: Optional[jax.Array] = None,
    *,
    scale: str = "std",
    eps: float = 1e-6,
) -> jax.Array:
  """Group-normalised advantages, the group on the last axis.

  `A[..., i] = (r[..., i] - mean) / (std + eps)` with mean and (population) std over the valid
  members of the group (GRPO, Shao et al., 2024), or `r - mean` with `scale="none"` (Dr. GRPO,
  Liu et al., 2025).

  Degenerate groups (`tied_groups`) get advantage exactly 0, with a finite (zero) gradient: groups whose valid
  rewards are equal up to a few ulps of the input dtype (so `0.1 + 0.2` and `0.3` count as equal,
  in f32 and bf16 alike), groups with a single valid member, and groups with no valid member.
  Invalid members get advantage 0 and do not enter the statistics.

  Args:
    rewards: `[..., G]` float (f32, bf16 or f16); the group is the last axis.
    valid: optional `[..., G]` bool; False excludes a member.
    scale: `"std"` (GRPO) or `"none"` (Dr. GRPO).
    eps: added to the std before dividing; must be > 0 with `scale="std"`.

  Returns:
    `[..., G]` float32 advantages.

  Raises:
    ValueError: for a non-float or scalar `rewards`, a `valid` of another shape or dtype, an
      unknown `scale`, or a non-positive `eps`.
  """
  core_types.check_choice("scale", scale, SCALES)
  rewards = _check_rewards(rewards)
  if scale == "std" and not eps > 0:
    raise ValueError(f"eps must be > 0, got {eps}")
  valid = _check_valid(valid, rewards.shape)

  r = rewards.astype(jnp.float32)
  w = valid.astype(jnp.float32)
  safe_count = jnp.maximum(w.sum(-1, keepdims=True), 1.0)
  mean = (r * w).sum(-1, keepdims=True) / safe_count
  centered = jnp.where(valid, r - mean, 0.0)
  degenerate = _degenerate(rewards, valid)

  if scale == "std":
    var = (centered**2).sum(-1, keepdims=True) / safe_count
    # Double-where: sqrt's gradient at 0 is inf, so degenerate groups never see var == 0.
    safe_var = jnp.where(degenerate, 1.0, var)
    adv = centered / (jnp.sqrt(safe_var) + eps)
  else:
    adv = centered
  return jnp.where(degenerate | ~valid, 0.0, adv)


def _check_staged(stage_rewards, final_rewards, valid):
  stage_rewards = jnp.asarray(stage_rewards)
  if final_rewards is not None:
    final_rewards = jnp.asarray(final_rewards)
  if stage_rewards.ndim != 3:
    raise ValueError(f"stage_rewards must be [B, G, S], got shape {tuple(stage_rewards.shape)}")
  if final_rewards is not None and tuple(final_rewards.shape) != tuple(stage_rewards.shape[:2]):
    raise ValueError(f"final_rewards must be [B, G] = {tuple(stage_rewards.shape[:2])}, "
                     f"got shape {tuple(final_rewards.shape)}")
  if valid is not None and tuple(valid.shape) not in (tuple(stage_rewards.shape),
                                                      tuple(stage_rewards.shape[:2])):
    raise ValueError(f"valid must be [B, G, S] or [B, G], got shape {tuple(valid.shape)}")
  if valid is None:
    valid = jnp.ones(stage_rewards.shape, dtype=bool)
  elif valid.ndim == 2:
    valid = jnp.broadcast_to(valid[..., None], stage_rewards.shape)
  return stage_rewards, final_rewards, _check_valid(valid, stage_rewards.shape)


def _per_stage(values: jax.Array, valid: jax.Array, scale: str) -> jax.Array:
  """Normalises `[B, G, S]` within the group (axis 1) for each stage."""
  adv = group_advantages(jnp.swapaxes(values, 1, 2), jnp.swapaxes(valid, 1, 2), scale=scale)
  return jnp.swapaxes(adv, 1, 2)


def weight_negatives(advantages: jax.Array, negative_weight: float) -> jax.Array:
  """`A if A > 0 else w · A`: negative advantages scaled by `w`, positive ones kept.

  Reinforcing a sampled answer raises its probability and takes mass from every other answer
  in proportion to theirs, most from the policy's mode; pushing a failed answer down spreads
  its mass over all the others in proportion to theirs, most to the long tail. With few
  successes per group the two kinds of update carry equal weight (group-normalised
  advantages sum to zero), and a policy whose mode is a wrong habit loses it mostly to other
  wrong answers. `w < 1` tilts learning towards the positive samples: the weighted REINFORCE
  of Zhu et al., 2025 ("The Surprising Effectiveness of Negative Reinforcement in LLM
  Reasoning", §5, which weights the *positive* term instead to keep pass@k; here the target
  is pass@1). `w = 1` is GRPO's advantage unchanged.

  Applied to provisional and target advantages alike (`replay.credit`), so that a provisional
  update and its correction still sum to the weighted target's update. A `mixed` target is
  weighted as a whole (`norm(R) + β·Â`), not term by term.

  Args:
    advantages: `[...]` float.
    negative_weight: `w >= 0` (a Python float; static under `jax.jit`).

  Returns:
    float32 array of the same shape.

  Raises:
    ValueError: `negative_weight` below 0, infinite or NaN.
  """
  if isinstance(negative_weight, (int, float)) and not 0 <= negative_weight < float("inf"):
    raise ValueError(f"negative_weight must be finite and >= 0, got {negative_weight}")
  a = jnp.asarray(advantages, jnp.float32)
  return jnp.where(a < 0, a * jnp.float32(negative_weight), a)


def stage_baselines(stage_rewards: jax.Array, valid: jax.Array, baseline: str) -> jax.Array:
  """Per-member, per-stage baselines `b[i, k]`, known before stage k acts.

  * `none`: 0.
  * `previous_stage`: the reward of the member's stage k-1 (0 for the first stage, or when
    stage k-1 was skipped): a stage is credited with what it added to the score the episode
    already had. Potential-based shaping (Ng, Harada & Russell, 1999) with the previous stage's
    score as the potential; as a function of the state before stage k acts, the baseline leaves
    the policy gradient unbiased (Williams, 1992; Sutton et al., 2000). Example, stages
    code -> debug scored on the public examples: `keep` after passing code gets 0 (it changed
    nothing), a fix +1, breaking passing code -1, instead of every stage sharing the episode's
    outcome.

  Args:
    stage_rewards: `[B, G, S]` float.
    valid: `[B, G, S]` bool; an invalid (skipped) stage counts as reward 0 for the next one.
    baseline: `"none"` or `"previous_stage"`.

  Returns:
    `[B, G, S]` float32.

  Raises:
    ValueError: for an unknown `baseline`.
  """
  core_types.check_choice("baseline", baseline, BASELINES)
  r = jnp.where(valid, stage_rewards.astype(jnp.float32), 0.0)
  if baseline == "none":
    return jnp.zeros_like(r)
  return jnp.concatenate([jnp.zeros_like(r[..., :1]), r[..., :-1]], axis=-1)


def provisional_advantages(
    stage_rewards: jax.Array,
    valid: Optional[jax.Array] = None,
    *,
    scale: str = "std",
    baseline: str = "none",
) -> jax.Array:
  """Provisional advantages `Â[i, k] = norm_group(r[:, k])[i]` (docs/design.md §1).

  Args:
    stage_rewards: `[B, G, S]` float, reward of stage k of member i, available when stage k of the
      whole group has completed.
    valid: optional `[B, G, S]` (or `[B, G]`) bool; False marks a stage the episode skipped.
    scale: `"std"` or `"none"`, as in `group_advantages`.
    baseline: `"none"` or `"previous_stage"` (`stage_baselines`): normalise `r[:, k] - b[:, k]`.

  Returns:
    `[B, G, S]` float32; 0 where invalid.

  Raises:
    ValueError: for shapes other than the above or an unknown `scale`.
  """
  core_types.check_choice("scale", scale, SCALES)
  stage_rewards, _, valid = _check_staged(stage_rewards, None, valid)
  values = stage_rewards - stage_baselines(stage_rewards, valid, baseline)
  return _per_stage(values, valid, scale)


def discounted_returns(stage_rewards: jax.Array, final_rewards: jax.Array,
                       gamma: float) -> jax.Array:
  """`G[i, k] = Σ_{j≥k} γ^{j−k} r[i, j] + γ^{S−k} R[i]` for `[B, G, S]`, `[B, G]` inputs."""
  def step(carry, r_k):
    g = r_k + gamma * carry
    return g, g
  # Scan backwards over stages: G_S = R, G_k = r_k + γ G_{k+1}.
  _, returns = jax.lax.scan(step, final_rewards.astype(jnp.float32),
                            jnp.moveaxis(stage_rewards.astype(jnp.float32), -1, 0), reverse=True)
  return jnp.moveaxis(returns, 0, -1)


def target_advantages(
    stage_rewards: jax.Array,
    final_rewards: jax.Array,
    *,
    mode: str,
    gamma: float = 1.0,
    beta: float = 0.0,
    valid: Optional[jax.Array] = None,
    scale: str = "std",
    baseline: str = "none",
) -> jax.Array:
  """Target advantages `A*[i, k]`: what each stage should have received in hindsight.

  Modes (docs/design.md §2):
    * `outcome`: `A*[i, k] = norm_group(R)[i]` for every stage; provisional plus correction
      updates then sum to outcome-only GRPO's update (Shao et al., 2024).
    * `return`: `A*[i, k] = norm_group(G[:, k])[i]` with the discounted return-to-go
      `G[i, k] = Σ_{j≥k} γ^{j−k} r[i, j] + γ^{S−k} R[i]` (stage rewards as shaping terms).
    * `mixed`: `A*[i, k] = norm_group(R)[i] + β · Â[i, k]`, keeping a share of the provisional
      advantage `Â` (see `provisional_advantages`).

  With a `baseline` other than `none`, `R` and `G[:, k]` above become `R - b[:, k]` and
  `G[:, k] - b[:, k]` (`stage_baselines`), normalised per stage, and `Â` is the provisional
  advantage with the same baseline.

  Args:
    stage_rewards: `[B, G, S]` float; a skipped stage holds 0.
    final_rewards: `[B, G]` float, the final (outcome) reward `R`.
    mode: `"outcome"`, `"return"` or `"mixed"`.
    gamma: discount over stages for `return`, in [0, 1].
    beta: weight of `Â` for `mixed`.
    valid: optional `[B, G, S]` or `[B, G]` bool. A member with no valid stage is left out of the
      outcome statistics; invalid stages get target 0.
    scale: `"std"` or `"none"`, as in `group_advantages`.
    baseline: `"none"` or `"previous_stage"`, see `stage_baselines`.

  Returns:
    `[B, G, S]` float32.

  Raises:
    ValueError: for an unknown `mode`/`scale`/`baseline`, `gamma` outside [0, 1], or mismatched
      shapes.
  """
  core_types.check_choice("mode", mode, TARGET_MODES)
  core_types.check_choice("scale", scale, SCALES)
  if isinstance(gamma, (int, float)) and not 0.0 <= gamma <= 1.0:  # Traced values pass.
    raise ValueError(f"gamma must be in [0, 1], got {gamma}")
  stage_rewards, final_rewards, valid = _check_staged(stage_rewards, final_rewards, valid)
  b = stage_baselines(stage_rewards, valid, baseline)
  if mode == "return":
    returns = discounted_returns(stage_rewards, final_rewards, gamma)
    return _per_stage(returns - b, valid, scale)
  if baseline == "none":
    member_valid = valid.any(-1)
    outcome = group_advantages(final_rewards, member_valid, scale=scale)
    target = jnp.where(valid, outcome[..., None], 0.0)
  else:
    target = _per_stage(final_rewards.astype(jnp.float32)[..., None] - b, valid, scale)
  if mode == "mixed":
    target = target + beta * _per_stage(stage_rewards - b, valid, scale)
  return target
