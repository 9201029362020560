"""Flags that several `launch/` entry points share, defined once, and their parsing.

absl keeps one global flag registry, so two entry points that each define `--workdir` could not be
imported by one process (a test, a notebook). Each shared flag lives here; an entry point imports
it. Entry-point-specific flags stay in their module under names no other entry point uses
(`tests/launch_imports_test.py` imports every entry point together).

Errors of the command line are one line on stderr and an exit code (`fail`): a misspelt
`--config.<field>` names the nearest field (`check_overrides`, before absl parses anything), a
bad flag value names the flag (`parse_flags`), and a `--config` file that does not load
(missing, a directory, a syntax error, no `get_config`, an error it raises, a value that is no
config) names the file, the error and its line (`parse_flags`, `run_config`). Every entry
point runs its `main` under `reported_errors`: an error `agentic_grpo.errors` classifies as
reported (an input mistake, a refusal) is one line and its exit code, anything else a bug with
its traceback; the logs of its startup are held back (`HeldLogs`) until its checks pass, so
that a refused run prints only its error line. `--help` (and absl's `--helpshort`,
`--helpfull`) print the flags and exit 0.
"""

import collections.abc
import contextlib
import functools
import logging as std_logging
import os
import re
import sys
import traceback
from typing import Callable

from absl import flags
from absl import logging
from ml_collections import config_flags

from agentic_grpo import config as config_lib
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


def _config_arg(argv: list[str]) -> str:
  """The `--config` value of the command line (the last one given), else `DEFAULT_CONFIG`."""
  path = DEFAULT_CONFIG
  args = list(argv[1:])
  for i, arg in enumerate(args):
    if arg == "--":
      break
    if arg.startswith("--config="):
      path = arg[len("--config="):]
    elif arg == "--config" and i + 1 < len(args):
      path = args[i + 1]
  return path


def _config_file(path: str) -> str:
  """The file of a `--config` value (`file.py` or `file.py:argument`)."""
  return os.path.abspath(path.split(":", 1)[0])


def _raised_in(error: BaseException, file: str):
  """The error in `error`'s chain (itself, then its cause or context) that the code of `file`
  raised, with the line it raised at, or `(None, None)`."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, SyntaxError) and error.filename and os.path.abspath(
        error.filename) == file:
      return error, error.lineno
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__)
             if os.path.abspath(f.filename) == file]
    if lines:
      return error, lines[-1]
    error = error.__cause__ or error.__context__
  return None, None


def _config_load_error(path: str, error: BaseException):
  """One line for a `--config` file that does not load (the error it raised and where), or None
  when `error` did not come from the file."""
  file = _config_file(path)
  raised, line = _raised_in(error, file)
  if raised is not None:
    message = str(raised.msg if isinstance(raised, SyntaxError) else raised)
    if "Error whilst parsing config file" in message:  # ml_collections' re-raise: its last line
      message = message.strip().splitlines()[-1].partition(": ")[2] or message
    return (f"--config={path} does not load: {type(raised).__name__}: "
            f"{errors.one_line(message)} ({file}, line {line})")
  if isinstance(error, AttributeError) and "get_config" in str(error):
    return f"--config={path} defines no get_config() (a config file's entry point)"
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag value or a `--config` file that does not load (its
  error and the line it raised at) as one line (exit code CONFIG_ERROR) and help exiting 0;
  pass as `app.run(main, flags_parser=parse_flags)`."""
  # ml_collections warns of a get_config() that returned None before absl's logging is set up
  # (two lines); `run_config` reports it as the error it is.
  quiet = _DropRecords("get_config() returned None")
  logging.get_absl_logger().addFilter(quiet)
  try:
    return flags.FLAGS(argv)
  except SystemExit as e:
    # Only absl's help flags (--help, --helpshort, --helpfull, --helpxml) exit while parsing,
    # with status 1 after printing the help that was asked for.
    sys.exit(0 if e.code == 1 else e.code)
  except Exception as e:  # pylint: disable=broad-except  (classified, else re-raised)
    # Parsing runs the config file's code (ml_collections imports it and calls get_config):
    # whatever that raises is the file's mistake.
    line = _config_load_error(_config_arg(argv), e)
    if line is not None:
      fail(exit_codes.CONFIG_ERROR, line)
    if isinstance(e, flags.Error):
      fail(exit_codes.CONFIG_ERROR, f"{errors.one_line(e)} (see --help, --show_config)")
    if isinstance(e, (KeyError, AttributeError)):  # a field that --config's file does not set
      first = str(e.args[0] if e.args else e).splitlines()[0]
      fail(exit_codes.CONFIG_ERROR, f"cannot override config field {first}: the config file "
           f"does not set it")
    raise
  finally:
    logging.get_absl_logger().removeFilter(quiet)


class _DropRecords(std_logging.Filter):
  """Drops the log records whose message contains `text`."""

  def __init__(self, text: str):
    super().__init__()
    self.text = text

  def filter(self, record: std_logging.LogRecord) -> bool:
    return self.text not in record.getMessage()


def run_config(holder) -> config_lib.TrainConfig:
  """The `TrainConfig` of `--config` (`holder`, from `config_flag()`) with its overrides.

  Raises:
    errors.InputError: the file is missing, a directory or unreadable (ml_collections defers
      that error to the config's first use), `get_config()` returned None or something else
      than a `ConfigDict` or mapping, or a field is unknown, ill-typed or out of range
      (`config.from_config_dict`).
  """
  path = flags.FLAGS[holder.name].config_filename
  file = _config_file(path)
  try:
    value = holder.value
  except flags.Error as e:  # absl refuses a None value
    raise errors.InputError(f"--config={path}: get_config() returned None, not a ConfigDict "
                            f"(a missing return?)") from e
  try:
    if not hasattr(value, "to_dict") and not isinstance(value, collections.abc.Mapping):
      raise errors.InputError(f"--config={path}: get_config() returned a value of type "
                              f"{type(value).__name__}, not a ConfigDict or a mapping")
    return config_lib.from_config_dict(value)
  except OSError as e:
    if not os.path.exists(file):
      reason = "no such file"
    elif os.path.isdir(file):
      reason = "is a directory, not a config file"
    else:
      reason = f"does not load: {errors.one_line(e.__cause__ or e)}"
    raise errors.InputError(f"--config={path}: {reason}") from e


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
