"""The jitted, donated update steps: `make_update_step` (Agentic GRPO policy update) and
`make_sft_step` (supervised warm-start), micro-batched with token-count weighting.

See the package docstring (`agentic_grpo.learner`) for what each loss term sees.
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_grpo.core import logprobs as logprobs_lib
from agentic_grpo.core import losses as losses_lib
from agentic_grpo.core import packing
from agentic_grpo.core import types as core_types
from agentic_grpo.learner.shardings import Shardings
from agentic_grpo.learner import sections
from agentic_grpo.learner import state as state_lib
from agentic_grpo.learner.state import TrainState
from agentic_grpo.models import transformer

def _positions(tokens):
  return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


def _aligned_logprobs(logits, tokens, transform: core_types.SamplingTransform):
  """`[N, T]` log-probs of `tokens` under `logits [N, T, V]`; entry t scores `tokens[:, t]`."""
  lp = logprobs_lib.token_logprobs(logits[:, :-1], tokens[:, 1:], transform)
  return jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)


def _aligned_entropy(logits, loss_mask, transform: core_types.SamplingTransform):
  """`[N, T]` entropy (nats) of the distribution each token was drawn from, under `transform`:
  entry t is that of `logits[:, t - 1]` (which scored `tokens[:, t]`), 0 at t = 0 and off the
  mask."""
  h = losses_lib.entropy(logprobs_lib.transform_logits(logits[:, :-1], transform),
                         loss_mask[:, 1:])
  return jnp.concatenate([jnp.zeros_like(h[:, :1]), h], axis=1)


def _token_logprobs(graphdef, params, tokens, transform: core_types.SamplingTransform,
                    positions=None, branches=None):
  """`(logprobs [N, T], logits [N, T, V])`, aligned: entry t scores `tokens[:, t]` (0 at a
  row's or a tree's first token), and `logits[:, t]` scores `tokens[:, t + 1]`.

  With `positions` and `branches` (a packed batch, `core.packing`) the forward uses the tree
  mask and the logits come back in that unpacked order (`core.packing.shifted_logits`: the
  first token of a suffix is scored from the prefix's last slot)."""
  if branches is None:
    logits, _ = transformer.apply(graphdef, params, tokens, _positions(tokens))
    return _aligned_logprobs(logits, tokens, transform), logits
  logits, _ = transformer.apply(graphdef, params, tokens, positions, branches=branches)
  logits = packing.shifted_logits(logits, positions, branches)
  # A tree's first token is scored by nothing of its own (`core.packing`): 0, as a row's first.
  lp = jnp.where(packing.is_tree_start(positions, branches), 0.0,
                 _aligned_logprobs(logits, tokens, transform))
  return lp, logits


def _slot_logits(graphdef, params, mb: core_types.UpdateBatch):
  """`[N, L, V]` logits that score the tokens at `mb.loss_slots` (entry l scores
  `tokens[n, loss_slots[n, l]]`): the model's last block and output head at their predictor
  slots only (`core.packing.predictor_slots`; `t - 1` in an unpacked row)."""
  if mb.branches is None:
    positions = _positions(mb.tokens)
    predictors = jnp.maximum(positions - 1, 0)
  else:
    positions = mb.positions
    predictors = packing.predictor_slots(mb.positions, mb.branches)
  query = jnp.take_along_axis(predictors, mb.loss_slots, axis=1)
  logits, _ = transformer.apply(graphdef, params, mb.tokens, positions, branches=mb.branches,
                                query_slots=query)
  return logits


Batch = core_types.UpdateBatch | core_types.SFTBatch


def _split_micro(batch: Batch, m: int) -> Batch:
  """`[N, ...]` fields to `[m, N / m, ...]`."""
  n = batch.tokens.shape[0]
  if n % m:
    raise ValueError(f"batch rows ({n}) must be divisible by micro_batches ({m})")
  return jax.tree.map(lambda v: v.reshape((m, n // m) + v.shape[1:]), batch)


def _accumulate(loss_fn: Callable, params, micro: Batch, aggregation: str,
                max_tokens: Optional[int], num_rows: Optional[int] = None):
  """Gradient of the whole-batch loss from micro-batches (weights `d_b / Σ d_b`); float
  leaves of the gradient are float32. `num_rows`: a micro-batch's rows in the constant
  normaliser (`core.losses.aggregate_denominator`)."""
  denoms = jax.vmap(lambda mk: losses_lib.aggregate_denominator(
      mk, aggregation, max_tokens, num_rows))(micro.loss_mask)
  total = jnp.maximum(denoms.sum(), 1.0)

  def body(carry, xs):
    mb, d = xs
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
    w = jnp.where(d > 0, d / total, 0.0)
    acc_grads, acc_loss, acc_metrics = carry
    acc_grads = jax.tree.map(lambda a, g: a + w * g, acc_grads, grads)
    acc_metrics = jax.tree.map(lambda a, x: a + w * x, acc_metrics, metrics)
    return (acc_grads, acc_loss + w * loss, acc_metrics), None

  # Accumulated in float32 whatever the parameters' dtype (a bf16 sum would lose small terms).
  zeros = state_lib.to_master(jax.tree.map(jnp.zeros_like, params))
  first = jax.tree.map(lambda v: v[0], micro)
  metric_shapes = jax.eval_shape(lambda p, b: loss_fn(p, b)[1], params, first)
  zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
  (grads, loss, metrics), _ = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32),
                                                  zero_metrics), (micro, denoms))
  return loss, metrics, grads


def _apply_updates(state: TrainState, grads, optimizer, loss, metrics):
  """One optimizer step; with a float32 master (`TrainState.master`), the gradients (taken
  through the low-precision parameters) are upcast, the master is updated, and the parameters
  are the new master cast to their dtype."""
  if state.master is None:
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params, master = optax.apply_updates(state.params, updates), None
  else:
    grads = state_lib.to_master(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.master)
    master = optax.apply_updates(state.master, updates)
    params = state_lib.from_master(master, state.params)
  rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0])
  metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads),
                 update_skipped=(~opt_state.last_finite).astype(jnp.float32),
                 nonfinite_consecutive=opt_state.notfinite_count.astype(jnp.float32),
                 nonfinite_total=opt_state.total_notfinite.astype(jnp.float32))
  return TrainState(params, opt_state, state.step + 1, rng, master), metrics


