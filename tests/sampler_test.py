"""Tests for agentic_grpo.models.sampler."""

import contextlib
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import logprobs as logprobs_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.models import sampler
from agentic_grpo.models import sampling_rules
from agentic_grpo.models import shared_prefill
from agentic_grpo.models import transformer
from tests.fixtures import sampling_model

_CONFIG = sampling_model.CONFIG
_N, _P, _T = 4, 12, 8

_model = sampling_model.model


def _prompts(seed=0, lengths=(12, 3, 7, 1)):
  rng = np.random.RandomState(seed)
  prompts = rng.randint(0, _CONFIG.vocab_size, (_N, _P)).astype(np.int32)
  lengths = np.asarray(lengths, np.int32)
  prompts[np.arange(_P)[None] >= lengths[:, None]] = 0
  return prompts, lengths


def _sample(prompts, lengths, **kwargs):
  """`sampler.sample`, with `temperature`, `top_k`, `top_p`, `vocab_limit` keywords as its
  transform."""
  graphdef, params = _model()
  kwargs.setdefault("max_new_tokens", _T)
  kwargs["transform"] = core_types.SamplingTransform(
      **{k: kwargs.pop(k) for k in ("temperature", "top_k", "top_p", "vocab_limit")
         if k in kwargs})
  return sampler.sample(graphdef, params, prompts, lengths, kwargs.pop("rng", jax.random.key(3)),
                        **kwargs)


def _trace_limits(decode: int, prefill: int):
  """Patches the sampler's two jitted programs with ones that fail past `decode` and
  `prefill` traces (`chex.assert_max_traces`)."""
  stack = contextlib.ExitStack()
  stack.enter_context(mock.patch.object(sampler, "_DECODE_JIT", jax.jit(
      chex.assert_max_traces(sampler._decode_impl, n=decode),
      static_argnames=sampler._STATIC_ARGNAMES)))
  stack.enter_context(mock.patch.object(sampler, "_PREFILL_JIT", jax.jit(
      chex.assert_max_traces(sampler._prefill_impl, n=prefill),
      static_argnames=("graphdef", "width"))))
  return stack


_sequence_logprobs = jax.jit(transformer.sequence_logprobs, static_argnums=(0, 5))


def _learner_logprobs(prompts, lengths, out, new_tokens=_T, **transform):
  """Log-probs of the completion tokens recomputed by a full forward pass."""
  graphdef, params = _model()
  tokens, positions, segment_mask, loss_mask = sampler.join_prompt_completion(
      prompts, lengths, out.tokens, out.lengths)
  lp = _sequence_logprobs(graphdef, params, tokens, positions, segment_mask,
                          core_types.SamplingTransform(**transform))
  idx = np.minimum(np.asarray(lengths)[:, None] + np.arange(new_tokens)[None], lp.shape[1] - 1)
  completion_lp = np.take_along_axis(np.asarray(lp), idx, axis=1)
  mask = np.asarray(sampler.completion_mask(out.lengths, new_tokens))
  # The loss mask of the joined rows marks exactly the completion tokens.
  np.testing.assert_array_equal(np.asarray(loss_mask).sum(1), np.asarray(out.lengths))
  return np.where(mask, completion_lp, 0.0)


