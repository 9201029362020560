"""TFDS builder for the synthetic task set, and a grain pipeline that reads it back as `Task`s.

The builder writes `array_record` files (random access, no TensorFlow needed) with `train`,
`validation` and `test` splits drawn by `synthetic.SyntheticTasks` (the splits are disjoint by
program). Reading uses `tfds.data_source` / `builder.as_data_source()` and
`grain.MapDataset`; nothing here imports TensorFlow (`tfds.load` and `as_dataset` would).

    builder = SyntheticCoding(config="tiny", data_dir=d, file_format="array_record")
    builder.download_and_prepare()
    ds = task_dataset(builder.as_data_source()["train"], seed=0)   # grain.MapDataset of Task

Records are decoded when they are read, long after the data set was built (by an older version,
perhaps, whose tasks today's `Task` refuses: a stdio time limit over `task.MAX_TIME_SECONDS`).
A record that does not decode is skipped and counted (logged), or, with `on_error="raise"`, a
`loading.RecordError` naming the data set, split and record index: never an error of another
kind in the middle of a run.
"""

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

from absl import logging
import grain
import numpy as np
import tensorflow_datasets as tfds

from agentic_grpo.tasks import loading
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib

NAME = "synthetic_coding"


@dataclasses.dataclass(eq=False)
class SyntheticCodingConfig(tfds.core.BuilderConfig):
  """Sizes and generator config of one version of the synthetic task set.

  Attributes:
    generator: the `SyntheticConfig` the tasks are drawn with (its seed included).
    num_train, num_validation, num_test: tasks per split (task `i` of a split is
      `SyntheticTasks(generator).task(split, i)`).
  """
  generator: synthetic.SyntheticConfig = synthetic.SyntheticConfig()
  num_train: int = 20_000
  num_validation: int = 500
  num_test: int = 500

  def __post_init__(self):
    for split in synthetic.SPLITS:
      n = self.size(split)
      if not isinstance(n, int) or n < 1:
        raise ValueError(f"num_{split} must be an int >= 1, got {n!r}")

  def size(self, split: str) -> int:
    return getattr(self, "num_train" if split == "train" else f"num_{split}")


