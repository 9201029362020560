"""Continuous batching: a fixed set of decode slots, refilled as rows finish.

The static sampler (`sampler.sample`) decodes a batch until its longest row stops: a finished
row keeps its place in every decode step. Here a row that stops frees its *slot*, which the
next waiting request takes after its prefill (iteration-level scheduling: Yu et al., 2022,
"Orca: A Distributed Serving System for Transformer-Based Generative Models"; Kwon et al.,
2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention",
vLLM). The device programs follow the prefill / insert / generate split of JAX serving
engines (JetStream, MaxText's engine), each a pure function under `jax.jit`:

* `prefill`: a few requests, prompts padded to a prompt bucket, through the model with a
  fresh `[B, P]` KV cache; draws each request's first token.
* `insert`: writes the prefilled cache rows, first tokens and per-request tables (row keys,
  stop ids, stop sequences) into free slots of the decode state (`SlotState`, a
  `[S, cache_len]` KV cache whose `index` is per slot: each slot writes at its own position).
* `generate`: up to `steps` decode steps of every slot in one `lax.while_loop`, ending early
  once enough slots finished while requests are waiting (so that the host can refill them),
  or when every slot is done.

`sample` is the host loop: a queue of requests in order, refilled into free slots (in batches
of `refill_batch`) until it is empty; one program per refill prefills the new requests,
inserts them and hands back the finished rows they replace, which are fetched once at the
end and returned in request order. Two bounds keep a decode step's cost near the work left:

* cache width: a step attends over the state's whole cache, so the state is kept at the
  smallest of a few widths (`cache_widths`: the longest prompt bucket `P` + `k * C`, up to
  `P + T`) that leaves every live slot a free position; `generate` returns when a live slot
  fills its cache, the host widens it (and narrows it once the longest live request is done).
  A step reads about as many positions as the fullest live slot holds, as the static
  sampler's segments do, not always `P + T`.
* the tail: once the queue is empty, whenever at most half the slots are live, the live
  requests move into a state of half as many slots (a power of two, down to `min_slots`), so
  that the slowest requests no longer step all `S` slots.

It returns a `sampler.SampleOutput` with
the fields and semantics of `sampler.sample`: same checks (`sampler.check_requests`), stop ids
and stop sequences (`sampler.stop_hits`), transform and token draw (`sampler.draw_tokens`),
lengths including the stop token(s), pad past the length, behaviour log-probs under the
transform (what `transformer.sequence_logprobs` over `sampler.join_prompt_completion`
recomputes). Determinism: request `r` draws with the key `jax.random.split(rng, N)[r]` folded
with its step index, as row `r` of the static sampler does, so its tokens do not depend on
which slot it got or when. Static and continuous batching give the same greedy tokens, and the
same sampled tokens for the same key, up to float rounding (a prefill padded to another width,
attention over a cache of another length: the log-probs agree to about 1e-6, and a token
differs only where two candidates are that close).

Shapes are static per program: slots (`S` and its halvings down to `min_slots`), cache
widths (`cache_widths`, at most 8 + 1), prefill batches of a power of two requests and prompts padded to a
bucket; the transform's `temperature` and `top_p` values, keys and stop tables are traced.
The decode state is donated to `insert` and `generate` (updated in place where the backend
allows it).

Sharded decoding. With `shardings` (a `sampler.Shardings`, `sampler.sampler_shardings`) every
program is jitted with explicit `in_shardings`/`out_shardings` (`_sharded_*`, cached per
shape): parameters as placed by `shardings.params`; the decode state's slots split over the
mesh's batch axes (`state_shardings`: every field by slots, the cache as `shardings.cache`
places it, key/value heads over `tensor` where they divide, its per-slot `index` like the
slots), so slot counts are multiples of the batch axes' size (`batch_ways`; the tail's
halvings and `min_slots` are rounded up to one); a prefill's `[B, P]` cache and each decode
step's cache are also constrained inside the program with `jax.lax.with_sharding_constraint`,
as in the static sampler; host values are placed with `shardings.put_rows` (0-d ones
replicated). The tokens, lengths and finish reasons are those of one device, the log-probs
agree up to float rounding. Single process only: the host loop needs every request (a
multi-process run would first gather every process's requests).

Reused conversation prefixes. Stage k+1 of an episode extends stage k's conversation (its
prompt, completion and a new opening); its prefill can start from stage k's cache rows instead
of position 0. A request that names a saved conversation (`prefix_keys`, looked up in a
`prefix_cache.PrefixCache`) whose tokens are the start of its prompt is refilled by
`_prefix_refill_impl`: the saved rows (`[B, n_layers, 2, n_kv_heads, Ls, head_dim]`, `Ls` a
prompt bucket) fill positions `0..L-1` of a `[B, Ls + Bs]` prefill cache whose per-row `index`
is `L`, and only the rest of the prompt (`[B, Bs]`, `Bs` the bucket of the longest rest) is
prefilled, at positions `L..`; its first token and the insert are those of a full prefill.
Requests of a refill that reuse a prefix are prefilled apart from those that do not (each in
parts of powers of two). A finished request's slot holds its conversation but the last
generated token at positions `0..index-1`; with `save_keys` those rows are copied out
(`prefix_cache.save_rows`, at a prompt bucket's width) as soon as the host sees the slot done,
before it is refilled, cut or moved, and put into the pool with their tokens and
`params_version` when the call returns. Policy versions make reuse a choice
(`reuse_prefix`, as in PipelineRL: Piché et al., 2025): `'never'` prefills every prompt whole
(the programs and outputs of a call without prefixes); `'same_version'` reuses a prefix only
when it was computed by the current version (the log-probs are those of a full prefill, up to
float rounding); `'always'` also reuses prefixes of earlier versions and reports each
request's (`Stats.prefix_versions`), so that the caller records it and the importance ratio
against the learner's recomputed log-probs covers the difference. A missing (never saved or
evicted: the pool is least-recently-used under a byte budget), other-version or mismatched
prefix falls back to a full prefill and is counted (`Stats`). One device only: saved prefixes
with `shardings` raise.
"""

import collections
import collections.abc
import functools
from typing import Callable, Hashable, NamedTuple, Optional, Sequence, Union

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import parallel
from agentic_grpo.core import types as core_types
from agentic_grpo.models import prefix_cache
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer

DEFAULT_SLOTS = 64
DEFAULT_STEPS_PER_CALL = 32
DEFAULT_MIN_SLOTS = 8


