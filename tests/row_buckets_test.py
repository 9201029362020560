"""Row buckets of update batches: `replay.batching.row_buckets`, the agreed row count
(`train.coordination`), and the update step's invariance to padding rows and its trace count
(`learner.make_update_step`)."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo.core import types as core_types
from agentic_grpo.models import presets
from agentic_grpo.models import transformer
from agentic_grpo.replay import batching
from agentic_grpo.train import coordination

ROWS, T = 8, 16


def _model_config():
  return presets.get_model_config("tiny", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                  head_dim=16, mlp_dim=64, max_seq_len=64)


def _cfg(aggregation, micro_batches):
  cfg = config_lib.TrainConfig()
  return dataclasses.replace(
      cfg, rl=dataclasses.replace(cfg.rl, micro_batches=micro_batches, rows_per_update=ROWS),
      loss=dataclasses.replace(cfg.loss, aggregation=aggregation, kl_beta=0.0,
                               max_tokens=T if aggregation == "seq_mean_token_sum_norm" else 0))


def _rows(n, seed=0):
  """`n` rows with loss tokens (no padding row)."""
  rng = np.random.default_rng(seed)
  mask = rng.random((n, T)) < 0.6
  mask[:, 0] = False
  mask[:, 1] = True
  return core_types.UpdateBatch(
      tokens=rng.integers(0, 256, (n, T)).astype(np.int32), loss_mask=mask,
      behaviour_logprobs=np.where(mask, -5.0 + 0.1 * rng.normal(size=(n, T)), 0.0
                                  ).astype(np.float32),
      advantages=np.where(mask, rng.normal(size=(n, T)), 0.0).astype(np.float32),
      sample_weights=np.ones((n,), np.float32))


def _padded(batch, rows):
  if rows == batch.tokens.shape[0]:
    return batch
  pad = core_types.UpdateBatch.padding(rows - batch.tokens.shape[0], T)
  return jax.tree.map(lambda a, b: np.concatenate([a, b]), batch, pad)


class RowBucketsTest(parameterized.TestCase):

  def test_row_buckets(self):
    self.assertEqual(batching.row_buckets(64), (1, 2, 4, 8, 16, 32, 64))
    self.assertEqual(batching.row_buckets(48, 4), (4, 8, 16, 32, 48))
    self.assertEqual(batching.row_buckets(1), (1,))
    self.assertEqual(batching.row_bucket(5, 64), 8)
    self.assertEqual(batching.row_bucket(33, 64), 64)
    self.assertEqual(batching.row_bucket(1, 48, 4), 4)
    # A flush of 1-8 rows is under half padding rows.
    for n in range(1, 65):
      self.assertLess(1 - n / batching.row_bucket(n, 64), 0.5)
    with self.assertRaisesRegex(ValueError, "rows must be in"):
      batching.row_bucket(0, 64)
    with self.assertRaisesRegex(ValueError, "multiple of granule"):
      batching.row_buckets(6, 4)

  def test_agreed_rows_are_the_ready_rows_of_the_bucket(self):
    coord = coordination.LocalCoordinator()
    # 5 ready: 3 fit 128 tokens, all 5 fit 256; the oldest needs 256.
    agreed = coord.agree(ready=5, rows=64, want_bucket=256, fits=[3, 5], buckets=(128, 256),
                         sampling=True, idle_batches=0, stop=False)
    self.assertTrue(agreed.update)
    self.assertEqual((agreed.buckets, agreed.rows), ((256,), 5))
    agreed = coord.agree(ready=70, rows=64, want_bucket=128, fits=[70, 70], buckets=(128, 256),
                         sampling=False, idle_batches=0, stop=False)
    self.assertEqual((agreed.buckets, agreed.rows), ((128,), 64))
    agreed = coord.agree(ready=3, rows=64, want_bucket=128, fits=[3, 3], buckets=(128, 256),
                         sampling=False, idle_batches=0, stop=False)
    self.assertFalse(agreed.update)
    self.assertEqual(agreed.rows, 0)
    with self.assertRaisesRegex(ValueError, "fits"):
      coord.agree(ready=3, rows=64, want_bucket=128, fits=[3], buckets=(128, 256),
                  sampling=True, idle_batches=0, stop=False)

  def test_dynamic_sampling_agrees_only_on_full_updates(self):
    coord = coordination.LocalCoordinator()
    kw = dict(rows=4, buckets=(128, 256), idle_batches=0, stop=False)
    agree = lambda ready, want, fits, **more: coord.agree(
        ready=ready, want_bucket=want, fits=fits, **{**kw, **more})
    # Too few rows: no partial update, not even before a sample phase.
    agreed = agree(3, 128, [3, 3], sampling=True, full_only=True)
    self.assertEqual((agreed.update, agreed.buckets, agreed.rows), (False, (), 0))
    # The oldest rows' bucket holds too few: the full update goes into a larger one.
    agreed = agree(5, 128, [2, 5], sampling=False, full_only=True)
    self.assertEqual((agreed.update, agreed.buckets, agreed.rows), (True, (256,), 4))
    agreed = agree(5, 128, [5, 5], sampling=False, full_only=True)
    self.assertEqual((agreed.buckets, agreed.rows), ((128,), 4))
    agreed = agree(5, 256, [4, 5], sampling=True, full_only=True)  # never below the oldest's
    self.assertEqual((agreed.buckets, agreed.rows), ((256,), 4))
    # Without waiting (the option off, or its cap reached): the flush before sampling.
    agreed = agree(3, 128, [3, 3], sampling=True, full_only=False)
    self.assertEqual((agreed.update, agreed.buckets, agreed.rows), (True, (128,), 3))
    self.assertEqual(agree(3, 128, [3, 3], sampling=True), agreed)

  def test_dynamic_sampling_agreement_across_processes(self):
    class TwoProcesses(coordination.LocalCoordinator):
      process_count = 2
      other = None

      def _gather_ints(self, values):
        return np.array([values, self.other], np.int64)

    coord = TwoProcesses()
    kw = dict(rows=4, buckets=(128, 256), sampling=True, idle_batches=0, stop=False)
    # This process has a full share, the other not: both wait.
    coord.other = [2, 128, 0, 0, 1, 2, 2]  # ready, want, idle, stop, full_only, *fits
    agreed = coord.agree(ready=6, want_bucket=128, fits=[6, 6], full_only=True, **kw)
    self.assertFalse(agreed.update)
    # The other reached its cap: the flush of the rows there are.
    coord.other = [2, 128, 0, 0, 0, 2, 2]
    agreed = coord.agree(ready=6, want_bucket=128, fits=[6, 6], full_only=True, **kw)
    self.assertEqual((agreed.update, agreed.buckets, agreed.rows), (True, (128,), 4))
    # Both full, but only in the larger bucket for the other.
    coord.other = [5, 128, 0, 0, 1, 1, 5]
    agreed = coord.agree(ready=6, want_bucket=128, fits=[6, 6], full_only=True, **kw)
    self.assertEqual((agreed.update, agreed.buckets, agreed.rows), (True, (256,), 4))

  @parameterized.product(
      aggregation=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"),
      micro_batches=(1, 2))
  def test_padding_rows_change_nothing(self, aggregation, micro_batches):
    """The same rows alone (4) and padded to the full update (8): same loss, same gradient."""
    graphdef, params = transformer.init_model(_model_config(), 0)
    cfg = _cfg(aggregation, micro_batches)
    opt = learner.make_optimizer(cfg.optim)
    step = learner.make_update_step(graphdef, cfg, opt)
    rows = _rows(4)
    out = []
    for batch in (rows, _padded(rows, ROWS)):
      state = learner.init_state(jax.tree.map(np.array, params), opt, 0)
      out.append(step(state, batch, None))
    (s_small, m_small), (s_full, m_full) = out
    for k in ("loss", "pg_loss", "grad_norm", "entropy", "loss_tokens"):
      np.testing.assert_allclose(m_small[k], m_full[k], rtol=1e-5, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree.leaves(s_small.params), jax.tree.leaves(s_full.params), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    self.assertEqual(step.num_traces, 2)  # one per row count

  def test_trace_count_is_bounded_by_the_row_buckets(self):
    graphdef, params = transformer.init_model(_model_config(), 1)
    cfg = _cfg("token_mean", 2)
    opt = learner.make_optimizer(cfg.optim)
    step = learner.make_update_step(graphdef, cfg, opt)
    # Placed as the run places it (an unplaced fresh state traces once more).
    state = jax.device_put(learner.init_state(params, opt, 0),
                           learner.Shardings.replicated().state)
    granule = 2
    before = step.num_traces  # the step is cached: other tests may have traced it
    for _ in range(2):
      for n in (1, 2, 3, 5, 8, 7, 2, 4, 6, 1):
        bucket = batching.row_bucket(n, ROWS, granule)
        state, _ = step(state, _padded(_rows(n, seed=n), bucket), None)
        jax.block_until_ready(state.params)
    # At most one trace per row bucket (2, 4 and 8 rows), however many updates.
    self.assertLessEqual(step.num_traces - before, len(batching.row_buckets(ROWS, granule)))
    self.assertLen(batching.row_buckets(ROWS, granule), 3)


if __name__ == "__main__":
  absltest.main()
