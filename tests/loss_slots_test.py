"""An update that scores its loss tokens' slots only: `learner.loss_slots` (host side), the
transformer's `query_slots` and the update steps on a batch with `UpdateBatch.loss_slots`.

The packed layout's cases (a suffix's first token scored from its prefix's last slot, and a
mesh) are in `prefix_packing_test`.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo.core import types as core_types
from agentic_grpo.models import presets
from agentic_grpo.models import transformer

N, T = 4, 40


def _model_config(**kw):
  return presets.get_model_config("tiny", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  head_dim=8, mlp_dim=64, max_seq_len=64, **kw)


def _batch(seed=0, density=0.2):
  rng = np.random.default_rng(seed)
  mask = rng.random((N, T)) < density
  mask[:, 0] = False
  mask[-1] = False  # a padding row
  return core_types.UpdateBatch(
      tokens=rng.integers(0, 256, (N, T)).astype(np.int32), loss_mask=mask,
      behaviour_logprobs=np.where(mask, -5.0 + 0.3 * rng.normal(size=(N, T)), 0.0
                                  ).astype(np.float32),
      advantages=np.where(mask, rng.normal(size=(N, T)), 0.0).astype(np.float32),
      sample_weights=np.array([1, 1, 1, 0], np.float32))


class HostTest(absltest.TestCase):

  def test_slot_widths(self):
    self.assertEqual(learner.slot_widths(512, (0.125, 0.25, 0.5)), (64, 128, 256))
    self.assertEqual(learner.slot_widths(384, (0.5, 0.125)), (48, 192))
    self.assertEqual(learner.slot_widths(20, (0.1, 1.0)), (8,))  # 2 -> 8; the whole row: none
    self.assertEqual(learner.slot_widths(64, ()), ())
    with self.assertRaisesRegex(ValueError, "fractions"):
      learner.slot_widths(64, (0.0,))
    with self.assertRaisesRegex(ValueError, "length"):
      learner.slot_widths(0, (0.5,))

  def test_slot_width_is_the_smallest_that_holds_every_row(self):
    mask = np.zeros((3, 64), bool)
    mask[0, 1:9] = True  # 8
    mask[1, 5:14] = True  # 9
    self.assertEqual(learner.slot_width(mask, (0.125, 0.25, 0.5)), 16)
    self.assertEqual(learner.slot_width(mask[:1], (0.125, 0.25, 0.5)), 8)
    self.assertEqual(learner.slot_width(mask[2:], (0.25,)), 16)  # no loss token: the smallest
    mask[2, 1:40] = True  # 39: more than half the row
    self.assertEqual(learner.slot_width(mask, (0.125, 0.25, 0.5)), 0)
    self.assertEqual(learner.slot_width(mask, ()), 0)

  def test_with_loss_slots(self):
    batch = _batch()
    width = int(batch.loss_mask.sum(1).max()) + 2
    out = learner.with_loss_slots(batch, width)
    self.assertEqual(out.loss_slots.shape, (N, width))
    self.assertEqual(out.loss_slots.dtype, np.int32)
    for r in range(N):
      slots = np.flatnonzero(batch.loss_mask[r])
      np.testing.assert_array_equal(out.loss_slots[r, :slots.size], slots)
      np.testing.assert_array_equal(out.loss_slots[r, slots.size:], 0)
    out.check()
    self.assertIs(learner.with_loss_slots(batch, 0), batch)
    with self.assertRaisesRegex(ValueError, "more than the width"):
      learner.with_loss_slots(batch, width - 3)
    with self.assertRaisesRegex(ValueError, "width"):
      learner.with_loss_slots(batch, T + 1)

  def test_check_names_bad_loss_slots(self):
    batch = _batch()
    with self.assertRaisesRegex(ValueError, r"loss_slots must be \[N=4, L\]"):
      batch._replace(loss_slots=np.zeros((N, T + 1), np.int32)).check()
    with self.assertRaisesRegex(ValueError, r"loss_slots must be \[N=4, L\]"):
      batch._replace(loss_slots=np.zeros((N - 1, 4), np.int32)).check()
    with self.assertRaisesRegex(ValueError, "loss_slots must be int32"):
      batch._replace(loss_slots=np.zeros((N, 4), np.int64)).check()


class QuerySlotsTest(parameterized.TestCase):

  @parameterized.named_parameters(("plain", 0), ("causal_blocks", 8))
  def test_logits_and_gradients_equal_the_full_forward(self, causal_block):
    config = _model_config(causal_block=causal_block)
    graphdef, params = transformer.init_model(config, 0)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 256, (2, 32)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(32), (2, 32))
    slots = jnp.asarray([[0, 3, 3, 17, 31], [30, 2, 9, 9, 0]], jnp.int32)  # any order, repeats
    weights = jnp.asarray(rng.normal(size=(2, 5, config.vocab_size)), jnp.float32)

    def full(p):
      logits, _ = transformer.apply(graphdef, p, tokens, positions)
      return jnp.take_along_axis(logits, slots[:, :, None], axis=1)

    def sliced(p):
      return transformer.apply(graphdef, p, tokens, positions, query_slots=slots)[0]

    np.testing.assert_allclose(sliced(params), full(params), atol=2e-5, rtol=0)
    g_full = jax.grad(lambda p: jnp.sum(weights * full(p)))(params)
    g_sliced = jax.grad(lambda p: jnp.sum(weights * sliced(p)))(params)
    for a, b in zip(jax.tree.leaves(g_sliced), jax.tree.leaves(g_full), strict=True):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)

  def test_bad_query_slots(self):
    graphdef, params = transformer.init_model(_model_config(), 0)
    tokens = jnp.zeros((2, 8), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(8), (2, 8))
    with self.assertRaisesRegex(ValueError, "query_slots"):
      transformer.apply(graphdef, params, tokens, positions,
                        query_slots=jnp.zeros((3, 2), jnp.int32))
    with self.assertRaisesRegex(ValueError, "logits_at"):
      transformer.apply(graphdef, params, tokens, positions,
                        query_slots=jnp.zeros((2, 2), jnp.int32),
                        logits_at=jnp.zeros((2,), jnp.int32))


def _cfg(aggregation, kl_beta, top_k, entropy_coef):
  cfg = config_lib.TrainConfig()
  return dataclasses.replace(
      cfg, rl=dataclasses.replace(cfg.rl, rows_per_update=N, top_k=top_k),
      loss=dataclasses.replace(cfg.loss, aggregation=aggregation, kl_beta=kl_beta,
                               entropy_coef=entropy_coef,
                               max_tokens=32 if aggregation == "seq_mean_token_sum_norm" else 0))


class UpdateTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # The KL term under a top-k filter scores the unfiltered distributions (a second
      # log-prob of the same logits); the entropy bonus takes a gradient through the slots.
      ("seq_mean_kl_top_k_entropy", "seq_mean_token_mean", 0.5, 20, 0.01),
      ("dr_grpo", "seq_mean_token_sum_norm", 0.0, 0, 0.0),
      ("token_mean_kl", "token_mean", 0.2, 0, 0.0),
  )
  def test_update_equals_every_slot(self, aggregation, kl_beta, top_k, entropy_coef):
    config = _model_config()
    graphdef, params = transformer.init_model(config, 0)
    ref = transformer.init_model(config, 1)[1]
    cfg = _cfg(aggregation, kl_beta, top_k, entropy_coef)
    opt = learner.make_optimizer(cfg.optim)
    step = learner.make_update_step(graphdef, cfg, opt)
    batch = _batch()
    width = learner.slot_width(batch.loss_mask, (0.25, 0.5))
    self.assertEqual(width, 16)
    sliced = learner.with_loss_slots(batch, width)
    out = []
    for b in (batch, sliced):
      state = learner.init_state(jax.tree.map(jnp.copy, params), opt, 0)
      out.append(jax.device_get(step(state, b, ref)))
    (s1, m1), (s2, m2) = out
    for key in ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "ratio_mean",
                "approx_kl", "loss_tokens", "grad_norm"):
      np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, atol=1e-7, err_msg=key)
    self.assertGreater(float(m1["grad_norm"]), 0.0)
    if kl_beta:
      self.assertGreater(float(m1["kl"]), 0.0)
    for a, b in zip(jax.tree.leaves(s2.params), jax.tree.leaves(s1.params), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)

  def test_chunks_of_several_widths_equal_the_whole_step(self):
    # A chunked update whose chunks score at different widths (and one every slot).
    config = _model_config()
    graphdef, params = transformer.init_model(config, 0)
    cfg = _cfg("seq_mean_token_mean", 0.0, 0, 0.0)
    opt = learner.make_optimizer(cfg.optim)
    batch = _batch(seed=3)
    batch.loss_mask[0, 1:30] = True  # a row with most of its slots in the loss
    batch.advantages[0, 1:30] = 1.0
    s1, m1 = learner.make_update_step(graphdef, cfg, opt)(
        learner.init_state(jax.tree.map(jnp.copy, params), opt, 0), batch, None)
    chunked = learner.make_chunked_update(graphdef, cfg, opt)
    chunks = learner.split_chunks(batch, 1, N)
    weights = np.stack([learner.chunk_weights(batch.loss_mask, mode, 1)
                        for mode in ("seq_mean_token_mean", "token_mean")], axis=1)
    state = learner.init_state(jax.tree.map(jnp.copy, params), opt, 0)
    acc = chunked.init(state.params)
    widths = []
    for chunk, w in zip(chunks, weights, strict=True):
      width = learner.slot_width(chunk.loss_mask, (0.25, 0.5))
      widths.append(width)
      acc = chunked.grad(state.params, acc, learner.with_loss_slots(chunk, width), None, w)
    s2, m2 = chunked.apply(state, acc)
    self.assertEqual(widths, [0, 16, 16, 16])
    for key in ("loss", "pg_loss", "entropy", "loss_tokens", "grad_norm"):
      np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for a, b in zip(jax.tree.leaves(s2.params), jax.tree.leaves(s1.params), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


if __name__ == "__main__":
  absltest.main()