class SlotState(NamedTuple):
  """The decode state of `S` slots (`init_slots`, `insert`, `generate`).

  Attributes:
    cache: `KVCache` of `[S, n_kv_heads, cache_len, head_dim]` keys and values, `[S,
      cache_len]` validity and a per-slot `[S]` int32 `index` (the slot's next position).
    tokens: `[S, T]` int32 generated ids of each slot's request; `pad_id` past its length.
    logprobs: `[S, T]` float32 behaviour log-probs; 0 past the length.
    window: `[S, L]` int32 last `L` generated tokens (-2 before the first), `L` the stop
      sequence width.
    steps: `[S]` int32 tokens generated so far (the length once done).
    last: `[S]` int32 the last generated token (the next decode input).
    prompt_lengths: `[S]` int32.
    done: `[S]` bool; an empty slot is done.
    finish: `[S]` int32 `sampler.FINISH_STOP` or `sampler.FINISH_LENGTH`.
    keys: `[S]` row keys of the slots' requests.
    stop_ids: `[S, K]` int32 stop id tables (-1 padded).
    stop_seqs: `[S, M, L]` int32 stop sequence tables.
  """
  cache: transformer.KVCache
  tokens: jax.Array
  logprobs: jax.Array
  window: jax.Array
  steps: jax.Array
  last: jax.Array
  prompt_lengths: jax.Array
  done: jax.Array
  finish: jax.Array
  keys: jax.Array
  stop_ids: jax.Array
  stop_seqs: jax.Array


class Prefix(NamedTuple):
  """What `prefill` hands to `insert` for `B` requests.

  Attributes:
    cache: `KVCache` of `[B, ..., P, ...]` rows (its index unused): positions `0..` of
      each prompt, valid up to the prompt's length.
    tokens: `[B]` int32 first generated tokens.
    logprobs: `[B]` float32 their behaviour log-probs.
    window: `[B, L]` int32 the stop window after the first token.
    hit: `[B]` bool, the first token stopped the request.
  """
  cache: transformer.KVCache
  tokens: jax.Array
  logprobs: jax.Array
  window: jax.Array
  hit: jax.Array


class Stats(NamedTuple):
  """Work done by one `sample_with_stats` call.

  Attributes:
    prompt_tokens: real prompt tokens prefilled (sum of prompt lengths).
    prefill_tokens: prompt slots computed, padding included (batch and bucket padding).
    prefill_calls: `prefill` programs run.
    generate_calls: `generate` programs run (host round trips).
    decode_steps: decode steps run (each over all the state's slots).
    cache_reads: cache positions the decode steps attended over, summed over steps (slots
      times cache width of each step; `decode_steps * slots * (P + T)` without the width
      and tail bounds).
    resizes: cache widenings and narrowings (`cache_widths`).
    compactions: moves of the live requests into fewer slots (`min_slots`).
    reused_tokens: prompt tokens taken from saved prefixes instead of prefilled
      (`reuse_prefix`); `prompt_tokens - reused_tokens` real tokens were prefilled.
    prefix_hits: requests that started from a saved prefix.
    prefix_misses: requests that named a prefix (`prefix_keys`) that was not in the pool
      (never saved, or evicted) or, at `'same_version'`, was computed by another version.
    prefix_mismatches: requests whose named prefix's tokens are not the start of their
      prompt (or not shorter than it); prefilled whole.
    prefixes_saved: conversations saved into the pool (`save_keys`; kept or not).
    prefix_versions: `[N]` int64, the policy version that computed each request's reused
      prefix, -1 where none was reused (None when `prefix_keys` is None).
  """
  prompt_tokens: int
  prefill_tokens: int
  prefill_calls: int
  generate_calls: int
  decode_steps: int
  cache_reads: int = 0
  resizes: int = 0
  compactions: int = 0
  reused_tokens: int = 0
  prefix_hits: int = 0
  prefix_misses: int = 0
  prefix_mismatches: int = 0
  prefixes_saved: int = 0
  prefix_versions: Optional[np.ndarray] = None


def _transform(temperature, top_p, top_k, use_top_p, vocab_limit):
  return core_types.SamplingTransform(temperature, top_k, top_p if use_top_p else 1.0,
                                      vocab_limit)


def init_slots(config: transformer.ModelConfig, slots: int, cache_len: int,
               max_new_tokens: int, stop_ids_width: int, stop_seqs_shape: tuple[int, int],
               keys: jax.Array) -> SlotState:
  """An empty decode state: every slot done and free.

  Args:
    config: the model's `ModelConfig` (cache shapes and dtype).
    slots: `S`, the number of decode slots.
    cache_len: cache positions per slot (at most the longest prompt bucket +
      `max_new_tokens`; `sample` starts at the first of `cache_widths`).
    max_new_tokens: `T`, the output width.
    stop_ids_width: `K` of the stop id tables.
    stop_seqs_shape: `(M, L)` of the stop sequence tables.
    keys: `[S]` keys of the type the requests use (placeholders until `insert`).

  Raises:
    ValueError: a non-positive `slots` or `cache_len` (`transformer.init_cache`).
  """
  cache = transformer.init_cache(config, slots, cache_len)
  cache = cache._replace(index=jnp.zeros((slots,), jnp.int32))
  m, length = stop_seqs_shape

  def zeros():  # a buffer of its own per field: the state is donated
    return jnp.zeros((slots,), jnp.int32)

  return SlotState(
      cache=cache, tokens=jnp.zeros((slots, max_new_tokens), jnp.int32),
      logprobs=jnp.zeros((slots, max_new_tokens), jnp.float32),
      window=jnp.full((slots, length), -2, jnp.int32), steps=zeros(), last=zeros(),
      prompt_lengths=zeros(), done=jnp.ones((slots,), jnp.bool_),
      finish=jnp.full((slots,), sampler.FINISH_LENGTH, jnp.int32), keys=keys,
      stop_ids=jnp.full((slots, stop_ids_width), -1, jnp.int32),
      stop_seqs=jnp.full((slots, m, length), -1, jnp.int32))


def _constrain(cache, shardings):
  return cache if shardings is None else jax.lax.with_sharding_constraint(cache, shardings)


def _prefill_impl(graphdef, params, prompts, prompt_lengths, keys, temperature, top_p,
                  stop_ids, stop_seqs, *, top_k, greedy, use_top_p, vocab_limit,
                  cache_shardings=None):
  """`cache_shardings`: None, or `(n, slots) -> KVCache` of shardings (`sampler.Shardings`)
  that the prefill cache is constrained to."""
  config = nnx.merge(graphdef, params).config
  b, p = prompts.shape
  transform = _transform(temperature, top_p, top_k, use_top_p, vocab_limit)
  place = None if cache_shardings is None else cache_shardings(b, p)
  cache = _constrain(transformer.init_cache(config, b, p), place)
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
  logits, cache = transformer.apply(graphdef, params, prompts, positions, cache,
                                    positions < prompt_lengths[:, None],
                                    logits_at=prompt_lengths - 1)
  cache = _constrain(cache, place)
  return _first_token(cache, logits[:, 0], transform, keys, stop_ids, stop_seqs, greedy)


