r"""Agentic GRPO for Qwen3-8B on competitive programming, on a v5p-64-like slice (32 chips).

`qwen2_5_coder_1_5b_stdio` scaled up: the same stdio problems and chat turns (code, one debug
round), a 8B model over 32 chips as (data, fsdp, tensor) = (1, 8, 4): parameters, gradients
and optimizer state sharded 32 ways, attention heads split 4 ways so that the materialised
attention of a 4096-token row fits. One process per host (8 hosts of 4 chips); the workdir must
be storage every host sees.

  # Memory per chip before paying for the slice (prints "fits" against 95 GiB):
  python -m launch.plan --model=qwen3_8b --mesh=1,8,4 --learner_rows=64 --micro_batches=8 \
      --seq_len=4096 --sample_rows=256 --cache_len=5632 --hbm_gib=95
  # The run (launch/tpu_pod.sh creates the slice, installs, and starts every host):
  launch/tpu_pod.sh --name=grpo-qwen3 --zone=us-east5-a --accelerator=v5p-64 -- \
      --config=experiments/qwen3_8b_pod.py --config.model.path=gs://BUCKET/models/qwen3-8b \
      --config.task.path=gs://BUCKET/data/code_contests_train.jsonl --workdir=gs://BUCKET/qwen3_8b
  # Evaluate a checkpoint on the slice (every host runs it):
  #   python -m launch.evaluate --workdir=gs://BUCKET/qwen3_8b --step=200

Qwen3's chat template drops earlier `<think>` blocks when it renders a conversation: the run
detects at start-up that a re-rendered conversation is not a prefix of what was sampled and
renders only each new turn's suffix (`agent/chat_format.py`).
"""

import ml_collections

from experiments import qwen2_5_coder_1_5b_stdio

# The slice the shapes below are sized for (`launch/plan.py`; `tests/config_test.py` checks the
# fit): chips and memory per chip.
NUM_DEVICES = 32
HBM_GIB = 95.0
# The shape of the model to plan with: `models.transformer` preset of the published checkpoint.
PLAN_PRESET = "qwen3_8b"


def get_config() -> ml_collections.ConfigDict:
  """Qwen3-8B, 32 chips as (1, 8, 4), stdio problems, Agentic GRPO."""
  c = qwen2_5_coder_1_5b_stdio.get_config()
  c.model.path = "hf://Qwen/Qwen3-8B"  # better: a gs:// copy every host reads
  c.sandbox.workers = 32  # per host

  # 32 problems x 8 attempts per episode batch: 256 rows per sampler call, 32 per host.
  c.rl.tasks_per_batch = 32
  c.rl.group_size = 8
  c.rl.rows_per_update = 64
  c.rl.micro_batches = 8  # 8 rows per micro-batch: one per (data x fsdp) shard
  c.rl.num_steps = 300
  c.optim.learning_rate = 1e-6

  c.mesh.data = 1
  c.mesh.fsdp = 8
  c.mesh.tensor = 4
  c.mesh.collective_timeout_s = 1800.0  # compiling an 8B model's steps takes minutes
  return c
