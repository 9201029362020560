"""The non-array records of a checkpoint across versions: required keys, and keys with safe
defaults.

A checkpoint's JSON meta (the run's phase and step, the replay's and the agent loop's
bookkeeping, the RL phase's unlogged rows) and its host arrays are read back by the code of the
day. A key that a later version added is absent from a checkpoint written before it: `read`
fills it from a default where the default is safe (the value is bookkeeping that only feeds
logged metrics, and starting it afresh changes no update, sample or id), logging a note for
each one, and raises `RecordError` naming every absent key that has no safe default (the
checkpoint is left as it is). Which keys default to what is declared where each record is read
(`checkpointer`'s module docstring lists them).
"""

import copy
from typing import Any, Mapping, Optional, Sequence

from absl import logging


class RecordError(ValueError):
  """A checkpoint record lacks keys that have no safe default (the message names them)."""


def read(record: Any, where: str, *, required: Sequence[str] = (),
         defaults: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
  """`record` checked for its `required` keys, with each absent key of `defaults` filled in.

  Args:
    record: a mapping read from a checkpoint (a JSON object, or host arrays by name).
    where: the record's name in messages, e.g. `meta.loop`.
    required: keys without a safe default.
    defaults: `{key: value}` for keys an earlier version did not write; a copy of the value is
      used, and each one used is logged as a warning.

  Returns:
    A new dict: `record`'s entries plus the defaults used.

  Raises:
    RecordError: `record` is not a mapping, or lacks some of `required` (all named).
  """
  if not isinstance(record, Mapping):
    raise RecordError(f"checkpoint record {where} is {type(record).__name__}, not a mapping "
                      f"(written by another version of the code?)")
  absent = [k for k in required if k not in record]
  if absent:
    raise RecordError(
        f"checkpoint record {where} lacks {', '.join(absent)}, which have no safe default "
        f"(written by another version of the code?); the checkpoint is left as it is. Present: "
        f"{', '.join(sorted(map(str, record))) or 'nothing'}")
  out = dict(record)
  for key, value in (defaults or {}).items():
    if key not in out:
      out[key] = copy.deepcopy(value)
      logging.warning("checkpoint record %s lacks %r (written by an earlier version): using %r",
                      where, key, value)
  return out
