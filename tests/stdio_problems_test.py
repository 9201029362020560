"""Tests for the `stdio` task source: the four layouts, auto-detection, malformed rows, the
reference check at load time, and stdio tasks through the workflow's stages and judge."""

import dataclasses
import json
import os
import time
import types

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo import config as config_lib
from agentic_grpo import sandbox
from agentic_grpo.agent import streams
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.agent import workflow_config
from agentic_grpo.sandbox import checked_sources
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import loading
from agentic_grpo.tasks import sources
from agentic_grpo.tasks import stdio_problems
from agentic_grpo.tasks import task as task_lib
from agentic_grpo.train import components

SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
MAX = "input()\nprint(max(map(int, input().split())))\n"
SQUARE = "n = int(input())\nprint(n * n)\n"


def codecontests_row(name="sum", solution=SUM, **extra):
  row = {"name": name, "description": "Print a + b.",
         "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
         "private_tests": {"input": ["5 7\n", "-1 1\n"], "output": ["12\n", "0\n"]},
         "generated_tests": {"input": ["100 1\n"], "output": ["101\n"]},
         "time_limit": {"seconds": 1, "nanos": 500000000}, "memory_limit_bytes": 268435456,
         "solutions": {"language": [2, 3], "solution": ["int main() {}", solution]},
         "difficulty": 7}
  row.update(extra)
  return row


def apps_row(problem_id=12, solution=MAX, **extra):
  row = {"problem_id": problem_id, "question": "Print the largest number.",
         "input_output": json.dumps({"inputs": ["3\n1 5 2\n", "1\n7\n", "2\n-3 -4\n"],
                                     "outputs": ["5\n", "7\n", "-3\n"]}),
         "solutions": json.dumps([solution]), "difficulty": "interview"}
  row.update(extra)
  return row


def taco_row(name="maxnum", **extra):
  row = apps_row(solution=MAX, time_limit="2 seconds", memory_limit="128 megabytes", name=name)
  del row["problem_id"]
  # Lists of lines, as some TACO/APPS rows store them.
  row["input_output"] = json.dumps({"inputs": [["3", "1 5 2"], ["1", "7"]],
                                    "outputs": [["5"], ["7"]]})
  row.update(extra)
  return row


def livecodebench_row(question_id="abc001_a", **extra):
  case = lambda i, o: {"input": i, "output": o, "testtype": "stdin"}
  row = {"question_id": question_id, "question_title": "Square",
         "question_content": "Print the square of n.",
         "public_test_cases": json.dumps([case("3\n", "9\n")]),
         "private_test_cases": json.dumps([case("4\n", "16\n"), case("12\n", "144\n")]),
         "difficulty": "easy", "platform": "atcoder"}
  row.update(extra)
  return row