class CountedJit:
  """`jax.jit(fn, **jit_kwargs)` that counts its traces (each trace is a compilation)."""

  def __init__(self, fn: Callable, **jit_kwargs):
    self.num_traces = 0

    def traced(*args):
      self.num_traces += 1
      return fn(*args)

    self._jitted = jax.jit(traced, **jit_kwargs)

  def __call__(self, *args):
    return self._jitted(*args)

  def lower(self, *args) -> jax.stages.Lowered:
    """`jax.jit(...).lower(*args)`: the step for these arguments, e.g. to read XLA's cost."""
    return self._jitted.lower(*args)


def make_update_step(graphdef: nnx.GraphDef, cfg: Any,
                     optimizer: optax.GradientTransformation, *,
                     shardings: Optional[Shardings] = None, vocab_limit: int = 0):
  """Builds the jitted Agentic GRPO update `(state, batch, ref_params) -> (state, metrics)`.

  Cached on the arguments that shape the computation (model structure, `loss`, micro-batches,
  sampling transform, optimizer, shardings): a second run in the same process reuses the
  compiled step.

  Args:
    graphdef: the model structure (static).
    cfg: the run config (`config.TrainConfig`, or anything with its `loss` and `rl` sections:
      the learner imports no `config/`); uses `loss` (`sections.LossSection`) and `rl`
      (micro_batches, rows_per_update, the sampling transform).
    optimizer: from `make_optimizer`.
    shardings: in/out shardings; replicated on one device by default.
    vocab_limit: the sampler's `SamplingTransform.vocab_limit` (the tokenizer's vocabulary
      when the embedding has padded rows: `models.sampling_rules.sampleable_vocab`; 0 = none):
      log-probs, the KL term and the entropy are over the same ids the sampler draws from,
      so that the importance ratio is 1 on policy.

  The returned callable takes:
    state: `TrainState` (donated: do not reuse the argument).
    batch: a `core.types.UpdateBatch` (`tokens [N, T]` int32, `loss_mask [N, T]` bool,
      `behaviour_logprobs [N, T]` f32, `advantages [N, T]` f32, `sample_weights [N]` f32, 0 on
      padding rows); checked when traced (`ValueError` naming a field of the wrong shape or
      dtype). N is a multiple of `rl.micro_batches`, at most `rl.rows_per_update`; each row
      count compiles once, and padding rows change neither the loss nor its gradient. A
      packed batch (`positions` and `branches`, shared-prefix packing: `core.packing`) gives
      every token the log-prob of its unpacked row (policy and KL reference alike); with a
      loss additive over a row's tokens (`core.losses.segments_additive`) its loss and
      gradient are those of the unpacked rows.
    ref_params: reference-model params for the KL term (ignored when `loss.kl_beta == 0`).
  and returns the new state and a dict of scalar float32 metrics: `loss`, `pg_loss`, `kl`,
  `entropy` (nats: the token-level entropy of the sampling distribution, temperature and
  top-k / top-p applied, at each loss token's position, aggregated like the policy loss;
  `loss.entropy_coef` > 0 subtracts `entropy_coef` times it from the loss), `clip_fraction`,
  `ratio_mean`, `ratio_max`, `approx_kl`, `loss_tokens`, `dual_clip_fraction`,
  `grad_norm`, `update_skipped` (1 when the non-finite guard rejected the
  update), `nonfinite_consecutive` (skipped updates in a row, this one included),
  `nonfinite_total`. The callable has a `num_traces` attribute (compilations so far).
  """
  # Dr. GRPO's constant normaliser counts a full update's rows (per micro-batch), whatever row
  # bucket a batch has (`replay.batching.row_buckets`): padding rows never change the loss.
  num_rows = (cfg.rl.rows_per_update // cfg.rl.micro_batches
              if cfg.loss.aggregation == "seq_mean_token_sum_norm" else None)
  return _update_step(graphdef, cfg.loss, cfg.rl.micro_batches, num_rows,
                      cfg.rl.transform(vocab_limit=vocab_limit), optimizer,
                      shardings or Shardings.replicated())


