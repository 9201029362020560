"""Tests for agentic_grpo.models.continuous (continuous batching against the static sampler)."""


from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np

from agentic_grpo import parallel
from agentic_grpo.core import types as core_types
from agentic_grpo.models import continuous
from agentic_grpo.models import continuous_programs
from agentic_grpo.models import placement
from agentic_grpo.models import prefix_cache
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer
from tests.fixtures import sampling_model

_CONFIG = sampling_model.CONFIG
_N, _P, _T = 10, 12, 8

_model = sampling_model.model


def _prompts(seed=0, n=_N):
  """Ragged prompts: lengths 1..P, some beyond the smallest bucket's half."""
  rng = np.random.RandomState(seed)
  prompts = rng.randint(0, _CONFIG.vocab_size, (n, _P)).astype(np.int32)
  lengths = rng.randint(1, _P + 1, (n,)).astype(np.int32)
  lengths[:2] = (1, _P)
  prompts[np.arange(_P)[None] >= lengths[:, None]] = 0
  return prompts, lengths


def _both(prompts, lengths, *, slots=3, steps_per_call=4, rng=None, **kwargs):
  """(static, continuous) outputs of the same call."""
  graphdef, params = _model()
  kwargs.setdefault("max_new_tokens", _T)
  rng = jax.random.key(3) if rng is None else rng
  static = sampler.sample(graphdef, params, prompts, lengths, rng, **kwargs)
  cont = continuous.sample(graphdef, params, prompts, lengths, rng, slots=slots,
                           steps_per_call=steps_per_call, **kwargs)
  return static, cont


def _assert_same(static, cont, atol=2e-5):
  np.testing.assert_array_equal(cont.tokens, static.tokens)
  np.testing.assert_array_equal(cont.lengths, static.lengths)
  np.testing.assert_array_equal(cont.finish_reason, static.finish_reason)
  np.testing.assert_allclose(cont.logprobs, static.logprobs, atol=atol)


def _free_greedy(prompts, lengths):
  graphdef, params = _model()
  return np.asarray(sampler.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                                   max_new_tokens=_T, greedy=True).tokens)


_sequence_logprobs = jax.jit(transformer.sequence_logprobs, static_argnums=(0, 5))


