r"""Trains a coding agent with Agentic GRPO.

With no flags it runs the embedded default (`experiments/tiny_codegen.py`) into a fresh workdir
under `workdirs/` and prints where:

  python -m launch.train
  python -m launch.train --config=experiments/outcome_grpo.py --workdir=/tmp/baseline
  python -m launch.train --config.rl.group_size=4 --config.rl.num_steps=20

Restarting with the same `--workdir` resumes from its latest intact checkpoint, unless the
config changes a field the saved state depends on (`agentic_grpo/config_drift.py`). One run at a
time holds a workdir (`agentic_grpo/checkpoint/run_lock.py`).

`--show_config` prints every config field with its value, default and doc, then exits.

Exit codes (`agentic_grpo/exit_codes.py`): 0 done, 65 resume refused for config drift, 73
workdir held by another run, 74 no intact checkpoint, 75 preempted (SIGTERM or SIGINT: the
current step finished and a checkpoint written; rerun to resume), 78 an input mistake: a config
or flag error, a missing or unusable data file, model directory or checkpoint, an empty split,
a context too short for `rl.buckets` (one line on stderr naming the field and the fix, or the
nearest valid name; nothing else is printed and nothing written), 79 the run ended without
doing its job (the last line says why), 1 a crash (a bug: its traceback). The classification
is `agentic_grpo/errors.py`'s, shared by every entry point.
"""

import datetime
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from agentic_grpo import config as config_lib
from agentic_grpo import config_help
from agentic_grpo import exit_codes
from agentic_grpo import parallel
from agentic_grpo import train
from launch import common_flags

if __name__ == "__main__":
  common_flags.check_overrides(sys.argv)


_CONFIG = common_flags.config_flag()
_WORKDIR = common_flags.WORKDIR
flags.declare_key_flag("config")  # listed by --help, not only --helpfull
flags.declare_key_flag("workdir")
_STOP_AFTER = flags.DEFINE_integer(
    "stop_after", None, "Stop (after a checkpoint) at this global step, as if interrupted.")
_SHOW_CONFIG = flags.DEFINE_bool(
    "show_config", False, "Print every config field (--config.<field>) with its value, "
    "default and doc, then exit.")


def _fresh_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("workdirs", f"{name}-{stamp}")


def _fmt(value) -> str:
  return "n/a" if value is None else f"{value:.3f}"


def _flat(cfg: config_lib.TrainConfig) -> dict:
  return {f.path: eval(f"cfg.{f.path}", {"cfg": cfg})  # pylint: disable=eval-used
          for f in config_help.fields()}


def _main(held: common_flags.HeldLogs):
  # Checked before anything is printed: an error is one line.
  cfg = common_flags.run_config(_CONFIG)
  if _SHOW_CONFIG.value:
    print(config_help.show(_flat(cfg)))
    return
  common_flags.quiet_orbax()
  # Multi-process (multi-host) when the environment says so (see launch/multihost_local.sh).
  # Validating the config first also reports a bad one before any process waits for another.
  parallel.initialize_distributed(collective_timeout_s=cfg.mesh.collective_timeout_s)
  workdir = _WORKDIR.value or _fresh_workdir(config_flags.get_config_filename(
      flags.FLAGS["config"]))

  def started():  # the startup checks passed: a refused run prints only its error line
    held.release()
    print(f"workdir: {os.path.abspath(workdir)}", flush=True)
    logging.info("config:\n%s", _CONFIG.value)

  result = train.run(cfg, workdir, stop_after=_STOP_AFTER.value, on_start=started)
  line = (f"done: global step {result['step']} in {result['seconds']:.0f} s; "
          f"held-out greedy pass@1: warm-start {_fmt(result['warmstart_pass_at_1'])}, "
          f"final {_fmt(result['final_pass_at_1'])}")
  last = result["last_eval"] or {}
  if "eval/pass_at_1_gain" in last:
    line += (f" (paired gain {last['eval/pass_at_1_gain']:+.3f} ± "
             f"{last['eval/pass_at_1_gain_stderr']:.3f} s.e.)")
  print(line, flush=True)
  rl_line = train.summary_line(result["summary"], group_size=cfg.rl.group_size,
                               temperature=cfg.rl.temperature)
  if rl_line:
    print(rl_line, flush=True)
  print(f"metrics: {os.path.abspath(os.path.join(workdir, 'metrics.jsonl'))}", flush=True)
  if result["incomplete"]:
    common_flags.fail(exit_codes.NO_PROGRESS, result["incomplete"])


# Input mistakes and refusals: one line and their exit code; the startup's logs held until
# its checks pass (`common_flags.entry_point`).
main = common_flags.entry_point(_main)


if __name__ == "__main__":
  app.run(main, flags_parser=common_flags.parse_flags)