class SyntheticCoding(tfds.core.GeneratorBasedBuilder):
  """The synthetic coding tasks as a TFDS dataset (one row per task, the record as JSON)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First version."}
  BUILDER_CONFIGS = [
      SyntheticCodingConfig(name="default", description="20k/500/500 tasks, depths 1-3."),
      SyntheticCodingConfig(name="tiny", description="64/16/16 tasks, for tests.",
                            num_train=64, num_validation=16, num_test=16),
  ]
  DEFAULT_CONFIG_NAME = "default"

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "task_id": tfds.features.Text(),
            "task": tfds.features.Text(),   # task_lib.task_to_json
            "program": tfds.features.Text(),
            "difficulty": tfds.features.Scalar(dtype=np.int32),
        }),
        supervised_keys=None,
        homepage=None,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    return {split: self._generate_examples(split) for split in synthetic.SPLITS}

  def _generate_examples(self, split: str):
    config: SyntheticCodingConfig = self.builder_config
    source = synthetic.SyntheticTasks(config.generator)
    for i in range(config.size(split)):
      t = source.task(split, i)
      yield i, {
          "task_id": t.task_id,
          "task": task_lib.task_to_json(t),
          "program": t.metadata["program"],
          "difficulty": t.difficulty,
      }


def decode_task(record: Mapping[str, Any]) -> task_lib.Task:
  """A data-source record (strings as bytes) back to a `Task`.

  Raises:
    ValueError: if the record has no `task` field or it is not a task JSON.
  """
  if "task" not in record:
    raise ValueError(f"record has no 'task' field; fields: {sorted(record)}")
  raw = record["task"]
  if isinstance(raw, bytes):
    try:
      raw = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"record field 'task' is not UTF-8: {e}") from e
  return task_lib.task_from_json(raw)


def decode_record(source: Any, index: int, dataset: str, split: str) -> task_lib.Task:
  """Record `index` of `source` (a data source, or anything indexable) read and decoded as a
  `Task` (`decode_task`).

  Raises:
    loading.RecordError: naming `dataset`, `split` and `index`, for a record that cannot be
      read or decoded, whatever the cause (the record is data: any exception is its fault).
  """
  try:
    return decode_task(source[index])
  except Exception as e:  # pylint: disable=broad-except
    raise loading.RecordError(dataset, split, index, f"{type(e).__name__}: "
                                                      f"{loading.short_repr(str(e), 200)}") from e


class _Decoder:
  """`(index, record) -> Task`, or None for a record that does not decode (skipped, counted in
  `skipped` and logged; raised as a `loading.RecordError` with `on_error="raise"`)."""

  def __init__(self, dataset: str, split: str, on_error: str):
    self.dataset, self.split, self.on_error, self.skipped = dataset, split, on_error, 0

  def __call__(self, item: tuple[int, Mapping[str, Any]]) -> Optional[task_lib.Task]:
    index, record = item
    try:
      return decode_record({index: record}, index, self.dataset, self.split)
    except loading.RecordError as e:
      if self.on_error == "raise":
        raise
      self.skipped += 1
      logging.warning("skipping a record that does not decode: %s", e)
      return None


def task_dataset(source: Sequence[Mapping[str, Any]], *, seed: Optional[int] = None,
                 num_epochs: Optional[int] = 1, shard_index: int = 0, shard_count: int = 1,
                 on_error: str = "skip", dataset: str = "tfds", split: str = "?"
                 ) -> grain.MapDataset:
  """A grain `MapDataset` of `Task`s over a TFDS data source.

  A record that does not decode is skipped: iterating leaves it out, and `ds[i]` is None for it
  (grain's `filter`), so `len(ds)` still counts records.

  Args:
    source: a random-access data source, e.g. `tfds.data_source(...)[split]`.
    seed: shuffle seed (a new order each epoch); None keeps the stored order.
    num_epochs: repetitions; None repeats forever.
    shard_index, shard_count: this process's shard (`source[shard_index::shard_count]`),
      e.g. `jax.process_index()`, `jax.process_count()`.
    on_error: `"skip"` (log and leave out a record that does not decode) or `"raise"` (a
      `loading.RecordError` when it is read).
    dataset, split: the data set's name and split, for error messages.

  Raises:
    ValueError: for a shard index outside `[0, shard_count)`, a non-positive epoch count or an
      unknown `on_error`.
  """
  loading.check_on_error(on_error)
  if shard_count < 1 or not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index must be in [0, shard_count={shard_count}), got {shard_index}")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs}")
  ds = grain.MapDataset.source(source).map_with_index(lambda i, record: (i, record))
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  if seed is not None:
    ds = ds.shuffle(seed=seed)
  if num_epochs != 1:
    ds = ds.repeat(num_epochs)
  return ds.map(_Decoder(dataset, split, on_error)).filter(lambda t: t is not None)


def build(data_dir: str, config: Union[str, SyntheticCodingConfig] = "default"
          ) -> SyntheticCoding:
  """Prepares the dataset in `data_dir` (array_record files) and returns its builder."""
  builder = SyntheticCoding(config=config, data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  return builder


def load_split(split: str, data_dir: str, config_name: str = "default", **kwargs
               ) -> grain.MapDataset:
  """`task_dataset` over a prepared split, via `tfds.data_source` (no TensorFlow).

  Raises:
    ValueError: for an unknown split.
  """
  if split not in synthetic.SPLITS:
    raise ValueError(f"split must be one of {synthetic.SPLITS}, got {split!r}")
  source = tfds.data_source(f"{NAME}/{config_name}", split=split, data_dir=data_dir,
                            download=False)
  return task_dataset(source, dataset=f"{NAME}/{config_name}", split=split, **kwargs)
