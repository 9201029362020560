"""Tests for agentic_grpo.config and the experiment configs."""

import importlib
import pathlib

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from agentic_grpo import config as config_lib
from agentic_grpo import parallel
from agentic_grpo.models import presets
from experiments import outcome_grpo
from experiments import qwen2_5_coder_1_5b_stdio
from experiments import qwen3_8b_pod
from experiments import tiny_codegen
from launch import plan

_EXPERIMENTS = pathlib.Path(__file__).resolve().parent.parent / "experiments"
# Experiment configs: the modules of experiments/ with a `get_config`.
_CONFIGS = sorted(p.stem for p in _EXPERIMENTS.glob("*.py")
                  if "\ndef get_config(" in p.read_text())


def _plan(module) -> plan.Plan:
  """`launch.plan`'s per-device memory of an experiment's run on its hardware."""
  cfg = config_lib.from_config_dict(module.get_config())
  shape = parallel.resolve_mesh_shape((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor),
                                      module.NUM_DEVICES)
  model, _ = plan.model_from_flags(module.PLAN_PRESET, param_dtype=cfg.model.param_dtype)
  return plan.make_plan(
      model, shape, learner_rows=cfg.rl.rows_per_update, seq_len=cfg.rl.buckets[-1],
      micro_batches=cfg.rl.micro_batches, sample_rows=cfg.rl.tasks_per_batch * cfg.rl.group_size,
      cache_len=cfg.rl.buckets[-1] + cfg.workflow.max_new_tokens, optim=cfg.optim,
      rules=cfg.mesh.rules())


