"""Continuous batching: a fixed set of decode slots, refilled as rows finish.

The static sampler (`sampler.sample`) decodes a batch until its longest row stops: a finished
row keeps its place in every decode step. Here a row that stops frees its *slot*, which the
next waiting request takes after its prefill (iteration-level scheduling: Yu et al., 2022,
"Orca: A Distributed Serving System for Transformer-Based Generative Models"; Kwon et al.,
2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention",
vLLM). The device programs (`continuous_programs`: `prefill`, `insert`, `generate`, and the
refill, resize, gather and take programs of the host loop) follow the prefill / insert / generate
split of JAX serving engines (JetStream, MaxText's engine), each a pure function under `jax.jit`.

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

It returns a `sampler.SampleOutput` with the fields and semantics of `sampler.sample`: same
checks (`sampling_rules.check_requests`), stop ids and stop sequences
(`sampling_rules.stop_hits`), transform and token draw (`sampling_rules.draw_tokens`), lengths
including the stop token(s), pad past the length, behaviour log-probs under the transform (what
`transformer.sequence_logprobs` over `sampler.join_prompt_completion` recomputes). Determinism:
request `r` draws with the key `jax.random.split(rng, N)[r]` folded with its step index, as row
`r` of the static sampler does, so its tokens do not depend on which slot it got or when. Static
and continuous batching give the same greedy tokens, and the same sampled tokens for the same
key, up to float rounding (a prefill padded to another width, attention over a cache of another
length: the log-probs agree to about 1e-6, and a token differs only where two candidates are
that close).

Shapes are static per program: slots (`S` and its halvings down to `min_slots`), cache
widths (`cache_widths`, at most 8 + 1), prefill batches of a power of two requests and prompts
padded to a bucket (`continuous_programs`).

Sharded decoding. With `shardings` (a `sampler.Shardings`, `sampler.sampler_shardings`) every
program is jitted with explicit shardings, the decode state's slots split over the mesh's batch
axes (`continuous_programs.state_shardings`), so slot counts are multiples of the batch axes'
size (`continuous_programs.batch_ways`; the tail's halvings and `min_slots` are rounded up to
one). The tokens, lengths and finish reasons are those of one device, the log-probs agree up to
float rounding. Single process only: the host loop needs every request (a multi-process run
would first gather every process's requests).

Reused conversation prefixes. Stage k+1 of an episode extends stage k's conversation (its
prompt, completion and a new opening); its prefill can start from stage k's cache rows instead
of position 0. A request that names a saved conversation (`prefix_keys`, looked up in a
`prefix_cache.PrefixCache`) whose tokens are the start of its prompt is refilled by the
prefix refill (`continuous_programs`): the saved rows (`[B, n_layers, 2, n_kv_heads, Ls,
head_dim]`, `Ls` a prompt bucket) fill positions `0..L-1` of a `[B, Ls + Bs]` prefill cache
whose per-row `index` is `L`, and only the rest of the prompt (`[B, Bs]`, `Bs` the bucket of
the longest rest) is prefilled, at positions `L..`; its first token and the insert are those of
a full prefill.
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
from typing import Hashable, NamedTuple, Optional, Sequence, Union

from flax import nnx
import jax
import numpy as np

from agentic_grpo import parallel
from agentic_grpo.core import types as core_types
from agentic_grpo.models import continuous_programs as programs_lib
from agentic_grpo.models import prefix_cache
from agentic_grpo.models import sampler
from agentic_grpo.models import sampling_rules

DEFAULT_SLOTS = 64
DEFAULT_MIN_SLOTS = 8


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


def _plan_prefixes(req: sampling_rules.Requests, pool, prefix_keys, reuse_prefix: str,
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
    prompt_buckets: Sequence[int] = sampling_rules.DEFAULT_PROMPT_BUCKETS,
    slots: int = DEFAULT_SLOTS,
    steps_per_call: int = programs_lib.DEFAULT_STEPS_PER_CALL,
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
      finishes (a static size of the `continuous_programs.generate` program).
    refill_batch: while requests wait, decoding returns to the host to refill once this many
      slots are free (or as many as requests wait), so that refills and their prefills come
      in batches; None: `max(1, slots // 16)`. The tokens do not depend on it.
    min_slots: the fewest slots the tail moves its live requests into.
    shardings: run on a mesh (`sampler.sampler_shardings`; see the module docstring):
      `params` must already be placed with `shardings.params`; the decode slots are split
      over the mesh's batch axes, so `slots` must be a multiple of their size
      (`continuous_programs.batch_ways`), and the tail's slot counts are rounded up to one
      (`min_slots` too).
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
    prompt_buckets: Sequence[int] = sampling_rules.DEFAULT_PROMPT_BUCKETS,
    slots: int = DEFAULT_SLOTS,
    steps_per_call: int = programs_lib.DEFAULT_STEPS_PER_CALL,
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
  req = sampling_rules.check_requests(graphdef, params, prompts, prompt_lengths,
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
    ways = programs_lib.batch_ways(shardings)
    if s % ways:
      raise ValueError(f"slots ({s}) must be a multiple of the batch mesh axes' size {ways} "
                       "(the slots are split over them)")
  floor = -(-min_slots // ways) * ways  # the fewest slots of the tail, a multiple of `ways`
  t_max = int(max_new_tokens)
  lengths = req.prompt_lengths
  widths = cache_widths(sampling_rules.prompt_bucket(int(lengths.max()), prompt_buckets), t_max)
  run_transform = core_types.SamplingTransform(transform.temperature, transform.top_k,
                                               transform.top_p, req.vocab_limit)
  keys = jax.random.split(rng, n)
  width = widths[0]
  static = dict(top_k=run_transform.top_k, greedy=bool(greedy),
                use_top_p=bool(run_transform.uses_top_p), vocab_limit=run_transform.vocab_limit)
  run = programs_lib.build_programs(graphdef, req.config, shardings, t_max,
                                    req.stop_ids.shape[1], req.stop_seqs.shape[1:],
                                    steps_per_call, static)
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
          bucket = sampling_rules.prompt_bucket(int(lengths[part].max()), prompt_buckets)
          batch = np.full((g, bucket), pad_id, np.int32)
          take = min(bucket, req.prompts.shape[1])
          batch[:, :take] = req.prompts[part, :take]
          args = run.rows({"prompts": batch, "lengths": lengths[part],
                           "keys": programs_lib.pick(keys, programs_lib.put(part)),
                           "stop_ids": req.stop_ids[part], "stop_seqs": req.stop_seqs[part],
                           "slots": target})
          state, evicted = run.refill(
              params, state, s, width, args["prompts"], args["lengths"], args["keys"],
              args["stop_ids"], args["stop_seqs"], args["slots"], temperature, top_p, pad)
        else:
          saved_width = sampling_rules.prompt_bucket(int(starts[part].max()), prompt_buckets)
          suffix_lengths = (lengths[part] - starts[part]).astype(np.int32)
          bucket = sampling_rules.prompt_bucket(int(suffix_lengths.max()), prompt_buckets)
          batch = np.full((g, bucket), pad_id, np.int32)
          for i, r in enumerate(part):
            batch[i, :suffix_lengths[i]] = req.prompts[r, starts[r]:lengths[r]]
          saved = prefix_cache.stack_rows([plan.entries[r] for r in part], saved_width)
          state, evicted = run.prefix_refill(
              params, state, s, width, saved,
              *programs_lib.put((starts[part].astype(np.int32), batch, suffix_lengths,
                                 lengths[part])),
              programs_lib.pick(keys, programs_lib.put(part)),
              *programs_lib.put((req.stop_ids[part], req.stop_seqs[part], target)),
              temperature, top_p, pad)
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
          keep = sampling_rules.prompt_bucket(int(index[slot]), prompt_buckets)
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
  out = programs_lib.put(out) if shardings is None else shardings.put_rows(out)
  return out, Stats(prompt_tokens=int(lengths.sum()), prefill_tokens=prefill_tokens,
                    prefill_calls=prefill_calls, generate_calls=generate_calls,
                    decode_steps=decode_steps, cache_reads=cache_reads, resizes=resizes,
                    compactions=compactions, reused_tokens=reused_tokens,
                    prefix_hits=int((starts > 0).sum()), prefix_misses=plan.misses,
                    prefix_mismatches=plan.mismatches, prefixes_saved=len(saves),
                    prefix_versions=None if prefix_keys is None else plan.versions)