def _first_token(cache, logits, transform, keys, stop_ids, stop_seqs, greedy) -> Prefix:
  """The `Prefix` of a prefilled `cache` whose last prompt tokens gave `logits [B, V]`."""
  tok, lp = sampler.draw_tokens(logits, transform, keys, 0, greedy)
  window = jnp.full((tok.shape[0], stop_seqs.shape[-1]), -2, jnp.int32).at[:, -1].set(tok)
  hit = sampler.stop_hits(tok, window, stop_ids, stop_seqs)
  return Prefix(cache=cache, tokens=tok, logprobs=lp, window=window, hit=hit)


def _prefix_prefill_impl(graphdef, params, saved, starts, suffixes, suffix_lengths, keys,
                         temperature, top_p, stop_ids, stop_seqs, *, top_k, greedy, use_top_p,
                         vocab_limit):
  """`prefill` of `B` requests whose first `starts` prompt tokens are in `saved` rows.

  `saved [B, n_layers, 2, n_kv_heads, Ls, head_dim]` (`prefix_cache.stack_rows`) holds each
  request's keys and values at positions `0..starts-1` (`starts <= Ls`); `suffixes [B, Bs]`
  the rest of each prompt (right-padded, `suffix_lengths` in `[1, Bs]`), prefilled at
  positions `starts..` into a `[B, Ls + Bs]` cache that attends to the saved positions."""
  config = nnx.merge(graphdef, params).config
  b, bs = suffixes.shape
  ls = saved.shape[4]
  transform = _transform(temperature, top_p, top_k, use_top_p, vocab_limit)
  pad = ((0, 0), (0, 0), (0, bs), (0, 0))
  cache = transformer.KVCache(
      k=tuple(jnp.pad(saved[:, i, 0], pad).astype(config.dtype)
              for i in range(config.n_layers)),
      v=tuple(jnp.pad(saved[:, i, 1], pad).astype(config.dtype)
              for i in range(config.n_layers)),
      valid=jnp.arange(ls + bs)[None] < starts[:, None], index=starts)
  offsets = jnp.arange(bs, dtype=jnp.int32)[None]
  logits, cache = transformer.apply(graphdef, params, suffixes, starts[:, None] + offsets,
                                    cache, offsets < suffix_lengths[:, None],
                                    logits_at=suffix_lengths - 1)
  return _first_token(cache, logits[:, 0], transform, keys, stop_ids, stop_seqs, greedy)


_PREFILL_JIT = jax.jit(_prefill_impl,
                       static_argnames=("graphdef", "top_k", "greedy", "use_top_p",
                                        "vocab_limit"))


def prefill(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array,
            prompt_lengths: jax.Array, keys: jax.Array, stop_ids: jax.Array,
            stop_seqs: jax.Array, *, transform: core_types.SamplingTransform,
            greedy: bool = False) -> Prefix:
  """Prefills `B` requests and draws their first tokens (jitted per `B`, `P`).

  Args:
    graphdef, params: the policy.
    prompts: `[B, P]` int32, right-padded (`P` a prompt bucket).
    prompt_lengths: `[B]` int32 in `[1, P]` (not checked here: `sample` checks).
    keys: `[B]` the requests' row keys (`jax.random.split(rng, N)[request]`).
    stop_ids: `[B, K]` int32, stop_seqs: `[B, M, L]` int32 (`sampler` tables).
    transform: the sampling transform; its `vocab_limit` as `sampler.check_requests`
      compiles it (0 for the whole vocabulary).
    greedy: argmax instead of a draw.

  Returns:
    a `Prefix` of `B` rows.
  """
  return _PREFILL_JIT(graphdef, params, prompts, prompt_lengths, keys,
                      jnp.float32(transform.temperature), jnp.float32(transform.top_p),
                      stop_ids, stop_seqs, top_k=transform.top_k, greedy=bool(greedy),
                      use_top_p=bool(transform.uses_top_p), vocab_limit=transform.vocab_limit)


def _insert_impl(state: SlotState, prefix: Prefix, slots, prompt_lengths, keys, stop_ids,
                 stop_seqs, pad_id) -> SlotState:
  s, t_max = state.tokens.shape
  b, p = prefix.cache.valid.shape
  cache_len = state.cache.valid.shape[1]
  # A prefix prefill's cache may be wider than the slots' (its saved and new parts are
  # bucketed apart); its positions past the cache hold no prompt token.
  p = min(p, cache_len)

  def put(x, rows):  # rows of slots `slots`; entries past S are dropped (batch padding)
    return x.at[slots].set(rows.astype(x.dtype), mode="drop")

  k = tuple(ck.at[slots, :, :p].set(pk[:, :, :p], mode="drop")
            for ck, pk in zip(state.cache.k, prefix.cache.k, strict=True))
  v = tuple(cv.at[slots, :, :p].set(pv[:, :, :p], mode="drop")
            for cv, pv in zip(state.cache.v, prefix.cache.v, strict=True))
  valid = jnp.zeros((b, cache_len), jnp.bool_).at[:, :p].set(prefix.cache.valid[:, :p])
  cache = transformer.KVCache(k=k, v=v, valid=put(state.cache.valid, valid),
                              index=put(state.cache.index, prompt_lengths))
  first = jnp.arange(t_max)[None] == 0
  done = prefix.hit | (t_max == 1)
  return SlotState(
      cache=cache,
      tokens=put(state.tokens, jnp.where(first, prefix.tokens[:, None], pad_id)),
      logprobs=put(state.logprobs, jnp.where(first, prefix.logprobs[:, None], 0.0)),
      window=put(state.window, prefix.window),
      steps=put(state.steps, jnp.ones((b,), jnp.int32)),
      last=put(state.last, prefix.tokens),
      prompt_lengths=put(state.prompt_lengths, prompt_lengths),
      done=put(state.done, done),
      finish=put(state.finish, jnp.where(prefix.hit, sampler.FINISH_STOP,
                                         sampler.FINISH_LENGTH)),
      keys=state.keys.at[slots].set(keys, mode="drop"),
      stop_ids=put(state.stop_ids, stop_ids),
      stop_seqs=put(state.stop_seqs, stop_seqs))


_INSERT_JIT = jax.jit(_insert_impl, donate_argnames=("state",))


def insert(state: SlotState, prefix: Prefix, slots: jax.Array, prompt_lengths: jax.Array,
           keys: jax.Array, stop_ids: jax.Array, stop_seqs: jax.Array,
           pad_id: int = 0) -> SlotState:
  """Writes `B` prefilled requests into slots `slots` (jitted; `state` is donated).

  Args:
    state: the decode state (its buffers are donated: do not use it afterwards).
    prefix: `prefill`'s output for the `B` requests.
    slots: `[B]` int32 slot of each request; an entry `>= S` is dropped (batch padding).
    prompt_lengths: `[B]` int32; keys: `[B]` row keys; stop_ids: `[B, K]`; stop_seqs:
      `[B, M, L]` (the tables' widths as the state's).
    pad_id: id written past a row's length.

  Returns:
    the new `SlotState`: each written slot holds its prompt's cache rows (positions `0..P-1`,
    padding invalid), its next position at its prompt length, its first token and step 1; it
    is done already if the first token stopped it (or `T == 1`).
  """
  return _INSERT_JIT(state, prefix, jnp.asarray(slots, jnp.int32),
                     jnp.asarray(prompt_lengths, jnp.int32), keys, stop_ids, stop_seqs,
                     jnp.int32(pad_id))