class LayoutTest(parameterized.TestCase):

  def test_codecontests(self):
    t = stdio_problems.row_to_task(codecontests_row(), 1, "cc.jsonl", "codecontests")
    self.assertEqual(t.kind, task_lib.STDIO)
    self.assertEqual(t.task_id, "codecontests/sum")
    self.assertEqual(t.public_examples, (task_lib.Example(("1 2\n",), "3\n"),))
    self.assertEqual([e.expected for e in t.hidden_tests], ["12\n", "0\n", "101\n"])
    self.assertEqual(t.reference_solution, SUM)  # the Python 3 one (language 3)
    self.assertEqual(t.stdio, task_lib.StdioSpec(time_seconds=1.5, memory_bytes=268435456,
                                                 abs_tol=1e-5, ignore_case=True))
    self.assertEqual(t.difficulty, 7)
    self.assertIsNone(t.probe)  # no hypothesis reward for stdio tasks
    self.assertIn("Print a + b.", t.prompt)
    # The samples as a statement shows them: plain text, not Python literals.
    self.assertTrue(t.prompt.endswith("Print a + b.\n\nExample 1\nInput:\n1 2\nOutput:\n3\n"),
                    t.prompt)
    self.assertNotIn("'1 2\\n'", t.prompt)
    two = stdio_problems.format_sample(task_lib.Example(("3\n1 5 2",), "5"), 2)
    self.assertEqual(two, "Example 2\nInput:\n3\n1 5 2\nOutput:\n5")

  def test_apps(self):
    t = stdio_problems.row_to_task(apps_row(), 1, "apps.jsonl", "apps")
    self.assertEqual(t.task_id, "apps/12")
    self.assertLen(t.public_examples, 1)
    self.assertLen(t.hidden_tests, 3)
    # The run's sandbox limits; the APPS harness's float comparison (numpy.allclose).
    self.assertEqual(t.stdio, task_lib.StdioSpec(abs_tol=1e-8, rel_tol=1e-5))
    self.assertEqual(t.difficulty, 1)
    self.assertEqual(t.reference_solution, MAX)

  def test_taco(self):
    t = stdio_problems.row_to_task(taco_row(), 4, "taco.jsonl", "taco")
    self.assertEqual(t.task_id, "taco/maxnum")
    self.assertEqual(t.public_examples, (task_lib.Example(("3\n1 5 2\n",), "5"),))
    self.assertEqual(t.stdio, task_lib.StdioSpec(time_seconds=2.0, memory_bytes=128 * 2**20,
                                                 abs_tol=1e-8, rel_tol=1e-5))

  def test_livecodebench(self):
    t = stdio_problems.row_to_task(livecodebench_row(), 1, "lcb.jsonl", "livecodebench")
    self.assertEqual(t.task_id, "livecodebench/abc001_a")
    self.assertEqual(t.public_examples, (task_lib.Example(("3\n",), "9\n"),))
    self.assertLen(t.hidden_tests, 2)
    self.assertIsNone(t.reference_solution)
    self.assertEqual(t.difficulty, 0)
    self.assertEqual(t.stdio, task_lib.StdioSpec(numbers_by_value=True))

  def test_hidden_tests_default_to_the_public_ones(self):
    row = codecontests_row(private_tests=None, generated_tests={"input": [], "output": []})
    t = stdio_problems.row_to_task(row, 1, "cc.jsonl")
    self.assertEqual(t.hidden_tests, t.public_examples)

  def test_float_tolerance_and_small_memory(self):
    t = stdio_problems.row_to_task(codecontests_row(float_tolerance=1e-6, rel_tol=0.0,
                                                    memory_limit_bytes=1000), 1, "cc.jsonl")
    self.assertEqual((t.stdio.abs_tol, t.stdio.rel_tol), (1e-6, 0.0))
    self.assertEqual(t.stdio.memory_bytes, stdio_problems.MIN_MEMORY_BYTES)

  @parameterized.parameters(
      (codecontests_row(), "codecontests"), (apps_row(), "apps"), (taco_row(), "taco"),
      (livecodebench_row(), "livecodebench"), ({"prompt": "x"}, None))
  def test_detect_layout(self, row, want):
    self.assertEqual(stdio_problems.detect_layout(row), want)
    if want is not None:  # `auto` converts each row as its detected layout
      self.assertEqual(stdio_problems.row_to_task(row, 1, "x.jsonl"),
                       stdio_problems.row_to_task(row, 1, "x.jsonl", want))

  def test_json_round_trip(self):
    t = stdio_problems.row_to_task(codecontests_row(float_tolerance=1e-6), 1, "cc.jsonl")
    self.assertEqual(task_lib.task_from_json(task_lib.task_to_json(t)), t)
    function_task = json.loads(task_lib.task_to_json(task_lib.Task(
        "f/1", "p", "f", "f(x)", hidden_tests=(task_lib.Example((1,), 1),))))
    self.assertNotIn("stdio", function_task)  # function tasks' JSON is unchanged
    with self.assertRaisesRegex(ValueError, "field 'stdio'"):
      task_lib.task_from_dict(dict(json.loads(task_lib.task_to_json(t)),
                                   stdio={"time_seconds": -1}))

  def test_stdio_examples_must_be_strings(self):
    with self.assertRaisesRegex(ValueError, "stdio example"):
      task_lib.Task("s/1", "p", "main", "main()", hidden_tests=(task_lib.Example((1,), "1"),),
                    stdio=task_lib.StdioSpec())


