"""Batched autoregressive sampling with a KV cache, in two jitted programs.

`sample` runs a prefill over the right-padded prompts of `N = B·G` rows
(ragged lengths; one program), then, in a second program, single-token decode
steps (`lax.while_loop`s: one per cache-length segment of `decode_segments` when
the cache at least doubles over the decode, else one) until every row has stopped
or `max_new_tokens` tokens were generated; with `compact_to`, once at most that
many rows are still generating, they go on alone.
Tokens are drawn from `softmax(core.logprobs.transform_logits(logits))`
(vocabulary limit, temperature, top-k, top-p) or taken greedily (the argmax of
the same transformed logits: an id at or past `transform.vocab_limit`, a padded
embedding row the tokenizer cannot decode, is never generated), and the behaviour log-prob of
each generated token is recorded under the same transform, so that
`transformer.sequence_logprobs` over the joined prompt + completion gives the
same values (importance ratio 1 on policy).

A row stops at a stop token id or when its last generated tokens equal one of
its stop sequences (e.g. a stop string encoded with the tokenizer); the stop
token(s) are part of the completion and of `lengths`. What the sampler
generated is what the learner trains on: completions are token ids, and loss
masks come from `lengths` (`completion_mask`), never from comparing ids with
pad or EOS (which may be equal).

Shapes are static per call: prompts are padded to a bucket (powers of two by
default) so that calls with the same `N`, bucket, `max_new_tokens`, `top_k`,
`vocab_limit`, `greedy` (traced in the sharded program: greedy and sampled calls share
it), whether top-p is on, `compact_to` and stop-table shapes reuse one compiled decode
program; `temperature`, the `top_p` value, the RNG and the stop ids are traced. The
prefill is its own program, compiled per bucket (and, for the shared-prefix prefill of
`models.shared_prefill`, per prefix bucket; its suffixes of any length run in one loop), and hands the decode a cache
laid out as the whole prompt's. So a call whose prefill layout is new compiles its
prefill only (about a quarter of the compile time of the two together at the default
task's shapes), and the evaluation's calls compile the decode programs that the RL
phase's calls of the same row count reuse.

Sharded sampling. With `shardings` (a `Shardings`, built over a device mesh by
`sampler_shardings`) the sampler is jitted with explicit
`in_shardings`/`out_shardings`: parameters as the learner holds them, prompt
rows and every `[N, ...]` output split over the mesh's batch axes, and the KV
cache (created inside the program) constrained to its own sharding (rows
over the batch axes, key/value heads over `tensor` where they divide). In a
multi-process run each process passes its own rows; the program runs on the
global batch of every process's rows and returns global arrays (take this
process's rows back with `parallel.local_rows`).
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import parallel
from agentic_grpo.core import types as core_types
from agentic_grpo.models import placement
from agentic_grpo.models import sampling_rules
from agentic_grpo.models import shared_prefill
from agentic_grpo.models import transformer

FINISH_STOP = 0
FINISH_LENGTH = 1

class SampleOutput(NamedTuple):
  """Result of `sample`.

  Attributes:
    tokens: `[N, max_new_tokens]` int32 generated ids; `pad_id` past `lengths`.
    lengths: `[N]` int32 generated tokens per row, including the stop token(s).
    finish_reason: `[N]` int32, `FINISH_STOP` or `FINISH_LENGTH`.
    logprobs: `[N, max_new_tokens]` float32 behaviour log-probs of `tokens`
      under the sampling transform; 0 past `lengths`.
  """
  tokens: jax.Array
  lengths: jax.Array
  finish_reason: jax.Array
  logprobs: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class Shardings:
  """Where the sampler's arrays live on a mesh (see `sampler_shardings`).

  Compared and hashed by identity: build it once per mesh (the jitted
  programs are cached on it).

  Attributes:
    params: pytree of `Sharding`s matching the parameters (`jit` in_shardings).
    rows: `n -> Sharding` of `[n, ...]` row arrays (prompts, lengths, stop
      tables, every `SampleOutput` field), `n` the global row count.
    cache: `(n, slots) -> KVCache` of `Sharding`s of
      `transformer.init_cache(config, n, slots)`.
    put_rows: pytree of this process's `[n_local, ...]` NumPy rows -> pytree of
      global arrays of `n_local * process_count` rows sharded by `rows`.
  """
  params: Any
  rows: Callable[[int], jax.sharding.Sharding]
  cache: Callable[[int, int], transformer.KVCache]
  put_rows: Callable[[Any], Any]


def sampler_shardings(model_config: transformer.ModelConfig, mesh: jax.sharding.Mesh,
                      rules: Optional[parallel.Rules] = None) -> Shardings:
  """The sampler's shardings on `mesh` (`sample(..., shardings=)`).

  Parameters as the learner holds them (`placement.shard_model`); prompt rows and outputs
  split by the `batch` rule as far as the global row count allows (`parallel.batch_sharding`);
  the KV cache by `placement.kv_cache_shardings` (rows over the batch axes, key/value heads
  over `tensor` where they divide, slots and head width whole); host rows placed with
  `parallel.shard_batch` (process-local rows in a multi-process run). Cached: the same
  arguments give the same object, so the sampler's compiled programs are reused.

  Raises:
    ValueError: `model_config` is not a `ModelConfig`, or bad `rules`.
  """
  return _sampler_shardings(model_config, mesh, parallel.canonical_rules(rules))


@functools.lru_cache(maxsize=8)
def _sampler_shardings(model_config, mesh, rules) -> Shardings:
  sm = placement.shard_model(model_config, mesh, rules)
  rows = functools.lru_cache(maxsize=None)(lambda n: parallel.batch_sharding(mesh, (n,), rules))
  cache = functools.lru_cache(maxsize=None)(
      lambda n, slots: placement.kv_cache_shardings(model_config, mesh, n, slots, rules))
  return Shardings(params=sm.param_shardings, rows=rows, cache=cache,
                   put_rows=lambda tree: parallel.shard_batch(tree, mesh, rules))


@jax.jit
def _completion_mask(lengths, iota):
  return iota[None, :] < lengths[:, None]


def completion_mask(lengths: jax.Array, max_len: int) -> jax.Array:
  """`[N, max_len]` bool, True on the first `lengths[n]` slots of each row.

  This is the loss mask of a completion: built from lengths (stop tokens
  included), never from token ids.
  """
  return _completion_mask(jnp.asarray(lengths, jnp.int32), jnp.arange(max_len, dtype=jnp.int32))


@jax.jit
def join_prompt_completion(
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    completions: jax.Array,
    completion_lengths: jax.Array,
    *,
    pad_id: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Packs prompt + completion of each row, left-aligned, for the learner.

  Args:
    prompts: `[N, P]` int32, right-padded.
    prompt_lengths: `[N]` int32.
    completions: `[N, T]` int32 (e.g. `SampleOutput.tokens`).
    completion_lengths: `[N]` int32 (e.g. `SampleOutput.lengths`).
    pad_id: id written on padding.

  Returns:
    `(tokens, positions, segment_mask, loss_mask)`, each `[N, P + T]`:
    tokens int32, positions int32 (`0..`), segment_mask bool (prompt and
    completion), loss_mask bool (completion tokens only). With this layout
    `sequence_logprobs(...)[n, prompt_lengths[n] + t]` is the log-prob of
    completion token `t`.
  """
  n, p = prompts.shape
  t = completions.shape[1]
  prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)[:, None]
  completion_lengths = jnp.asarray(completion_lengths, jnp.int32)[:, None]
  j = jnp.arange(p + t)[None, :]
  in_prompt = j < prompt_lengths
  in_completion = (~in_prompt) & (j < prompt_lengths + completion_lengths)
  from_prompt = jnp.take_along_axis(prompts, jnp.clip(j, 0, p - 1).repeat(n, 0), axis=1)
  from_completion = jnp.take_along_axis(
      completions, jnp.clip(j - prompt_lengths, 0, t - 1), axis=1)
  tokens = jnp.where(in_prompt, from_prompt, jnp.where(in_completion, from_completion, pad_id))
  positions = jnp.broadcast_to(j, (n, p + t)).astype(jnp.int32)
  return tokens.astype(jnp.int32), positions, in_prompt | in_completion, in_completion


