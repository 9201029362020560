"""Shared-prefix packing of learner rows (tree attention): `core.packing`, the transformer's
`branches`, `replay.batching`'s packed layout and the update step on packed batches.

A packed batch must give every token the log-prob of its unpacked row, the same loss and the same
gradient as the unpacked batch of the same items (a random small model, several groups of
different prompt lengths, provisional rows of two stages and packed correction rows with
per-segment staleness weights), on one device and sharded over 8 simulated CPU devices
(conftest.py).
"""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo import replay as replay_lib
from agentic_grpo.core import packing
from agentic_grpo.core import types as core_types
from agentic_grpo.learner import steps as steps_lib
from agentic_grpo.models import transformer
from agentic_grpo.replay import batching

VOCAB = 48
G, S = 4, 2
ROWS = 48  # items per update, and the unpacked batch's rows
BUCKET = 64  # the unpacked length bucket
PACKED = {32: 64, 64: 128}  # packed row length per length bucket

_CONFIG = transformer.ModelConfig(
    vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=48,
    qkv_bias=True, tie_embeddings=False, max_seq_len=256)


def _brute_mask(branches, positions=None):
  """The tree mask by its definition; `positions`: trees start at branch 0 and position 0."""
  n, t = branches.shape
  out = np.zeros((n, t, t), bool)
  for r in range(n):
    tree, trees = 0, []
    for q in range(t):
      if q > 0 and positions is not None and branches[r, q] == 0 and positions[r, q] == 0:
        tree += 1
      trees.append(tree)
    for q in range(t):
      for k in range(q + 1):
        out[r, q, k] = (trees[k] == trees[q]
                        and (branches[r, k] == 0 or branches[r, k] == branches[r, q]))
  return out


@functools.lru_cache(maxsize=None)
def _params():
  graphdef, params = transformer.init_model(_CONFIG, 0)
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda x: x + 0.2 * rng.standard_normal(x.shape).astype(x.dtype),
                        params)
  ref = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(x.dtype), params)
  return graphdef, params, ref


def _replay(packed, *, shared_start=False, seed=0):
  """A replay after two stages and the outcome of 3 groups of G (prompts of 7, 12 and 18
  tokens), with every item ready: provisional rows of both stages and packed corrections.

  `shared_start`: the members of the first group also share their first 3 generated tokens
  (a prefix must still end before the first loss token)."""
  rng = np.random.default_rng(seed)
  pack = batching.PrefixPacking(PACKED) if packed else None
  replay = replay_lib.StagedReplay(group_size=G, num_stages=S, capacity=10_000,
                                   staleness_mode="linear", max_staleness=2,
                                   prefix_packing=pack)
  rows = {}
  for g, plen in enumerate((7, 12, 18)):
    eps = list(range(g * G, (g + 1) * G))
    replay.add_group(g, eps)
    prompt = rng.integers(0, VOCAB, plen)
    start = rng.integers(0, VOCAB, 3)
    for e in eps:
      rows[e] = prompt
    for k in range(S):
      toks, masks, blps = [], [], []
      for e in eps:
        opening = rng.integers(0, VOCAB, 0 if k == 0 else 3)
        gen = rng.integers(0, VOCAB, int(rng.integers(2, 9)))
        if shared_start and g == 0 and k == 0:
          gen = np.concatenate([start, gen])
        row = np.concatenate([rows[e], opening, gen]).astype(np.int32)
        mask = np.zeros(row.shape, bool)
        mask[-len(gen):] = True
        rows[e] = row
        toks.append(row)
        masks.append(mask)
        blps.append(np.where(mask, -3.0 + 0.3 * rng.standard_normal(row.shape), 0.0
                             ).astype(np.float32))
      replay.add_stage(eps, k, toks, masks, blps, k, rng.random(G))
    replay.finish(eps, rng.random(G))
  return replay


