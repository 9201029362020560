"""Tests for agentic_grpo.config_drift."""

import dataclasses
import json

from absl.testing import absltest

from agentic_grpo import config as config_lib
from agentic_grpo import config_drift


def _saved(cfg: config_lib.TrainConfig) -> dict:
  return json.loads(json.dumps(config_lib.to_dict(cfg)))  # as read back from config.json


class ConfigDriftTest(absltest.TestCase):

  def test_every_field_is_classified_once(self):
    paths = set(config_drift.field_paths())
    self.assertIn("rl.group_size", paths)
    self.assertIn("seed", paths)
    self.assertEmpty(config_drift.FIXED & config_drift.MAY_CHANGE)
    self.assertEqual(paths - (config_drift.FIXED | config_drift.MAY_CHANGE), set(),
                     "unclassified config fields: add each to FIXED or MAY_CHANGE")
    self.assertEqual((config_drift.FIXED | config_drift.MAY_CHANGE) - paths, set(),
                     "classified fields that are not config fields")

  def test_refused_fields_are_listed_in_one_message(self):
    old = config_lib.TrainConfig()
    new = config_lib.from_config_dict({"rl": {"group_size": 4, "num_steps": 7},
                                       "workflow": {"stages": ["code"]},
                                       "model": {"d_model": 64}, "eval": {"every": 3}})
    with self.assertRaises(config_drift.ConfigDriftError) as ctx:
      config_drift.check(_saved(old), new, where="/runs/a")
    message = str(ctx.exception)
    self.assertIn("/runs/a", message)
    self.assertIn("3 field(s)", message)
    self.assertIn("config.rl.group_size: 8 -> 4", message)
    self.assertIn("config.model.d_model: 0 -> 64", message)
    self.assertIn("config.workflow.stages: ['hypothesis', 'code', 'tests', 'debug'] -> "
                  "['code']", message)
    self.assertNotIn("num_steps", message)
    self.assertNotIn("eval.every", message)

  def test_allowed_changes_are_returned(self):
    old = config_lib.TrainConfig()
    new = config_lib.from_config_dict({"rl": {"num_steps": 7}, "eval": {"every": 3},
                                       "checkpoint": {"every": 5}, "log": {"plot": False}})
    got = config_drift.check(_saved(old), new)
    self.assertEqual([c.field for c in got],
                     ["checkpoint.every", "eval.every", "log.plot", "rl.num_steps"])
    self.assertEqual((got[0].old, got[0].new), (20, 5))
    self.assertEqual(config_drift.check(_saved(old), old), [])

  def test_missing_saved_field_counts_as_its_default(self):
    old = _saved(config_lib.TrainConfig())
    del old["rl"]["group_size"]  # a config.json from before the field existed
    self.assertEqual(config_drift.check(old, config_lib.TrainConfig()), [])
    new = dataclasses.replace(config_lib.TrainConfig(),
                              rl=dataclasses.replace(config_lib.RLSection(), group_size=4))
    with self.assertRaisesRegex(config_drift.ConfigDriftError, "group_size: 8 -> 4"):
      config_drift.check(old, new)


if __name__ == "__main__":
  absltest.main()
