"""Task sources by name: the config's `task.source` -> a factory of a random-access task source.

A task source is any object with `task(split, index) -> Task` (`TaskSource`): task `index` of
split `train`, `validation` or `test`, the same in every process for the same config, for every
index >= 0 (the training stream draws indices without end unless `task.train_size` makes it a
finite pool). A factory takes the config's `task` section (`config.TaskSection`, or anything
with its fields) and returns the source:

    tasks = sources.TASK_SOURCES.get(cfg.task.source)(cfg.task)
    tasks.task("train", 17)

Registered: `synthetic` (`tasks.synthetic`). The HumanEval and MBPP JSONL loaders
(`tasks.humaneval`, `tasks.mbpp`) return finite lists without a train split, so they do not fit
this interface yet: registering them needs a split rule for each data set and a source size that
the task stream cycles over (its finite pool), which comes with the real-task issue.
"""

from typing import Any, Protocol

from agentic_grpo import registry
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib


class TaskSource(Protocol):
  """Random access into the splits of a task distribution."""

  def task(self, split: str, index: int) -> task_lib.Task:
    """Task `index` (>= 0) of `split`."""


TASK_SOURCES: registry.Registry[Any] = registry.Registry("task source")


@TASK_SOURCES.register("synthetic")
def synthetic_source(section: Any) -> synthetic.SyntheticTasks:
  """The synthetic generator of the `task` section's `seed`, `depths`, `string_prob`,
  `ambiguity_target`, `num_hidden` and `split_by` (its other knobs keep their defaults).

  Raises:
    ValueError: from `synthetic.SyntheticConfig` for a bad field value.
  """
  return synthetic.SyntheticTasks(synthetic.SyntheticConfig(
      seed=section.seed, depths=section.depths, string_prob=section.string_prob,
      ambiguity_target=section.ambiguity_target, num_hidden=section.num_hidden,
      split_by=section.split_by))
