"""Dynamic sampling (`rl.dynamic_sampling`) and the pass-rate filter (`rl.pass_rate_filter`) in
training runs of a micro model.

A random micro model's real rewards tie (all 0), so the runs here score the model's outputs by
a hash (`HashedRewards`): tied and untied groups both occur, deterministically given the seed.
What the learner takes is recorded from the replay (`StagedReplay.take`), and whether each
group carries signal is computed independently from what the loop fed the replay
(`add_group`, `add_stage`, `finish`) with `core.advantages`.
"""

import collections
import dataclasses
import json
import os
import zlib
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo import replay as replay_lib
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.core import advantages as advantages_lib
from agentic_grpo.models import placement
from agentic_grpo.train import metric_rows
from agentic_grpo.train import rl_phase
from experiments import tiny_codegen
from tests.fixtures import micro_run

_WALL_CLOCK = metric_rows.WALL_CLOCK


def _micro(**overrides):
  """The default experiment shrunk to a micro model and one task of 2 attempts per batch."""
  c = tiny_codegen.get_config()
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64,
                 max_seq_len=256)
  c.task.eval_size = 2
  c.workflow.max_new_tokens = 12
  c.rl.update(tasks_per_batch=1, group_size=2, rows_per_update=4, buckets=(128,),
              batches_in_flight=2)
  c.warmstart.update(steps=1, batch_size=4, seq_len=128)
  c.eval.update(every=0, num_samples=0, k=(1,))
  micro_run.pin_rl_levers(c)  # the filters under test are set by each test
  c.checkpoint.every = 0
  c.log.progress_bar = False
  c.mesh.data = 1
  for key, value in overrides.items():
    section, field = key.split(".")
    c[section][field] = value
  return config_lib.from_config_dict(c)


class HashedRewards(workflow_lib.Workflow):
  """Training rewards from a hash of the outputs: a stage's reward is 1 for one in four of its
  outputs' CRC-32s, the final reward likewise of the episode's summed CRCs (so groups tie
  often). Evaluation (scored with `reward_mode=fraction`) is left as it is."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._hashes = collections.Counter()

  def _training(self):
    return self.config.reward_mode != stages_lib.FRACTION

  def close_stage(self, episodes, outputs):
    result = super().close_stage(episodes, outputs)
    if not self._training():
      return result
    h = np.array([zlib.crc32(o.encode()) for o in outputs], np.int64)
    for ep, x in zip(episodes, h, strict=True):
      self._hashes[id(ep)] += int(x)
    return dataclasses.replace(result, rewards=np.where(result.valid, h % 4 == 0, 0).astype(
        np.float32))

  def finish(self, episodes):
    result = super().finish(episodes)
    if not self._training():
      return result
    return dataclasses.replace(result, rewards=np.array(
        [(self._hashes[id(ep)] >> 3) % 4 == 0 for ep in episodes], np.float32))


class _Recorder:
  """Wraps the replay's intake and `take`: what the loop fed it and what the learner took."""

  def __init__(self):
    self.group_of, self.stage_r, self.final_r = {}, collections.defaultdict(dict), {}
    self.groups = {}
    self.takes = []  # (max_rows, rows taken, episodes of the taken segments)

  def patches(self):
    cls = replay_lib.StagedReplay
    orig = {n: getattr(cls, n) for n in ("add_group", "add_stage", "finish", "take")}
    rec = self

    def add_group(self, group_id, episode_ids):
      rec.groups[group_id] = [int(e) for e in episode_ids]
      return orig["add_group"](self, group_id, episode_ids)

    def add_stage(self, episode_ids, stage, tokens, loss_mask, blps, version, rewards,
                  valid=None):
      valid = np.ones(len(episode_ids), bool) if valid is None else np.asarray(valid, bool)
      for e, r, v in zip(episode_ids, rewards, valid, strict=True):
        rec.stage_r[int(e)][stage] = (float(r) if v else 0.0, bool(v))
      return orig["add_stage"](self, episode_ids, stage, tokens, loss_mask, blps, version,
                               rewards, valid)

    def finish(self, episode_ids, final_rewards):
      for e, r in zip(episode_ids, final_rewards, strict=True):
        rec.final_r[int(e)] = float(r)
      return orig["finish"](self, episode_ids, final_rewards)

    def take(self, max_rows, current_version, buckets):
      batch = orig["take"](self, max_rows, current_version, buckets)
      rec.takes.append((max_rows, 0 if batch is None else batch.num_rows,
                        [] if batch is None else [e for e, _, _ in batch.segments]))
      return batch

    return [mock.patch.object(cls, n, f) for n, f in
            (("add_group", add_group), ("add_stage", add_stage), ("finish", finish),
             ("take", take))]

  def finished_groups(self, num_stages):
    """`{group: (signal, pass rate)}` of the finished groups: whether any of its provisional or
    target advantages (the default config's previous-stage baseline) is non-zero."""
    out = {}
    for g, eps in self.groups.items():
      if not all(e in self.final_r for e in eps):
        continue
      r = np.array([[[self.stage_r[e][k][0] for k in range(num_stages)] for e in eps]],
                   np.float32)
      valid = np.array([[[self.stage_r[e][k][1] for k in range(num_stages)] for e in eps]])
      final = np.array([[self.final_r[e] for e in eps]], np.float32)
      prov = advantages_lib.provisional_advantages(r, valid, baseline="previous_stage")
      target = advantages_lib.target_advantages(r, final, mode="outcome", valid=valid,
                                                baseline="previous_stage")
      out[g] = (bool(np.any(prov) or np.any(target)), float(final.mean()))
    return out


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _history(workdir):
  return [{k: v for k, v in r.items() if k not in _WALL_CLOCK} for r in _rows(workdir)]


class GroupFiltersTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits(
        cpu_seconds=1.0, wall_seconds=0.5))

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def _run(self, cfg, workdir=None, **kwargs):
    rec = _Recorder()
    workdir = workdir or self.create_tempdir().full_path
    patches = rec.patches()
    for p in patches:
      p.start()
    try:
      result = train.run(cfg, workdir, pool=self.pool, workflow_factory=HashedRewards,
                         **kwargs)
    finally:
      for p in patches:
        p.stop()
    return result, rec, workdir

  def test_dynamic_sampling_updates_are_full_of_groups_with_signal(self):
    cfg = _micro(**{"rl.num_steps": 4, "rl.dynamic_sampling": True})
    result, rec, workdir = self._run(cfg)
    self.assertEqual(result["step"], 1 + 4)
    groups = rec.finished_groups(2)
    episode_group = {e: g for g, eps in rec.groups.items() for e in eps}
    updates = [t for t in rec.takes if t[1]]
    self.assertLen(updates, 4)
    for max_rows, rows, episodes in updates:
      # Full: the update waited for rows_per_update rows (the cap of 10 batches never bit).
      self.assertEqual((max_rows, rows), (4, 4))
      for e in episodes:  # every row from a group with a non-zero advantage
        g = episode_group[e]
        self.assertTrue(g not in groups or groups[g][0], f"group {g} has no signal")
    last = _rows(workdir)[-1]
    tied = sum(not signal for signal, _ in groups.values())
    self.assertGreater(tied, 0)  # the run met groups without signal, and dropped them
    self.assertEqual(last["loop/dynamic_sampling_dropped_groups"], tied)
    self.assertEqual(last["counts/dynamic_sampling_partial_updates"], 0)
    self.assertNotIn("loop/pass_rate_filtered_groups", last)

  def test_the_cap_lets_partial_updates_through(self):
    cfg = _micro(**{"rl.num_steps": 3, "rl.dynamic_sampling": True,
                    "rl.dynamic_sampling_max_batches": 1, "rl.rows_per_update": 16})
    _, rec, workdir = self._run(cfg)
    updates = [t for t in rec.takes if t[1]]
    partial = [t for t in updates if t[1] < 16]
    self.assertNotEmpty(partial)
    self.assertEqual(_rows(workdir)[-1]["counts/dynamic_sampling_partial_updates"],
                     len(partial))

  def test_without_the_options_the_run_flushes_before_sampling(self):
    # Off (the default), the same run makes partial updates (a flush before each sample
    # phase) from every group, tied ones included (skip_zero_advantage=False here).
    cfg = _micro(**{"rl.num_steps": 4})
    _, rec, workdir = self._run(cfg)
    updates = [t for t in rec.takes if t[1]]
    self.assertTrue(any(rows < 4 for _, rows, _ in updates))
    last = _rows(workdir)[-1]
    for key in ("loop/dynamic_sampling_dropped_groups", "loop/pass_rate_filtered_groups",
                "counts/dynamic_sampling_partial_updates"):
      self.assertNotIn(key, last)

  def test_pass_rate_filter_with_dynamic_sampling_resumes_exactly(self):
    # With the default's KL penalty to the warm-start policy too (its reference is restored).
    cfg = _micro(**{"warmstart.steps": 1, "rl.num_steps": 5, "rl.dynamic_sampling": True,
                    "rl.pass_rate_filter": (0.25, 0.75),
                    "loss.kl_beta": tiny_codegen.get_config().loss.kl_beta})
    self.assertGreater(cfg.loss.kl_beta, 0.0)
    _, rec, full = self._run(cfg)
    groups = rec.finished_groups(2)
    outside = sum(not 0.25 <= rate <= 0.75 for _, rate in groups.values())
    self.assertGreater(outside, 0)
    last = _rows(full)[-1]
    self.assertEqual(last["loop/pass_rate_filtered_groups"], outside)
    self.assertIn("loop/dynamic_sampling_dropped_groups", last)
    parts = self.create_tempdir().full_path
    for stop in (3, None):  # mid-RL, then to the end
      self._run(cfg, parts, stop_after=stop)
    self.assertEqual(_history(parts), _history(full))
    want, got = self._final(full, cfg), self._final(parts, cfg)
    for a, b in zip(jax.tree.leaves(want[0]), jax.tree.leaves(got[0]), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for group in ("replay", "loop"):
      for k in want[1][group]:
        np.testing.assert_array_equal(want[1][group][k], got[1][group][k], err_msg=k)
    for key in ("step", "replay", "loop", "counters"):
      self.assertEqual(want[2][key], got[2][key], msg=key)
    clock = lambda rl_phase: {k: v for k, v in rl_phase.items() if k != "rl_seconds"}
    self.assertEqual(clock(want[2]["rl_phase"]), clock(got[2]["rl_phase"]))

  def _final(self, workdir, cfg):
    comp = train.build(cfg, pool=self.pool)
    params = placement.init_params(comp.sharded_model, comp.model_config, 0)
    abstract = {"state": learner.init_state(params, learner.make_optimizer(cfg.optim), 0)}
    if cfg.loss.kl_beta > 0:  # the run keeps its KL reference beside the state
      abstract["ref"] = params
    return checkpointer.Checkpointer(os.path.join(workdir, "checkpoints")).restore(
        None, abstract)


class ReadiedRowsTest(absltest.TestCase):
  """Dynamic sampling's idle-batch count reads the rows a harvest readied, net of the queued
  provisional rows the outcome withdrew (`correction.supersede_queued`)."""

  def _readied_by_one_group(self, supersede):
    replay = replay_lib.StagedReplay(group_size=2, num_stages=2, supersede_queued=supersede)
    s = mock.Mock(replay=replay, agent=mock.Mock(counters={"episodes": 0}), rl_saved=None)
    phase = rl_phase.RLPhase(s)
    before = phase._readied()
    replay.add_group(0, [0, 1])
    for k in range(2):  # every stage with signal, none taken by the learner
      rows = [np.arange(3 + 4 * k, dtype=np.int32)] * 2
      masks = [np.arange(len(r)) >= len(r) - 2 for r in rows]
      replay.add_stage([0, 1], k, rows, masks, [np.zeros(len(r), np.float32) for r in rows],
                       0, [1.0, 0.0])
    replay.finish([0, 1], [1.0, 1.0])  # a tied outcome: every target is 0
    return phase._readied() - before, replay.num_ready

  def test_rows_readied_and_withdrawn_in_one_harvest_count_as_none(self):
    self.assertEqual(self._readied_by_one_group(supersede=True), (0, 0))
    readied, ready = self._readied_by_one_group(supersede=False)
    self.assertGreater(ready, 0)  # provisional rows and the corrections that offset them
    self.assertEqual(readied, ready)


if __name__ == "__main__":
  absltest.main()
