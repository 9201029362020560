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
import threading
from typing import Any, Union

# Re-entrant: a garbage-collector finalizer may parse in the thread that holds the lock.
_LOCK = threading.RLock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
  """`ast.parse(source, filename, mode)`, serialised with every other parse of the process.

  Args:
    source: Python source text.
    filename: the name compiler messages and warnings carry (warning filters match it).
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

  Text is parsed (mode `eval`) then evaluated; an `ast` node is evaluated without parsing
  (it takes the lock all the same: one rule for every call site).

  Raises:
    Whatever `ast.literal_eval` raises: ValueError (not a literal: a call, a name, an
    operator other than a sign or a complex number's `+`/`-`), TypeError (an unhashable set
    element or dict key), and for text what `parse` raises.
  """
  with _LOCK:
    return ast.literal_eval(node_or_text)