def _generate_impl(graphdef, params, state: SlotState, temperature, top_p, min_finished,
                   *, steps, top_k, greedy, use_top_p, vocab_limit, cache_sharding=None):
  """`cache_sharding`: None, or the `KVCache` of shardings of the state's cache that each
  step's cache is constrained to."""
  transform = _transform(temperature, top_p, top_k, use_top_p, vocab_limit)
  t_max = state.tokens.shape[1]
  done_before = jnp.sum(state.done)

  width = state.cache.valid.shape[1]

  def cond(carry):
    k, st = carry
    finished = jnp.sum(st.done)
    refill = (min_finished > 0) & (finished > done_before) & (finished >= min_finished)
    # A live slot writes at its index: stop (for the host to widen the cache) once one has
    # no room left.
    room = jnp.all(st.done | (st.cache.index < width))
    return (k < steps) & jnp.any(~st.done) & ~refill & room

  def body(carry):
    k, st = carry
    live = ~st.done
    # `last` is token `steps - 1` of the completion, at position prompt + steps - 1.
    pos = (st.prompt_lengths + st.steps - 1)[:, None]
    logits, cache = transformer.apply(graphdef, params, st.last[:, None], pos, st.cache)
    # A done (or empty) slot keeps its index: it rewrites one slot past its content.
    cache = cache._replace(index=jnp.where(live, cache.index, st.cache.index))
    cache = _constrain(cache, cache_sharding)
    tok, lp = sampler.draw_tokens(logits[:, 0], transform, st.keys, st.steps, greedy)
    at = (jnp.arange(t_max)[None] == st.steps[:, None]) & live[:, None]
    window = jnp.where(live[:, None], jnp.concatenate([st.window[:, 1:], tok[:, None]], 1),
                       st.window)
    hit = live & sampler.stop_hits(tok, window, st.stop_ids, st.stop_seqs)
    new_steps = jnp.where(live, st.steps + 1, st.steps)
    return k + 1, st._replace(
        cache=cache, tokens=jnp.where(at, tok[:, None], st.tokens),
        logprobs=jnp.where(at, lp[:, None], st.logprobs), window=window, steps=new_steps,
        last=jnp.where(live, tok, st.last),
        done=st.done | hit | (new_steps >= t_max),
        finish=jnp.where(hit, sampler.FINISH_STOP, st.finish))

  k, state = jax.lax.while_loop(cond, body, (jnp.int32(0), state))
  return state, k


_GENERATE_JIT = jax.jit(_generate_impl, donate_argnames=("state",),
                        static_argnames=("graphdef", "steps", "top_k", "greedy", "use_top_p",
                                         "vocab_limit"))


def generate(graphdef: nnx.GraphDef, params: nnx.State, state: SlotState, *,
             transform: core_types.SamplingTransform, greedy: bool = False,
             steps: int = DEFAULT_STEPS_PER_CALL,
             min_finished: int = 1) -> tuple[SlotState, jax.Array]:
  """Up to `steps` decode steps of every slot (jitted per `steps`; `state` is donated).

  Each step feeds every live slot its last token at its own position and draws the next
  (`sampler.draw_tokens` with the slot's key and step); a slot is done at a stop id, a stop
  sequence, or `T` tokens. The call also ends once a live slot has written the cache's last
  position (`sample` then widens the cache).

  Args:
    graphdef, params: the policy.
    state: the decode state (donated).
    transform, greedy: as `prefill` (the same values for the whole run).
    steps: static, the most decode steps of this call.
    min_finished: end once a slot finished in this call and at least `min_finished` slots
      are done (free for waiting requests); 0: run until every slot is done or `steps`
      steps. Traced.

  Returns:
    `(state, steps_run)`, `steps_run` an int32 scalar.
  """
  return _GENERATE_JIT(graphdef, params, state, jnp.float32(transform.temperature),
                       jnp.float32(transform.top_p), jnp.int32(min_finished), steps=steps,
                       top_k=transform.top_k, greedy=bool(greedy),
                       use_top_p=bool(transform.uses_top_p), vocab_limit=transform.vocab_limit)


def _take_impl(state: SlotState, slots):
  return state.tokens[slots], state.logprobs[slots], state.steps[slots], state.finish[slots]


_take = jax.jit(_take_impl)


def _refill_impl(graphdef, params, state, prompts, prompt_lengths, keys, stop_ids, stop_seqs,
                 slots, temperature, top_p, pad_id, *, top_k, greedy, use_top_p, vocab_limit,
                 cache_shardings=None):
  """`prefill` + `insert` in one program; also returns the slots' rows before the insert
  (the finished requests they held: `_take`)."""
  evicted = _take(state, jnp.minimum(slots, state.done.shape[0] - 1))
  prefix = _prefill_impl(graphdef, params, prompts, prompt_lengths, keys, temperature, top_p,
                         stop_ids, stop_seqs, top_k=top_k, greedy=greedy, use_top_p=use_top_p,
                         vocab_limit=vocab_limit, cache_shardings=cache_shardings)
  state = _insert_impl(state, prefix, slots, prompt_lengths, keys, stop_ids, stop_seqs, pad_id)
  return state, evicted


_REFILL_JIT = jax.jit(_refill_impl, donate_argnames=("state",),
                      static_argnames=("graphdef", "top_k", "greedy", "use_top_p",
                                       "vocab_limit"))


def _prefix_refill_impl(graphdef, params, state, saved, starts, suffixes, suffix_lengths,
                        prompt_lengths, keys, stop_ids, stop_seqs, slots, temperature, top_p,
                        pad_id, *, top_k, greedy, use_top_p, vocab_limit):
  """`_refill_impl` of requests that start from saved rows (`_prefix_prefill_impl`)."""
  evicted = _take(state, jnp.minimum(slots, state.done.shape[0] - 1))
  prefix = _prefix_prefill_impl(graphdef, params, saved, starts, suffixes, suffix_lengths,
                                keys, temperature, top_p, stop_ids, stop_seqs, top_k=top_k,
                                greedy=greedy, use_top_p=use_top_p, vocab_limit=vocab_limit)
  state = _insert_impl(state, prefix, slots, prompt_lengths, keys, stop_ids, stop_seqs, pad_id)
  return state, evicted


_PREFIX_REFILL_JIT = jax.jit(_prefix_refill_impl, donate_argnames=("state",),
                             static_argnames=("graphdef", "top_k", "greedy", "use_top_p",
                                              "vocab_limit"))