class RowFormsTest(parameterized.TestCase):
  """Files and rows as real data sets write them: loaded, nothing lost."""

  def _write(self, data: bytes) -> str:
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "wb") as f:
      f.write(data)
    return path

  def test_bom_crlf_and_blank_lines_lose_no_row(self):
    rows = [json.dumps(codecontests_row(name=f"p{i}")).encode() for i in range(3)]
    data = b"\xef\xbb\xbf" + rows[0] + b"\r\n\r\n  \n" + rows[1] + b"\r\n\n" + rows[2]
    errors = []
    tasks = stdio_problems.load_stdio(self._write(data), on_error="skip", errors=errors)
    self.assertEqual([t.task_id for t in tasks], [f"codecontests/p{i}" for i in range(3)])
    self.assertEmpty(errors)

  def test_huge_row_loads(self):
    n = 2000  # a 10 MB row: many tests, each near a kilobyte
    big = codecontests_row(name="big", description="x" * 2**20, generated_tests={
        "input": [f"{i} {i}\n" + " " * 900 for i in range(n)],
        "output": [f"{2 * i}\n" for i in range(n)]})
    [task] = stdio_problems.load_stdio(self._write(json.dumps(big).encode() + b"\n"))
    self.assertLen(task.hidden_tests, 2 + n)

  @parameterized.parameters(
      (0, None), ({"seconds": 0, "nanos": 0}, None), (None, None),  # the run's default
      ({"seconds": 60, "nanos": 0}, 60.0), ("60 seconds", 60.0))
  def test_time_limit_edges(self, limit, want):
    task = stdio_problems.row_to_task(codecontests_row(time_limit=limit), 1, "cc.jsonl")
    self.assertEqual(task.stdio.time_seconds, want)
    if not isinstance(limit, dict):  # TACO writes numbers and strings
      taco = stdio_problems.row_to_task(taco_row(time_limit=limit), 1, "t.jsonl")
      self.assertEqual(taco.stdio.time_seconds, want)

  @parameterized.parameters(
      ("2000 ms", 2.0), ("2000 milliseconds", 2.0), ("1500 MS", 1.5), ("1.5 s", 1.5),
      ("1.5", 1.5), ("3 sec", 3.0), ("1 second", 1.0), (2000, 2.0), ("2000", 2.0),
      (100, 0.1), (99, None), (2, 2.0), (2.5, 2.5), ("None", None), ("null", None))
  def test_time_limit_units(self, limit, want):
    for row in (codecontests_row(time_limit=limit), taco_row(time_limit=limit)):
      if want is None and limit == 99:  # 99 s: no unit says ms, and it is over the cap
        with self.assertRaisesRegex(loading.RowError, "over the largest a problem may ask"):
          stdio_problems.row_to_task(row, 1, "p.jsonl")
        continue
      self.assertEqual(stdio_problems.row_to_task(row, 1, "p.jsonl").stdio.time_seconds, want)
    # CodeContests' own {seconds, nanos} is seconds, whatever the number.
    with self.assertRaisesRegex(loading.RowError, "over the largest"):
      stdio_problems.row_to_task(codecontests_row(time_limit={"seconds": 2000}), 1, "p.jsonl")

  @parameterized.parameters(
      ("256 megabytes", 2**28), ("256 MB", 2**28), ("262144 kb", 2**28), ("1 GB", 2**30),
      (512, 2**29), ("512", 2**29), ("None", None))
  def test_memory_limit_units(self, limit, want):
    task = stdio_problems.row_to_task(taco_row(memory_limit=limit), 1, "t.jsonl")
    self.assertEqual(task.stdio.memory_bytes, want)
    if isinstance(limit, str) and not limit.isdigit() and want is not None:  # a unit, not bytes
      cc = stdio_problems.row_to_task(codecontests_row(memory_limit_bytes=limit), 1, "c.jsonl")
      self.assertEqual(cc.stdio.memory_bytes, want)

  def test_unknown_unit_is_a_malformed_row(self):
    for limit in ("2 minutes", "2 ms s", "fast"):
      with self.assertRaisesRegex(loading.RowError, r"field 'time_limit': cannot read a limit "
                                                    r".*units: .*milliseconds"):
        stdio_problems.row_to_task(taco_row(time_limit=limit), 1, "t.jsonl")

  def test_spec_limits_are_bounded_for_every_source(self):
    # A Task JSON (the `jsonl` and `tfds` sources) asks through the same spec.
    for bad in (dict(time_seconds=61.0), dict(memory_bytes=task_lib.MAX_MEMORY_BYTES + 1)):
      with self.assertRaisesRegex(ValueError, "StdioSpec"):
        task_lib.StdioSpec(**bad)
    task_lib.StdioSpec(time_seconds=task_lib.MAX_TIME_SECONDS,
                       memory_bytes=task_lib.MAX_MEMORY_BYTES)


