"""Field checks shared by the config sections: each error names the field by its dotted path."""

from typing import Any

from agentic_grpo.core import types as core_types


def fail(path: str, msg: str, value: Any) -> None:
  """Raises `ValueError("config.<path> <msg>, got <value>")`."""
  raise ValueError(f"config.{path} {msg}, got {value!r}")


def check(cond: bool, path: str, msg: str, value: Any) -> None:
  """Raises like `fail` unless `cond`."""
  if not cond:
    fail(path, msg, value)


def choice(path: str, value: str, allowed: tuple[str, ...]) -> None:
  """Raises `ValueError` naming `config.<path>` unless `value` is one of `allowed`."""
  core_types.check_choice(f"config.{path}", value, allowed)
