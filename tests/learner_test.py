"""Tests for agentic_grpo.learner.

The jitted steps are built once per class (compilation dominates the run time).
"""

import dataclasses

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo.core import losses as losses_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.models import presets
from agentic_grpo.models import transformer

N, T = 4, 16


def _model_config():
  return presets.get_model_config("tiny", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                  head_dim=16, mlp_dim=64, max_seq_len=64)


def _cfg(micro_batches):
  cfg = config_lib.TrainConfig()
  return dataclasses.replace(
      cfg,
      rl=dataclasses.replace(cfg.rl, micro_batches=micro_batches, rows_per_update=N),
      # seq_mean_token_mean: micro-batch weights differ from token counts, the harder case.
      loss=dataclasses.replace(cfg.loss, aggregation="seq_mean_token_mean", kl_beta=0.5))


def _batch(seed=0, t=T):
  rng = np.random.default_rng(seed)
  mask = rng.random((N, t)) < 0.6
  mask[:, 0] = False
  mask[-1] = False  # A padding row.
  return {
      "tokens": rng.integers(0, 256, (N, t)).astype(np.int32),
      "loss_mask": mask,
      "behaviour_logprobs": np.where(mask, -5.0 + 0.1 * rng.normal(size=(N, t)), 0.0
                                     ).astype(np.float32),
      "advantages": np.where(mask, rng.normal(size=(N, t)), 0.0).astype(np.float32),
      "sample_weights": np.array([1, 1, 1, 0], np.float32),
  }


class LearnerTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graphdef, _ = transformer.init_model(_model_config(), 0)
    cls.sh = learner.Shardings.replicated()
    cls.cfg = _cfg(1)
    cls.opt = learner.make_optimizer(cls.cfg.optim)
    cls.step = learner.make_update_step(cls.graphdef, cls.cfg, cls.opt, shardings=cls.sh)
    cls.step2 = learner.make_update_step(cls.graphdef, _cfg(2), cls.opt, shardings=cls.sh)

  def _state(self, seed=0):
    params = transformer.init_model(_model_config(), seed)[1]
    return jax.device_put(learner.init_state(params, self.opt, 0), self.sh.state)

  def _ref(self, seed=0):
    return jax.device_put(transformer.init_model(_model_config(), seed)[1], self.sh.ref_params)

  def test_micro_batches_match_full_batch(self):
    batch = core_types.UpdateBatch(**_batch())
    s1, m1 = self.step(self._state(), batch, self._ref(1))
    s2, m2 = self.step2(self._state(), batch, self._ref(1))
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m1["kl"], m2["kl"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    self.assertEqual(int(s1.step), 1)

  def test_chunked_update_matches_full_batch(self):
    # Chunks of one row (the KL term on, seq_mean_token_mean's per-row weights) accumulate to
    # the whole step's loss, metrics and parameters.
    batch = core_types.UpdateBatch(**_batch())
    ref = self._ref(1)
    s1, m1 = self.step(self._state(), batch, ref)
    chunked = learner.make_chunked_update(self.graphdef, self.cfg, self.opt, shardings=self.sh)
    weights = np.stack([learner.chunk_weights(batch.loss_mask, mode, 1)
                        for mode in ("seq_mean_token_mean", "token_mean")], axis=1)
    state = self._state()
    acc = chunked.init(state.params)
    for i in range(N):
      chunk = jax.tree.map(lambda a, i=i: a[i:i + 1], batch)
      acc = chunked.grad(state.params, acc, chunk, ref, weights[i])
    s2, m2 = chunked.apply(state, acc)
    for key in ("loss", "kl", "pg_loss", "entropy", "clip_fraction", "ratio_mean",
                "approx_kl", "loss_tokens", "grad_norm"):
      np.testing.assert_allclose(m2[key], m1[key], rtol=1e-4, atol=1e-6, err_msg=key)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    self.assertEqual(int(s2.step), 1)
    self.assertEqual(weights[-1].tolist(), [0.0, 0.0])  # the padding row weighs nothing

  def test_real_chunks_and_split_chunks(self):
    batch = core_types.UpdateBatch.padding(8, 5)
    batch.sample_weights[:3] = 1.0
    batch.tokens[:3] = 7
    self.assertEqual(learner.real_chunks(batch, 2), 2)  # 3 real rows, trailing padding
    self.assertEqual(learner.real_chunks(core_types.UpdateBatch.padding(4, 5), 2), 1)
    chunks = learner.split_chunks(batch, 2, 2)  # cut to 4 rows
    self.assertEqual([c.tokens.shape for c in chunks], [(2, 5), (2, 5)])
    np.testing.assert_array_equal(chunks[1].tokens[0], 7)
    np.testing.assert_array_equal(chunks[1].sample_weights, [1.0, 0.0])
    chunks = learner.split_chunks(batch, 3, 4)  # padded to 12 rows with padding rows
    self.assertLen(chunks, 4)
    self.assertEqual(float(sum(c.sample_weights.sum() for c in chunks)), 3.0)
    self.assertFalse(chunks[-1].loss_mask.any())

  def test_chunk_weights(self):
    mask = np.zeros((4, 3), bool)
    mask[0, :2] = mask[1, 0] = mask[2, :] = True
    np.testing.assert_allclose(learner.chunk_weights(mask, "token_mean", 2), [0.5, 0.5])
    np.testing.assert_allclose(learner.chunk_weights(mask, "seq_mean_token_mean", 2),
                               [2 / 3, 1 / 3])
    np.testing.assert_allclose(learner.chunk_weights(mask, "seq_mean_token_sum_norm", 2),
                               [1.0, 1.0])
    np.testing.assert_allclose(learner.chunk_weights(mask, "token_mean", 2,
                                                     combine=lambda d: 2 * d), [0.5, 0.5])
    with self.assertRaisesRegex(ValueError, "chunk_rows"):
      learner.chunk_weights(mask, "token_mean", 3)
    with self.assertRaisesRegex(ValueError, "aggregation"):
      learner.chunk_weights(mask, "sum", 2)

  def test_nonfinite_update_is_skipped_and_counted(self):
    batch = _batch()
    r, c = np.argwhere(batch["loss_mask"])[0]
    batch["advantages"][r, c] = np.nan
    state = self._state()
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = self.step(state, core_types.UpdateBatch(**batch), self._ref())
    self.assertEqual(float(metrics["update_skipped"]), 1.0)
    self.assertEqual(learner.nonfinite_count(state), 1)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params), strict=True):
      np.testing.assert_array_equal(a, b)
    state, metrics = self.step(state, core_types.UpdateBatch(**_batch(1)), self._ref())
    self.assertEqual(float(metrics["update_skipped"]), 0.0)
    self.assertTrue(all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params)))
    self.assertEqual(learner.nonfinite_count(state), 1)

  def test_consecutive_skips_are_counted_and_stop_the_run(self):
    bad = _batch()
    bad["advantages"][bad["loss_mask"]] = np.nan
    state, seen = self._state(), []
    for _ in range(3):
      state, metrics = self.step(state, core_types.UpdateBatch(**bad), self._ref())
      seen.append(jax.device_get(metrics))
    self.assertEqual([m["nonfinite_consecutive"] for m in seen], [1.0, 2.0, 3.0])
    learner.check_skipped_updates(seen[:2], 3, 2)  # below the limit: no error
    learner.check_skipped_updates(seen, 0, 3)  # 0: never
    with self.assertRaisesRegex(learner.NonFiniteUpdatesError,
                                r"3 consecutive updates were skipped.*max_skipped_updates=3"):
      learner.check_skipped_updates(seen, 3, 3)
    self.assertTrue(issubclass(learner.NonFiniteUpdatesError, RuntimeError))
    state, metrics = self.step(state, core_types.UpdateBatch(**_batch(1)), self._ref())
    self.assertEqual(float(metrics["nonfinite_consecutive"]), 0.0)  # a finite update resets it
    self.assertEqual(learner.nonfinite_count(state), 3)

  def test_kl_under_top_k_is_between_unfiltered_distributions(self):
    # Tokens are the reference's greedy choices and top_k = 1: under the filter the policy
    # (another init) gives many of them log-prob -1e30 where the reference gives 0, so a KL of
    # filtered log-probs is ~1e30 with NaN gradients and every update would be skipped.
    cfg = dataclasses.replace(self.cfg, rl=dataclasses.replace(self.cfg.rl, top_k=1,
                                                               temperature=0.7))
    step = learner.make_update_step(self.graphdef, cfg, self.opt, shardings=self.sh)
    ref = self._ref(1)
    apply = jax.jit(transformer.apply, static_argnums=0)
    batch = _batch()
    tokens = batch["tokens"]
    positions = np.broadcast_to(np.arange(T, dtype=np.int32), (N, T))
    for t in range(T - 1):
      logits = apply(self.graphdef, ref, jnp.asarray(tokens), jnp.asarray(positions))[0]
      tokens[:, t + 1] = np.asarray(jnp.argmax(logits[:, t], -1))
    state = self._state(0)
    lp = lambda params, **kw: np.asarray(transformer.sequence_logprobs(
        self.graphdef, params, jnp.asarray(tokens), jnp.asarray(positions), None,
        core_types.SamplingTransform(**kw)))
    filtered = lp(state.params, temperature=0.7, top_k=1)
    mask = batch["loss_mask"]
    self.assertTrue(np.any(mask & (filtered < -1e29)))  # the trigger is present
    batch["behaviour_logprobs"] = np.where(mask, filtered, 0.0).astype(np.float32)
    pol, ref_lp = lp(state.params, temperature=0.7), lp(ref, temperature=0.7)
    want_kl = losses_lib.aggregate(losses_lib.kl_penalty(pol, ref_lp), mask,
                                   "seq_mean_token_mean")
    state, metrics = step(state, core_types.UpdateBatch(**batch), ref)
    self.assertEqual(float(metrics["update_skipped"]), 0.0)
    self.assertTrue(all(np.all(np.isfinite(v)) for v in jax.device_get(metrics).values()))
    np.testing.assert_allclose(metrics["kl"], want_kl, rtol=1e-4)
    self.assertGreater(float(metrics["kl"]), 0.0)
    # The ratio still uses the filtered (behaviour) distribution: on-policy, ratio 1.
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, atol=1e-5)

  def test_gradient_clipping(self):
    # With a huge Adam eps the update is lr * g / eps: linear in the (clipped) gradient.
    grads = {"w": jnp.full((4,), 10.0)}
    for clip, want_norm in ((1.0, 1.0), (0.0, 20.0)):
      opt = learner.make_optimizer(dataclasses.replace(
          config_lib.OptimSection(), grad_clip=clip, eps=1e6, learning_rate=1.0))
      updates, _ = jax.jit(opt.update)(grads, opt.init(grads), grads)
      np.testing.assert_allclose(optax.tree.norm(updates) * 1e6, want_norm, rtol=1e-3)

  def test_cosine_decay_reaches_final_fraction(self):
    # b1 = 0 and a huge eps: the update is lr(t) * g / eps, so it traces the schedule.
    grads = {"w": jnp.ones((2,))}
    optim = dataclasses.replace(config_lib.OptimSection(), b1=0.0, eps=1e6, learning_rate=1.0,
                                grad_clip=0.0)
    opt = learner.make_optimizer(optim, decay_steps=4, final_lr_fraction=0.25)
    state, lrs = opt.init(grads), []
    for _ in range(5):
      updates, state = opt.update(grads, state, grads)
      lrs.append(-float(updates["w"][0]) * 1e6)
    np.testing.assert_allclose(lrs[0], 1.0, rtol=1e-4)
    np.testing.assert_allclose(lrs[4], 0.25, rtol=1e-4)
    self.assertTrue(all(a > b for a, b in zip(lrs[:-1], lrs[1:], strict=True)), lrs)

  def test_reference_kl(self):
    batch = core_types.UpdateBatch(**_batch())
    _, same = self.step(self._state(0), batch, self._ref(0))
    self.assertAlmostEqual(float(same["kl"]), 0.0, places=6)
    _, other = self.step(self._state(0), batch, self._ref(1))
    self.assertGreater(float(other["kl"]), 0.0)
    np.testing.assert_allclose(other["loss"], other["pg_loss"] + 0.5 * other["kl"], rtol=1e-5)

  def test_on_policy_ratio_donation_and_no_recompile(self):
    state = self._state()
    batch = _batch()
    lp = transformer.sequence_logprobs(self.graphdef, state.params, jnp.asarray(batch["tokens"]),
                                       jnp.broadcast_to(jnp.arange(T), (N, T)), None)
    batch["behaviour_logprobs"] = np.where(batch["loss_mask"], np.asarray(lp), 0.0)
    traces = self.step.num_traces
    old_leaf = jax.tree.leaves(state.params)[0]
    state, metrics = self.step(state, core_types.UpdateBatch(**batch), self._ref())
    self.assertTrue(old_leaf.is_deleted())  # The state was donated.
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, atol=1e-5)
    self.assertEqual(float(metrics["clip_fraction"]), 0.0)
    for seed in (1, 2):
      state, _ = self.step(state, core_types.UpdateBatch(**_batch(seed)), self._ref())
    self.assertLessEqual(self.step.num_traces, max(traces, 1))  # Compiled once at most.
    self.step(state, core_types.UpdateBatch(**_batch(3, t=2 * T)), self._ref())
    self.assertEqual(self.step.num_traces, max(traces, 1) + 1)  # A new bucket compiles once.

  def test_sft_step_learns(self):
    opt = learner.make_optimizer(self.cfg.optim, learning_rate=1e-2)
    state = jax.device_put(learner.init_state(self._state().params, opt, 0), self.sh.state)
    step = learner.make_sft_step(self.graphdef, self.cfg, opt, shardings=self.sh)
    batch = core_types.SFTBatch(_batch()["tokens"], _batch()["loss_mask"])
    losses = []
    for _ in range(8):
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    self.assertLess(losses[-1], 0.7 * losses[0])
    self.assertEqual(step.num_traces, 1)


