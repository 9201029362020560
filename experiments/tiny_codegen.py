"""The embedded default: Agentic GRPO on synthetic coding tasks, a byte-level model, 2 CPU cores.

`make train` runs this config. Budgeted to finish in well under 15 minutes on two CPU cores
(supervised warm-start on reference episodes, then Agentic GRPO with stage rewards and
retroactive corrections) and to show held-out hidden-test pass@1 rising above the warm-start.
Every field of `agentic_grpo.config.TrainConfig` is present, so any can be overridden from the
command line, e.g. `--config.rl.group_size=8`.
"""

import ml_collections

from agentic_grpo import config as config_lib


def get_config() -> ml_collections.ConfigDict:
  """The default Agentic GRPO run."""
  c = ml_collections.ConfigDict(config_lib.to_dict(config_lib.TrainConfig()))
  c.seed = 0

  # A ~0.8M-parameter byte-level Llama-style model (the `tiny` preset).
  c.model.preset = "tiny"

  # Single-primitive synthetic tasks: short prompts, learnable in minutes.
  c.task.source = "synthetic"
  c.task.depths = (1,)
  c.task.eval_size = 64

  # hypothesis -> code -> tests -> debug, each stage rewarded when it completes.
  c.workflow.stages = ("hypothesis", "code", "tests", "debug")
  c.workflow.stage_rewards = True

  c.rl.num_steps = 60
  c.rl.tasks_per_batch = 8
  c.rl.group_size = 8
  c.rl.batches_in_flight = 2
  c.rl.rows_per_update = 64
  c.rl.buckets = (128, 256)

  c.correction.enabled = True
  c.correction.target = "outcome"
  c.correction.max_staleness = 8

  c.warmstart.steps = 200
  c.eval.every = 20
  c.checkpoint.every = 20
  return c