def decode_segments(prompt_width: int, max_new_tokens: int, segments: int = 4) -> list[int]:
  """Cache slots of each decode segment: `P + k * C` up to `P + T`, `C` about `T / segments`.

  `C` is rounded up to a multiple of 8, so that short completions get fewer segments (each is
  compiled separately). The last entry is `P + T`. The static sampler decodes in these
  segments when `T >= P` (the cache at least doubles), else in one.

  Raises:
    ValueError: a non-positive width, token count or segment count.
  """
  if prompt_width < 1 or max_new_tokens < 1 or segments < 1:
    raise ValueError(f"prompt_width, max_new_tokens and segments must be positive, got "
                     f"{prompt_width}, {max_new_tokens}, {segments}")
  chunk = sampling_rules.round_up(-(-max_new_tokens // segments), 8)
  return [prompt_width + min(max_new_tokens, k * chunk)
          for k in range(1, -(-max_new_tokens // chunk) + 1)]


class _DecodeRows(NamedTuple):
  """Per-row constants of the decode loop (`[w, ...]`, w rows being decoded)."""
  keys: jax.Array
  prompt_lengths: jax.Array
  stop_ids: jax.Array
  stop_seqs: jax.Array


def _placer(cache_shardings):
  """`cache -> cache` constrained to `cache_shardings(rows, slots)` (the identity without)."""

  def place(cache):
    if cache_shardings is None:
      return cache
    return jax.lax.with_sharding_constraint(cache, cache_shardings(*cache.valid.shape))

  return place


def _prefill_impl(graphdef, params, prompts, prompt_lengths, shared=None, *, width,
                  cache_shardings=None):
  """Jitted prefill of `sample` (its own program, so that the decode's is shared by every
  prefill layout of a prompt width): the last prompt token's logits `[n, V]` float32 and the
  `[n, width]` cache, a row's prompt in its first `len` slots.

  `prompts`: the whole prompts `[n, w]` (`shared` None; `w` at most `width`: prefilled at `w`
  slots, the cache then widened to `width`, `sample`'s `prefill_width`), or each row's suffix
  `[n, width]` after its group's shared prefix, right-padded, `shared` then holding
  `(group_prompts [n / G, Pa], shared_lengths [n / G])` (`sample`'s `prefix_group`);
  `prompt_lengths` the whole prompts'.
  `cache_shardings`: None, or `(rows, slots) -> KVCache` of shardings the caches are
  constrained to.
  """
  config = nnx.merge(graphdef, params).config
  place = _placer(cache_shardings)
  n = prompts.shape[0]
  if shared is None:
    w = prompts.shape[1]
    if w > width:
      raise ValueError(f"prompts of width {w} exceed the prefill's cache width {width}")
    cache = place(transformer.init_cache(config, n, w))
    positions = jnp.broadcast_to(jnp.arange(w, dtype=jnp.int32), (n, w))
    prompt_mask = positions < prompt_lengths[:, None]
    # Only the last prompt token's logits are needed (and the last block's MLP only there).
    logits, cache = transformer.apply(graphdef, params, prompts, positions, cache, prompt_mask,
                                      logits_at=prompt_lengths - 1)
    if w < width:  # the bucket's layout, for its decode program
      cache = transformer.extend_cache(place(cache), width - w)._replace(
          index=jnp.asarray(width, jnp.int32))
    return logits[:, 0], place(cache)
  last, cache = shared_prefill.prefill(graphdef, params, config, prompts, prompt_lengths,
                                       shared, place, width)
  return last, place(cache)


# Long by design: one traced program, read top to bottom (the first token, the segmented decode,
# the compacted decode); its closures `step` and `decode` share the traced shapes and transform,
# which as separate functions would each take a dozen arguments (the per-row constants reach
# them as `_DecodeRows`, gathered when the decode is compacted).
def _decode_impl(graphdef, params, last, cache, prompt_lengths, rng, temperature, top_p,
                 stop_ids, stop_seqs, pad_id, *, max_new_tokens, top_k, greedy, use_top_p,
                 vocab_limit=0, cache_shardings=None, compact_to=0):
  """Jitted decode of `sample`; see there. `last`: the last prompt token's logits `[n, V]`,
  `cache`: the prefill's `[n, P]` cache (`_prefill_impl`).

  `cache_shardings`: None, or `(rows, slots) -> KVCache` of shardings that the decode caches
  are constrained to (`rows` the cache's own: the n rows, or the compacted decode's
  `compact_to`).
  """
  n, p = cache.valid.shape
  t_max = max_new_tokens
  # `temperature` and `top_p` traced; `top_k`, `vocab_limit` and whether top-p is on static.
  transform = core_types.SamplingTransform(temperature, top_k, top_p if use_top_p else 1.0,
                                           vocab_limit)
  place = _placer(cache_shardings)
  seq_len = stop_seqs.shape[-1]

  # Per-row constants of the decode; gathered with the rows when the decode is compacted.
  rows = _DecodeRows(keys=jax.random.split(rng, n), prompt_lengths=prompt_lengths,
                     stop_ids=stop_ids, stop_seqs=stop_seqs)

  def step(i, logits_i, state, rows):
    out_tokens, out_lp, history, done, lengths, finish = state
    tok, lp = sampling_rules.draw_tokens(logits_i, transform, rows.keys, i, greedy)
    active = ~done
    out_tokens = out_tokens.at[:, i].set(jnp.where(active, tok, pad_id))
    out_lp = out_lp.at[:, i].set(jnp.where(active, lp, 0.0))
    history = jax.lax.dynamic_update_slice(history, tok[:, None], (0, seq_len - 1 + i))
    window = jax.lax.dynamic_slice(history, (0, i), (tok.shape[0], seq_len))  # last L tokens
    hit = sampling_rules.stop_hits(tok, window, rows.stop_ids, rows.stop_seqs)
    lengths = jnp.where(active, i + 1, lengths)
    finish = jnp.where(active & hit, FINISH_STOP, finish)
    done = done | hit
    return tok, (out_tokens, out_lp, history, done, lengths, finish)

  state = (
      jnp.full((n, t_max), pad_id, jnp.int32),
      jnp.zeros((n, t_max), jnp.float32),
      jnp.full((n, seq_len - 1 + t_max), -2, jnp.int32),  # -2 never matches
      jnp.zeros((n,), jnp.bool_),
      jnp.zeros((n,), jnp.int32),
      jnp.full((n,), FINISH_LENGTH, jnp.int32),
  )
  tok, state = step(0, last, state, rows)

  def decode(carry, rows, last_step, floor):
    """Decode steps while a row is undone, `i <= last_step` and more than `floor` rows are."""

    def cond(carry):
      i, _, _, state = carry
      done = state[3]
      return ((i < t_max) & (i <= last_step) & ~jnp.all(done)
              & (jnp.sum(~done) > floor))

    def body(carry):
      i, prev, cache, state = carry
      pos = (rows.prompt_lengths + i - 1)[:, None]
      logits, cache = transformer.apply(graphdef, params, prev[:, None], pos, cache)
      cache = place(cache)
      tok, state = step(i, logits[:, 0], state, rows)
      return i + 1, tok, cache, state

    return jax.lax.while_loop(cond, body, carry)

  # Step i (1 <= i < T) writes slot P + i - 1 and attends over the cache's slots. Decoding runs in
  # segments whose cache holds only the slots filled by the segment's end, so that a step reads
  # about the filled part of the cache rather than all P + T slots (the slots past a row's last
  # token are masked: the results are those of one full-length cache, up to float rounding of
  # the shorter softmax sums). Each segment is a `while_loop`; all stop when every row is done.
  # Segments pay when the cache at least doubles over the decode (measured on CPU: prompts of 64
  # and 256 new tokens ran 30% faster in 4 segments; prompts of 128 and 48 new tokens ran as
  # fast in one, which compiles a second faster per segment saved).
  # With compaction (`compact_to` < n), the loops also stop once at most `compact_to` rows are
  # undone; those rows (gathered with their cache, keys and stop tables) are then decoded alone,
  # in a full-length cache, so that a step computes `compact_to` rows instead of n.
  compact = 0 < compact_to < n
  carry = (jnp.int32(1), tok, cache, state)
  filled = p
  limits = decode_segments(p, t_max) if t_max >= p else [p + t_max]
  for limit in limits:
    i, tok, cache, state = carry
    cache = place(transformer.extend_cache(cache, limit - filled))
    filled = limit
    carry = decode((i, tok, cache, state), rows, limit - p, compact_to if compact else 0)
  if compact:
    i, tok, cache, state = carry
    keep = jnp.argsort(state[3], stable=True)[:compact_to]  # the undone rows first
    take = lambda x: jnp.take(x, keep, axis=0)
    cache = place(transformer.KVCache(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)),
                                      valid=take(cache.valid), index=cache.index))
    i, _, _, kept = decode((i, take(tok), cache, jax.tree.map(take, state)),
                           jax.tree.map(take, rows), t_max, 0)
    # The kept rows' outputs written back over theirs (the stop-window history is not one).
    state = tuple(x if j == 2 else x.at[keep].set(y)
                  for j, (x, y) in enumerate(zip(state, kept, strict=True)))
  else:
    state = carry[3]
  out_tokens, out_lp, _, _, lengths, finish = state
  return SampleOutput(tokens=out_tokens, lengths=lengths, finish_reason=finish, logprobs=out_lp)


_STATIC_ARGNAMES = ("graphdef", "max_new_tokens", "top_k", "greedy", "use_top_p",
                    "vocab_limit", "compact_to")
_PREFILL_JIT = jax.jit(_prefill_impl, static_argnames=("graphdef", "width"))
_DECODE_JIT = jax.jit(_decode_impl, static_argnames=_STATIC_ARGNAMES)


@functools.lru_cache(maxsize=64)
def _sharded_prefill(graphdef, shardings: Shardings, n: int, width: int,
                     groups: Optional[int] = None):
  """`_prefill_impl` jitted with explicit in/out shardings for `n` global rows of prompt width
  `width` (and `groups` global groups of a shared-prefix prefill, None without one)."""
  rows = shardings.rows(n)

  def fn(params, prompts, prompt_lengths, shared=None):
    return _prefill_impl(graphdef, params, prompts, prompt_lengths, shared, width=width,
                         cache_shardings=shardings.cache)

  shared = None if groups is None else (shardings.rows(groups), shardings.rows(groups))
  return jax.jit(fn, in_shardings=(shardings.params, rows, rows, shared),
                 out_shardings=(rows, shardings.cache(n, width)))


def compile_prefill(graphdef, params, shardings: Shardings, rows: int, width: int,
                    group: int = 1, prefix_width: int = 0, prompt_width: int = 0) -> None:
  """Compiles `sample`'s prefill (`shardings`'s program) for `rows` global rows at prompt
  width `width`, ahead of its first call: lowering and compiling fills the jitted program's
  cache, so that the call runs at once (`train.sampling.compile_rl_prefills`). `group` > 1
  and `prefix_width`: the shared-prefix prefill of groups of `group` rows whose prefixes are
  padded to `prefix_width` (`shared_prefill.split_shared_prefixes`' `Pa`); else the
  whole-prompt one, at `prompt_width` slots (0: `width`; `sample`'s `prefill_width`). `params`:
  the parameters or their `jax.ShapeDtypeStruct`s. Computes nothing.

  Raises:
    ValueError: `group` > 1 not dividing `rows`, or without a `prefix_width` in [1, width]; a
      `prompt_width` outside [0, width], or with `group` > 1.
  """
  if not 0 <= prompt_width <= width or (prompt_width and group > 1):
    raise ValueError(f"prompt_width must be in [0, {width}] and only for the whole-prompt "
                     f"prefill (group 1), got {prompt_width} with group {group}")
  row = shardings.rows(rows)
  prompts = jax.ShapeDtypeStruct((rows, prompt_width or width), jnp.int32, sharding=row)
  lengths = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=row)
  groups, shared = None, None
  if group > 1:
    if rows % group or not 1 <= prefix_width <= width:
      raise ValueError(f"a shared-prefix prefill needs group ({group}) dividing rows ({rows}) "
                       f"and prefix_width in [1, {width}], got {prefix_width}")
    groups = rows // group
    g = shardings.rows(groups)
    shared = (jax.ShapeDtypeStruct((groups, prefix_width), jnp.int32, sharding=g),
              jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=g))
  # Every argument as `sample` passes it: `lru_cache` keys on the arguments as given.
  _sharded_prefill(graphdef, shardings, rows, width, groups).lower(params, prompts, lengths,
                                                                   shared).compile()


@functools.lru_cache(maxsize=64)
def _sharded_decode(graphdef, shardings: Shardings, n: int, width: int, max_new_tokens: int,
                    top_k: int, use_top_p: bool, vocab_limit: int, compact_to: int = 0):
  """`_decode_impl` jitted with explicit in/out shardings for `n` global rows after a prefill
  of width `width` (`compact_to` global rows decoded on alone, `sample`'s).

  `greedy` is a traced (replicated) bool argument here, not a static one: greedy and sampled
  calls of the same shapes share one program (a run's evaluation compiles 8 sampler programs
  instead of 12). The draw computes both the argmax and the categorical sample and selects
  one (`sampling_rules.draw_tokens`); tokens and log-probs are bit-identical to the static
  programs' (tested against recorded outputs of the static sampler)."""
  rows = shardings.rows(n)
  rep = jax.sharding.NamedSharding(rows.mesh, jax.sharding.PartitionSpec())

  def fn(params, last, cache, prompt_lengths, rng, temperature, top_p, stop_ids, stop_seqs,
         pad_id, greedy_flag):
    return _decode_impl(graphdef, params, last, cache, prompt_lengths, rng, temperature, top_p,
                        stop_ids, stop_seqs, pad_id, max_new_tokens=max_new_tokens,
                        top_k=top_k, greedy=greedy_flag, use_top_p=use_top_p,
                        vocab_limit=vocab_limit, cache_shardings=shardings.cache,
                        compact_to=compact_to)

  return jax.jit(fn, in_shardings=(shardings.params, rows, shardings.cache(n, width), rows, rep,
                                   rep, rep, rows, rows, rep, rep),
                 out_shardings=SampleOutput(rows, rows, rows, rows))


def sample(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompts,
    prompt_lengths,
    rng: jax.Array,
    *,
    max_new_tokens: int,
    transform: core_types.SamplingTransform = core_types.IDENTITY_TRANSFORM,
    greedy: bool = False,
    stop_token_ids: Optional[Union[Sequence[int], Sequence[Sequence[int]], np.ndarray]] = None,
    stop_sequences: Optional[Sequence] = None,
    pad_id: int = 0,
    prompt_buckets: Sequence[int] = sampling_rules.DEFAULT_PROMPT_BUCKETS,
    shardings: Optional[Shardings] = None,
    prefix_group: int = 1,
    compact_to: int = 0,
    prefill_width: int = 0,
) -> SampleOutput:
  """Generates up to `max_new_tokens` tokens for each of N prompts.

  Args:
    graphdef, params: the policy (`transformer.init_model` or
      `hf_import.load_hf_checkpoint`).
    prompts: `[N, P]` int32 prompt ids, right-padded (host or device array).
    prompt_lengths: `[N]` int, each in `[1, P]`.
    rng: a `jax.random` key; split into one key per row, folded with the step.
    max_new_tokens: static, tokens to generate at most (the output width T).
    transform: the `SamplingTransform` tokens are drawn under and their
      log-probs recorded under; its `top_k`, `vocab_limit` (and whether
      `top_p < 1`) are static, its `temperature` and `top_p` values are
      traced. Give a model whose embedding is larger than its tokenizer
      `vocab_limit` = the tokenizer's vocabulary
      (`sampling_rules.sampleable_vocab`).
    greedy: take the argmax of the transformed logits instead of sampling
      (never an id at or past `vocab_limit`); log-probs are still those of
      the transformed distribution.
    stop_token_ids: ids that end a row: `[K]` for all rows, or `N` per-row
      lists / an `[N, K]` array padded with -1.
    stop_sequences: token sequences that end a row when the generated ids end
      with them: a list of sequences for all rows, or `N` per-row lists of
      sequences (see `sampling_rules.encode_stop_strings`).
    pad_id: id written past a row's length (may equal a stop id).
    prompt_buckets: allowed padded prompt widths; the smallest one that holds
      the longest prompt is used. In a multi-process call every process must
      arrive at the same bucket: pass the one agreed bucket.
    shardings: run on a mesh with these shardings (see module docstring);
      `params` must already be placed with `shardings.params`. `prompts`,
      `prompt_lengths` and per-row stop tables are this process's rows
      (host arrays); stop tables must have the same shapes in every process.
      None: one `jit` that follows the arguments' placement.
    prefix_group: G, the rows come in consecutive groups of G (a GRPO group's
      attempts at one task, or its later stages) whose prompts share a prefix:
      the shared-prefix prefill (`models.shared_prefill`) computes each group's
      longest common prefix once, for `N / G` rows at a width of
      `prompt_buckets`, copies its cache to the group's rows and prefills each
      row's rest after it (`shared_prefill.SUFFIX_CHUNK` tokens a loop step, up to the longest
      rest), when its estimated work is less than the whole prompts' prefill
      (`shared_prefill.layout`; else, and at 1, the plain prefill). Same tokens and
      log-probs up to float rounding. Single-process only.
    compact_to: decode compaction, static (0 = off; ignored unless below the global row
      count, `N * process_count` with `shardings`): once at most `compact_to` rows are still
      generating, those rows alone (gathered with their cache, keys and stop tables) are
      decoded on, so that a step computes `compact_to` rows instead of all; their outputs are
      written back to their rows. A call's longest completion sets its decode steps while
      most rows stop early (sampled completions of the default's stages: 10 tokens on
      average, 31 the longest of 128), so this about halves the decode's row-steps there.
      Same tokens and log-probs up to float rounding (each row keeps its key). One more
      decode loop to compile. Independently of it, the decode runs in the cache-length
      segments of `decode_segments` only when `max_new_tokens >= P` (the cache at least
      doubles), else in one.
    prefill_width: 0 (the prompt bucket), or the whole-prompt prefill's width, from the longest
      prompt to the bucket (`sampling_rules.prefill_width`): the prefill computes that many
      slots a row and its cache is then widened to the bucket's, so that the decode program
      is the bucket's. Same tokens and log-probs up to float rounding. Not used by the
      shared-prefix prefill. In a multi-process call every process must pass the same width
      (from the agreed longest prompt).

  Returns:
    `SampleOutput` with `[N, max_new_tokens]` tokens and log-probs, `[N]`
    lengths (stop tokens included) and finish reasons. With `shardings`, N is
    the global row count (`N_local * process_count`) and the fields are
    global arrays with the `shardings.rows(N)` sharding.

  Raises:
    ValueError: bad shapes, a prompt length outside `[1, P]`, prompt + new
      tokens longer than the model's `max_seq_len`, non-positive
      `max_new_tokens`, a `compact_to` that is not an int >= 0, a `prefill_width` that is
      neither 0 nor between the longest prompt and the bucket, a `transform`
      that is not a `SamplingTransform`, a `transform.vocab_limit` above the
      model's vocabulary, stop ids outside the sampleable ids
      (`[0, vocab_limit or vocab_size)`), or a
      `prefix_group` that is not a positive divisor of N (or above 1 in a
      multi-process run).
  """
  if (not isinstance(prefix_group, (int, np.integer)) or isinstance(prefix_group, bool)
      or prefix_group < 1 or np.shape(prompts)[0] % prefix_group):
    raise ValueError(f"prefix_group must be a positive divisor of the {np.shape(prompts)[0]} "
                     f"rows, got {prefix_group!r}")
  if (not isinstance(compact_to, (int, np.integer)) or isinstance(compact_to, bool)
      or compact_to < 0):
    raise ValueError(f"compact_to must be an int >= 0 (0 = off), got {compact_to!r}")
  compact_to = int(compact_to)
  if prefix_group > 1 and shardings is not None and parallel.process_count() > 1:
    raise ValueError(f"prefix_group={prefix_group}: the shared-prefix prefill is single-process "
                     f"only (the processes would have to agree on its widths); use 1")
  req = sampling_rules.check_requests(graphdef, params, prompts, prompt_lengths,
                       max_new_tokens=max_new_tokens, transform=transform,
                       stop_token_ids=stop_token_ids, stop_sequences=stop_sequences)
  prompts, prompt_lengths = req.prompts, req.prompt_lengths
  stop_ids, stop_seqs, vocab_limit = req.stop_ids, req.stop_seqs, req.vocab_limit
  temperature, top_k, top_p = transform.temperature, transform.top_k, transform.top_p
  n, width = prompts.shape
  bucket = sampling_rules.prompt_bucket(int(prompt_lengths.max()), prompt_buckets)
  if (not isinstance(prefill_width, (int, np.integer)) or isinstance(prefill_width, bool)
      or not (prefill_width == 0 or int(prompt_lengths.max()) <= prefill_width <= bucket)):
    raise ValueError(f"prefill_width must be 0 (the bucket) or in [longest prompt "
                     f"{int(prompt_lengths.max())}, bucket {bucket}], got {prefill_width!r}")
  whole_width = int(prefill_width) or bucket
  shared = None
  if prefix_group > 1:
    layout = shared_prefill.layout(prompts, prompt_lengths, prefix_group, bucket,
                                   prompt_buckets, pad_id, req.config, whole_width)
    if layout is not None:
      prompts, shared = layout.suffix, (layout.group_prompts, layout.shared_lengths)
  if shared is None:  # the whole prompts, at the prefill's width
    prompts = (np.concatenate([prompts, np.full((n, whole_width - width), pad_id,
                                                prompts.dtype)], 1)
               if whole_width > width else prompts[:, :whole_width])
  return _prefill_and_decode(
      graphdef, params, prompts, prompt_lengths, shared, bucket, rng, stop_ids, stop_seqs,
      temperature=temperature, top_p=top_p, pad_id=pad_id, greedy=greedy,
      max_new_tokens=max_new_tokens, top_k=top_k, vocab_limit=vocab_limit, shardings=shardings,
      compact_to=compact_to)


def _prefill_and_decode(graphdef, params, prompts, prompt_lengths, shared, width, rng, stop_ids,
                        stop_seqs, *, temperature, top_p, pad_id, greedy, max_new_tokens, top_k,
                        vocab_limit, shardings, compact_to):
  """`sample`'s two programs on checked host rows (`prompts` at `width`, or the shared-prefix
  prefill's suffix with `shared`)."""
  if shardings is not None:
    # Every host value is placed explicitly (0-d ones replicated), so that the call runs under
    # `jax.transfer_guard("disallow")`.
    rows = shardings.put_rows({"prompts": prompts.astype(np.int32),
                               "lengths": prompt_lengths.astype(np.int32),
                               "stop_ids": stop_ids, "stop_seqs": stop_seqs,
                               "temperature": np.float32(temperature),
                               "top_p": np.float32(top_p), "pad_id": np.int32(pad_id),
                               "greedy": np.bool_(greedy)})
    groups = None
    if shared is not None:
      shared = shardings.put_rows(shared)
      groups = int(shared[0].shape[0])
    n_global = int(rows["prompts"].shape[0])
    last, cache = _sharded_prefill(graphdef, shardings, n_global, width, groups)(
        params, rows["prompts"], rows["lengths"], shared)
    fn = _sharded_decode(graphdef, shardings, n_global, width, max_new_tokens, top_k,
                         bool(top_p < 1.0), vocab_limit, compact_to)
    return fn(params, last, cache, rows["lengths"], rng, rows["temperature"], rows["top_p"],
              rows["stop_ids"], rows["stop_seqs"], rows["pad_id"], rows["greedy"])
  if shared is not None:
    shared = tuple(jnp.asarray(x, jnp.int32) for x in shared)
  lengths = jnp.asarray(prompt_lengths, jnp.int32)
  last, cache = _PREFILL_JIT(graphdef, params, jnp.asarray(prompts, jnp.int32), lengths, shared,
                             width=width)
  return _DECODE_JIT(
      graphdef, params, last, cache, lengths, rng, jnp.float32(temperature), jnp.float32(top_p),
      jnp.asarray(stop_ids), jnp.asarray(stop_seqs), jnp.int32(pad_id),
      max_new_tokens=max_new_tokens, top_k=top_k, greedy=bool(greedy),
      use_top_p=bool(top_p < 1.0), vocab_limit=vocab_limit, compact_to=compact_to)
