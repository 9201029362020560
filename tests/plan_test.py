"""Tests for launch/plan.py: per-device memory from shapes."""

import contextlib
import io
import json
import os

from absl.testing import absltest
from absl.testing import flagsaver
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import exit_codes
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo.models import placement
from agentic_grpo.models import presets
from agentic_grpo.models import transformer
from launch import plan

_TINY = transformer.ModelConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=8, mlp_dim=64,
    max_seq_len=64)


def _bytes_on_device(tree, shardings, device) -> int:
  """Bytes that `device` holds once `tree` is placed with `shardings` (measured)."""
  total = 0
  for a, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True):
    x = jax.device_put(np.zeros(a.shape, a.dtype), s)
    total += sum(sh.data.nbytes for sh in x.addressable_shards if sh.device == device)
  return total


class PlanTest(absltest.TestCase):

  def test_matches_arrays_placed_on_a_real_mesh(self):
    mesh = parallel.make_mesh((2, 2, 2))
    p = plan.make_plan(_TINY, (2, 2, 2), learner_rows=8, seq_len=16, sample_rows=8,
                       cache_len=32)
    sm = placement.shard_model(_TINY, mesh)
    dev = mesh.devices.flat[0]
    self.assertEqual(p.params, _bytes_on_device(sm.abstract_params, sm.param_shardings, dev))
    tx = learner.make_optimizer(config_lib.OptimSection())
    abstract_opt, opt_sh = placement.optimizer_state_shardings(tx, sm)
    self.assertEqual(p.opt_state, _bytes_on_device(abstract_opt, opt_sh, dev))
    cache_sh = placement.kv_cache_shardings(_TINY, mesh, 8, 32)
    cache = jax.eval_shape(lambda: transformer.init_cache(_TINY, 8, 32))
    self.assertEqual(p.kv_cache, _bytes_on_device(cache, cache_sh, dev))
    self.assertEqual(p.rows_per_device, 2)
    self.assertEqual(p.num_params, transformer.param_count(sm.abstract_params))

  def test_qwen2_7b_on_32_devices(self):
    c = presets.get_model_config("qwen2_7b")
    p = plan.make_plan(c, (1, 8, 4), learner_rows=64, seq_len=1024, micro_batches=4,
                       sample_rows=128, cache_len=2048)
    # Matrices split 32 ways (bf16); norm scales and biases have no second axis to
    # split, so they are replicated over one of fsdp / tensor: a tiny excess.
    excess = p.params * 32 - p.num_params * 2
    self.assertBetween(excess, 1, 1e-3 * p.num_params * 2)
    # Float32 (twice the bf16 bytes): accumulator + one micro-batch.
    self.assertEqual(p.grads, 2 * 2 * p.params)
    # Float32 AdamW moments (2 x 2) and float32 master copy (2) of the bf16 parameters, plus a
    # few scalar counters.
    self.assertBetween(p.opt_state - 6 * p.params, 0, 1024)
    # KV cache: 128 rows over fsdp 8, 4 kv heads over tensor 4.
    kv = (128 // 8) * 2048 * c.n_layers * 2 * (c.n_kv_heads // 4) * c.head_dim * 2
    self.assertEqual(p.kv_cache, kv + (128 // 8) * 2048 + 4)  # + valid mask, int32 index
    self.assertEqual(p.rows_per_device, 2)

  def test_more_sharding_less_memory_and_activations_scale(self):
    base = dict(learner_rows=16, seq_len=32, sample_rows=16, cache_len=64)
    p1 = plan.make_plan(_TINY, (8, 1, 1), **base)
    p2 = plan.make_plan(_TINY, (1, 8, 1), **base)
    self.assertLess(p2.params, p1.params)
    self.assertEqual(p1.activations, p2.activations)  # same rows per device
    longer = plan.make_plan(_TINY, (8, 1, 1), **dict(base, seq_len=64))
    self.assertGreater(longer.activations, 2 * p1.activations)  # attention is quadratic
    more_rows = plan.make_plan(_TINY, (8, 1, 1), **dict(base, learner_rows=32))
    self.assertEqual(more_rows.activations, 2 * p1.activations)

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "micro_batches"):
      plan.make_plan(_TINY, (1, 1, 1), learner_rows=6, seq_len=8, micro_batches=4,
                     sample_rows=1, cache_len=8)
    with self.assertRaisesRegex(ValueError, "seq_len"):
      plan.make_plan(_TINY, (1, 1, 1), learner_rows=4, seq_len=0, sample_rows=1, cache_len=8)

  def test_hf_config(self):
    # A Qwen3-8B config.json (keys as published) sizes like the qwen3_8b preset.
    path = os.path.join(self.create_tempdir().full_path, "config.json")
    with open(path, "w") as f:
      json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                 "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                 "rope_theta": 1000000, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16"}, f)
    config, name = plan.model_from_flags("tiny", path)
    self.assertEqual(config, presets.get_model_config("qwen3_8b"))
    self.assertEqual(name, f"qwen3 from {path}")
    f32, _ = plan.model_from_flags("tiny", os.path.dirname(path), "float32")
    self.assertEqual(f32.param_dtype, np.float32)
    out = io.StringIO()
    with flagsaver.flagsaver(hf_config=path, mesh="1,8,1", num_devices=0):
      with contextlib.redirect_stdout(out):
        plan.main(["plan"])
    self.assertRegex(out.getvalue(), r"model qwen3 from .*: 8\.19B parameters \(8,19\d,\d{3},\d{3}\)")
    with self.assertRaisesRegex(errors.InputError, "--hf_config '/nonexistent': no config.json"):
      plan.model_from_flags("tiny", "/nonexistent")
    with open(path, "w") as f:  # architectures and model_type of different families
      json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "llama"}, f)
    with self.assertRaisesRegex(errors.InputError, "disagree"):
      plan.model_from_flags("tiny", path)
    with self.assertRaisesRegex(errors.InputError, "--model must be one of"):
      plan.model_from_flags("qwen9_1t")

  def test_main_prints_the_table_and_exits_non_zero_when_it_does_not_fit(self):
    out = io.StringIO()
    with flagsaver.flagsaver(model="qwen2_0_5b", mesh="2,-1,1", num_devices=8, hbm_gib=0.001,
                             seq_len=64, cache_len=64, learner_rows=8, sample_rows=8):
      with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as exited:
        plan.main(["plan"])
    self.assertEqual(exited.exception.code, exit_codes.DOES_NOT_FIT)
    text = out.getvalue()
    self.assertIn("(2, 4, 1), 8 devices", text)
    self.assertIn("does NOT fit", text)
    for row in ("parameters", "optimizer state", "KV cache", "activations"):
      self.assertIn(row, text)
    out = io.StringIO()
    with flagsaver.flagsaver(model="qwen2_0_5b", mesh="2,-1,1", num_devices=8, hbm_gib=1000,
                             seq_len=64, cache_len=64, learner_rows=8, sample_rows=8):
      with contextlib.redirect_stdout(out):
        plan.main(["plan"])  # fits: returns (exit 0)
    self.assertIn("of 1000 GiB per device: fits", out.getvalue())

  def test_small_parameter_counts_are_legible(self):
    for n, text in ((0, "0"), (950, "950"), (12_345, "12.3K"), (999_999, "1.00M"), (9_996, "10.0K"),
                    (1_020_000, "1.02M"), (494_032_768, "494M"), (8_190_735_360, "8.19B"),
                    (1.5e12, "1.50T")):
      self.assertEqual(plan.format_count(int(n)), text, n)
    with self.assertRaises(ValueError):
      plan.format_count(-1)
    p = plan.make_plan(_TINY, (1, 1, 1), learner_rows=4, seq_len=16, sample_rows=4, cache_len=32)
    line = plan.format_plan(p, "tiny").splitlines()[0]
    self.assertEqual(line, f"model tiny: {plan.format_count(p.num_params)} parameters "
                           f"({p.num_params:,})")
    self.assertNotIn("0.000", line)  # was "0.000 B parameters" for a test-sized model

  def test_input_mistakes_are_one_line_and_exit_78(self):
    for flags_, pattern in (
        (dict(mesh="2,x,1"), r"--mesh must be three comma-separated ints"),
        (dict(mesh="2,-1,1", num_devices=0), r"--mesh has a -1: give --num_devices"),
        (dict(mesh="1,1,1", model="nope"), r"--model must be one of"),
        (dict(mesh="1,1,1", model="qwen2_0_5b", micro_batches=3, learner_rows=8),
         r"--micro_batches \(3\) must divide --learner_rows \(8\)"),
        (dict(mesh="1,1,1", hf_config="/nonexistent"), r"--hf_config '/nonexistent'")):
      err = io.StringIO()
      with flagsaver.flagsaver(**flags_), contextlib.redirect_stderr(err):
        with self.assertRaises(SystemExit) as exited:
          plan.main(["plan"])
      self.assertEqual(exited.exception.code, exit_codes.CONFIG_ERROR, flags_)
      self.assertLen(err.getvalue().splitlines(), 1, err.getvalue())
      self.assertRegex(err.getvalue(), "^error: " + pattern)


if __name__ == "__main__":
  absltest.main()
