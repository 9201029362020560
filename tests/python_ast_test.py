"""Tests for agentic_grpo.tasks.python_ast, and that the package parses only through it.

The package rule (read from the source with `ast`, like tests/import_rules_test.py): no module
but `tasks/python_ast.py` names `ast.parse` or `ast.literal_eval` (called or not, under any
alias of `ast`, or imported `from ast`), nor `ast.PyCF_ONLY_AST` (`compile` building a tree).
The sandbox's child runner is exempt: it runs in its own single-threaded process and never
imports the package.
"""

import ast
import pathlib
import subprocess
import sys
import threading

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo.tasks import python_ast
from tests.fixtures import thread_stress

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentic_grpo"
ALLOWED = ("tasks/python_ast.py", "sandbox/runner.py")
_GUARDED = frozenset({"parse", "literal_eval", "PyCF_ONLY_AST"})


def unguarded_uses(source: str) -> list[str]:
  """`line: what` for each use of a guarded name of `ast` in `source` (module docstring)."""
  tree = ast.parse(source)
  aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names if a.name == "ast"}
  out = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and node.attr in _GUARDED
        and isinstance(node.value, ast.Name) and node.value.id in aliases):
      out.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    elif isinstance(node, ast.ImportFrom) and node.module == "ast" and node.level == 0:
      out.extend(f"{node.lineno}: from ast import {a.name}" for a in node.names
                 if a.name in _GUARDED or a.name == "*")
  return out


class PackageRuleTest(parameterized.TestCase):

  def test_package_parses_only_through_python_ast(self):
    sources = sorted(PACKAGE.rglob("*.py"))
    self.assertGreater(len(sources), 50)
    found = []
    for path in sources:
      rel = path.relative_to(PACKAGE).as_posix()
      if rel not in ALLOWED:
        found.extend(f"{rel}:{use}" for use in unguarded_uses(path.read_text()))
    self.assertEmpty(found, "parse through agentic_grpo.tasks.python_ast")

  def test_the_wrapper_itself_is_seen(self):
    uses = unguarded_uses((PACKAGE / "tasks" / "python_ast.py").read_text())
    self.assertLen([u for u in uses if u.endswith("ast.parse")], 1)
    self.assertLen([u for u in uses if u.endswith("ast.literal_eval")], 1)

  @parameterized.parameters(
      ("import ast\nast.parse(s)\n", "2: ast.parse"),
      ("import ast\nx = ast.literal_eval\n", "2: ast.literal_eval"),
      ("import ast as a\ndef f(s):\n  return a.parse(s, mode='eval')\n", "3: a.parse"),
      ("from ast import literal_eval\n", "1: from ast import literal_eval"),
      ("from ast import *\n", "1: from ast import *"),
      ("import ast\ncompile(s, 'f', 'exec', ast.PyCF_ONLY_AST)\n", "2: ast.PyCF_ONLY_AST"),
  )
  def test_a_violation_is_caught(self, source, want):
    self.assertEqual(unguarded_uses(source), [want])

  @parameterized.parameters(
      "import ast\nast.walk(t)\nast.unparse(t)\n",
      "from agentic_grpo.tasks import python_ast\npython_ast.parse(s)\n",
      "parse(s)\nliteral_eval(s)\n",  # not `ast`'s
      "import ast\ncompile(s, 'f', 'exec')\n",  # bytecode: builds no `ast` objects
  )
  def test_other_code_passes(self, source):
    self.assertEmpty(unguarded_uses(source))


class PythonAstTest(parameterized.TestCase):

  @parameterized.parameters(("x = [1, (2, 'a')]\ndef f(y):\n  return y\n", "exec"),
                            ("sorted(x)[0] + 1", "eval"), ("x += 1", "single"))
  def test_parse_is_ast_parse(self, source, mode):
    self.assertEqual(ast.dump(python_ast.parse(source, mode=mode)),
                     ast.dump(ast.parse(source, mode=mode)))

  def test_parse_errors_name_the_file(self):
    with self.assertRaises(SyntaxError) as e:
      python_ast.parse("def f(:\n", filename="<model output>")
    self.assertEqual(e.exception.filename, "<model output>")
    with self.assertRaises(ValueError):
      python_ast.parse("x", mode="module")

  def test_literal_eval_of_text_and_of_a_node(self):
    self.assertEqual(python_ast.literal_eval(" [1, (2, 'a'), {3: None}] "),
                     [1, (2, "a"), {3: None}])
    node = python_ast.parse("f(-1, {2}, b'x')", mode="eval").body
    self.assertEqual([python_ast.literal_eval(a) for a in node.args], [-1, {2}, b"x"])
    with self.assertRaises(ValueError):
      python_ast.literal_eval("__import__('os')")
    with self.assertRaises(TypeError):
      python_ast.literal_eval("{[1]}")
    with self.assertRaises(SyntaxError):
      python_ast.literal_eval("[1,")

  def test_compiler_warnings_about_data_are_not_shown(self):
    # `"\\d"` and `1if` draw SyntaxWarnings ("invalid escape sequence", "invalid decimal
    # literal"); turned into errors (`-W error`) they would make the data unparseable. A
    # caller's own file name, and other code of the process, still warn.
    script = ("import ast\n"
              "from agentic_grpo.tasks import python_ast, task\n"
              "print(python_ast.literal_eval('\"\\\\d\"'), task.parse_value(' \"\\\\d\"'))\n"
              "print(type(python_ast.parse('1if x else 0', mode='eval').body).__name__)\n"
              "for parse in (lambda s: python_ast.parse(s, filename='<mine>'), ast.parse):\n"
              "  try:\n"
              "    parse('1if x else 0')\n"
              "  except SyntaxError:\n"
              "    print('warned')\n")
    out = subprocess.run([sys.executable, "-W", "error::SyntaxWarning", "-c", script],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    self.assertEqual(out.stdout, "\\d \\d\nIfExp\nwarned\nwarned\n")

  def test_parses_wait_for_each_other_and_the_lock_is_reentrant(self):
    done = threading.Event()

    def other():
      python_ast.parse("x = 1")
      done.set()

    with python_ast._LOCK:  # pylint: disable=protected-access
      thread = threading.Thread(target=other)
      thread.start()
      self.assertFalse(done.wait(0.2))  # another thread's parse waits ...
      self.assertEqual(python_ast.literal_eval("(1,)"), (1,))  # ... this thread's does not.
    thread.join(10)
    self.assertTrue(done.is_set())

  def test_parses_in_threads(self):
    source = "def f(x):\n" + "".join(f"  y{i} = [x, ({i}, [x + {i}])]\n" for i in range(40))
    want = ast.dump(python_ast.parse(source))

    def call():
      return (ast.dump(python_ast.parse(source)) == want
              and python_ast.literal_eval("[(1, 'a'), {2: (3.5, None)}]")[1][2][0] == 3.5)

    self.assertEqual(thread_stress.count_failures(call), 0)


if __name__ == "__main__":
  absltest.main()