class ContinuousTest(parameterized.TestCase):

  def test_output_structure(self):
    prompts, lengths = _prompts()
    _, out = _both(prompts, lengths, pad_id=5)
    chex.assert_shape([out.tokens, out.logprobs], (_N, _T))
    chex.assert_type([out.tokens, out.lengths, out.finish_reason, out.logprobs],
                     [jnp.int32, jnp.int32, jnp.int32, jnp.float32])
    np.testing.assert_array_equal(out.lengths, [_T] * _N)
    np.testing.assert_array_equal(out.finish_reason, [sampler.FINISH_LENGTH] * _N)

  @parameterized.named_parameters(
      ("slots_reused", 3, 4),
      ("one_slot_one_step", 1, 1),
      ("more_slots_than_rows", 16, 32),
  )
  def test_greedy_equals_static_with_stops(self, slots, steps_per_call):
    prompts, lengths = _prompts(seed=1)
    free = _free_greedy(prompts, lengths)
    # Stop ids and a stop sequence taken from the free completions, so that rows stop at
    # different lengths (some at their first token) and slots are freed at different times.
    stop_ids = sorted({int(free[2, 0]), int(free[3, 4])})
    seqs = [[int(free[4, 1]), int(free[4, 2])]]
    static, cont = _both(prompts, lengths, greedy=True, transform=core_types.SamplingTransform(
        temperature=0.7), stop_token_ids=stop_ids, stop_sequences=seqs, pad_id=stop_ids[0],
                         slots=slots, steps_per_call=steps_per_call)
    _assert_same(static, cont)
    # The workload is ragged: some rows stop early, some run to the end.
    self.assertIn(sampler.FINISH_STOP, np.asarray(cont.finish_reason).tolist())
    self.assertIn(sampler.FINISH_LENGTH, np.asarray(cont.finish_reason).tolist())
    self.assertGreater(len(set(np.asarray(cont.lengths).tolist())), 2)
    self.assertEqual(int(cont.lengths[2]), 1)

  def test_per_row_stop_tables(self):
    prompts, lengths = _prompts(seed=2)
    free = _free_greedy(prompts, lengths)
    stop_ids = [[int(free[i, i % _T])] for i in range(_N)]
    seqs = [[[int(free[i, (i + 1) % _T])]] for i in range(_N)]
    static, cont = _both(prompts, lengths, greedy=True, stop_token_ids=stop_ids,
                         stop_sequences=seqs)
    _assert_same(static, cont)
    self.assertTrue(np.all(np.asarray(cont.lengths) <= np.arange(_N) % _T + 1))

  @parameterized.named_parameters(
      ("t1", dict(temperature=1.0)),
      ("t06_top_k", dict(temperature=0.6, top_k=5)),
      ("top_p", dict(temperature=1.0, top_p=0.9)),
      ("vocab_limit", dict(temperature=1.3, vocab_limit=20)),
  )
  def test_sampling_equals_static_for_the_same_seed(self, transform):
    prompts, lengths = _prompts(seed=3, n=24)
    stop = [1, 2]
    static, cont = _both(prompts, lengths, rng=jax.random.key(7), stop_token_ids=stop,
                         transform=core_types.SamplingTransform(**transform), slots=5)
    # Each request draws with its own row key and step: the same tokens as the static
    # sampler's row, whichever slot and round it ran in.
    _assert_same(static, cont)
    self.assertGreater(len({tuple(r) for r in np.asarray(cont.tokens).tolist()}), _N)
    other = continuous.sample(*_model(), prompts, lengths, jax.random.key(8),
                              max_new_tokens=_T, stop_token_ids=stop, slots=5,
                              transform=core_types.SamplingTransform(**transform))
    self.assertFalse(np.array_equal(other.tokens, cont.tokens))

  def test_tokens_do_not_depend_on_slots(self):
    prompts, lengths = _prompts(seed=4, n=16)
    graphdef, params = _model()
    outs = [continuous.sample(graphdef, params, prompts, lengths, jax.random.key(5),
                              max_new_tokens=_T, stop_token_ids=[4], slots=slots,
                              steps_per_call=steps, refill_batch=refill)
            for slots, steps, refill in ((2, 3, 1), (7, 1, 3), (32, 8, None))]
    for out in outs[1:]:
      _assert_same(outs[0], out, atol=1e-5)

  @parameterized.named_parameters(
      ("t1", dict(temperature=1.0)),
      ("top_p", dict(temperature=0.8, top_p=0.9)),
  )
  def test_behaviour_logprobs_equal_learner_logprobs(self, transform):
    graphdef, params = _model()
    prompts, lengths = _prompts(seed=5)
    out = continuous.sample(graphdef, params, prompts, lengths, jax.random.key(9),
                            max_new_tokens=_T, stop_token_ids=[6], slots=4,
                            transform=core_types.SamplingTransform(**transform))
    tokens, positions, segment_mask, loss_mask = sampler.join_prompt_completion(
        prompts, lengths, out.tokens, out.lengths)
    lp = np.asarray(_sequence_logprobs(graphdef, params, tokens, positions, segment_mask,
                                       core_types.SamplingTransform(**transform)))
    idx = np.minimum(lengths[:, None] + np.arange(_T)[None], lp.shape[1] - 1)
    mask = np.asarray(sampler.completion_mask(out.lengths, _T))
    learner = np.where(mask, np.take_along_axis(lp, idx, axis=1), 0.0)
    np.testing.assert_array_equal(np.asarray(loss_mask).sum(1), np.asarray(out.lengths))
    np.testing.assert_allclose(out.logprobs, learner, atol=2e-5)
    np.testing.assert_allclose(np.exp(learner - np.asarray(out.logprobs)), 1.0, atol=5e-5)
    np.testing.assert_array_equal(np.asarray(out.logprobs)[~mask], 0.0)

  def test_every_row_stops_at_its_first_token(self):
    prompts, lengths = _prompts(seed=6)
    first = _free_greedy(prompts, lengths)[:, 0]
    static, cont = _both(prompts, lengths, greedy=True, stop_token_ids=first[:, None],
                         pad_id=int(first[0]))
    _assert_same(static, cont)
    np.testing.assert_array_equal(cont.lengths, [1] * _N)
    np.testing.assert_array_equal(cont.tokens[:, 1:], np.full((_N, _T - 1), first[0]))

  def test_one_new_token(self):
    prompts, lengths = _prompts(seed=7)
    static, cont = _both(prompts, lengths, max_new_tokens=1, rng=jax.random.key(2))
    _assert_same(static, cont)

  def test_stats(self):
    graphdef, params = _model()
    prompts, lengths = _prompts(seed=8)
    _, stats = continuous.sample_with_stats(graphdef, params, prompts, lengths,
                                            jax.random.key(1), max_new_tokens=_T, slots=4)
    self.assertEqual(stats.prompt_tokens, int(lengths.sum()))
    self.assertGreaterEqual(stats.prefill_tokens, stats.prompt_tokens)
    # No stops: 4 slots, 10 rows of 8 tokens, 7 decode steps each -> at least 3 rounds.
    self.assertGreaterEqual(stats.decode_steps, 3 * (_T - 1))
    self.assertGreaterEqual(stats.prefill_calls, 3)

  @parameterized.named_parameters(
      ("greedy", True, None),
      ("sampled", False, dict(temperature=1.0, top_p=0.95)),
  )
  def test_width_and_tail_bounds_keep_tokens(self, greedy, transform):
    graphdef, params = _model()
    prompts, lengths = _prompts(seed=9, n=24)
    t = 40  # cache widths 24, 32, .., 56: the state is widened as slots fill
    free = np.asarray(sampler.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                                     max_new_tokens=t, greedy=True).tokens)
    # Stops at a few tokens of the free completions: lengths from 1 to t, most short.
    stop = sorted({int(free[i, j]) for i, j in ((0, 3), (1, 9), (2, 0))})
    kwargs = dict(max_new_tokens=t, greedy=greedy, stop_token_ids=stop,
                  transform=core_types.SamplingTransform(**(transform or {})))
    static = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(4), **kwargs)
    runs = {m: continuous.sample_with_stats(graphdef, params, prompts, lengths,
                                            jax.random.key(4), slots=16, steps_per_call=8,
                                            min_slots=m, **kwargs) for m in (1, 16)}
    for out, _ in runs.values():
      _assert_same(static, out)
    out, stats = runs[1]
    self.assertGreater(int(np.ptp(np.asarray(out.lengths))), t // 2)
    if greedy:
      self.assertIn(sampler.FINISH_LENGTH, np.asarray(out.finish_reason).tolist())
    # The tail ran in fewer slots, and the cache was kept narrower than P + T.
    self.assertGreaterEqual(stats.compactions, 2)
    self.assertEqual(runs[16][1].compactions, 0)
    self.assertGreaterEqual(stats.resizes, 2)
    full = stats.decode_steps * 16 * (16 + t)
    self.assertLess(stats.cache_reads, 0.6 * full)
    self.assertLess(stats.cache_reads, runs[16][1].cache_reads)

  def test_cache_widths(self):
    self.assertEqual(continuous.cache_widths(16, 40), [24, 32, 40, 48, 56])
    self.assertEqual(continuous.cache_widths(64, 256)[-1], 320)
    self.assertEqual(continuous.cache_widths(16, 8), [24])


_STOP = [3]
_OPENING = 5  # new tokens of stage 2 after stage 1's conversation


def _stage_one(greedy, seed=11, n=_N):
  """Stage 1 (`prompts`, `lengths`), saved under keys `(r, 1)`: (output, pool)."""
  graphdef, params = _model()
  prompts, lengths = _prompts(seed=seed, n=n)
  pool = prefix_cache.PrefixCache(1 << 30)
  out, stats = continuous.sample_with_stats(
      graphdef, params, prompts, lengths, jax.random.key(1), max_new_tokens=_T, greedy=greedy,
      stop_token_ids=_STOP, slots=3, steps_per_call=4, prefix_pool=pool,
      save_keys=[(r, 1) for r in range(n)])
  return prompts, lengths, out, stats, pool


def _stage_two(prompts, lengths, out, seed=12):
  """Stage 2 prompts: stage 1's prompt + completion + `_OPENING` new tokens, `[N, W]`."""
  rng = np.random.RandomState(seed)
  tokens, done = np.asarray(out.tokens), np.asarray(out.lengths)
  conv = [np.concatenate([prompts[r, :lengths[r]], tokens[r, :done[r]],
                          rng.randint(0, _CONFIG.vocab_size, _OPENING)])
          for r in range(len(lengths))]
  new_lengths = np.array([c.size for c in conv], np.int32)
  new = np.zeros((len(conv), int(new_lengths.max())), np.int32)
  for r, c in enumerate(conv):
    new[r, :c.size] = c
  return new, new_lengths


def _run_stage_two(prompts, lengths, *, params=None, greedy=False, **kwargs):
  graphdef, base = _model()
  return continuous.sample_with_stats(
      graphdef, base if params is None else params, prompts, lengths, jax.random.key(2),
      max_new_tokens=_T, greedy=greedy, stop_token_ids=_STOP, slots=3, steps_per_call=4,
      transform=core_types.SamplingTransform(temperature=1.0, top_p=0.95), **kwargs)


def _assert_outputs_equal(got, want, atol=1e-5):
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.lengths, want.lengths)
  np.testing.assert_array_equal(got.finish_reason, want.finish_reason)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=atol)


