r"""Agentic GRPO for Qwen2.5-Coder-1.5B-Instruct on competitive programming, one accelerator host.

The model writes a complete program in a chat turn (`code`), sees how it fares on the
statement's sample tests and answers with a revision or keeps it (`debug`); programs are judged
on stdin/stdout (`task.source='stdio'`: a JSONL of CodeContests-layout problems; APPS, TACO and
LiveCodeBench rows are read as well, see `tasks/stdio_problems.py`). Sample tests feed the stage
rewards, hidden tests only the final reward. No warm-start: the pretrained model already writes
well-formed turns, and its weights are the frozen reference policy of the KL term.

One host: a TPU v5p-8 (4 chips, 95 GiB each) or 8 GPUs of 80 GiB; every local device is one
FSDP shard (`mesh.fsdp=-1`).

  # The checkpoint (or give --config.model.path=hf://Qwen/Qwen2.5-Coder-1.5B-Instruct, which
  # downloads it at start-up):
  huggingface-cli download Qwen/Qwen2.5-Coder-1.5B-Instruct --local-dir ~/models/qwen2.5-coder-1.5b
  # Memory per device before the run (a planning number):
  python -m launch.plan --hf_config=~/models/qwen2.5-coder-1.5b --mesh=1,4,1 --learner_rows=64 \
      --micro_batches=16 --seq_len=4096 --sample_rows=128 --cache_len=5632 --hbm_gib=95
  python -m launch.train --config=experiments/qwen2_5_coder_1_5b_stdio.py \
      --config.model.path=$HOME/models/qwen2.5-coder-1.5b \
      --config.task.path=$HOME/data/code_contests_train.jsonl --workdir=/tmp/qwen15_stdio
  # Held-out pass@k of the model as loaded (the baseline), then of a checkpoint:
  python -m launch.evaluate --config=experiments/qwen2_5_coder_1_5b_stdio.py \
      --config.model.path=$HOME/models/qwen2.5-coder-1.5b \
      --config.task.path=$HOME/data/code_contests_train.jsonl --workdir=/tmp/qwen15_base
  python -m launch.evaluate --workdir=/tmp/qwen15_stdio --step=200
"""

import ml_collections

from agentic_grpo import config as config_lib

# Hardware the shapes below are sized for (`launch/plan.py`; `tests/config_test.py` checks the
# fit): devices of one host and memory per device.
NUM_DEVICES = 4
HBM_GIB = 95.0
# The shape of the model to plan with: `models.transformer` preset of the same shape as the
# checkpoint (Qwen2.5-Coder-1.5B is shaped as Qwen2-1.5B).
PLAN_PRESET = "qwen2_1_5b"


def get_config() -> ml_collections.ConfigDict:
  """Qwen2.5-Coder-1.5B-Instruct, `chat` turns, stdio problems, Agentic GRPO."""
  c = ml_collections.ConfigDict(config_lib.to_dict(config_lib.TrainConfig()))
  c.seed = 0

  c.model.source = "hf"
  c.model.path = "hf://Qwen/Qwen2.5-Coder-1.5B-Instruct"  # or a local / gs:// directory
  c.model.param_dtype = "bfloat16"  # with a float32 master copy in the optimizer

  c.task.source = "stdio"
  c.task.path = "code_contests_train.jsonl"  # set --config.task.path
  c.task.stdio_layout = "codecontests"  # `auto` detects the layout per row
  c.task.heldout_fraction = 0.05
  c.task.eval_size = 200  # one standard error of pass@1 <= 0.035

  # code -> one debug round, as chat turns; a program counts only if it passes every test.
  c.workflow.prompt_format = "chat"
  c.workflow.stages = ("code", "debug")
  c.workflow.max_debug_rounds = 1
  c.workflow.reward_mode = "all_pass"
  c.workflow.max_new_tokens = 1536  # a competitive-programming solution, with some prose
  c.workflow.max_obs_chars = 1200

  # Statements run to ~1k tokens; the debug turn's context holds the first program and its
  # verdicts.
  c.sandbox.update(workers=16, timeout_s=6.0, cpu_s=4.0, memory_mb=1024)

  c.warmstart.steps = 0

  # 16 problems x 8 attempts per episode batch (the GRPO group), two batches in flight.
  c.rl.num_steps = 400
  c.rl.tasks_per_batch = 16
  c.rl.group_size = 8
  c.rl.batches_in_flight = 2
  c.rl.rows_per_update = 64
  c.rl.micro_batches = 16  # one 4096-token row per device and micro-batch on 4 devices
  c.rl.buckets = (2048, 4096)
  c.rl.temperature = 1.0
  c.rl.max_idle_batches = 20
  # Continuous batching (`models.continuous`): programs of a few hundred to 1,536 tokens with a
  # long tail; a finished row's slot takes the next request instead of idling until the
  # longest row stops (on a long-tailed CPU workload 2.9x the static sampler's useful tokens/s
  # and 4.5x `transformers` `generate`, docs/benchmarks.md). Reused prefixes need one device.
  c.rl.sampler = "continuous"

  c.loss.aggregation = "seq_mean_token_sum_norm"  # provisional + correction add up
  c.loss.max_tokens = 1536  # = workflow.max_new_tokens
  c.loss.kl_beta = 1e-3
  c.loss.kl_estimator = "k3"
  c.optim.learning_rate = 1e-6
  c.optim.warmup_steps = 10
  c.optim.weight_decay = 0.0
  c.optim.grad_clip = 1.0

  c.correction.enabled = True
  c.correction.target = "outcome"
  c.correction.baseline = "previous_stage"  # the debug turn is credited with what it fixed
  c.correction.max_staleness = 4

  c.eval.every = 50
  c.eval.num_samples = 8
  c.eval.k = (1, 4, 8)
  c.eval.temperature = 0.7
  c.checkpoint.every = 25
  c.checkpoint.max_to_keep = 3

  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  return c