def _items(batch):
  """The items of a batch as unpacked rows: `[(tokens, mask, blp, adv, (row, slots))]`."""
  u = batch.update
  out = []
  for r in range(u.tokens.shape[0]):
    if not u.sample_weights[r]:
      continue
    t = u.tokens.shape[1]
    b = np.zeros(t, np.int32) if u.branches is None else u.branches[r]
    pos = np.arange(t) if u.positions is None else u.positions[r]
    starts = list(np.flatnonzero((b == 0) & (pos == 0))) + [t]  # where each tree starts
    slots = []
    for lo, hi in zip(starts[:-1], starts[1:], strict=True):
      tree = b[lo:hi]
      if not tree.any():  # one item: the tree as it is, up to the row's trailing padding
        n = hi - lo if lo == 0 else int(np.argmin(np.append(pos[lo:hi] == np.arange(hi - lo),
                                                             False)))
        slots.append(lo + np.arange(n))
      else:
        prefix = int(np.argmax(tree > 0))
        slots.extend(lo + np.concatenate([np.arange(prefix), np.flatnonzero(tree == i)])
                     for i in range(1, tree.max() + 1))
    for s in slots:
      if u.positions is not None:  # each item at the positions of its own row
        np.testing.assert_array_equal(u.positions[r, s], np.arange(len(s)))
      out.append((u.tokens[r, s], u.loss_mask[r, s], u.behaviour_logprobs[r, s],
                  u.advantages[r, s], (r, s)))
  return out


def _match(packed, unpacked):
  """Pairs each item of the packed batch with a distinct unpacked row holding the same
  tokens, loss mask, behaviour log-probs and advantages: `[(packed item, unpacked item)]`."""
  got, want = _items(packed), _items(unpacked)
  assert len(got) == len(want), (len(got), len(want))
  used, pairs = set(), []
  for g in got:
    for j, w in enumerate(want):
      n = len(g[0])
      if j in used or len(w[0]) < n and g[1][len(w[0]):].any():
        continue
      m = min(n, len(w[0]))
      if (np.array_equal(g[0][:m], w[0][:m]) and np.array_equal(g[1][:m], w[1][:m])
          and not g[1][m:].any() and not w[1][m:].any()
          and np.array_equal(g[2][:m], w[2][:m]) and np.array_equal(g[3][:m], w[3][:m])):
        used.add(j)
        pairs.append((g, w, m))
        break
    else:
      raise AssertionError(f"no unpacked row holds packed item {g[0]}")
  return pairs


def _take_all(replay, version=3):
  """Every ready item in one batch, at `version`: stage-0 segments (version 0) dropped as
  stale, stage-1 segments (version 1) weighted 1/3 (linear staleness, max 2)."""
  batch = replay.take(ROWS, version, (BUCKET,))
  assert replay.num_ready == 0
  return batch


def _cfg(aggregation="seq_mean_token_sum_norm", micro_batches=1, kl_beta=0.1):
  cfg = config_lib.TrainConfig()
  return dataclasses.replace(
      cfg,
      rl=dataclasses.replace(cfg.rl, rows_per_update=ROWS, micro_batches=micro_batches),
      loss=dataclasses.replace(cfg.loss, aggregation=aggregation, kl_beta=kl_beta,
                               max_tokens=16 if aggregation == "seq_mean_token_sum_norm" else 0))


def _state(params, tx):
  """A fresh learner state on copies of `params` (the update step donates its state)."""
  return learner.init_state(jax.tree.map(jnp.copy, params), tx, 0)


# Plain SGD (lr 1) under the learner's non-finite guard: the parameter change is the gradient.
_SGD = optax.apply_if_finite(optax.sgd(1.0), 3)


