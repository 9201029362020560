"""Tests for agentic_grpo.models.hf_import against checkpoints saved by `transformers`.

The fixtures in tests/fixtures/hf were written by tests/fixtures/make_hf_fixtures.py
(tiny random models and their float32 logits from a Hugging Face forward pass);
this test needs neither torch nor transformers.
"""

import dataclasses
import json
import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from agentic_grpo.models import hf_import
from agentic_grpo.models import transformer

_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
_CASES = ("llama_tied_gqa", "llama_untied_rope", "qwen2_tied_bias", "qwen2_untied_sharded")
_apply = jax.jit(transformer.apply, static_argnums=0)


def _logits(config, params, tokens):
  graphdef, _ = transformer.abstract_model(config)
  positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
  return np.asarray(_apply(graphdef, params, tokens, positions)[0])


class ParityTest(parameterized.TestCase):

  @parameterized.parameters(*_CASES)
  def test_logits_match_transformers(self, case):
    path = os.path.join(_FIXTURES, case)
    ref = np.load(os.path.join(path, "reference.npz"))
    config, params = hf_import.load_hf_checkpoint(path)
    for leaf in jax.tree.leaves(params):
      self.assertIsInstance(leaf, jax.Array)
      self.assertEqual(leaf.dtype, jnp.float32)
    logits = _logits(config, params, ref["tokens"])
    self.assertEqual(logits.shape, ref["logits"].shape)
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-4, rtol=0)

  def test_configs_cover_the_options(self):
    configs = {c: hf_import.load_hf_checkpoint(os.path.join(_FIXTURES, c))[0] for c in _CASES}
    self.assertTrue(configs["llama_tied_gqa"].tie_embeddings)
    self.assertEqual(configs["llama_tied_gqa"].group_size, 2)
    self.assertFalse(configs["llama_untied_rope"].tie_embeddings)
    self.assertEqual(configs["llama_untied_rope"].rope_theta, 50_000.0)
    self.assertEqual(configs["llama_untied_rope"].rope_scaling.factor, 8.0)
    self.assertTrue(configs["qwen2_tied_bias"].qkv_bias)
    self.assertEqual(configs["qwen2_tied_bias"].rope_theta, 1e6)
    self.assertFalse(configs["llama_tied_gqa"].qkv_bias)
    self.assertTrue(os.path.isfile(os.path.join(_FIXTURES, "qwen2_untied_sharded",
                                                "model.safetensors.index.json")))

  def test_rope_scaling_matters(self):
    # The parity test would catch a missing Llama 3 frequency scaling.
    path = os.path.join(_FIXTURES, "llama_untied_rope")
    ref = np.load(os.path.join(path, "reference.npz"))
    config, params = hf_import.load_hf_checkpoint(path)
    unscaled = _logits(dataclasses.replace(config, rope_scaling=None), params, ref["tokens"])
    self.assertGreater(np.abs(unscaled - ref["logits"]).max(), 1e-2)

  def test_dtype_override(self):
    path = os.path.join(_FIXTURES, "qwen2_tied_bias")
    config, params = hf_import.load_hf_checkpoint(path, param_dtype=jnp.bfloat16)
    self.assertEqual(config.param_dtype, jnp.bfloat16)
    self.assertEqual(config.dtype, jnp.bfloat16)
    self.assertTrue(all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params)))


class ConfigTest(absltest.TestCase):

  def test_transformers4_layout(self):
    with open(os.path.join(_FIXTURES, "llama_untied_rope", "config.json")) as f:
      hf = json.load(f)
    new = hf_import.model_config_from_hf(hf)
    rope = hf.pop("rope_parameters")
    hf["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    hf["rope_scaling"] = rope
    hf["torch_dtype"] = hf.pop("dtype")
    self.assertEqual(hf_import.model_config_from_hf(hf), new)


class ErrorTest(parameterized.TestCase):

  def _copy(self, case):
    dst = os.path.join(self.create_tempdir().full_path, case)
    shutil.copytree(os.path.join(_FIXTURES, case), dst)
    return dst

  def _edit_config(self, path, **changes):
    file = os.path.join(path, "config.json")
    with open(file) as f:
      hf = json.load(f)
    hf.update(changes)
    with open(file, "w") as f:
      json.dump(hf, f)

  @parameterized.named_parameters(
      ("architecture", dict(architectures=["GPT2LMHeadModel"], model_type="gpt2"),
       "unsupported architecture"),
      ("activation", dict(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
      ("rope", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
       "unsupported rope_type 'yarn'"),
      ("mlp_bias", dict(mlp_bias=True), "mlp_bias"),
      ("shape", dict(intermediate_size=50),
       r"tensor 'model.layers.0.mlp.(down|gate|up)_proj.weight' has shape"),
      ("untied_missing_head", dict(tie_word_embeddings=False),
       r"missing tensor\(s\) \['lm_head.weight'\]"),
  )
  def test_bad_config(self, changes, match):
    path = self._copy("llama_tied_gqa")
    self._edit_config(path, **changes)
    with self.assertRaisesRegex(ValueError, match):
      hf_import.load_hf_checkpoint(path)

  def test_missing_tensor(self):
    path = self._copy("llama_tied_gqa")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, file)
    with self.assertRaisesRegex(ValueError, r"missing tensor\(s\) "
                                r"\['model.layers.1.self_attn.k_proj.weight'\]"):
      hf_import.load_hf_checkpoint(path)

  def test_unexpected_tensor(self):
    path = self._copy("llama_tied_gqa")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros((32,), np.float32)
    save_file(tensors, file)
    with self.assertRaisesRegex(ValueError, "unexpected tensor.*o_proj.bias"):
      hf_import.load_hf_checkpoint(path)

  def test_missing_shard(self):
    path = self._copy("qwen2_untied_sharded")
    os.remove(os.path.join(path, "model-00002-of-00005.safetensors"))
    with self.assertRaisesRegex(ValueError, "shard 'model-00002-of-00005.safetensors'"):
      hf_import.load_hf_checkpoint(path)

  def test_missing_files(self):
    with self.assertRaisesRegex(ValueError, "not a directory"):
      hf_import.load_hf_checkpoint(os.path.join(_FIXTURES, "nope"))
    path = self._copy("llama_tied_gqa")
    os.remove(os.path.join(path, "model.safetensors"))
    with self.assertRaisesRegex(ValueError, "no model.safetensors"):
      hf_import.load_hf_checkpoint(path)
    os.remove(os.path.join(path, "config.json"))
    with self.assertRaisesRegex(ValueError, "no config.json"):
      hf_import.load_hf_checkpoint(path)


if __name__ == "__main__":
  absltest.main()