def _rl_loss_fn(graphdef, loss_cfg: sections.LossSection, num_rows: Optional[int],
                transform: core_types.SamplingTransform) -> Callable:
  """`loss_fn(params, batch, ref_params) -> (loss, metrics)`: the Agentic GRPO update's loss
  on one (micro-)batch (`make_update_step`)."""
  max_tokens = loss_cfg.max_tokens or None
  # The KL term's distributions: temperature-scaled, not filtered (module docstring), over the
  # sampleable ids.
  kl_transform = core_types.SamplingTransform(temperature=transform.temperature,
                                              vocab_limit=transform.vocab_limit)
  filtered = transform != kl_transform
  use_kl = loss_cfg.kl_beta > 0

  def loss_fn(params, mb: core_types.UpdateBatch, ref_params):
    if mb.loss_slots is None:  # every slot: `[N, T]` per-token arrays
      mask, behaviour, advantages = mb.loss_mask, mb.behaviour_logprobs, mb.advantages
      logprobs, logits = _token_logprobs(graphdef, params, mb.tokens, transform, mb.positions,
                                         mb.branches)
      entropy = _aligned_entropy(logits, mask, transform)

      def kl_logprobs():  # the policy's and the reference's, under the KL term's transform
        policy = _aligned_logprobs(logits, mb.tokens, kl_transform) if filtered else logprobs
        return policy, _token_logprobs(graphdef, ref_params, mb.tokens, kl_transform,
                                       mb.positions, mb.branches)[0]
    else:  # the loss tokens' slots only: `[N, L]` per-token arrays, the same row sums
      slots = mb.loss_slots
      mask, behaviour, advantages, targets = (
          jnp.take_along_axis(x, slots, axis=1)
          for x in (mb.loss_mask, mb.behaviour_logprobs, mb.advantages, mb.tokens))
      logits = _slot_logits(graphdef, params, mb)
      logprobs = logprobs_lib.token_logprobs(logits, targets, transform)
      entropy = losses_lib.entropy(logprobs_lib.transform_logits(logits, transform), mask)

      def kl_logprobs():
        policy = (logprobs_lib.token_logprobs(logits, targets, kl_transform) if filtered
                  else logprobs)
        ref = _slot_logits(graphdef, ref_params, mb)
        return policy, logprobs_lib.token_logprobs(ref, targets, kl_transform)
    pg, metrics = losses_lib.policy_loss(
        logprobs, behaviour, advantages, mask,
        eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high, ratio_level=loss_cfg.ratio_level,
        aggregation=loss_cfg.aggregation, max_tokens=max_tokens,
        sample_weights=mb.sample_weights, dual_clip=loss_cfg.dual_clip, num_rows=num_rows)
    total = pg
    kl = jnp.zeros((), jnp.float32)
    if use_kl:
      kl = losses_lib.aggregate(
          losses_lib.kl_penalty(*kl_logprobs(), estimator=loss_cfg.kl_estimator),
          mask, loss_cfg.aggregation, max_tokens, num_rows=num_rows)
      total = total + loss_cfg.kl_beta * kl
    # The entropy bonus (Mnih et al., 2016; Schulman et al., 2017): aggregated like the policy
    # loss, so micro-batches combine exactly; always computed for the `entropy` metric.
    ent = losses_lib.aggregate(entropy, mask, loss_cfg.aggregation, max_tokens,
                               mb.sample_weights, num_rows=num_rows)
    if loss_cfg.entropy_coef > 0:
      total = total - loss_cfg.entropy_coef * ent
    metrics = dict(metrics, pg_loss=pg, kl=jax.lax.stop_gradient(kl),
                   entropy=jax.lax.stop_gradient(ent))
    metrics.pop("loss_tokens")
    metrics.pop("ratio_max")
    return total, metrics

  return loss_fn


