"""The one equality of plain literal values that every reward uses.

Task values (expected outputs, probe outputs, the agent's predictions, the
values a program returns in the sandbox) are plain literals: None, bool, int,
float, complex, str, bytes and lists, tuples, sets, frozensets and dicts of
them. `values_equal` decides whether two of them match, for I/O tests (the
sandbox's parent process), hypothesis predictions and observations (the
workflow). It lives here, below both `tasks/` and `agent/`, so that neither
needs the other to compare values.
"""

import math
from typing import Any


def _float_equal(a: float, b: float) -> bool:
  if math.isnan(a) or math.isnan(b):
    return math.isnan(a) and math.isnan(b)
  return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def canonical(x: Any) -> Any:
  """Exact, hashable, type-tagged form of a plain literal (for set elements and dict keys).

  Raises:
    TypeError: if `x` holds an unhashable value where a set element or key is expected.
  """
  t = type(x)
  if t is float:
    return ("float", "nan" if math.isnan(x) else x)
  if t is complex:
    return ("complex", canonical(x.real), canonical(x.imag))
  if t in (list, tuple):
    return (t.__name__,) + tuple(canonical(v) for v in x)
  if t in (set, frozenset):
    return (t.__name__, frozenset(canonical(v) for v in x))
  if t is dict:
    return ("dict", frozenset((canonical(k), canonical(v)) for k, v in x.items()))
  return (t.__name__, x)


def values_equal(actual: Any, expected: Any) -> bool:
  """Type-strict equality of plain literals.

  The rule: types must match exactly at every level (`True != 1`, `1 != 1.0`,
  `(1,) != [1]`, `"a" != b"a"`); floats (and the parts of complex numbers)
  compare with `math.isclose(rel_tol=1e-9, abs_tol=1e-12)`, and NaN equals
  NaN; list and tuple elements compare in order; set elements and dict keys
  compare exactly (by `canonical` form, so `{True} != {1}`), dict values by
  this rule. Other values (int, str, bytes, None, bool) compare with `==`.
  Symmetric; never raises for plain literals.
  """
  ta = type(actual)
  if ta is not type(expected):
    return False
  if ta is float:
    return _float_equal(actual, expected)
  if ta is complex:
    return _float_equal(actual.real, expected.real) and _float_equal(actual.imag, expected.imag)
  if ta in (list, tuple):
    return len(actual) == len(expected) and all(
        values_equal(a, e) for a, e in zip(actual, expected))
  if ta in (set, frozenset):
    return {canonical(v) for v in actual} == {canonical(v) for v in expected}
  if ta is dict:
    if len(actual) != len(expected):
      return False
    exp = {canonical(k): v for k, v in expected.items()}
    for k, v in actual.items():
      ck = canonical(k)
      if ck not in exp or not values_equal(v, exp[ck]):
        return False
    return True
  return actual == expected
