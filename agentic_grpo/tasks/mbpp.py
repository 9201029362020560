"""MBPP-format JSONL (Austin et al., 2021) as `Task`s.

A row has a description (`text`, or `prompt` in the sanitized release), a reference solution
`code`, an id `task_id`, assert-style tests `test_list` (optionally `challenge_test_list`,
`test_setup_code`, `test_imports`). The entry point is the function the first test calls.

Tests of the form `assert entry_point(literal args) == literal` become I/O `hidden_tests`, so
that their expected values never enter the sandboxed process; if any test has another form,
all tests run together as a `hidden_script` instead. The first `num_public` I/O tests are also
shown in the prompt as public examples (`ARGS->EXPECTED` lines, the format of the workflow's
tests stage):

    Write a function to find the shared elements from the given two lists.
    similar_elements(test_tup1, test_tup2)
    (3,4,5,6),(5,7,4,10)->(4,5)
"""

import ast
from typing import Optional

from agentic_grpo.tasks import loading
from agentic_grpo.tasks import python_ast
from agentic_grpo.tasks import task as task_lib


def _called_function(assert_src: str, defined: set[str]) -> Optional[str]:
  """Name of the first function called in an assert that the solution defines (never raises)."""
  try:
    tree = python_ast.parse(assert_src.strip())
  except Exception:  # pylint: disable=broad-except  (syntax, null bytes, nesting limits)
    return None
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined:
      return node.func.id
  return None


# Long by design: each MBPP field is checked in turn with an error naming file, row and field.
def row_to_task(row_dict: dict, row: int = 0, path: str = "<mbpp>", *, num_public: int = 1
                ) -> task_lib.Task:
  """One MBPP row to a `Task`.

  Raises:
    loading.RowError: naming the row and field for a missing or malformed field (any content:
      bad types, unparsable or absurdly nested code, huge values).
  """
  d = row_dict
  text_key = "text" if "text" in d else "prompt"
  text = loading.require(d, text_key, str, path, row)
  code = loading.require(d, "code", str, path, row)
  task_id = d.get("task_id")
  if (not isinstance(task_id, (int, str)) or isinstance(task_id, bool) or task_id == ""
      or isinstance(task_id, int) and abs(task_id) >= 10**18):
    raise loading.RowError(path, row, "task_id", f"expected an int or str, got "
                           f"{loading.short_repr(task_id, 40)}")
  tests = loading.require(d, "test_list", list, path, row)
  extra = d.get("challenge_test_list") or []
  if not isinstance(extra, list):
    raise loading.RowError(path, row, "challenge_test_list",
                           f"expected a list, got {loading.short_repr(extra, 40)}")
  setup = d.get("test_setup_code") or ""
  imports = d.get("test_imports") or []
  if not isinstance(setup, str):
    raise loading.RowError(path, row, "test_setup_code",
                           f"expected a str, got {loading.short_repr(setup, 40)}")
  if not isinstance(imports, list):
    raise loading.RowError(path, row, "test_imports",
                           f"expected a list, got {loading.short_repr(imports, 40)}")
  for field, values in (("test_list", tests), ("challenge_test_list", extra),
                        ("test_imports", imports)):
    for i, t in enumerate(values):
      if not isinstance(t, str) or not t.strip():
        raise loading.RowError(path, row, field,
                               f"item {i} is not a non-empty str: {loading.short_repr(t, 40)}")
  if not tests:
    raise loading.RowError(path, row, "test_list", "empty")
  tree = loading.parse_source(code, path, row, "code")
  defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
  entry_point = _called_function(tests[0], defined)
  if entry_point is None:
    raise loading.RowError(path, row, "test_list", f"item 0 calls no function that `code` "
                                                   f"defines: {loading.short_repr(tests[0])}")
  found = loading.function_signature(code, entry_point)
  if found is None:
    raise loading.RowError(path, row, "code", f"signature of {entry_point!r} cannot be read")
  signature = found[0]
  all_tests = list(tests) + list(extra)
  examples = [loading.assert_example(t, entry_point) for t in all_tests]
  if all(e is not None for e in examples):
    hidden, script = tuple(examples), None
    public = tuple(examples[:num_public])
  else:
    hidden = ()
    script = "\n".join(list(imports) + [setup] + all_tests) + "\n"
    public = tuple(e for e in examples[:num_public] if e is not None)
  prompt = "\n".join([text.strip(), signature] + [task_lib.format_example(e) for e in public])
  return task_lib.Task(
      task_id=f"mbpp/{task_id}",
      prompt=prompt,
      entry_point=entry_point,
      signature=signature,
      public_examples=public,
      hidden_tests=hidden,
      reference_solution=code,
      hidden_script=script,
      source="mbpp",
  )


def load_mbpp(path: str, *, on_error: str = "raise", num_public: int = 1,
              errors: Optional[list[loading.RowError]] = None,
              check: Optional[loading.Check] = None) -> list[task_lib.Task]:
  """MBPP-format JSONL (optionally .gz) as `Task`s, in file order.

  Args:
    path: the JSONL file.
    on_error: `"raise"` stops at the first malformed row; `"skip"` logs and skips it.
    num_public: how many of a row's I/O tests are shown in the prompt.
    errors: if given, skipped rows' `RowError`s are appended to it.
    check: optional reference check (`loading.load_rows`); a failing row's field is `code`.

  Raises:
    ValueError: for an unknown `on_error` or a negative `num_public`.
    loading.RowError: with `on_error="raise"`, naming the row and field of a malformed row.
  """
  if num_public < 0:
    raise ValueError(f"num_public must be >= 0, got {num_public}")
  return loading.load_rows(
      path, lambda d, row: row_to_task(d, row, str(path), num_public=num_public), on_error,
      errors, check=check, check_field="code")
