"""Tests for agentic_grpo.models.shared_prefill's host side: the split of grouped prompts into
shared prefixes and rests, and the choice between the shared-prefix and the whole prefill.
The prefill itself is checked against the whole prompts' in `sampler_test.SharedPrefillTest`
and on meshes in `placement_test`."""

from absl.testing import absltest
import numpy as np

from agentic_grpo.models import presets
from agentic_grpo.models import sampling_rules
from agentic_grpo.models import shared_prefill

_PROMPTS = np.array([[1, 2, 3, 4, 0], [1, 2, 3, 5, 6], [7, 8, 0, 0, 0], [7, 8, 0, 0, 0],
                     [1, 0, 0, 0, 0], [2, 3, 0, 0, 0]], np.int32)
_LENGTHS = np.array([4, 5, 2, 2, 1, 2], np.int32)


class SplitTest(absltest.TestCase):

  def test_split_shared_prefixes(self):
    split = shared_prefill.split_shared_prefixes(_PROMPTS, _LENGTHS, 2, prompt_buckets=(4, 8),
                                                 pad_id=9)
    # Common prefixes 3, 2 (identical rows: one token short of the shortest) and 0.
    np.testing.assert_array_equal(split.shared_lengths, [3, 1, 0])
    np.testing.assert_array_equal(split.group_prompts, [[1, 2, 3, 9], [7, 9, 9, 9],
                                                        [9, 9, 9, 9]])
    self.assertEqual(split.suffix.shape, (6, 8))
    np.testing.assert_array_equal(split.suffix[:, :2], [[4, 9], [5, 6], [8, 9], [8, 9],
                                                        [1, 9], [2, 3]])
    np.testing.assert_array_equal(split.suffix[:, 2:], 9)
    self.assertEqual(split.token_slots, 3 * 4 + 6 * 8)

  def test_bad_groups_and_lengths_raise(self):
    with self.assertRaisesRegex(ValueError, "group must be a positive divisor of the 6 rows"):
      shared_prefill.split_shared_prefixes(_PROMPTS, _LENGTHS, 4)
    with self.assertRaisesRegex(ValueError, "group must be a positive divisor"):
      shared_prefill.layout(_PROMPTS, _LENGTHS, 0, 16)
    with self.assertRaisesRegex(ValueError, r"prompt_lengths must be in \[1, 5\]"):
      shared_prefill.split_shared_prefixes(_PROMPTS, np.array([4, 5, 2, 2, 0, 2]), 2)


class LayoutTest(absltest.TestCase):

  def _grouped(self, group, prefix, rests, width):
    """`group` rows sharing `prefix` tokens, then rows of the given rest lengths."""
    rng = np.random.RandomState(0)
    common = rng.randint(2, 50, (prefix,))
    prompts = np.zeros((len(rests), width), np.int32)
    for r, rest in enumerate(rests):
      prompts[r, :prefix + rest] = np.concatenate([common, rng.randint(2, 50, (rest,))])
    return prompts, prefix + np.asarray(rests, np.int32)

  def test_the_shared_prefill_when_it_computes_fewer_slots(self):
    prompts, lengths = self._grouped(4, 100, [3, 9, 20, 1], 128)
    layout = shared_prefill.layout(prompts, lengths, 4, 128, pad_id=7)
    self.assertIsNotNone(layout)
    # One prefix of 100 tokens in a 128 bucket, then the loop to the longest rest: 2 chunks.
    self.assertEqual(layout.token_slots, 128 + 4 * 2 * shared_prefill.SUFFIX_CHUNK)
    self.assertEqual(layout.suffix.shape, (4, 128))  # the sampler's prompt width
    np.testing.assert_array_equal(layout.shared_lengths, [100])
    for r in range(4):
      rest = lengths[r] - 100
      np.testing.assert_array_equal(layout.suffix[r, :rest], prompts[r, 100:lengths[r]])
      np.testing.assert_array_equal(layout.suffix[r, rest:], 7)

  def test_the_whole_prefill_when_the_groups_share_little(self):
    # A 4-token prefix padded to a 16-token bucket, and rests of about the whole prompt.
    prompts, lengths = self._grouped(4, 4, [40, 50, 60, 28], 64)
    self.assertIsNone(shared_prefill.layout(prompts, lengths, 4, 64))
    # Groups of one share nothing: never cheaper than the whole prompts.
    self.assertIsNone(shared_prefill.layout(prompts, lengths, 1, 64))

  def test_slots_count_whole_chunks(self):
    # Rests of 16 and 17 tokens: one chunk and two.
    for rest, chunks in ((16, 1), (17, 2)):
      prompts, lengths = self._grouped(2, 60, [rest, 1], 128)
      layout = shared_prefill.layout(prompts, lengths, 2, 128)
      self.assertEqual(layout.token_slots,
                       sampling_rules.prompt_bucket(60) + 2 * chunks * shared_prefill.SUFFIX_CHUNK)


