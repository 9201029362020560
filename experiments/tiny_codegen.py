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

  # Single-primitive synthetic tasks: short prompts, learnable in minutes. Held-out tasks are
  # new tasks (program with new examples and hidden tests): with one primitive per program, a
  # program-disjoint split would hold out primitives the model never sees.
  c.task.source = "synthetic"
  c.task.depths = (1,)
  c.task.split_by = "task"
  c.task.eval_size = 64

  # hypothesis -> code -> tests -> debug, each stage rewarded when it completes. Episodes are
  # about 120-190 byte tokens; 48 new tokens per stage bound a rambling policy.
  c.workflow.stages = ("hypothesis", "code", "tests", "debug")
  c.workflow.stage_rewards = True
  c.workflow.max_new_tokens = 48

  # Supervised warm-start on reference episodes.
  c.warmstart.steps = 200
  c.warmstart.batch_size = 32
  c.warmstart.learning_rate = 2e-3
  c.warmstart.seq_len = 192

  # Agentic GRPO: 8 tasks x 8 attempts per episode batch, two batches in flight.
  c.rl.num_steps = 60
  c.rl.tasks_per_batch = 8
  c.rl.group_size = 8
  c.rl.batches_in_flight = 2
  c.rl.rows_per_update = 32
  c.rl.buckets = (128, 256)
  c.optim.learning_rate = 2e-4
  c.optim.warmup_steps = 5

  c.correction.enabled = True
  c.correction.target = "outcome"
  c.correction.max_staleness = 8

  c.eval.every = 20
  c.eval.num_samples = 4
  c.eval.k = (1, 4)
  c.checkpoint.every = 50
  return c
