"""Tests for the learner's mixed precision: low-precision parameters with a float32 master copy
and float32 optimizer moments (`learner.TrainState.master`)."""

import dataclasses

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.core import types as core_types
from agentic_grpo.models import transformer
from tests.fixtures import old_checkpoints

N, T = 4, 16


def _model_config(param_dtype=jnp.bfloat16):
  return transformer.ModelConfig(
      vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16, mlp_dim=64,
      max_seq_len=32, dtype=param_dtype, param_dtype=param_dtype)


def _cfg(learning_rate=1e-3):
  cfg = config_lib.TrainConfig()
  return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim,
                                                            learning_rate=learning_rate))


def _batch():
  rng = np.random.default_rng(0)
  mask = np.ones((N, T), bool)
  mask[:, 0] = False
  return core_types.SFTBatch(tokens=rng.integers(0, 64, (N, T)).astype(np.int32),
                             loss_mask=mask)


def _float_leaves(tree):
  return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]


def _norm_scales(params):
  """The final RMSNorm's scales: all exactly 1.0 at init, whose bf16 spacing is 2^-8 below."""
  return np.asarray(params["final_norm"]["scale"].get_value(), np.float32)


class MixedPrecisionTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graphdef, cls.params = transformer.init_model(_model_config(), 0)
    cls.cfg = _cfg()
    cls.opt = learner.make_optimizer(cls.cfg.optim)
    cls.sh = learner.Shardings.replicated()
    cls.step = learner.make_sft_step(cls.graphdef, cls.cfg, cls.opt, shardings=cls.sh)

  def _params(self):
    """A copy of the bf16 parameters (the steps donate their state)."""
    return jax.tree.map(jnp.copy, self.params)

  def _fresh(self):
    return jax.device_put(learner.init_state(self._params(), self.opt, 0), self.sh.state)

  def _run(self, state, steps):
    for _ in range(steps):
      state, metrics = self.step(state, _batch())
      self.assertEqual(float(metrics["update_skipped"]), 0.0)
    return state

  def test_float32_params_have_no_master(self):
    _, params = transformer.init_model(_model_config(jnp.float32), 0)
    self.assertFalse(learner.needs_master(params))
    self.assertIsNone(learner.init_state(params, self.opt, 0).master)

  def test_master_and_moments_are_float32_and_params_follow_the_master(self):
    self.assertTrue(learner.needs_master(self.params))
    state = learner.init_state(self._params(), self.opt, 0)
    self.assertTrue(all(x.dtype == jnp.bfloat16 for x in _float_leaves(state.params)))
    self.assertTrue(all(x.dtype == jnp.float32 for x in _float_leaves(state.master)))
    self.assertTrue(all(x.dtype == jnp.float32 for x in _float_leaves(state.opt_state)))
    state = self._run(jax.device_put(state, self.sh.state), 3)
    self.assertEqual(int(state.step), 3)
    self.assertTrue(all(x.dtype == jnp.bfloat16 for x in _float_leaves(state.params)))
    self.assertTrue(all(x.dtype == jnp.float32 for x in _float_leaves(state.master)))
    self.assertTrue(all(x.dtype == jnp.float32 for x in _float_leaves(state.opt_state)))
    self.assertEqual(jax.tree.structure(state.master), jax.tree.structure(state.params))
    for p, m in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.master), strict=True):
      np.testing.assert_array_equal(np.asarray(p), np.asarray(m.astype(jnp.bfloat16)))
    self.assertFalse(np.array_equal(_norm_scales(state.master), 1.0))  # it trained

  def test_updates_below_bf16_resolution_accumulate_in_the_master(self):
    # Adam's steps are about lr = 1e-3 each, under half the bf16 spacing below 1.0 (2^-9).
    state = self._run(self._fresh(), 1)
    master1 = _norm_scales(state.master)
    self.assertTrue(np.all(master1 != 1.0))
    self.assertLess(np.max(np.abs(master1 - 1.0)), 2.0 ** -9)
    np.testing.assert_array_equal(_norm_scales(state.params), 1.0)  # rounded back
    state = self._run(state, 9)
    moved = np.mean(_norm_scales(state.params) != 1.0)
    self.assertGreater(moved, 0.5)
    # The contrast, with the same optimizer and a fixed gradient: updating the bf16 parameters
    # themselves (no master) rounds every step of those scales away, through a float32 master
    # the same steps add up.
    params = self._params()
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.01), params)
    opt_step = jax.jit(lambda p, g, s: self.opt.update(g, s, p))
    plain, plain_state = params, self.opt.init(params)
    master = learner.to_master(params)
    master_state = self.opt.init(master)
    for _ in range(10):
      updates, plain_state = opt_step(plain, grads, plain_state)
      plain = optax.apply_updates(plain, updates)
      updates, master_state = opt_step(master, learner.to_master(grads), master_state)
      master = optax.apply_updates(master, updates)
    np.testing.assert_array_equal(_norm_scales(plain), 1.0)
    np.testing.assert_allclose(_norm_scales(master), 1.0 - 10 * 1e-3, rtol=1e-4)
    self.assertTrue(np.all(_norm_scales(learner.from_master(master, params)) < 1.0))

  def test_warm_start_master_carries_over(self):
    state = self._run(self._fresh(), 1)
    fresh = learner.init_state(state.params, self.opt, 1, master=state.master)
    np.testing.assert_array_equal(_norm_scales(fresh.master), _norm_scales(state.master))
    self.assertEqual(int(fresh.step), 0)
    with self.assertRaisesRegex(ValueError, "master"):
      learner.init_state(state.params, self.opt, 1, master={"x": jnp.zeros(3)})

  def test_master_sharded_like_params_on_a_mesh(self):
    mesh = parallel.make_mesh((2, 2, 2))
    sm, shardings = learner.learner_shardings(_model_config(), mesh, self.opt,
                                              with_reference=False)
    self.assertEqual(jax.tree.leaves(shardings.state.master),
                     jax.tree.leaves(sm.param_shardings))
    state = jax.device_put(learner.init_state(self._params(), self.opt, 0), shardings.state)
    step = learner.make_sft_step(self.graphdef, self.cfg, self.opt, shardings=shardings)
    state, _ = step(state, parallel.put_batch(_batch(), mesh))
    specs = [x.sharding.spec for x in jax.tree.leaves(state.master)]
    self.assertEqual(specs, [x.sharding.spec for x in jax.tree.leaves(state.params)])
    self.assertEqual(specs, [s.spec for s in jax.tree.leaves(sm.param_shardings)])
    self.assertTrue(any(any(a is not None for a in s) for s in specs))  # something is split
    self.assertEqual(state.master["embed"].get_value().dtype, jnp.float32)

  def test_checkpoint_round_trip_keeps_the_master(self):
    state = self._run(self._fresh(), 2)
    ck = checkpointer.Checkpointer(self.create_tempdir().full_path)
    ck.save(2, state, {}, {"phase": "rl"})
    abstract = learner.init_state(transformer.init_model(_model_config(), 1)[1], self.opt, 0)
    got, _, _ = ck.restore(None, abstract)
    self.assertEqual(jax.tree.structure(got), jax.tree.structure(state))
    for a, b in zip(jax.tree.leaves(state.master), jax.tree.leaves(got.master), strict=True):
      self.assertEqual(b.dtype, jnp.float32)
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(got), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def test_checkpoint_from_before_the_master_trains_on(self):
    # A bfloat16 run saved before `TrainState.master` existed (bfloat16 moments, no master):
    # restored with the master derived from its parameters and the moments read as float32,
    # into the learner's shardings, it takes updates like any other state.
    old = old_checkpoints.pre_master_state(self._params(), self.opt)
    ck = checkpointer.Checkpointer(self.create_tempdir().full_path)
    ck.save(2, {"state": old}, {}, {"phase": "warmstart"})
    abstract = {"state": self._fresh()}
    got, _, _ = ck.restore(None, abstract, derivations=learner.STATE_DERIVATIONS)
    state = jax.device_put(got["state"], self.sh.state)
    self.assertEqual(jax.tree.structure(state), jax.tree.structure(abstract["state"]))
    for x in _float_leaves(state.master) + _float_leaves(state.opt_state):
      self.assertEqual(x.dtype, jnp.float32)
    np.testing.assert_array_equal(_norm_scales(state.master), _norm_scales(old.params))
    state = self._run(state, 2)
    self.assertEqual(int(state.step), 2)
    for p, m in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.master), strict=True):
      np.testing.assert_array_equal(np.asarray(p), np.asarray(m.astype(p.dtype)))
    self.assertTrue(any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                        zip(jax.tree.leaves(old.params), jax.tree.leaves(state.params),
                            strict=True)))


if __name__ == "__main__":
  absltest.main()