class SampleTest(parameterized.TestCase):

  def test_output_structure(self):
    prompts, lengths = _prompts()
    out = _sample(prompts, lengths, temperature=1.0, pad_id=5)
    chex.assert_shape([out.tokens, out.logprobs], (_N, _T))
    chex.assert_type([out.tokens, out.lengths, out.finish_reason, out.logprobs],
                     [jnp.int32, jnp.int32, jnp.int32, jnp.float32])
    np.testing.assert_array_equal(out.lengths, [_T] * _N)
    np.testing.assert_array_equal(out.finish_reason, [sampler.FINISH_LENGTH] * _N)
    self.assertTrue(np.all(np.asarray(out.logprobs) < 0))

  @parameterized.named_parameters(
      ("t1", dict(temperature=1.0)),
      ("t06", dict(temperature=0.6)),
      ("top_p09", dict(temperature=1.0, top_p=0.9)),
  )
  def test_behaviour_logprobs_equal_learner_logprobs(self, transform):
    prompts, lengths = _prompts(seed=1)
    out = _sample(prompts, lengths, rng=jax.random.key(7), **transform)
    learner = _learner_logprobs(prompts, lengths, out, **transform)
    np.testing.assert_allclose(out.logprobs, learner, atol=2e-5)
    # On policy, the importance ratio is 1.
    np.testing.assert_allclose(np.exp(learner - np.asarray(out.logprobs)), 1.0, atol=5e-5)

  def test_greedy_follows_full_forward_argmax(self):
    graphdef, params = _model()
    prompts, lengths = _prompts(seed=2)
    out = _sample(prompts, lengths, greedy=True, temperature=0.6)
    tokens, positions, segment_mask, _ = sampler.join_prompt_completion(
        prompts, lengths, out.tokens, out.lengths)
    logits, _ = transformer.apply(graphdef, params, tokens, positions,
                                  segment_mask=segment_mask)
    for n in range(_N):
      start = int(lengths[n]) - 1
      expected = np.argmax(np.asarray(logits[n, start:start + _T]), axis=-1)
      np.testing.assert_array_equal(out.tokens[n], expected)
    # Greedy log-probs are those of the transformed distribution (temperature 0.6).
    np.testing.assert_allclose(
        out.logprobs, _learner_logprobs(prompts, lengths, out, temperature=0.6), atol=2e-5)

  def test_rows_use_their_own_keys(self):
    prompts, lengths = _prompts()
    same = np.repeat(prompts[:1], _N, 0), np.repeat(lengths[:1], _N)
    a = _sample(*same, rng=jax.random.key(11))
    b = _sample(*same, rng=jax.random.key(11))
    c = _sample(*same, rng=jax.random.key(12))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    self.assertGreater(len({tuple(r) for r in np.asarray(a.tokens).tolist()}), 1)
    self.assertFalse(np.array_equal(a.tokens, c.tokens))

  def test_samples_follow_transformed_distribution(self):
    graphdef, params = _model()
    n = 512
    prompts = np.tile(np.array([[3, 1, 4, 1, 5]], np.int32), (n, 1))
    lengths = np.full((n,), 5, np.int32)
    out = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(5),
                         max_new_tokens=1,
                         transform=core_types.SamplingTransform(temperature=0.8, top_k=3))
    logits, _ = transformer.apply(graphdef, params, prompts[:1], jnp.arange(5)[None])
    probs = np.asarray(jax.nn.softmax(logprobs_lib.transform_logits(
        logits[0, -1], core_types.SamplingTransform(temperature=0.8, top_k=3))))
    freq = np.bincount(np.asarray(out.tokens[:, 0]), minlength=_CONFIG.vocab_size) / n
    self.assertEqual(set(np.flatnonzero(freq)), set(np.flatnonzero(probs > 0)) & set(
        np.flatnonzero(freq)))
    self.assertLessEqual(np.count_nonzero(freq), 3)
    np.testing.assert_allclose(freq, probs, atol=0.08)
    np.testing.assert_allclose(out.logprobs[:, 0], np.log(probs[out.tokens[:, 0]]), atol=1e-5)


