"""Tests for agentic_grpo.config and the experiment configs."""

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from agentic_grpo import config as config_lib
from experiments import code_debug
from experiments import full_workflow
from experiments import outcome_grpo
from experiments import tiny_codegen


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(tiny_codegen, outcome_grpo, full_workflow, code_debug)
  def test_experiments_resolve(self, module):
    cfg = config_lib.from_config_dict(module.get_config())
    self.assertIsInstance(cfg, config_lib.TrainConfig)
    self.assertIsInstance(cfg.rl, config_lib.RLSection)
    self.assertIsInstance(cfg.rl.buckets, tuple)

  def test_baseline_differs_only_in_stage_rewards_and_correction(self):
    a = config_lib.to_dict(config_lib.from_config_dict(tiny_codegen.get_config()))
    b = config_lib.to_dict(config_lib.from_config_dict(outcome_grpo.get_config()))
    self.assertTrue(a["workflow"].pop("stage_rewards"))
    self.assertFalse(b["workflow"].pop("stage_rewards"))
    self.assertTrue(a["correction"].pop("enabled"))
    self.assertFalse(b["correction"].pop("enabled"))
    self.assertEqual(a, b)

  def test_round_trip_and_defaults(self):
    cfg = config_lib.TrainConfig()
    again = config_lib.from_config_dict(ml_collections.ConfigDict(config_lib.to_dict(cfg)))
    self.assertEqual(again, cfg)
    # Missing fields take defaults.
    self.assertEqual(config_lib.from_config_dict({"rl": {"group_size": 4}}).rl.group_size, 4)
    self.assertEqual(cfg.loss.dual_clip, 0.0)  # off: the default run's numbers are unchanged
    self.assertEqual(cfg.rl.max_skipped_updates, 3)
    on = config_lib.from_config_dict({"loss": {"dual_clip": 3}, "rl": {"max_skipped_updates": 0}})
    self.assertEqual((on.loss.dual_clip, on.rl.max_skipped_updates), (3.0, 0))

  @parameterized.named_parameters(
      ("range", {"rl": {"group_size": 1}}, r"config\.rl\.group_size must be >= 2, got 1"),
      ("type", {"rl": {"group_size": "8"}}, r"config\.rl\.group_size must be an int"),
      ("bool", {"workflow": {"stage_rewards": 1}}, r"config\.workflow\.stage_rewards must be"),
      ("choice", {"loss": {"aggregation": "sum"}}, r"config\.loss\.aggregation must be one of"),
      ("unknown", {"rl": {"grup_size": 8}}, r"config\.rl\.grup_size"),
      ("unknown_section", {"rll": {}}, r"config\.rll"),
      ("tuple_elem", {"rl": {"buckets": (64, "x")}}, r"config\.rl\.buckets\[1\]"),
      ("buckets", {"rl": {"buckets": (256, 128)}}, r"config\.rl\.buckets must be strictly"),
      ("divide", {"rl": {"rows_per_update": 10, "micro_batches": 3}},
       r"config\.rl\.micro_batches must be >= 1 and divide"),
      ("cross", {"warmstart": {"seq_len": 512}, "rl": {"buckets": (128, 256)}},
       r"config\.warmstart\.seq_len must be <="),
      ("sum_norm", {"loss": {"aggregation": "seq_mean_token_sum_norm"}},
       r"config\.loss\.max_tokens must be > 0"),
      ("section", {"rl": 3}, r"config\.rl must be a section"),
      ("schedule", {"optim": {"schedule": "linear"}}, r"config\.optim\.schedule must be"),
      ("baseline", {"correction": {"baseline": "critic"}},
       r"config\.correction\.baseline must be one of"),
      ("stage_credit", {"correction": {"stage_credit": "later"}},
       r"config\.correction\.stage_credit must be one of"),
      ("rules", {"mesh": {"logical_axis_rules": (("embed", "fsdp,model"),)}},
       r"config\.mesh\.logical_axis_rules\[0\] must name mesh axes"),

      ("dual_clip", {"loss": {"dual_clip": 1.0}}, r"config\.loss\.dual_clip must be 0 \(off\) or > 1"),
      ("dual_clip_negative", {"loss": {"dual_clip": -3.0}}, r"config\.loss\.dual_clip must be"),
      ("max_skipped", {"rl": {"max_skipped_updates": -1}},
       r"config\.rl\.max_skipped_updates must be >= 0"),
      ("max_skipped_guard", {"rl": {"max_skipped_updates": 5},
                             "optim": {"max_consecutive_nonfinite": 4}},
       r"config\.rl\.max_skipped_updates must be <= optim\.max_consecutive_nonfinite"),
      ("model_source", {"model": {"source": "gguf"}}, r"config\.model\.source must be one of"),
      ("hf_without_path", {"model": {"source": "hf"}},
       r"config\.model\.path must name a checkpoint with source='hf', got ''"),
      ("hf_with_shape", {"model": {"source": "hf", "path": "/ckpt", "d_model": 64}},
       r"config\.model\.d_model must be 0 with source='hf'"),
      ("preset_with_path", {"model": {"path": "/ckpt"}},
       r"config\.model\.path must be empty with source='preset'"),
      ("param_dtype", {"model": {"param_dtype": "fp8"}},
       r"config\.model\.param_dtype must be one of"),
      ("collective_timeout", {"mesh": {"collective_timeout_s": 5}},
       r"config\.mesh\.collective_timeout_s must be 0 \(off\) or >= 10 seconds, got 5"),
  )
  def test_errors_name_the_field(self, data, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      config_lib.from_config_dict(data)

  def test_mesh_rules(self):
    cfg = config_lib.from_config_dict(
        {"mesh": {"logical_axis_rules": (("batch", "data,fsdp"), ("embed", ""),
                                         ("mlp", "tensor"))}})
    self.assertEqual(cfg.mesh.rules(), (("batch", ("data", "fsdp")), ("embed", None),
                                        ("mlp", "tensor")))
    self.assertIsNone(config_lib.TrainConfig().mesh.rules())

  def test_override_like_command_line(self):
    c = tiny_codegen.get_config()
    c.rl.group_size = 4
    c.rl.rows_per_update = 32
    cfg = config_lib.from_config_dict(c)
    self.assertEqual(cfg.rl.group_size, 4)
    self.assertEqual(cfg.rl.rows_per_update, 32)


if __name__ == "__main__":
  absltest.main()
