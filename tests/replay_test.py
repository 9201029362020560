"""Tests for agentic_grpo.replay."""

import collections
import dataclasses
import inspect

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import replay as replay_lib
from agentic_grpo.checkpoint import records as checkpoint_records
from agentic_grpo.core import advantages as advantages_lib
from agentic_grpo.core import losses as losses_lib

G, S = 4, 3
BUCKETS = (64, 128)


def _norm(x):
  """Independent GRPO normalisation of a `[G]` vector (population std, eps 1e-6)."""
  x = np.asarray(x, np.float64)
  if np.ptp(x) == 0:
    return np.zeros_like(x)
  return (x - x.mean()) / (x.std() + 1e-6)


class _Episodes:
  """Builds chained stage rows: each stage appends a prompt chunk and a generated chunk."""

  def __init__(self, rng, episode_ids):
    self.rng = rng
    self.rows = {e: rng.integers(0, 256, size=5).astype(np.int32) for e in episode_ids}
    self.masks = {e: np.zeros(5, bool) for e in episode_ids}

  def stage(self, episode_ids):
    toks, masks, blps = [], [], []
    for e in episode_ids:
      prompt = self.rng.integers(0, 256, size=3)
      gen = self.rng.integers(0, 256, size=int(self.rng.integers(2, 6)))
      row = np.concatenate([self.rows[e], prompt, gen]).astype(np.int32)
      mask = np.zeros(row.shape, bool)
      mask[-len(gen):] = True
      self.rows[e] = row
      toks.append(row)
      masks.append(mask)
      blps.append(np.where(mask, -self.rng.random(row.shape), 0.0).astype(np.float32))
    return toks, masks, blps


def _make(**kwargs):
  opts = dict(group_size=G, num_stages=S, capacity=10_000)
  opts.update(kwargs)
  return replay_lib.StagedReplay(**opts)


def _drain(replay, version=0, rows=8):
  batches = []
  while True:
    b = replay.take(rows, version, BUCKETS)
    if b is None:
      return batches
    batches.append(b)


