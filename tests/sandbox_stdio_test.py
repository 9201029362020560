"""The stdin/stdout judge: verdicts, adversarial programs, comparison, limits."""

import marshal
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo import sandbox as sb
from agentic_grpo.sandbox import runner
from agentic_grpo.sandbox import stdio

V = stdio.StdioVerdict
_SECRET = "expected-7f3a91"
_TESTS = (stdio.StdioTest("1 2\n", "3\n"), stdio.StdioTest("5 7\n", _SECRET + "\n"))
# Each program, run on _TESTS, and the verdict of its first test.
_ADVERSARIAL = {
    "correct": ("a, b = map(int, input().split())\nprint(a + b)", V.PASSED),
    "wrong_answer": ("print(0)", V.WRONG_ANSWER),
    "timeout_cpu": ("while True:\n  pass", V.TIMEOUT),
    "timeout_sleep": ("import time\ntime.sleep(60)", V.TIMEOUT),
    "memory": ("x = bytearray(2 * 10**9)", V.MEMORY_LIMIT),
    "runtime_error": ("raise ValueError('boom')", V.RUNTIME_ERROR),
    "exit_nonzero": ("import sys\nsys.exit(3)", V.RUNTIME_ERROR),
    "syntax_error": ("def (:", V.RUNTIME_ERROR),
    "output_flood": ("import sys\nwhile True:\n  sys.stdout.write('x' * 65536)", V.OUTPUT_LIMIT),
    "stderr_flood": ("import sys\nwhile True:\n  sys.stderr.write('x' * 65536)", V.OUTPUT_LIMIT),
    # Looks for the expected output everywhere it could be: files, environment,
    # the parent's memory and command line, its own stdin.
    "read_expected": ('''
import os, sys
found = []
def look(fn):
  try:
    text = fn()
    if isinstance(text, bytes):
      text = text.decode("utf-8", "replace")
    if "expected-" in str(text):
      found.append(str(text)[:40])
  except Exception:
    pass
look(lambda: sys.stdin.read())
look(lambda: repr(dict(os.environ)))
for pid in ("1", "2", str(os.getppid()), "self"):
  for name in ("cmdline", "environ", "mem", "maps"):
    look(lambda: open("/proc/%s/%s" % (pid, name), "rb").read(1 << 20))
for root in ("/", "/tmp", "..", "/proc"):
  try:
    for r, _, files in os.walk(root):
      for f in files[:50]:
        look(lambda: open(os.path.join(r, f), "rb").read(1 << 16))
  except Exception:
    pass
print(found[0] if found else "nothing")
''', V.WRONG_ANSWER),
}


# Programs a first-time user's model (or data set) writes, on _SUM_TESTS: (source, the first
# test's verdict, or a tuple of the verdicts it may get).
_SUM_TESTS = (stdio.StdioTest("3\n", "6\n"), stdio.StdioTest("4", "10\r\n"))  # no final newline
_TRIANGLE = "n * (n + 1) // 2"
_FORMS = {
    "reads_past_eof": ("a = input()\nb = input()\nprint(a)", V.RUNTIME_ERROR),
    "no_trailing_newline": (f"import sys\nn = int(input())\nsys.stdout.write(str({_TRIANGLE}))",
                            V.PASSED),
    "stderr_only": (f"import sys\nn = int(input())\nprint({_TRIANGLE}, file=sys.stderr)",
                    V.WRONG_ANSWER),
    "stderr_debugging": (f"import sys\nn = int(input())\nprint('dbg', list(range(2000)), "
                         f"file=sys.stderr)\nprint({_TRIANGLE})", V.PASSED),
    "fork": (f"import os\nn = int(input())\npid = os.fork()\nif pid == 0:\n  os._exit(0)\n"
             f"os.waitpid(pid, 0)\nprint({_TRIANGLE})", V.PASSED),
    # The competitive-programming idiom for deep recursion: a thread with a big stack.
    "thread_big_stack": (f"import sys, threading\nthreading.stack_size(2**26)\n"
                         f"sys.setrecursionlimit(10**6)\ndef f(k):\n  return 0 if k == 0 else "
                         f"1 + f(k - 1)\ndef main():\n  n = int(input())\n  f(10**5)\n"
                         f"  print({_TRIANGLE})\nt = threading.Thread(target=main)\nt.start()\n"
                         f"t.join()", V.PASSED),
    "deep_recursion": (f"import sys\nsys.setrecursionlimit(10**6)\ndef f(k):\n  return 0 if "
                       f"k == 0 else 1 + f(k - 1)\nn = int(input())\nf(2 * 10**5)\n"
                       f"print({_TRIANGLE})", V.PASSED),
    # Python frames live on the heap: it ends at the CPU or memory cap, or overflows the stack.
    "runaway_recursion": ("import sys\nsys.setrecursionlimit(10**9)\ndef f(k):\n  return "
                          "f(k + 1) + 1\nf(0)", (V.TIMEOUT, V.MEMORY_LIMIT, V.RUNTIME_ERROR)),
    "reads_proc": (f"n = int(input())\nopen('/proc/self/status').read()\nprint({_TRIANGLE})",
                   V.RUNTIME_ERROR),
    "binary_stdin": (f"import sys\nn = int(sys.stdin.buffer.read().split()[0])\n"
                     f"print({_TRIANGLE})", V.PASSED),
    # The whole time limit on the first test, then the others pass: each test has its own.
    "slow_first_test": (f"n = int(input())\nif n == 3:\n  while True: pass\nprint({_TRIANGLE})",
                        V.TIMEOUT),
}


class StdioJudgeTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sb.SandboxPool(2)

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def test_adversarial_verdict_table(self):
    names = list(_ADVERSARIAL)
    programs = [stdio.StdioProgram(_ADVERSARIAL[n][0], _TESTS, time_seconds=1.0,
                                   memory_bytes=256 * 2**20, output_bytes=2**20)
                for n in names]
    results = self.pool.map(programs)  # One pool call for every program and test.
    table = {n: r.verdicts[0] for n, r in zip(names, results, strict=True)}
    self.assertEqual(table, {n: _ADVERSARIAL[n][1] for n in names})
    for n, r in zip(names, results, strict=True):
      self.assertIsInstance(r, stdio.StdioResult)
      self.assertLen(r.verdicts, 2)
      if n != "correct":  # The second test's expected output is the secret.
        self.assertNotEqual(r.verdicts[1], V.PASSED, n)
    correct = results[names.index("correct")]
    self.assertEqual(correct.verdicts, (V.PASSED, V.WRONG_ANSWER))  # 12 != the secret.
    self.assertEqual(correct.num_passed, 1)
    self.assertEqual(correct.verdict, V.WRONG_ANSWER)
    self.assertIn("boom", results[names.index("runtime_error")].error)
    self.assertIn("SystemExit", results[names.index("exit_nonzero")].error)
    self.assertIn("SyntaxError", results[names.index("syntax_error")].error)

  def test_program_forms_verdict_table(self):
    names = list(_FORMS)
    results = self.pool.map([stdio.StdioProgram(_FORMS[n][0], _SUM_TESTS, time_seconds=1.0)
                             for n in names])
    for n, r in zip(names, results, strict=True):
      want = _FORMS[n][1]
      self.assertIn(r.verdicts[0], want if isinstance(want, tuple) else (want,), n)
    by_name = dict(zip(names, results, strict=True))
    self.assertEqual(by_name["slow_first_test"].verdicts, (V.TIMEOUT, V.PASSED))
    self.assertIn("/proc", by_name["reads_proc"].error)
    self.assertIn("EOFError", by_name["reads_past_eof"].error)

  def test_unicode_output(self):
    [r] = self.pool.map([stdio.StdioProgram("print('héllo, 世界')",
                                            (stdio.StdioTest("", "héllo,  世界\n"),))])
    self.assertEqual(r.verdict, V.PASSED)

  def test_stdin_forms_and_exit_zero(self):
    tests = (stdio.StdioTest(b"3\n1 2 3\n", "6"), stdio.StdioTest("2\n10 20\n", "30"))
    sources = [
        "n = int(input())\nprint(sum(map(int, input().split())))",
        "import sys\ndata = sys.stdin.buffer.read().split()\nprint(sum(map(int, data[1:])))",
        "data = open(0).read().split()\nprint(sum(map(int, data[1:])))",
        "import sys\nprint(sum(map(int, sys.stdin.read().split()[1:])))\nsys.exit(0)",
    ]
    results = self.pool.map([stdio.StdioProgram(s, tests) for s in sources])
    for s, r in zip(sources, results, strict=True):
      self.assertEqual(r.verdicts, (V.PASSED, V.PASSED), (s, r.error))

  def test_tests_do_not_share_files(self):
    source = ("import os\nprint('seen' if os.path.exists('state') else 'fresh')\n"
              "open('state', 'w').write('x')")
    tests = (stdio.StdioTest("", "fresh"),) * 3
    [r] = self.pool.map([stdio.StdioProgram(source, tests)])
    self.assertEqual(r.verdicts, (V.PASSED,) * 3)

  def test_stop_on_error_skips_the_rest(self):
    source = "x = int(input())\nprint(1 // x)"
    tests = (stdio.StdioTest("1", "1"), stdio.StdioTest("0", "0"), stdio.StdioTest("1", "1"))
    stop, go_on = self.pool.map([stdio.StdioProgram(source, tests, stop_on_error=True),
                                 stdio.StdioProgram(source, tests)])
    self.assertEqual(stop.verdicts, (V.PASSED, V.RUNTIME_ERROR, V.SKIPPED))
    self.assertEqual(go_on.verdicts, (V.PASSED, V.RUNTIME_ERROR, V.PASSED))
    self.assertEqual(go_on.num_passed, 2)

  def test_float_tolerance(self):
    tests = (stdio.StdioTest("", "0.3333333"),)
    source = "print(1 / 3)"
    exact, tolerant = self.pool.map([
        stdio.StdioProgram(source, tests),
        stdio.StdioProgram(source, tests, abs_tol=1e-6, rel_tol=1e-6)])
    self.assertEqual(exact.verdict, V.WRONG_ANSWER)
    self.assertEqual(tolerant.verdict, V.PASSED)


