"""Learner state and the optimizer: `TrainState`, `make_optimizer` (AdamW inside
`optax.apply_if_finite`), `init_state`, and the guard against a run of skipped updates."""

import functools
from typing import Any, Mapping, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import optax

from agentic_grpo import config as config_lib

@flax.struct.dataclass
class TrainState:
  """Learner state, a pytree.

  Attributes:
    params: model parameters (`nnx.State`).
    opt_state: optax state (includes the non-finite counters of `optax.apply_if_finite`).
    step: int32 scalar, updates applied so far (the policy version).
    rng: uint32 `[2]` raw PRNG key, split on every step.
  """
  params: Any
  opt_state: Any
  step: jax.Array
  rng: jax.Array


@functools.lru_cache(maxsize=32)
def make_optimizer(optim: config_lib.OptimSection, *, learning_rate: Optional[float] = None,
                   warmup_steps: Optional[int] = None, decay_steps: int = 0,
                   final_lr_fraction: float = 1.0) -> optax.GradientTransformation:
  """AdamW with linear warm-up and clipping, skipping non-finite updates.

  Cached: equal arguments return the same object, so that the jitted steps built on it are
  reused (no recompilation) by later runs in the same process.

  Args:
    optim: optimizer section of the config.
    learning_rate: overrides `optim.learning_rate` (the warm-start uses its own).
    warmup_steps: overrides `optim.warmup_steps`.
    decay_steps: if > 0, a cosine decay (Loshchilov & Hutter, 2017) from the peak at the end
      of the warm-up to `final_lr_fraction * learning_rate` at `decay_steps`; else constant.
    final_lr_fraction: see `decay_steps`.
  """
  lr = optim.learning_rate if learning_rate is None else learning_rate
  warmup = optim.warmup_steps if warmup_steps is None else warmup_steps
  if decay_steps > 0:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=lr / max(warmup, 1), peak_value=lr, warmup_steps=warmup,
        decay_steps=max(decay_steps, warmup + 1), end_value=final_lr_fraction * lr)
  elif warmup > 0:
    # Linear warm-up from lr / warmup (the first update is not wasted), then constant.
    schedule = optax.linear_schedule(lr / warmup, lr, warmup)
  else:
    schedule = optax.constant_schedule(lr)
  parts = []
  if optim.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(optim.grad_clip))
  parts.append(optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                           weight_decay=optim.weight_decay))
  return optax.apply_if_finite(optax.chain(*parts), optim.max_consecutive_nonfinite)


def init_state(params, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
  """A fresh `TrainState` at step 0."""
  return TrainState(params=params, opt_state=optimizer.init(params),
                    step=jnp.zeros((), jnp.int32),
                    rng=jax.random.key_data(jax.random.key(seed)).astype(jnp.uint32))


def nonfinite_count(state: TrainState) -> int:
  """Updates skipped so far because their gradients were not finite."""
  return int(state.opt_state.total_notfinite)


class NonFiniteUpdatesError(RuntimeError):
  """Too many consecutive updates were skipped because their gradients were not finite."""


def check_skipped_updates(metrics: Sequence[Mapping[str, Any]], limit: int, step: int) -> None:
  """Raises once `limit` consecutive updates have been skipped as non-finite.

  Args:
    metrics: host copies of the update metrics of the steps since the last check, in order
      (each has `nonfinite_consecutive`: the optimizer's count of consecutive skipped updates).
    limit: `rl.max_skipped_updates`; 0 never raises.
    step: the step of the last entry of `metrics` (for the message).

  Raises:
    NonFiniteUpdatesError: if any entry's consecutive count reached `limit`.
  """
  if not limit:
    return
  counts = [int(m["nonfinite_consecutive"]) for m in metrics]
  if counts and max(counts) >= limit:
    raise NonFiniteUpdatesError(
        f"{max(counts)} consecutive updates were skipped because their gradients were not "
        f"finite (by step {step}; rl.max_skipped_updates={limit}): the run is training on "
        f"nothing. Look for non-finite advantages, log-probs or parameters, or lower the "
        f"learning rate.")
