"""Shared-prefix packing in a run (`rl.pack_prefix`): the config, the device side's packed
batches across processes, and micro runs with packing on against off (the same updates) and
resumed (exact)."""

import dataclasses
import json
import os
import types

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.core import types as core_types
from agentic_grpo.models import placement
from agentic_grpo.train import device as device_lib
from experiments import tiny_codegen
from tests.fixtures import micro_run


def _micro(**overrides):
  """The default experiment shrunk to a micro model and tiny batches (as tests/train_test.py),
  groups of 4 so that packing has rows to share."""
  c = tiny_codegen.get_config()
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64,
                 max_seq_len=512)
  c.task.eval_size = 2
  c.workflow.max_new_tokens = 12
  c.rl.update(tasks_per_batch=2, group_size=4, rows_per_update=8, buckets=(128,),
              batches_in_flight=2, num_steps=3)
  c.warmstart.update(steps=2, batch_size=4, seq_len=128)
  c.eval.update(every=0, num_samples=0, k=(1,))
  micro_run.pin_rl_levers(c)  # a random model's groups tie: still take steps
  c.checkpoint.every = 1
  c.log.progress_bar = False
  c.log.plot = False
  c.log.tensorboard = False
  c.mesh.data = 1
  for key, value in overrides.items():
    section, field = key.split(".")
    c[section][field] = value
  return config_lib.from_config_dict(c)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


class ConfigTest(parameterized.TestCase):

  def test_packed_lengths(self):
    rl = config_lib.RLSection(buckets=(128, 192))
    self.assertEqual(rl.packed_lengths(), {128: 256, 192: 384})
    self.assertEqual(dataclasses.replace(rl, packed_buckets=(192, 192)).packed_lengths(),
                     {128: 192, 192: 192})
    # One length: every bucket's rows at least that long (one row shape for both here).
    self.assertEqual(dataclasses.replace(rl, packed_buckets=(384,)).packed_lengths(),
                     {128: 384, 192: 384})
    self.assertEqual(dataclasses.replace(rl, packed_buckets=(160,)).packed_lengths(),
                     {128: 160, 192: 192})

  @parameterized.parameters((0,), (256, 128), (256, 512, 1024))
  def test_bad_packed_buckets(self, *buckets):
    cfg = config_lib.TrainConfig()
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, pack_prefix=True,
                                                          packed_buckets=buckets))
    with self.assertRaisesRegex(ValueError, r"config\.rl\.packed_buckets"):
      cfg.validate()

  @parameterized.named_parameters(
      ("token_sum_norm", "token", "seq_mean_token_sum_norm", True),
      ("token_mean", "token", "token_mean", True),
      ("gspo", "sequence", "seq_mean_token_sum_norm", False),
      ("seq_mean_token_mean", "token", "seq_mean_token_mean", False),
  )
  def test_only_additive_losses_pack(self, ratio_level, aggregation, packs):
    cfg = config_lib.TrainConfig()
    cfg = dataclasses.replace(
        cfg, rl=dataclasses.replace(cfg.rl, pack_prefix=True),
        loss=dataclasses.replace(cfg.loss, ratio_level=ratio_level, aggregation=aggregation,
                                 max_tokens=16))
    self.assertEqual(device_lib.packs_prefixes(cfg), packs)
    off = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, pack_prefix=False))
    self.assertFalse(device_lib.packs_prefixes(off))


class _Coord:
  """Two processes: `agree_max` sees the other process's values in `other`."""
  process_count = 2

  def __init__(self, other):
    self.other = list(other)

  def agree_max(self, value):
    return max(value, self.other.pop(0))


class PackedShareTest(absltest.TestCase):

  def _share(self, batch, other):
    fake = types.SimpleNamespace(_comp=types.SimpleNamespace(coord=_Coord(other)))
    return device_lib.DeviceSide._packed_share(fake, batch, 8, (128,))

  def test_processes_pad_to_the_largest_shape(self):
    batch = core_types.UpdateBatch.padding(2, 128, packed=True)
    batch.tokens[:] = 5
    batch.loss_mask[:, 3] = True
    batch.sample_weights[:] = 1.0
    batch.branches[:, 10:20] = 1
    got = self._share(batch, [4, 256]).check()
    self.assertEqual(got.tokens.shape, (4, 256))
    np.testing.assert_array_equal(got.tokens[:2, :128], batch.tokens)
    np.testing.assert_array_equal(got.branches[:2, :128], batch.branches)
    np.testing.assert_array_equal(got.sample_weights, [1, 1, 0, 0])
    self.assertEqual(int(got.loss_mask.sum()), 2)
    np.testing.assert_array_equal(got.positions[3], np.arange(256))
    # A process without rows contributes packed padding of the agreed shape.
    none = self._share(None, [4, 256]).check()
    self.assertEqual(none.tokens.shape, (4, 256))
    self.assertTrue(none.packed)
    self.assertFalse(none.loss_mask.any())
    # The largest process keeps its batch as it is.
    self.assertIs(self._share(batch, [1, 128]), batch)


class PackedRunTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits(
        cpu_seconds=1.0, wall_seconds=0.5))

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def _final(self, workdir, cfg):
    comp = train.build(cfg, pool=self.pool)
    opt = learner.make_optimizer(cfg.optim)
    params = placement.init_params(comp.sharded_model, comp.model_config, 0)
    ck = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))
    return ck.restore(None, {"state": learner.init_state(params, opt, 0)})

  def test_packed_run_takes_the_same_updates_and_resumes_exactly(self):
    off = _micro(**{"rl.pack_prefix": False, "checkpoint.every": 0})
    on = _micro(**{"rl.pack_prefix": True, "checkpoint.every": 0})
    self.assertTrue(device_lib.packs_prefixes(on))
    runs = {}
    for name, cfg in (("off", off), ("on", on)):
      workdir = self.create_tempdir().full_path
      train.run(cfg, workdir, pool=self.pool)
      runs[name] = workdir
    rows_off = [r for r in _rows(runs["off"]) if r["phase"] == "rl"]
    rows_on = [r for r in _rows(runs["on"]) if r["phase"] == "rl"]
    self.assertLen(rows_on, len(rows_off))
    self.assertNotEmpty(rows_on)
    for a, b in zip(rows_off, rows_on, strict=True):
      self.assertEqual(a["step"], b["step"])
      for k in ("loss/loss", "loss/pg_loss", "loss/entropy", "loss/grad_norm"):
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
      self.assertEqual(b["replay/loss_tokens"], a["replay/loss_tokens"])
      self.assertEqual(b["replay/items"], a["replay/rows"])  # the same items ...
      self.assertLessEqual(b["replay/token_slots"], a["replay/token_slots"])  # ... packed
    self.assertLess(sum(r["replay/token_slots"] for r in rows_on),
                    sum(r["replay/token_slots"] for r in rows_off))
    (s_off, _, _), (s_on, _, _) = self._final(runs["off"], off), self._final(runs["on"], on)
    for a, b in zip(jax.tree.leaves(s_off), jax.tree.leaves(s_on), strict=True):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-4)

    # Stopped mid-RL and resumed, the packed run ends exactly as uninterrupted.
    parts = self.create_tempdir().full_path
    train.run(on, parts, pool=self.pool, stop_after=on.warmstart.steps + 1)
    train.run(on, parts, pool=self.pool)
    (want, _, want_meta), (got, _, got_meta) = (self._final(runs["on"], on),
                                                self._final(parts, on))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
      np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    self.assertEqual(want_meta["replay"], got_meta["replay"])


if __name__ == "__main__":
  absltest.main()