class PrefixReuseTest(parameterized.TestCase):
  """Stage 2 of a conversation starts from stage 1's saved cache rows (`reuse_prefix`)."""

  @parameterized.named_parameters(("greedy", True), ("sampled", False))
  def test_same_version_reuse_gives_the_logprobs_of_a_full_prefill(self, greedy):
    prompts, lengths, out, stats, pool = _stage_one(greedy)
    self.assertEqual(stats.prefixes_saved, _N)
    self.assertLen(pool, _N)
    self.assertIn(sampler.FINISH_STOP, np.asarray(out.finish_reason).tolist())
    new, new_lengths = _stage_two(prompts, lengths, out)
    keys = [None] + [(r, 1) for r in range(1, _N)]  # request 0 is prefilled whole
    full, full_stats = _run_stage_two(new, new_lengths, greedy=greedy)
    got, got_stats = _run_stage_two(new, new_lengths, greedy=greedy,
                                    reuse_prefix="same_version", prefix_pool=pool,
                                    prefix_keys=keys)
    _assert_outputs_equal(got, full)
    # Saved: each stage-1 prompt and completion but its last token.
    saved = lengths + np.asarray(out.lengths) - 1
    self.assertEqual(got_stats.prefix_hits, _N - 1)
    self.assertEqual(got_stats.reused_tokens, int(saved[1:].sum()))
    np.testing.assert_array_equal(got_stats.prefix_versions, [-1] + [0] * (_N - 1))
    self.assertEqual((got_stats.prefix_misses, got_stats.prefix_mismatches), (0, 0))
    self.assertEqual(got_stats.prompt_tokens, full_stats.prompt_tokens)
    self.assertLess(got_stats.prefill_tokens, 0.6 * full_stats.prefill_tokens)
    # And the learner's log-probs of the whole conversation.
    graphdef, params = _model()
    transform = core_types.SamplingTransform(temperature=1.0, top_p=0.95)
    tokens, positions, segment_mask, _ = sampler.join_prompt_completion(
        new, new_lengths, got.tokens, got.lengths)
    lp = np.asarray(_sequence_logprobs(graphdef, params, tokens, positions, segment_mask,
                                       transform))
    idx = np.minimum(new_lengths[:, None] + np.arange(_T)[None], lp.shape[1] - 1)
    mask = np.asarray(sampler.completion_mask(got.lengths, _T))
    np.testing.assert_allclose(got.logprobs, np.where(mask, np.take_along_axis(lp, idx, 1), 0),
                               atol=2e-5)

  def test_never_is_the_plain_call(self):
    prompts, lengths, out, _, pool = _stage_one(False)
    new, new_lengths = _stage_two(prompts, lengths, out)
    plain, plain_stats = _run_stage_two(new, new_lengths)
    never, never_stats = _run_stage_two(new, new_lengths, reuse_prefix="never",
                                        prefix_pool=pool,
                                        prefix_keys=[(r, 1) for r in range(_N)])
    for a, b in zip(never, plain, strict=True):  # bit for bit
      np.testing.assert_array_equal(a, b)
    self.assertEqual(never_stats._replace(prefix_versions=None), plain_stats)
    np.testing.assert_array_equal(never_stats.prefix_versions, [-1] * _N)
    # Saving the conversations does not change the outputs either.
    saving, saving_stats = _run_stage_two(new, new_lengths, prefix_pool=pool,
                                          save_keys=[(r, 2) for r in range(_N)])
    for a, b in zip(saving, plain, strict=True):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(saving_stats.prefixes_saved, _N)
    self.assertLen(pool, 2 * _N)

  def test_always_reuses_an_older_version_and_reports_it(self):
    prompts, lengths, out, _, pool = _stage_one(False)
    new, new_lengths = _stage_two(prompts, lengths, out)
    keys = [(r, 1) for r in range(_N)]
    full, _ = _run_stage_two(new, new_lengths)
    same, same_stats = _run_stage_two(new, new_lengths, reuse_prefix="same_version",
                                      prefix_pool=pool, prefix_keys=keys, params_version=1)
    self.assertEqual((same_stats.prefix_hits, same_stats.prefix_misses), (0, _N))
    self.assertEqual(same_stats.reused_tokens, 0)
    np.testing.assert_array_equal(same_stats.prefix_versions, [-1] * _N)
    for a, b in zip(same, full, strict=True):
      np.testing.assert_array_equal(a, b)
    # The same weights under a new version number: reused, reported as version 0.
    always, always_stats = _run_stage_two(new, new_lengths, reuse_prefix="always",
                                          prefix_pool=pool, prefix_keys=keys,
                                          params_version=1)
    self.assertEqual((always_stats.prefix_hits, always_stats.prefix_misses), (_N, 0))
    np.testing.assert_array_equal(always_stats.prefix_versions, [0] * _N)
    _assert_outputs_equal(always, full)
    # New weights: the stale prefix is kept, so the log-probs are not a full prefill's.
    _, params = _model()
    moved = jax.tree.map(lambda x: x * 1.05, params)
    stale, stale_stats = _run_stage_two(new, new_lengths, params=moved, greedy=True,
                                        reuse_prefix="always", prefix_pool=pool,
                                        prefix_keys=keys, params_version=1)
    fresh, _ = _run_stage_two(new, new_lengths, params=moved, greedy=True)
    self.assertEqual(stale_stats.prefix_hits, _N)
    self.assertGreater(float(np.abs(np.asarray(stale.logprobs[:, 0])
                                    - np.asarray(fresh.logprobs[:, 0])).max()), 1e-3)

  def test_eviction_under_a_tiny_budget_falls_back_to_full_prefill(self):
    prompts, lengths, out, _, big = _stage_one(True)
    new, new_lengths = _stage_two(prompts, lengths, out)
    entries = [big.get((r, 1)) for r in range(_N)]
    pool = prefix_cache.PrefixCache(2 * max(e.nbytes for e in entries))
    for r, e in enumerate(entries):
      pool.put((r, 1), e.tokens, e.rows, e.version)
    self.assertLessEqual(len(pool), 2)
    self.assertGreaterEqual(pool.evictions, _N - 2)
    self.assertLessEqual(pool.nbytes, pool.budget_bytes)
    self.assertIn((_N - 1, 1), pool)  # the most recently saved are kept
    self.assertNotIn((0, 1), pool)
    full, _ = _run_stage_two(new, new_lengths, greedy=True)
    got, stats = _run_stage_two(new, new_lengths, greedy=True, reuse_prefix="same_version",
                                prefix_pool=pool, prefix_keys=[(r, 1) for r in range(_N)])
    self.assertEqual(stats.prefix_hits, len(pool))
    self.assertEqual(stats.prefix_misses, _N - len(pool))
    _assert_outputs_equal(got, full)

  def test_a_prefix_whose_tokens_differ_is_not_reused(self):
    prompts, lengths, out, _, pool = _stage_one(True)
    new, new_lengths = _stage_two(prompts, lengths, out)
    new[1, 0] = (new[1, 0] + 1) % _CONFIG.vocab_size  # differs at its first token
    new[2, lengths[2] - 1] = (new[2, lengths[2] - 1] + 1) % _CONFIG.vocab_size
    # Request 3's prompt is its saved conversation exactly: nothing left to prefill.
    saved = pool.get((3, 1)).tokens
    new[3] = 0
    new[3, :saved.size] = saved
    new_lengths[3] = saved.size
    full, _ = _run_stage_two(new, new_lengths, greedy=True)
    got, stats = _run_stage_two(new, new_lengths, greedy=True, reuse_prefix="always",
                                prefix_pool=pool, prefix_keys=[(r, 1) for r in range(_N)])
    self.assertEqual(stats.prefix_mismatches, 3)
    self.assertEqual(stats.prefix_hits, _N - 3)
    np.testing.assert_array_equal(np.asarray(stats.prefix_versions)[1:4], [-1] * 3)
    _assert_outputs_equal(got, full)

  def test_pool_is_least_recently_used(self):
    rows = jnp.zeros((2, 2, 2, 16, 8), jnp.float32)
    one = prefix_cache.Entry(np.zeros((4,), np.int32), rows, 0).nbytes
    pool = prefix_cache.PrefixCache(2 * one)
    for key in "ab":
      self.assertTrue(pool.put(key, np.zeros((4,), np.int32), rows, 0))
    self.assertIsNotNone(pool.get("a"))  # "b" is now the least recently used
    pool.put("c", np.zeros((4,), np.int32), rows, 3)
    self.assertEqual(sorted(k for k in "abc" if k in pool), ["a", "c"])
    self.assertEqual((pool.evictions, pool.nbytes), (1, 2 * one))
    self.assertEqual(pool.get("c").version, 3)
    big = jnp.zeros((2, 2, 2, 64, 8), jnp.float32)
    self.assertFalse(pool.put("d", np.zeros((4,), np.int32), big, 0))
    self.assertNotIn("d", pool)
    with self.assertRaisesRegex(ValueError, "budget_bytes"):
      prefix_cache.PrefixCache(0)
    with self.assertRaisesRegex(ValueError, "rows must be"):
      pool.put("e", np.zeros((17,), np.int32), rows, 0)
    with self.assertRaisesRegex(ValueError, "reuse_prefix must be one of"):
      prefix_cache.check_reuse_prefix("sometimes")

  @parameterized.named_parameters(
      ("mode", dict(reuse_prefix="sometimes"), "reuse_prefix must be one of"),
      ("mode_type", dict(reuse_prefix=None), "reuse_prefix must be one of"),
      ("no_pool", dict(reuse_prefix="always", prefix_keys=[0] * _N), "prefix_pool must be"),
      ("save_no_pool", dict(save_keys=[0] * _N), "prefix_pool must be"),
      ("keys_length", dict(reuse_prefix="always", prefix_keys=[0], pool=True),
       "prefix_keys must have N=10"),
      ("keys_type", dict(save_keys="abc", pool=True), "save_keys must be a sequence"),
      ("unhashable", dict(save_keys=[[0]] * _N, pool=True), "save_keys entries must be"),
      ("version", dict(params_version=-1), "params_version must be an int"),
  )
  def test_invalid(self, kwargs, match):
    graphdef, params = _model()
    prompts, lengths = _prompts()
    if kwargs.pop("pool", False):
      kwargs["prefix_pool"] = prefix_cache.PrefixCache(1 << 20)
    with self.assertRaisesRegex(ValueError, match):
      continuous.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                        max_new_tokens=_T, **kwargs)

  def test_entries_of_another_model_are_refused(self):
    graphdef, params = _model()
    prompts, lengths = _prompts()
    pool = prefix_cache.PrefixCache(1 << 20)
    pool.put("x", prompts[0, :1], jnp.zeros((1, 2, 2, 16, 8), jnp.float32), 0)
    with self.assertRaisesRegex(ValueError, "does not fit this model"):
      continuous.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                        max_new_tokens=_T, reuse_prefix="always", prefix_pool=pool,
                        prefix_keys=["x"] * _N)


