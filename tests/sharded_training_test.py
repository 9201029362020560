"""The learner's update step and the sampler on device meshes equal one device.

8 simulated CPU devices (conftest.py); meshes (8,1,1), (2,4,1), (2,2,2), (1,1,8).
Tolerances: the update step's loss and metrics within 2e-5 relative, parameters
after two AdamW steps within 2e-6 absolute (AdamW with eps 1e-3, so that an
update is continuous in its gradient; float32 reduction order is the only
difference); greedy tokens equal, behaviour log-probs within 2e-5 absolute.
"""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo.core import types as core_types
from agentic_grpo.models import placement
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer

_CONFIG = transformer.ModelConfig(
    vocab_size=64, d_model=32, n_layers=1, n_heads=8, n_kv_heads=2, head_dim=8, mlp_dim=64,
    qkv_bias=True, tie_embeddings=False, max_seq_len=32)

MESHES = (
    ("data8", (8, 1, 1)),
    ("data2_fsdp4", (2, 4, 1)),
    ("data2_fsdp2_tensor2", (2, 2, 2)),
    ("tensor8", (1, 1, 8)),
)

N, T = 8, 12
_NEW = 6


def _cfg():
  cfg = config_lib.TrainConfig()
  return dataclasses.replace(
      cfg,
      rl=dataclasses.replace(cfg.rl, micro_batches=1, rows_per_update=N),
      loss=dataclasses.replace(cfg.loss, kl_beta=0.1),
      optim=dataclasses.replace(cfg.optim, learning_rate=1e-2, eps=1e-3))


def _batch():
  rng = np.random.default_rng(0)
  mask = rng.random((N, T)) < 0.7
  mask[:, 0] = False
  mask[-1] = False  # a padding row
  return {
      "tokens": rng.integers(0, _CONFIG.vocab_size, (N, T)).astype(np.int32),
      "loss_mask": mask,
      "behaviour_logprobs": np.where(mask, -4.0 + 0.3 * rng.normal(size=(N, T)), 0.0
                                     ).astype(np.float32),
      "advantages": np.where(mask, rng.normal(size=(N, T)), 0.0).astype(np.float32),
      "sample_weights": np.array([1] * (N - 1) + [0], np.float32),
  }


def _randomise(params, seed):
  """Random values for every parameter (NumPy: no per-shape compilation)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: np.asarray(x) + 0.2 * rng.standard_normal(x.shape).astype(x.dtype), params)


def _host(tree):
  return jax.tree.map(np.asarray, tree)


@functools.lru_cache(maxsize=None)
def _reference():
  """Params, two update steps and a greedy sample, all on one device."""
  graphdef, abstract = transformer.abstract_model(_CONFIG)
  # Norm scales near 1, everything else near 0, plus noise.
  base = jax.tree.map(lambda a: np.ones(a.shape, a.dtype) if len(a.shape) == 1
                      else np.zeros(a.shape, a.dtype), abstract)
  params, ref_params = _randomise(base, 1), _randomise(base, 2)
  cfg = _cfg()
  tx = learner.make_optimizer(cfg.optim)
  step = learner.make_update_step(graphdef, cfg, tx)
  state = learner.init_state(params, tx, 0)
  batch = core_types.UpdateBatch(**_batch())
  metrics = []
  for _ in range(2):
    state, m = step(state, batch, ref_params)
    metrics.append(_host(m))
  prompts, lengths = _prompts()
  out = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(5),
                       max_new_tokens=_NEW, greedy=True)
  return graphdef, params, ref_params, _host(state.params), metrics, _host(out)


def _prompts():
  rng = np.random.default_rng(3)
  lengths = np.array([5, 3, 8, 1, 6, 8, 2, 4], np.int32)
  prompts = rng.integers(0, _CONFIG.vocab_size, (N, 8)).astype(np.int32)
  prompts[np.arange(8)[None, :] >= lengths[:, None]] = 0
  return prompts, lengths


class ShardedTrainingTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Compilation dominates these tiny programs; XLA's backend optimisations
    # (not the SPMD partitioner) are switched off for this class.
    cls._saved_opt = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)

  @classmethod
  def tearDownClass(cls):
    jax.config.update("jax_disable_most_optimizations", cls._saved_opt)
    super().tearDownClass()

  @parameterized.named_parameters(*MESHES)
  def test_update_step_and_greedy_sampling_equal_one_device(self, shape):
    graphdef, params, ref_params, want_params, want_metrics, want_sample = _reference()
    mesh = parallel.make_mesh(shape)
    sm = placement.shard_model(_CONFIG, mesh)
    cfg = _cfg()
    tx = learner.make_optimizer(cfg.optim)

    sm2, shardings = learner.learner_shardings(_CONFIG, mesh, tx)
    self.assertEqual(sm2.param_shardings, sm.param_shardings)
    self.assertEqual(shardings.ref_params, sm.param_shardings)
    self.assertIsNone(shardings.batch)  # the batch brings its own (shape-aware) sharding
    # Hashable by value (the learner caches its steps on the shardings).
    self.assertEqual(hash(shardings), hash(learner.learner_shardings(_CONFIG, mesh, tx)[1]))
    state = jax.device_put(learner.init_state(params, tx, 0), shardings.state)
    step = learner.make_update_step(graphdef, cfg, tx, shardings=shardings)
    ref = placement.device_put_params(ref_params, sm)
    batch = parallel.put_batch(core_types.UpdateBatch(**_batch()), mesh)
    self.assertEqual(batch.tokens.sharding.spec, parallel.batch_sharding(mesh, (N, T)).spec)
    for i in range(3):  # the third step only checks that nothing recompiles
      state, metrics = step(state, batch, ref)
      if i < 2:
        for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
          np.testing.assert_allclose(metrics[k], want_metrics[i][k], rtol=2e-5, atol=1e-7,
                                     err_msg=f"step {i} {k}")
      if i == 1:
        got = _host(state.params)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want_params), strict=True):
          np.testing.assert_allclose(a, b, atol=2e-6, rtol=0)
    self.assertEqual(step.num_traces, 1)  # no recompilation after the first step
    self.assertGreater(float(want_metrics[0]["grad_norm"]), 0.0)
    # The state stays sharded as the rules say (parameters and AdamW moments).
    self.assertEqual(state.params["embed"].get_value().sharding.spec,
                     sm.param_shardings["embed"].get_value().spec)
    gate_spec = sm.param_shardings["layers"][0]["mlp"]["gate"].get_value().spec
    moments = 0
    for path, x in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]:
      key = jax.tree_util.keystr(path)
      if "['mlp']['gate']" in key:  # AdamW's mu and nu of that parameter
        self.assertEqual(x.sharding.spec, gate_spec, key)
        moments += 1
      elif not x.shape:  # counters
        self.assertEqual(x.sharding.spec, jax.sharding.PartitionSpec(), key)
    self.assertEqual(moments, 2)

    prompts, lengths = _prompts()
    out = sampler.sample(graphdef, placement.device_put_params(params, sm), prompts, lengths,
                         jax.random.key(5), max_new_tokens=_NEW, greedy=True)
    np.testing.assert_array_equal(np.asarray(out.tokens), want_sample.tokens)
    np.testing.assert_array_equal(np.asarray(out.lengths), want_sample.lengths)
    np.testing.assert_allclose(np.asarray(out.logprobs), want_sample.logprobs, atol=2e-5, rtol=0)


if __name__ == "__main__":
  absltest.main()
