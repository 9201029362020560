"""Tests for agentic_grpo.models.hf_export: where the export goes, and what it never overwrites.

The exported files themselves are checked by the import/export round trips in sources_test.
"""

import os
from unittest import mock

from absl.testing import absltest

from agentic_grpo.models import hf_export
from agentic_grpo.models import hf_import
from agentic_grpo.models import transformer

_CONFIG = transformer.ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2,
                                  n_kv_heads=1, head_dim=8, mlp_dim=24, max_seq_len=32)


class ExportTargetTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    _, self.params = transformer.init_model(_CONFIG, 0)
    self.root = self.create_tempdir().full_path

  def test_an_empty_directory_is_replaced_by_the_export(self):
    out = os.path.join(self.root, "out")
    os.makedirs(out)
    hf_export.export_hf(out, _CONFIG, self.params)
    config, _ = hf_import.load_hf_checkpoint(out)
    self.assertEqual(config.d_model, _CONFIG.d_model)
    self.assertFalse(os.path.exists(out + ".partial"))

  def test_a_file_in_the_way_is_named_before_anything_is_written(self):
    out = os.path.join(self.root, "out")
    with open(out, "w") as f:
      f.write("mine")
    with self.assertRaisesRegex(ValueError, f"{out!r} exists and is not a directory"):
      hf_export.export_hf(out, _CONFIG, self.params)
    self.assertEqual(os.listdir(self.root), ["out"])

  def test_a_directory_filled_while_exporting_is_not_overwritten(self):
    out = os.path.join(self.root, "out")
    write_tensors = hf_export._write_tensors

    def and_another_writer(*args, **kwargs):
      write_tensors(*args, **kwargs)
      os.makedirs(out)
      with open(os.path.join(out, "theirs.txt"), "w") as f:
        f.write("theirs")

    with mock.patch.object(hf_export, "_write_tensors", and_another_writer):
      with self.assertRaisesRegex(FileExistsError, f"{out!r} was written to while exporting.*"
                                                   f"{out + '.partial'!r}"):
        hf_export.export_hf(out, _CONFIG, self.params)
    self.assertEqual(os.listdir(out), ["theirs.txt"])
    config, _ = hf_import.load_hf_checkpoint(out + ".partial")  # the finished export
    self.assertEqual(config.d_model, _CONFIG.d_model)


if __name__ == "__main__":
  absltest.main()
