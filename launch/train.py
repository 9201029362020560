r"""Trains a coding agent with Agentic GRPO.

With no flags it runs the embedded default (`experiments/tiny_codegen.py`) into a fresh workdir
under `workdirs/` and prints where:

  python -m launch.train
  python -m launch.train --config=experiments/outcome_grpo.py --workdir=/tmp/baseline
  python -m launch.train --config.rl.group_size=4 --config.rl.num_steps=20

Restarting with the same `--workdir` resumes from its latest checkpoint.
"""

import datetime
import logging as std_logging
import os

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from agentic_grpo import config as config_lib
from agentic_grpo import parallel
from agentic_grpo import train

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "experiments", "tiny_codegen.py")

_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "Experiment config file (a `get_config()` module).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output directory; resumed if it holds a checkpoint. Default: a fresh "
    "directory workdirs/<config>-<time>.")
_STOP_AFTER = flags.DEFINE_integer(
    "stop_after", None, "Stop (after a checkpoint) at this global step, as if interrupted.")


class _DropCheckpointInfo(std_logging.Filter):
  """Drops Orbax's INFO records (hundreds per run: every save's steps); its warnings and errors
  pass. Kept with `--verbosity=1`."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return (record.levelno > std_logging.INFO
            or f"{os.sep}orbax{os.sep}" not in record.pathname)


def _fresh_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("workdirs", f"{name}-{stamp}")


def _fmt(value) -> str:
  return "n/a" if value is None else f"{value:.3f}"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if logging.get_verbosity() < 1:
    logging.get_absl_handler().addFilter(_DropCheckpointInfo())
  # Multi-process (multi-host) when the environment says so (see launch/multihost_local.sh).
  # Validating the config first also reports a bad one before any process waits for another.
  timeout_s = config_lib.from_config_dict(_CONFIG.value).mesh.collective_timeout_s
  parallel.initialize_distributed(collective_timeout_s=timeout_s)
  workdir = _WORKDIR.value or _fresh_workdir(config_flags.get_config_filename(
      flags.FLAGS["config"]))
  print(f"workdir: {os.path.abspath(workdir)}", flush=True)
  logging.info("config:\n%s", _CONFIG.value)
  result = train.run(_CONFIG.value, workdir, stop_after=_STOP_AFTER.value)
  line = (f"done: global step {result['step']} in {result['seconds']:.0f} s; "
          f"held-out greedy pass@1: warm-start {_fmt(result['warmstart_pass@1'])}, "
          f"final {_fmt(result['final_pass@1'])}")
  last = result["last_eval"] or {}
  if "eval/pass@1_gain" in last:
    line += (f" (paired gain {last['eval/pass@1_gain']:+.3f} ± "
             f"{last['eval/pass@1_gain_stderr']:.3f} s.e.)")
  print(line, flush=True)
  print(f"metrics: {os.path.abspath(os.path.join(workdir, 'metrics.jsonl'))}", flush=True)


if __name__ == "__main__":
  app.run(main)
