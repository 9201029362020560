"""The only home of single- vs multi-process code in a run: `Coordinator`.

A multi-process run (`jax.distributed`, one process per host) runs the same host loop in every
process, each on its own tasks, episodes and replay. Whatever must be the same everywhere is
agreed here, with a small host collective (`parallel.host_allgather`, `parallel.allgather_json`,
guarded by `parallel.peer_watchdog` with `mesh.collective_timeout_s`):

* per loop iteration of the RL phase (`agree`): whether to update (every process has its share
  of rows ready, or the loop is about to sample and some process has rows; with dynamic
  sampling, while every process waits for a full update, only when every process has its share
  in one length bucket), the length bucket (the longest any process needs), the rows an update
  takes (the most any process has ready in that bucket, at most its share), the fewest idle
  batches of any process, and whether any process was asked to stop (a signal);
* per update, whether any process had a row with a loss token (`any`);
* per sampler call, the longest prompt (`agree_max`), so that every process pads to one bucket;
* per warm-start step, whether any process was asked to stop (`any`);
* per logged row, every process's host numbers (`gather`) and per evaluation its per-task
  results (`gather_task_rows`).

`LocalCoordinator` answers every question from this process alone, with no collective;
`MultiProcessCoordinator` asks every process. `make_coordinator()` picks one. The rest of the
`train` package never asks how many processes there are.
"""

import abc
import dataclasses
from typing import Any, Sequence

import numpy as np

from agentic_grpo import parallel


@dataclasses.dataclass(frozen=True)
class Agreement:
  """What every process does at one iteration of the RL loop.

  Attributes:
    update: take a batch and update now.
    buckets: the length buckets the batch may use (one agreed bucket; empty without update).
    rows: the most rows of that bucket any process has ready, at most its share of an update
      (0 without update): the batch's row bucket is chosen for it (`replay.batching.row_bucket`).
    idle_batches: the fewest episode batches in a row without learning signal of any process.
    stop: some process was asked to stop (SIGTERM / SIGINT): checkpoint and end.
  """
  update: bool
  buckets: tuple[int, ...]
  rows: int
  idle_batches: int
  stop: bool


class Coordinator(abc.ABC):
  """Agreements and gathers between the processes of a run (see module docstring)."""

  process_index: int
  process_count: int

  @property
  def is_primary(self) -> bool:
    """True in the process that writes metrics and plots (process 0)."""
    return self.process_index == 0

  def share(self, name: str, value: int) -> int:
    """This process's part of a global count `value` (rows of a batch).

    Raises:
      ValueError: `value` is not a multiple of the process count (names `config.<name>`).
    """
    if value % self.process_count:
      raise ValueError(f"config.{name} must be a multiple of the number of processes "
                       f"({self.process_count}), got {value}")
    return value // self.process_count

  def eval_width(self, total: int) -> int:
    """Held-out tasks every process runs: the largest share of `total` (others pad to it)."""
    return -(-total // self.process_count)

  def agree(self, *, ready: int, rows: int, want_bucket: int, fits: Sequence[int],
            buckets: Sequence[int], sampling: bool, idle_batches: int,
            stop: bool, full_only: bool = False) -> Agreement:
    """The RL loop's per-iteration agreement.

    Args:
      ready: this process's ready replay items.
      rows: this process's rows of an update.
      want_bucket: the bucket of this process's oldest ready item (0 when none is ready).
      fits: per length bucket (`buckets`), this process's ready items that fit in it.
      buckets: the length buckets (`rl.buckets`), the same in every process.
      sampling: the agent loop's next action is to sample (every process's is the same).
      idle_batches: this process's episode batches in a row without learning signal.
      stop: this process was asked to stop.
      full_only: this process waits for a full update (dynamic sampling, `rl.dynamic_sampling`).
        When every process does, an update happens only in the smallest bucket, from the one
        the oldest rows need up, in which every process has `rows` ready rows, and takes
        `rows`; no partial update before a sample phase. When some process does not (its cap
        reached), as without.

    Raises:
      ValueError: `fits` and `buckets` of different lengths.
    """
    if len(fits) != len(buckets):
      raise ValueError(f"fits must have one count per bucket ({len(buckets)}), got {len(fits)}")
    everyone = self._gather_ints([ready, want_bucket, idle_batches, int(stop), int(full_only),
                                  *fits])
    ready_all, want_all = everyone[:, 0], everyone[:, 1]
    bucket = int(want_all.max())
    fits_all = everyone[:, 5:]
    if everyone[:, 4].all():  # every process waits for a full update
      full = [b for j, b in enumerate(buckets)
              if b >= bucket and int(fits_all[:, j].min()) >= rows]
      return Agreement(update=bool(full), buckets=tuple(full[:1]), rows=rows if full else 0,
                       idle_batches=int(everyone[:, 2].min()), stop=bool(everyone[:, 3].any()))
    update = bool(ready_all.min() >= rows or (sampling and ready_all.max() > 0))
    taken = 0
    if update:
      taken = min(rows, int(fits_all[:, list(buckets).index(bucket)].max()))
    return Agreement(update=update, buckets=(bucket,) if update else (), rows=taken,
                     idle_batches=int(everyone[:, 2].min()), stop=bool(everyone[:, 3].any()))

  def any(self, flag: bool) -> bool:
    """True when `flag` is True in some process."""
    return bool(self._gather_ints([int(flag)])[:, 0].any())

  def agree_max(self, value: int) -> int:
    """The largest `value` of any process."""
    return int(self._gather_ints([value])[:, 0].max())

  def total(self, value: int) -> int:
    """The sum of `value` over the processes."""
    return int(self._gather_ints([value])[:, 0].sum())

  @abc.abstractmethod
  def _gather_ints(self, values: Sequence[int]) -> np.ndarray:
    """`[process_count, len(values)]` int64: every process's `values`."""

  @abc.abstractmethod
  def gather(self, obj: Any) -> list[Any]:
    """Every process's JSON-serialisable `obj`, in process order."""

  @abc.abstractmethod
  def gather_task_rows(self, x: np.ndarray, own: int, total: int) -> np.ndarray:
    """Per-task results `[eval_width(total), ...]` of every process (its first `own` rows
    real), joined in task order: `[total, ...]`. The process shares are
    `parallel.process_slice(total)`."""


class LocalCoordinator(Coordinator):
  """One process: every agreement is this process's own value; no collective."""

  process_index = 0
  process_count = 1

  def _gather_ints(self, values):
    return np.asarray(values, np.int64)[None]

  def gather(self, obj):
    return [obj]

  def gather_task_rows(self, x, own, total):
    return x[:own]


class MultiProcessCoordinator(Coordinator):
  """Several processes: every agreement is a host collective (all processes call it at the
  same point; `parallel.peer_watchdog` ends the process when a peer does not)."""

  def __init__(self):
    self.process_index = parallel.process_index()
    self.process_count = parallel.process_count()

  def _gather_ints(self, values):
    return parallel.host_allgather(np.asarray(values, np.int64))

  def gather(self, obj):
    return parallel.allgather_json(obj)

  def gather_task_rows(self, x, own, total):
    everything = parallel.host_allgather(x)
    count = self.process_count
    sizes = [len(range(total)[parallel.process_slice(total, p, count)]) for p in range(count)]
    return np.concatenate([everything[p, :sizes[p]] for p in range(count)])


def make_coordinator() -> Coordinator:
  """The coordinator for this run's processes (`parallel.process_count()`)."""
  return MultiProcessCoordinator() if parallel.process_count() > 1 else LocalCoordinator()
