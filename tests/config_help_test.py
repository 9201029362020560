"""Tests for agentic_grpo.config_help."""

from absl.testing import absltest

from agentic_grpo import config_drift
from agentic_grpo import config_help


class ConfigHelpTest(absltest.TestCase):

  def test_every_field_has_a_doc(self):
    found = config_help.fields()
    self.assertEqual([f.path for f in found], config_drift.field_paths())
    undocumented = [f.path for f in found if not f.doc]
    self.assertEqual(undocumented, [], "document these fields in their section's Attributes:")

  def test_docs_join_continuation_lines(self):
    docs = {f.path: f for f in config_help.fields()}
    self.assertEqual(docs["rl.group_size"].doc, "attempts per task (G), the GRPO group.")
    self.assertEqual(docs["rl.group_size"].default, 8)
    self.assertEqual(docs["rl.group_size"].type, "int")
    self.assertTrue(docs["model.max_seq_len"].doc.endswith("workflow.max_new_tokens)."))

  def test_nearest(self):
    self.assertEqual(config_help.nearest("rl.grop_size"), "rl.group_size")
    self.assertEqual(config_help.nearest("evall"), "eval")
    self.assertIsNone(config_help.nearest("zzzzzz.qqqq"))

  def test_show_lists_every_field_with_value_and_default(self):
    text = config_help.show({"rl.group_size": 4})
    self.assertIn("config.rl.group_size = 4  (int, default 8) attempts per task", text)
    self.assertIn("config.eval.every = 20  (int) evaluate every", text)
    self.assertEqual(sum(line.startswith("config.") for line in text.splitlines()),
                     len(config_help.fields()))


if __name__ == "__main__":
  absltest.main()
