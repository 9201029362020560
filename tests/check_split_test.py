"""check_split: HumanEval `check` assertions as I/O tests compared in the parent."""

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo import sandbox
from agentic_grpo.sandbox import check_split
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import humaneval


class SplitCheckTest(parameterized.TestCase):

  def test_every_form(self):
    script = '''
METADATA = {"author": "x"}

def check(candidate):
    # a comment
    assert candidate(1, 2) == 3
    assert [1, 2] == candidate([2, 1]), "message"
    assert candidate("a") is True
    assert candidate(()) is None
    assert True, "always"
'''
    tests, rest = check_split.split_check(script)
    self.assertIsNone(rest)
    self.assertEqual([(t.args, t.expected, t.equality) for t in tests], [
        ((1, 2), 3, "python"), (([2, 1],), [1, 2], "python"), (("a",), True, "strict"),
        (((),), None, "strict")])

  @parameterized.parameters(
      "assert abs(candidate(1.0) - 0.5) < 1e-6",
      "assert candidate(x) == 3",
      "assert candidate(1, key=2) == 3",
      "assert candidate(*[1]) == 1",
      "assert candidate(1) == 1 == 1",
      "assert candidate(1) != 2",
      "assert candidate(1) is 3",
      "for i in range(3):\n        assert candidate(i) == i",
  )
  def test_kept_as_script(self, line):
    script = f"def check(candidate):\n    assert candidate(0) == 0\n    {line}\n"
    tests, rest = check_split.split_check(script)
    self.assertLen(tests, 1)
    self.assertIsNotNone(rest)
    self.assertNotIn("candidate(0) == 0", rest)
    self.assertIn("def check(candidate)", rest)

  @parameterized.parameters("def check(:", "x = 1", "def check(a, b):\n  assert a(1) == 1")
  def test_unchanged(self, script):
    self.assertEqual(check_split.split_check(script), ((), script))

  def test_python_equality_is_compared_in_the_parent(self):
    tests = (sandbox.IOTest((2,), 1, "python"), sandbox.IOTest((2,), 1, "strict"))
    with sandbox.SandboxPool(1) as pool:
      [r] = pool.map([sandbox.Program("def f(x):\n  return x / 2", "f", io_tests=tests)])
    self.assertEqual(r.passed, (True, False))  # 1.0 == 1 in Python; not type-strict.
    with self.assertRaisesRegex(ValueError, "IOTest.equality"):
      sandbox.IOTest((1,), 1, "loose")


class HumanEvalConversionTest(absltest.TestCase):

  def test_all_problems(self):
    tasks = humaneval.load_humaneval()
    self.assertLen(tasks, 164)
    splits = [check_split.split_check(t.hidden_script) for t in tasks]
    full = sum(rest is None for _, rest in splits)
    partial = sum(bool(tests) and rest is not None for tests, rest in splits)
    self.assertEqual((full, partial), (143, 12))
    self.assertEqual(sum(len(tests) for tests, _ in splits), 1065)
    good = [execution.hidden_program(t, t.reference_solution) for t in tasks]
    wrong = [execution.hidden_program(t, t.prompt + "    return None\n") for t in tasks]
    with sandbox.SandboxPool(2) as pool:
      results = pool.map(good + wrong)
    good_r, wrong_r = results[:164], results[164:]
    failed = [t.task_id for t, r in zip(tasks, good_r, strict=True)
              if r.verdict != sandbox.Verdict.PASSED]
    self.assertEqual(failed, [])
    self.assertEqual(sum(r.verdict == sandbox.Verdict.PASSED for r in wrong_r), 0)
    full_programs = [p for p, (_, rest) in zip(good, splits, strict=True) if rest is None]
    self.assertTrue(all(p.script_test is None for p in full_programs))


if __name__ == "__main__":
  absltest.main()
