"""Finite data sets (HumanEval, MBPP, the project's Task JSONL) as random-access task sources.

A finite list of tasks has no train split of its own. `FiniteTasks` splits it
deterministically by task id: task `t` is held out when

    int(sha256(f"{split_seed}:{t.task_id}")[:16], 16) / 2**64 < heldout_fraction

so the split does not depend on the file's order, the process or the
machine, and a task keeps its side when other rows are added or dropped. The
`train` split is the rest; `validation` and `test` are both the held-out
tasks. `task(split, index)` cycles: index `i` is task `i mod n` of the split
(in file order), so the training stream's endless indices visit the pool
again and again.
"""

import hashlib
from typing import Sequence

from agentic_grpo import errors
from agentic_grpo.tasks import task as task_lib

SPLITS = ("train", "validation", "test")


def is_heldout(task_id: str, heldout_fraction: float, split_seed: int) -> bool:
  """The split rule (module docstring): whether `task_id` is held out."""
  digest = hashlib.sha256(f"{split_seed}:{task_id}".encode("utf-8")).hexdigest()
  return int(digest[:16], 16) / 2.0**64 < heldout_fraction


class FiniteTasks:
  """A finite task list split into train and held-out tasks (see the module docstring).

  Args:
    tasks: the data set, in file order (unique task ids).
    heldout_fraction: in (0, 1): expected share of held-out tasks.
    split_seed: seed of the split rule.
    name: the data set, for error messages.

  Raises:
    ValueError: for a bad fraction.
    errors.InputError (a ValueError): duplicate task ids, or a split left empty (the message
      names the config fields that change the split).
  """

  def __init__(self, tasks: Sequence[task_lib.Task], heldout_fraction: float, split_seed: int,
               name: str = "tasks"):
    if not 0.0 < heldout_fraction < 1.0:
      raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
      dup = next(i for i in ids if ids.count(i) > 1)
      raise errors.InputError(f"{name}: duplicate task_id {dup!r}")
    self.heldout = tuple(t for t in tasks if is_heldout(t.task_id, heldout_fraction, split_seed))
    self.train = tuple(t for t in tasks
                       if not is_heldout(t.task_id, heldout_fraction, split_seed))
    for split, part in (("train", self.train), ("held-out", self.heldout)):
      if not part:
        change = "lower" if split == "train" else "raise"
        raise errors.InputError(
            f"{name}: the {split} split of {len(ids)} tasks is empty (heldout_fraction="
            f"{heldout_fraction}, split_seed={split_seed}): {change} "
            f"--config.task.heldout_fraction or try another --config.task.split_seed")

  def size(self, split: str) -> int:
    """Tasks in `split`."""
    return len(self._split(split))

  def task(self, split: str, index: int) -> task_lib.Task:
    """Task `index mod size(split)` of `split`.

    Raises:
      ValueError: for an unknown split or a negative index.
    """
    if not isinstance(index, int) or index < 0:
      raise ValueError(f"index must be an int >= 0, got {index!r}")
    part = self._split(split)
    return part[index % len(part)]

  def _split(self, split: str) -> tuple[task_lib.Task, ...]:
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return self.train if split == "train" else self.heldout