def _resize_impl(state: SlotState, *, width):
  """The state with its cache cut or padded to `width` positions (one copy of the cache)."""
  cache = state.cache
  have = cache.valid.shape[1]
  if width > have:
    pad = transformer.extend_cache(cache, width - have)
    return state._replace(cache=pad._replace(index=cache.index))
  cut = lambda x: x[:, :, :width]  # noqa: E731
  return state._replace(cache=cache._replace(
      k=tuple(cut(x) for x in cache.k), v=tuple(cut(x) for x in cache.v),
      valid=cache.valid[:, :width]))


_RESIZE_JIT = jax.jit(_resize_impl, static_argnames=("width",))  # new shapes: no donation


def _gather_impl(state: SlotState, rows):
  """The state of `len(rows)` slots: slot `i` is slot `rows[i]` of `state`."""
  return jax.tree.map(lambda x: x[rows], state)


_gather = jax.jit(_gather_impl)


# The sharded path: the same program bodies, jitted with explicit in/out shardings.


def _replicated(shardings: sampler.Shardings) -> jax.sharding.NamedSharding:
  return jax.sharding.NamedSharding(shardings.rows(1).mesh, jax.sharding.PartitionSpec())


def batch_ways(shardings: sampler.Shardings) -> int:
  """How many ways `shardings` splits rows: the size of the mesh's batch axes."""
  mesh = shardings.rows(1).mesh
  spec = shardings.rows(int(mesh.devices.size)).spec  # every batch axis divides the mesh size
  axes = spec[0] if len(spec) else None
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return int(np.prod([mesh.shape[a] for a in axes]))


def state_shardings(shardings: sampler.Shardings, slots: int, cache_len: int) -> SlotState:
  """The `SlotState` of `Sharding`s of `slots` slots of `cache_len` positions: every field
  split by slots over the batch axes (`shardings.rows`), the cache as `shardings.cache`
  places a cache of `slots` rows (key/value heads over `tensor` where they divide) with its
  per-slot `index` split like the slots."""
  rows = shardings.rows(slots)
  cache = shardings.cache(slots, cache_len)._replace(index=rows)
  return SlotState(cache, *([rows] * (len(SlotState._fields) - 1)))


@functools.lru_cache(maxsize=64)
def _sharded_init(config, shardings, slots, cache_len, max_new_tokens, stop_ids_width,
                  stop_seqs_shape):
  fn = functools.partial(init_slots, config, slots, cache_len, max_new_tokens, stop_ids_width,
                         stop_seqs_shape)
  return jax.jit(fn, in_shardings=(shardings.rows(slots),),
                 out_shardings=state_shardings(shardings, slots, cache_len))


@functools.lru_cache(maxsize=256)
def _sharded_refill(graphdef, shardings, slots, cache_len, b, top_k, greedy, use_top_p,
                    vocab_limit):
  state = state_shardings(shardings, slots, cache_len)
  rows, rep = shardings.rows(b), _replicated(shardings)
  fn = functools.partial(_refill_impl, graphdef, top_k=top_k, greedy=greedy,
                         use_top_p=use_top_p, vocab_limit=vocab_limit,
                         cache_shardings=shardings.cache)
  return jax.jit(fn, in_shardings=(shardings.params, state) + (rows,) * 6 + (rep,) * 3,
                 out_shardings=(state, (rows,) * 4), donate_argnums=1)


@functools.lru_cache(maxsize=256)
def _sharded_generate(graphdef, shardings, slots, cache_len, steps, top_k, greedy, use_top_p,
                      vocab_limit):
  state = state_shardings(shardings, slots, cache_len)
  rep = _replicated(shardings)
  fn = functools.partial(_generate_impl, graphdef, steps=steps, top_k=top_k, greedy=greedy,
                         use_top_p=use_top_p, vocab_limit=vocab_limit,
                         cache_sharding=state.cache)
  return jax.jit(fn, in_shardings=(shardings.params, state, rep, rep, rep),
                 out_shardings=(state, rep), donate_argnums=1)


@functools.lru_cache(maxsize=256)
def _sharded_resize(shardings, slots, have, width):
  return jax.jit(functools.partial(_resize_impl, width=width),
                 in_shardings=(state_shardings(shardings, slots, have),),
                 out_shardings=state_shardings(shardings, slots, width))


@functools.lru_cache(maxsize=256)
def _sharded_gather(shardings, slots, cache_len, new_slots):
  return jax.jit(_gather_impl, in_shardings=(state_shardings(shardings, slots, cache_len),
                                             _replicated(shardings)),
                 out_shardings=state_shardings(shardings, new_slots, cache_len))


@functools.lru_cache(maxsize=256)
def _sharded_take(shardings, slots, cache_len, k):
  return jax.jit(_take_impl, in_shardings=(state_shardings(shardings, slots, cache_len),
                                           _replicated(shardings)),
                 out_shardings=(shardings.rows(k),) * 4)


class _Programs(NamedTuple):
  """The programs of one `sample_with_stats` call, by state shape, and how host values
  reach them: one device (the module's jits, following the arguments' placement), or a mesh
  (`_sharded_*`, every argument placed as the program's in_shardings say)."""
  init: Callable  # (slots, cache_len, keys) -> SlotState
  refill: Callable  # (params, state, slots, cache_len, *args) -> (state, evicted)
  prefix_refill: Optional[Callable]  # the same, from saved rows (one device only)
  generate: Callable  # (params, state, slots, cache_len, *args) -> (state, steps_run)
  resize: Callable  # (state, slots, have, width) -> state
  gather: Callable  # (state, slots, cache_len, rows) -> state
  take: Callable  # (state, slots, cache_len, rows) -> evicted
  rows: Callable  # pytree of [n, ...] host rows (and `keys`: [n] device keys) -> arguments
  scalar: Callable  # a host scalar -> argument


def _put(tree):
  """`tree`'s host values on the default device: an explicit copy (`jax.transfer_guard`)."""
  return jax.device_put(tree)


# `x[rows]` of a device array `x` and device indices `rows`, in one program (indexing outside
# `jit` would copy its index constants to the device implicitly).
_pick = jax.jit(lambda x, rows: x[rows])


