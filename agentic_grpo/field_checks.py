"""Field checks shared by the config sections, wherever a section lives (`config/` assembles
them; a section kept by its owner, as `learner/sections.py`, checks its fields here too): each
error names the field by its dotted path.

Every error is an `errors.InputError` (a `ValueError`): an entry point reports it as one line
with exit code `exit_codes.CONFIG_ERROR`.
"""

from typing import Any

from agentic_grpo import errors
from agentic_grpo.core import types as core_types


def fail(path: str, msg: str, value: Any) -> None:
  """Raises `errors.InputError("config.<path> <msg>, got <value>")`."""
  raise errors.InputError(f"config.{path} {msg}, got {value!r}")


def check(cond: bool, path: str, msg: str, value: Any) -> None:
  """Raises like `fail` unless `cond`."""
  if not cond:
    fail(path, msg, value)


def choice(path: str, value: str, allowed: tuple[str, ...]) -> None:
  """Raises `errors.InputError` naming `config.<path>` unless `value` is one of `allowed`."""
  try:
    core_types.check_choice(f"config.{path}", value, allowed)
  except ValueError as e:
    raise errors.InputError(str(e)) from None
