"""Flags that several `launch/` entry points share, defined once.

absl keeps one global flag registry, so two entry points that each define `--workdir` could not be
imported by one process (a test, a notebook). Each shared flag lives here; an entry point imports
it. Entry-point-specific flags stay in their module under names no other entry point uses
(`tests/launch_imports_test.py` imports every entry point together).
"""

from absl import flags

WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run's directory (config.json, checkpoints/, metrics.jsonl). "
    "launch.train: resumed if it holds a checkpoint; default a fresh directory "
    "workdirs/<config>-<time>. Other entry points: required, read only.")
