"""Code-stage outputs: the source a model's answer stands for, and the compact reference.

`parse_code` accepts the forms a model writes (an expression of the task's parameters, a module
defining the entry point, a HumanEval-style completion of the prompt) and returns runnable
source, or raises `episodes.ParseError`; `compact_reference` is the reference solution in the
shortest of those forms (the ideal output of the code and debug stages). Model outputs are
parsed through `python_ast`, whose compiler warnings about data are not shown.
"""

import ast
import re
from typing import Optional

from agentic_grpo.agent import episodes as episodes_lib
from agentic_grpo.tasks import python_ast
from agentic_grpo.tasks import task as task_lib

MAX_OUTPUT_CHARS = 20_000  # longer stage outputs are not parsed (reward 0)


def parse_code(body: str, task: task_lib.Task) -> str:
  """Runnable source for a code-stage output.

  A `stdio` task's output is a whole program (any source that parses). Otherwise, accepted
  forms: a one-line expression of the task's parameters (`sorted(x)`, wrapped into
  `def f(x): return sorted(x)`); a module defining `entry_point`; both prefixed with the task's
  `code_context`; or a continuation of a prompt that ends inside the entry point
  (HumanEval-style completion, prefixed with the prompt).

  Raises:
    episodes.ParseError: if the text is none of these.
  """
  stripped = body.strip()
  if not stripped:
    raise episodes_lib.ParseError("empty code")
  if len(body) > MAX_OUTPUT_CHARS:
    raise episodes_lib.ParseError(f"code longer than {MAX_OUTPUT_CHARS} characters")
  if task.kind == task_lib.STDIO:  # a whole program: any module that parses
    try:
      python_ast.parse(stripped)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
      raise episodes_lib.ParseError(f"program does not parse: {e}") from e
    return stripped + "\n"
  if "\n" not in stripped:
    try:
      python_ast.parse(stripped, mode="eval")
      params = ",".join(task.param_names)
      return f"{task.code_context}def {task.entry_point}({params}): return {stripped}\n"
    except (SyntaxError, ValueError, MemoryError, RecursionError):
      pass
  for prefix, text in ((task.code_context, stripped + "\n"), (task.prompt, body + "\n")):
    if prefix is task.prompt and f"def {task.entry_point}(" not in task.prompt:
      continue
    source = prefix + text
    try:
      tree = python_ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
      continue
    if any(isinstance(n, ast.FunctionDef) and n.name == task.entry_point for n in tree.body):
      return source
  raise episodes_lib.ParseError(
      f"neither an expression nor a definition of {task.entry_point!r}")


def compact_reference(task: task_lib.Task) -> Optional[str]:
  """`EXPR` of a one-line reference `def f(params): return EXPR`, else the full source (None
  without a reference solution)."""
  ref = task.reference_solution
  if ref is None:
    return None
  m = re.fullmatch(r"def\s+(\w+)\(([^)]*)\):\s*return\s+(.+?)\s*", ref)
  if m and m.group(1) == task.entry_point:
    params = tuple(p.strip() for p in m.group(2).split(",") if p.strip())
    if params == task.param_names and "\n" not in m.group(3):
      return m.group(3)
  return ref