class TreeMaskTest(parameterized.TestCase):

  def test_mask_equals_brute_force(self):
    rng = np.random.default_rng(0)
    branches = rng.integers(0, 4, (3, 11)).astype(np.int32)
    branches[0] = [0, 0, 0, 1, 1, 2, 2, 2, 3, 0, 0]  # a layout with padding at its end
    np.testing.assert_array_equal(np.asarray(packing.tree_mask(jnp.asarray(branches))),
                                  _brute_mask(branches))

  def test_several_trees_mask_equals_brute_force(self):
    # Two trees and a single row in one packed row: [p p 1 1 2 | q q q 1 2 2 | r r r | pad].
    branches = np.array([[0, 0, 1, 1, 2, 0, 0, 0, 1, 2, 2, 0, 0, 0, 0, 0]], np.int32)
    positions = np.array([[0, 1, 2, 3, 2, 0, 1, 2, 3, 3, 4, 0, 1, 2, 14, 15]], np.int32)
    mask = np.asarray(packing.tree_mask(jnp.asarray(branches), jnp.asarray(positions)))
    np.testing.assert_array_equal(mask, _brute_mask(branches, positions))
    self.assertFalse(mask[0, 5:, :5].any())  # no tree sees another
    self.assertFalse(mask[0, 11:, :11].any())
    np.testing.assert_array_equal(
        np.asarray(packing.tree_starts(jnp.asarray(positions), jnp.asarray(branches)))[0],
        [0] * 5 + [5] * 6 + [11] * 5)
    # A suffix's first token is scored from its own tree's prefix end; a tree's first token
    # from the slot before it (never a loss token; its log-prob is set to 0).
    np.testing.assert_array_equal(
        np.asarray(packing.predictor_slots(jnp.asarray(positions), jnp.asarray(branches)))[0],
        [0, 0, 1, 2, 1, 4, 5, 6, 7, 7, 9, 10, 11, 12, 13, 14])

  def test_several_trees_give_each_its_unpacked_logprobs(self):
    """Two trees side by side in one row: every token's log-prob is its unpacked row's."""
    graphdef, params, _ = _params()
    rng = np.random.default_rng(5)
    p1, p2 = rng.integers(0, VOCAB, 5), rng.integers(0, VOCAB, 7)
    rows = [np.concatenate([p1, rng.integers(0, VOCAB, 3)]),
            np.concatenate([p1, rng.integers(0, VOCAB, 4)]),
            np.concatenate([p2, rng.integers(0, VOCAB, 2)]),
            rng.integers(0, VOCAB, 6)]
    t = 32
    tokens = np.zeros((1, t), np.int32)
    positions = np.arange(t, dtype=np.int32)[None].copy()
    branches = np.zeros((1, t), np.int32)
    where = []  # the slots of each row
    start = 0
    for members, prefix in (([0, 1], 5), ([2], 9), ([3], 6)):
      offset = start + prefix
      for b, k in enumerate(members):
        n = len(rows[k])
        if len(members) == 1:
          slots = start + np.arange(n)
        else:
          slots = np.concatenate([start + np.arange(prefix), offset + np.arange(n - prefix)])
          branches[0, offset:offset + n - prefix] = b + 1
          offset += n - prefix
        tokens[0, slots] = rows[k]
        positions[0, slots] = np.arange(n)
        where.append(slots)
      start = offset if len(members) > 1 else start + len(rows[members[0]])
    fn = jax.jit(steps_lib._token_logprobs, static_argnums=(0, 3))
    transform = core_types.SamplingTransform(temperature=1.0)
    packed = np.asarray(fn(graphdef, params, jnp.asarray(tokens), transform,
                           jnp.asarray(positions), jnp.asarray(branches))[0])[0]
    for k, row in enumerate(rows):
      plain = np.asarray(fn(graphdef, params, jnp.asarray(row[None].astype(np.int32)),
                            transform)[0])[0]
      np.testing.assert_allclose(packed[where[k]], plain, atol=2e-5, rtol=0)

  def test_place_trees(self):
    rows = batching.place_trees([30, 10, 25, 5, 20], 40)
    self.assertEqual(rows, [[(0, 0), (1, 30)], [(2, 0), (3, 25)], [(4, 0)]])
    self.assertEqual(batching.place_trees([40], 40), [[(0, 0)]])
    with self.assertRaisesRegex(ValueError, "does not fit"):
      batching.place_trees([41], 40)

  def test_all_prefix_is_causal(self):
    mask = np.asarray(packing.tree_mask(jnp.zeros((1, 6), jnp.int32)))[0]
    np.testing.assert_array_equal(mask, np.tril(np.ones((6, 6), bool)))

  def test_predictor_slots(self):
    # prefix of 3, suffixes of 2, 3 and 1 tokens, then padding.
    branches = np.array([[0, 0, 0, 1, 1, 2, 2, 2, 3, 0]], np.int32)
    positions = np.array([[0, 1, 2, 3, 4, 3, 4, 5, 3, 9]], np.int32)
    np.testing.assert_array_equal(
        np.asarray(packing.predictor_slots(jnp.asarray(positions), jnp.asarray(branches))),
        [[0, 0, 1, 2, 3, 2, 5, 6, 2, 8]])

  @parameterized.parameters((0, 0), (4, 0), (0, 4), (0, 5), (4, 4))
  def test_packed_logits_equal_unpacked_rows(self, chunk, block):
    """Every token of a packed row gets its unpacked row's logits (`chunk`: the chunked
    attention path, query chunks of 4; `block`: causal blocks of 4 or 5 queries; both: causal
    chunks of 4)."""
    config = dataclasses.replace(_CONFIG, attention_chunk=chunk, causal_block=block)
    graphdef, params, _ = _params()
    rng = np.random.default_rng(2)
    prefix = rng.integers(0, VOCAB, 6)
    suffixes = [rng.integers(0, VOCAB, n) for n in (3, 1, 5)]
    # The suffixes differ from their first token on (the whole prompt is shared).
    suffixes[1][0] = (suffixes[0][0] + 1) % VOCAB
    rows = [np.concatenate([prefix, s]) for s in suffixes]
    t = 6 + 9 + 2  # two padding slots
    tokens = np.zeros((1, t), np.int32)
    positions = np.arange(t, dtype=np.int32)[None].copy()
    branches = np.zeros((1, t), np.int32)
    tokens[0, :6] = prefix
    off = 6
    for i, s in enumerate(suffixes):
      tokens[0, off:off + len(s)] = s
      positions[0, off:off + len(s)] = 6 + np.arange(len(s))
      branches[0, off:off + len(s)] = i + 1
      off += len(s)
    graphdef_c = transformer.abstract_model(config)[0]
    apply = jax.jit(transformer.apply, static_argnums=0)
    got = np.asarray(apply(graphdef_c, params, tokens, positions, branches=branches)[0])[0]
    flat = np.zeros((3, 11), np.int32)
    for i, r in enumerate(rows):
      flat[i, :len(r)] = r
    want = np.asarray(apply(graphdef, params, flat, np.broadcast_to(np.arange(11), (3, 11)))[0])
    np.testing.assert_allclose(got[:6], want[0, :6], atol=1e-5)
    off = 6
    for i, s in enumerate(suffixes):
      for j in range(len(s)):
        np.testing.assert_allclose(got[off + j], want[i, 6 + j], atol=1e-5)
      off += len(s)
    # Without the branches the later suffixes see the earlier ones (the test can fail).
    plain = np.asarray(apply(graphdef, params, tokens, positions)[0])[0]
    self.assertGreater(float(np.abs(plain[6 + 3] - want[1, 6]).max()), 1e-3)
    with self.assertRaisesRegex(ValueError, "branches shape"):
      transformer.apply(graphdef, params, tokens, positions, branches=branches[:, :3])