@functools.lru_cache(maxsize=16)
def _update_step(graphdef, loss_cfg: sections.LossSection, micro_batches: int,
                 num_rows: Optional[int], transform: core_types.SamplingTransform, optimizer,
                 shardings: Shardings):
  """The cached body of `make_update_step`."""
  max_tokens = loss_cfg.max_tokens or None
  loss_fn = _rl_loss_fn(graphdef, loss_cfg, num_rows, transform)

  def step(state: TrainState, batch: core_types.UpdateBatch, ref_params):
    _check_type(batch, core_types.UpdateBatch).check()
    micro = _split_micro(batch, micro_batches)
    loss, metrics, grads = _accumulate(
        lambda p, mb: loss_fn(p, mb, ref_params), state.params, micro, loss_cfg.aggregation,
        max_tokens, num_rows)
    # Micro-batch metrics are denominator-weighted means; maxima would not combine that way.
    metrics = dict(metrics, loss_tokens=jnp.sum(batch.loss_mask).astype(jnp.float32))
    return _apply_updates(state, grads, optimizer, loss, metrics)

  return CountedJit(step, in_shardings=(shardings.state, shardings.batch, shardings.ref_params),
                    out_shardings=(shardings.state, None), donate_argnums=(0,))


def make_sft_step(graphdef: nnx.GraphDef, cfg: Any,
                  optimizer: optax.GradientTransformation, *,
                  shardings: Optional[Shardings] = None, vocab_limit: int = 0):
  """Builds the jitted supervised warm-start step `(state, batch) -> (state, metrics)`.

  `batch` is a `core.types.SFTBatch`: `tokens [N, T]` int32 and `loss_mask [N, T]` bool (True on
  the tokens to imitate); the loss is the token-mean negative log-likelihood (temperature 1, no
  filtering; over the first `vocab_limit` ids when it is > 0, as the sampler draws: see
  `make_update_step`). Metrics: `loss`, `token_accuracy` (the argmax over the same ids),
  `grad_norm`, `update_skipped`, `nonfinite_consecutive`, `nonfinite_total`.
  Micro-batched like `make_update_step` (token-count weighting); cached like it.
  """
  return _sft_step(graphdef, cfg.rl.micro_batches, optimizer, shardings or Shardings.replicated(),
                   core_types.SamplingTransform(vocab_limit=vocab_limit))


@functools.lru_cache(maxsize=8)
def _sft_step(graphdef, micro_batches: int, optimizer, shardings: Shardings,
              transform: core_types.SamplingTransform):
  """The cached body of `make_sft_step`."""

  def loss_fn(params, mb: core_types.SFTBatch):
    mask = mb.loss_mask
    logprobs, logits = _token_logprobs(graphdef, params, mb.tokens, transform)
    nll = losses_lib.aggregate(-logprobs, mask, "token_mean")
    pred = jnp.argmax(logprobs_lib.transform_logits(logits[:, :-1], transform), axis=-1)
    hit = jnp.concatenate([jnp.zeros_like(mask[:, :1]), pred == mb.tokens[:, 1:]], axis=1)
    acc = losses_lib.aggregate(hit.astype(jnp.float32), mask, "token_mean")
    return nll, {"token_accuracy": jax.lax.stop_gradient(acc)}

  def step(state: TrainState, batch: core_types.SFTBatch):
    _check_type(batch, core_types.SFTBatch).check()
    micro = _split_micro(batch, micro_batches if
                         batch.tokens.shape[0] % micro_batches == 0 else 1)
    loss, metrics, grads = _accumulate(loss_fn, state.params, micro, "token_mean", None)
    return _apply_updates(state, grads, optimizer, loss, metrics)

  return CountedJit(step, in_shardings=(shardings.state, shardings.batch),
                    out_shardings=(shardings.state, None), donate_argnums=(0,))


