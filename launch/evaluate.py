r"""Scores a run's checkpoint, or a model as loaded, on the held-out split, without training.

  python -m launch.evaluate --workdir=/tmp/run1 [--step=200]
  python -m launch.evaluate --workdir=/tmp/run1 --num_samples=16 --k=1,4,16 --temperature=0.8
  python -m launch.evaluate --workdir=/tmp/qwen_base \
      --config=experiments/qwen2_5_coder_1_5b_stdio.py --config.task.path=problems.jsonl

Without `--config`: the run in `--workdir` is evaluated at checkpoint `--step` (the newest
intact one by default) with its saved `config.json`. With `--config` (or any
`--config.<field>=...` override of the default config file): the model that config loads
(`--config.model.source=hf --config.model.path=DIR`: a Hugging Face checkpoint) is evaluated as
it is, into a workdir that holds no checkpoint.

Greedy pass@1 with its standard error, the hidden-test fraction, stage rewards and sampled
pass@k (the unbiased estimator, `--num_samples` samples per held-out task at `--temperature`)
on `--eval_size` held-out tasks; each flag overrides the config's `eval` / `task.eval_size`.
Written to `WORKDIR/eval/step_<N>.json` (step 0 for a model as loaded), appended to
`metrics.jsonl` as a row of phase `eval_only` whose metrics are named `eval_only/...`, and to
TensorBoard under the same tags (`agentic_grpo/train/eval_only.py`); a summary line is printed.

Exit codes (`agentic_grpo/exit_codes.py`): 0 done, 74 no intact checkpoint or none at
`--step` (the steps there are listed), 78 an input mistake (one line naming the field and the
fix): a config or flag error, a missing workdir or one without config.json, `--config` with a
workdir holding checkpoints, a missing or unusable data file, model directory or checkpoint,
an empty held-out split, a context too short for `rl.buckets`; 73 a workdir held by a live
run; 1 a crash (a bug, with its traceback: never reported as a config error). The
classification is `agentic_grpo/errors.py`'s, shared by every entry point.
"""

import os
import sys

from absl import app
from absl import flags

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import exit_codes
from agentic_grpo import parallel
from agentic_grpo.train import eval_only
from launch import common_flags

if __name__ == "__main__":
  common_flags.check_overrides(sys.argv)

_WORKDIR = common_flags.WORKDIR
_STEP = common_flags.STEP
_CONFIG = common_flags.config_flag()
flags.declare_key_flag("workdir")  # listed by --help, not only --helpfull
flags.declare_key_flag("step")
flags.declare_key_flag("config")
_NUM_SAMPLES = flags.DEFINE_integer(
    "num_samples", None, "Samples per held-out task for pass@k (default: config.eval.num_samples;"
    " 0: greedy only).")
_K = flags.DEFINE_list("k", None, "The k of pass@k, each in [1, num_samples] (default: "
                       "config.eval.k).")
_EVAL_SIZE = flags.DEFINE_integer("eval_size", None, "Held-out tasks evaluated (default: "
                                  "config.task.eval_size).")
_TEMPERATURE = flags.DEFINE_float("temperature", None, "Sampling temperature of the pass@k "
                                  "samples (default: config.eval.temperature).")


def _config(config_given: bool) -> config_lib.TrainConfig:
  """The config to evaluate with.

  Raises:
    errors.InputError: `--step` with `--config`, no config (see `eval_only.saved_config`), or
      an invalid one or override.
  """
  if config_given:
    if _STEP.value != -1:
      raise errors.InputError("--step evaluates a run's checkpoint with its saved config: "
                              "drop --config and --config.* overrides")
    cfg = common_flags.run_config(_CONFIG)
  else:
    cfg = eval_only.saved_config(_WORKDIR.value)
  try:
    k = None if _K.value is None else [int(x) for x in _K.value]
  except ValueError:
    raise errors.InputError(f"--k must be comma-separated ints, got {_K.value}") from None
  return eval_only.with_overrides(cfg, num_samples=_NUM_SAMPLES.value, k=k,
                                  eval_size=_EVAL_SIZE.value, temperature=_TEMPERATURE.value)


def _main(held: common_flags.HeldLogs):
  if not _WORKDIR.value:
    common_flags.fail(exit_codes.CONFIG_ERROR, "--workdir is required")
  config_given = common_flags.config_given(sys.argv)
  cfg = _config(config_given)
  common_flags.quiet_orbax()
  parallel.initialize_distributed(collective_timeout_s=cfg.mesh.collective_timeout_s)
  workdir = _WORKDIR.value
  if config_given:
    record = eval_only.evaluate_model(cfg, workdir, on_start=held.release)
  else:
    step = None if _STEP.value < 0 else _STEP.value
    record = eval_only.evaluate_checkpoint(workdir, step, cfg=cfg, on_start=held.release)
  print(eval_only.summary(record), flush=True)
  written = os.path.join(workdir, "eval", f"step_{record['step']}.json")
  print(f"written: {os.path.abspath(written)}", flush=True)


# Input mistakes and refusals: one line and their exit code; the startup's logs held until
# its checks pass (`common_flags.entry_point`).
main = common_flags.entry_point(_main)


if __name__ == "__main__":
  app.run(main, flags_parser=common_flags.parse_flags)
