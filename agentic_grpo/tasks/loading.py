"""Shared pieces of the dataset loaders: row and record errors, JSONL reading, assert and doctest
parsing."""

import ast
import doctest
import gzip
import json
import zlib
from typing import Any, Callable, Iterator, Optional, Sequence

from absl import logging

from agentic_grpo import errors
from agentic_grpo.tasks import python_ast
from agentic_grpo.tasks import task as task_lib

ON_ERROR = ("skip", "raise")


class RowError(errors.InputError):
  """A malformed dataset row: names the file, the row (1-based line) and the field (an input
  mistake: `errors.InputError`, a ValueError)."""

  def __init__(self, path: str, row: int, field: Optional[str], message: str):
    self.path, self.row, self.field, self.message = path, row, field, message
    self.checked = False  # rejected by a load-time check (a reference failing its tests)
    where = f"{path}: row {row}" + (f", field {field!r}" if field else "")
    super().__init__(f"{where}: {message}")


class RecordError(errors.InputError):
  """A record of a lazily read data set (TFDS) that does not decode to a task: names the data
  set, the split and the record's index in it (an `errors.InputError`, a ValueError)."""

  def __init__(self, dataset: str, split: str, index: int, message: str):
    self.dataset, self.split, self.index = dataset, split, index
    super().__init__(f"data set {dataset!r}, split {split!r}, record {index}: {message}")


def check_on_error(on_error: str) -> None:
  if on_error not in ON_ERROR:
    raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")


def short_repr(value: Any, limit: int = 60) -> str:
  """`repr(value)` cut to `limit` characters; never raises (deep nesting, huge ints)."""
  try:
    text = repr(value)
  except Exception:  # pylint: disable=broad-except
    return f"<unprintable {type(value).__name__}>"
  return text if len(text) <= limit else text[:limit] + "..."


_BOM = b"\xef\xbb\xbf"


def _parse_line(path: str, row: int, line: bytes) -> Any:
  """One JSONL line to its value, or a `RowError` (bad UTF-8, bad JSON, absurd nesting)."""
  try:
    text = line.decode("utf-8")
  except UnicodeDecodeError as e:
    return RowError(path, row, None, f"not UTF-8 (byte {line[e.start]:#04x} at column "
                                     f"{e.start + 1})")
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    return RowError(path, row, None, f"not JSON ({e.msg} at column {e.colno})")
  except (ValueError, RecursionError, MemoryError) as e:  # huge integers, deep nesting
    return RowError(path, row, None, f"not readable JSON ({type(e).__name__}: "
                                     f"{short_repr(str(e), 80)})")


def read_jsonl(path: str) -> Iterator[tuple[int, Any]]:
  """Yields `(row, parsed JSON or RowError)` for every non-blank line (gzip by suffix).

  A UTF-8 byte-order mark opening the file (as some editors and Windows tools write) is
  dropped. A line that is not UTF-8 or not JSON (also: nested too deeply, or an integer too
  long to convert) yields a `RowError` instead of raising, so that the caller decides.
  Compressed data that cannot be read yields one `RowError` for the row it stopped at, and ends
  the file.

  Raises:
    OSError: if `path` cannot be opened.
  """
  path = str(path)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    row = 0
    try:
      for row, line in enumerate(f, start=1):
        if row == 1 and line.startswith(_BOM):
          line = line[len(_BOM):]
        if line.strip():
          yield row, _parse_line(path, row, line)
    except (OSError, EOFError, zlib.error) as e:  # a corrupt or truncated gzip stream
      yield row + 1, RowError(path, row + 1, None, f"unreadable data ({type(e).__name__}: {e})")


Check = Callable[[Sequence[task_lib.Task]], Sequence[Optional[str]]]


def load_rows(path: str, convert: Callable[[dict, int], task_lib.Task], on_error: str,
              errors: Optional[list[RowError]] = None, *, check: Optional[Check] = None,
              check_field: Optional[str] = None) -> list[task_lib.Task]:
  """Converts every row of a JSONL file with `convert(row_dict, row_number)`.

  `convert` raises `RowError` for a malformed row; any other exception from it is wrapped into
  one (field unknown). With `on_error="raise"` the first error propagates; with `"skip"` the
  row is logged, appended to `errors` (if given) and skipped: no malformed row, whatever its
  bytes, stops the load. A task whose `task_id` an earlier row already gave is a malformed row
  too (field `task_id`, naming the earlier row): the first one is kept. Then `check`, if given,
  sees all converted tasks at once (e.g. one sandbox pool call running every reference solution
  on its own tests) and returns a reason per task, or None: a task with a reason is a malformed
  row of field `check_field`.

  Raises:
    ValueError: for an unknown `on_error`.
    RowError: with `on_error="raise"`, for the first malformed row.
    OSError: if `path` cannot be opened.
  """
  check_on_error(on_error)
  tasks, rows, dropped = [], [], []
  first_row: dict[str, int] = {}

  def reject(err: RowError, cause: Optional[Exception], checked: bool = False) -> None:
    if on_error == "raise":
      raise err from cause
    err.checked = checked
    dropped.append(err)
    logging.warning("skipping malformed row: %s", err)
    if errors is not None:
      errors.append(err)

  for row, value in read_jsonl(path):
    try:
      if isinstance(value, RowError):
        raise value
      if not isinstance(value, dict):
        raise RowError(str(path), row, None, f"expected a JSON object, got {type(value).__name__}")
      task = convert(value, row)
      if task.task_id in first_row:
        raise RowError(str(path), row, "task_id", f"duplicate task id {task.task_id!r} (first "
                                                  f"at row {first_row[task.task_id]})")
      first_row[task.task_id] = row
      tasks.append(task)
      rows.append(row)
    except Exception as e:  # pylint: disable=broad-except
      err = e if isinstance(e, RowError) else RowError(
          str(path), row, None, f"{type(e).__name__}: {short_repr(str(e), 200)}")
      reject(err, None if err is e else e)
  if check is not None and tasks:
    reasons = list(check(tasks))
    if len(reasons) != len(tasks):
      raise RuntimeError(f"check returned {len(reasons)} reasons for {len(tasks)} tasks")
    kept = []
    for task, row, reason in zip(tasks, rows, reasons):
      if reason is None:
        kept.append(task)
      else:
        reject(RowError(str(path), row, check_field, reason), None, checked=True)
    tasks = kept
  if dropped:
    logging.warning("%s", load_summary(str(path), len(tasks), dropped))
  else:
    logging.info("%s", load_summary(str(path), len(tasks), dropped))
  return tasks


