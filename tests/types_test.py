"""Tests for agentic_grpo.core.types (the typed values crossing the host/device door)."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import types as core_types


def _update(n=3, t=5):
  return core_types.UpdateBatch(
      tokens=np.zeros((n, t), np.int32), loss_mask=np.ones((n, t), bool),
      behaviour_logprobs=np.zeros((n, t), np.float32), advantages=np.ones((n, t), np.float32),
      sample_weights=np.ones((n,), np.float32))


class UpdateBatchTest(parameterized.TestCase):

  def test_padding_rows_carry_no_loss(self):
    batch = core_types.UpdateBatch.padding(4, 8).check()
    self.assertEqual(batch.tokens.shape, (4, 8))
    self.assertEqual(batch.sample_weights.shape, (4,))
    self.assertFalse(batch.loss_mask.any())
    self.assertEqual(float(batch.sample_weights.sum()), 0.0)
    with self.assertRaisesRegex(ValueError, "rows and length"):
      core_types.UpdateBatch.padding(0, 8)

  @parameterized.named_parameters(
      ("tokens_dtype", dict(tokens=np.zeros((3, 5), np.int64)),
       r"UpdateBatch\.tokens must be int32"),
      ("mask_dtype", dict(loss_mask=np.ones((3, 5), np.float32)),
       r"UpdateBatch\.loss_mask must be bool"),
      ("blp_shape", dict(behaviour_logprobs=np.zeros((3, 4), np.float32)),
       r"UpdateBatch\.behaviour_logprobs must have shape \(3, 5\)"),
      ("adv_rank", dict(advantages=np.zeros((3,), np.float32)),
       r"UpdateBatch\.advantages must be \[N, T\]"),
      ("weights_shape", dict(sample_weights=np.ones((2,), np.float32)),
       r"UpdateBatch\.sample_weights must have shape \(3,\)"),
  )
  def test_check_names_the_bad_field(self, change, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      _update()._replace(**change).check()

  def test_is_a_pytree_that_keeps_its_type(self):
    batch = jax.tree.map(jnp.asarray, _update())
    self.assertIsInstance(batch, core_types.UpdateBatch)
    self.assertLen(jax.tree.leaves(batch), 5)
    # `check` reads only shapes and dtypes: it runs on tracers too.
    total = jax.jit(lambda b: b.check().advantages.sum())(batch)
    self.assertEqual(float(total), 15.0)

  def test_sft_batch_check(self):
    core_types.SFTBatch(np.zeros((2, 3), np.int32), np.ones((2, 3), bool)).check()
    with self.assertRaisesRegex(ValueError, r"SFTBatch\.loss_mask must have shape"):
      core_types.SFTBatch(np.zeros((2, 3), np.int32), np.ones((2, 4), bool)).check()


class SamplingTransformTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("temperature", dict(temperature=0.0), "temperature"),
      ("top_k_negative", dict(top_k=-1), "top_k"),
      ("top_k_bool", dict(top_k=True), "top_k"),
      ("top_p", dict(top_p=1.5), "top_p"),
  )
  def test_invalid(self, kwargs, match):
    with self.assertRaisesRegex(ValueError, match):
      core_types.SamplingTransform(**kwargs)

  def test_hashable_by_value_and_top_p_switch(self):
    a = core_types.SamplingTransform(0.5, 3, 0.9)
    self.assertEqual(a, core_types.SamplingTransform(temperature=0.5, top_k=3, top_p=0.9))
    self.assertEqual(hash(a), hash(core_types.SamplingTransform(0.5, 3, 0.9)))
    self.assertTrue(a.uses_top_p)
    self.assertFalse(core_types.IDENTITY_TRANSFORM.uses_top_p)

  def test_check_choice(self):
    core_types.check_choice("mode", "a", ("a", "b"))
    with self.assertRaisesRegex(ValueError, r"mode must be one of \('a', 'b'\), got 'c'"):
      core_types.check_choice("mode", "c", ("a", "b"))


if __name__ == "__main__":
  absltest.main()
