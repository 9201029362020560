"""The baseline: outcome-only GRPO on the same tasks, model and budget as `tiny_codegen`.

Stage rewards and retroactive corrections are off, so each episode is updated once, after its
final reward, with the group-normalised outcome advantage (Shao et al., 2024).
"""

import ml_collections

from experiments import tiny_codegen


def get_config() -> ml_collections.ConfigDict:
  """`tiny_codegen` with stage rewards and corrections switched off."""
  c = tiny_codegen.get_config()
  c.workflow.stage_rewards = False
  c.correction.enabled = False
  return c
