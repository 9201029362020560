"""Flags that several `launch/` entry points share, defined once, and their parsing.

absl keeps one global flag registry, so two entry points that each define `--workdir` could not be
imported by one process (a test, a notebook). Each shared flag lives here; an entry point imports
it. Entry-point-specific flags stay in their module under names no other entry point uses
(`tests/launch_imports_test.py` imports every entry point together).

Errors of the command line are one line on stderr and an exit code (`fail`): a misspelt
`--config.<field>` names the nearest field (`check_overrides`, before absl parses anything), a
bad flag value names the flag (`parse_flags`). Every entry point runs its `main` under
`reported_errors`: an error `agentic_grpo.errors` classifies as reported (an input mistake, a
refusal) is one line and its exit code, anything else a bug with its traceback; the logs of
its startup are held back (`HeldLogs`) until its checks pass, so that a refused run prints only
its error line. `--help` (and
absl's `--helpshort`, `--helpfull`) print the flags and exit 0.
"""

import contextlib
import functools
import logging as std_logging
import os
import re
import sys
from typing import Callable

from absl import flags
from absl import logging
from ml_collections import config_flags

from agentic_grpo import config_help
from agentic_grpo import errors
from agentic_grpo import exit_codes

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "experiments", "tiny_codegen.py")

WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run's directory (config.json, checkpoints/, metrics.jsonl). "
    "launch.train: resumed if it holds a checkpoint; default a fresh directory "
    "workdirs/<config>-<time>. launch.evaluate: the run to evaluate, or (with --config) where "
    "to write the evaluation of the model as loaded. Other entry points: required, read only.")
STEP = flags.DEFINE_integer(
    "step", -1, "The checkpoint's global step (launch.export, launch.evaluate); -1: the newest "
    "intact one.")


@functools.cache
def config_flag():
  """`--config`, defined at the first call (later calls return the same flag holder).

  ml_collections applies `--config.<field>` overrides from `sys.argv` when the flag is defined,
  and turns an unknown field into three chained tracebacks: an entry point calls
  `check_overrides(sys.argv)` first.
  """
  return config_flags.DEFINE_config_file(
      "config", DEFAULT_CONFIG, "Experiment config file (a `get_config()` module); override its "
      "fields with --config.<section>.<field>=value (--show_config lists every field).",
      lock_config=True)


_OVERRIDE = re.compile(r"^--(?:no)?config\.([\w.]+)")


def fail(code: int, message: str):
  """Exits with `code` after one line on stderr."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def config_given(argv: list[str]) -> bool:
  """Whether the command line sets `--config` or any `--config.<field>`."""
  for arg in argv[1:]:
    if arg == "--":
      break
    if arg == "--config" or arg.startswith("--config=") or _OVERRIDE.match(arg):
      return True
  return False


def check_overrides(argv: list[str]) -> None:
  """Exits with one line naming the nearest valid field for a misspelt `--config.<path>`.

  Call it before `config_flag()` (see there).
  """
  known = {f.path for f in config_help.fields()}
  for arg in argv[1:]:
    if arg == "--":
      break
    m = _OVERRIDE.match(arg)
    if m and m.group(1) not in known:
      near = config_help.nearest(m.group(1))
      fail(exit_codes.CONFIG_ERROR, f"unknown config field config.{m.group(1)}"
           + (f"; did you mean config.{near}?" if near else "; see --show_config"))


class HeldLogs:
  """Holds back the log records that reach absl's handler (every Python logger's, absl's own
  included) until `release` emits them in order, or `drop` discards them.

  An entry point holds its startup's logs: a run refused for an input mistake then prints
  only its error line, and one that starts prints them all, as they would have come.
  """

  def __init__(self):
    self._handler = logging.get_absl_handler()
    self._records: list[std_logging.LogRecord] = []
    self._held = True
    self._handler.addFilter(self._hold)

  def _hold(self, record: std_logging.LogRecord) -> bool:
    if self._held:
      self._records.append(record)
      return False
    return True

  def release(self) -> None:
    """Emits the held records and stops holding (idempotent)."""
    if self._held:
      self._held = False
      self._handler.removeFilter(self._hold)
      records, self._records = self._records, []
      for record in records:
        self._handler.handle(record)

  def drop(self) -> None:
    """Discards the held records and stops holding (idempotent)."""
    self._records = []
    self.release()


@contextlib.contextmanager
def reported_errors(hold_logs: bool = False):
  """Runs the block; an error that `errors.code_of` classifies exits with one line and its
  code (`fail`), any other propagates (its traceback, exit code 1: a bug).

  With `hold_logs`, yields a `HeldLogs` that holds the block's logs until the entry point calls
  its `release` (once its startup checks have passed); a reported error before that drops them
  (the one line is all that is printed), a bug or the block's end releases them.

    with common_flags.reported_errors(hold_logs=True) as held:
      ...  # startup checks
      held.release()
  """
  held = HeldLogs() if hold_logs else None
  try:
    yield held
  except Exception as e:  # pylint: disable=broad-except  (classified, else re-raised)
    code = errors.code_of(e)
    if code is None:
      if held is not None:
        held.release()
      raise
    if held is not None:
      held.drop()
    fail(code, errors.one_line(e))
  finally:
    if held is not None:
      held.release()


def entry_point(body: Callable[["HeldLogs"], None]) -> Callable[[list[str]], None]:
  """The `main` of an entry point, for `app.run(main, flags_parser=parse_flags)`.

  `main(argv)` refuses positional arguments (exit code CONFIG_ERROR, one line) and runs
  `body(held)` under `reported_errors(hold_logs=True)`: `body` calls `held.release()` once its
  startup checks pass.

    main = common_flags.entry_point(_main)  # def _main(held: common_flags.HeldLogs): ...
  """
  @functools.wraps(body)
  def main(argv: list[str]) -> None:
    with reported_errors(hold_logs=True) as held:
      if len(argv) > 1:
        fail(exit_codes.CONFIG_ERROR, f"unexpected arguments {argv[1:]}")
      body(held)
  return main


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag value as one line (exit code CONFIG_ERROR) and help
  exiting 0; pass as `app.run(main, flags_parser=parse_flags)`."""
  try:
    return flags.FLAGS(argv)
  except SystemExit as e:
    # Only absl's help flags (--help, --helpshort, --helpfull, --helpxml) exit while parsing,
    # with status 1 after printing the help that was asked for.
    sys.exit(0 if e.code == 1 else e.code)
  except flags.Error as e:
    fail(exit_codes.CONFIG_ERROR, f"{e} (see --help, --show_config)")
  except (KeyError, AttributeError) as e:  # a field that --config's file does not set
    first = str(e.args[0] if e.args else e).splitlines()[0]
    fail(exit_codes.CONFIG_ERROR, f"cannot override config field {first}: the config file "
         f"does not set it")


class DropCheckpointInfo(std_logging.Filter):
  """Drops Orbax's INFO records (hundreds per run: every save's steps); its warnings and errors
  pass."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return (record.levelno > std_logging.INFO
            or f"{os.sep}orbax{os.sep}" not in record.pathname)


def quiet_orbax() -> None:
  """Installs `DropCheckpointInfo` on absl's handler, unless `--verbosity` >= 1."""
  if logging.get_verbosity() < 1:
    logging.get_absl_handler().addFilter(DropCheckpointInfo())
