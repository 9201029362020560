"""Policy-gradient losses for (Agentic) GRPO: clipped surrogate, KL penalty, entropy.

* Clipped surrogate: PPO (Schulman et al., 2017) with asymmetric "clip-higher" bounds
  `[1 − eps_low, 1 + eps_high]` (DAPO, Yu et al., 2025), and optional dual clipping for negative
  advantages (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep RL").
* Importance ratio per token (PPO/GRPO) or per sequence, length-normalised (GSPO, Zheng et al.,
  2025, "Group Sequence Policy Optimization"), in its GSPO-token form so that per-token
  advantages are allowed.
* Aggregation over tokens: `token_mean` (DAPO), `seq_mean_token_mean` (GRPO, Shao et al., 2024),
  `seq_mean_token_sum_norm` (Dr. GRPO, Liu et al., 2025: a constant `max_tokens` normaliser).
* KL to a frozen reference with Schulman's estimators k1, k2, k3 ("Approximating KL Divergence",
  2020), as used by GRPO (k3).

Every loss is an `aggregate` of per-token values, so micro-batches combine exactly when weighted
by `aggregate_denominator` (see there).

Finiteness: log-ratios are clamped to `±MAX_LOG_RATIO` before `exp` (in the surrogate and the KL
estimators), so that the loss, its gradient and the metrics are finite for any finite inputs,
including the `-1e30` log-prob a top-k/top-p filter gives a token outside its kept set.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from agentic_grpo.core import types as core_types

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
RATIO_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")

# Bound on |log ρ| before `exp` (verl clamps its log-ratios to the same ±20): ratios lie in
# [e^-20, e^20] ≈ [2.1e-9, 4.9e8], so `A · ρ` stays finite in float32 for any |A| < 1e29. Beyond
# the bound the ratio is constant (zero gradient); PPO's clip already zeroes the gradient there
# except for a negative advantage with ρ > 1 + eps_high, which `dual_clip` bounds properly.
MAX_LOG_RATIO = 20.0


def segments_additive(ratio_level: str, aggregation: str) -> bool:
  """Whether `policy_loss` of a row is the sum of its segments' losses as rows of their own.

  Then an episode's segments may be packed into one row (the row of the last segment, the
  earlier ones its prefixes) without changing the loss or its gradient. It holds for the token
  ratio with `token_mean` or `seq_mean_token_sum_norm` (per-token terms over a constant or
  token-count normaliser). It fails for:
    * `ratio_level="sequence"`: GSPO's ratio `s_n` is a mean over the row's loss tokens, so a
      packed row gives every segment the ratio of the whole episode; a later stage that moved
      the ratio out of the clip range zeroes the gradient of an unchanged earlier stage;
    * `aggregation="seq_mean_token_mean"`: each row is weighted by its own token count.

  Raises:
    ValueError: for an unknown `ratio_level` or `aggregation`.
  """
  core_types.check_choice("ratio_level", ratio_level, RATIO_LEVELS)
  core_types.check_choice("aggregation", aggregation, AGGREGATIONS)
  return ratio_level == "token" and aggregation != "seq_mean_token_mean"


def _check_2d(name: str, x, shape=None) -> jax.Array:
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f"{name} must be [N, T], got shape {tuple(x.shape)}")
  if shape is not None and tuple(x.shape) != tuple(shape):
    raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
  return x


def _check_mask(loss_mask, shape) -> jax.Array:
  loss_mask = _check_2d("loss_mask", loss_mask, shape)
  if loss_mask.dtype != jnp.bool_:
    raise ValueError(f"loss_mask must be bool, got dtype {loss_mask.dtype}")
  return loss_mask


def _check_sample_weights(sample_weights, n: int) -> Optional[jax.Array]:
  if sample_weights is None:
    return None
  sample_weights = jnp.asarray(sample_weights)
  if tuple(sample_weights.shape) != (n,):
    raise ValueError(f"sample_weights must be [N] = ({n},), got shape {tuple(sample_weights.shape)}")
  return sample_weights.astype(jnp.float32)


def aggregate_denominator(loss_mask: jax.Array, mode: str,
                          max_tokens: Optional[int] = None,
                          num_rows: Optional[int] = None) -> jax.Array:
  """The normaliser `aggregate` divides by: the weight of a micro-batch.

  For micro-batches `b` of one batch, `aggregate(batch) = Σ_b aggregate(b) · d_b / Σ_b d_b` with
  `d_b = aggregate_denominator(mask_b, mode, max_tokens, num_rows)`:
    * `token_mean`: number of loss tokens;
    * `seq_mean_token_mean`: number of rows with at least one loss token;
    * `seq_mean_token_sum_norm`: number of rows (`num_rows`, default `N`) times `max_tokens`.

  None of them depends on rows without a loss token, except the last when `num_rows` is None.

  Args:
    loss_mask: `[N, T]` bool.
    mode: one of `AGGREGATIONS`.
    max_tokens: the constant normaliser for `seq_mean_token_sum_norm` (a positive int).
    num_rows: the row count of `seq_mean_token_sum_norm`'s constant normaliser (>= N; default
      N): a batch cut to fewer rows than a full one (row buckets) passes the full one's count,
      so that its loss is the loss of the same rows padded to the full count.

  Returns:
    Scalar float32 (not clamped: an all-masked micro-batch weighs 0).

  Raises:
    ValueError: for an unknown `mode`, a bad `loss_mask`, a missing `max_tokens`, or
      `num_rows < N`.
  """
  core_types.check_choice("mode", mode, AGGREGATIONS)
  loss_mask = _check_mask(loss_mask, None)
  if num_rows is not None and num_rows < loss_mask.shape[0]:
    raise ValueError(f"num_rows must be >= the mask's rows ({loss_mask.shape[0]}), got "
                     f"{num_rows}")
  if mode == "token_mean":
    return loss_mask.sum().astype(jnp.float32)
  if mode == "seq_mean_token_mean":
    return loss_mask.any(-1).sum().astype(jnp.float32)
  if max_tokens is None or max_tokens <= 0:
    raise ValueError(f"max_tokens must be a positive int for {mode}, got {max_tokens!r}")
  return jnp.float32((loss_mask.shape[0] if num_rows is None else num_rows) * max_tokens)


def aggregate(
    values: jax.Array,
    loss_mask: jax.Array,
    mode: str,
    max_tokens: Optional[int] = None,
    sample_weights: Optional[jax.Array] = None,
    num_rows: Optional[int] = None,
) -> jax.Array:
  """Reduces per-token values `[N, T]` to a scalar over the loss tokens.

  * `token_mean` (DAPO): `Σ_{n,t} w_n m v / Σ_{n,t} m`.
  * `seq_mean_token_mean` (GRPO): mean over rows with a loss token of `w_n Σ_t m v / Σ_t m`.
  * `seq_mean_token_sum_norm` (Dr. GRPO): `Σ_{n,t} w_n m v / (num_rows · max_tokens)`,
    `num_rows` defaulting to N.

  Masked entries never reach the result or its gradient, whatever they hold (also inf/NaN).

  Args:
    values: `[N, T]` float.
    loss_mask: `[N, T]` bool.
    mode: one of `AGGREGATIONS`.
    max_tokens: constant normaliser for `seq_mean_token_sum_norm` (positive int); ignored else.
    sample_weights: optional `[N]` float per-row weights (e.g. staleness weights); they scale a
      row's contribution, not the normaliser.
    num_rows: see `aggregate_denominator`.

  Returns:
    Scalar float32; 0 when no token is in the loss.

  Raises:
    ValueError: for an unknown `mode`, mismatched shapes, a non-bool mask, or a missing
      `max_tokens` for `seq_mean_token_sum_norm`.
  """
  core_types.check_choice("mode", mode, AGGREGATIONS)
  values = _check_2d("values", values)
  loss_mask = _check_mask(loss_mask, values.shape)
  sample_weights = _check_sample_weights(sample_weights, values.shape[0])
  denominator = aggregate_denominator(loss_mask, mode, max_tokens, num_rows)
  v = jnp.where(loss_mask, values.astype(jnp.float32), 0.0)
  if sample_weights is not None:
    v = v * sample_weights[:, None]
  if mode == "seq_mean_token_mean":
    per_row = v.sum(-1) / jnp.maximum(loss_mask.sum(-1), 1).astype(jnp.float32)
    return per_row.sum() / jnp.maximum(denominator, 1.0)
  return v.sum() / jnp.maximum(denominator, 1.0)


def _masked_mean(values, mask):
  return jnp.where(mask, values, 0.0).sum() / jnp.maximum(mask.sum(), 1)


def policy_loss(
    logprobs: jax.Array,
    behaviour_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    ratio_level: str = "token",
    aggregation: str = "seq_mean_token_mean",
    max_tokens: Optional[int] = None,
    sample_weights: Optional[jax.Array] = None,
    dual_clip: float = 0.0,
    num_rows: Optional[int] = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped importance-weighted policy-gradient surrogate.

  Per token, with importance ratio `ρ = π_θ / π_β` and advantage `A`:
  `ℓ = max(−A ρ, −A clip(ρ, 1 − eps_low, 1 + eps_high))` (PPO, Schulman et al., 2017; separate
  bounds as DAPO's clip-higher, Yu et al., 2025). `ratio_level="token"` uses the token ratio
  (GRPO); `"sequence"` uses GSPO's length-normalised sequence ratio
  `s_n = exp(mean_t log ρ_{n,t})` (Zheng et al., 2025) in the GSPO-token form
  `ρ_{n,t} = sg(s_n) · π_θ(y_t) / sg(π_θ(y_t))`, clipped per sequence. At `ρ = 1` the gradient is
  `−A ∇ log π_θ`, linear in `A`: the basis of Agentic GRPO's correction identity
  (docs/design.md §1).

  Dual clip (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep RL"): with
  `dual_clip = c > 1`, a token with `A < 0` gets `ℓ = min(max(−A ρ, −A clip(ρ)), −c A)`, i.e.
  the objective `max(min(ρ A, clip(ρ) A), c A)`: its loss and gradient stay bounded however far
  the policy has moved towards a token the advantage says to avoid (stale corrections make such
  tokens common). `A >= 0` tokens and every token with `ρ <= c` are unchanged.

  `log ρ` is clamped to `[−MAX_LOG_RATIO, MAX_LOG_RATIO]` before `exp` (per token, and so the
  sequence ratio too), so the loss, the gradient and the metrics are finite for any finite inputs.

  Args:
    logprobs: `[N, T]` float32 log π_θ of the tokens (aligned as in docs/architecture.md).
    behaviour_logprobs: `[N, T]` float32 log π_β recorded at sampling time (no gradient).
    advantages: `[N]` (per row) or `[N, T]` (per token) float32.
    loss_mask: `[N, T]` bool, True on generated tokens of the segment.
    eps_low: lower clip range, in [0, 1).
    eps_high: upper clip range, >= 0.
    ratio_level: `"token"` or `"sequence"`.
    aggregation: one of `AGGREGATIONS`.
    max_tokens: constant normaliser for `seq_mean_token_sum_norm`.
    sample_weights: optional `[N]` per-row weights (staleness weights of correction items).
    dual_clip: the dual-clip bound `c` (> 1) for negative advantages; 0 disables.
    num_rows: the row count of `seq_mean_token_sum_norm`'s normaliser (`aggregate_denominator`).

  Returns:
    `(loss, metrics)`: scalar float32 loss; metrics (scalars, over loss tokens)
    `clip_fraction` (share of tokens whose PPO-clipped branch is active, i.e. gradient 0),
    `dual_clip_fraction` (share of tokens held at the dual-clip bound, also gradient 0),
    `ratio_mean`, `ratio_max`, `approx_kl` (k3 estimate of KL(π_β‖π_θ)), `loss_tokens`.

  Raises:
    ValueError: for mismatched shapes, a non-bool mask, unknown options, clip ranges out of
      bounds, or a `dual_clip` that is neither 0 nor > 1.
  """
  core_types.check_choice("ratio_level", ratio_level, RATIO_LEVELS)
  core_types.check_choice("aggregation", aggregation, AGGREGATIONS)
  if not 0.0 <= eps_low < 1.0:
    raise ValueError(f"eps_low must be in [0, 1), got {eps_low}")
  if not eps_high >= 0.0:
    raise ValueError(f"eps_high must be >= 0, got {eps_high}")
  if not (dual_clip == 0.0 or dual_clip > 1.0):
    raise ValueError(f"dual_clip must be 0 (off) or > 1, got {dual_clip}")
  logprobs = _check_2d("logprobs", logprobs)
  behaviour_logprobs = _check_2d("behaviour_logprobs", behaviour_logprobs, logprobs.shape)
  loss_mask = _check_mask(loss_mask, logprobs.shape)
  advantages = jnp.asarray(advantages)
  if advantages.shape == logprobs.shape[:1]:
    advantages = advantages[:, None]
  elif tuple(advantages.shape) != tuple(logprobs.shape):
    raise ValueError(f"advantages must be [N] or [N, T] for logprobs of shape "
                     f"{tuple(logprobs.shape)}, got shape {tuple(advantages.shape)}")
  advantages = jnp.where(loss_mask, advantages.astype(jnp.float32), 0.0)

  # Mask and clamp before exp: padded slots may hold anything, a filtered-out token's log-prob is
  # -1e30, and exp of either poisons the loss and its gradient.
  log_ratio = jnp.where(loss_mask, logprobs - jax.lax.stop_gradient(behaviour_logprobs), 0.0)
  log_ratio = jnp.clip(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO)
  if ratio_level == "token":
    ratio = jnp.exp(log_ratio)
  else:
    n_tokens = jnp.maximum(loss_mask.sum(-1, keepdims=True), 1)
    seq_log_ratio = log_ratio.sum(-1, keepdims=True) / n_tokens
    token_part = log_ratio - jax.lax.stop_gradient(log_ratio)
    ratio = jnp.exp(jax.lax.stop_gradient(seq_log_ratio) + token_part)
    ratio = jnp.where(loss_mask, ratio, 1.0)

  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  per_token = jnp.maximum(unclipped, clipped)
  is_dual = jnp.zeros_like(loss_mask)
  if dual_clip:
    bound = -dual_clip * advantages  # > 0 where A < 0
    is_dual = (advantages < 0) & (per_token > bound) & loss_mask
    per_token = jnp.where(is_dual, bound, per_token)
  loss = aggregate(per_token, loss_mask, aggregation, max_tokens, sample_weights, num_rows)

  ratio_sg = jax.lax.stop_gradient(ratio)
  is_clipped = (clipped > unclipped) & loss_mask
  log_r = jax.lax.stop_gradient(log_ratio)
  metrics = {
      "clip_fraction": _masked_mean(is_clipped.astype(jnp.float32), loss_mask),
      "dual_clip_fraction": _masked_mean(is_dual.astype(jnp.float32), loss_mask),
      "ratio_mean": _masked_mean(ratio_sg, loss_mask),
      "ratio_max": jnp.where(loss_mask, ratio_sg, -jnp.inf).max(initial=-jnp.inf),
      "approx_kl": _masked_mean(jnp.expm1(-log_r) + log_r, loss_mask),
      "loss_tokens": loss_mask.sum().astype(jnp.float32),
  }
  return loss, metrics


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, *, estimator: str = "k3") -> jax.Array:
  """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled from π_θ.

  With `log r = log π_ref − log π_θ` (Schulman, 2020, "Approximating KL Divergence"):
  `k1 = −log r` (unbiased, high variance, can be negative), `k2 = ½ (log r)²` (biased, low
  variance), `k3 = (r − 1) − log r` (unbiased, always >= 0; GRPO's choice, Shao et al., 2024).
  `log r` is clamped to `±MAX_LOG_RATIO` first (as verl does), so every estimator, and its
  gradient, is finite for any finite inputs; beyond the bound a token's term is constant.
  `ref_logprobs` get no gradient. As a loss term `β · aggregate(kl)`, k2's gradient is
  ∇KL(π_θ‖π_ref) and k3's is ∇KL(π_ref‖π_θ) in expectation; both pull π_θ towards π_ref.

  Args:
    logprobs: `[N, T]` float32 log π_θ of the tokens.
    ref_logprobs: `[N, T]` float32 log π_ref of the same tokens.
    estimator: `"k1"`, `"k2"` or `"k3"`.

  Returns:
    `[N, T]` float32; exactly 0 where `logprobs == ref_logprobs`.

  Raises:
    ValueError: for mismatched shapes or an unknown estimator.
  """
  core_types.check_choice("estimator", estimator, KL_ESTIMATORS)
  logprobs = _check_2d("logprobs", logprobs)
  ref_logprobs = _check_2d("ref_logprobs", ref_logprobs, logprobs.shape)
  log_r = jax.lax.stop_gradient(ref_logprobs).astype(jnp.float32) - logprobs.astype(jnp.float32)
  log_r = jnp.clip(log_r, -MAX_LOG_RATIO, MAX_LOG_RATIO)
  if estimator == "k1":
    return -log_r
  if estimator == "k2":
    return 0.5 * jnp.square(log_r)
  return jnp.expm1(log_r) - log_r


def entropy(logits: jax.Array, loss_mask: jax.Array) -> jax.Array:
  """Per-token entropy `H = −Σ_v p_v log p_v` of the policy's next-token distribution.

  Args:
    logits: `[N, T, V]` float logits (already transformed, e.g. temperature-scaled, if the
      entropy of the sampling distribution is wanted).
    loss_mask: `[N, T]` bool.

  Returns:
    `[N, T]` float32 entropy in nats, 0 where masked. Aggregate with `aggregate`.

  Raises:
    ValueError: for a `logits` that is not 3-D or a mask of another `[N, T]`.
  """
  logits = jnp.asarray(logits)
  if logits.ndim != 3:
    raise ValueError(f"logits must be [N, T, V], got shape {tuple(logits.shape)}")
  loss_mask = _check_mask(loss_mask, logits.shape[:2])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  # 0 · log 0 = 0 for masked-out (-inf) vocabulary entries; the double where keeps the gradient
  # finite there.
  finite = jnp.isfinite(logp)
  safe_logp = jnp.where(finite, logp, 0.0)
  h = -jnp.sum(jnp.where(finite, jnp.exp(safe_logp) * safe_logp, 0.0), axis=-1)
  return jnp.where(loss_mask, h, 0.0)