def load_summary(path: str, loaded: int, dropped: Sequence[RowError]) -> str:
  """One line saying how many rows of `path` were loaded and dropped, and why.

  Dropped rows are counted by cause: a reference solution failing its own tests (rows the load
  check rejected: `RowError.checked`), else the field that was malformed (`row` when no field
  is known); each cause names its first row and message. E.g. `p.jsonl: loaded 8 of 10 rows;
  dropped 2: 1 whose reference fails its own tests (field 'solutions'; first: row 3, ...), 1
  malformed (field 'input_output'; first: row 7, ...)`.

  Args:
    path: the file.
    loaded: tasks kept.
    dropped: the `RowError`s of the rows dropped.
  """
  causes: dict[tuple[bool, Optional[str]], list[RowError]] = {}
  for err in dropped:
    causes.setdefault((err.checked, err.field), []).append(err)
  total = loaded + len(dropped)
  line = f"{path}: loaded {loaded} of {total} row(s)"
  if not dropped:
    return line + "; dropped none"
  parts = []
  for (checked, field), errs in sorted(causes.items(), key=lambda kv: -len(kv[1])):
    what = "whose reference fails its own tests" if checked else "malformed"
    where = f"field {field!r}" if field else "the row"
    first = errs[0]
    message = first.message if len(first.message) <= 120 else first.message[:120] + "..."
    parts.append(f"{len(errs)} {what} ({where}; first: row {first.row}, {message})")
  return f"{line}; dropped {len(dropped)}: " + ", ".join(parts)


def require(d: dict, key: str, kind: type, path: str, row: int) -> Any:
  """`d[key]`, checked to be a `kind` (non-empty for str), or a `RowError` naming the field."""
  if key not in d:
    raise RowError(path, row, key, "missing")
  value = d[key]
  if not isinstance(value, kind) or (kind is str and not value.strip()):
    raise RowError(path, row, key, f"expected a non-empty {kind.__name__}, got "
                                   f"{short_repr(value)}")
  return value


def parse_source(source: str, path: str, row: int, field: str):
  """`python_ast.parse(source)`, or a `RowError` naming the field for any parser failure (syntax,
  null bytes, nesting or size limits)."""
  try:
    return python_ast.parse(source)
  except SyntaxError as e:
    raise RowError(path, row, field, f"does not parse: {e.msg} (line {e.lineno})") from e
  except Exception as e:  # pylint: disable=broad-except
    raise RowError(path, row, field, f"does not parse: {type(e).__name__}: "
                                     f"{short_repr(str(e), 80)}") from e


def call_example(call_src: str, expected_src: str, entry_point: str
                 ) -> Optional[task_lib.Example]:
  """`Example` of `entry_point(literal args)` with a literal expected value, else None."""
  try:
    call = python_ast.parse(call_src.strip(), mode="eval").body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id == entry_point and not call.keywords):
      return None
    args = tuple(python_ast.literal_eval(a) for a in call.args)
    expected = python_ast.literal_eval(expected_src.strip())
  except Exception:  # pylint: disable=broad-except
    return None
  return task_lib.Example(args, expected)


def assert_example(assert_src: str, entry_point: str) -> Optional[task_lib.Example]:
  """`Example` of an `assert entry_point(args) == expected` line, else None (never raises)."""
  try:
    node = python_ast.parse(assert_src.strip()).body
    if len(node) != 1 or not isinstance(node[0], ast.Assert):
      return None
    test = node[0].test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
      return None
    left, right = ast.unparse(test.left), ast.unparse(test.comparators[0])
  except Exception:  # pylint: disable=broad-except
    return None
  return call_example(left, right, entry_point)


def doctest_examples(source: str, entry_point: str) -> tuple[task_lib.Example, ...]:
  """`>>> entry_point(...)` examples with literal arguments and outputs in `source`."""
  try:
    parsed = doctest.DocTestParser().get_examples(source)
  except Exception:  # pylint: disable=broad-except
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
  """`(signature without def, line index of the def)` of top-level function `name`, or None
  (also when `source` does not parse, for any reason)."""
  try:
    tree = python_ast.parse(source)
    for node in tree.body:
      if isinstance(node, ast.FunctionDef) and node.name == name:
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        return f"{name}({ast.unparse(node.args)}){returns}", first
  except Exception:  # pylint: disable=broad-except
    return None
  return None