# Malformed rows: (row or raw bytes, the field the error names, a phrase of its message).
_BAD_ROWS = (
    ("no_tests", codecontests_row(public_tests={"input": [], "output": []},
                                  private_tests=None, generated_tests=None),
     "public_tests", "no tests"),
    ("not_json_tests", apps_row(input_output="{not json"), "input_output", "not JSON"),
    ("unequal_counts", codecontests_row(private_tests={"input": ["1 1\n"], "output": []}),
     "private_tests", "1 inputs but 0 outputs"),
    ("non_string_test", codecontests_row(public_tests={"input": [1], "output": ["1"]}),
     "public_tests", "not a str"),
    ("lone_surrogate", codecontests_row(public_tests={"input": ["\ud800"], "output": ["1"]}),
     "public_tests", "not UTF-8"),
    ("huge_output", codecontests_row(
        generated_tests={"input": ["1 1\n"], "output": ["2" * (2**20 + 1)]}),
     "generated_tests", "over the judge's output limit"),
    ("call_based", apps_row(input_output=json.dumps({"fn_name": "f", "inputs": [[1]],
                                                      "outputs": [1]})),
     "input_output", "call-based"),
    ("functional_lcb", livecodebench_row(public_test_cases=json.dumps(
        [{"input": "1", "output": "1", "testtype": "functional"}])),
     "public_test_cases", "functional"),
    ("bad_time_limit", taco_row(time_limit="soon"), "time_limit", "cannot read a limit"),
    ("bad_tolerance", codecontests_row(abs_tol=-1), "abs_tol", "number >= 0"),
    ("reference_does_not_parse", codecontests_row(solution="print(("), "solutions",
     "does not parse"),
    ("unknown_layout", {"statement": "x"}, None, "cannot detect the layout"),
    ("not_utf8", b"\xff\xfe{}\n", None, "not UTF-8"),
    # The first row's problem again: kept once, the repeat counted.
    ("duplicate_id", codecontests_row(name="good"), "task_id",
     r"duplicate task id 'codecontests/good' \(first at row 1\)"),
    ("empty_outputs", codecontests_row(name="quiet", public_tests={"input": ["1\n"],
                                                                   "output": [""]},
                                       private_tests={"input": ["2\n"], "output": [" \r\n"]},
                                       generated_tests=None),
     "public_tests", "every test expects an empty output"),
    ("absurd_time", codecontests_row(name="slow", time_limit={"seconds": 10**9, "nanos": 0}),
     "time_limit", "over the largest a problem may ask, 60"),
    ("absurd_memory", codecontests_row(name="fat", memory_limit_bytes=10**15),
     "memory_limit_bytes", "over the largest a problem may ask, 4294967296"),
    ("absurd_taco_memory", taco_row(name="fat", memory_limit="1000000000 megabytes"),
     "memory_limit", "over the largest a problem may ask, 4096"),
    ("truncated_last_line", json.dumps(codecontests_row(name="cut")).encode()[:-40], None,
     "not JSON"),
)


class MalformedRowsTest(parameterized.TestCase):

  def _write(self, rows) -> str:
    path = os.path.join(self.create_tempdir().full_path, "problems.jsonl")
    with open(path, "wb") as f:
      for row in rows:
        f.write(row + b"\n" * (not row.endswith(b"\n")) if isinstance(row, bytes)
                else json.dumps(row).encode() + b"\n")
    return path

  @parameterized.named_parameters(*_BAD_ROWS)
  def test_raise_names_file_row_and_field(self, bad, field, phrase):
    path = self._write([codecontests_row(name="good"), bad])
    with self.assertRaisesRegex(loading.RowError, phrase) as cm:
      stdio_problems.load_stdio(path, on_error="raise")
    self.assertEqual((cm.exception.path, cm.exception.row, cm.exception.field),
                     (path, 2, field))

  def test_skipped_and_counted(self):
    good = [codecontests_row(name="good"), apps_row(), taco_row(), livecodebench_row()]
    bad = [row for _, row, _, _ in _BAD_ROWS]
    path = self._write(good[:2] + bad + good[2:])
    errors = []
    tasks = stdio_problems.load_stdio(path, on_error="skip", errors=errors)
    self.assertEqual([t.task_id for t in tasks], ["codecontests/good", "apps/12", "taco/maxnum",
                                                  "livecodebench/abc001_a"])
    self.assertLen(errors, len(_BAD_ROWS))  # 13 rows skipped, each counted
    self.assertEqual([e.row for e in errors], list(range(3, 3 + len(_BAD_ROWS))))

  def test_layout_is_checked(self):
    with self.assertRaisesRegex(ValueError, "layout must be one of"):
      stdio_problems.load_stdio("x.jsonl", layout="codeforces")
    with self.assertRaisesRegex(ValueError, r"config\.task\.stdio_layout"):
      config_lib.TaskSection(source="stdio", path="x", stdio_layout="codeforces").validate("task")


# A float answer: the expected outputs print 1.5 where the reference prints 1.5000000000.
HALF = "a, b = map(int, input().split())\nprint(f'{a / b:.10f}')\n"


def float_rows():
  """The division problem in the CodeContests and the APPS layout, and an integer problem."""
  tests = {"input": ["3 2\n", "1 4\n", "10 5\n"], "output": ["1.5\n", "0.25\n", "2\n"]}
  cc = codecontests_row(name="half", solution=HALF,
                        public_tests={"input": tests["input"][:1], "output": tests["output"][:1]},
                        private_tests={"input": tests["input"][1:],
                                       "output": tests["output"][1:]},
                        generated_tests=None)
  apps = apps_row(problem_id="half2", solution=HALF, input_output=json.dumps(
      {"inputs": tests["input"], "outputs": tests["output"]}))
  return [cc, apps, codecontests_row(name="sum")]