class PaddedVocabTest(parameterized.TestCase):
  """An embedding with more rows than the tokenizer has ids (`vocab_limit` < `vocab_size`): the
  padded ids are never generated, greedy or sampled, and the behaviour log-probs are the
  learner's under the same transform."""

  _LIMIT = 20  # ids 20..36 of the 37-row model are "padding rows"

  def _prompts(self, n=32):
    rng = np.random.RandomState(4)
    prompts = rng.randint(0, self._LIMIT, (n, _P)).astype(np.int32)
    return prompts, rng.randint(1, _P + 1, (n,)).astype(np.int32)

  @parameterized.named_parameters(
      ("t1", dict(temperature=1.0)),
      ("t06", dict(temperature=0.6)),
      ("top_k", dict(temperature=1.0, top_k=5)),
      ("top_p", dict(temperature=1.0, top_p=0.9)),
      ("t2_top_k_top_p", dict(temperature=2.0, top_k=30, top_p=0.95)),
  )
  def test_padded_ids_never_sampled_and_logprobs_agree(self, transform):
    prompts, lengths = self._prompts()
    unlimited = _sample(prompts, lengths, rng=jax.random.key(9), **transform)
    # Without the limit this model draws padded ids: the test would catch them.
    self.assertTrue(np.any(np.asarray(unlimited.tokens) >= self._LIMIT))
    out = _sample(prompts, lengths, rng=jax.random.key(9), vocab_limit=self._LIMIT, **transform)
    self.assertTrue(np.all(np.asarray(out.tokens) < self._LIMIT))
    learner = _learner_logprobs(prompts, lengths, out, vocab_limit=self._LIMIT, **transform)
    np.testing.assert_allclose(out.logprobs, learner, atol=2e-5)
    np.testing.assert_allclose(np.exp(learner - np.asarray(out.logprobs)), 1.0, atol=5e-5)

  def test_greedy_is_argmax_over_sampleable_ids(self):
    graphdef, params = _model()
    prompts, lengths = self._prompts(8)
    unlimited = _sample(prompts, lengths, greedy=True)
    self.assertTrue(np.any(np.asarray(unlimited.tokens) >= self._LIMIT))
    out = _sample(prompts, lengths, greedy=True, temperature=0.7, vocab_limit=self._LIMIT)
    tokens, positions, segment_mask, _ = sampler.join_prompt_completion(
        prompts, lengths, out.tokens, out.lengths)
    logits, _ = transformer.apply(graphdef, params, tokens, positions,
                                  segment_mask=segment_mask)
    for n in range(len(lengths)):
      start = int(lengths[n]) - 1
      expected = np.argmax(np.asarray(logits[n, start:start + _T, :self._LIMIT]), axis=-1)
      np.testing.assert_array_equal(out.tokens[n], expected)
    np.testing.assert_allclose(
        out.logprobs, _learner_logprobs(prompts, lengths, out, temperature=0.7,
                                        vocab_limit=self._LIMIT), atol=2e-5)

  def test_stop_ids_must_be_sampleable_and_limit_within_model(self):
    prompts, lengths = _prompts()
    with self.assertRaisesRegex(ValueError, r"stop_token_ids must be ids in \[0, 20\)"):
      _sample(prompts, lengths, vocab_limit=self._LIMIT, stop_token_ids=[25])
    with self.assertRaisesRegex(ValueError, "vocab_limit"):
      _sample(prompts, lengths, vocab_limit=38)

  def test_sampleable_vocab(self):

    class _Tok:
      def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    self.assertEqual(sampling_rules.sampleable_vocab(_Tok(330), 336), 330)
    self.assertEqual(sampling_rules.sampleable_vocab(_Tok(336), 336), 0)  # no padded rows
    with self.assertRaisesRegex(ValueError, "more than the model's embedding"):
      sampling_rules.sampleable_vocab(_Tok(337), 336)
    with self.assertRaisesRegex(ValueError, "tokenizer.vocab_size"):
      sampling_rules.sampleable_vocab(object(), 336)
    with self.assertRaisesRegex(ValueError, "model_vocab_size"):
      sampling_rules.sampleable_vocab(_Tok(3), 0)