class ShardedTest(parameterized.TestCase):
  """On meshes of the 8 simulated CPU devices (conftest.py): the same results as one device."""

  @parameterized.named_parameters(
      ("greedy_data2_fsdp2_tensor2", True, (2, 2, 2)),
      ("sampled_data4_tensor2", False, (4, 1, 2)),
  )
  def test_sharded_equals_one_device(self, greedy, shape):
    graphdef, params = _model()
    mesh = parallel.make_mesh(shape)
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    self.assertEqual(continuous_programs.batch_ways(shardings), 4)
    placed = placement.device_put_params(params, placement.shard_model(_CONFIG, mesh))
    prompts, lengths = _prompts(seed=10, n=20)
    t = 24  # cache widths 24, 32, 40: the state is widened as slots fill
    free = np.asarray(sampler.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                                     max_new_tokens=t, greedy=True).tokens)
    stop = sorted({int(free[i, j]) for i, j in ((0, 3), (1, 9), (2, 0))})
    kwargs = dict(max_new_tokens=t, greedy=greedy, stop_token_ids=stop, slots=8,
                  steps_per_call=4, min_slots=1,
                  transform=core_types.SamplingTransform(temperature=1.0, top_p=0.95))
    want, _ = continuous.sample_with_stats(graphdef, params, prompts, lengths,
                                           jax.random.key(6), **kwargs)
    got, stats = continuous.sample_with_stats(graphdef, placed, prompts, lengths,
                                              jax.random.key(6), shardings=shardings, **kwargs)
    _assert_same(want, got)
    self.assertGreater(len(set(np.asarray(got.lengths).tolist())), 2)
    # Refills, widenings and a move into fewer slots (8 -> 4: min_slots rounded up to the
    # batch axes' size) all ran sharded.
    self.assertGreaterEqual(stats.prefill_calls, 2)
    self.assertGreaterEqual(stats.resizes, 1)
    self.assertEqual(stats.compactions, 1)
    for field in got:
      self.assertTrue(field.sharding.is_equivalent_to(shardings.rows(20), field.ndim))
    state = continuous_programs.state_shardings(shardings, 8, 32)
    kv = "tensor"  # 2 kv heads over a tensor axis of 2
    self.assertEqual(state.cache.k[0].spec, P(("data", "fsdp"), kv, None, None))
    self.assertEqual(state.cache.index.spec, P(("data", "fsdp")))
    self.assertEqual(state.tokens.spec, P(("data", "fsdp")))

  def test_slots_must_divide_over_the_batch_axes(self):
    graphdef, params = _model()
    mesh = parallel.make_mesh((2, 2, 2))
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    placed = placement.device_put_params(params, placement.shard_model(_CONFIG, mesh))
    prompts, lengths = _prompts()
    with self.assertRaisesRegex(ValueError, r"slots \(6\) must be a multiple of .* 4"):
      continuous.sample(graphdef, placed, prompts, lengths, jax.random.key(0),
                        max_new_tokens=_T, slots=6, shardings=shardings)

  def test_saved_prefixes_are_one_device_only(self):
    graphdef, params = _model()
    mesh = parallel.make_mesh((2, 2, 2))
    shardings = sampler.sampler_shardings(_CONFIG, mesh)
    placed = placement.device_put_params(params, placement.shard_model(_CONFIG, mesh))
    prompts, lengths = _prompts()
    with self.assertRaisesRegex(ValueError, "one device only: not with shardings"):
      continuous.sample(graphdef, placed, prompts, lengths, jax.random.key(0),
                        max_new_tokens=_T, slots=8, shardings=shardings,
                        prefix_pool=prefix_cache.PrefixCache(1 << 20), save_keys=[0] * _N)