def _programs(graphdef, config, shardings, t_max, stop_ids_width, stop_seqs_shape, steps,
              static) -> _Programs:
  if shardings is None:
    return _Programs(
        init=lambda s, w, keys: init_slots(config, s, w, t_max, stop_ids_width,
                                           stop_seqs_shape, keys),
        refill=lambda params, state, s, w, *args: _REFILL_JIT(graphdef, params, state, *args,
                                                              **static),
        prefix_refill=lambda params, state, s, w, *args: _PREFIX_REFILL_JIT(
            graphdef, params, state, *args, **static),
        generate=lambda params, state, s, w, *args: _GENERATE_JIT(
            graphdef, params, state, *args, steps=steps, **static),
        resize=lambda state, s, have, width: _RESIZE_JIT(state, width=width),
        gather=lambda state, s, w, rows: _gather(state, _put(np.asarray(rows, np.int32))),
        take=lambda state, s, w, rows: _take(state, _put(np.asarray(rows, np.int32))),
        rows=_put, scalar=_put)
  rep = _replicated(shardings)

  def rows(tree):
    keys = tree.pop("keys", None)
    out = shardings.put_rows(tree)
    if keys is not None:
      out["keys"] = jax.device_put(keys, shardings.rows(int(keys.shape[0])))
    return out

  def scalar(x):
    return jax.device_put(x, rep)

  def index(x):
    return scalar(np.asarray(x, np.int32))

  def refill(params, state, s, w, prompts, *args):
    fn = _sharded_refill(graphdef, shardings, s, w, int(prompts.shape[0]), **static)
    return fn(params, state, prompts, *args)

  return _Programs(
      init=lambda s, w, keys: _sharded_init(config, shardings, s, w, t_max, stop_ids_width,
                                            stop_seqs_shape)(
          jax.device_put(keys, shardings.rows(s))),
      refill=refill, prefix_refill=None,
      generate=lambda params, state, s, w, *args: _sharded_generate(
          graphdef, shardings, s, w, steps, **static)(params, state, *args),
      resize=lambda state, s, have, width: _sharded_resize(shardings, s, have, width)(state),
      gather=lambda state, s, w, keep: _sharded_gather(shardings, s, w, len(keep))(
          state, index(keep)),
      take=lambda state, s, w, idx: _sharded_take(shardings, s, w, len(idx))(
          state, index(idx)),
      rows=rows, scalar=scalar)


def cache_widths(prompt_width: int, max_new_tokens: int, segments: int = 8) -> list[int]:
  """The cache widths `sample` keeps its decode state at: `P + k * C` up to `P + T`
  (`sampler.decode_segments`), `P` the longest prompt bucket.

  A decode step attends over the state's whole cache; `sample` keeps it at the smallest of
  these widths that leaves a free position to every live slot (widened as slots fill,
  narrowed when the longest request finishes), so that a step reads about as many positions
  as the fullest live slot holds, not always `P + T`.
  """
  return sampler.decode_segments(prompt_width, max_new_tokens, segments)


def _width_for(widths: Sequence[int], index: np.ndarray, live: np.ndarray) -> int:
  need = int(index[live].max()) + 1 if live.any() else 0
  return next(w for w in widths if w >= need)


def _positive_int(name: str, value) -> int:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive int, got {value!r}")
  return int(value)


def _per_request(name: str, keys, n: int) -> Optional[list]:
  if keys is None:
    return None
  if isinstance(keys, np.ndarray) and keys.ndim == 1:
    keys = keys.tolist()
  if isinstance(keys, (str, bytes)) or not isinstance(keys, collections.abc.Sequence):
    raise ValueError(f"{name} must be a sequence of N={n} keys (None: none), got "
                     f"{type(keys).__name__}")
  keys = list(keys)
  if len(keys) != n:
    raise ValueError(f"{name} must have N={n} entries (one per request), got {len(keys)}")
  for key in keys:
    if not isinstance(key, collections.abc.Hashable):
      raise ValueError(f"{name} entries must be hashable (or None), got {key!r}")
  return keys


class _Plan(NamedTuple):
  """Which requests start from which saved prefix (`_plan_prefixes`)."""
  entries: list  # [N] prefix_cache.Entry or None
  starts: np.ndarray  # [N] int64 prompt tokens taken from the entry (0: prefill whole)
  versions: np.ndarray  # [N] int64 the entry's version, -1 where none is reused
  misses: int
  mismatches: int


def _plan_prefixes(req: sampler.Requests, pool, prefix_keys, reuse_prefix: str,
                   version: int) -> _Plan:
  n = req.prompts.shape[0]
  entries = [None] * n
  starts = np.zeros((n,), np.int64)
  versions = np.full((n,), -1, np.int64)
  misses = mismatches = 0
  if reuse_prefix == "never" or prefix_keys is None:
    return _Plan(entries, starts, versions, 0, 0)
  for r, key in enumerate(prefix_keys):
    if key is None:
      continue
    entry = pool.get(key)
    if entry is None or (reuse_prefix == "same_version" and entry.version != version):
      misses += 1
      continue
    prefix_cache.check_entry(entry, req.config)
    saved = entry.tokens.size
    if saved >= req.prompt_lengths[r] or not np.array_equal(req.prompts[r, :saved],
                                                            entry.tokens):
      mismatches += 1
      continue
    entries[r], starts[r], versions[r] = entry, saved, entry.version
  return _Plan(entries, starts, versions, misses, mismatches)


