"""Tests for agentic_grpo.tasks.tfds_builder: array_record build, data source, grain pipeline."""

import json
import shutil
import sys
import tempfile

from absl.testing import absltest
from etils import epath

from agentic_grpo import config as config_lib
from agentic_grpo.tasks import loading
from agentic_grpo.tasks import sources
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib
from agentic_grpo.tasks import tfds_builder


def _stdio_record(i: int, time_seconds: float) -> dict:
  """A stdio task record as a data set built by an older version may hold it: the limit is
  written as is, even over today's `task.MAX_TIME_SECONDS`."""
  t = task_lib.Task(task_id=f"legacy-{i}", prompt="Print a + b.\n", entry_point="main",
                    signature="main()", public_examples=(task_lib.Example(("1 2\n",), "3\n"),),
                    hidden_tests=(task_lib.Example(("5 7\n",), "12\n"),), source="stdio",
                    stdio=task_lib.StdioSpec(time_seconds=2.0))
  d = task_lib.task_to_dict(t)
  d["stdio"]["time_seconds"] = time_seconds
  return {"task_id": t.task_id, "task": json.dumps(d), "program": "", "difficulty": 0}


class LegacyStdio(tfds_builder.SyntheticCoding):
  """Five stdio tasks a split; record 1 asks 1000 s (over the cap), record 3 is not JSON."""

  BUILDER_CONFIGS = [tfds_builder.SyntheticCodingConfig(
      name="tiny", num_train=5, num_validation=5, num_test=5)]
  DEFAULT_CONFIG_NAME = "tiny"
  pkg_dir_path = epath.Path(tfds_builder.__file__).parent  # a test module is not a package

  def _generate_examples(self, split):
    for i in range(5):
      record = _stdio_record(i, 1000.0 if i == 1 else 2.0)
      if i == 3:
        record["task"] = "{not json"
      yield i, record


class UndecodableRecordsTest(absltest.TestCase):
  """A record that does not decode is read during the run: skipped and counted, or raised
  naming the data set, split and record; never another error mid-run."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp(prefix="tfds_legacy_test")
    LegacyStdio(data_dir=cls.data_dir, file_format="array_record").download_and_prepare()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def _section(self, **kw):
    section = config_lib.TaskSection(source="tfds", path=self.data_dir,
                                     tfds_name="legacy_stdio/tiny", **kw)
    section.validate("task")
    return section

  def _stored(self, split):
    """The split's data source and its task ids in stored order (TFDS shuffles on writing)."""
    source = tfds_builder.tfds.data_source("legacy_stdio/tiny", split=split,
                                           data_dir=self.data_dir, download=False)
    return source, [r["task_id"].decode() for r in source]

  def test_task_source_skips_and_counts(self):
    tasks = sources.TASK_SOURCES.get("tfds")(self._section())
    _, ids = self._stored("train")
    good = {"legacy-0", "legacy-2", "legacy-4"}
    # A bad record gives the next record that decodes (cyclically): every process agrees.
    want = [next(ids[(i + k) % 5] for k in range(5) if ids[(i + k) % 5] in good)
            for i in range(10)]
    self.assertEqual([tasks.task("train", i).task_id for i in range(10)], want)
    self.assertEqual(tasks.skipped, 2)
    self.assertEqual(tasks.task("test", ids.index("legacy-1")).stdio.time_seconds, 2.0)

  def test_task_source_raises_naming_the_record(self):
    tasks = sources.TASK_SOURCES.get("tfds")(self._section(on_error="raise"))
    _, ids = self._stored("validation")
    self.assertEqual(tasks.task("validation", ids.index("legacy-0")).task_id, "legacy-0")
    over, garbled = ids.index("legacy-1"), ids.index("legacy-3")
    with self.assertRaisesRegex(loading.RecordError, rf"data set 'legacy_stdio/tiny', split "
                                rf"'validation', record {over}: ValueError: .*StdioSpec\."
                                rf"time_seconds must be a number in \(0, 60\]"):
      tasks.task("validation", over)
    with self.assertRaisesRegex(loading.RecordError, rf"record {garbled}: .*not JSON"):
      tasks.task("validation", garbled + 5)

  def test_grain_pipeline_skips_or_raises(self):
    source, ids = self._stored("train")
    ds = tfds_builder.task_dataset(source, dataset="legacy_stdio/tiny", split="train")
    want = [i for i in ids if i in ("legacy-0", "legacy-2", "legacy-4")]
    self.assertEqual([t.task_id for t in ds], want)
    self.assertIsNone(ds[ids.index("legacy-1")])
    twice = tfds_builder.task_dataset(source, seed=1, num_epochs=2, shard_index=0,
                                      shard_count=1)
    self.assertCountEqual([t.task_id for t in twice], want * 2)
    strict = tfds_builder.task_dataset(source, on_error="raise", dataset="legacy_stdio/tiny",
                                       split="train")
    first_bad = min(ids.index("legacy-1"), ids.index("legacy-3"))
    with self.assertRaisesRegex(loading.RecordError, rf"split 'train', record {first_bad}: "):
      list(strict)
    with self.assertRaisesRegex(ValueError, "on_error"):
      tfds_builder.task_dataset(source, on_error="ignore")


class TfdsBuilderTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp(prefix="tfds_builder_test")
    cls.builder = tfds_builder.build(cls.data_dir, "tiny")
    cls.source = cls.builder.as_data_source()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def test_splits_and_files(self):
    config = self.builder.builder_config
    self.assertEqual({k: len(v) for k, v in self.source.items()},
                     {s: config.size(s) for s in synthetic.SPLITS})
    files = [p.name for p in self.builder.data_path.iterdir()]
    for split in synthetic.SPLITS:
      self.assertTrue(any(f.startswith(f"{tfds_builder.NAME}-{split}.array_record") for f in files),
                      files)

  def test_records_are_the_generated_tasks(self):
    gen = synthetic.SyntheticTasks(self.builder.builder_config.generator)
    for split in synthetic.SPLITS:
      tasks = [tfds_builder.decode_task(r) for r in self.source[split]]
      ids = sorted(int(t.task_id.rsplit("-", 1)[1]) for t in tasks)
      self.assertEqual(ids, list(range(len(tasks))))
      for t in tasks[:5]:
        index = int(t.task_id.rsplit("-", 1)[1])
        self.assertEqual(t, gen.task(split, index))

  def test_splits_disjoint(self):
    prompts = {s: {tfds_builder.decode_task(r).prompt for r in self.source[s]}
               for s in synthetic.SPLITS}
    self.assertEmpty(prompts["train"] & prompts["test"])
    self.assertEmpty(prompts["train"] & prompts["validation"])
    self.assertEmpty(prompts["validation"] & prompts["test"])

  def test_grain_pipeline(self):
    ds = tfds_builder.load_split("train", self.data_dir, "tiny", seed=3)
    again = tfds_builder.load_split("train", self.data_dir, "tiny", seed=3)
    stored = tfds_builder.task_dataset(self.source["train"])
    self.assertLen(ds, len(self.source["train"]))
    self.assertIsInstance(ds[0], task_lib.Task)
    ids = [t.task_id for t in ds]
    self.assertEqual(ids, [t.task_id for t in again])  # deterministic for a seed
    self.assertCountEqual(ids, [t.task_id for t in stored])  # a permutation
    self.assertNotEqual(ids, [t.task_id for t in stored])
    two = tfds_builder.task_dataset(self.source["test"], num_epochs=2)
    self.assertLen(two, 2 * len(self.source["test"]))
    shards = [[t.task_id for t in tfds_builder.task_dataset(self.source["train"], shard_index=i,
                                                             shard_count=3)] for i in range(3)]
    self.assertCountEqual(sum(shards, []), ids)

  def test_task_source_registry(self):
    section = config_lib.TaskSection(source="tfds", path=self.data_dir,
                                     tfds_name=f"{tfds_builder.NAME}/tiny")
    section.validate("task")
    tasks = sources.TASK_SOURCES.get("tfds")(section)
    gen = synthetic.SyntheticTasks(self.builder.builder_config.generator)
    for split in synthetic.SPLITS:
      self.assertEqual(tasks.size(split), len(self.source[split]))
      want = tfds_builder.decode_task(self.source[split][1])
      self.assertEqual(tasks.task(split, 1), want)
      self.assertEqual(tasks.task(split, 1 + tasks.size(split)), want)  # wraps around
      index = int(want.task_id.rsplit("-", 1)[1])
      self.assertEqual(want, gen.task(split, index))
    with self.assertRaisesRegex(ValueError, r"config\.task\.tfds_name"):
      config_lib.TaskSection(source="tfds", path=self.data_dir).validate("task")
    with self.assertRaisesRegex(ValueError, "no readable split"):
      sources.TASK_SOURCES.get("tfds")(config_lib.TaskSection(
          source="tfds", path=self.data_dir, tfds_name="no_such_set/x"))

  def test_no_tensorflow(self):
    self.assertNotIn("tensorflow", sys.modules)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "shard_index"):
      tfds_builder.task_dataset(self.source["train"], shard_index=2, shard_count=2)
    with self.assertRaisesRegex(ValueError, "num_epochs"):
      tfds_builder.task_dataset(self.source["train"], num_epochs=0)
    with self.assertRaisesRegex(ValueError, "'task' field"):
      tfds_builder.decode_task({"program": b"L:sort"})
    with self.assertRaisesRegex(ValueError, "split"):
      tfds_builder.load_split("dev", self.data_dir, "tiny")
    with self.assertRaisesRegex(ValueError, "num_test"):
      tfds_builder.SyntheticCodingConfig(name="bad", num_test=0)


if __name__ == "__main__":
  absltest.main()