class PaddedVocabLearnerTest(absltest.TestCase):
  """A model with padded embedding rows (`vocab_limit` < `vocab_size`): the learner's log-probs
  are normalised over the same ids as the sampler's, so the ratio is 1 on policy."""

  _LIMIT = 200  # ids 200..268 of the tiny preset's 269 rows are "padding rows"

  def test_update_and_sft_steps_use_the_sampler_vocab_limit(self):
    graphdef, params = transformer.init_model(_model_config(), 0)
    sh = learner.Shardings.replicated()
    cfg = _cfg(1)
    opt = learner.make_optimizer(cfg.optim)
    batch = _batch()
    batch["tokens"] %= self._LIMIT
    positions = jnp.broadcast_to(jnp.arange(T), (N, T))
    limited = core_types.SamplingTransform(vocab_limit=self._LIMIT)
    lp = transformer.sequence_logprobs(graphdef, params, jnp.asarray(batch["tokens"]),
                                       positions, None, limited)
    unlimited = transformer.sequence_logprobs(graphdef, params, jnp.asarray(batch["tokens"]),
                                              positions, None)
    mask = batch["loss_mask"]
    self.assertGreater(np.abs(np.asarray(lp - unlimited))[mask].min(), 1e-3)
    batch["behaviour_logprobs"] = np.where(mask, np.asarray(lp), 0.0).astype(np.float32)
    step = learner.make_update_step(graphdef, cfg, opt, shardings=sh, vocab_limit=self._LIMIT)

    def copy():  # the steps donate their state
      return jax.tree.map(jnp.copy, params)

    ref = jax.device_put(copy(), sh.ref_params)
    state = jax.device_put(learner.init_state(copy(), opt, 0), sh.state)
    _, metrics = step(state, core_types.UpdateBatch(**batch), ref)
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, atol=1e-5)
    self.assertAlmostEqual(float(metrics["kl"]), 0.0, places=6)

    sft = learner.make_sft_step(graphdef, cfg, opt, shardings=sh, vocab_limit=self._LIMIT)
    state = jax.device_put(learner.init_state(copy(), opt, 0), sh.state)
    _, metrics = sft(state, core_types.SFTBatch(batch["tokens"], mask))
    expected = -np.asarray(lp)[mask].mean()
    np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)


if __name__ == "__main__":
  absltest.main()