class StopAndMaskTest(parameterized.TestCase):

  def _greedy(self, **kwargs):
    prompts, lengths = _prompts(seed=4)
    return prompts, lengths, _sample(prompts, lengths, greedy=True, **kwargs)

  def test_no_stop_is_truncated(self):
    _, _, free = self._greedy()
    np.testing.assert_array_equal(free.finish_reason, [sampler.FINISH_LENGTH] * _N)
    np.testing.assert_array_equal(sampler.completion_mask(free.lengths, _T), np.ones((_N, _T)))

  def test_stops_on_any_of_several_ids(self):
    # A chat model ends on any of its eos ids (end-of-turn, end-of-text): each row stops
    # at the first greedy token in the set, whichever it is.
    prompts, lengths, free = self._greedy()
    free_tokens = np.asarray(free.tokens)
    stop = sorted({int(free_tokens[0, 2]), int(free_tokens[1, 1])})
    out = _sample(prompts, lengths, greedy=True, stop_token_ids=stop, pad_id=0)
    for i in range(_N):
      hits = np.flatnonzero(np.isin(free_tokens[i], stop))
      want = hits[0] + 1 if hits.size else _T
      self.assertEqual(int(out.lengths[i]), want, i)
      self.assertEqual(int(out.finish_reason[i]),
                       sampler.FINISH_STOP if hits.size else sampler.FINISH_LENGTH)
    self.assertLessEqual(int(out.lengths[0]), 3)
    self.assertLessEqual(int(out.lengths[1]), 2)

  def test_stop_at_first_position_with_pad_equal_to_eos(self):
    prompts, lengths, free = self._greedy()
    first = np.asarray(free.tokens[:, 0])
    # Per-row stop id = the row's first greedy token; pad id = row 0's stop id.
    pad = int(first[0])
    out = _sample(prompts, lengths, greedy=True, stop_token_ids=first[:, None], pad_id=pad)
    np.testing.assert_array_equal(out.lengths, [1] * _N)
    np.testing.assert_array_equal(out.finish_reason, [sampler.FINISH_STOP] * _N)
    np.testing.assert_array_equal(out.tokens[:, 0], first)
    np.testing.assert_array_equal(out.tokens[:, 1:], np.full((_N, _T - 1), pad))
    mask = np.asarray(sampler.completion_mask(out.lengths, _T))
    np.testing.assert_array_equal(mask, np.arange(_T)[None].repeat(_N, 0) < 1)
    # A mask from ids (token != pad) would be wrong here: row 0's real token equals pad.
    self.assertFalse(np.array_equal(np.asarray(out.tokens) != pad, mask))
    np.testing.assert_array_equal(np.asarray(out.logprobs)[:, 1:], 0.0)
    tokens, _, segment_mask, loss_mask = sampler.join_prompt_completion(
        prompts, lengths, out.tokens, out.lengths, pad_id=pad)
    for n in range(_N):
      row_mask = np.zeros(_P + _T, bool)
      row_mask[lengths[n]] = True
      np.testing.assert_array_equal(loss_mask[n], row_mask)
      self.assertEqual(int(tokens[n, lengths[n]]), first[n])
      self.assertEqual(int(segment_mask[n].sum()), lengths[n] + 1)

  def test_stop_sequence_in_last_slot(self):
    prompts, lengths, free = self._greedy()
    # Each row stops on its own full greedy completion: matched only at the last slot.
    seqs = [[list(map(int, row))] for row in np.asarray(free.tokens)]
    out = _sample(prompts, lengths, greedy=True, stop_sequences=seqs)
    np.testing.assert_array_equal(out.tokens, free.tokens)
    np.testing.assert_array_equal(out.lengths, [_T] * _N)
    np.testing.assert_array_equal(out.finish_reason, [sampler.FINISH_STOP] * _N)
    np.testing.assert_array_equal(sampler.completion_mask(out.lengths, _T), np.ones((_N, _T)))

  def test_stop_sequence_mid_completion(self):
    prompts, lengths, free = self._greedy()
    row = np.asarray(free.tokens[1])
    # Row 1 stops after its 3rd token (tokens 1..2 as a 2-token sequence), unless
    # that pair occurs earlier; other rows share the table.
    pair = [int(row[1]), int(row[2])]
    out = _sample(prompts, lengths, greedy=True, stop_sequences=[pair])
    free_rows = np.asarray(free.tokens)
    for n in range(_N):
      # Lengths at which the last two generated tokens equal the pair.
      hits = [i + 1 for i in range(1, _T) if list(free_rows[n, i - 1:i + 1]) == pair]
      expected = hits[0] if hits else _T
      self.assertEqual(int(out.lengths[n]), expected, n)
      self.assertEqual(int(out.finish_reason[n]),
                       sampler.FINISH_STOP if hits else sampler.FINISH_LENGTH)
    self.assertLessEqual(int(out.lengths[1]), 3)

  def test_encode_stop_strings(self):

    class _Bytes:
      def encode(self, s):
        return list(s.encode())

    self.assertEqual(sampling_rules.encode_stop_strings(_Bytes(), ["ab", "\n"]), [[97, 98], [10]])
    with self.assertRaisesRegex(ValueError, "non-empty"):
      sampling_rules.encode_stop_strings(_Bytes(), [""])