class FloatAnswersTest(parameterized.TestCase):
  """Each layout judges outputs as its own harness does (`LAYOUT_COMPARISON`), overridable by
  `float_tolerance`; a row's own tolerance fields win."""

  def _match(self, task, actual, expected):
    s = task.stdio
    return sandbox.outputs_match(actual, expected, s.abs_tol, s.rel_tol,
                                 ignore_case=s.ignore_case, numbers_by_value=s.numbers_by_value)

  @parameterized.named_parameters(
      # name, row, "1.5000000000" ok, "1.5001" ok, "1.5000001" ok, "YES" for "yes" ok
      ("codecontests", codecontests_row(), True, False, True, True),
      ("apps", apps_row(), True, False, True, False),
      ("taco", taco_row(), True, False, True, False),
      ("livecodebench", livecodebench_row(), True, False, False, False),
  )
  def test_layout_comparison(self, row, padded, off_4, off_7, case):
    task = stdio_problems.row_to_task(row, 1, "p.jsonl")
    self.assertEqual(self._match(task, b"1.5000000000", "1.5"), padded)
    self.assertEqual(self._match(task, b"1.5001", "1.5"), off_4)
    self.assertEqual(self._match(task, b"1.5000001", "1.5"), off_7)
    self.assertEqual(self._match(task, b"YES", "yes"), case)
    self.assertFalse(self._match(task, b"1000001", "1000000"))  # integers always exactly
    self.assertFalse(self._match(task, b"1.6", "1.5"))

  def test_float_tolerance_overrides_the_layout_and_rows_win(self):
    exact = stdio_problems.row_to_task(apps_row(), 1, "p.jsonl", float_tolerance=0.0)
    self.assertEqual((exact.stdio.abs_tol, exact.stdio.rel_tol), (0.0, 0.0))
    self.assertFalse(self._match(exact, b"1.5000000000", "1.5"))
    loose = stdio_problems.row_to_task(codecontests_row(), 1, "p.jsonl", float_tolerance=0.01)
    self.assertEqual((loose.stdio.abs_tol, loose.stdio.rel_tol), (0.01, 0.01))
    self.assertTrue(loose.stdio.ignore_case)  # only the tolerance is replaced
    self.assertTrue(self._match(loose, b"1.505", "1.5"))
    own = stdio_problems.row_to_task(apps_row(abs_tol=0.1), 1, "p.jsonl", float_tolerance=0.0)
    self.assertEqual((own.stdio.abs_tol, own.stdio.rel_tol), (0.1, 0.0))
    self.assertEqual(stdio_problems.comparison("livecodebench", 1e-3),
                     dict(abs_tol=1e-3, rel_tol=1e-3, ignore_case=False, numbers_by_value=True))

  @parameterized.parameters(-1.0, float("nan"), float("inf"), True, "0.1")
  def test_bad_float_tolerance(self, bad):
    with self.assertRaisesRegex(ValueError, "float_tolerance"):
      stdio_problems.row_to_task(apps_row(), 1, "p.jsonl", float_tolerance=bad)
    with self.assertRaisesRegex(ValueError, "float_tolerance"):
      stdio_problems.load_stdio("unused.jsonl", float_tolerance=bad)

  def test_every_layout_has_a_comparison(self):
    self.assertEqual(set(stdio_problems.LAYOUT_COMPARISON), set(stdio_problems.LAYOUTS))
    for layout in stdio_problems.LAYOUTS:
      task_lib.StdioSpec(**stdio_problems.comparison(layout))  # valid judge settings


class LoadSummaryTest(absltest.TestCase):

  def test_summary_counts_dropped_rows_by_cause(self):
    rows = [codecontests_row(name=f"p{i}") for i in range(4)] + [
        apps_row(input_output=json.dumps({"fn_name": "f", "inputs": [], "outputs": []})),
        codecontests_row(name="bad", abs_tol=-1), apps_row(problem_id=7, solution="print(0)")]
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    wrong = lambda tasks: ["1/3 passed (wrong_answer)" if "print(0)" in t.reference_solution
                           else None for t in tasks]
    with self.assertLogs(level="WARNING") as logs:
      tasks = stdio_problems.load_stdio(path, on_error="skip", check=wrong)
    self.assertLen(tasks, 4)
    [line] = [m for m in logs.output if "loaded" in m]
    self.assertIn("loaded 4 of 7 row(s); dropped 3: ", line)
    self.assertIn("1 whose reference fails its own tests (field 'solutions'; first: row 7, "
                  "1/3 passed (wrong_answer))", line)
    self.assertIn("1 malformed (field 'input_output'; first: row 5, a call-based problem", line)
    self.assertIn("1 malformed (field 'abs_tol'; first: row 6,", line)

  def test_summary_of_a_clean_load(self):
    self.assertEqual(loading.load_summary("p.jsonl", 3, []), "p.jsonl: loaded 3 of 3 row(s); "
                     "dropped none")
    err = loading.RowError("p.jsonl", 2, None, "not JSON (x at column 1)")
    self.assertEqual(loading.load_summary("p.jsonl", 1, [err]),
                     "p.jsonl: loaded 1 of 2 row(s); dropped 1: 1 malformed (the row; first: "
                     "row 2, not JSON (x at column 1))")


