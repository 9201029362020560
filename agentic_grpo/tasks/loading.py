"""Shared pieces of the dataset loaders: row errors, JSONL reading, assert and doctest parsing."""

import ast
import doctest
import gzip
import json
from typing import Any, Callable, Iterator, Optional

from absl import logging

from agentic_grpo.tasks import task as task_lib

ON_ERROR = ("skip", "raise")


class RowError(ValueError):
  """A malformed dataset row: names the file, the row (1-based line) and the field."""

  def __init__(self, path: str, row: int, field: Optional[str], message: str):
    self.path, self.row, self.field = path, row, field
    where = f"{path}: row {row}" + (f", field {field!r}" if field else "")
    super().__init__(f"{where}: {message}")


def check_on_error(on_error: str) -> None:
  if on_error not in ON_ERROR:
    raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")


def read_jsonl(path: str) -> Iterator[tuple[int, Any]]:
  """Yields `(row, parsed JSON or RowError)` for every non-blank line (gzip by suffix).

  A line that is not JSON yields a `RowError` instead of raising, so that the caller decides.
  """
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    for row, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        yield row, json.loads(line)
      except json.JSONDecodeError as e:
        yield row, RowError(str(path), row, None, f"not JSON ({e.msg} at column {e.colno})")


def load_rows(path: str, convert: Callable[[dict, int], task_lib.Task], on_error: str,
              errors: Optional[list[RowError]] = None) -> list[task_lib.Task]:
  """Converts every row of a JSONL file with `convert(row_dict, row_number)`.

  `convert` raises `RowError` for a malformed row; any other exception from it is wrapped
  into one (field unknown). With `on_error="raise"` the first error propagates; with `"skip"`
  the row is logged, appended to `errors` (if given) and skipped.

  Raises:
    ValueError: for an unknown `on_error`.
    RowError: with `on_error="raise"`, for the first malformed row.
    OSError: if `path` cannot be read.
  """
  check_on_error(on_error)
  tasks = []
  for row, value in read_jsonl(path):
    try:
      if isinstance(value, RowError):
        raise value
      if not isinstance(value, dict):
        raise RowError(str(path), row, None, f"expected a JSON object, got {type(value).__name__}")
      tasks.append(convert(value, row))
    except Exception as e:  # pylint: disable=broad-except
      err = e if isinstance(e, RowError) else RowError(str(path), row, None,
                                                       f"{type(e).__name__}: {e}")
      if on_error == "raise":
        raise err from (None if err is e else e)
      logging.warning("skipping malformed row: %s", err)
      if errors is not None:
        errors.append(err)
  return tasks


def require(d: dict, key: str, kind: type, path: str, row: int) -> Any:
  """`d[key]`, checked to be a `kind` (non-empty for str), or a `RowError` naming the field."""
  if key not in d:
    raise RowError(path, row, key, "missing")
  value = d[key]
  if not isinstance(value, kind) or (kind is str and not value.strip()):
    raise RowError(path, row, key, f"expected a non-empty {kind.__name__}, got {value!r:.60}")
  return value


def call_example(call_src: str, expected_src: str, entry_point: str
                 ) -> Optional[task_lib.Example]:
  """`Example` of `entry_point(literal args)` with a literal expected value, else None."""
  try:
    call = ast.parse(call_src.strip(), mode="eval").body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id == entry_point and not call.keywords):
      return None
    args = tuple(ast.literal_eval(a) for a in call.args)
    expected = ast.literal_eval(expected_src.strip())
  except Exception:  # pylint: disable=broad-except
    return None
  return task_lib.Example(args, expected)


def assert_example(assert_src: str, entry_point: str) -> Optional[task_lib.Example]:
  """`Example` of an `assert entry_point(args) == expected` line, else None."""
  try:
    node = ast.parse(assert_src.strip()).body
  except Exception:  # pylint: disable=broad-except
    return None
  if len(node) != 1 or not isinstance(node[0], ast.Assert):
    return None
  test = node[0].test
  if not (isinstance(test, ast.Compare) and len(test.ops) == 1
          and isinstance(test.ops[0], ast.Eq)):
    return None
  return call_example(ast.unparse(test.left), ast.unparse(test.comparators[0]), entry_point)


def doctest_examples(source: str, entry_point: str) -> tuple[task_lib.Example, ...]:
  """`>>> entry_point(...)` examples with literal arguments and outputs in `source`."""
  try:
    parsed = doctest.DocTestParser().get_examples(source)
  except ValueError:
    return ()
  out = []
  for ex in parsed:
    # A docstring's closing quotes right after the last example end up in its `want`.
    want = ex.want.split('"""')[0].split("'''")[0]
    got = call_example(ex.source, want, entry_point)
    if got is not None:
      out.append(got)
  return tuple(out)


def function_signature(source: str, name: str) -> Optional[tuple[str, int]]:
  """`(signature without def, line index of the def)` of top-level function `name`, or None."""
  try:
    tree = ast.parse(source)
  except SyntaxError:
    return None
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name == name:
      returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
      first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
      return f"{name}({ast.unparse(node.args)}){returns}", first
  return None