def _check_type(batch, cls):
  if not isinstance(batch, cls):
    raise ValueError(f"batch must be a {cls.__name__}, got {type(batch).__name__}")
  return batch


# `core.losses.policy_loss`'s metrics that are means over the loss tokens (whatever the loss's
# aggregation): chunks combine them by their loss-token counts.
TOKEN_MEAN_METRICS = ("clip_fraction", "dual_clip_fraction", "ratio_mean", "approx_kl")


class ChunkedUpdate(NamedTuple):
  """One Agentic GRPO update as a loop of fixed-shape gradient programs (`make_chunked_update`).

  Attributes:
    init: `init(params) -> acc`, a zero accumulator (float32 gradients like `params`, the
      loss, the metrics, the loss-token count).
    grad: `grad(params, acc, chunk, ref_params, weights) -> acc`: adds the chunk's gradient,
      loss and aggregated metrics (`pg_loss`, `kl`, `entropy`) times `weights[0]` and its
      token-mean metrics (`TOKEN_MEAN_METRICS`) times `weights[1]` (`chunk_weights`: the
      loss's and `token_mean`'s); `chunk` a `core.types.UpdateBatch` of `chunk_rows` rows,
      `weights` `[2]` float32, `acc` donated.
    apply: `apply(state, acc) -> (state, metrics)`: one optimizer step on the accumulated
      gradient (`state` donated), the metrics of `make_update_step`.
  """
  init: CountedJit
  grad: CountedJit
  apply: CountedJit


def make_chunked_update(graphdef: nnx.GraphDef, cfg: Any, optimizer: optax.GradientTransformation,
                        *, shardings: Optional[Shardings] = None,
                        vocab_limit: int = 0) -> ChunkedUpdate:
  """`make_update_step`'s update, computed as a loop over chunks of a fixed row count.

  An update of N rows runs `grad` on `ceil(N / C)` chunks of `C` rows (the last padded with
  padding rows, which change nothing) and `apply` once, so that the update compiles one
  gradient program per row length whatever N is, instead of one whole step per row bucket,
  and computes no padding rows beyond the last chunk's. With `chunk_weights`' weights the
  accumulated loss, gradient and metrics are the whole batch's (`core.losses.aggregate`'s
  micro-batch identity, with the whole update's constant normaliser for
  `seq_mean_token_sum_norm`): `make_update_step`'s update with `rl.micro_batches=1` up to
  float summation order. Arguments as `make_update_step`'s; `rl.micro_batches` is not used.
  """
  num_rows = (cfg.rl.rows_per_update if cfg.loss.aggregation == "seq_mean_token_sum_norm"
              else None)
  return _chunked_update(graphdef, cfg.loss, num_rows, cfg.rl.transform(vocab_limit=vocab_limit),
                         optimizer, shardings or Shardings.replicated())


@functools.lru_cache(maxsize=16)
def _chunked_update(graphdef, loss_cfg: sections.LossSection, num_rows: Optional[int],
                    transform: core_types.SamplingTransform, optimizer,
                    shardings: Shardings) -> ChunkedUpdate:
  """The cached body of `make_chunked_update`."""
  loss_fn = _rl_loss_fn(graphdef, loss_cfg, num_rows, transform)
  # The accumulated gradient is sharded like the parameters; its scalars are replicated.
  param_sh = getattr(shardings.state, "params", shardings.state)
  scalar = jax.sharding.NamedSharding(jax.tree.leaves(param_sh)[0].mesh,
                                      jax.sharding.PartitionSpec())
  acc_sh = (param_sh, scalar, scalar, scalar)

  def metric_zeros(params):
    probe = core_types.UpdateBatch.padding(1, 8)
    shapes = jax.eval_shape(lambda p: loss_fn(p, probe, p)[1], params)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def init(params):
    zeros = state_lib.to_master(jax.tree.map(jnp.zeros_like, params))
    return (zeros, jnp.zeros((), jnp.float32), metric_zeros(params),
            jnp.zeros((), jnp.float32))

  def grad(params, acc, chunk: core_types.UpdateBatch, ref_params, weights):
    _check_type(chunk, core_types.UpdateBatch).check()
    (loss, metrics), grads = jax.value_and_grad(
        lambda p: loss_fn(p, chunk, ref_params), has_aux=True)(params)
    acc_grads, acc_loss, acc_metrics, acc_tokens = acc
    w, per_token = weights[0], weights[1]
    grads = state_lib.to_master(grads)
    metrics = {k: (per_token if k in TOKEN_MEAN_METRICS else w) * x for k, x in metrics.items()}
    return (jax.tree.map(lambda a, g: a + w * g, acc_grads, grads),
            acc_loss + w * loss,
            jax.tree.map(jnp.add, acc_metrics, metrics),
            acc_tokens + jnp.sum(chunk.loss_mask).astype(jnp.float32))

  def apply(state: TrainState, acc):
    grads, loss, metrics, tokens = acc
    return _apply_updates(state, grads, optimizer, loss, dict(metrics, loss_tokens=tokens))

  return ChunkedUpdate(
      init=CountedJit(init, in_shardings=(param_sh,), out_shardings=acc_sh),
      grad=CountedJit(grad, in_shardings=(param_sh, acc_sh, shardings.batch,
                                          shardings.ref_params, scalar),
                      out_shardings=acc_sh, donate_argnums=(1,)),
      apply=CountedJit(apply, in_shardings=(shardings.state, acc_sh),
                       out_shardings=(shardings.state, None), donate_argnums=(0,)))


