"""Where the agent loop's inputs come from: the task stream, and the sandbox pool it counts.

`TaskStream` is the deterministic, resumable (and shardable) order of training tasks over a
task source; `CountingPool` wraps a sandbox pool and counts run verdicts for the metrics.
"""

import collections
import threading
from typing import Callable, Sequence

import numpy as np

from agentic_grpo.tasks import task as task_lib


class TaskStream:
  """A deterministic, resumable stream of training tasks, optionally one shard of it.

  With `pool_size == 0` task `q` of the stream is `get_task(q)`; otherwise the stream cycles over
  a finite pool of `pool_size` tasks, visiting them in a fresh seeded order every epoch.

  Sharding (multi-process runs): shard `i` of `n` draws the global stream positions
  `i, i + n, i + 2n, ...`, so shards are disjoint and together draw exactly what one unsharded
  stream draws. `position` (the resumable data position) counts the tasks this shard has
  drawn; `take` and `at` speak in global stream positions.

  Args:
    get_task: index -> `Task` (random access into a task source's split).
    pool_size: size of the finite pool (0 = unlimited).
    seed: seed of the per-epoch orders.
    shard_index: this shard, in `[0, shard_count)` (e.g. `jax.process_index()`).
    shard_count: number of shards (e.g. `jax.process_count()`).

  Raises:
    ValueError: a negative `pool_size`, `shard_count < 1` or `shard_index` outside
      `[0, shard_count)`.
  """

  def __init__(self, get_task: Callable[[int], task_lib.Task], *, pool_size: int = 0,
               seed: int = 0, shard_index: int = 0, shard_count: int = 1):
    if pool_size < 0:
      raise ValueError(f"pool_size must be >= 0, got {pool_size}")
    if shard_count < 1:
      raise ValueError(f"shard_count must be >= 1, got {shard_count}")
    if not 0 <= shard_index < shard_count:
      raise ValueError(f"shard_index must be in [0, {shard_count}), got {shard_index}")
    self._get_task = get_task
    self.pool_size = int(pool_size)
    self.seed = int(seed)
    self.shard_index, self.shard_count = int(shard_index), int(shard_count)
    self.position = 0
    self._order_epoch, self._order = -1, None

  def global_position(self, local: int) -> int:
    """Global stream position of this shard's `local`-th task."""
    return local * self.shard_count + self.shard_index

  def index(self, position: int) -> int:
    """Source index of the task at global stream `position`."""
    if not self.pool_size:
      return position
    epoch, within = divmod(position, self.pool_size)
    if epoch != self._order_epoch:
      self._order = np.random.default_rng([self.seed, epoch]).permutation(self.pool_size)
      self._order_epoch = epoch
    return int(self._order[within])

  def epoch(self) -> int:
    """Epochs completed (0 for an unlimited stream): those before this shard's next task."""
    return self.global_position(self.position) // self.pool_size if self.pool_size else 0

  def take(self, n: int) -> tuple[list[int], list[task_lib.Task]]:
    """This shard's next `n` tasks and their global stream positions."""
    positions = [self.global_position(q) for q in range(self.position, self.position + n)]
    self.position += n
    return positions, [self._get_task(self.index(p)) for p in positions]

  def at(self, positions: Sequence[int]) -> list[task_lib.Task]:
    """Tasks at given global stream positions (for restoring in-flight episodes)."""
    return [self._get_task(self.index(p)) for p in positions]


class CountingPool:
  """Wraps a sandbox pool and counts run verdicts (`timeout`, `error`, ...) thread-safely.

  Transparent otherwise: every other attribute is the wrapped pool's (`limits`, `max_workers`,
  `isolation_info`, ...), so code that reads the run's limits off the pool it was given
  (`execution.program`: a stdio task's time, memory and job budget) sees the same limits
  through the wrapper as without it. Verdicts of `map` and of `submit`'s futures are counted.
  """

  def __init__(self, pool):
    self._pool = pool
    self._lock = threading.Lock()
    self.counts: collections.Counter = collections.Counter()

  def map(self, programs, limits=None):
    results = self._pool.map(programs, limits) if limits is not None else self._pool.map(
        programs)
    self._count(results)
    return results

  def submit(self, program, limits=None):
    future = (self._pool.submit(program, limits) if limits is not None
              else self._pool.submit(program))
    future.add_done_callback(
        lambda f: None if f.cancelled() or f.exception() else self._count([f.result()]))
    return future

  def _count(self, results) -> None:
    with self._lock:
      for r in results:
        self.counts[str(getattr(r.verdict, "value", r.verdict))] += 1

  def __getattr__(self, name: str):
    # Called only for names not found on the wrapper: those are the wrapped pool's.
    if name.startswith("__") or name in ("_pool", "_lock", "counts"):
      raise AttributeError(name)
    return getattr(self._pool, name)

  def pop_counts(self) -> dict[str, int]:
    with self._lock:
      out = dict(self.counts)
      self.counts.clear()
    return out