class CompileTest(parameterized.TestCase):

  def test_no_retrace_for_same_bucket(self):
    with _trace_limits(decode=1, prefill=1):
      # Different prompt lengths and widths (same bucket), temperatures, top-p
      # values, keys, stop ids and pad ids: one trace.
      for seed, lengths, width, temperature, top_p, stop in (
          (0, (12, 3, 7, 1), 12, 1.0, 0.9, [1]),
          (1, (2, 2, 2, 2), 5, 0.6, 0.8, [4, 5]),
          (2, (16, 9, 1, 4), 16, 1.3, 0.95, [[1], [2], [3, 4], []]),
      ):
        prompts = np.random.RandomState(seed).randint(0, 37, (_N, width))
        out = _sample(prompts, np.asarray(lengths), temperature=temperature, top_p=top_p,
                      stop_token_ids=stop, pad_id=seed, rng=jax.random.key(seed))
        jax.block_until_ready(out)
      chex.clear_trace_counter()

  def test_no_device_to_host_transfer(self):
    prompts, lengths = _prompts()
    out = _sample(prompts, lengths, stop_token_ids=[1], max_new_tokens=20)  # compiled
    jax.block_until_ready(out)
    # The whole call (prefill, every decode segment, stop checks) stays on the device.
    with jax.transfer_guard_device_to_host("disallow"):
      again = _sample(prompts, lengths, stop_token_ids=[1], max_new_tokens=20)
      jax.block_until_ready(again)
    np.testing.assert_array_equal(again.tokens, out.tokens)

  def test_decode_segments(self):
    self.assertEqual(sampler.decode_segments(64, 128), [96, 128, 160, 192])
    self.assertEqual(sampler.decode_segments(16, 16), [24, 32])
    self.assertEqual(sampler.decode_segments(8, 5), [13])
    self.assertEqual(sampler.decode_segments(8, 20), [16, 24, 28])
    with self.assertRaisesRegex(ValueError, "positive"):
      sampler.decode_segments(8, 0)

  def test_prefill_widths(self):
    self.assertEqual(sampling_rules.prefill_width(300, (256, 448), (320, 384)), 320)
    self.assertEqual(sampling_rules.prefill_width(321, (256, 448), (320, 384)), 384)
    self.assertEqual(sampling_rules.prefill_width(399, (256, 448), (320, 384)), 448)
    # A width at or above the bucket, or below the longest prompt, is never taken.
    self.assertEqual(sampling_rules.prefill_width(100, (256, 448), (320, 384)), 256)
    self.assertEqual(sampling_rules.prefill_width(100, (256, 448)), 256)
    self.assertEqual(sampling_rules.prefill_width(100, (256, 448), (64, 128)), 128)
    self.assertEqual(sampling_rules.bucket_prefill_widths(448, (256, 448), (128, 320, 384)),
                     [320, 384, 448])
    self.assertEqual(sampling_rules.bucket_prefill_widths(256, (256, 448), (128, 320)),
                     [128, 256])

  @parameterized.parameters(True, False)
  def test_a_narrower_prefill_samples_the_same(self, greedy):
    # The whole-prompt prefill at 12 slots, its cache widened to the 16 bucket's layout: the
    # bucket's tokens and log-probs, and the decode program of the bucket.
    prompts, lengths = _prompts(lengths=(12, 3, 7, 1))
    chex.clear_trace_counter()
    with _trace_limits(decode=1, prefill=2):  # one decode program for both prefills
      want = _sample(prompts, lengths, greedy=greedy, temperature=0.8)
      got = _sample(prompts, lengths, greedy=greedy, temperature=0.8, prefill_width=12)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)

  @parameterized.parameters(11, 17, -1, True, 12.0)
  def test_a_prefill_width_outside_the_longest_prompt_and_the_bucket_raises(self, width):
    prompts, lengths = _prompts(lengths=(12, 3, 7, 1))
    with self.assertRaisesRegex(ValueError, "prefill_width must be 0"):
      _sample(prompts, lengths, greedy=True, prefill_width=width)

  def test_buckets(self):
    self.assertEqual(sampling_rules.prompt_bucket(1), 16)
    self.assertEqual(sampling_rules.prompt_bucket(17, sampling_rules.DEFAULT_PROMPT_BUCKETS), 32)
    self.assertEqual(sampling_rules.prompt_bucket(5, (8, 4)), 8)
    with self.assertRaisesRegex(ValueError, "largest prompt bucket"):
      sampling_rules.prompt_bucket(9, (4, 8))


def _grouped_prompts(seed=0, group=4, groups=2, width=24):
  """`[groups * group, width]` prompts: each group's rows share a prefix of its own length
  (the first group's rows are identical), then go their own ways; ragged lengths."""
  rng = np.random.RandomState(seed)
  rows, lengths = [], []
  for g in range(groups):
    common = rng.randint(0, _CONFIG.vocab_size, (rng.randint(8, 16),))
    for r in range(group):
      rest = (np.zeros((0,), np.int64) if g == 0 else
              rng.randint(0, _CONFIG.vocab_size, (rng.randint(1, width - len(common) + 1),)))
      row = np.concatenate([common, rest])
      lengths.append(len(row))
      rows.append(np.pad(row, (0, width - len(row))))
  return np.asarray(rows, np.int32), np.asarray(lengths, np.int32)


