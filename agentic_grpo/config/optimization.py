"""The config section of the supervised warm-start (the RL phase's optimizer, `OptimSection`,
lives with the learner: `learner/sections.py`)."""

import dataclasses

from agentic_grpo import field_checks as checks


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
