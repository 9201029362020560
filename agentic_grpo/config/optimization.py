"""Config sections of the optimizers: the RL phase's AdamW and the supervised warm-start."""

import dataclasses

from agentic_grpo.config import checks


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


@dataclasses.dataclass(frozen=True)
class WarmstartSection:
  """Supervised warm-start on reference episodes (0 steps skips it).

  The learning rate warms up linearly over `warmup_steps`, then follows a cosine decay to
  `final_lr_fraction` of its peak at `steps`.

  Attributes:
    steps: supervised warm-start steps (0 = skip).
    batch_size: reference episodes per step.
    learning_rate: peak learning rate.
    warmup_steps: linear warm-up steps.
    final_lr_fraction: final learning rate as a fraction of the peak, in [0, 1].
    seq_len: tokens per reference episode (longer ones are cut; <= the largest rl bucket).
  """
  steps: int = 200
  batch_size: int = 32
  learning_rate: float = 1e-3
  warmup_steps: int = 20
  final_lr_fraction: float = 0.1
  seq_len: int = 256

  def validate(self, path: str) -> None:
    checks.check(self.steps >= 0, f"{path}.steps", "must be >= 0", self.steps)
    checks.check(self.batch_size >= 1, f"{path}.batch_size", "must be >= 1", self.batch_size)
    checks.check(self.learning_rate > 0, f"{path}.learning_rate", "must be > 0", self.learning_rate)
    checks.check(self.warmup_steps >= 0, f"{path}.warmup_steps", "must be >= 0", self.warmup_steps)
    checks.check(0.0 <= self.final_lr_fraction <= 1.0, f"{path}.final_lr_fraction",
                 "must be in [0, 1]", self.final_lr_fraction)
    checks.check(self.seq_len >= 8, f"{path}.seq_len", "must be >= 8", self.seq_len)
