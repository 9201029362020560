"""Tests for agentic_grpo.agent.streams: the task stream and the verdict-counting pool."""

import collections
import concurrent.futures

from absl.testing import absltest

from agentic_grpo import sandbox
from agentic_grpo.agent import streams
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import task as task_lib


class _Result:
  def __init__(self, verdict):
    self.verdict = verdict


class _Pool:
  limits = sandbox.Limits(cpu_seconds=7.0, memory_bytes=300 * 2**20, stdio_budget_seconds=3.0)

  def map(self, programs, limits=None):
    del limits
    return [_Result(sandbox.Verdict.PASSED if p else sandbox.Verdict.TIMEOUT) for p in programs]

  def submit(self, program, limits=None):
    future = concurrent.futures.Future()
    future.set_result(self.map([program], limits)[0])
    return future


class TaskStreamTest(absltest.TestCase):

  def test_task_stream_epochs(self):
    stream = streams.TaskStream(lambda i: i, pool_size=4, seed=0)
    first = stream.take(4)[1]
    second = stream.take(4)[1]
    self.assertEqual(sorted(first), [0, 1, 2, 3])
    self.assertEqual(sorted(second), [0, 1, 2, 3])
    self.assertEqual(stream.epoch(), 2)
    again = streams.TaskStream(lambda i: i, pool_size=4, seed=0)
    again.position = 4  # Resuming exactly at an epoch boundary.
    self.assertEqual(again.take(4)[1], second)
    self.assertEqual(again.at([1, 6]), [first[1], second[2]])
    unlimited = streams.TaskStream(lambda i: i * 10)
    self.assertEqual(unlimited.take(3), ([0, 1, 2], [0, 10, 20]))

  def test_task_stream_shards_are_disjoint_and_cover_the_stream(self):
    whole = streams.TaskStream(lambda i: i, pool_size=6, seed=2)
    want = whole.take(12)
    shards = [streams.TaskStream(lambda i: i, pool_size=6, seed=2, shard_index=p,
                                 shard_count=3) for p in range(3)]
    got = [s.take(2) + s.take(2) for s in shards]  # two takes each: (pos, tasks, pos, tasks)
    positions = [g[0] + g[2] for g in got]
    for p, pos in enumerate(positions):
      self.assertEqual(pos, [p, p + 3, p + 6, p + 9])
      self.assertEqual(shards[p].position, 4)
      self.assertEqual(got[p][1] + got[p][3], [want[1][q] for q in pos])
      self.assertEqual(shards[p].at(pos), got[p][1] + got[p][3])
    self.assertEqual(sorted(sum(positions, [])), want[0])
    self.assertEqual([s.epoch() for s in shards], [2, 2, 2])  # 12 of a 6-task pool drawn
    for kwargs, message in (({"shard_count": 0}, "shard_count"),
                            ({"shard_index": 2, "shard_count": 2}, "shard_index")):
      with self.assertRaisesRegex(ValueError, message):
        streams.TaskStream(lambda i: i, **kwargs)

  def test_negative_pool_size(self):
    with self.assertRaisesRegex(ValueError, "pool_size"):
      streams.TaskStream(lambda i: i, pool_size=-1)


class CountingPoolTest(absltest.TestCase):

  def test_counts_verdicts_and_resets(self):
    pool = streams.CountingPool(_Pool())
    self.assertLen(pool.map([True, False, False]), 3)
    self.assertEqual(pool.pop_counts(), {"passed": 1, "timeout": 2})
    self.assertEqual(pool.pop_counts(), {})
    self.assertIsInstance(pool.counts, collections.Counter)
    self.assertEqual(pool.submit(False).result().verdict, sandbox.Verdict.TIMEOUT)
    self.assertEqual(pool.pop_counts(), {"timeout": 1})

  def test_the_wrapped_pools_limits_reach_a_stdio_program(self):
    # The class of bug: a wrapper that hides the pool's limits makes every stdio job run under
    # `sandbox.Limits()` instead of the run's `config.sandbox`.
    inner = _Pool()
    pool = streams.CountingPool(inner)
    self.assertIs(pool.limits, inner.limits)
    with self.assertRaises(AttributeError):
      pool.no_such_attribute  # pylint: disable=pointless-statement
    stdio_task = task_lib.Task("s/1", "Add.", "main", "main()",
                               public_examples=(task_lib.Example(("1 2\n",), "3\n"),),
                               hidden_tests=(task_lib.Example(("2 2\n",), "4\n"),),
                               stdio=task_lib.StdioSpec())
    for wrapper in (inner, pool):
      program = execution.program(stdio_task, "print(3)", stdio_task.public_examples, wrapper)
      self.assertEqual((program.time_seconds, program.memory_bytes, program.budget_seconds),
                       (7.0, 300 * 2**20, 3.0))


if __name__ == "__main__":
  absltest.main()
