"""`SECTION.FIELD=VALUE` overrides of a run's `ConfigDict`, as scripts other than absl's take them.

An experiment's own command line overrides through `ml_collections.config_flags`
(`--config.rl.group_size=8`). Drivers that build several configs in one process (the ablation's
arms, the pipeline benchmark's child runs) take plain `SECTION.FIELD=VALUE` strings instead and
set them here, with the same rule for every driver: VALUE is read as a Python literal, else kept
as a string, and must keep the field's type.
"""

from typing import Sequence

import ml_collections

from agentic_grpo.tasks import python_ast


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Sets each `SECTION.FIELD=VALUE` of `overrides` in `cfg`, in order (nested paths too).

  Args:
    cfg: the run's config, changed in place.
    overrides: strings `path.to.field=VALUE`; VALUE a Python literal (`1e-4`, `True`, `(128,)`),
      else a string (`cosine`).

  Raises:
    ValueError: an override without `=`, naming a field `cfg` lacks, or of the wrong type
      (ml_collections keeps each field's type); the message names the override.
  """
  for item in overrides:
    path, sep, text = item.partition("=")
    parts = path.strip().split(".")
    node = cfg
    for part in parts[:-1]:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if not sep or not isinstance(node, ml_collections.ConfigDict) or parts[-1] not in node:
      raise ValueError(f"override {item!r} must be SECTION.FIELD=VALUE naming a config field")
    try:
      value = python_ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
      value = text
    try:
      node[parts[-1]] = value
    except TypeError as e:  # ml_collections keeps a field's type
      raise ValueError(f"override {item!r}: {e}") from None
