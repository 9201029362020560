"""Retroactive correction of provisional stage updates (docs/design.md §1).

A segment updated with provisional advantage `Â` is later updated again with
`Δ = A* − Â` once the target `A*` is known. The clipped surrogate's gradient is linear in the
advantage at an unchanged policy, so the two updates sum to the update `A*` asks for. The
correction is importance-weighted against the behaviour policy by `losses.policy_loss`; segments
sampled too many policy versions ago are dropped or down-weighted here, bounding the staleness of
off-policy corrections (as in asynchronous RL systems, e.g. AReaL, Fu et al., 2025).
"""

import jax
import jax.numpy as jnp

from agentic_grpo.core import types as core_types

STALENESS_MODES = ("drop", "linear")


def correction_advantages(provisional: jax.Array, target: jax.Array) -> jax.Array:
  """`Δ = A* − Â`: the advantage of a correction update.

  Args:
    provisional: `[...]` float32, the advantage `Â` already applied to each segment.
    target: `[...]` float32 of the same shape, the target advantage `A*`.

  Returns:
    float32 array of the common shape.

  Raises:
    ValueError: when the shapes differ.
  """
  provisional = jnp.asarray(provisional)
  target = jnp.asarray(target)
  if provisional.shape != target.shape:
    raise ValueError(f"provisional and target must have the same shape, got "
                     f"{tuple(provisional.shape)} and {tuple(target.shape)}")
  return target.astype(jnp.float32) - provisional.astype(jnp.float32)


def staleness_weights(
    segment_versions: jax.Array,
    current_version,
    *,
    max_staleness: int,
    mode: str = "drop",
) -> jax.Array:
  """Per-segment weight from its staleness `current_version − segment_version`.

  * `drop`: 1 while staleness <= `max_staleness`, else 0.
  * `linear`: `1 − staleness / (max_staleness + 1)`, i.e. 1 when fresh, falling linearly, 0 once
    staleness exceeds `max_staleness`.

  A segment from a version newer than `current_version` (negative staleness) cannot happen in a
  correct run; it is given weight 0 so it never trains. Versions are compared, never subtracted
  unchecked, so no integer overflow can turn a far-future or far-past version into a fresh one
  (for `current_version >= 0`, which learner steps are); the weights are always finite.

  Args:
    segment_versions: `[N]` int, the policy version (learner step) that sampled each segment.
    current_version: scalar int, the learner's version now.
    max_staleness: int in [0, 2^31).
    mode: `"drop"` or `"linear"`.

  Returns:
    `[N]` float32 weights in [0, 1].

  Raises:
    ValueError: for an unknown `mode`, a negative `max_staleness`, or non-integer versions.
  """
  core_types.check_choice("mode", mode, STALENESS_MODES)
  if int(max_staleness) != max_staleness or not 0 <= max_staleness < 2**31:
    raise ValueError(f"max_staleness must be an int in [0, 2^31), got {max_staleness!r}")
  segment_versions = jnp.asarray(segment_versions)
  if not jnp.issubdtype(segment_versions.dtype, jnp.integer):
    raise ValueError(f"segment_versions must be integers, got dtype {segment_versions.dtype}")
  current = jnp.asarray(current_version, segment_versions.dtype)
  # `current - max_staleness` cannot overflow for current >= 0; nor can `current - version` on
  # the fresh entries, where it lies in [0, max_staleness].
  fresh_enough = (segment_versions <= current) & (segment_versions >= current - max_staleness)
  if mode == "drop":
    return fresh_enough.astype(jnp.float32)
  staleness = jnp.where(fresh_enough, current - segment_versions, 0).astype(jnp.float32)
  return jnp.where(fresh_enough, 1.0 - staleness / (max_staleness + 1.0), 0.0)
