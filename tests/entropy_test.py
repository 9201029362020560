"""The update step's policy entropy (`loss/entropy`) and the entropy bonus (`loss.entropy_coef`).

The metric is checked against a NumPy computation from the model's logits on a small batch
(the sampling distribution at the RL temperature, at the position that scored each loss
token); a positive coefficient moves the parameters towards higher entropy.
"""

import dataclasses

from absl.testing import absltest
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo.core import types as core_types
from agentic_grpo.models import presets
from agentic_grpo.models import transformer

N, T = 4, 12
TEMPERATURE = 0.7


def _model_config():
  return presets.get_model_config("tiny", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                  head_dim=16, mlp_dim=64, max_seq_len=64)


def _cfg(entropy_coef=0.0, aggregation="token_mean"):
  cfg = config_lib.TrainConfig()
  return dataclasses.replace(
      cfg, rl=dataclasses.replace(cfg.rl, rows_per_update=N, temperature=TEMPERATURE),
      loss=dataclasses.replace(cfg.loss, aggregation=aggregation, max_tokens=T,
                               entropy_coef=entropy_coef),
      optim=dataclasses.replace(cfg.optim, learning_rate=1e-3, warmup_steps=0))


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = rng.random((N, T)) < 0.6
  mask[:, 0] = False
  mask[-1] = False  # a padding row
  return core_types.UpdateBatch(
      tokens=rng.integers(0, 256, (N, T)).astype(np.int32), loss_mask=mask,
      behaviour_logprobs=np.zeros((N, T), np.float32),
      # No policy-gradient signal: only the entropy bonus moves the parameters.
      advantages=np.zeros((N, T), np.float32),
      sample_weights=np.array([1, 1, 1, 0], np.float32))


def _numpy_entropy(params, graphdef, batch, aggregation="token_mean"):
  """Mean entropy (nats) of softmax(logits / T) at the positions that scored the loss tokens."""
  positions = np.broadcast_to(np.arange(T, dtype=np.int32), (N, T))
  logits, _ = transformer.apply(graphdef, params, batch.tokens, positions)
  z = np.asarray(logits, np.float64)[:, :-1] / TEMPERATURE
  z = z - z.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  h = -(np.exp(logp) * logp).sum(-1)  # [N, T - 1]: h[:, t - 1] is token t's distribution
  mask = batch.loss_mask[:, 1:]
  if aggregation == "token_mean":
    return float(h[mask].mean())
  # seq_mean_token_sum_norm: sum over loss tokens / (rows * max_tokens)
  return float(h[mask].sum() / (N * T))


class EntropyTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graphdef, _ = transformer.init_model(_model_config(), 0)
    cls.sh = learner.Shardings.replicated()

  def _run(self, cfg, batch, seed=0):
    opt = learner.make_optimizer(cfg.optim)
    step = learner.make_update_step(self.graphdef, cfg, opt, shardings=self.sh)
    params = transformer.init_model(_model_config(), seed)[1]
    state = jax.device_put(learner.init_state(params, opt, 0), self.sh.state)
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = step(state, batch, state.params)
    return before, jax.tree.map(np.asarray, state.params), jax.device_get(metrics)

  def test_metric_equals_numpy(self):
    batch = _batch()
    for aggregation in ("token_mean", "seq_mean_token_sum_norm"):
      before, _, metrics = self._run(_cfg(aggregation=aggregation), batch)
      want = _numpy_entropy(before, self.graphdef, batch, aggregation)
      np.testing.assert_allclose(metrics["entropy"], want, rtol=1e-4, err_msg=aggregation)
    # The entropy of the next position's distribution (what an unshifted mask would read) is
    # another number: the check above can fail.
    shifted = batch._replace(loss_mask=np.roll(batch.loss_mask, -1, axis=1))
    self.assertNotAlmostEqual(_numpy_entropy(before, self.graphdef, shifted),
                              _numpy_entropy(before, self.graphdef, batch), places=4)

  def test_positive_coef_raises_entropy(self):
    batch = _batch(1)
    before, after_off, _ = self._run(_cfg(0.0), batch)
    # Without the bonus and without advantages there is no gradient: nothing moves.
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after_off), strict=True):
      np.testing.assert_array_equal(a, b)
    _, after_on, metrics = self._run(_cfg(0.5), batch)
    self.assertGreater(float(metrics["grad_norm"]), 0.0)
    h0 = _numpy_entropy(before, self.graphdef, batch)
    h1 = _numpy_entropy(after_on, self.graphdef, batch)
    self.assertAlmostEqual(float(metrics["entropy"]), h0, places=4)
    self.assertGreater(h1, h0)
    # The loss is the negated bonus: coef times the entropy, subtracted.
    np.testing.assert_allclose(metrics["loss"], -0.5 * h0, rtol=1e-4)

  def test_coef_is_validated(self):
    for bad in (-0.1, float("nan"), float("inf")):
      with self.assertRaisesRegex(ValueError, r"config\.loss\.entropy_coef must be a finite"):
        config_lib.from_config_dict({"loss": {"entropy_coef": bad}})
    self.assertEqual(config_lib.TrainConfig().loss.entropy_coef, 0.0)  # off by default


if __name__ == "__main__":
  absltest.main()