class ConfigTest(parameterized.TestCase):

  def test_every_experiment_config_is_found(self):
    self.assertContainsSubset({"tiny_codegen", "outcome_grpo", "full_workflow", "code_debug",
                               "qwen2_5_coder_1_5b_stdio", "qwen3_8b_pod"}, _CONFIGS)

  @parameterized.parameters(*_CONFIGS)
  def test_experiments_resolve(self, name):
    cfg = config_lib.from_config_dict(importlib.import_module(f"experiments.{name}").get_config())
    self.assertIsInstance(cfg, config_lib.TrainConfig)
    self.assertIsInstance(cfg.rl, config_lib.RLSection)
    self.assertIsInstance(cfg.rl.buckets, tuple)

  @parameterized.parameters(qwen2_5_coder_1_5b_stdio, qwen3_8b_pod)
  def test_real_runs_start_from_the_pretrained_chat_model(self, module):
    cfg = config_lib.from_config_dict(module.get_config())
    self.assertEqual((cfg.model.source, cfg.model.param_dtype), ("hf", "bfloat16"))
    self.assertEqual((cfg.task.source, cfg.task.stdio_layout), ("stdio", "codecontests"))
    self.assertEqual(cfg.workflow.prompt_format, "chat")
    self.assertEqual(cfg.warmstart.steps, 0)
    self.assertBetween(cfg.rl.group_size, 8, 16)
    self.assertLessEqual(cfg.optim.learning_rate, 2e-6)
    self.assertBetween(cfg.loss.kl_beta, 1e-4, 1e-2)
    self.assertEqual(cfg.loss.max_tokens, cfg.workflow.max_new_tokens)
    # The model checkpoint is as long as a row plus a stage's new tokens (32k / 40k positions).
    self.assertLessEqual(cfg.rl.buckets[-1] + cfg.workflow.max_new_tokens,
                         presets.get_model_config(module.PLAN_PRESET).max_seq_len)

  @parameterized.parameters(qwen2_5_coder_1_5b_stdio, qwen3_8b_pod)
  def test_launch_plan_says_the_real_runs_fit(self, module):
    p = _plan(module)
    self.assertIn(": fits", plan.format_plan(p, module.PLAN_PRESET, module.HBM_GIB))
    self.assertLessEqual(max(p.total, p.sampling_total), module.HBM_GIB * plan.GIB)
    self.assertEqual(p.rows_per_device, 1)

  def test_qwen3_8b_pod_is_a_v5p_64_slice_of_qwen3_8b(self):
    p = _plan(qwen3_8b_pod)
    self.assertEqual(p.mesh_shape, (1, 8, 4))
    self.assertBetween(p.num_params, 8.1e9, 8.3e9)
    # Parameters (bf16) sharded 32 ways: about 16.4 GB / 32 per chip.
    self.assertBetween(p.params, 2 * p.num_params / 32, 1.01 * 2 * p.num_params / 32)

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
    # Dynamic sampling and the pass-rate filter are off by default.
    self.assertEqual((cfg.rl.dynamic_sampling, cfg.rl.pass_rate_filter), (False, ()))
    on = config_lib.from_config_dict({"rl": {"dynamic_sampling": True,
                                             "pass_rate_filter": [0, 1]}})
    self.assertEqual((on.rl.dynamic_sampling, on.rl.pass_rate_filter), (True, (0.0, 1.0)))

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
      ("final_reward_lag", {"rl": {"final_reward_lag": -1}},
       r"config\.rl\.final_reward_lag must be >= 0, got -1"),
      ("final_reward_jitter", {"workflow": {"final_reward_jitter_s": -0.5}},
       r"config\.workflow\.final_reward_jitter_s must be >= 0, got -0\.5"),
      ("dynamic_sampling_cap", {"rl": {"dynamic_sampling_max_batches": -1}},
       r"config\.rl\.dynamic_sampling_max_batches must be >= 0 \(0 = no cap\), got -1"),
      ("pass_rate_order", {"rl": {"pass_rate_filter": (0.8, 0.2)}},
       r"config\.rl\.pass_rate_filter must be \(\) \(off\) or \(lo, hi\) with 0 <= lo <= hi "
       r"<= 1, got \(0\.8, 0\.2\)"),
      ("pass_rate_range", {"rl": {"pass_rate_filter": (0.2, 1.5)}},
       r"config\.rl\.pass_rate_filter must be"),
      ("pass_rate_arity", {"rl": {"pass_rate_filter": (0.2,)}},
       r"config\.rl\.pass_rate_filter must be"),
      ("prefill_width_bucket", {"rl": {"buckets": (128, 256), "prefill_widths": (128,)}},
       r"config\.rl\.prefill_widths must be \(\) \(off\) or strictly increasing"),
      ("prefill_width_above", {"rl": {"buckets": (128, 256), "prefill_widths": (320,)}},
       r"config\.rl\.prefill_widths must be"),
      ("prefill_width_order", {"rl": {"buckets": (128, 256), "prefill_widths": (192, 160)}},
       r"config\.rl\.prefill_widths must be"),
      ("attention_backward", {"model": {"attention_backward": "flash"}},
       r"config\.model\.attention_backward must be one of"),
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

  def test_string_overrides_set_fields_and_name_a_bad_one(self):
    c = tiny_codegen.get_config()
    config_lib.apply_overrides(c, ["optim.learning_rate=2e-4", "rl.rows_per_update=16",
                                   "optim.schedule=constant", "rl.buckets=(128, 256)",
                                   "workflow.stages=('code',)", "rl.dynamic_sampling=True"])
    cfg = config_lib.from_config_dict(c)
    self.assertEqual((cfg.optim.learning_rate, cfg.rl.rows_per_update, cfg.optim.schedule,
                      tuple(cfg.rl.buckets), tuple(cfg.workflow.stages), cfg.rl.dynamic_sampling),
                     (2e-4, 16, "constant", (128, 256), ("code",), True))
    for bad in ("optim.learning_rat=1e-4", "rl.rows_per_update", "nope.x=1", "rl=1",
                "rl.rows_per_update='many'", "rl.rows_per_update.x=1"):
      with self.subTest(bad), self.assertRaisesRegex(ValueError, "override"):
        config_lib.apply_overrides(c, [bad])
    self.assertEqual(c.rl.rows_per_update, 16)  # a bad override changes nothing


if __name__ == "__main__":
  absltest.main()
