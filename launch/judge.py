r"""Judges programs against a data set's tasks, as a run judges its final code.

  python -m launch.judge --config.task.source=stdio --config.task.path=problems.jsonl \
      [--config.task.stdio_layout=codecontests] [--programs=programs.jsonl] \
      [--split=all|train|heldout] [--public] [--verdicts=verdicts.jsonl]

The data set is loaded as a run loads it (`--config`, default the embedded one, and its
`--config.task.*` / `--config.sandbox.*` overrides; `agentic_grpo.judging.load_tasks`).
`--programs` is a JSONL file of `{"task_id": ..., "program": ...}` rows; without it each task's
own reference solution is judged (a check of the data set and of the judge). Each program runs
in the sandbox on its task's hidden tests (`--public`: a stdio task's public ones too) under the
task's limits and its layout's output comparison (`agentic_grpo.judging.judge`). One line per
program (`PASS` / `FAIL`, the task id, tests passed, the verdict), then a summary;
`--verdicts` writes them as JSONL.

Exit codes (`agentic_grpo/exit_codes.py`): 0 judged (whatever the verdicts), 78 an input
mistake (one line naming the flag or field and the fix: a missing or unusable data file, a
layout mismatch, an empty split, a missing or malformed --programs file or one naming an
unknown task), 1 a crash (a bug, with its traceback). The classification is
`agentic_grpo/errors.py`'s, shared by every entry point.
"""

import json
import sys

from absl import app
from absl import flags

from agentic_grpo import errors
from agentic_grpo import judging
from launch import common_flags

if __name__ == "__main__":
  common_flags.check_overrides(sys.argv)

_CONFIG = common_flags.config_flag()
flags.declare_key_flag("config")  # listed by --help, not only --helpfull
_PROGRAMS = flags.DEFINE_string(
    "programs", "", "JSONL file of {\"task_id\": ..., \"program\": ...} rows to judge; '' "
    "judges each task's reference solution.")
_SPLIT = flags.DEFINE_enum("split", "all", list(judging.SPLITS),
                           "Which tasks: both splits, the training or the held-out one.")
_PUBLIC = flags.DEFINE_bool("public", False, "Also run a stdio task's public tests.")
_OUT = flags.DEFINE_string("verdicts", "", "Write the verdicts here as JSONL ('' = do "
                           "not).")


def _main(held: common_flags.HeldLogs):
  cfg = common_flags.run_config(_CONFIG)
  tasks = judging.load_tasks(cfg, _SPLIT.value)
  if _PROGRAMS.value:
    pairs = judging.read_programs(_PROGRAMS.value, tasks)
  else:
    pairs = [(i, t.reference_solution) for i, t in tasks.items()]
    if all(p is None for _, p in pairs):
      raise errors.InputError("the data set's tasks have no reference solution: give "
                              "--programs")
  held.release()
  with cfg.sandbox.pool() as pool:
    verdicts = judging.judge([tasks[i] for i, _ in pairs], [p for _, p in pairs], pool,
                             public=_PUBLIC.value)
  for v in verdicts:
    line = (f"{'PASS' if v.passed else 'FAIL'} {v.task_id}: {v.num_passed}/{v.num_tests} "
            f"tests ({v.verdict})")
    print(line + (f": {' '.join(v.error.split())[:120]}" if v.error and not v.passed else ""))
  passed = sum(v.passed for v in verdicts)
  print(f"judged {len(verdicts)} program(s) on {cfg.task.source} tasks "
        f"({_SPLIT.value}): {passed} passed every test "
        f"({passed / max(len(verdicts), 1):.1%})", flush=True)
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(v.to_json()) + "\n" for v in verdicts)
    print(f"written: {_OUT.value}", flush=True)


# Input mistakes and refusals: one line and their exit code; the startup's logs held until
# its checks pass (`common_flags.entry_point`).
main = common_flags.entry_point(_main)


if __name__ == "__main__":
  app.run(main, flags_parser=common_flags.parse_flags)
