"""The replay's config sections: retroactive correction and advantages (`CorrectionSection`,
the config's `correction`) and storage (`ReplaySection`, the config's `replay`).

They live with the replay that reads them: `StagedReplay`'s keyword defaults are these
sections' defaults (one set), and `StagedReplay.from_sections` builds a replay from them.
`config/` assembles them into `TrainConfig` (and re-exports them as `config.CorrectionSection`,
`config.ReplaySection`).
"""

import dataclasses

from agentic_grpo import field_checks as checks
from agentic_grpo.core import advantages as advantages_lib
from agentic_grpo.core import correction as correction_lib
from agentic_grpo.replay import credit

WHEN_FULL = ("evict_oldest", "error")


@dataclasses.dataclass(frozen=True)
class CorrectionSection:
  """Retroactive correction and advantage options (docs/design.md §1-2).

  `baseline='previous_stage'` subtracts each member's previous-stage reward before the group
  normalisation, in provisional and target advantages alike (`core.advantages.stage_baselines`).
  With `workflow.stage_rewards=False` no stage is scored, the baseline is 0, and the run stays
  outcome-only GRPO.

  Attributes:
    enabled: apply retroactive corrections once final rewards arrive.
    target: target advantage: `outcome`, `return` or `mixed`.
    gamma: discount over stages of `return` targets, in [0, 1].
    beta: weight of the provisional (stage) advantage kept in `mixed` targets.
    scale: group normalisation: `std` or `none`.
    baseline: `none` or `previous_stage`.
    negative_weight: the weight of negative advantages, provisional and target alike
      (`core.advantages.weight_negatives`: a policy gradient tilted towards the group's
      successes), >= 0; 1 (the default) is GRPO's advantage unchanged.
    max_staleness: policy versions a correction may lag its provisional update.
    staleness_mode: beyond max_staleness: `drop` or `linear` down-weighting.
    stage_credit: when stage advantages reach the learner: `immediate` (as soon as a group
      completes the stage: Agentic GRPO) or `post_hoc` (held until the group's final rewards:
      dense stage credit without immediacy, arm 2 of DESIGN.md §7). Needs stage rewards to
      matter.
    supersede_queued: a provisional item still waiting in the replay when its group's final
      rewards arrive is withdrawn, and its segment gets its target in full in the episode's
      outcome row (`StagedReplay`'s `supersede_queued`): the learner computes that context
      once, not twice (with `rl.final_reward_lag=0` the last stage's provisional row and the
      correction row are the same tokens). Each segment's provisional plus correction
      advantage is its target either way. Only with `enabled`, stage rewards and `immediate`
      stage credit; False (the default) keeps every provisional update.
  """
  enabled: bool = True
  target: str = "outcome"
  gamma: float = 1.0
  beta: float = 0.0
  scale: str = "std"
  baseline: str = "none"
  negative_weight: float = 1.0
  max_staleness: int = 8
  staleness_mode: str = "drop"
  stage_credit: str = "immediate"
  supersede_queued: bool = False

  def validate(self, path: str) -> None:
    checks.choice(f"{path}.target", self.target, advantages_lib.TARGET_MODES)
    checks.check(0.0 <= self.gamma <= 1.0, f"{path}.gamma", "must be in [0, 1]", self.gamma)
    checks.choice(f"{path}.scale", self.scale, advantages_lib.SCALES)
    checks.choice(f"{path}.baseline", self.baseline, advantages_lib.BASELINES)
    checks.check(0.0 <= self.negative_weight < float("inf"), f"{path}.negative_weight",
                 "must be finite and >= 0", self.negative_weight)
    checks.check(self.max_staleness >= 0, f"{path}.max_staleness", "must be >= 0",
                 self.max_staleness)
    checks.choice(f"{path}.staleness_mode", self.staleness_mode, correction_lib.STALENESS_MODES)
    checks.choice(f"{path}.stage_credit", self.stage_credit, credit.STAGE_CREDIT)


@dataclasses.dataclass(frozen=True)
class ReplaySection:
  """`replay.StagedReplay` storage options.

  Attributes:
    capacity: segments the replay holds.
    when_full: `evict_oldest` or `error`.
    skip_zero_advantage: drop rows whose advantage is 0 (no gradient).
    pack_corrections: pack an episode's correction segments into one row when they chain and
      that leaves the loss unchanged (`core.losses.segments_additive`: the token ratio, and an
      aggregation other than `seq_mean_token_mean`); otherwise every segment keeps its own row.
  """
  capacity: int = 8192
  when_full: str = "evict_oldest"
  skip_zero_advantage: bool = True
  pack_corrections: bool = True

  def validate(self, path: str) -> None:
    checks.check(self.capacity >= 1, f"{path}.capacity", "must be >= 1", self.capacity)
    checks.choice(f"{path}.when_full", self.when_full, WHEN_FULL)