class PerRowCacheIndexTest(absltest.TestCase):

  def test_per_row_index_equals_scalar_index(self):
    graphdef, params = _model()
    cache = transformer.init_cache(_CONFIG, 3, 16)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 37, (3, 5)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(5), (3, 5))
    want, want_cache = transformer.apply(graphdef, params, tokens, positions, cache)
    rows = cache._replace(index=jnp.zeros((3,), jnp.int32))
    got, got_cache = transformer.apply(graphdef, params, tokens, positions, rows)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_array_equal(got_cache.valid, want_cache.valid)
    np.testing.assert_array_equal(got_cache.index, [5, 5, 5])
    # Rows at different slots: each writes its own slot and sees its own history.
    step = jnp.asarray([[1], [2], [3]], jnp.int32)
    shifted = got_cache._replace(index=jnp.asarray([5, 3, 5], jnp.int32))
    _, after = transformer.apply(graphdef, params, step, step + 4, shifted)
    np.testing.assert_array_equal(after.index, [6, 4, 6])
    k_before, k_after = np.asarray(shifted.k[0]), np.asarray(after.k[0])
    self.assertFalse(np.allclose(k_after[1, :, 3], k_before[1, :, 3]))  # row 1 rewrote slot 3
    np.testing.assert_array_equal(k_after[1, :, 5], 0.0)  # and left slot 5 empty
    self.assertTrue(np.all(np.abs(k_after[[0, 2], :, 5]).sum(-1) > 0))
    np.testing.assert_array_equal(np.asarray(after.valid).sum(1), [6, 5, 6])

  def test_bad_index_rank(self):
    graphdef, params = _model()
    cache = transformer.init_cache(_CONFIG, 2, 8)
    cache = cache._replace(index=jnp.zeros((2, 1), jnp.int32))
    with self.assertRaisesRegex(ValueError, "cache.index"):
      transformer.apply(graphdef, params, jnp.zeros((2, 1), jnp.int32),
                        jnp.zeros((2, 1), jnp.int32), cache)


class ValidationTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("slots", dict(slots=0), "slots must be a positive int"),
      ("slots_bool", dict(slots=True), "slots must be a positive int"),
      ("steps", dict(steps_per_call=0), "steps_per_call must be a positive int"),
      ("refill_batch", dict(refill_batch=0), "refill_batch must be a positive int"),
      ("min_slots", dict(min_slots=0), "min_slots must be a positive int"),
      ("rank", dict(prompts=np.zeros((4,), np.int32)), "prompts must be"),
      ("zero_length", dict(lengths=np.zeros((_N,), np.int32)), "prompt_lengths must be in"),
      ("max_new", dict(max_new_tokens=0), "max_new_tokens"),
      ("max_seq_len", dict(max_new_tokens=60), "max_seq_len"),
      ("stop_id", dict(stop_token_ids=[37]), "stop_token_ids"),
      ("empty_seq", dict(stop_sequences=[[]]), "empty sequence"),
      ("bucket", dict(prompt_buckets=(4, 8)), "largest prompt bucket"),
      ("transform", dict(transform="greedy"), "transform must be a SamplingTransform"),
  )
  def test_invalid(self, kwargs, match):
    graphdef, params = _model()
    prompts, lengths = _prompts()
    prompts = kwargs.pop("prompts", prompts)
    lengths = kwargs.pop("lengths", lengths)
    kwargs.setdefault("max_new_tokens", _T)
    with self.assertRaisesRegex(ValueError, match):
      continuous.sample(graphdef, params, prompts, lengths, jax.random.key(0), **kwargs)


if __name__ == "__main__":
  absltest.main()
