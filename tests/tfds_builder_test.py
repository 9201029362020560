"""Tests for agentic_grpo.tasks.tfds_builder: array_record build, data source, grain pipeline."""

import shutil
import sys
import tempfile

from absl.testing import absltest

from agentic_grpo import config as config_lib
from agentic_grpo.tasks import sources
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib
from agentic_grpo.tasks import tfds_builder


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