class SharedPrefillTest(parameterized.TestCase):
  """`sample(..., prefix_group=G)`: the shared-prefix prefill."""

  @parameterized.named_parameters(("greedy", True, 1.0), ("sampled", False, 1.0),
                                  ("sampled_t07", False, 0.7))
  def test_same_tokens_and_logprobs_as_the_whole_prefill(self, greedy, temperature):
    prompts, lengths = _grouped_prompts(seed=3)
    # The shared path is the sampler's choice for these prompts.
    self.assertIsNotNone(shared_prefill.layout(prompts, lengths, 4, 32, config=_CONFIG))
    kwargs = dict(greedy=greedy, temperature=temperature, max_new_tokens=_T,
                  rng=jax.random.key(11), stop_token_ids=[1])
    whole = _sample(prompts, lengths, **kwargs)
    shared = _sample(prompts, lengths, prefix_group=4, **kwargs)
    np.testing.assert_array_equal(shared.tokens, whole.tokens)
    np.testing.assert_array_equal(shared.lengths, whole.lengths)
    np.testing.assert_allclose(shared.logprobs, whole.logprobs, atol=1e-5)
    # And the learner's full forward pass gives the same log-probs (importance ratio 1).
    learner = _learner_logprobs(prompts, lengths, shared, temperature=temperature)
    np.testing.assert_allclose(shared.logprobs, learner, atol=2e-5)

  def test_one_program_each_for_every_suffix_width_of_a_prompt_bucket(self):
    # The decode is its own program over a cache laid out as the whole prompt's, shared by the
    # whole and the shared-prefix prefill; the shared-prefix prefill's loop takes suffixes of
    # any length: one program each for calls of other suffix widths in a prompt bucket.
    calls = [(_grouped_prompts(seed=s, width=w), g) for s, w, g in ((6, 24, 4), (6, 28, 4),
                                                                     (6, 24, 1))]
    layouts = {shared_prefill.split_shared_prefixes(*prompts, 4).suffix.shape[1]
               for prompts, g in calls if g > 1}
    self.assertLen(layouts, 2)  # two suffix widths
    for (prompts, lengths), g in calls[:2]:  # both take the shared-prefix prefill
      self.assertIsNotNone(shared_prefill.layout(prompts, lengths, g, 32, config=_CONFIG))
    self.assertLen({shared_prefill.split_shared_prefixes(*prompts, 4).group_prompts.shape
                    for prompts, g in calls if g > 1}, 1)  # one prefix bucket
    self.assertEqual({sampling_rules.prompt_bucket(int(l.max())) for (_, l), _ in calls}, {32})
    # Two prefills: the shared-prefix one (both suffix widths) and the whole.
    with _trace_limits(decode=1, prefill=2):
      for (prompts, lengths), group in calls:
        out = _sample(prompts, lengths, temperature=1.0, prefix_group=group)
        whole = _sample(prompts, lengths, temperature=1.0)
        np.testing.assert_array_equal(out.tokens, whole.tokens)
      chex.clear_trace_counter()

  def test_a_group_with_a_long_prefix_beside_groups_with_long_suffixes(self):
    # The loop runs to the longest suffix (three chunks here); the rows of the group whose
    # prefix is most of the bucket write their later chunks past the bucket's slots, which
    # must leave their prompts' slots as the whole prefill has them.
    rng = np.random.RandomState(8)
    g, width = 8, 64
    prompts = np.zeros((2 * g, width), np.int32)
    lengths = np.concatenate([rng.randint(45, 57, g), rng.randint(36, 43, g)]).astype(np.int32)
    prompts[:g, :44] = rng.randint(2, _CONFIG.vocab_size, (44,))
    prompts[g:, :2] = rng.randint(2, _CONFIG.vocab_size, (2,))
    for r in range(2 * g):
      start = 44 if r < g else 2
      prompts[r, start:lengths[r]] = rng.randint(2, _CONFIG.vocab_size, (lengths[r] - start,))
    split = shared_prefill.split_shared_prefixes(prompts, lengths, g)
    offsets = np.repeat(split.shared_lengths, g)
    rest = int((lengths - offsets).max())
    self.assertGreater(rest, 2 * shared_prefill.SUFFIX_CHUNK)  # three loop steps
    # The third step's chunk starts past the bucket for the long prefix's rows.
    self.assertGreater(offsets.max() + 2 * shared_prefill.SUFFIX_CHUNK, width)
    # The shared path is taken when it computes fewer slots than the whole prompts (the
    # attention's weight in the choice held off: this model's attention is a large share of
    # its work, and with it the whole prefill would be taken).
    layout = shared_prefill.layout(prompts, lengths, g, width)
    self.assertIsNotNone(layout)
    self.assertEqual(layout.token_slots, split.group_prompts.size
                     + 2 * g * sampling_rules.round_up(rest, shared_prefill.SUFFIX_CHUNK))
    self.assertLess(layout.token_slots, 2 * g * width)
    kwargs = dict(temperature=1.0, max_new_tokens=_T, rng=jax.random.key(4),
                  stop_token_ids=[1])
    whole = _sample(prompts, lengths, **kwargs)
    shared_args = []
    real = sampler._prefill_impl

    def spy(*args, **kw):
      shared_args.append(args[4] is not None)
      return real(*args, **kw)

    with mock.patch.object(sampler, "_PREFILL_JIT",
                           jax.jit(spy, static_argnames=("graphdef", "width"))), \
         mock.patch.object(shared_prefill, "WHOLE_ATTENTION_COST", 0.0):
      shared = _sample(prompts, lengths, prefix_group=g, **kwargs)
    self.assertEqual(shared_args, [True])
    np.testing.assert_array_equal(shared.tokens, whole.tokens)
    np.testing.assert_allclose(shared.logprobs, whole.logprobs, atol=1e-5)

  def test_falls_back_to_the_whole_prefill_when_it_would_cost_more(self):
    prompts, lengths = _prompts(seed=4)  # four unrelated prompts: nothing shared
    with _trace_limits(decode=1, prefill=1):
      whole = _sample(prompts, lengths, temperature=1.0)
      grouped = _sample(prompts, lengths, temperature=1.0, prefix_group=2)  # no new trace
      chex.clear_trace_counter()
    np.testing.assert_array_equal(grouped.tokens, whole.tokens)
    np.testing.assert_array_equal(grouped.logprobs, whole.logprobs)

  @parameterized.parameters(0, 3, True, 1.5)
  def test_bad_group(self, group):
    prompts, lengths = _prompts()
    with self.assertRaisesRegex(ValueError, "prefix_group must be a positive divisor"):
      _sample(prompts, lengths, prefix_group=group)


