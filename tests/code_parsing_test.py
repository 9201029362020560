"""Tests for agentic_grpo.agent.code_parsing: the code parser and the compact reference."""

import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo.agent import code_parsing
from agentic_grpo.agent import episodes
from agentic_grpo.tasks import humaneval
from agentic_grpo.tasks import task as task_lib
from tests.fixtures import thread_stress


def _sort_task():
  """f(x) = sorted(x)."""
  ex = task_lib.Example
  return task_lib.Task(
      task_id="t/sort", prompt="f(x:list[int])->list[int]\n[3,1,2]->[1,2,3]\n[5]->[5]",
      entry_point="f", signature="f(x:list[int])->list[int]",
      public_examples=(ex(([3, 1, 2],), [1, 2, 3]), ex(([5],), [5])),
      hidden_tests=tuple(ex((x,), sorted(x)) for x in ([2, 1], [9, 8, 7], [], [4, 4, 1],
                                                          [1, 2], [6, 0, 6, 1], [7], [3, 9, 2])),
      reference_solution="def f(x): return sorted(x)", source="test")


class ParseCodeTest(parameterized.TestCase):

  def test_compiler_warnings_on_model_output_are_not_shown(self):
    # `1if` draws "SyntaxWarning: invalid decimal literal"; turned into an error (`-W error`)
    # it would also make the expression unparseable. Other sources still warn.
    script = ("import ast, warnings\n"
              "from agentic_grpo.agent import code_parsing\n"
              "from agentic_grpo.tasks import task\n"
              "t = task.Task(task_id='t', prompt='f(x:int)->int', entry_point='f',\n"
              "              signature='f(x:int)->int', public_examples=(),\n"
              "              hidden_tests=(task.Example((1,), 1),))\n"
              "print(code_parsing.parse_code('1if x else 0', t), end='')\n"
              "try:\n"
              "  ast.parse('1if x else 0')\n"
              "except SyntaxError:\n"
              "  print('elsewhere: error')\n")
    out = subprocess.run([sys.executable, "-W", "error::SyntaxWarning", "-c", script],
                         capture_output=True, text=True, check=True)
    self.assertEqual(out.stdout, "def f(x): return 1if x else 0\nelsewhere: error\n")

  def test_forms(self):
    task = _sort_task()
    self.assertEqual(code_parsing.parse_code(" sorted(x) ", task), "def f(x): return sorted(x)\n")
    src = code_parsing.parse_code("def f(x):\n  return x", task)
    self.assertIn("def f(x):", src)
    he = humaneval.load_humaneval()[0]
    completion = code_parsing.parse_code("    return False\n", he)
    self.assertTrue(completion.startswith(he.prompt))
    full = code_parsing.parse_code("def has_close_elements(numbers, threshold):\n  return 1", he)
    self.assertTrue(full.startswith("from typing import List"))

  @parameterized.parameters("", "   ", "def g(x): return x", "sorted(x", "import os",
                            "(" * 300 + ")" * 300 + "x" * 0 + "+")
  def test_rejects(self, body):
    with self.assertRaises(episodes.ParseError):
      code_parsing.parse_code(body, _sort_task())

  def test_parses_in_threads(self):
    # Reward functions parse model outputs in several threads at once (the background
    # final-reward thread, the sandbox pool's callers): a spurious SystemError of concurrent AST
    # construction (CPython gh-106905) would score a valid output as unparseable.
    task = _sort_task()
    module = "def f(x):\n" + "".join(f"  y{i} = [x, ({i}, [len(x) + {i}])]\n"
                                     for i in range(30)) + "  return sorted(x)\n"
    expression = "sorted([v for v in x if v > 0] + [v for v in x if v <= 0])"
    want = code_parsing.parse_code(module, task), code_parsing.parse_code(expression, task)
    self.assertEqual(want[1], f"def f(x): return {expression}\n")

    def call():
      return (code_parsing.parse_code(module, task),
              code_parsing.parse_code(expression, task)) == want

    self.assertEqual(thread_stress.count_failures(call), 0)


class CompactReferenceTest(absltest.TestCase):

  def test_compact_reference(self):
    self.assertEqual(code_parsing.compact_reference(_sort_task()), "sorted(x)")


if __name__ == "__main__":
  absltest.main()