class PackedLayoutTest(parameterized.TestCase):

  @parameterized.product(shared_start=(False, True), version=(1, 2, 3))
  def test_same_items_and_state(self, shared_start, version):
    plain, packed = _replay(False, shared_start=shared_start), _replay(True,
                                                                       shared_start=shared_start)
    while plain.num_ready:
      a = plain.take(16, version, (32, 64))
      b = packed.take(16, version, (32, 64))
      if a is None:
        self.assertIsNone(b)
        continue
      # The same items, segments and replay state; the packed layout holds the same per-token
      # terms of every item.
      self.assertCountEqual(a.segments, b.segments)
      self.assertCountEqual(a.kinds, b.kinds)
      sa, sb = plain.state_dict(), packed.state_dict()
      self.assertEqual(sa[1], sb[1])
      for k in sa[0]:
        np.testing.assert_array_equal(sa[0][k], sb[0][k])
      self.assertLen(_match(b, a), a.stats["rows"])
      self.assertEqual(b.stats["items"], a.stats["rows"])
      self.assertEqual(b.stats["loss_tokens"], a.stats["loss_tokens"])
      self.assertLessEqual(b.stats["rows"], a.stats["rows"])
      # One row length per length bucket, a row bucket of rows: no more shapes than unpacked.
      self.assertEqual(b.update.tokens.shape[1], PACKED[a.update.tokens.shape[1]])
      self.assertIn(b.update.tokens.shape[0], batching.row_buckets(16))
      b.update.check()
      self.assertTrue(b.update.packed)
      self.assertFalse(a.update.packed)
    self.assertEqual(packed.num_ready, 0)

  def test_prefix_ends_before_every_first_loss_token(self):
    batch = _take_all(_replay(True, shared_start=True))
    u = batch.update
    self.assertLess(batch.stats["rows"], batch.stats["items"])  # packing happened
    self.assertLess(batch.stats["rows"], batch.stats["trees"])  # trees share rows
    self.assertGreater(batch.stats["shared_prefix_tokens"], 0)
    for r in range(u.tokens.shape[0]):
      if u.branches[r].any():
        prefix = int(np.argmax(u.branches[r] > 0))
        self.assertFalse(u.loss_mask[r, :prefix].any())
        np.testing.assert_array_equal(u.positions[r, :prefix], np.arange(prefix))

  def test_plan_packs_respects_length_and_prefix(self):
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, VOCAB, 10)
    rows = [np.concatenate([prompt, rng.integers(0, VOCAB, 5)]) for _ in range(4)]
    rows.append(rng.integers(0, VOCAB, 15))  # shares nothing
    rows[-1][0] = (prompt[0] + 1) % VOCAB
    first_loss = [10] * 5
    packs = batching.plan_packs(rows, first_loss, 10 + 3 * 5)  # room for 3 of the 4
    self.assertLen(packs, 3)  # the fewest rows: the four in two rows, the stranger alone
    self.assertIn(([4], 15), packs)
    self.assertLen(batching.plan_packs(rows, first_loss, 10 + 4 * 5), 2)
    self.assertLen(batching.plan_packs(rows, first_loss, 19), 5)  # no room to share
    for members, prefix in packs:
      lengths = [len(rows[k]) for k in members]
      self.assertLessEqual(batching.packed_length(lengths, prefix), 25)
      if len(members) > 1:
        self.assertEqual(prefix, 10)
    self.assertCountEqual(sum((m for m, _ in packs), []), range(5))
    # The first loss token caps the prefix even where the rows share more.
    self.assertEqual(batching.plan_packs([rows[0], rows[0]], [4, 7], 100), [([0, 1], 4)])

  def test_bad_packing(self):
    with self.assertRaisesRegex(ValueError, "at least as long"):
      batching.PrefixPacking({64: 32})
    with self.assertRaisesRegex(ValueError, "row_granule"):
      batching.PrefixPacking({64: 64}, row_granule=0)
    with self.assertRaisesRegex(ValueError, "length bucket 48 has no packed row length"):
      batching.PrefixPacking(PACKED).length_for(48)
    with self.assertRaisesRegex(ValueError, "positions and UpdateBatch.branches"):
      core_types.UpdateBatch.padding(2, 8, packed=True)._replace(branches=None).check()
    with self.assertRaisesRegex(ValueError, r"UpdateBatch\.branches must be int32"):
      pad = core_types.UpdateBatch.padding(2, 8, packed=True)
      pad._replace(branches=pad.branches.astype(np.int64)).check()


class PackedUpdateTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.plain = _take_all(_replay(False, shared_start=True))
    cls.packed = _take_all(_replay(True, shared_start=True))

  def test_packed_batch_is_smaller(self):
    self.assertLess(self.packed.update.loss_mask.size, self.plain.update.loss_mask.size / 2)

  def test_token_logprobs_equal(self):
    graphdef, params, _ = _params()
    fn = jax.jit(steps_lib._token_logprobs, static_argnums=(0, 3))
    transform = core_types.SamplingTransform(temperature=0.7)
    u, p = self.plain.update, self.packed.update
    lp_plain = np.asarray(fn(graphdef, params, u.tokens, transform)[0])
    lp_packed = np.asarray(fn(graphdef, params, p.tokens, transform, p.positions,
                              p.branches)[0])
    pairs = _match(self.packed, self.plain)
    self.assertLen(pairs, self.plain.stats["rows"])
    for (_, _, _, _, (r, s)), (_, _, _, _, (r0, s0)), m in pairs:
      np.testing.assert_allclose(lp_packed[r, s[:m]], lp_plain[r0, s0[:m]], atol=2e-5, rtol=0)

  @parameterized.named_parameters(
      ("dr_grpo_kl", "seq_mean_token_sum_norm", 1, 0.1, False),
      ("token_mean_micro2", "token_mean", 2, 0.0, False),
      # The packed rows' loss tokens only (`UpdateBatch.loss_slots`): the last block and the
      # head at their predictor slots, the first token of a suffix scored from its prefix.
      ("dr_grpo_kl_loss_slots", "seq_mean_token_sum_norm", 1, 0.1, True),
      ("token_mean_micro2_loss_slots", "token_mean", 2, 0.0, True),
  )
  def test_loss_and_gradient_equal(self, aggregation, micro_batches, kl_beta, loss_slots):
    graphdef, params, ref = _params()
    cfg = _cfg(aggregation, micro_batches, kl_beta)
    plain = _take_all(_replay(False, shared_start=True))
    packed_replay = _replay(True, shared_start=True)
    packed_replay.prefix_packing = batching.PrefixPacking(PACKED, row_granule=micro_batches)
    packed = _take_all(packed_replay)
    self.assertEqual(packed.update.tokens.shape[0] % micro_batches, 0)
    if loss_slots:
      mask = packed.update.loss_mask
      width = int(mask.sum(1).max())
      self.assertLess(width, mask.shape[1] // 2)
      packed = dataclasses.replace(packed, update=learner.with_loss_slots(packed.update, width))
    step = learner.make_update_step(graphdef, cfg, _SGD)
    got, want = [], []
    for batch, out in ((plain, want), (packed, got)):
      state = _state(params, _SGD)
      state, metrics = step(state, batch.update, ref)
      delta = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), state.params, params)
      out.append((jax.device_get(metrics), delta))
    (m_got, d_got), (m_want, d_want) = got[0], want[0]
    for k in ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "ratio_mean", "approx_kl",
              "grad_norm"):
      np.testing.assert_allclose(m_got[k], m_want[k], rtol=2e-5, atol=1e-7, err_msg=k)
    self.assertEqual(float(m_got["loss_tokens"]), float(m_want["loss_tokens"]))
    self.assertGreater(float(m_want["grad_norm"]), 0.0)
    if kl_beta:
      self.assertGreater(float(m_want["kl"]), 0.0)
    for a, b in zip(jax.tree.leaves(d_got), jax.tree.leaves(d_want), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

  def test_unpacked_layout_in_a_packed_batch_is_exact(self):
    """An unpacked batch in the packed layout (one item per row: branch 0, positions 0..T-1)
    gives exactly the plain step's loss, KL and entropy, and its gradient to float rounding:
    the tree mask and the gather add nothing."""
    graphdef, params, ref = _params()
    cfg = _cfg()
    step = learner.make_update_step(graphdef, cfg, _SGD)
    u = self.plain.update
    layout = core_types.UpdateBatch.padding(*u.tokens.shape, packed=True)
    as_packed = u._replace(positions=layout.positions, branches=layout.branches)
    m_plain = jax.device_get(step(_state(params, _SGD), u, ref)[1])
    m_packed = jax.device_get(step(_state(params, _SGD), as_packed, ref)[1])
    for k in ("loss", "kl", "entropy"):
      self.assertEqual(float(m_plain[k]), float(m_packed[k]), k)
    # The backward pass's dots are two programs' (with XLA's own dot emitter, each orders its
    # sums by its shapes): equal up to float rounding.
    np.testing.assert_allclose(m_plain["grad_norm"], m_packed["grad_norm"], rtol=1e-6)

  @parameterized.named_parameters(("data8", (8, 1, 1), False),
                                  ("data2_fsdp2_tensor2", (2, 2, 2), False),
                                  ("data2_fsdp2_tensor2_loss_slots", (2, 2, 2), True))
  def test_sharded_packed_update_equals_one_device(self, shape, loss_slots):
    graphdef, params, ref = _params()
    cfg = _cfg()
    tx = learner.make_optimizer(dataclasses.replace(cfg.optim, eps=1e-3))
    batch = _take_all(_replay(True, shared_start=True)).update
    if loss_slots:
      batch = learner.with_loss_slots(batch, int(batch.loss_mask.sum(1).max()))
    one = learner.make_update_step(graphdef, cfg, tx)
    s1, m1 = one(_state(params, tx), batch, ref)
    mesh = parallel.make_mesh(shape)
    _, sm = learner.learner_shardings(_CONFIG, mesh, tx)
    state = jax.device_put(_state(params, tx), sm.state)
    step = learner.make_update_step(graphdef, cfg, tx, shardings=sm)
    placed = parallel.put_batch(batch, mesh)
    s2, m2 = step(state, placed, jax.device_put(ref, sm.ref_params))
    for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
      np.testing.assert_allclose(m2[k], m1[k], rtol=2e-5, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree.leaves(jax.device_get(s2.params)),
                    jax.tree.leaves(jax.device_get(s1.params)), strict=True):
      np.testing.assert_allclose(a, b, atol=2e-6, rtol=0)


if __name__ == "__main__":
  absltest.main()