def _ragged_prompts(n=16, width=12, seed=7):
  rng = np.random.RandomState(seed)
  lengths = rng.randint(1, width + 1, (n,)).astype(np.int32)
  prompts = rng.randint(0, _CONFIG.vocab_size, (n, width)).astype(np.int32)
  prompts[np.arange(width)[None] >= lengths[:, None]] = 0
  return prompts, lengths


# A fifth of the ids stop a row: sampled completions end after 1 to 16 tokens, most early.
_STOPS = list(range(0, _CONFIG.vocab_size, 5))


class CompactionTest(parameterized.TestCase):
  """`sample(..., compact_to=)`: the rows still generating decoded on alone."""

  def _compare(self, compact_to, prompts, lengths, **kwargs):
    kwargs.setdefault("stop_token_ids", _STOPS)
    kwargs.setdefault("max_new_tokens", 16)
    kwargs.setdefault("rng", jax.random.key(21))
    whole = jax.device_get(_sample(prompts, lengths, **kwargs))
    compact = jax.device_get(_sample(prompts, lengths, compact_to=compact_to, **kwargs))
    np.testing.assert_array_equal(compact.tokens, whole.tokens)
    np.testing.assert_array_equal(compact.lengths, whole.lengths)
    np.testing.assert_array_equal(compact.finish_reason, whole.finish_reason)
    np.testing.assert_allclose(compact.logprobs, whole.logprobs, atol=1e-5, rtol=0)
    return whole, compact

  def _assert_compacted(self, lengths, compact_to):
    """The call did compact: at some step at most `compact_to` rows, but not none, generated
    while a longer row went on (the `compact_to + 1`-th longest row ended before the longest)."""
    longest = np.sort(np.asarray(lengths))[::-1]
    self.assertLess(longest[compact_to], longest[0])

  @parameterized.named_parameters(("sampled", False, 4, 21), ("greedy", True, 4, 21),
                                  ("one_row", False, 1, 22), ("half", False, 8, 23))
  def test_same_outputs_as_the_whole_decode(self, greedy, compact_to, key):
    prompts, lengths = _ragged_prompts()
    # Greedy rows repeat themselves: other stop ids end most of them early.
    stops = list(range(1, _CONFIG.vocab_size, 3)) if greedy else _STOPS
    whole, compact = self._compare(compact_to, prompts, lengths, greedy=greedy,
                                   temperature=1.0, stop_token_ids=stops,
                                   rng=jax.random.key(key))
    self._assert_compacted(whole.lengths, compact_to)
    self.assertGreater(int(np.sum(whole.finish_reason == sampler.FINISH_STOP)), 8)
    # The behaviour log-probs are still the learner's (importance ratio 1).
    learner = _learner_logprobs(prompts, lengths, compact, new_tokens=16)
    np.testing.assert_allclose(compact.logprobs, learner, atol=2e-5)

  def test_rows_that_reach_the_limit_and_per_row_stop_tables(self):
    # Per-row stop ids and stop sequences are gathered with their rows; rows that never stop
    # end at `max_new_tokens`, after the compaction.
    prompts, lengths = _ragged_prompts(seed=8)
    per_row = [[] if i % 8 == 0 else _STOPS[i % 3::2] for i in range(16)]
    sequences = [[[3, 4]] if i % 2 else [[9]] for i in range(16)]
    whole, _ = self._compare(4, prompts, lengths, temperature=1.0, stop_token_ids=per_row,
                             stop_sequences=sequences)
    self._assert_compacted(whole.lengths, 4)
    self.assertIn(sampler.FINISH_LENGTH, whole.finish_reason.tolist())
    self.assertIn(sampler.FINISH_STOP, whole.finish_reason.tolist())

  def test_with_the_shared_prefix_prefill(self):
    prompts, lengths = _grouped_prompts(seed=3)
    whole, _ = self._compare(4, prompts, lengths, temperature=1.0, prefix_group=4,
                             max_new_tokens=_T, stop_token_ids=[1, 2, 3, 4, 5, 6, 7])
    self._assert_compacted(whole.lengths, 4)

  @parameterized.parameters(16, 40)
  def test_compact_to_at_or_above_the_row_count_changes_nothing(self, compact_to):
    prompts, lengths = _ragged_prompts()
    kwargs = dict(temperature=1.0, stop_token_ids=_STOPS, max_new_tokens=16,
                  rng=jax.random.key(21))
    whole = jax.device_get(_sample(prompts, lengths, **kwargs))
    compact = jax.device_get(_sample(prompts, lengths, compact_to=compact_to, **kwargs))
    chex.assert_trees_all_equal(compact, whole)

  @parameterized.named_parameters(("one_segment", 8, 4), ("three_segments", 16, 4),
                                  ("three_segments_to_2", 16, 2))
  def test_decode_steps_run_at_the_compacted_width(self, new_tokens, compact_to):
    # Traced: one decode loop body per segment of all 16 rows (prompts of 12: 8 new tokens do
    # not double the cache, one segment; 16 do, 2 segments), and one of `compact_to` rows.
    # Run: every row at each step until at most `compact_to` rows are undone (before step i,
    # the rows longer than i are), then those rows alone until the longest ends.
    prompts, lengths = _ragged_prompts()
    real_apply = transformer.apply
    traced, ran = [], []

    def spy(graphdef, params, tokens, *args, **kwargs):
      if tokens.shape[1] == 1:  # a decode step's body
        width = tokens.shape[0]
        traced.append(width)
        jax.debug.callback(lambda: ran.append(width))
      return real_apply(graphdef, params, tokens, *args, **kwargs)

    fresh = jax.jit(sampler._decode_impl, static_argnames=sampler._STATIC_ARGNAMES)
    with mock.patch.object(transformer, "apply", spy), \
         mock.patch.object(sampler, "_DECODE_JIT", fresh):
      out = jax.device_get(_sample(prompts, lengths, temperature=1.0, stop_token_ids=_STOPS,
                                   max_new_tokens=new_tokens, rng=jax.random.key(22),
                                   compact_to=compact_to))
    jax.effects_barrier()
    segments = len(sampler.decode_segments(12, new_tokens)) if new_tokens >= 12 else 1
    self.assertEqual(traced, [16] * segments + [compact_to])
    longest = np.sort(out.lengths)[::-1]
    self.assertLess(longest[compact_to], longest[0])
    self.assertEqual(ran.count(16), longest[compact_to] - 1)
    self.assertEqual(ran.count(compact_to), longest[0] - longest[compact_to])

  @parameterized.parameters(-1, 1.5, True)
  def test_bad_compact_to(self, compact_to):
    prompts, lengths = _ragged_prompts()
    with self.assertRaisesRegex(ValueError, "compact_to must be an int >= 0"):
      _sample(prompts, lengths, compact_to=compact_to)


class ValidationTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("rank", dict(prompts=np.zeros((4,), np.int32)), "prompts must be"),
      ("lengths_shape", dict(lengths=np.ones((3,), np.int32)), "prompt_lengths must be"),
      ("zero_length", dict(lengths=np.array([1, 0, 1, 1])), "prompt_lengths must be in"),
      ("too_long", dict(lengths=np.array([13, 1, 1, 1])), "prompt_lengths must be in"),
      ("max_new", dict(max_new_tokens=0), "max_new_tokens"),
      ("max_seq_len", dict(max_new_tokens=60), "max_seq_len"),
      ("temperature", dict(temperature=0.0), "temperature"),
      ("top_p", dict(top_p=0.0), "top_p"),
      ("stop_id", dict(stop_token_ids=[37]), "stop_token_ids"),
      ("stop_rows", dict(stop_token_ids=[[1], [2]]), "stop_token_ids must have"),
      ("empty_seq", dict(stop_sequences=[[]]), "empty sequence"),
  )
  def test_invalid(self, kwargs, match):
    prompts, lengths = _prompts()
    prompts = kwargs.pop("prompts", prompts)
    lengths = kwargs.pop("lengths", lengths)
    with self.assertRaisesRegex(ValueError, match):
      _sample(prompts, lengths, **kwargs)


if __name__ == "__main__":
  absltest.main()
