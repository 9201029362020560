"""HumanEval-style `check(candidate)` scripts split into I/O tests and a remaining script.

A script test runs trusted test code against a proxy of the candidate and
reports one bit. Most HumanEval assertions are plain calls with literal
arguments compared with a literal, `assert candidate(1, 2) == 3`: such an
assertion is an I/O test, whose value the sandbox reports and the trusted
parent compares, with Python's `==` as the assertion would (`IOTest.equality
= "python"`). `split_check` parses the script with `ast`, turns every
top-level statement of `check`'s body of one of the forms

  assert candidate(ARGS) == EXPECTED[, message]
  assert EXPECTED == candidate(ARGS)[, message]
  assert candidate(ARGS) is True / is False / is None

(ARGS positional literals, EXPECTED a literal, both read by
`ast.literal_eval`) into an `IOTest`, and keeps everything else as the script
test (None when nothing is left but the definition of `check` with an empty
body, and module-level assignments such as HumanEval's `METADATA`).

Order changes nothing for a correct candidate; for a wrong one the I/O tests
give partial credit where the script stopped at its first failed assertion.
"""

import ast
import functools
from typing import Optional

from agentic_grpo import sandbox
from agentic_grpo.tasks import python_ast


def _literal(node: ast.expr):
  """`ast.literal_eval` of `node`; raises ValueError if it is not a plain literal."""
  try:
    return python_ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
    raise ValueError(str(e)) from e


def _call_args(node: ast.expr, candidate: str) -> Optional[tuple]:
  """The literal positional arguments of `candidate(...)`, or None for any other expression."""
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
          node.func.id == candidate and not node.keywords):
    return None
  if any(isinstance(a, ast.Starred) for a in node.args):
    return None
  try:
    return tuple(_literal(a) for a in node.args)
  except ValueError:
    return None


def _as_io_test(stmt: ast.stmt, candidate: str) -> Optional[sandbox.IOTest]:
  """The I/O test an assertion statement stands for, or None."""
  if not isinstance(stmt, ast.Assert) or not isinstance(stmt.test, ast.Compare):
    return None
  cmp = stmt.test
  if len(cmp.ops) != 1:
    return None
  left, op, right = cmp.left, cmp.ops[0], cmp.comparators[0]
  if isinstance(op, ast.Is):
    args = _call_args(left, candidate)
    if (args is None or not isinstance(right, ast.Constant) or
        right.value not in (True, False, None) or not isinstance(right.value, (bool, type(None)))):
      return None
    return _make(args, right.value, "strict")  # `is True` is type-strict, like values_equal.
  if not isinstance(op, ast.Eq):
    return None
  args, other = _call_args(left, candidate), right
  if args is None:
    args, other = _call_args(right, candidate), left
  if args is None:
    return None
  try:
    expected = _literal(other)
  except ValueError:
    return None
  return _make(args, expected, "python")


def _make(args, expected, equality) -> Optional[sandbox.IOTest]:
  try:
    return sandbox.IOTest(args, expected, equality)
  except ValueError:  # Not a plain literal (e.g. a float('nan') built some other way).
    return None


@functools.lru_cache(maxsize=4096)
def split_check(script: str, check_function: str = "check"
                ) -> tuple[tuple[sandbox.IOTest, ...], Optional[str]]:
  """Splits a `check(candidate)` script into I/O tests and the script left to run.

  Args:
    script: the test source (HumanEval's `test` field).
    check_function: the function that receives the candidate.

  Returns:
    (io_tests, rest): the converted assertions, in order, and the script
    without them (`ast.unparse`d), or None when the rest would test nothing.
    A script that does not parse, or has no `check_function(candidate)`,
    comes back unchanged with no I/O tests.
  """
  try:
    tree = python_ast.parse(script)
  except (SyntaxError, ValueError, MemoryError, RecursionError):
    return (), script
  check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and
                n.name == check_function), None)
  if check is None or len(check.args.args) != 1 or check.decorator_list:
    return (), script
  candidate = check.args.args[0].arg
  tests, kept = [], []
  for stmt in check.body:
    test = _as_io_test(stmt, candidate)
    if test is None:
      kept.append(stmt)
    else:
      tests.append(test)
  if not tests:
    return (), script
  meaningful = [s for s in kept if not (
      isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) or
      isinstance(s, ast.Pass) or
      isinstance(s, ast.Assert) and isinstance(s.test, ast.Constant) and s.test.value is True)]
  others = [n for n in tree.body if n is not check and not isinstance(n, (
      ast.Assign, ast.Import, ast.ImportFrom, ast.Expr))]
  if not meaningful and not others:
    return tuple(tests), None
  check.body = kept or [ast.Pass()]
  return tuple(tests), ast.unparse(tree)