def _powers_of_two(rows: np.ndarray) -> list[np.ndarray]:
  """`rows` in consecutive parts of decreasing powers of two (7 rows: 4, 2, 1)."""
  parts = []
  while rows.size:
    b = 1 << (rows.size.bit_length() - 1)
    parts.append(rows[:b])
    rows = rows[b:]
  return parts


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
    prompt_buckets: Sequence[int] = sampler.DEFAULT_PROMPT_BUCKETS,
    slots: int = DEFAULT_SLOTS,
    steps_per_call: int = DEFAULT_STEPS_PER_CALL,
    refill_batch: Optional[int] = None,
    min_slots: int = DEFAULT_MIN_SLOTS,
    shardings: Optional[sampler.Shardings] = None,
    reuse_prefix: str = "never",
    prefix_pool: Optional[prefix_cache.PrefixCache] = None,
    prefix_keys: Optional[Sequence[Optional[Hashable]]] = None,
    save_keys: Optional[Sequence[Optional[Hashable]]] = None,
    params_version: int = 0,
) -> sampler.SampleOutput:
  """Generates up to `max_new_tokens` tokens for each of N prompts with `slots` decode slots.

  The arguments and the result are those of `sampler.sample`, plus:

  Args:
    slots: `S`, requests decoded at once; a finished request's slot goes to the next
      waiting one (N may be larger or smaller than S).
    steps_per_call: the most decode steps between two host round trips while no slot
      finishes (a static size of the `generate` program).
    refill_batch: while requests wait, decoding returns to the host to refill once this many
      slots are free (or as many as requests wait), so that refills and their prefills come
      in batches; None: `max(1, slots // 16)`. The tokens do not depend on it.
    min_slots: the fewest slots the tail moves its live requests into.
    shardings: run on a mesh (`sampler.sampler_shardings`; see the module docstring):
      `params` must already be placed with `shardings.params`; the decode slots are split
      over the mesh's batch axes, so `slots` must be a multiple of their size
      (`batch_ways`), and the tail's slot counts are rounded up to one (`min_slots` too).
      Single process only: `prompts` are every request. None: one device.
    reuse_prefix: whether a request starts from a saved prefix (`prefix_cache.REUSE_PREFIX`):
      `'never'` prefills every prompt whole (`prefix_keys` unused); `'same_version'` reuses
      a named prefix only when it was computed by `params_version` (the log-probs are those
      of a full prefill, up to float rounding); `'always'` also reuses prefixes of other
      versions, reporting each request's in `Stats.prefix_versions` (`sample_with_stats`;
      the caller records it: the importance ratio against the learner's recomputed
      log-probs covers the difference). A request reuses its named entry when the entry's tokens are the start of
      its prompt and shorter than it: the saved rows fill positions `0..L-1` and only the
      rest of the prompt is prefilled (from position `L`); otherwise it is prefilled whole
      (`Stats.prefix_misses`, `Stats.prefix_mismatches`).
    prefix_pool: the `prefix_cache.PrefixCache` that `prefix_keys` are looked up in and
      `save_keys` saved into; needed with either.
    prefix_keys: None, or `N` keys (None entries: no prefix), each naming the saved
      conversation request `r`'s prompt continues, e.g. `(episode, stage - 1)`.
    save_keys: None, or `N` keys (None entries: not saved): request `r`'s conversation
      (its prompt and completion but the completion's last token: what its cache holds) is
      saved under `save_keys[r]` with version `params_version` when the call returns (a
      request cannot reuse a conversation saved in the same call). Conversations longer than
      the largest prompt bucket are not saved.
    params_version: int >= 0, the version of `params`.

  Returns:
    `sampler.SampleOutput` in request order: `[N, max_new_tokens]` int32 tokens (`pad_id`
    past `lengths`) and float32 behaviour log-probs (0 past `lengths`), `[N]` int32 lengths
    (stop tokens included) and finish reasons; with `shardings`, placed with
    `shardings.rows(N)`.

  Raises:
    ValueError: as `sampler.sample` (bad shapes, prompt lengths outside `[1, P]`, prompt +
      new tokens past `max_seq_len`, a non-positive `max_new_tokens`, a bad `transform` or
      stop ids, a prompt longer than the largest bucket), or `slots`, `steps_per_call`,
      `refill_batch` or `min_slots` not a positive int; with `shardings`, `slots` not a
      multiple of the batch axes' size, or more than one process; `reuse_prefix` not one of
      `prefix_cache.REUSE_PREFIX`; `prefix_keys` or `save_keys` not `N` hashable keys;
      `params_version` not an int >= 0; keys without a `PrefixCache` `prefix_pool`; saved
      prefixes with `shardings`; a reused entry that does not fit the model's cache.
  """
  return sample_with_stats(
      graphdef, params, prompts, prompt_lengths, rng, max_new_tokens=max_new_tokens,
      transform=transform, greedy=greedy, stop_token_ids=stop_token_ids,
      stop_sequences=stop_sequences, pad_id=pad_id, prompt_buckets=prompt_buckets,
      slots=slots, steps_per_call=steps_per_call, refill_batch=refill_batch,
      min_slots=min_slots, shardings=shardings, reuse_prefix=reuse_prefix,
      prefix_pool=prefix_pool, prefix_keys=prefix_keys, save_keys=save_keys,
      params_version=params_version)[0]


