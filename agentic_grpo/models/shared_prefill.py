"""The static sampler's shared-prefix prefill (`models.sampler.sample`'s `prefix_group`).

A training stage's `G` rows per task share a prefix: the first stage's prompts are identical,
a later stage's differ only after the task prompt (the conversation so far is each attempt's
own). The shared-prefix prefill computes each group's longest common prefix once, for `N / G`
rows, copies its KV cache to the group's rows, then prefills each row's rest after it,
`SUFFIX_CHUNK` tokens a step of one loop that runs to the longest rest. The cache it returns
is laid out as the whole prompts' prefill's (a row's prompt in its first `len` slots, at the
same rotary positions), so the sampler's decode program is the same for both, and tokens and
log-probs agree with the whole prefill up to float rounding.

* `split_shared_prefixes` (host): the groups' prefixes and the rows' rests.
* `layout` (host): that split, at the sampler's prompt width, when its estimated work
  (`prefill_cost`) is less than the whole prompts' prefill; else None.
* `prefill` (traced): the prefill itself, called by the sampler's jitted prefill.
"""

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.models import attention
from agentic_grpo.models import sampling_rules
from agentic_grpo.models import transformer

# Widths of the rows' suffixes after their group's shared prefix (`sample`'s `prefix_group`).
SUFFIX_BUCKETS = tuple(2 ** k for k in range(3, 18))  # 8 .. 131072
# Suffix tokens per step of the shared-prefix prefill's loop (`prefill`).
SUFFIX_CHUNK = 16
# The attention's rate against the dense layers' in the prefill's estimated cost
# (`prefill_cost`). Fitted to the static sampler's prefill of the `tiny` model on XLA:CPU (128
# rows in groups of 8, prompts of 50-400 tokens, widths 192 to 448): the whole prefill's
# attention costs about twice its share of FLOPs (`WHOLE_ATTENTION_COST`); the loop's, each
# chunk's 16 queries against all S slots of the cache, `1 + S / LOOP_ATTENTION_SLOTS` times
# the whole prefill's per pair (1.4 at S = 208, 1.9 at S = 464).
WHOLE_ATTENTION_COST = 2.0
LOOP_ATTENTION_SLOTS = 500


class SharedPrefixes(NamedTuple):
  """The shared-prefix prefill's inputs (`split_shared_prefixes`).

  Attributes:
    group_prompts: `[N / G, Pa]` int32, each group's shared prefix, right-padded.
    shared_lengths: `[N / G]` int32, its length (0 when the group shares nothing).
    suffix: `[N, Pb]` int32, each row's prompt after its group's prefix, right-padded
      (at least one token per row); `[N, width]` from `layout`.
    token_slots: the token slots of the prefill: `N / G * Pa + N * Pb` from
      `split_shared_prefixes`; from `layout`, what its loop computes, `N / G * Pa + N *
      round_up(longest rest, SUFFIX_CHUNK)`.
  """
  group_prompts: np.ndarray
  shared_lengths: np.ndarray
  suffix: np.ndarray
  token_slots: int