class LoopingCostTest(absltest.TestCase):
  """What a program that never ends costs on many tests: about one time limit, not one per
  test (a stdio job stops at its first error or at its budget; a `Program` shares one process
  and one deadline among its tests)."""

  N = 40  # each test's own deadline alone: N * (2 * 0.1 + 1) = 48 s of wall clock

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sb.SandboxPool(1, sb.Limits(cpu_seconds=1.0, wall_seconds=1.2))
    cls.pool.start()

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def _judge(self, program):
    start = time.monotonic()
    [result] = self.pool.map([program])
    return result, time.monotonic() - start

  def test_stop_on_error_ends_the_job_at_the_first_timeout(self):
    tests = (stdio.StdioTest("1", "1"),) * self.N
    r, wall = self._judge(stdio.StdioProgram("while True:\n  pass", tests, time_seconds=0.1,
                                             stop_on_error=True))
    self.assertEqual(r.verdicts, (V.TIMEOUT,) + (V.SKIPPED,) * (self.N - 1))
    self.assertLess(wall, 8.0)

  def test_budget_bounds_the_job_and_counts_tests_not_run_as_failed(self):
    source = "x = int(input())\nwhile x:\n  pass\nprint(x)"
    tests = (stdio.StdioTest("0", "0"),) + (stdio.StdioTest("1", "1"),) * self.N
    r, wall = self._judge(stdio.StdioProgram(source, tests, time_seconds=0.1,
                                             budget_seconds=2.5))
    self.assertEqual(r.verdicts[0], V.PASSED)
    self.assertEqual(r.verdicts[1], V.TIMEOUT)
    self.assertEqual(r.num_passed, 1)
    self.assertEqual(r.verdicts[-1], V.SKIPPED)
    self.assertGreaterEqual(r.verdicts.count(V.SKIPPED), self.N - 3)
    self.assertLess(wall, 9.0)

  def test_budget_leaves_a_fast_program_alone(self):
    tests = tuple(stdio.StdioTest(f"{i}", f"{i}") for i in range(10))
    r, _ = self._judge(stdio.StdioProgram("print(input())", tests, budget_seconds=30.0))
    self.assertEqual(r.verdicts, (V.PASSED,) * 10)

  def test_function_program_shares_one_deadline(self):
    io_tests = tuple(sb.IOTest((i,), i) for i in range(200))
    r, wall = self._judge(sb.Program("def f(x):\n  while True:\n    pass", "f",
                                     io_tests=io_tests))
    self.assertEqual(r.verdict, sb.Verdict.TIMEOUT)
    self.assertEqual(r.num_passed, 0)
    self.assertLess(wall, 8.0)

  def test_a_test_cut_by_the_budget_says_so(self):
    program = stdio.StdioProgram("print(1)", _TESTS, time_seconds=1.0, budget_seconds=1.0)
    self.assertEqual(program.budget, program.wall_seconds)  # at least one test's deadline
    self.assertEqual(stdio.job(program, -1, {}, b"n")["budget"], 3.0)
    cut = {"reason": runner.REASON_BUDGET, "status": 9, "cpu": 0.5, "maxrss": 0,
           "stdout": b"", "tail": b"", "report": b""}
    ok = dict(cut, reason=runner.REASON_NONE, status=0, stdout=b"3\n")
    r = stdio.assemble(program, marshal.dumps([ok, cut]), b"n", 3.0)
    self.assertEqual(r.verdicts, (V.PASSED, V.TIMEOUT))
    self.assertIn("budget of 3s for all 2 tests ran out", r.error)
    r = stdio.assemble(program, marshal.dumps([ok]), b"n", 3.0)
    self.assertEqual(r.verdicts, (V.PASSED, V.SKIPPED))
    self.assertEqual(r.num_passed, 1)