def sample_with_stats(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    prompts,
    prompt_lengths,
    rng: jax.Array,
    *,
    max_new_tokens: int,
    transform: core_types.SamplingTransform = core_types.IDENTITY_TRANSFORM,
    greedy: bool = False,
    stop_token_ids=None,
    stop_sequences=None,
    pad_id: int = 0,
    prompt_buckets: Sequence[int] = sampler.DEFAULT_PROMPT_BUCKETS,
    slots: int = DEFAULT_SLOTS,
    steps_per_call: int = DEFAULT_STEPS_PER_CALL,
    refill_batch: Optional[int] = None,
    min_slots: int = DEFAULT_MIN_SLOTS,
    shardings: Optional[sampler.Shardings] = None,
    reuse_prefix: str = "never",
    prefix_pool: Optional[prefix_cache.PrefixCache] = None,
    prefix_keys: Optional[Sequence[Optional[Hashable]]] = None,
    save_keys: Optional[Sequence[Optional[Hashable]]] = None,
    params_version: int = 0,
) -> tuple[sampler.SampleOutput, Stats]:
  """`sample`, and the `Stats` of the work it did (prefill tokens, round trips, steps).

  Raises:
    ValueError: as `sample`.
  """
  s = _positive_int("slots", slots)
  steps_per_call = _positive_int("steps_per_call", steps_per_call)
  refill_batch = max(1, s // 16) if refill_batch is None else _positive_int(
      "refill_batch", refill_batch)
  req = sampler.check_requests(graphdef, params, prompts, prompt_lengths,
                               max_new_tokens=max_new_tokens, transform=transform,
                               stop_token_ids=stop_token_ids, stop_sequences=stop_sequences)
  min_slots = _positive_int("min_slots", min_slots)
  reuse_prefix = prefix_cache.check_reuse_prefix(reuse_prefix)
  n = req.prompts.shape[0]
  prefix_keys = _per_request("prefix_keys", prefix_keys, n)
  save_keys = _per_request("save_keys", save_keys, n)
  if (not isinstance(params_version, (int, np.integer)) or isinstance(params_version, bool)
      or params_version < 0):
    raise ValueError(f"params_version must be an int >= 0, got {params_version!r}")
  uses_pool = save_keys is not None or (reuse_prefix != "never" and prefix_keys is not None)
  if uses_pool and not isinstance(prefix_pool, prefix_cache.PrefixCache):
    raise ValueError(f"prefix_pool must be a prefix_cache.PrefixCache when save_keys or "
                     f"prefix_keys (with reuse_prefix={reuse_prefix!r}) are given, got "
                     f"{type(prefix_pool).__name__}")
  if uses_pool and shardings is not None:
    raise ValueError("reuse_prefix / save_keys (saved prefixes) run on one device only: "
                     "not with shardings")
  ways = 1
  if shardings is not None:
    if parallel.process_count() > 1:
      raise ValueError("continuous.sample with shardings runs in a single process only (it "
                       "needs every process's requests)")
    ways = batch_ways(shardings)
    if s % ways:
      raise ValueError(f"slots ({s}) must be a multiple of the batch mesh axes' size {ways} "
                       "(the slots are split over them)")
  floor = -(-min_slots // ways) * ways  # the fewest slots of the tail, a multiple of `ways`
  t_max = int(max_new_tokens)
  lengths = req.prompt_lengths
  widths = cache_widths(sampler.prompt_bucket(int(lengths.max()), prompt_buckets), t_max)
  run_transform = core_types.SamplingTransform(transform.temperature, transform.top_k,
                                               transform.top_p, req.vocab_limit)
  keys = jax.random.split(rng, n)
  width = widths[0]
  static = dict(top_k=run_transform.top_k, greedy=bool(greedy),
                use_top_p=bool(run_transform.uses_top_p), vocab_limit=run_transform.vocab_limit)
  run = _programs(graphdef, req.config, shardings, t_max, req.stop_ids.shape[1],
                  req.stop_seqs.shape[1:], steps_per_call, static)
  state = run.init(s, width, jax.random.split(rng, s))
  owner = np.full((s,), -1, np.int64)  # request each slot holds (or held, once done); -1 none
  done = np.ones((s,), bool)  # the host's view: free or finished slots
  index = np.zeros((s,), np.int64)  # the host's view of each slot's next cache position
  queue = collections.deque(range(n))
  evictions = []  # (requests, their rows on the device), fetched once at the end
  prefill_tokens = prefill_calls = generate_calls = decode_steps = 0
  cache_reads = resizes = compactions = 0
  temperature, top_p, pad = (run.scalar(np.float32(transform.temperature)),
                             run.scalar(np.float32(transform.top_p)),
                             run.scalar(np.int32(pad_id)))

  plan = _plan_prefixes(req, prefix_pool, prefix_keys, reuse_prefix, int(params_version))
  starts = plan.starts
  saves = []  # (request, its conversation's length, its rows on the device)
  saved_req = np.zeros((n,), bool)
  reused_tokens = 0

  while True:
    free = np.flatnonzero(done)
    while queue and free.size:
      # A power of two of requests at a time (few compiled sizes, no padded rows): 17 free
      # slots take a refill of 16, then one of 1. Those that start from a saved prefix are
      # prefilled apart, in parts of powers of two too.
      b = 1 << (min(free.size, len(queue)).bit_length() - 1)
      rows = np.array([queue.popleft() for _ in range(b)])
      reuse = starts[rows] > 0
      for part in [rows[~reuse]] + _powers_of_two(rows[reuse]):
        if not part.size:
          continue
        g = part.size
        target = free[:g].astype(np.int32)
        if not starts[part[0]]:
          bucket = sampler.prompt_bucket(int(lengths[part].max()), prompt_buckets)
          batch = np.full((g, bucket), pad_id, np.int32)
          take = min(bucket, req.prompts.shape[1])
          batch[:, :take] = req.prompts[part, :take]
          args = run.rows({"prompts": batch, "lengths": lengths[part],
                           "keys": _pick(keys, _put(part)), "stop_ids": req.stop_ids[part],
                           "stop_seqs": req.stop_seqs[part], "slots": target})
          state, evicted = run.refill(
              params, state, s, width, args["prompts"], args["lengths"], args["keys"],
              args["stop_ids"], args["stop_seqs"], args["slots"], temperature, top_p, pad)
        else:
          saved_width = sampler.prompt_bucket(int(starts[part].max()), prompt_buckets)
          suffix_lengths = (lengths[part] - starts[part]).astype(np.int32)
          bucket = sampler.prompt_bucket(int(suffix_lengths.max()), prompt_buckets)
          batch = np.full((g, bucket), pad_id, np.int32)
          for i, r in enumerate(part):
            batch[i, :suffix_lengths[i]] = req.prompts[r, starts[r]:lengths[r]]
          saved = prefix_cache.stack_rows([plan.entries[r] for r in part], saved_width)
          state, evicted = run.prefix_refill(
              params, state, s, width, saved,
              *_put((starts[part].astype(np.int32), batch, suffix_lengths,
                     lengths[part])), _pick(keys, _put(part)),
              *_put((req.stop_ids[part], req.stop_seqs[part], target)), temperature, top_p, pad)
          reused_tokens += int(starts[part].sum())
        evictions.append((owner[target].copy(), evicted))
        owner[target] = part
        done[target] = False
        index[target] = lengths[part]
        free = free[g:]
        prefill_tokens += g * bucket
        prefill_calls += 1
    if not queue and done.all():
      break
    live = ~done
    if not queue and live.sum() <= s // 2 and s > floor:
      # The tail: the live requests move into the first of fewer slots (the rest padded
      # with a finished slot); the finished rows are handed back first.
      evictions.append((np.where(done, owner, -1), run.take(state, s, width, np.arange(s))))
      fewer = -(-(1 << (int(live.sum()) - 1).bit_length()) // ways) * ways
      keep = np.concatenate([np.flatnonzero(live), np.flatnonzero(done)])[:max(floor, fewer)]
      state = run.gather(state, s, width, keep)
      s = keep.size
      owner, done, index = np.where(live[keep], owner[keep], -1), done[keep], index[keep]
      live = ~done
      compactions += 1
    need = _width_for(widths, index, live)
    if need != width:
      state, width = run.resize(state, s, width, need), need
      resizes += 1
    if queue:
      min_finished = min(refill_batch, len(queue))
    else:  # return when the live requests fit in half the slots
      min_finished = s - s // 2 if s > floor else 0
    state, k = run.generate(params, state, s, width, temperature, top_p,
                            run.scalar(np.int32(min_finished)))
    done, index, k = jax.device_get((state.done, state.cache.index, k))
    done, index = np.array(done), np.array(index)
    if save_keys is not None:
      # A finished slot holds its conversation (prompt + completion but its last token) at
      # positions 0..index-1 until it is refilled, cut or moved: saved now.
      for slot in np.flatnonzero(done & (owner >= 0)):
        r = int(owner[slot])
        if save_keys[r] is None or saved_req[r]:
          continue
        saved_req[r] = True
        try:
          keep = sampler.prompt_bucket(int(index[slot]), prompt_buckets)
        except ValueError:  # longer than any prompt it could start
          continue
        saves.append((r, int(index[slot]), prefix_cache.save_rows(state.cache, slot, keep)))
    generate_calls += 1
    decode_steps += int(k)
    cache_reads += int(k) * s * width
  evictions.append((owner, run.take(state, s, width, np.arange(s))))
  out_tokens = np.full((n, t_max), pad_id, np.int32)
  out_lp = np.zeros((n, t_max), np.float32)
  out_len = np.zeros((n,), np.int32)
  out_finish = np.zeros((n,), np.int32)
  for requests, (tok, lp, length, finish) in jax.device_get(evictions):
    held = requests >= 0
    r = requests[held]
    out_tokens[r], out_lp[r], out_len[r], out_finish[r] = (tok[held], lp[held], length[held],
                                                           finish[held])
  for r, length, rows in saves:
    conversation = np.concatenate([req.prompts[r, :lengths[r]],
                                   out_tokens[r, :out_len[r] - 1]])
    prefix_pool.put(save_keys[r], conversation[:length], rows, int(params_version))
  out = sampler.SampleOutput(tokens=out_tokens, lengths=out_len, finish_reason=out_finish,
                             logprobs=out_lp)
  out = _put(out) if shardings is None else shardings.put_rows(out)
  return out, Stats(prompt_tokens=int(lengths.sum()), prefill_tokens=prefill_tokens,
                    prefill_calls=prefill_calls, generate_calls=generate_calls,
                    decode_steps=decode_steps, cache_reads=cache_reads, resizes=resizes,
                    compactions=compactions, reused_tokens=reused_tokens,
                    prefix_hits=int((starts > 0).sum()), prefix_misses=plan.misses,
                    prefix_mismatches=plan.mismatches, prefixes_saved=len(saves),
                    prefix_versions=None if prefix_keys is None else plan.versions)
