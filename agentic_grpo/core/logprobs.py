"""The one sampling transform shared by the sampler and the learner.

The sampler draws tokens from `softmax(transform_logits(logits, ...))` and
records the log-probability of each drawn token with `token_logprobs`; the
learner recomputes log-probs of the same tokens with the same function and the
same arguments. The importance ratio `exp(learner - behaviour)` is therefore 1
up to floating-point tolerance whenever the parameters are unchanged.

Transform order (as in Hugging Face `generate` and vLLM): the ids past the tokenizer's
vocabulary (`vocab_limit`: the padded rows of an embedding larger than the tokenizer) masked,
temperature scaling,
then top-k (Fan et al., 2018, "Hierarchical Neural Story Generation"), then
top-p / nucleus filtering (Holtzman et al., 2020, "The Curious Case of Neural
Text Degeneration") on the temperature-scaled distribution. Filtered-out
entries get the finite logit `MASKED_LOGIT` rather than `-inf`, so that the
log-prob of a token the current policy would never sample is a large negative
number with a finite (zero) gradient instead of `-inf`/NaN.
"""

import jax
import jax.numpy as jnp

from agentic_grpo.core import types as core_types

# Logit given to entries removed by top-k / top-p. Finite so that gradients and
# differences of log-probs stay finite; exp(MASKED_LOGIT - x) underflows to 0.
MASKED_LOGIT = -1e30


def transform_logits(
    logits: jax.Array,
    transform: core_types.SamplingTransform = core_types.IDENTITY_TRANSFORM,
) -> jax.Array:
  """Applies the vocabulary limit, temperature, top-k and top-p to logits.

  Args:
    logits: `[..., V]` float logits (any float dtype; computed in float32).
    transform: the `SamplingTransform` (validated when it was built):
      * `vocab_limit`: entries `>= vocab_limit` get `MASKED_LOGIT` first, so that they are
        never sampled, never counted in top-k and carry no probability mass (top-p and the
        log-softmax are over the first `vocab_limit` ids); 0 (or `>= V`) disables.
      * `temperature`: logits are divided by it; a Python number or a traced
        float32 scalar (a traced value does not cause recompilation).
      * `top_k`: keep the `top_k` largest entries per row (ties at the k-th
        value are all kept); 0 disables.
      * `top_p`: keep the smallest set of largest-probability entries whose
        total probability reaches `top_p` (computed on the temperature-scaled,
        top-k filtered distribution; the most likely entry is always kept, ties
        at the threshold are all kept). A Python `1.0` disables the filter at
        trace time; a traced value is always applied.

  Returns:
    `[..., V]` float32 logits; removed entries are `MASKED_LOGIT`.

  Raises:
    ValueError: if `transform` is not a `SamplingTransform`.
  """
  if not isinstance(transform, core_types.SamplingTransform):
    raise ValueError(f"transform must be a SamplingTransform, got {type(transform).__name__}")
  top_k, top_p = transform.top_k, transform.top_p
  x = jnp.asarray(logits, jnp.float32) / jnp.asarray(transform.temperature, jnp.float32)
  vocab = x.shape[-1]
  limit = transform.vocab_limit
  if 0 < limit < vocab:
    x = jnp.where(jnp.arange(vocab) < limit, x, MASKED_LOGIT)
    vocab = limit
  if 0 < top_k < vocab:
    kth = jax.lax.top_k(x, top_k)[0][..., -1:]
    x = jnp.where(x >= kth, x, MASKED_LOGIT)
  if transform.uses_top_p:
    sorted_x = jnp.sort(x, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_x, axis=-1)
    # Mass strictly before each sorted entry; entry i is kept while it is < p.
    before = jnp.cumsum(probs, axis=-1) - probs
    keep = before < jnp.asarray(top_p, jnp.float32)
    # Smallest kept logit value (entry 0 is always kept).
    threshold = jnp.min(jnp.where(keep, sorted_x, jnp.inf), axis=-1, keepdims=True)
    x = jnp.where(x >= threshold, x, MASKED_LOGIT)
  return x


def token_logprobs(
    logits: jax.Array,
    targets: jax.Array,
    transform: core_types.SamplingTransform = core_types.IDENTITY_TRANSFORM,
) -> jax.Array:
  """Log-probability of `targets` under the transformed distribution.

  `log softmax(transform_logits(logits))[targets]`: the sampler's behaviour
  log-prob and the learner's log-prob of a token, computed the same way.

  Args:
    logits: `[..., V]` float logits.
    targets: `[...]` int token ids in `[0, V)`.
    transform: the sampling transform, see `transform_logits`.

  Returns:
    `[...]` float32 log-probs; a token removed by top-k/top-p (or at or past
    `vocab_limit`) gets about `MASKED_LOGIT` (a huge negative, finite number).

  Raises:
    ValueError: if `targets.shape != logits.shape[:-1]`, or `transform` is not
      a `SamplingTransform`.
  """
  if tuple(targets.shape) != tuple(logits.shape[:-1]):
    raise ValueError(
        f"targets shape {tuple(targets.shape)} must equal logits.shape[:-1] "
        f"{tuple(logits.shape[:-1])}")
  x = transform_logits(logits, transform)
  logp = jax.nn.log_softmax(x, axis=-1)
  return jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
