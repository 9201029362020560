"""Finite task sources from the config: humaneval, mbpp, jsonl; the split rule; bad rows."""

import dataclasses
import json
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo import config as config_lib
from agentic_grpo.sandbox import checked_sources
from agentic_grpo.tasks import finite
from agentic_grpo.tasks import loading
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib


def _mbpp_row(i):
  return {"task_id": i, "text": f"Add {i}.", "code": f"def add_{i}(x):\n  return x + {i}",
          "test_list": [f"assert add_{i}(1) == {1 + i}", f"assert add_{i}(2) == {2 + i}",
                        f"assert add_{i}(0) == {i}"]}


class SplitRuleTest(parameterized.TestCase):

  def test_deterministic_and_order_free(self):
    tasks = [synthetic.SyntheticTasks(synthetic.SyntheticConfig(seed=1)).task("train", i)
             for i in range(60)]
    a = finite.FiniteTasks(tasks, 0.25, 7)
    b = finite.FiniteTasks(tasks[::-1], 0.25, 7)
    self.assertEqual({t.task_id for t in a.heldout}, {t.task_id for t in b.heldout})
    self.assertEqual(a.size("train") + a.size("test"), 60)
    self.assertBetween(a.size("test"), 5, 25)
    self.assertEqual(a.task("validation", 3), a.task("test", 3))
    self.assertEqual(a.task("train", a.size("train") + 2), a.task("train", 2))  # cycles
    self.assertTrue(all(finite.is_heldout(t.task_id, 0.25, 7) for t in a.heldout))
    other = finite.FiniteTasks(tasks, 0.25, 8)
    self.assertNotEqual({t.task_id for t in a.heldout}, {t.task_id for t in other.heldout})

  @parameterized.parameters((1e-9, "held-out split"), (1 - 1e-9, "train split"))
  def test_both_splits_are_forced(self, fraction, empty):
    tasks = [synthetic.SyntheticTasks(synthetic.SyntheticConfig(seed=1)).task("train", i)
             for i in range(10)]
    with self.assertRaisesRegex(ValueError, f"the {empty} of 10 tasks is empty"):
      finite.FiniteTasks(tasks, fraction, 0)

  def test_bad_arguments(self):
    task = synthetic.SyntheticTasks(synthetic.SyntheticConfig(seed=1)).task("train", 0)
    with self.assertRaisesRegex(ValueError, "duplicate task_id"):
      finite.FiniteTasks([task, task], 0.5, 0)
    with self.assertRaisesRegex(ValueError, "heldout_fraction"):
      finite.FiniteTasks([task], 1.0, 0)


class SourcesFromConfigTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()

  def _write(self, name, lines):
    path = os.path.join(self.dir, name)
    with open(path, "wb") as f:
      for line in lines:
        f.write(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")
    return path

  def test_humaneval(self):
    section = config_lib.TaskSection(source="humaneval", heldout_fraction=0.25)
    section.validate("task")
    tasks = checked_sources.open_source(section)
    self.assertEqual(tasks.size("train") + tasks.size("test"), 164)
    self.assertBetween(tasks.size("test"), 25, 60)
    self.assertTrue(tasks.task("test", 0).task_id.startswith("HumanEval/"))

  def test_mbpp_with_bad_rows_skipped_or_raised(self):
    rows = [_mbpp_row(i) for i in range(20)]
    bad = [b"\xff\xfe not utf-8\n", json.dumps({"task_id": 99, "text": "x", "code": "def f(:",
                                                 "test_list": []}).encode() + b"\n",
           json.dumps({"task_id": 98, "text": "x", "code": "def g(x): return x",
                       "test_list": []}).encode() + b"\n"]
    path = self._write("mbpp.jsonl", rows[:10] + bad + rows[10:])
    section = config_lib.TaskSection(source="mbpp", path=path, heldout_fraction=0.3)
    tasks = checked_sources.open_source(section)
    self.assertEqual(tasks.size("train") + tasks.size("test"), 20)
    t = tasks.task("train", 0)
    self.assertLen(t.public_examples, 1)  # MBPP's first test is public.
    with self.assertRaisesRegex(loading.RowError, "mbpp.jsonl.*row 11"):
      checked_sources.open_source(config_lib.TaskSection(
          source="mbpp", path=path, on_error="raise"))

  def test_jsonl_round_trip(self):
    gen = synthetic.SyntheticTasks(synthetic.SyntheticConfig(seed=2))
    want = [gen.task("train", i) for i in range(30)]
    path = self._write("tasks.jsonl", [json.loads(task_lib.task_to_json(t)) for t in want]
                       + [{"task_id": "x"}])
    tasks = checked_sources.open_source(config_lib.TaskSection(source="jsonl", path=path))
    got = {t.task_id: t for t in tasks.train + tasks.heldout}
    self.assertEqual(got, {t.task_id: t for t in want})

  def test_reference_check_runs_under_the_runs_sandbox_limits(self):
    # References that need 1 s each: within the default 5 s wall limit, over a run's 0.5 s.
    gen = synthetic.SyntheticTasks(synthetic.SyntheticConfig(seed=3))
    tasks = [gen.task("train", i) for i in range(12)]
    slow = {t.task_id for t in tasks[:2]}
    rows = [json.loads(task_lib.task_to_json(dataclasses.replace(
        t, reference_solution="import time\ntime.sleep(1.0)\n" + t.reference_solution)
        if t.task_id in slow else t)) for t in tasks]
    path = self._write("slow.jsonl", rows)
    section = config_lib.TaskSection(source="jsonl", path=path, heldout_fraction=0.5)
    load = checked_sources.open_source
    default = load(section)
    self.assertLen(default.train + default.heldout, 12)
    strict = config_lib.SandboxSection(timeout_s=0.5, workers=1)
    kept = load(section, strict)
    self.assertEqual({t.task_id for t in kept.train + kept.heldout},
                     {t.task_id for t in tasks} - slow)
    with self.assertRaisesRegex(loading.RowError, "slow.jsonl.*row 1.*reference solution fails"):
      load(dataclasses.replace(section, on_error="raise"), strict)

  def test_sandbox_section_limits_and_pool(self):
    section = config_lib.SandboxSection(workers=3, timeout_s=1.5, cpu_s=1.0, memory_mb=256,
                                        job_budget_s=0.0)
    limits = section.limits()
    self.assertEqual((limits.wall_seconds, limits.cpu_seconds, limits.memory_bytes,
                      limits.stdio_budget_seconds), (1.5, 1.0, 256 * 2**20, None))
    self.assertEqual(config_lib.SandboxSection(job_budget_s=7.0).limits().stdio_budget_seconds,
                     7.0)

  def test_config_validation(self):
    with self.assertRaisesRegex(ValueError, "config.task.path"):
      config_lib.TaskSection(source="mbpp").validate("task")
    with self.assertRaisesRegex(ValueError, "config.task.heldout_fraction"):
      config_lib.TaskSection(heldout_fraction=0.0).validate("task")
    with self.assertRaisesRegex(ValueError, "config.task.on_error"):
      config_lib.TaskSection(on_error="ignore").validate("task")


if __name__ == "__main__":
  absltest.main()
