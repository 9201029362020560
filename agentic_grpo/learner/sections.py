"""The learner's config sections: the policy loss (`LossSection`, the config's `loss`) and the
RL phase's optimizer (`OptimSection`, the config's `optim`).

They live with the learner that reads them, so the learner imports no `config/`; `config/`
assembles them into `TrainConfig` (and re-exports them as `config.LossSection`,
`config.OptimSection`).
"""

import dataclasses
import math

from agentic_grpo import field_checks as checks
from agentic_grpo.core import losses as losses_lib


@dataclasses.dataclass(frozen=True)
class LossSection:
  """`core.losses` options (docs/design.md §2).

  With stage rewards and corrections, use `aggregation='seq_mean_token_sum_norm'` (Dr. GRPO's
  constant normaliser `rows · max_tokens`): a segment's provisional update and its correction
  are applied in different batches, and only a normaliser that ignores a batch's contents makes
  them add up to the target's update (`tests/losses_test.py`, cross-batch identity).

  `dual_clip` > 1 bounds the loss of negative-advantage tokens at `dual_clip · |A|` (dual-clip
  PPO, Ye et al., 2020); 0 disables it.

  Attributes:
    eps_low: lower PPO clip range, in [0, 1).
    eps_high: upper PPO clip range (DAPO's clip-higher).
    ratio_level: importance ratio per `token` or per `sequence`.
    aggregation: `token_mean`, `seq_mean_token_mean` or `seq_mean_token_sum_norm`.
    max_tokens: the constant normaliser of `seq_mean_token_sum_norm` (> 0 with it).
    kl_beta: weight of the KL penalty to the warm-start policy (0 = off).
    kl_estimator: KL estimator: `k1`, `k2` or `k3`.
    entropy_coef: entropy bonus weight (>= 0; 0 = off): the loss subtracts entropy_coef
      times the policy's token entropy at the RL temperature, aggregated like the policy loss
      (Mnih et al., 2016; Schulman et al., 2017, PPO). Logged as loss/entropy either way.
    dual_clip: dual-clip bound on negative-advantage token losses (0 = off, else > 1).
  """
  eps_low: float = 0.2
  eps_high: float = 0.28
  ratio_level: str = "token"
  aggregation: str = "token_mean"
  max_tokens: int = 0
  kl_beta: float = 0.0
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0
  dual_clip: float = 0.0

  def validate(self, path: str) -> None:
    checks.check(self.dual_clip == 0.0 or self.dual_clip > 1.0, f"{path}.dual_clip",
                 "must be 0 (off) or > 1", self.dual_clip)
    checks.check(0.0 <= self.eps_low < 1.0, f"{path}.eps_low", "must be in [0, 1)", self.eps_low)
    checks.check(self.eps_high >= 0.0, f"{path}.eps_high", "must be >= 0", self.eps_high)
    checks.choice(f"{path}.ratio_level", self.ratio_level, losses_lib.RATIO_LEVELS)
    checks.choice(f"{path}.aggregation", self.aggregation, losses_lib.AGGREGATIONS)
    if self.aggregation == "seq_mean_token_sum_norm":
      checks.check(self.max_tokens > 0, f"{path}.max_tokens",
                   "must be > 0 with aggregation seq_mean_token_sum_norm", self.max_tokens)
    checks.check(self.kl_beta >= 0.0, f"{path}.kl_beta", "must be >= 0", self.kl_beta)
    checks.choice(f"{path}.kl_estimator", self.kl_estimator, losses_lib.KL_ESTIMATORS)
    checks.check(math.isfinite(self.entropy_coef) and self.entropy_coef >= 0.0,
                 f"{path}.entropy_coef", "must be a finite number >= 0 (0 = off)",
                 self.entropy_coef)


@dataclasses.dataclass(frozen=True)
class OptimSection:
  """AdamW with linear warm-up, global-norm clipping and a non-finite guard (the RL phase).

  `schedule="constant"` keeps `learning_rate` after the warm-up; `"cosine"` decays it to
  `final_lr_fraction` of its peak at the last RL update (`rl.num_steps`; Loshchilov & Hutter,
  2017).

  Attributes:
    learning_rate: peak learning rate of the RL phase.
    warmup_steps: linear warm-up updates.
    schedule: after the warm-up: `constant` or `cosine`.
    final_lr_fraction: cosine: final learning rate as a fraction of the peak, in [0, 1].
    weight_decay: AdamW weight decay.
    b1: Adam first-moment decay, in [0, 1).
    b2: Adam second-moment decay, in [0, 1).
    eps: Adam epsilon (> 0).
    grad_clip: global gradient-norm clip (0 = off).
    max_consecutive_nonfinite: non-finite updates skipped in a row before one is applied
      (`optax.apply_if_finite`).
  """
  learning_rate: float = 3e-4
  warmup_steps: int = 0
  schedule: str = "constant"
  final_lr_fraction: float = 0.0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.99
  eps: float = 1e-8
  grad_clip: float = 1.0
  max_consecutive_nonfinite: int = 1000

  def validate(self, path: str) -> None:
    checks.check(self.learning_rate > 0, f"{path}.learning_rate", "must be > 0", self.learning_rate)
    checks.check(self.warmup_steps >= 0, f"{path}.warmup_steps", "must be >= 0", self.warmup_steps)
    checks.check(self.schedule in ("constant", "cosine"), f"{path}.schedule",
                 "must be 'constant' or 'cosine'", self.schedule)
    checks.check(0.0 <= self.final_lr_fraction <= 1.0, f"{path}.final_lr_fraction",
                 "must be in [0, 1]", self.final_lr_fraction)
    checks.check(self.weight_decay >= 0, f"{path}.weight_decay", "must be >= 0", self.weight_decay)
    checks.check(0.0 <= self.b1 < 1.0, f"{path}.b1", "must be in [0, 1)", self.b1)
    checks.check(0.0 <= self.b2 < 1.0, f"{path}.b2", "must be in [0, 1)", self.b2)
    checks.check(self.eps > 0, f"{path}.eps", "must be > 0", self.eps)
    checks.check(self.grad_clip >= 0, f"{path}.grad_clip", "must be >= 0 (0 disables)",
                 self.grad_clip)
    checks.check(self.max_consecutive_nonfinite >= 0, f"{path}.max_consecutive_nonfinite",
                 "must be >= 0", self.max_consecutive_nonfinite)
