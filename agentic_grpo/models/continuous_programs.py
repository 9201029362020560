"""Continuous batching's device programs: the decode state of a fixed set of slots and the
jitted programs that fill, step, resize and read it (`continuous.sample` is the host loop).

The programs follow the prefill / insert / generate split of JAX serving engines (JetStream,
MaxText's engine), each a pure function under `jax.jit`:

* `prefill`: a few requests, prompts padded to a prompt bucket, through the model with a
  fresh `[B, P]` KV cache; draws each request's first token (`Prefix`).
* `insert`: writes the prefilled cache rows, first tokens and per-request tables (row keys,
  stop ids, stop sequences) into free slots of the decode state (`SlotState`, a
  `[S, cache_len]` KV cache whose `index` is per slot: each slot writes at its own position).
* `generate`: up to `steps` decode steps of every slot in one `lax.while_loop`, ending early
  once enough slots finished while requests are waiting (so that the host can refill them),
  or when every slot is done.
* the host loop's own programs: a refill (prefill, insert, and the finished rows it replaces,
  in one program; from saved conversation prefixes too), a resize of the cache width, a
  gather of live slots into fewer, a take of finished rows.

Shapes are static per program: slots, cache widths, prefill batches and prompt buckets; the
transform's `temperature` and `top_p` values, keys and stop tables are traced. The decode state
is donated to `insert`, `generate` and the refills (updated in place where the backend allows
it).

Sharded decoding. With `shardings` (a `sampler.Shardings`, `sampler.sampler_shardings`) every
program is jitted with explicit `in_shardings`/`out_shardings` (`_sharded_*`, cached per
shape): parameters as placed by `shardings.params`; the decode state's slots split over the
mesh's batch axes (`state_shardings`: every field by slots, the cache as `shardings.cache`
places it, key/value heads over `tensor` where they divide, its per-slot `index` like the
slots), so slot counts are multiples of the batch axes' size (`batch_ways`); a prefill's
`[B, P]` cache and each decode step's cache are also constrained inside the program with
`jax.lax.with_sharding_constraint`, as in the static sampler; host values are placed with
`shardings.put_rows` (0-d ones replicated). `build_programs` hands the host loop one call's
programs, on one device or over a mesh, behind one interface (`Programs`).
"""

import functools
from typing import Callable, NamedTuple, Optional

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import types as core_types
from agentic_grpo.models import sampler
from agentic_grpo.models import sampling_rules
from agentic_grpo.models import transformer

DEFAULT_STEPS_PER_CALL = 32


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
  tok, lp = sampling_rules.draw_tokens(logits, transform, keys, 0, greedy)
  window = jnp.full((tok.shape[0], stop_seqs.shape[-1]), -2, jnp.int32).at[:, -1].set(tok)
  hit = sampling_rules.stop_hits(tok, window, stop_ids, stop_seqs)
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
    transform: the sampling transform; its `vocab_limit` as `sampling_rules.check_requests`
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
    tok, lp = sampling_rules.draw_tokens(logits[:, 0], transform, st.keys, st.steps, greedy)
    at = (jnp.arange(t_max)[None] == st.steps[:, None]) & live[:, None]
    window = jnp.where(live[:, None], jnp.concatenate([st.window[:, 1:], tok[:, None]], 1),
                       st.window)
    hit = live & sampling_rules.stop_hits(tok, window, st.stop_ids, st.stop_seqs)
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
  (`sampling_rules.draw_tokens` with the slot's key and step); a slot is done at a stop id, a stop
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


class Programs(NamedTuple):
  """The programs of one `continuous.sample_with_stats` call, by state shape, and how host values
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


def put(tree):
  """`tree`'s host values on the default device: an explicit copy (`jax.transfer_guard`)."""
  return jax.device_put(tree)


# `x[rows]` of a device array `x` and device indices `rows`, in one program (indexing outside
# `jit` would copy its index constants to the device implicitly).
pick = jax.jit(lambda x, rows: x[rows])


def build_programs(graphdef, config, shardings, t_max, stop_ids_width, stop_seqs_shape,
                   steps, static) -> Programs:
  """The programs of one host-loop call (`Programs`): the module's jits on one device
  (`shardings` None), or the `_sharded_*` programs over `shardings`' mesh."""
  if shardings is None:
    return Programs(
        init=lambda s, w, keys: init_slots(config, s, w, t_max, stop_ids_width,
                                           stop_seqs_shape, keys),
        refill=lambda params, state, s, w, *args: _REFILL_JIT(graphdef, params, state, *args,
                                                              **static),
        prefix_refill=lambda params, state, s, w, *args: _PREFIX_REFILL_JIT(
            graphdef, params, state, *args, **static),
        generate=lambda params, state, s, w, *args: _GENERATE_JIT(
            graphdef, params, state, *args, steps=steps, **static),
        resize=lambda state, s, have, width: _RESIZE_JIT(state, width=width),
        gather=lambda state, s, w, rows: _gather(state, put(np.asarray(rows, np.int32))),
        take=lambda state, s, w, rows: _take(state, put(np.asarray(rows, np.int32))),
        rows=put, scalar=put)
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

  return Programs(
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
