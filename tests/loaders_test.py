"""Tests for the HumanEval and MBPP-format loaders (agentic_grpo.tasks.humaneval, .mbpp)."""

import gzip
import json
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentic_grpo.tasks import humaneval
from agentic_grpo.tasks import loading
from agentic_grpo.tasks import mbpp
from agentic_grpo.tasks import task as task_lib

# MBPP-format rows written for these tests (not taken from the MBPP data set).
_IO_ROW = {
    "task_id": 1, "text": "Return the sum of two numbers.",
    "code": "def add_two(a, b):\n  return a + b\n",
    "test_list": ["assert add_two(1, 2) == 3", "assert add_two(-1, 1) == 0",
                  "assert add_two(2, 2)==4"],
    "test_setup_code": "", "challenge_test_list": ["assert add_two(10, 5) == 15"],
}
_SCRIPT_ROW = {
    "task_id": 2, "prompt": "Return half of x.",
    "code": "import math\ndef helper(x):\n  return x\ndef half(x):\n  return helper(x) / 2\n",
    "test_list": ["assert half(4) == 2.0", "assert math.isclose(half(3), 1.5)"],
    "test_imports": ["import math"],
}


def _write_jsonl(path, rows, gz=False):
  opener = gzip.open if gz else open
  with opener(path, "wt", encoding="utf-8") as f:
    for r in rows:
      f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


class HumanEvalTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tasks = humaneval.load_humaneval()

  def test_all_problems(self):
    self.assertLen(self.tasks, humaneval.NUM_PROBLEMS)
    self.assertLen({t.task_id for t in self.tasks}, humaneval.NUM_PROBLEMS)
    for t in self.tasks:
      self.assertEqual(t.source, "humaneval")
      self.assertIn("def check(", t.hidden_script)
      self.assertTrue(t.signature.startswith(t.entry_point + "("), t.signature)
      self.assertNotEmpty(t.param_names)
      self.assertTrue(t.reference_solution.startswith(t.prompt))
      self.assertTrue(t.prompt.startswith(t.code_context))
      self.assertNotIn(f"def {t.entry_point}(", t.code_context)
      self.assertIsNone(t.probe)

  def test_public_examples_from_docstrings(self):
    first = self.tasks[0]
    self.assertEqual(first.public_examples,
                     (task_lib.Example(([1.0, 2.0, 3.0], 0.5), False),
                      task_lib.Example(([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3), True)))
    with_examples = sum(bool(t.public_examples) for t in self.tasks)
    self.assertGreater(with_examples, 50)
    for t in self.tasks:
      for e in t.public_examples:
        self.assertIn(t.entry_point, t.prompt)
        self.assertIsInstance(e.args, tuple)

  def test_helpers_go_to_code_context(self):
    t = next(t for t in self.tasks if t.entry_point == "make_palindrome")
    self.assertIn("def is_palindrome(", t.code_context)

  def test_malformed_rows(self):
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp)
    good = {"task_id": "X/0", "prompt": "def f(x):\n  \"\"\"\n  >>> f(1)\n  2\n  \"\"\"\n",
            "entry_point": "f", "canonical_solution": "  return x + 1\n",
            "test": "def check(candidate):\n  assert candidate(1) == 2\n"}
    rows = [good, dict(good, task_id="X/1", entry_point="g"), "{not json",
            {k: v for k, v in good.items() if k != "test"}, dict(good, task_id="X/4"),
            dict(good, task_id="X/5", prompt=7), ["a list"]]
    path = os.path.join(tmp, "he.jsonl")
    _write_jsonl(path, rows)
    errors = []
    tasks = humaneval.load_humaneval(path, on_error="skip", errors=errors)
    self.assertEqual([t.task_id for t in tasks], ["X/0", "X/4"])
    self.assertEqual(tasks[0].public_examples, (task_lib.Example((1,), 2),))
    self.assertEqual([(e.row, e.field) for e in errors],
                     [(2, "prompt"), (3, None), (4, "test"), (6, "prompt"), (7, None)])
    self.assertIn("row 3", str(errors[1]))
    with self.assertRaisesRegex(loading.RowError, r"row 2, field 'prompt'.*'g'"):
      humaneval.load_humaneval(path, on_error="raise")
    with self.assertRaisesRegex(ValueError, "on_error"):
      humaneval.load_humaneval(path, on_error="ignore")


class MbppTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp)

  @parameterized.parameters(False, True)
  def test_io_row(self, gz):
    path = os.path.join(self.tmp, "m.jsonl" + (".gz" if gz else ""))
    _write_jsonl(path, [_IO_ROW, "", _SCRIPT_ROW], gz=gz)
    io_task, script_task = mbpp.load_mbpp(path, num_public=2)
    self.assertEqual(io_task.task_id, "mbpp/1")
    self.assertEqual(io_task.entry_point, "add_two")
    self.assertEqual(io_task.signature, "add_two(a, b)")
    self.assertEqual(io_task.hidden_tests, (
        task_lib.Example((1, 2), 3), task_lib.Example((-1, 1), 0), task_lib.Example((2, 2), 4),
        task_lib.Example((10, 5), 15)))
    self.assertIsNone(io_task.hidden_script)
    self.assertEqual(io_task.public_examples, io_task.hidden_tests[:2])
    self.assertEqual(io_task.prompt,
                     "Return the sum of two numbers.\nadd_two(a, b)\n1,2->3\n-1,1->0")
    self.assertEqual(io_task.reference_solution, _IO_ROW["code"])
    # A test that is not `f(literals) == literal` turns the row into a script test.
    self.assertEqual(script_task.entry_point, "half")
    self.assertEqual(script_task.hidden_tests, ())
    self.assertIn("import math", script_task.hidden_script)
    self.assertIn("assert math.isclose(half(3), 1.5)", script_task.hidden_script)
    self.assertEqual(script_task.public_examples, (task_lib.Example((4,), 2.0),))
    self.assertTrue(script_task.prompt.startswith("Return half of x."))

  def test_malformed_rows(self):
    rows = [
        _IO_ROW,                                                   # 1 ok
        {k: v for k, v in _IO_ROW.items() if k != "test_list"},    # 2 missing test_list
        dict(_IO_ROW, code="def add_two(a, b) return"),            # 3 code syntax
        dict(_IO_ROW, test_list=["assert other(1) == 2"]),         # 4 calls nothing defined
        "[1, 2",                                                   # 5 not JSON
        dict(_IO_ROW, test_list="assert add_two(1, 2) == 3"),      # 6 not a list
        dict(_IO_ROW, test_list=[]),                               # 7 empty
        dict(_IO_ROW, task_id=None),                               # 8 bad id
        dict(_IO_ROW, test_list=[3]),                              # 9 item not str
        dict(_IO_ROW, task_id=10),                                 # 10 ok
    ]
    path = os.path.join(self.tmp, "bad.jsonl")
    _write_jsonl(path, rows)
    errors = []
    tasks = mbpp.load_mbpp(path, on_error="skip", errors=errors)
    self.assertEqual([t.task_id for t in tasks], ["mbpp/1", "mbpp/10"])
    self.assertEqual([(e.row, e.field) for e in errors],
                     [(2, "test_list"), (3, "code"), (4, "test_list"), (5, None),
                      (6, "test_list"), (7, "test_list"), (8, "task_id"), (9, "test_list")])
    for e in errors:
      self.assertIn(path, str(e))
    with self.assertRaisesRegex(loading.RowError, r"row 2, field 'test_list': missing"):
      mbpp.load_mbpp(path)
    with self.assertRaisesRegex(ValueError, "num_public"):
      mbpp.load_mbpp(path, num_public=-1)


_HE_ROW = {"task_id": "X/0", "prompt": "def f(x):\n  \"\"\"\n  >>> f(1)\n  2\n  \"\"\"\n",
           "entry_point": "f", "canonical_solution": "  return x + 1\n",
           "test": "def check(candidate):\n  assert candidate(1) == 2\n"}
_DEEP = "[" * 10**5 + "]" * 10**5
_ODD_VALUES = (None, 0, -1, 1.5, True, "", " ", "x", [], {}, [1, "a"], {"a": [1]}, 10**4000,
               -10**30, float("inf"), _DEEP, "assert f(" + _DEEP + ") == 1", "9" * 5000,
               "def f(x):\n  return " + "-" * 10**5 + "x\n", "\x00", [_DEEP], [[[[[[[[1]]]]]]]])


def _mutated_line(rng, row: dict) -> tuple[bytes, bool]:
  """A mutated JSONL line of `row`; True when the mutation is inside a field (the row is valid
  JSON), so that a rejection must name the field."""
  kind = rng.integers(8)
  text = json.dumps(row).encode()
  if kind == 0:  # random bytes (possibly several lines)
    return rng.integers(0, 256, rng.integers(1, 300), dtype=np.uint8).tobytes(), False
  if kind == 1:  # truncated
    return text[:rng.integers(0, len(text))], False
  if kind == 2:  # flipped bytes
    b = bytearray(text)
    for i in rng.integers(0, len(b), rng.integers(1, 4)):
      b[i] ^= int(rng.integers(1, 256))
    return bytes(b), False
  if kind == 3:  # invalid UTF-8
    i = int(rng.integers(0, len(text)))
    bad = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80"][rng.integers(4)]
    return text[:i] + bad + text[i:], False
  if kind == 4:  # deep nesting as the whole line, or huge numbers
    return [_DEEP.encode(), b"1" * 5000, b'{"task_id": ' + b"9" * 5000 + b"}",
            b"[" * 10**5][rng.integers(4)], False
  field = list(row)[rng.integers(len(row))]
  changed = dict(row)
  if kind == 5:  # a missing field
    del changed[field]
  else:  # wrong types, deep nesting, huge numbers, parser bombs inside a field
    changed[field] = _ODD_VALUES[rng.integers(len(_ODD_VALUES))]
  return json.dumps(changed).encode(), True


