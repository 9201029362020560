"""Tests for judging programs against a data set (`agentic_grpo.judging`, `launch/judge.py`)."""

import json
import os
import pathlib
import subprocess
import sys

from absl.testing import absltest

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import judging
from agentic_grpo import sandbox

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
HALF = "print(int(input()) / 2)\n"


def _rows() -> list[dict]:
  rows = [{"name": f"sum{i}", "description": "Print a + b.",
           "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
           "private_tests": {"input": ["5 7\n", "-1 1\n"], "output": ["12\n", "0\n"]},
           "solutions": {"language": [3], "solution": [SUM]}} for i in range(3)]
  # A float answer: CodeContests' harness accepts 1.5000000000 for 1.5.
  rows.append({"name": "half", "description": "Print n / 2.",
               "public_tests": {"input": ["3\n"], "output": ["1.5000000000\n"]},
               "private_tests": {"input": ["5\n"], "output": ["2.5\n"]},
               "solutions": {"language": [3], "solution": [HALF]}})
  return rows


class JudgingTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path
    self.data = os.path.join(self.tmp, "cc.jsonl")
    with open(self.data, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in _rows())
    self.cfg = config_lib.from_config_dict({"task": {
        "source": "stdio", "path": self.data, "stdio_layout": "codecontests",
        "heldout_fraction": 0.5}})

  def test_load_and_judge(self):
    tasks = judging.load_tasks(self.cfg)
    self.assertCountEqual(tasks, ["codecontests/sum0", "codecontests/sum1", "codecontests/sum2",
                                  "codecontests/half"])
    self.assertEqual(len(judging.load_tasks(self.cfg, "train"))
                     + len(judging.load_tasks(self.cfg, "heldout")), 4)
    ordered = [tasks[i] for i in ("codecontests/sum0", "codecontests/sum1", "codecontests/half")]
    with sandbox.SandboxPool(max_workers=2) as pool:
      verdicts = judging.judge(ordered, [SUM, "print(-7)\n", HALF], pool)
      public = judging.judge(ordered[:1], [SUM], pool, public=True)
      nothing = judging.judge(ordered[:1], [None], pool)
    self.assertEqual([(v.task_id, v.passed, v.num_passed, v.num_tests) for v in verdicts],
                     [("codecontests/sum0", True, 2, 2), ("codecontests/sum1", False, 0, 2),
                      ("codecontests/half", True, 1, 1)])
    self.assertEqual(verdicts[0].verdict, "passed")
    self.assertEqual(verdicts[1].verdict, "wrong_answer")
    self.assertEqual(public[0].num_tests, 3)  # the public test too
    self.assertEqual(nothing[0].verdict, "no_program")
    self.assertEqual(json.loads(json.dumps(verdicts[1].to_json()))["verdict"], "wrong_answer")
    with self.assertRaisesRegex(ValueError, "3 tasks but 1 programs"):
      judging.judge(ordered, [SUM], None)

  def test_input_mistakes(self):
    with self.assertRaisesRegex(errors.InputError, "--split must be one of"):
      judging.load_tasks(self.cfg, "test")
    with self.assertRaisesRegex(errors.InputError, "is not a data set of fixed tasks"):
      judging.load_tasks(config_lib.from_config_dict({}))
    tasks = judging.load_tasks(self.cfg)
    programs = os.path.join(self.tmp, "programs.jsonl")
    for text, pattern in (("[1]\n", "row 1 must be an object"), ("{\n", "row 1 is not JSON"),
                          ('{"task_id": "x", "program": ""}\n', "names task_id 'x'")):
      with open(programs, "w") as f:
        f.write(text)
      with self.assertRaisesRegex(errors.InputError, pattern):
        judging.read_programs(programs, tasks)
    with open(programs, "w") as f:
      f.write(json.dumps({"task_id": "codecontests/sum2", "program": SUM}) + "\n\n")
    self.assertEqual(judging.read_programs(programs, tasks), [("codecontests/sum2", SUM)])

  def test_command_line(self):
    programs = os.path.join(self.tmp, "programs.jsonl")
    with open(programs, "w") as f:
      for task_id, program in (("codecontests/sum0", SUM), ("codecontests/half", "print(1)\n")):
        f.write(json.dumps({"task_id": task_id, "program": program}) + "\n")
    out = os.path.join(self.tmp, "verdicts.jsonl")
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "launch.judge", "--config.task.source=stdio",
         f"--config.task.path={self.data}", "--config.task.heldout_fraction=0.5",
         f"--programs={programs}", f"--verdicts={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    self.assertEqual(lines[:2], ["PASS codecontests/sum0: 2/2 tests (passed)",
                                 "FAIL codecontests/half: 0/1 tests (wrong_answer): wrong answer"])
    self.assertEqual(lines[2], "judged 2 program(s) on stdio tasks (all): 1 passed every test "
                               "(50.0%)")
    with open(out) as f:
      self.assertEqual([json.loads(l)["passed"] for l in f], [True, False])
    # Without --programs: each task's reference solution (a check of the data and the judge).
    proc = subprocess.run(
        [sys.executable, "-m", "launch.judge", "--config.task.source=stdio",
         f"--config.task.path={self.data}", "--config.task.heldout_fraction=0.5", "--public"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn("judged 4 program(s) on stdio tasks (all): 4 passed every test (100.0%)",
                  proc.stdout)


if __name__ == "__main__":
  absltest.main()
