"""Plain literals on the host side of the sandbox: validation and decoding.

Values cross the sandbox boundary as tagged JSON (`runner.make_encoder`);
`decode` turns a report's JSON back into a Python value of exact builtin
types, and `check_plain` validates what the trusted side puts into tests. The
comparison of decoded values with expected ones is
`agentic_grpo.tasks.literals.values_equal`, shared with the workflow.
"""

import json
from typing import Any

from agentic_grpo.sandbox import runner

_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)


def check_plain(value: Any, where: str, depth: int = 0) -> None:
  """Raises ValueError (naming `where`) unless `value` is a plain literal of exact builtin types.

  Plain: None, bool, int, float, complex, str, bytes, and list, tuple, set,
  frozenset and dict of plain literals, nested at most `runner.MAX_DEPTH`
  deep; no subclasses.
  """
  t = type(value)
  if t in _PLAIN_TYPES:
    return
  if depth > runner.MAX_DEPTH:
    raise ValueError(f"{where} is nested more than {runner.MAX_DEPTH} deep")
  if t in (list, tuple, set, frozenset):
    for x in value:
      check_plain(x, where, depth + 1)
  elif t is dict:
    for k, x in value.items():
      check_plain(k, where, depth + 1)
      check_plain(x, where, depth + 1)
  else:
    raise ValueError(f"{where} must hold only plain literals, found {t.__name__}: {value!r:.80}")


def decode(text: bytes) -> Any:
  """Tagged JSON text from the sandbox -> plain literal.

  Raises:
    ValueError: if `text` is not valid tagged JSON (written by a rogue program).
    RecursionError: if it nests deeper than the decoder's recursion allows.
  """
  return runner.decode_value(json.loads(text))