class FuzzTest(parameterized.TestCase):
  """Property: no malformed row stops a load under `skip`; under `raise` the error is a
  `RowError` (a ValueError) naming the file and row, and the field when the row is JSON."""

  LOADERS = {"mbpp": (lambda p, **kw: mbpp.load_mbpp(p, **kw), (_IO_ROW, _SCRIPT_ROW)),
             "humaneval": (lambda p, **kw: humaneval.load_humaneval(p, **kw), (_HE_ROW,))}

  def _write(self, data: bytes, gz: bool) -> str:
    path = os.path.join(self.create_tempdir().full_path, "rows.jsonl" + (".gz" if gz else ""))
    with (gzip.open if gz else open)(path, "wb") as f:
      f.write(data)
    return path

  @parameterized.product(loader=("mbpp", "humaneval"), gz=(False, True))
  def test_mutated_rows(self, loader, gz):
    load, good_rows = self.LOADERS[loader]
    rng = np.random.default_rng(0 if loader == "mbpp" else 1)
    for _ in range(6):
      lines, in_field = [], {}
      for _ in range(12):
        if rng.random() < 0.3:
          lines.append(json.dumps(good_rows[rng.integers(len(good_rows))]).encode())
        else:
          line, named = _mutated_line(rng, good_rows[rng.integers(len(good_rows))])
          lines.append(line)
          if named:
            in_field[len(b"\n".join(lines).split(b"\n"))] = True
      data = b"\n".join(lines) + b"\n"
      path = self._write(data, gz)
      errors = []
      tasks = load(path, on_error="skip", errors=errors)
      rows = sum(1 for line in data.split(b"\n") if line.strip())
      self.assertEqual(len(tasks) + len(errors), rows)  # every row is loaded or counted
      for e in errors:
        self.assertIsInstance(e, loading.RowError)
        self.assertEqual(e.path, path)
        self.assertIn(f"row {e.row}", str(e))
        if in_field.get(e.row):
          self.assertIsNotNone(e.field, str(e))  # a malformed value names its field
          self.assertIn(f"field {e.field!r}", str(e))
      if errors:
        with self.assertRaises(loading.RowError) as raised:
          load(path, on_error="raise")
        self.assertEqual((raised.exception.path, raised.exception.row, raised.exception.field),
                         (path, errors[0].row, errors[0].field))
      else:
        self.assertLen(load(path, on_error="raise"), rows)

  @parameterized.product(loader=("mbpp", "humaneval"), gz=(False, True))
  def test_random_bytes(self, loader, gz):
    load, _ = self.LOADERS[loader]
    rng = np.random.default_rng(2)
    for _ in range(5):
      path = self._write(rng.integers(0, 256, rng.integers(1, 4000), dtype=np.uint8).tobytes(), gz)
      errors = []
      self.assertEmpty(load(path, on_error="skip", errors=errors))
      self.assertNotEmpty(errors)
      with self.assertRaisesRegex(ValueError, r"rows\.jsonl.*: row \d+"):
        load(path, on_error="raise")

  def test_corrupt_gzip_tail_keeps_earlier_rows(self):
    buf = gzip.compress((json.dumps(_IO_ROW) + "\n").encode() * 3)
    path = self._write(b"", False) + ".gz"
    with open(path, "wb") as f:
      f.write(buf[:-12])  # the stream is truncated: its trailer and some data are gone
    errors = []
    tasks = mbpp.load_mbpp(path, on_error="skip", errors=errors)
    self.assertLen(errors, 1)
    self.assertIn("unreadable data", str(errors[0]))
    self.assertLessEqual(len(tasks), 3)


class ParsingTest(absltest.TestCase):

  def test_assert_example(self):
    self.assertEqual(loading.assert_example("assert f([1, 2], 'a') == (1,)", "f"),
                     task_lib.Example(([1, 2], "a"), (1,)))
    for src in ("assert f(x) == 1", "assert g(1) == 1", "assert f(1) != 1", "f(1) == 1",
                "assert f(1) == 1 == 1", "assert f(k=1) == 1", "assert f(1) == set()"[:-2]):
      self.assertIsNone(loading.assert_example(src, "f"), src)

  def test_doctest_examples(self):
    src = 'def f(x):\n  """Doc.\n  >>> f(2)\n  4\n  >>> f(y)\n  1\n  >>> print(3)\n  3\n  """\n'
    self.assertEqual(loading.doctest_examples(src, "f"), (task_lib.Example((2,), 4),))


if __name__ == "__main__":
  absltest.main()
