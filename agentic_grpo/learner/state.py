"""Learner state and the optimizer: `TrainState`, `make_optimizer` (AdamW inside
`optax.apply_if_finite`), `init_state`, and the guard against a run of skipped updates.

Mixed precision: parameters stored in a low-precision float (`model.param_dtype='bfloat16'`)
get a float32 master copy (`TrainState.master`), and the optimizer state is built from the
master, so that the AdamW moments are float32 too. Each update adds to the master, and the
parameters are the master rounded to their dtype (Micikevicius et al., 2018, "Mixed Precision
Training"): updates smaller than the parameters' rounding step accumulate in the master instead
of vanishing. With float32 parameters there is no master (`master is None`).
"""

import functools
from typing import Any, Mapping, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import optax

from agentic_grpo import exit_codes
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import layout as checkpoint_layout
from agentic_grpo.learner import sections

@flax.struct.dataclass
class TrainState:
  """Learner state, a pytree.

  Attributes:
    params: model parameters (`nnx.State`).
    opt_state: optax state (includes the non-finite counters of `optax.apply_if_finite`).
    step: int32 scalar, updates applied so far (the policy version).
    rng: uint32 `[2]` raw PRNG key, split on every step.
    master: float32 copy of `params` (same tree, shapes and shardings) that the optimizer
      updates when some parameter is stored in a lower-precision float; `params` is then
      `master` cast to each parameter's dtype. None when every parameter is float32.
  """
  params: Any
  opt_state: Any
  step: jax.Array
  rng: jax.Array
  master: Any = None


# Fields of `TrainState` that checkpoints of earlier versions lack, and how a restore rebuilds
# them (`Checkpointer.restore(..., derivations=STATE_DERIVATIONS)`).
STATE_DERIVATIONS = (
    checkpoint_layout.Derivation(
        "master", "the float32 master copy, absent from checkpoints written before it existed: "
        "the saved low-precision params cast to float32 (exact)", source="params"),
)


@functools.lru_cache(maxsize=32)
def make_optimizer(optim: sections.OptimSection, *, learning_rate: Optional[float] = None,
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


def needs_master(params) -> bool:
  """True when some floating-point leaf of `params` is not float32 (e.g. bfloat16)."""
  return any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.float32
             for x in jax.tree.leaves(params))


def to_master(params):
  """`params` with every floating-point leaf cast to float32 (the master copy's values)."""
  return jax.tree.map(
      lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def from_master(master, params):
  """`master` cast leaf by leaf to the dtypes of `params` (same tree structure)."""
  return jax.tree.map(lambda m, p: m.astype(p.dtype), master, params)


def init_state(params, optimizer: optax.GradientTransformation, seed: int, *,
               master=None) -> TrainState:
  """A fresh `TrainState` at step 0.

  Args:
    params: the model parameters (`nnx.State`), any float dtypes.
    optimizer: from `make_optimizer`; its state is built from the float32 master when there
      is one (so the moments are float32), else from `params`.
    seed: seeds the state's PRNG key.
    master: optional float32 master to carry on (e.g. from the warm-start's state to the RL
      phase's, without rounding it through the parameters' dtype); default: `params` cast to
      float32. Used only when `params` needs a master (`needs_master`).

  Raises:
    ValueError: `master` given whose tree or shapes differ from `params`'.
  """
  if needs_master(params):
    if master is None:
      master = to_master(params)
    elif (jax.tree.structure(master) != jax.tree.structure(params)
          or [m.shape for m in jax.tree.leaves(master)] != [p.shape for p in
                                                            jax.tree.leaves(params)]):
      raise ValueError("master must have the tree structure and shapes of params")
  else:
    master = None
  return TrainState(params=params,
                    opt_state=optimizer.init(params if master is None else master),
                    step=jnp.zeros((), jnp.int32),
                    rng=jax.random.key_data(jax.random.key(seed)).astype(jnp.uint32),
                    master=master)


def abstract_state(abstract_params, optimizer: optax.GradientTransformation,
                   state_shardings) -> TrainState:
  """The `TrainState` that `init_state` would build from parameters shaped like
  `abstract_params`, as `jax.ShapeDtypeStruct`s placed by `state_shardings`
  (`Shardings.state`): a restore target built without allocating a state."""
  plain = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), abstract_params)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      jax.eval_shape(lambda p: init_state(p, optimizer, 0), plain),
                      state_shardings)


def restore_field(ckpt: checkpointer.Checkpointer, step: Optional[int], abstract_params,
                  optimizer: optax.GradientTransformation, state_shardings, *,
                  reference_in_rl: bool, field: str = "params") -> tuple[Any, dict]:
  """One field of a checkpoint's learner state, and the checkpoint's meta: the one path that
  loads a saved policy (evaluation of a checkpoint, export).

  Reads only `field` into an abstract target (`abstract_state`), without first materialising
  a state: the optimizer's moments, the float32 master (unless `field="master"`) and the KL
  reference stay on disk (`Checkpointer.restore(only=...)`), so the caller needs the memory of
  that field alone. Checkpoints of earlier layouts are fitted (`STATE_DERIVATIONS`).

  Args:
    ckpt: the run's checkpoints.
    step: the checkpoint step, or None for the newest intact one.
    abstract_params: the model's parameters as shaped (and sharded) abstract values.
    optimizer: any optimizer of the run (every one has the state structure of the RL phase's).
    state_shardings: `Shardings.state` of the run.
    reference_in_rl: the run keeps a KL reference (`loss.kl_beta > 0`): an RL-phase
      checkpoint then holds it beside the state.
    field: `params` or `master` (a `TrainState` field). `master` of a state that keeps none
      (float32 parameters are their own master) reads `params`.

  Returns:
    `(value, meta)`: the field's tree of `jax.Array`s in `state_shardings`' layout, and the
    checkpoint's meta (`meta["step"]`: its global step).

  Raises:
    FileNotFoundError, checkpointer.CheckpointIntegrityError: as `Checkpointer.restore`.
    ValueError: `field` is neither `params` nor `master`; the checkpoint's tree does not match
      the abstract target (another model shape), naming the checkpoint.
  """
  if field not in ("params", "master"):
    raise ValueError(f"field must be 'params' or 'master', got {field!r}")
  meta = ckpt.read_meta(step)
  with_ref = reference_in_rl and meta["phase"] == "rl"
  state = abstract_state(abstract_params, optimizer, state_shardings)
  if field == "master" and state.master is None:
    field = "params"
  abstract = {"state": state, "ref": abstract_params} if with_ref else {"state": state}
  try:
    restored, _, meta = ckpt.restore(step, abstract, derivations=STATE_DERIVATIONS,
                                     only=checkpointer.state_field(field))
  except ValueError as e:  # Orbax: the saved tree differs from `abstract`.
    raise ValueError(f"checkpoint {step if step is not None else '(newest)'} in "
                     f"{ckpt.directory} does not match the run's config (another model "
                     f"shape?): {e}") from e
  return getattr(restored["state"], field), meta


def nonfinite_count(state: TrainState) -> int:
  """Updates skipped so far because their gradients were not finite."""
  return int(state.opt_state.total_notfinite)


class NonFiniteUpdatesError(RuntimeError):
  """Too many consecutive updates were skipped because their gradients were not finite."""
  exit_code = exit_codes.NO_PROGRESS


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
