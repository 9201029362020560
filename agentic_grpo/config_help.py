"""The config fields documented: every dotted field with its type, default and doc.

The docs are the `Attributes:` blocks of the section dataclasses in `config` (one source, read
by people in the code and printed by `launch/train.py --show_config`); `tests/
config_help_test.py` checks that every field has one. `nearest` suggests the field a misspelt
name meant.
"""

import dataclasses
import difflib
import inspect
import re
import typing
from typing import Any, Optional

from agentic_grpo import config as config_lib

_ATTRIBUTE = re.compile(r"^    (\w+): (.*)$")
_CONTINUATION = re.compile(r"^      +(\S.*)$")


def _attribute_docs(cls) -> dict[str, str]:
  """`{field: doc}` from the `Attributes:` block of `cls`'s docstring."""
  lines = (cls.__doc__ or "").splitlines()
  if "  Attributes:" not in lines:
    return {}
  docs: dict[str, str] = {}
  name = None
  for line in lines[lines.index("  Attributes:") + 1:]:
    if m := _ATTRIBUTE.match(line):
      name = m.group(1)
      docs[name] = m.group(2)
    elif (m := _CONTINUATION.match(line)) and name:
      docs[name] += " " + m.group(1)
    else:
      name = None
  return docs


@dataclasses.dataclass(frozen=True)
class Field:
  """One leaf config field: dotted path, annotation (as text), dataclass default, doc."""
  path: str
  type: str
  default: Any
  doc: str


def fields(cls=config_lib.TrainConfig, prefix: str = "") -> list[Field]:
  """Every leaf field of the config dataclasses, in declaration order."""
  out = []
  docs = _attribute_docs(cls)
  defaults = cls()
  for name, tp in typing.get_type_hints(cls).items():
    if dataclasses.is_dataclass(tp):
      out += fields(tp, f"{prefix}{name}.")
    else:
      text = inspect.formatannotation(tp)
      out.append(Field(prefix + name, text, getattr(defaults, name), docs.get(name, "")))
  return out


def nearest(path: str) -> Optional[str]:
  """The valid dotted field (or section) name closest to `path`, or None when none is close."""
  names = [f.path for f in fields()] + [f.name for f in dataclasses.fields(config_lib.TrainConfig)]
  found = difflib.get_close_matches(path, names, n=1, cutoff=0.6)
  return found[0] if found else None


def show(values: Optional[dict[str, Any]] = None) -> str:
  """Every field as `path = value  # (type, default D) doc`, grouped by section.

  Args:
    values: the flattened values to show (e.g. an experiment's, after overrides); the
      dataclass defaults when None.
  """
  lines, section = [], None
  for f in fields():
    head = f.path.split(".")[0] if "." in f.path else ""
    if head != section:
      section = head
      lines.append(f"\n[{head or 'top level'}]")
    value = f.default if values is None else values.get(f.path, f.default)
    default = "" if value == f.default else f", default {f.default!r}"
    lines.append(f"config.{f.path} = {value!r}  ({f.type}{default}) {f.doc}")
  return "\n".join(lines).lstrip("\n")