def split_shared_prefixes(prompts: np.ndarray, prompt_lengths: np.ndarray, group: int,
                          prompt_buckets: Sequence[int] = sampling_rules.DEFAULT_PROMPT_BUCKETS,
                          pad_id: int = 0) -> SharedPrefixes:
  """Splits right-padded prompts `[N, P]` (lengths `[N]`) in consecutive groups of `group`
  rows into each group's longest common prefix and each row's rest.

  A group's prefix stops one token short of its shortest prompt, so that every row keeps a
  token to prefill after it (the one whose logits give the first sampled token). `Pa` is the
  smallest of `prompt_buckets` that holds the longest prefix, `Pb` the smallest of
  `SUFFIX_BUCKETS` that holds the longest rest.

  Raises:
    ValueError: `group` does not divide N, or a prompt length outside `[1, P]`.
  """
  prompts = np.asarray(prompts)
  lengths = np.asarray(prompt_lengths).astype(np.int32)
  n, width = prompts.shape
  if group < 1 or n % group:
    raise ValueError(f"group must be a positive divisor of the {n} rows, got {group}")
  if np.any(lengths < 1) or np.any(lengths > width):
    raise ValueError(f"prompt_lengths must be in [1, {width}], got {lengths.tolist()}")
  rows = prompts.reshape(n // group, group, width)
  same = np.all(rows == rows[:, :1], axis=1)  # [groups, P]: every row agrees at the slot
  common = np.where(same.all(axis=1), width, np.argmin(same, axis=1))
  shared = np.minimum(common, lengths.reshape(-1, group).min(axis=1) - 1).astype(np.int32)
  pa = sampling_rules.prompt_bucket(max(int(shared.max()), 1), prompt_buckets)
  rest = lengths - np.repeat(shared, group)
  pb = sampling_rules.prompt_bucket(int(rest.max()), SUFFIX_BUCKETS)
  group_prompts = np.full((n // group, pa), pad_id, np.int32)
  for g, k in enumerate(shared):
    group_prompts[g, :k] = rows[g, 0, :k]
  suffix = np.full((n, pb), pad_id, np.int32)
  offsets = np.repeat(shared, group)
  for i in range(n):
    suffix[i, :rest[i]] = prompts[i, offsets[i]:lengths[i]]
  return SharedPrefixes(group_prompts, shared, suffix, n // group * pa + n * pb)


def causal_pairs(width: int, causal_block: int) -> int:
  """Query-key pairs a row's prefill of `width` slots scores from slot 0: the blocks of
  `causal_block` queries against the keys up to their own last slot when the transformer
  takes that path (`attention.scores_causal_blocks`), else all `width ** 2`."""
  if not attention.scores_causal_blocks(width, causal_block):
    return width * width
  return sum((min(s + causal_block, width) - s) * min(s + causal_block, width)
             for s in range(0, width, causal_block))


def pair_cost(config: transformer.ModelConfig) -> float:
  """One query-key pair's attention FLOPs (scores and weighted values, all heads) over one
  token's dense FLOPs (q, k, v, o and the SwiGLU MLP), per layer: the unit of `prefill_cost`."""
  c = config
  dense = c.d_model * (2 * c.n_heads + 2 * c.n_kv_heads) * c.head_dim + 3 * c.d_model * c.mlp_dim
  return 2.0 * c.n_heads * c.head_dim / dense


def prefill_cost(n: int, group: int, width: int, prefix_width: int, loop_steps: int,
                 config: Optional[transformer.ModelConfig],
                 whole_width: int = 0) -> tuple[float, float]:
  """Estimated work of the whole prompts' prefill and of the shared-prefix prefill of `n`
  rows at prompt width `width`, in token slots of dense work (`layout`'s choice).

  The whole prefill: `n * W` slots and `n` rows' `causal_pairs` (`W`: `whole_width`, its own
  width, `sample`'s `prefill_width`; 0: `width`). The shared-prefix
  prefill: `n / group` prefixes of `prefix_width` slots with their causal pairs, then
  `loop_steps` steps of `SUFFIX_CHUNK` tokens per row, each against the cache's `S = width +
  SUFFIX_CHUNK` slots. A pair counts `pair_cost(config) * WHOLE_ATTENTION_COST` slots, the
  loop's `1 + S / LOOP_ATTENTION_SLOTS` times that (nothing when `config` is None: slots
  alone).

  Returns:
    `(whole, shared)` estimated costs.
  """
  unit = 0.0 if config is None else pair_cost(config) * WHOLE_ATTENTION_COST
  block = 0 if config is None else config.causal_block
  slots = width + SUFFIX_CHUNK  # the keys of each loop step
  w = whole_width or width
  whole = n * w + unit * n * causal_pairs(w, block)
  loop = n * loop_steps * SUFFIX_CHUNK
  shared = (n // group * (prefix_width + unit * causal_pairs(prefix_width, block))
            + loop + unit * (1 + slots / LOOP_ATTENTION_SLOTS) * loop * slots)
  return whole, shared


def layout(prompts: np.ndarray, prompt_lengths: np.ndarray, group: int, width: int,
           prompt_buckets: Sequence[int] = sampling_rules.DEFAULT_PROMPT_BUCKETS,
           pad_id: int = 0, config: Optional[transformer.ModelConfig] = None,
           whole_width: int = 0) -> Optional[SharedPrefixes]:
  """The shared-prefix prefill's inputs for right-padded prompts `[N, P]` at the sampler's
  prompt width `width` (a bucket that holds the longest prompt), or None when the whole
  prompts' prefill is estimated to cost no more (`prefill_cost`, with the model's `config`;
  None: token slots alone, `N * width` against `token_slots`); the whole prefill at its own
  `whole_width` slots when given (`sample`'s `prefill_width`).

  The shared-prefix prefill computes `N / G * Pa` prefix slots and, its loop running to the
  longest rest, `N * round_up(longest rest, SUFFIX_CHUNK)` suffix slots (`token_slots` of the
  result), each suffix chunk against every slot of the cache, where the whole prefill scores
  causal blocks. Its `suffix` is `[N, width]` (right-padded with `pad_id`).

  Raises:
    ValueError: as `split_shared_prefixes`.
  """
  split = split_shared_prefixes(prompts, prompt_lengths, group, prompt_buckets, pad_id)
  n = split.suffix.shape[0]
  longest_rest = int(np.max(np.asarray(prompt_lengths)
                            - np.repeat(split.shared_lengths, group)))
  steps = -(-longest_rest // SUFFIX_CHUNK)
  slots = split.group_prompts.size + n * steps * SUFFIX_CHUNK
  whole, shared = prefill_cost(n, group, width, split.group_prompts.shape[1], steps, config,
                               whole_width)
  if shared >= whole:
    return None
  suffix = np.full((n, width), pad_id, split.suffix.dtype)
  keep = min(width, split.suffix.shape[1])
  suffix[:, :keep] = split.suffix[:, :keep]
  return split._replace(suffix=suffix, token_slots=slots)


def prefill(graphdef, params, config: transformer.ModelConfig, suffix: jax.Array,
            prompt_lengths: jax.Array, shared: tuple[jax.Array, jax.Array],
            place, width: int) -> tuple[jax.Array, transformer.KVCache]:
  """The shared-prefix prefill, traced inside the sampler's prefill program: each group's
  shared prefix once, its cache copied to the group's rows, then each row's suffix after it,
  `SUFFIX_CHUNK` tokens a step, in a loop of as many steps as the longest suffix needs.

  The suffix tokens go into the slots right after the row's own prefix, at the rotary
  positions of a whole-prompt prefill: the returned cache is laid out as that prefill's (a
  row's prompt in its first `len` slots), and every query attends to the same keys at the
  same positions, so logits and cache agree with it up to float rounding. The program's
  shapes depend on the row and group counts, the prefix bucket `Pa` and `width` only, not
  on the suffixes' lengths.

  Args:
    graphdef, params: the model (`nnx.split`).
    config: its `ModelConfig`.
    suffix: `[n, width]` int32, each row's prompt after its group's prefix, right-padded
      (`layout`'s `suffix`).
    prompt_lengths: `[n]` int32, the whole prompts' lengths.
    shared: `(group_prompts [n / G, Pa], shared_lengths [n / G])` int32 (`layout`'s).
    place: `cache -> cache`, the sampler's sharding constraint on a cache (or the identity).
    width: static, the prompt width (a bucket) of the returned cache.

  Returns:
    The last prompt token's logits `[n, V]` float32 and the `[n, width]` `KVCache`.
  """
  group_prompts, shared_lengths = shared
  groups, pa = group_prompts.shape
  n = suffix.shape[0]
  c = SUFFIX_CHUNK
  positions = jnp.broadcast_to(jnp.arange(pa, dtype=jnp.int32), (groups, pa))
  cache = place(transformer.init_cache(config, groups, pa))
  # The prefix's own logits are not needed: one position's, the cheapest the model offers.
  _, cache = transformer.apply(graphdef, params, group_prompts, positions, cache,
                               positions < shared_lengths[:, None],
                               logits_at=jnp.zeros((groups,), jnp.int32))
  def repeat(x):  # a group's value to each of its rows
    return jnp.repeat(x, n // groups, axis=0)

  cache = transformer.KVCache(k=tuple(map(repeat, cache.k)), v=tuple(map(repeat, cache.v)),
                              valid=repeat(cache.valid), index=cache.index)
  # `c` slots past `width`: a loop step writes whole chunks (slots past a row's prompt are
  # invalid, and those past `width` are dropped at the end).
  cache = place(transformer.extend_cache(place(cache), width + c - pa))
  offset = repeat(shared_lengths)
  rest = prompt_lengths - offset  # at least 1
  suffix = jnp.pad(suffix, ((0, 0), (0, c)))
  steps = jnp.arange(c, dtype=jnp.int32)

  def body(carry):
    start, cache, last = carry
    tokens = jax.lax.dynamic_slice_in_dim(suffix, start, c, axis=1)
    logits, cache = transformer.apply(
        graphdef, params, tokens, offset[:, None] + start + steps[None, :], cache,
        start + steps[None, :] < rest[:, None], logits_at=jnp.clip(rest - 1 - start, 0, c - 1))
    here = (rest - 1 >= start) & (rest - 1 < start + c)  # the row's last prompt token
    return start + c, place(cache), jnp.where(here[:, None], logits[:, 0], last)

  cache = cache._replace(index=offset)  # each row writes after its own prefix
  last = jnp.zeros((n, config.vocab_size), jnp.float32)
  _, cache, last = jax.lax.while_loop(lambda carry: carry[0] < jnp.max(rest), body,
                                      (jnp.int32(0), cache, last))
  def cut(x):  # the `width` slots of the whole-prompt layout
    return x[:, :, :width]

  return last, transformer.KVCache(k=tuple(map(cut, cache.k)), v=tuple(map(cut, cache.v)),
                                   valid=cache.valid[:, :width],
                                   index=jnp.asarray(width, jnp.int32))
