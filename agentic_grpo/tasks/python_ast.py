"""Thread-safe `ast.parse` and `ast.literal_eval`: every host-side Python parse goes through here.

CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 (of the versions this package supports, >= 3.11) keep
the recursion depth of the AST constructor (the C tree -> `ast` objects conversion behind
`ast.parse`, `ast.literal_eval` of text and `compile(..., ast.PyCF_ONLY_AST)`) in
per-interpreter state, not per call (since the depth check of gh-95185). When two threads
build trees at once (one paused mid-construction, e.g. while the garbage collector runs a
finalizer written in Python, which lets the GIL pass), a valid source fails with a spurious
`SystemError: AST constructor recursion depth mismatch (before=.., after=..)` (CPython issue
gh-106905; fixed by python/cpython#113035, released in 3.11.8, 3.12.2 and 3.13).

The host process parses from several threads at once: task records decoded in the data
pipeline's threads (grain), model outputs read by the stage parsers and reward functions (the
background final-reward thread, the sandbox pool's callers), check scripts split for the
sandbox. A spurious SystemError there passes for bad input: a valid row skipped, a correct
output scored as unparseable or counted as a reward error (a silently wrong reward). So every
`ast.parse` and `ast.literal_eval` of the package runs here, under one process-wide
re-entrant lock (a finalizer that parses in the thread holding it cannot deadlock);
`tests/python_ast_test.py` fails on any other call site. Parsing holds the GIL anyway, so the
lock costs no parallelism.

The lock orders only this package's parses: a library parsing in another thread at the same
time is not covered. The sandbox's child runner (`sandbox/runner.py`) compiles its jobs
with the builtins: it runs in its own single-threaded process, outside this lock's reach.
"""

import ast
import re
import threading
from typing import Any, Union
import warnings

# Re-entrant: a garbage-collector finalizer may parse in the thread that holds the lock.
_LOCK = threading.RLock()
# The file name text is parsed under unless the caller names one: everything this package
# parses is data (task rows, model outputs, check scripts, literals), and the compiler's
# SyntaxWarnings about it (`1if x`: "invalid decimal literal", `"\d"`: "invalid escape
# sequence") say nothing about the run, so they are not shown. The filter matches this name
# alone: a caller's own file names, and every other source of the process, still warn.
DATA_SOURCE = "<parsed data>"
warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(DATA_SOURCE) + r"\Z")


def parse(source: str, filename: str = DATA_SOURCE, mode: str = "exec") -> ast.AST:
  """`ast.parse(source, filename, mode)`, serialised with every other parse of the process.

  Args:
    source: Python source text.
    filename: the name compiler messages and warnings carry (warning filters match it);
      under the default, `DATA_SOURCE`, SyntaxWarnings are not shown.
    mode: `exec` (a module), `eval` (one expression) or `single` (one interactive statement).

  Returns:
    The tree: `ast.Module` for `exec`, `ast.Expression` for `eval`, `ast.Interactive`.

  Raises:
    Whatever `ast.parse` raises: SyntaxError (bad syntax, IndentationError, null bytes, an int
    literal over the digit limit, too many nested parentheses), ValueError (an unknown `mode`;
    null bytes on some versions), MemoryError or RecursionError (deeper nesting).
  """
  with _LOCK:
    return ast.parse(source, filename, mode)


def literal_eval(node_or_text: Union[str, ast.AST]) -> Any:
  """`ast.literal_eval(node_or_text)`, serialised with every other parse of the process.

  Text is parsed (mode `eval`, under `DATA_SOURCE`: no SyntaxWarnings) then evaluated, as
  `ast.literal_eval` does; an `ast` node is evaluated without parsing (it takes the lock all
  the same: one rule for every call site).

  Raises:
    Whatever `ast.literal_eval` raises: ValueError (not a literal: a call, a name, an
    operator other than a sign or a complex number's `+`/`-`), TypeError (an unhashable set
    element or dict key), and for text what `parse` raises.
  """
  with _LOCK:
    if isinstance(node_or_text, str):
      node_or_text = parse(node_or_text.lstrip(" \t"), DATA_SOURCE, "eval")  # re-entrant
    return ast.literal_eval(node_or_text)