class JudgedTest(absltest.TestCase):
  """Reference checks and the workflow's stages on stdio tasks, in a real sandbox."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2)

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def test_reference_check_skips_a_failing_reference(self):
    rows = [codecontests_row(name=f"p{i}") for i in range(6)]
    rows[2] = codecontests_row(name="wrong", solution="print(0)")
    rows[4] = apps_row(solution="while True: pass")  # times out: also a failure
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    errors = []
    check = lambda tasks: execution.reference_failures(tasks, self.pool)
    tasks = stdio_problems.load_stdio(path, on_error="skip", errors=errors, check=check)
    self.assertLen(tasks, 4)  # 2 of 6 skipped
    self.assertEqual([(e.row, e.field) for e in errors], [(3, "solutions"), (5, "solutions")])
    self.assertIn("1/4 passed (wrong_answer", str(errors[0]))  # `-1 1` gives 0
    self.assertIn("timeout", str(errors[1]))
    with self.assertRaisesRegex(loading.RowError, r"row 3, field 'solutions'"):
      stdio_problems.load_stdio(path, on_error="raise", check=check)

  def test_float_problems_are_kept_by_the_reference_check_and_judged_right(self):
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in float_rows())
    check = lambda tasks: execution.reference_failures(tasks, self.pool)
    tasks = stdio_problems.load_stdio(path, on_error="raise", check=check)
    self.assertEqual([t.task_id for t in tasks],
                     ["codecontests/half", "apps/half2", "codecontests/sum"])
    for task in tasks[:2]:
      programs = [execution.hidden_program(task, source, self.pool)
                  for source in (HALF, "a, b = map(int, input().split())\nprint(a / b)\n",
                                 "a, b = map(int, input().split())\nprint(a // b)\n")]
      verdicts = [r.verdict for r in self.pool.map(programs)]
      self.assertEqual(verdicts[:2], [sandbox.StdioVerdict.PASSED] * 2, task.task_id)
      self.assertEqual(verdicts[2], sandbox.StdioVerdict.WRONG_ANSWER, task.task_id)
    # With exact numbers the references "fail their own tests" and are dropped.
    errors = []
    exact = stdio_problems.load_stdio(path, on_error="skip", check=check, errors=errors,
                                      float_tolerance=0.0)
    self.assertEqual([t.task_id for t in exact], ["codecontests/sum"])
    self.assertEqual([(e.row, e.field) for e in errors], [(1, "solutions"), (2, "solutions")])

  def test_config_float_tolerance_reaches_the_source(self):
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in float_rows() + [
          codecontests_row(name=f"p{i}") for i in range(5)])
    load = lambda **kw: checked_sources.open_source(config_lib.TaskSection(
        source="stdio", path=path, heldout_fraction=0.5, **kw))
    kept = load()
    self.assertLen(kept.train + kept.heldout, 8)  # the layouts' own comparison
    exact = load(float_tolerance=0.0)  # exact numbers: the float references fail
    ids = {t.task_id for t in exact.train + exact.heldout}
    self.assertLen(ids, 6)
    self.assertFalse(ids & {"codecontests/half", "apps/half2"})
    with self.assertRaisesRegex(ValueError, "config.task.float_tolerance must be finite"):
      config_lib.TaskSection(float_tolerance=float("nan")).validate("task")

  def test_source_registry_splits_and_checks(self):
    rows = [codecontests_row(name=f"p{i}") for i in range(8)] + [
        codecontests_row(name="wrong", solution="print(1)")]
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    section = config_lib.TaskSection(source="stdio", path=path, heldout_fraction=0.5)
    section.validate("task")
    tasks = checked_sources.open_source(section)
    ids = {t.task_id for t in tasks.train + tasks.heldout}
    self.assertLen(ids, 8)
    self.assertNotIn("codecontests/wrong", ids)
    unchecked = checked_sources.open_source(
        config_lib.TaskSection(source="stdio", path=path, heldout_fraction=0.5,
                               check_references=False))
    self.assertLen(unchecked.train + unchecked.heldout, 9)
    # The registry's source runs no program: the check is the caller's to give.
    raw = sources.TASK_SOURCES.get("stdio")(section)
    self.assertLen(raw.train + raw.heldout, 9)
    self.assertIsNone(checked_sources.reference_check(
        dataclasses.replace(section, check_references=False)))

  def test_reference_check_keeps_noisy_and_slow_references(self):
    noisy = "import sys\nprint('debug', list(range(500)), file=sys.stderr)\n" + SUM
    # About half of the 1.5 s limit on every test (busy CPU, as a slow Python solution).
    slow = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.7: pass\n" + SUM
    rows = [codecontests_row(name="noisy", solution=noisy),
            codecontests_row(name="slow", solution=slow)]
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    check = lambda tasks: execution.reference_failures(tasks, self.pool)
    tasks = stdio_problems.load_stdio(path, on_error="raise", check=check)
    self.assertEqual([t.task_id for t in tasks], ["codecontests/noisy", "codecontests/slow"])

  def test_source_errors_name_the_path_and_the_first_row(self):
    tmp = self.create_tempdir().full_path
    path = os.path.join(tmp, "p.jsonl")
    with open(path, "w") as f:  # every reference fails its own tests
      f.writelines(json.dumps(codecontests_row(name=f"p{i}", solution="print(0)")) + "\n"
                   for i in range(3))
    load = checked_sources.open_source
    section = lambda p, **kw: config_lib.TaskSection(source="stdio", path=p, **kw)
    with self.assertRaisesRegex(ValueError, r"config\.task\.path: no usable stdio task in .*"
                                r"p\.jsonl: all 3 row\(s\) .*the first: .*row 1, field "
                                r"'solutions': reference solution fails"):
      load(section(path))
    open(path, "w").close()
    with self.assertRaisesRegex(ValueError, r"no usable stdio task .*: it holds no rows"):
      load(section(path))
    with self.assertRaisesRegex(ValueError, r"config\.task\.path '.*' \(stdio JSONL file\) "
                                            r"is a directory"):
      load(section(tmp))
    for name in ("stdio", "mbpp", "jsonl", "humaneval"):
      with self.assertRaisesRegex(ValueError, rf"config\.task\.path .*nope\.jsonl.* \({name} "
                                              r"JSONL file\) is missing"):
        sources.TASK_SOURCES.get(name)(config_lib.TaskSection(
            source=name, path=os.path.join(tmp, "nope.jsonl")))

  def test_a_repeated_problem_does_not_stop_the_source(self):
    rows = [codecontests_row(name=f"p{i}") for i in range(6)] + [codecontests_row(name="p2")]
    path = os.path.join(self.create_tempdir().full_path, "p.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    tasks = sources.TASK_SOURCES.get("stdio")(config_lib.TaskSection(
        source="stdio", path=path, heldout_fraction=0.5, check_references=False))
    self.assertLen(tasks.train + tasks.heldout, 6)

  def test_mbpp_reference_check(self):
    good = {"task_id": 1, "text": "Add.", "code": "def add(a, b):\n  return a + b\n",
            "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
    bad = dict(good, task_id=2, code="def add(a, b):\n  return a - b\n")
    path = os.path.join(self.create_tempdir().full_path, "mbpp.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in (good, bad))
    check = lambda tasks: execution.reference_failures(tasks, self.pool)
    from agentic_grpo.tasks import mbpp  # pylint: disable=g-import-not-at-top
    errors = []
    tasks = mbpp.load_mbpp(path, on_error="skip", errors=errors, check=check)
    self.assertEqual([t.task_id for t in tasks], ["mbpp/1"])
    self.assertEqual([(e.row, e.field) for e in errors], [(2, "code")])

  def _episode(self, task, outputs):
    wf = workflow_lib.Workflow(workflow_config.WorkflowConfig(
        stages=("hypothesis", "code", "tests", "debug")), self.pool)
    eps = wf.start([task])
    results = []
    for stage, out in zip(wf.stages, outputs, strict=True):
      wf.open_stage(eps)
      results.append(wf.close_stage(eps, [out + stage.close_token]))
    return eps[0], results, wf.finish(eps)

  def test_workflow_stages_on_a_stdio_task(self):
    task = stdio_problems.row_to_task(codecontests_row(), 1, "cc.jsonl")
    ep, results, final = self._episode(task, [
        "3", SUM, "'2 3\\n'->'5\\n'\n'10 20\\n'->'30'", "keep"])
    self.assertEqual([bool(r.valid[0]) for r in results], [False, True, True, True])
    self.assertEqual([float(r.rewards[0]) for r in results], [0.0, 1.0, 1.0, 1.0])
    self.assertEqual((float(final.rewards[0]), int(final.num_tests[0])), (1.0, 3))
    self.assertEqual(ep.segments[3].opening, "<obs>3/3</obs><debug>")

    wrong, results, final = self._episode(task, [
        "3", "print(0)", "'2 3\\n'->'6\\n'\n'1 1\\n'->'2\\n'", "keep"])
    self.assertEqual([float(r.rewards[0]) for r in results], [0.0, 0.0, 0.5, 0.0])
    self.assertAlmostEqual(float(final.rewards[0]), 1 / 3)  # `-1 1` -> 0 passes
    self.assertIn("'1 2\\n'->'3\\n' got wrong_answer", wrong.segments[3].opening)

  def test_problem_limits_and_defaults_reach_the_judge(self):
    task = stdio_problems.row_to_task(apps_row(), 1, "apps.jsonl")
    prog = execution.program(task, MAX, task.public_examples, self.pool)
    self.assertIsInstance(prog, sandbox.StdioProgram)
    self.assertEqual((prog.time_seconds, prog.memory_bytes),
                     (self.pool.limits.cpu_seconds, self.pool.limits.memory_bytes))
    timed = stdio_problems.row_to_task(codecontests_row(float_tolerance=0.01), 1, "cc.jsonl")
    prog = execution.hidden_program(timed, SUM, self.pool)
    self.assertEqual((prog.time_seconds, prog.memory_bytes, prog.abs_tol), (1.5, 2**28, 0.01))
    [result] = self.pool.map([prog])
    self.assertEqual(result.verdict, sandbox.StdioVerdict.PASSED)

  def _final(self, pool, reward_mode, source, n_hidden):
    many = codecontests_row(name="many", time_limit={"seconds": 1, "nanos": 0},
                            generated_tests={"input": [f"{i} 1\n" for i in range(n_hidden)],
                                             "output": [f"{i + 1}\n" for i in range(n_hidden)]})
    task = stdio_problems.row_to_task(many, 1, "cc.jsonl")
    wf = workflow_lib.Workflow(workflow_config.WorkflowConfig(stages=("code",),
                                                              reward_mode=reward_mode), pool)
    eps = wf.start([task])
    wf.open_stage(eps)
    wf.close_stage(eps, [source + wf.stages[0].close_token])
    start = time.monotonic()
    final = wf.finish(eps)
    return final, time.monotonic() - start, len(task.hidden_tests)

  def test_a_looping_program_costs_one_time_limit_with_all_pass(self):
    # 1 s per test (a wall deadline of 3 s): 30 tests, 90 s without the early stop.
    final, wall, n = self._final(self.pool, "all_pass", "while True: pass\n", 30)
    self.assertEqual((float(final.rewards[0]), int(final.num_passed[0]), int(final.num_tests[0])),
                     (0.0, 0, n))
    self.assertLess(wall, 15.0)
    final, _, _ = self._final(self.pool, "all_pass", SUM, 30)  # the reward is unchanged
    self.assertEqual(float(final.rewards[0]), 1.0)

  def test_a_looping_program_costs_the_budget_with_fraction(self):
    cfg = config_lib.TrainConfig()
    self.assertEqual(cfg.sandbox.job_budget_s, 60.0)
    cfg = dataclasses.replace(cfg, sandbox=dataclasses.replace(cfg.sandbox, workers=1,
                                                               job_budget_s=4.0))
    with components.sandbox_pool(cfg) as raw:
      # Training and evaluation hand their workflows the pool wrapped to count verdicts: the
      # budget must reach the judge through the wrapper.
      pool = streams.CountingPool(raw)
      self.assertEqual(pool.limits.stdio_budget_seconds, 4.0)
      final, wall, n = self._final(pool, "fraction", "while True: pass\n", 30)
      self.assertEqual((float(final.rewards[0]), int(final.num_tests[0])), (0.0, n))
      self.assertLess(wall, 15.0)
      # The last of 6 hidden tests loops: the budget takes nothing from the others.
      last = "a, b = map(int, input().split())\nwhile a == 3: pass\nprint(a + b)\n"
      final, _, n = self._final(pool, "fraction", last, 4)
      self.assertEqual(int(final.num_passed[0]), n - 1)
      self.assertAlmostEqual(float(final.rewards[0]), (n - 1) / n, places=6)

  def test_all_or_nothing_reaches_the_judge(self):
    task = stdio_problems.row_to_task(codecontests_row(), 1, "cc.jsonl")
    limits = sandbox.Limits(stdio_budget_seconds=30.0)
    pool = types.SimpleNamespace(limits=limits)
    stop = execution.hidden_program(task, SUM, pool, all_or_nothing=True)
    budget = execution.hidden_program(task, SUM, pool)
    self.assertEqual((stop.stop_on_error, stop.budget_seconds), (True, None))
    self.assertEqual((budget.stop_on_error, budget.budget_seconds), (False, 30.0))


if __name__ == "__main__":
  absltest.main()