def real_chunks(batch: core_types.UpdateBatch, chunk_rows: int) -> int:
  """How many chunks of `chunk_rows` rows hold `batch`'s real rows (host side): those up to the
  last row with a weight or a loss token; at least 1."""
  real = np.flatnonzero((np.asarray(batch.sample_weights) > 0)
                        | np.asarray(batch.loss_mask).any(-1))
  used = int(real[-1]) + 1 if real.size else 0
  return max(1, -(-used // chunk_rows))


def split_chunks(batch: core_types.UpdateBatch, chunk_rows: int,
                 num_chunks: int) -> list[core_types.UpdateBatch]:
  """`batch` (NumPy, `[N, T]`) as `num_chunks` chunks of `chunk_rows` rows: its first rows,
  cut or padded with padding rows (`UpdateBatch.padding`, which change nothing) to
  `num_chunks * chunk_rows`. Rows cut must be padding (`real_chunks`)."""
  rows = num_chunks * chunk_rows
  batch = jax.tree.map(lambda a: a[:rows], batch)
  have = batch.tokens.shape[0]
  if have < rows:
    pad = core_types.UpdateBatch.padding(rows - have, batch.tokens.shape[1],
                                         packed=batch.branches is not None)
    batch = jax.tree.map(lambda a, b: np.concatenate([a, b]), batch, pad)
  return [jax.tree.map(lambda a, i=i: a[i * chunk_rows:(i + 1) * chunk_rows], batch)
          for i in range(num_chunks)]


def chunk_weights(loss_mask: np.ndarray, aggregation: str, chunk_rows: int,
                  combine: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> np.ndarray:
  """Host-side weights `[N / C]` float32 of `make_chunked_update`'s chunks: `d_c / max(D, 1)`
  (0 where `d_c` is 0), `d_c` the chunk's `core.losses.aggregate_denominator` and `D` the
  whole batch's; 1 for every chunk under `seq_mean_token_sum_norm`, whose chunks are
  normalised by the whole update's constant already.

  Args:
    loss_mask: `[N, T]` bool, this process's rows, N a multiple of `chunk_rows`.
    aggregation: `loss.aggregation`.
    chunk_rows: C >= 1.
    combine: with several processes, maps this process's `[N / C]` float64 denominators to
      the global chunks' (the sum over processes: a collective every process calls); None for
      one process. Not called under `seq_mean_token_sum_norm`.

  Raises:
    ValueError: N not a multiple of `chunk_rows`, or an unknown aggregation.
  """
  mask = np.asarray(loss_mask, bool)
  n = mask.shape[0]
  if chunk_rows < 1 or n % chunk_rows:
    raise ValueError(f"chunk_rows must be >= 1 and divide the batch's rows ({n}), got "
                     f"{chunk_rows}")
  core_types.check_choice("aggregation", aggregation, losses_lib.AGGREGATIONS)
  if aggregation == "seq_mean_token_sum_norm":
    return np.ones(n // chunk_rows, np.float32)
  chunks = mask.reshape(n // chunk_rows, chunk_rows, -1)
  if aggregation == "token_mean":
    d = chunks.sum(axis=(1, 2)).astype(np.float64)
  else:
    d = chunks.any(-1).sum(-1).astype(np.float64)
  if combine is not None:
    d = np.asarray(combine(d), np.float64)
  return np.where(d > 0, d / max(d.sum(), 1.0), 0.0).astype(np.float32)