class OutputsMatchTest(parameterized.TestCase):

  @parameterized.parameters(
      (b"1 2\n3\n", "1 2 3", True),
      (b"  1\t2 \r\n3  \n\n", "1 2\n3\n", True),
      (b"1 2", "1 2 3", False),
      (b"1 2 3 4", "1 2 3", False),
      (b"YES", "yes", False),
      (b"", "", True),
      (b"\xff\xfe", "x", False),
      (b"1.0", "1", False),
  )
  def test_exact(self, actual, expected, match):
    self.assertEqual(stdio.outputs_match(actual, expected), match)

  @parameterized.parameters(
      (b"1.0000001", "1", 1e-6, 0.0, True),
      (b"1.001", "1", 1e-6, 0.0, False),
      (b"1000.1", "1000", 0.0, 1e-3, True),
      (b"nan", "nan", 1e-6, 0.0, True),  # Byte-equal tokens always match.
      (b"inf", "1e308", 1e-6, 1.0, False),
      (b"abc", "abd", 1.0, 1.0, False),
      (b"0.001", "1e-3", 1e-9, 0.0, True),
      (b"-0.0", "0", 1e-9, 0.0, True),
      (b"3.0", "3", 1e-6, 0.0, True),  # an integer-looking float: a number
      (b"5.", "5", 1e-6, 0.0, True),
      (b"1_000", "1000", 1e-6, 0.0, False),  # `float()` reads it; a judge does not
      (b" 1e400", "inf", 1.0, 1.0, False),
      (b"0x10", "16", 1e-6, 0.0, False),
      # Integers are exact under any tolerance: 10**18 + 1 is not 10**18.
      (b"1000000000000000001", "1000000000000000000", 0.0, 1e-6, False),
      (b"1000000001", "1000000000", 0.0, 1e-6, False),
      (b"+007", "7", 0.0, 1e-6, True),
      (b"-0", "0", 0.0, 1e-6, True),
      (b"7" * 5000, "7" * 5000, 0.0, 1e-6, True),  # past int()'s 4300 digits
      (b"7" * 4999 + b"6", "7" * 5000, 0.0, 1e-6, False),
  )
  def test_tolerant(self, actual, expected, abs_tol, rel_tol, match):
    self.assertEqual(stdio.outputs_match(actual, expected, abs_tol, rel_tol), match)

  @parameterized.parameters(
      (b"YES", "yes", True),
      (b"Yes\nNO", "yes no", True),
      (b"yes", "yess", False),
      (b"1E3", "1e3", True),
      (b"\xc3\x89", "\u00e9", False),  # ASCII case only, as the CodeContests judge
  )
  def test_ignore_case(self, actual, expected, match):
    self.assertEqual(stdio.outputs_match(actual, expected, ignore_case=True), match)
    self.assertEqual(stdio.outputs_match(actual, expected), actual == expected.encode())

  @parameterized.parameters(
      (b"1.5000000000", "1.5", True),
      (b"3.0", "3", True),
      (b"0.10", ".1", True),
      (b"1.5000000001", "1.5", False),  # by value, no tolerance
      (b"007", "7", True),
      (b"8", "7", False),
      (b"abc", "abd", False),
  )
  def test_numbers_by_value(self, actual, expected, match):
    self.assertEqual(stdio.outputs_match(actual, expected, numbers_by_value=True), match)


class ValidationTest(parameterized.TestCase):

  @parameterized.parameters(
      dict(tests=()),
      dict(tests=("1",)),
      dict(time_seconds=0),
      dict(time_seconds=float("inf")),
      dict(memory_bytes=2**20),
      dict(output_bytes=0),
      dict(abs_tol=-1.0),
      dict(budget_seconds=0),
      dict(budget_seconds=float("nan")),
      dict(budget_seconds=True),
      dict(ignore_case=1),
      dict(numbers_by_value="yes"),
  )
  def test_bad_program(self, **kwargs):
    args = dict(source="print(1)", tests=(stdio.StdioTest("", "1"),))
    args.update(kwargs)
    with self.assertRaisesRegex(ValueError, "StdioProgram"):
      stdio.StdioProgram(**args)

  def test_bad_limits(self):
    for bad in (0, -1.0, float("inf"), "60"):
      with self.assertRaisesRegex(ValueError, "Limits.stdio_budget_seconds"):
        sb.Limits(stdio_budget_seconds=bad)

  def test_bad_test(self):
    with self.assertRaisesRegex(ValueError, "StdioTest.expected"):
      stdio.StdioTest("1", b"1")
    with self.assertRaisesRegex(ValueError, "StdioTest.input"):
      stdio.StdioTest(1, "1")

  def test_job_holds_no_expected_output(self):
    program = stdio.StdioProgram("print(1)", _TESTS)
    job = stdio.job(program, -1, {}, b"nonce")
    self.assertNotIn(_SECRET, repr(job))
    self.assertEqual(job["inputs"], [b"1 2\n", b"5 7\n"])


if __name__ == "__main__":
  absltest.main()