class StagedReplayTest(parameterized.TestCase):

  def test_provisional_only_when_group_completes_stage(self):
    replay = _make()
    eps = _Episodes(np.random.default_rng(0), range(G))
    replay.add_group(7, range(G))
    toks, masks, blps = eps.stage(range(G))
    made = replay.add_stage(range(G - 1), 0, toks[:-1], masks[:-1], blps[:-1], 0,
                            [0.0, 1.0, 0.5])
    self.assertEqual(made, 0)
    self.assertEqual(replay.num_ready, 0)
    made = replay.add_stage([G - 1], 0, toks[-1:], masks[-1:], blps[-1:], 0, [1.0])
    self.assertEqual(made, G)
    batch = replay.take(8, 0, BUCKETS)
    self.assertEqual(batch.kinds, ["provisional"] * G)
    self.assertEqual({k for _, k, _ in batch.segments}, {0})
    np.testing.assert_allclose([a for _, _, a in batch.segments], _norm([0, 1, .5, 1]), atol=1e-5)
    # Stage 1 reported by part of the group only: nothing ready.
    toks, masks, blps = eps.stage(range(2))
    self.assertEqual(replay.add_stage(range(2), 1, toks, masks, blps, 1, [1.0, 0.0]), 0)
    self.assertIsNone(replay.take(8, 1, BUCKETS))

  def test_batch_layout(self):
    replay = _make()
    eps = _Episodes(np.random.default_rng(1), range(G))
    replay.add_group(0, range(G))
    toks, masks, blps = eps.stage(range(G))
    replay.add_stage(range(G), 0, toks, masks, blps, 3, [0.0, 1.0, 0.0, 1.0])
    batch = replay.take(6, 3, BUCKETS)
    self.assertEqual(batch.update.tokens.shape, (6, 64))
    self.assertEqual(batch.update.tokens.dtype, np.int32)
    np.testing.assert_array_equal(batch.update.sample_weights, [1, 1, 1, 1, 0, 0])
    self.assertFalse(batch.update.loss_mask[4:].any())
    for r in range(G):
      n = len(toks[r])
      np.testing.assert_array_equal(batch.update.tokens[r, :n], toks[r])
      np.testing.assert_array_equal(batch.update.loss_mask[r, :n], masks[r])
      np.testing.assert_array_equal(batch.update.behaviour_logprobs[r, :n], blps[r])
      self.assertFalse(batch.update.loss_mask[r, n:].any())
      # Per-token advantage is the row's advantage on its loss tokens, 0 elsewhere.
      adv = batch.segments[r][2]
      np.testing.assert_allclose(batch.update.advantages[r],
                                 np.where(batch.update.loss_mask[r], adv, 0.0))

  @parameterized.product(target_mode=("outcome", "return", "mixed"),
                         pack=(True, False), skip_zero=(True, False),
                         baseline=("none", "previous_stage"), negative_weight=(1.0, 0.5, 0.0))
  def test_provisional_plus_correction_equals_target(self, target_mode, pack, skip_zero,
                                                     baseline, negative_weight):
    rng = np.random.default_rng(2)
    replay = _make(target_mode=target_mode, gamma=0.9, beta=0.3, pack_corrections=pack,
                   skip_zero_advantage=skip_zero, baseline=baseline,
                   negative_weight=negative_weight)
    num_groups = 3
    ids = np.arange(num_groups * G).reshape(num_groups, G)
    eps = _Episodes(rng, ids.ravel())
    for g in range(num_groups):
      replay.add_group(100 + g, ids[g])
    # Binary rewards make all-equal groups (advantage 0) likely; one skipped stage.
    stage_r = rng.integers(0, 2, size=(num_groups, G, S)).astype(np.float32)
    stage_r[0, 1, 2] = 0.0
    valid = np.ones((num_groups, G, S), bool)
    valid[0, 1, 2] = False
    final_r = rng.integers(0, 3, size=(num_groups, G)).astype(np.float32) / 2
    total = collections.defaultdict(float)
    kinds = collections.Counter()
    provisional = np.asarray(advantages_lib.weight_negatives(
        advantages_lib.provisional_advantages(stage_r, valid, baseline=baseline),
        negative_weight))
    for k in range(S):
      toks, masks, blps = eps.stage(ids.ravel())
      replay.add_stage(ids.ravel(), k, toks, masks, blps, k, stage_r[..., k].ravel(),
                       valid[..., k].ravel())
      for b in _drain(replay, k):
        kinds.update(b.kinds)
        for e, s, a in b.segments:
          self.assertAlmostEqual(a, float(provisional.reshape(-1, S)[e, s]), places=5)
          total[(e, s)] += a
    replay.finish(ids.ravel(), final_r.ravel())
    for b in _drain(replay, S):
      kinds.update(b.kinds)
      for e, s, a in b.segments:
        total[(e, s)] += a
    target = np.asarray(advantages_lib.weight_negatives(advantages_lib.target_advantages(
        stage_r, final_r, mode=target_mode, gamma=0.9, beta=0.3, valid=valid,
        baseline=baseline), negative_weight))
    if target_mode == "outcome":  # Independent check of the outcome target.
      for g in range(num_groups):
        norm = _norm(final_r[g])
        norm = np.where(norm < 0, negative_weight * norm, norm)
        np.testing.assert_allclose(target[g, valid[g].all(-1), 0],
                                   norm[valid[g].all(-1)], atol=1e-5)
    for g in range(num_groups):
      for i in range(G):
        for k in range(S):
          got = total.get((int(ids[g, i]), k), 0.0)
          self.assertAlmostEqual(got, float(target[g, i, k]) if valid[g, i, k] else 0.0,
                                 places=5, msg=f"group {g} member {i} stage {k}")
    self.assertGreater(kinds["provisional"], 0)
    self.assertGreater(kinds["correction"], 0)
    self.assertEqual(replay.num_pending_episodes, 0)
    self.assertEqual(replay.num_segments(), 0)

  def test_packed_row_has_per_segment_advantages(self):
    rng = np.random.default_rng(3)
    replay = _make(stage_rewards=False)
    eps = _Episodes(rng, range(G))
    replay.add_group(0, range(G))
    stage_masks = []
    for k in range(S):
      toks, masks, blps = eps.stage(range(G))
      stage_masks.append(masks)
      self.assertEqual(replay.add_stage(range(G), k, toks, masks, blps, 0, [1.0] * G), 0)
    self.assertEqual(replay.num_ready, 0)  # Stage rewards off: nothing provisional.
    final = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
    self.assertEqual(replay.finish(range(G), final), G)  # One packed row per episode.
    batch = replay.take(8, 0, BUCKETS)
    self.assertEqual(batch.kinds, ["final"] * G)
    want = _norm(final)
    for r in range(G):
      n = len(toks[r])
      np.testing.assert_array_equal(batch.update.tokens[r, :n], toks[r])
      union = np.zeros(n, bool)
      for k in range(S):
        m = stage_masks[k][r]
        union[:len(m)] |= m
      np.testing.assert_array_equal(batch.update.loss_mask[r, :n], union)
      np.testing.assert_allclose(batch.update.advantages[r, :n], np.where(union, want[r], 0.0),
                                 atol=1e-5)

  def test_outcome_only_runs_ignore_the_stage_baseline(self):
    # Outcome-only runs score no stage (rewards 0): the previous-stage baseline is 0 and the
    # rows are those of plain outcome GRPO.
    def rows(baseline):
      rng = np.random.default_rng(5)
      replay = _make(stage_rewards=False, correction=False, baseline=baseline)
      eps = _Episodes(rng, range(G))
      replay.add_group(0, range(G))
      for k in range(S):
        toks, masks, blps = eps.stage(range(G))
        replay.add_stage(range(G), k, toks, masks, blps, 0, np.zeros(G))
      replay.finish(range(G), [1.0, 0.0, 0.5, 0.0])
      return [(b.update.tokens, b.update.advantages) for b in _drain(replay)]
    plain, with_baseline = rows("none"), rows("previous_stage")
    self.assertNotEmpty(plain)
    for (t0, a0), (t1, a1) in zip(plain, with_baseline, strict=True):
      np.testing.assert_array_equal(t0, t1)
      np.testing.assert_allclose(a0, a1, atol=1e-6)

  def test_no_correction_leaves_provisional_only(self):
    rng = np.random.default_rng(4)
    replay = _make(correction=False, num_stages=1)
    eps = _Episodes(rng, range(G))
    replay.add_group(0, range(G))
    toks, masks, blps = eps.stage(range(G))
    replay.add_stage(range(G), 0, toks, masks, blps, 0, [1.0, 0.0, 0.0, 0.0])
    self.assertEqual(len(_drain(replay)), 1)
    self.assertEqual(replay.finish(range(G), [0.0, 1.0, 0.0, 0.0]), 0)
    self.assertEqual(replay.counters["sign_reversals"], 2)
    self.assertEqual(replay.counters["corrections"], 0)

  @parameterized.named_parameters(
      # Stage [+, -, -, -] against final [-, +, -, -]: episodes 0 and 1 reverse (and are
      # corrected); 2 and 3 keep their advantage (no correction).
      ("opposite", [0.0, 1.0, 0.0, 0.0], 2, 2),
      # Equal final rewards: every target is exactly 0, which withdraws each provisional
      # update (a correction) but reverses no sign.
      ("zero_targets", [0.0, 0.0, 0.0, 0.0], 0, G),
      ("same_signs", [1.0, 0.0, 0.0, 0.0], 0, 0))
  def test_sign_reversals_count_strictly_opposite_signs(self, final, reversals, corrections):
    replay = _make(num_stages=1, pack_corrections=False)
    eps = _Episodes(np.random.default_rng(6), range(G))
    replay.add_group(0, range(G))
    toks, masks, blps = eps.stage(range(G))
    replay.add_stage(range(G), 0, toks, masks, blps, 0, [1.0, 0.0, 0.0, 0.0])
    _drain(replay)
    replay.finish(range(G), final)
    self.assertEqual(replay.counters["sign_reversals"], reversals)
    self.assertEqual(replay.counters["corrections"], corrections)

  @parameterized.parameters(True, False)
  def test_post_hoc_stage_credit_holds_provisional_items_until_the_outcome(self, correction):
    """`post_hoc` readies the same rows as `immediate`, all after `finish` (none before)."""
    rng_seed = 11
    stage_r = np.array([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    final = [1.0, 0.0, 0.0, 1.0]
    out = {}
    for credit in ("immediate", "post_hoc"):
      replay = _make(stage_credit=credit, correction=correction, pack_corrections=False)
      eps = _Episodes(np.random.default_rng(rng_seed), range(G))
      replay.add_group(0, range(G))
      before = []
      for k in range(S):
        toks, masks, blps = eps.stage(range(G))
        replay.add_stage(range(G), k, toks, masks, blps, 0, stage_r[k])
        before.append(replay.num_ready)
      made = replay.finish(range(G), final)
      batch = replay.take(64, 0, BUCKETS)
      out[credit] = (before, made, sorted(zip(batch.kinds, batch.segments, strict=True)))
    self.assertEqual(out["post_hoc"][0], [0, 0, 0])
    self.assertGreater(out["immediate"][0][-1], 0)
    immediate_rows = out["immediate"][0][-1] + out["immediate"][1]
    self.assertEqual(out["post_hoc"][1], immediate_rows)
    self.assertEqual(len(out["post_hoc"][2]), len(out["immediate"][2]))
    for (k0, (e0, s0, a0)), (k1, (e1, s1, a1)) in zip(out["immediate"][2], out["post_hoc"][2],
                                                      strict=True):
      self.assertEqual((k0, e0, s0), (k1, e1, s1))
      self.assertAlmostEqual(a0, a1, places=5)

  def test_post_hoc_counts_provisional_items_at_release(self):
    replay = _make(stage_credit="post_hoc", correction=False, num_stages=1)
    eps = _Episodes(np.random.default_rng(3), range(G))
    replay.add_group(0, range(G))
    toks, masks, blps = eps.stage(range(G))
    replay.add_stage(range(G), 0, toks, masks, blps, 0, [1.0, 0.0, 0.0, 0.0])
    self.assertEqual(replay.counters["provisional_items"], 0)
    self.assertEqual(replay.finish(range(G), [0.0, 1.0, 0.0, 0.0]), G)
    self.assertEqual(replay.counters["provisional_items"], G)
    self.assertEqual(replay.counters["correction_items"], 0)
    self.assertEqual(replay.counters["sign_reversals"], 2)

  @parameterized.parameters(("drop", 0.0), ("linear", 1.0 / 3.0))
  def test_staleness(self, mode, weight_at_2):
    rng = np.random.default_rng(5)
    replay = _make(max_staleness=2, staleness_mode=mode, num_stages=1)
    eps = _Episodes(rng, range(2 * G))
    replay.add_group(0, range(G))
    replay.add_group(1, range(G, 2 * G))
    r = [1.0, 0.0, 0.0, 0.0]
    toks, masks, blps = eps.stage(range(2 * G))
    replay.add_stage(range(G), 0, toks[:G], masks[:G], blps[:G], 10, r)
    replay.add_stage(range(G, 2 * G), 0, toks[G:], masks[G:], blps[G:], 11, r)
    # Group 0 is 3 versions old (> max_staleness), group 1 is 2 old.
    batch = replay.take(8, 13, BUCKETS)
    want = _norm(r)
    if mode == "drop":
      self.assertEqual(batch.num_rows, G)
      self.assertEqual(replay.counters["stale_dropped_segments"], G)
      np.testing.assert_allclose([a for _, _, a in batch.segments], want, atol=1e-5)
    else:
      self.assertEqual(batch.num_rows, G)  # Weight 0 at staleness 3: dropped too.
      self.assertEqual(replay.counters["stale_dropped_segments"], G)
      self.assertEqual(replay.counters["stale_downweighted_segments"], G)
      np.testing.assert_allclose([a for _, _, a in batch.segments], want * weight_at_2,
                                 atol=1e-5)
      np.testing.assert_allclose(batch.update.advantages[0][batch.update.loss_mask[0]],
                                 want[0] * weight_at_2, atol=1e-5)
    # A dropped provisional item counts as not applied: its correction is the full target.
    replay.finish(range(G), [0.0, 1.0, 0.0, 0.0])
    b = replay.take(8, 10, BUCKETS)
    self.assertEqual(b.kinds, ["final"] * G)
    np.testing.assert_allclose([a for _, _, a in b.segments], _norm([0, 1, 0, 0]), atol=1e-5)

  def test_bucketing_takes_oldest_bucket(self):
    replay = _make(num_stages=1)
    replay.add_group(0, range(G))
    replay.add_group(1, range(G, 2 * G))
    short = [np.arange(10, dtype=np.int32)] * G
    long = [np.arange(100, dtype=np.int32)] * G
    mask = lambda n: [np.ones(n, bool)] * G
    blp = lambda n: [np.zeros(n, np.float32)] * G
    replay.add_stage(range(G), 0, short, mask(10), blp(10), 0, [1.0, 0, 0, 0])
    replay.add_stage(range(G, 2 * G), 0, long, mask(100), blp(100), 0, [1.0, 0, 0, 0])
    b1 = replay.take(8, 0, BUCKETS)
    self.assertEqual(b1.update.tokens.shape, (8, 64))
    self.assertEqual(b1.num_rows, G)
    b2 = replay.take(8, 0, BUCKETS)
    self.assertEqual(b2.update.tokens.shape, (8, 128))
    with self.assertRaisesRegex(ValueError, "largest bucket"):
      replay.add_group(2, range(100, 100 + G))
      replay.add_stage(range(100, 100 + G), 0, [np.arange(200)] * G, mask(200), blp(200), 0,
                       [1.0, 0, 0, 0])
      replay.take(8, 0, BUCKETS)

  def test_capacity(self):
    replay = _make(num_stages=1, capacity=2 * G)
    rng = np.random.default_rng(6)
    eps = _Episodes(rng, range(3 * G))
    for g in range(3):
      members = range(g * G, (g + 1) * G)
      replay.add_group(g, members)
      toks, masks, blps = eps.stage(members)
      replay.add_stage(members, 0, toks, masks, blps, 0, [1.0, 0, 0, 0])
      replay.finish(members, [0.0, 1.0, 0, 0])
      self.assertLessEqual(replay.num_segments(), 2 * G)
    # 3 groups x (4 provisional + 2 correction rows) = 18 > 8: the oldest were evicted.
    self.assertEqual(replay.counters["evicted_segments"], 18 - replay.num_ready)
    # Each intake of a new group evicted everything older: only the last group's rows remain.
    batch = replay.take(8, 0, BUCKETS)
    self.assertEqual({e // G for e, _, _ in batch.segments}, {2})
    self.assertEqual(batch.num_rows, 6)
    strict = _make(num_stages=1, capacity=G, when_full="error")
    strict.add_group(0, range(G))
    with self.assertRaisesRegex(RuntimeError, "replay full"):
      toks, masks, blps = eps.stage(range(G))
      strict.add_stage(range(G), 0, toks, masks, blps, 0, [1.0, 0, 0, 0])
      strict.add_group(1, range(G, 2 * G))
      toks, masks, blps = eps.stage(range(G, 2 * G))
      strict.add_stage(range(G, 2 * G), 0, toks, masks, blps, 0, [1.0, 0, 0, 0])

  def test_state_dict_round_trip(self):
    rng = np.random.default_rng(7)
    a, b = _make(), _make()
    ids = np.arange(2 * G)
    eps = _Episodes(rng, ids)
    a.add_group(0, ids[:G])
    a.add_group(1, ids[G:])
    for k in range(2):
      toks, masks, blps = eps.stage(ids)
      a.add_stage(ids, k, toks, masks, blps, k, rng.random(2 * G))
    a.take(3, 1, BUCKETS)  # Leave a part of the queue.
    arrays, meta = a.state_dict()
    b.load_state_dict({k: v.copy() for k, v in arrays.items()}, meta)
    toks, masks, blps = eps.stage(ids)
    final = rng.random(2 * G)
    for r in (a, b):
      r.add_stage(ids, 2, toks, masks, blps, 2, np.ones(2 * G))
      r.finish(ids, final)
    ba, bb = _drain(a, 2), _drain(b, 2)
    self.assertLen(bb, len(ba))
    for x, y in zip(ba, bb, strict=True):
      for field in ("tokens", "loss_mask", "behaviour_logprobs", "advantages", "sample_weights"):
        np.testing.assert_array_equal(getattr(x.update, field), getattr(y.update, field))
      self.assertEqual(x.segments, y.segments)
    self.assertEqual(a.counters, b.counters)

  def test_state_of_an_earlier_version_without_counters(self):
    # Counters only feed logged metrics: a state without them restores them at zero; anything
    # else absent is named.
    rng = np.random.default_rng(3)
    a, b = _make(), _make()
    ids = np.arange(G)
    eps = _Episodes(rng, ids)
    a.add_group(0, ids)
    a.add_stage(ids, 0, *eps.stage(ids), 0, rng.random(G))
    arrays, meta = a.state_dict()
    self.assertNotEmpty(a.counters)
    old = {k: v for k, v in meta.items() if k != "counters"}
    with self.assertLogs(level="WARNING") as logs:
      b.load_state_dict(arrays, old)
    self.assertIn("meta.replay lacks 'counters'", logs.output[0])
    self.assertEmpty(b.counters)
    self.assertEqual(b.state_dict()[1]["items"], meta["items"])
    self.assertEqual(b.state_dict()[1]["episodes"], meta["episodes"])
    with self.assertRaisesRegex(checkpoint_records.RecordError, r"meta\.replay lacks items"):
      b.load_state_dict(arrays, {k: v for k, v in meta.items() if k != "items"})
    with self.assertRaisesRegex(checkpoint_records.RecordError,
                                r"host arrays replay lacks token_segment"):
      b.load_state_dict({k: v for k, v in arrays.items() if k != "token_segment"}, meta)

  def test_bad_inputs(self):
    replay = _make()
    with self.assertRaisesRegex(ValueError, "group_size"):
      _make(group_size=0)
    with self.assertRaisesRegex(ValueError, "staleness_mode"):
      _make(staleness_mode="sometimes")
    with self.assertRaisesRegex(ValueError, "stage_credit"):
      _make(stage_credit="later")
    for w in (-0.5, float("nan"), float("inf")):
      with self.assertRaisesRegex(ValueError, "negative_weight"):
        _make(negative_weight=w)
    with self.assertRaisesRegex(ValueError, "episode_ids"):
      replay.add_group(0, [1, 2])
    replay.add_group(0, range(G))
    with self.assertRaisesRegex(ValueError, "not registered"):
      replay.add_stage([99], 0, [np.zeros(3)], [np.ones(3, bool)], [np.zeros(3)], 0, [1.0])
    with self.assertRaisesRegex(ValueError, "stage"):
      replay.add_stage([0], S, [np.zeros(3)], [np.ones(3, bool)], [np.zeros(3)], 0, [1.0])
    with self.assertRaisesRegex(ValueError, "rewards must be finite"):
      replay.add_stage([0], 0, [np.zeros(3)], [np.ones(3, bool)], [np.zeros(3)], 0, [np.nan])
    with self.assertRaisesRegex(ValueError, "same length"):
      replay.add_stage([0], 0, [np.zeros(3)], [np.ones(2, bool)], [np.zeros(3)], 0, [1.0])
    with self.assertRaisesRegex(ValueError, "has not reported"):
      replay.finish([0], [1.0])
    with self.assertRaisesRegex(ValueError, "max_rows"):
      replay.take(0, 0, BUCKETS)


class DefaultsTest(absltest.TestCase):

  def test_defaults_are_the_config_defaults(self):
    # A replay built with its own defaults behaves as a run with the config's defaults: the
    # keyword arguments that `train.session.make_replay` fills from a config section default to
    # that section's field.
    sections = {"correction": config_lib.CorrectionSection(),
                "replay": config_lib.ReplaySection(), "rl": config_lib.RLSection(),
                "workflow": config_lib.TrainConfig().workflow}
    fields = {"stage_rewards": "workflow.stage_rewards", "correction": "correction.enabled",
              "target_mode": "correction.target", "gamma": "correction.gamma",
              "beta": "correction.beta", "scale": "correction.scale",
              "baseline": "correction.baseline", "max_staleness": "correction.max_staleness",
              "staleness_mode": "correction.staleness_mode", "capacity": "replay.capacity",
              "when_full": "replay.when_full",
              "skip_zero_advantage": "replay.skip_zero_advantage",
              "pack_corrections": "replay.pack_corrections",
              "stage_credit": "correction.stage_credit",
              "supersede_queued": "correction.supersede_queued",
              "drop_tied_groups": "rl.dynamic_sampling"}
    params = inspect.signature(replay_lib.StagedReplay).parameters
    got = {k: params[k].default for k in fields}
    want = {k: getattr(sections[p.split(".")[0]], p.split(".")[1]) for k, p in fields.items()}
    self.assertEqual(got, want)

  def test_from_sections_takes_every_field_of_both_sections(self):
    # Every field of the correction and replay sections reaches the replay, under its name
    # (`enabled` -> `correction`, `target` -> `target_mode`); a field added to a section and
    # not passed on fails here.
    renamed = {"enabled": "correction", "target": "target_mode"}
    correction = config_lib.CorrectionSection(
        enabled=False, target="mixed", gamma=0.5, beta=0.25, scale="none",
        baseline="previous_stage", negative_weight=0.5, max_staleness=3,
        staleness_mode="linear", stage_credit="post_hoc", supersede_queued=True)
    storage = config_lib.ReplaySection(capacity=77, when_full="error",
                                       skip_zero_advantage=False, pack_corrections=False)
    replay = replay_lib.StagedReplay.from_sections(group_size=2, num_stages=3,
                                                   correction=correction, storage=storage)
    for section in (correction, storage):
      default = type(section)()
      for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        self.assertNotEqual(value, getattr(default, f.name), f"pick a non-default {f.name}")
        self.assertEqual(getattr(replay, renamed.get(f.name, f.name)), value, f.name)
    packed = replay_lib.StagedReplay.from_sections(
        group_size=2, num_stages=3, correction=correction,
        storage=config_lib.ReplaySection(pack_corrections=True), loss_additive=False)
    self.assertFalse(packed.pack_corrections)  # needs a loss additive over segments


class PackedGradientTest(parameterized.TestCase):
  """Packing an episode's corrections into one row must not change the policy gradient."""

  def _corrections(self, pack):
    """One group's correction batch (`G * S` rows) and `(row episode [N], stage [N])` for the
    rows of the unpacked layout (-1 on padding rows)."""
    rng = np.random.default_rng(5)
    replay = _make(pack_corrections=pack)
    eps = _Episodes(rng, range(G))
    replay.add_group(0, range(G))
    for k in range(S):
      toks, masks, blps = eps.stage(range(G))
      replay.add_stage(range(G), k, toks, masks, blps, 0, rng.random(G))
    _drain(replay, rows=G * S)  # the provisional updates
    replay.finish(range(G), rng.random(G))
    batches = _drain(replay, rows=G * S)
    self.assertLen(batches, 1)
    return batches[0]

  def _policy_logprobs(self, batch, theta, owner):
    """`[N, T]` log-probs of the batch's rows from per-episode, per-position `theta [G, T]`."""
    rows = np.array([owner.get(tuple(r[:5]), 0) for r in batch.update.tokens.tolist()])
    return theta[rows]

  def _grad(self, batch, theta, owner, ratio_level, aggregation):
    u = batch.update
    def loss(th):
      return losses_lib.policy_loss(
          self._policy_logprobs(batch, th, owner), u.behaviour_logprobs, u.advantages,
          u.loss_mask, ratio_level=ratio_level, aggregation=aggregation,
          max_tokens=u.tokens.shape[1], sample_weights=u.sample_weights)[0]
    return np.asarray(jax.grad(loss)(theta))

  def _setup(self, last_stage_shift, noise):
    """The unpacked batch, the owner map (row prefix -> episode) and a perturbed policy:
    behaviour log-probs plus `noise`, plus `last_stage_shift` on the last stage's tokens."""
    unpacked = self._corrections(pack=False)
    u = unpacked.update
    self.assertEqual(unpacked.num_rows, len(unpacked.segments))  # one segment per row
    owner, theta = {}, np.zeros((G, u.tokens.shape[1]), np.float32)
    last = np.zeros_like(theta, bool)
    for r, (e, k, _) in enumerate(unpacked.segments):
      owner[tuple(u.tokens[r, :5].tolist())] = e
      theta[e] = np.where(u.loss_mask[r], u.behaviour_logprobs[r], theta[e])
      last[e] |= u.loss_mask[r] & (k == S - 1)
    rng = np.random.default_rng(6)
    theta = theta + noise * rng.standard_normal(theta.shape) + last_stage_shift * last
    return unpacked, owner, jnp.asarray(theta, jnp.float32), last

  @parameterized.product(ratio_level=losses_lib.RATIO_LEVELS,
                         aggregation=losses_lib.AGGREGATIONS)
  def test_packed_and_unpacked_gradients_agree(self, ratio_level, aggregation):
    unpacked, owner, theta, _ = self._setup(last_stage_shift=0.3, noise=0.1)
    packed = self._corrections(pack=losses_lib.segments_additive(ratio_level, aggregation))
    if losses_lib.segments_additive(ratio_level, aggregation):
      self.assertLess(packed.num_rows, unpacked.num_rows)  # packing happened
    want = self._grad(unpacked, theta, owner, ratio_level, aggregation)
    got = self._grad(packed, theta, owner, ratio_level, aggregation)
    self.assertGreater(np.abs(want).max(), 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)

  def test_sequence_ratio_across_packed_stages_zeroes_unchanged_stage(self):
    # Why the replay does not pack under GSPO: only the last stage moved, far enough that the
    # episode's sequence ratio leaves the clip range; packed, the unchanged earlier stages of
    # an episode with a positive correction lose their gradient.
    unpacked, owner, theta, last = self._setup(last_stage_shift=1.5, noise=0.0)
    forced = self._corrections(pack=True)
    want = self._grad(unpacked, theta, owner, "sequence", "token_mean")
    got = self._grad(forced, theta, owner, "sequence", "token_mean")
    earlier = ~last & (want != 0.0)
    self.assertTrue(earlier.any())
    self.assertTrue(np.any(got[earlier] == 0.0))


def _run_groups(replay, stage_r, final_r, seed=0, undrained=(), rows=None):
  """Runs `[B, G, S]` stage rewards and `[B, G]` final rewards through `replay` (group `b` has
  episodes `b·G ..`), draining after every stage but those in `undrained` and at the end;
  returns every taken segment as `(episode, stage, advantage)` and the per-segment totals.
  `rows`, a list, gets the kinds of the rows taken."""
  num_groups = stage_r.shape[0]
  ids = np.arange(num_groups * G).reshape(num_groups, G)
  eps = _Episodes(np.random.default_rng(seed), ids.ravel())
  for b in range(num_groups):
    replay.add_group(b, ids[b])
  taken = []
  for k in range(replay.num_stages):
    toks, masks, blps = eps.stage(ids.ravel())
    replay.add_stage(ids.ravel(), k, toks, masks, blps, k, stage_r[..., k].ravel())
    if k not in undrained:
      batches = _drain(replay, k)
      taken += [seg for batch in batches for seg in batch.segments]
      if rows is not None:
        rows += [kind for batch in batches for kind in batch.kinds]
  replay.finish(ids.ravel(), final_r.ravel())
  batches = _drain(replay, replay.num_stages)
  taken += [seg for batch in batches for seg in batch.segments]
  if rows is not None:
    rows += [kind for batch in batches for kind in batch.kinds]
  total = collections.defaultdict(float)
  for e, k, a in taken:
    total[(e, k)] += a
  return sorted((e, k, round(a, 5)) for e, k, a in taken), total


class GroupFilterTest(parameterized.TestCase):
  """`drop_tied_groups` (dynamic sampling) and `pass_rate_band` (the pass-rate filter)."""

  # Group 0 ties everywhere; group 1 ties at stage 0 only; group 2 ties nowhere.
  STAGE_R = np.array([[[1, 0, 1]] * G,
                      [[0, 1, 0], [0, 0, 1], [0, 1, 1], [0, 0, 0]],
                      [[1, 0, 0], [0, 1, 0], [1, 1, 1], [0, 0, 1]]], np.float32)
  FINAL_R = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], np.float32)

  @parameterized.product(stage_credit=("immediate", "post_hoc"), stage_rewards=(True, False),
                         skip_zero=(True, False), baseline=("none", "previous_stage"))
  def test_tied_groups_ready_nothing_and_are_counted(self, stage_credit, stage_rewards,
                                                     skip_zero, baseline):
    opts = dict(stage_credit=stage_credit, stage_rewards=stage_rewards,
                skip_zero_advantage=skip_zero, baseline=baseline)
    want, _ = _run_groups(_make(**opts), self.STAGE_R, self.FINAL_R)
    replay = _make(drop_tied_groups=True, **opts)
    got, _ = _run_groups(replay, self.STAGE_R, self.FINAL_R)
    # Without the filter, the tied group's rows (and group 1's tied stage 0) are the zero rows
    # skip_zero_advantage=False keeps; with it, nothing of them.
    dropped = lambda e, k, a: e < G or (stage_rewards and e < 2 * G and k == 0 and a == 0.0)
    self.assertEqual(got, [seg for seg in want if not dropped(*seg)])
    if not skip_zero:
      self.assertTrue(any(e < G for e, _, _ in want))
    self.assertFalse(any(a == 0.0 for e, k, a in got if e < 2 * G and k == 0 and stage_rewards))
    self.assertEqual(replay.counters["dynamic_sampling_dropped_groups"], 1)
    self.assertNotIn("dynamic_sampling_dropped_groups", _make(**opts).counters)

  @parameterized.product(stage_credit=("immediate", "post_hoc"), correction=(True, False),
                         stage_rewards=(True, False))
  def test_pass_rate_band_withdraws_the_credit_of_groups_outside_it(self, stage_credit,
                                                                   correction, stage_rewards):
    opts = dict(stage_credit=stage_credit, correction=correction, stage_rewards=stage_rewards,
                skip_zero_advantage=False)
    stage_r = self.STAGE_R.copy()
    stage_r[0, 0] = [0, 1, 0]  # every group with stage signal
    _, want = _run_groups(_make(**opts), stage_r, self.FINAL_R)
    replay = _make(pass_rate_band=(0.3, 0.9), **opts)  # groups 0 (1.0) and 1 (0.25) outside
    got_rows, got = _run_groups(replay, stage_r, self.FINAL_R)
    self.assertEqual(replay.counters["pass_rate_filtered_groups"], 2)
    provisional = np.asarray(advantages_lib.provisional_advantages(stage_r)).reshape(-1, S)
    for e in range(3 * G):
      for k in range(S):
        if e >= 2 * G:  # inside the band: as without the filter
          self.assertAlmostEqual(got.get((e, k), 0.0), want[(e, k)], places=5)
        elif stage_rewards and stage_credit == "immediate" and not correction:
          # Applied at once and never corrected: the provisional update stays.
          self.assertAlmostEqual(got.get((e, k), 0.0), float(provisional[e, k]), places=5)
        else:
          self.assertAlmostEqual(got.get((e, k), 0.0), 0.0, places=5, msg=f"{e}, {k}")
    if stage_credit == "post_hoc" or not stage_rewards:
      # Nothing was applied before the outcome: the filtered groups ready no row at all.
      self.assertEqual([seg for seg in got_rows if seg[0] < 2 * G], [])

  def test_the_whole_band_filters_nothing(self):
    want, _ = _run_groups(_make(skip_zero_advantage=False), self.STAGE_R, self.FINAL_R)
    replay = _make(skip_zero_advantage=False, pass_rate_band=(0.0, 1.0))
    got, _ = _run_groups(replay, self.STAGE_R, self.FINAL_R)
    self.assertEqual(got, want)
    self.assertEqual(replay.counters["pass_rate_filtered_groups"], 0)

  def test_bad_band(self):
    for band in ((0.5, 0.2), (0.1,), (-0.1, 0.5), (0.2, 1.5)):
      with self.assertRaisesRegex(ValueError, r"pass_rate_band must be \(lo, hi\)"):
        _make(pass_rate_band=band)




class SupersedeQueuedTest(parameterized.TestCase):
  """`supersede_queued`: provisional items still queued when the outcome lands give way to it."""

  STAGE_R = GroupFilterTest.STAGE_R
  FINAL_R = GroupFilterTest.FINAL_R

  @parameterized.product(undrained=((), (S - 1,), (1, S - 1)), pack=(True, False),
                         skip_zero=(True, False), baseline=("none", "previous_stage"))
  def test_each_segment_still_totals_its_target(self, undrained, pack, skip_zero, baseline):
    opts = dict(pack_corrections=pack, skip_zero_advantage=skip_zero, baseline=baseline)
    want_kinds, got_kinds = [], []
    _, want = _run_groups(_make(**opts), self.STAGE_R, self.FINAL_R, undrained=undrained,
                          rows=want_kinds)
    replay = _make(supersede_queued=True, **opts)
    _, got = _run_groups(replay, self.STAGE_R, self.FINAL_R, undrained=undrained,
                         rows=got_kinds)
    for key in sorted(set(want) | set(got)):
      self.assertAlmostEqual(got.get(key, 0.0), want.get(key, 0.0), places=5, msg=str(key))
    # The provisional items of the stages left in the queue never reached the learner.
    provisional = np.asarray(advantages_lib.provisional_advantages(
        self.STAGE_R, baseline=baseline))
    queued = sum(int(np.sum(provisional[..., k] != 0.0)) if skip_zero else provisional[..., k].size
                 for k in undrained)
    self.assertEqual(replay.counters["superseded_provisional_items"], queued)
    self.assertEqual(collections.Counter(got_kinds)["provisional"],
                     collections.Counter(want_kinds)["provisional"] - queued)
    if undrained and queued:
      self.assertLess(len(got_kinds), len(want_kinds))
    self.assertEqual(replay.num_segments(), 0)

  def _interleaved(self, replay, check):
    """Group 0 finished (its outcome rows queued), group 1 with its first stage queued and
    unfinished, then group 2 finishes with every stage still queued; `check(queued_before)`
    runs right after that finish. Returns the per-segment totals once everything is drained
    (group 1 finished last)."""
    rng = np.random.default_rng(7)
    ids = np.arange(3 * G).reshape(3, G)
    eps = _Episodes(rng, ids.ravel())
    rewards = rng.integers(0, 2, size=(3, G, S)).astype(np.float32)
    final = rng.integers(0, 2, size=(3, G)).astype(np.float32)
    for g in range(3):
      replay.add_group(g, ids[g])
    taken = []
    drain = lambda v: taken.extend(seg for b in _drain(replay, v) for seg in b.segments)
    stage = lambda g, k: replay.add_stage(ids[g], k, *eps.stage(ids[g]), k, rewards[g, :, k])
    for k in range(S):
      stage(0, k)
      drain(k)
    replay.finish(ids[0], final[0])  # group 0's outcome rows wait in the queue
    stage(1, 0)  # group 1's first stage waits too
    for k in range(S):
      stage(2, k)
    before = list(replay._ready)
    replay.finish(ids[2], final[2])
    check(before)
    for k in range(1, S):
      stage(1, k)
    replay.finish(ids[1], final[1])
    drain(S)
    total = collections.defaultdict(float)
    for e, k, a in taken:
      total[(e, k)] += a
    return total

  def test_only_the_finishing_groups_queued_provisional_rows_are_withdrawn(self):
    def check(before):
      after = list(replay._ready)
      group_of = lambda item: int(item.seg_episode[0]) // G
      for item in before:
        kept = any(item is a for a in after)
        if group_of(item) == 2 and item.kind == "provisional":
          self.assertFalse(kept)
        else:  # group 0's outcome rows, group 1's provisional rows
          self.assertTrue(kept, (group_of(item), item.kind))
      self.assertEqual(replay.counters["superseded_provisional_items"],
                       sum(group_of(i) == 2 and i.kind == "provisional" for i in before))
      self.assertGreater(replay.counters["superseded_provisional_items"], 0)
      # Group 2's segments now arrive in its outcome rows, with every stage among them.
      outcome = [i for i in after if group_of(i) == 2]
      self.assertEqual({int(k) for i in outcome for k in i.seg_stage}, set(range(S)))

    replay = _make(supersede_queued=True, skip_zero_advantage=False)
    got = self._interleaved(replay, check)
    want = self._interleaved(_make(skip_zero_advantage=False), lambda before: None)
    for key in sorted(set(want) | set(got)):
      self.assertAlmostEqual(got.get(key, 0.0), want.get(key, 0.0), places=5, msg=str(key))

  def test_a_replay_restored_mid_queue_supersedes_alike(self):
    # The state (queued provisional rows, their segments' applied advantages) round-trips.
    replay = _make(supersede_queued=True)
    ids = np.arange(G)
    eps = _Episodes(np.random.default_rng(3), ids)
    replay.add_group(0, ids)
    for k in range(S):
      replay.add_stage(ids, k, *eps.stage(ids), k, [1.0, 0.0, 1.0, 0.0])
    restored = _make(supersede_queued=True)
    restored.load_state_dict(*replay.state_dict())
    for r in (replay, restored):
      r.finish(ids, [1.0, 0.0, 0.0, 1.0])
    self.assertEqual(restored.counters["superseded_provisional_items"],
                     replay.counters["superseded_provisional_items"])
    self.assertGreater(replay.counters["superseded_provisional_items"], 0)
    self.assertEqual(sorted(_drain(restored, S)[0].segments),
                     sorted(_drain(replay, S)[0].segments))

  @parameterized.named_parameters(("no_correction", dict(correction=False)),
                                  ("post_hoc", dict(stage_credit="post_hoc")),
                                  ("outcome_only", dict(stage_rewards=False)))
  def test_off_where_it_would_change_the_credit(self, opts):
    # Without a correction a provisionally updated segment keeps its provisional advantage and
    # never gets its target (withdrawing its row would hand it the target instead); post-hoc
    # credit holds its items outside the queue; outcome-only runs have no provisional items:
    # nothing changes.
    want, _ = _run_groups(_make(**opts), self.STAGE_R, self.FINAL_R, undrained=(S - 1,))
    replay = _make(supersede_queued=True, **opts)
    got, _ = _run_groups(replay, self.STAGE_R, self.FINAL_R, undrained=(S - 1,))
    self.assertEqual(got, want)
    self.assertEqual(replay.counters["superseded_provisional_items"], 0)


if __name__ == "__main__":
  absltest.main()
