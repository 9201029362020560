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
from agentic_grpo.models import placement
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
    self.assertEqual(continuous.batch_ways(shardings), 4)
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
    state = continuous.state_shardings(shardings, 8, 32)
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