class CostTest(absltest.TestCase):
  """`prefill_cost`: the whole prefill's causal blocks against the loop's chunks, each scored
  against the whole cache."""

  def test_causal_pairs(self):
    # Blocks of 4 over 12 slots: 4 * 4 + 4 * 8 + 4 * 12; over 10: 4 * 4 + 4 * 8 + 2 * 10.
    self.assertEqual(shared_prefill.causal_pairs(12, 4), 16 + 32 + 48)
    self.assertEqual(shared_prefill.causal_pairs(10, 4), 16 + 32 + 20)
    # Below two blocks, and without blocks, the transformer scores all pairs.
    self.assertEqual(shared_prefill.causal_pairs(7, 4), 49)
    self.assertEqual(shared_prefill.causal_pairs(12, 0), 144)

  def test_pair_cost_of_tiny(self):
    # 4 heads of 32: 2 * 128 FLOPs-equivalents per pair over 245,760 weights per layer.
    self.assertAlmostEqual(shared_prefill.pair_cost(presets.get_model_config("tiny")),
                           1 / 960)

  def test_without_a_config_slots_alone(self):
    whole, shared = shared_prefill.prefill_cost(16, 8, 128, 64, 3, None)
    self.assertEqual(whole, 16 * 128)
    self.assertEqual(shared, 2 * 64 + 16 * 3 * shared_prefill.SUFFIX_CHUNK)

  def test_a_narrower_whole_prefill_costs_its_own_width(self):
    whole, shared = shared_prefill.prefill_cost(16, 8, 128, 64, 3, None, whole_width=96)
    self.assertEqual(whole, 16 * 96)
    self.assertEqual(shared, shared_prefill.prefill_cost(16, 8, 128, 64, 3, None)[1])
    # Rows of 80 tokens that take the loop against a whole prefill at the 128 bucket take the
    # whole prefill at 80 slots.
    prompts, lengths = self._stage(20, 60, 128)
    self.assertIsNotNone(shared_prefill.layout(prompts, lengths, 8, 128, (128,)))
    self.assertIsNone(shared_prefill.layout(prompts, lengths, 8, 128, (128,), whole_width=80))

  def _stage(self, prefix, rest, width, rows=128, group=8):
    """Rows in groups sharing `prefix` tokens, each with `rest` tokens of its own after it."""
    rng = np.random.RandomState(1)
    prompts = np.zeros((rows, width), np.int32)
    for g in range(rows // group):
      common = rng.randint(2, 200, (prefix,))
      for r in range(g * group, (g + 1) * group):
        prompts[r, :prefix + rest] = np.concatenate([common, rng.randint(2, 200, (rest,))])
    return prompts, np.full((rows,), prefix + rest, np.int32)

  def test_long_rests_take_the_whole_prefill(self):
    """A late piece of a long conversation (a 70-token task prompt, then 330 tokens of each
    attempt's own in a 448 bucket): fewer slots in the loop, but each of its chunks scores the
    whole cache, where the whole prefill scores causal blocks; with the model's config the
    whole prefill is taken. The first piece (rests of 30) keeps the loop."""
    tiny = presets.get_model_config("tiny")
    prompts, lengths = self._stage(70, 330, 448)
    self.assertIsNotNone(shared_prefill.layout(prompts, lengths, 8, 448, (256, 448)))
    self.assertIsNone(shared_prefill.layout(prompts, lengths, 8, 448, (256, 448), config=tiny))
    prompts, lengths = self._stage(70, 30, 256)
    self.assertIsNotNone(
        shared_prefill.layout(prompts, lengths, 8, 256, (256, 448), config=tiny))


if __name__ == "__main__":
  absltest.main()
