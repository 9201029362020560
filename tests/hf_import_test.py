"""Tests for agentic_grpo.models.hf_import against checkpoints saved by `transformers`.

The fixtures in tests/fixtures/hf were written by tests/fixtures/make_hf_fixtures.py
(tiny random models and their float32 logits from a Hugging Face forward pass);
this test needs neither torch nor transformers.
"""

import dataclasses
import json
import os
import shutil
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from agentic_grpo import parallel
from agentic_grpo.models import hf_config
from agentic_grpo.models import hf_import
from agentic_grpo.models import placement
from agentic_grpo.models import transformer

_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
_CASES = ("llama_tied_gqa", "llama_untied_rope", "llama_odd_heads", "qwen2_tied_bias",
          "qwen2_untied_sharded", "qwen2_odd_heads", "qwen3_tied_odd_heads",
          "qwen3_untied_sharded")
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

  @parameterized.parameters(*_CASES)
  def test_sharded_load_matches(self, case):
    # Built in its shards on a (2, 2, 2) mesh of 8 devices: same values, same logits.
    path = os.path.join(_FIXTURES, case)
    ref = np.load(os.path.join(path, "reference.npz"))
    mesh = parallel.make_mesh((2, 2, 2))
    config, params = hf_import.load_hf_checkpoint(
        path, shardings=lambda c: placement.shard_model(c, mesh).param_shardings)
    _, single = hf_import.load_hf_checkpoint(path)
    want = placement.shard_model(config, mesh).param_shardings
    for leaf, sharding, one in zip(jax.tree.leaves(params), jax.tree.leaves(want),
                                   jax.tree.leaves(single), strict=True):
      self.assertEqual(leaf.sharding, sharding)
      np.testing.assert_array_equal(np.asarray(leaf), np.asarray(one))
    np.testing.assert_allclose(_logits(config, params, ref["tokens"]), ref["logits"],
                               atol=1e-4, rtol=0)

  def test_reads_in_pieces(self):
    # Blocks filled a few rows at a time give the same arrays.
    path = os.path.join(_FIXTURES, "llama_untied_rope")
    _, whole = hf_import.load_hf_checkpoint(path)
    mesh = parallel.make_mesh((2, 2, 2))
    with mock.patch.object(hf_import, "_READ_CHUNK_BYTES", 200):
      _, pieces = hf_import.load_hf_checkpoint(
          path, shardings=lambda c: placement.shard_model(c, mesh).param_shardings)
    for a, b in zip(jax.tree.leaves(pieces), jax.tree.leaves(whole), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def test_head_dim_split_reads(self):
    # A sharding that splits head_dim still reads the right sub-block of each head.
    path = os.path.join(_FIXTURES, "qwen3_untied_sharded")
    mesh = parallel.make_mesh((2, 2, 2))
    rules = tuple((k, "tensor" if k == "head_dim" else v if k != "heads" else None)
                  for k, v in parallel.DEFAULT_RULES)
    config, params = hf_import.load_hf_checkpoint(
        path, shardings=lambda c: placement.shard_model(c, mesh, rules).param_shardings)
    _, single = hf_import.load_hf_checkpoint(path)
    q = params["layers"][0]["attn"]["q"][...]
    self.assertEqual(q.sharding.spec[2], "tensor")
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(single), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    del config

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
    odd = configs["qwen3_tied_odd_heads"]
    self.assertEqual((odd.n_heads, odd.n_kv_heads, odd.head_dim, odd.d_model), (3, 1, 10, 32))
    self.assertTrue(odd.qk_norm and odd.tie_embeddings and not odd.qkv_bias)
    self.assertFalse(configs["qwen3_untied_sharded"].tie_embeddings)
    self.assertEqual(configs["llama_odd_heads"].head_dim, 8)
    self.assertEqual((configs["qwen2_odd_heads"].n_heads, configs["qwen2_odd_heads"].head_dim),
                     (3, 12))

  def test_qk_norm_matters(self):
    # The parity test would catch q/k norms that are loaded but not applied.
    path = os.path.join(_FIXTURES, "qwen3_tied_odd_heads")
    ref = np.load(os.path.join(path, "reference.npz"))
    config, params = hf_import.load_hf_checkpoint(path)
    for layer in params["layers"].values():
      for name in ("q_norm", "k_norm"):
        layer["attn"][name]["scale"].set_value(jnp.ones_like(layer["attn"][name]["scale"][...]))
    self.assertGreater(np.abs(_logits(config, params, ref["tokens"]) - ref["logits"]).max(),
                       1e-2)

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
    new = hf_config.model_config_from_hf(hf)
    rope = hf.pop("rope_parameters")
    hf["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    hf["rope_scaling"] = rope
    hf["torch_dtype"] = hf.pop("dtype")
    self.assertEqual(hf_config.model_config_from_hf(hf), new)


class DefaultsTest(parameterized.TestCase):
  """Keys a config.json omits take the family's transformers defaults (Llama/Qwen2/Qwen3Config)."""

  @parameterized.named_parameters(
      ("llama", "LlamaForCausalLM", dict(vocab_size=32000, d_model=4096, mlp_dim=11008,
                                         n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                                         max_seq_len=2048, qkv_bias=False)),
      ("qwen2", "Qwen2ForCausalLM", dict(vocab_size=151936, d_model=4096, mlp_dim=22016,
                                         n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                                         max_seq_len=32768, qkv_bias=True)),
      ("qwen3", "Qwen3ForCausalLM", dict(vocab_size=151936, d_model=4096, mlp_dim=22016,
                                         n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                                         max_seq_len=32768, qkv_bias=False, qk_norm=True)),
  )
  def test_every_absent_key(self, arch, want):
    config = hf_config.model_config_from_hf({"architectures": [arch]})
    want.update(rope_theta=10_000.0, tie_embeddings=False, norm_eps=1e-6, rope_scaling=None,
                param_dtype=jnp.float32)
    self.assertEqual({k: getattr(config, k) for k in want}, want)

  def test_head_counts(self):
    # Llama derives kv heads from the query heads; Qwen2's default is 32 whatever the heads.
    llama = hf_config.model_config_from_hf({"model_type": "llama", "num_attention_heads": 8,
                                            "hidden_size": 64})
    self.assertEqual((llama.n_kv_heads, llama.head_dim), (8, 8))
    qwen = hf_config.model_config_from_hf({"model_type": "qwen2", "num_attention_heads": 64,
                                           "hidden_size": 1024, "head_dim": None})
    self.assertEqual((qwen.n_kv_heads, qwen.head_dim), (32, 16))
    qwen3 = hf_config.model_config_from_hf({"model_type": "qwen3", "num_attention_heads": 64,
                                            "hidden_size": 1024})
    self.assertEqual((qwen3.n_kv_heads, qwen3.head_dim), (32, 128))  # head_dim not derived
    for family in ("llama", "qwen2", "qwen3"):  # explicit null kv heads: as many as the queries
      c = hf_config.model_config_from_hf({"model_type": family, "num_attention_heads": 4,
                                          "num_key_value_heads": None, "head_dim": 24})
      self.assertEqual((c.n_kv_heads, c.head_dim), (4, 24))

  @parameterized.named_parameters(
      ("qwen2_untied", "qwen2_untied_sharded", None),
      ("qwen2_tied", "qwen2_tied_bias", r"missing tensor\(s\) \['lm_head.weight'\]"),
      ("llama_tied", "llama_tied_gqa", r"missing tensor\(s\) \['lm_head.weight'\]"),
  )
  def test_checkpoint_without_tie_key_is_untied(self, case, error):
    path = os.path.join(self.create_tempdir().full_path, case)
    shutil.copytree(os.path.join(_FIXTURES, case), path)
    with open(os.path.join(path, "config.json")) as f:
      hf = json.load(f)
    del hf["tie_word_embeddings"]
    for key in ("rms_norm_eps", "hidden_act", "use_sliding_window", "attention_bias", "mlp_bias"):
      if hf.get(key) == hf_config.HF_DEFAULTS[hf["model_type"]].get(key, "absent"):
        del hf[key]  # at their defaults: dropping them changes nothing
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(hf, f)
    if error:  # tied in the checkpoint, untied by default: the head is missing, not guessed
      with self.assertRaisesRegex(ValueError, error):
        hf_import.load_hf_checkpoint(path)
      return
    ref = np.load(os.path.join(path, "reference.npz"))
    config, params = hf_import.load_hf_checkpoint(path)
    self.assertFalse(config.tie_embeddings)
    np.testing.assert_allclose(_logits(config, params, ref["tokens"]), ref["logits"], atol=1e-4,
                               rtol=0)

  @parameterized.named_parameters(
      ("moe_arch", {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"},
       r"unsupported architecture 'Qwen3MoeForCausalLM'; supported: \['LlamaForCausalLM', "
       r"'Qwen2ForCausalLM', 'Qwen3ForCausalLM'\]"),
      ("gemma_type", {"model_type": "gemma"}, r"unsupported architecture 'gemma'"),
      ("qwen3_bias", {"model_type": "qwen3", "attention_bias": True}, "attention_bias"),
      ("quantized", {"model_type": "qwen3", "quantization_config": {"quant_method": "awq"}},
       "quantization_config"),
      ("dtype", {"model_type": "qwen3", "dtype": "int8"}, r"unsupported checkpoint dtype 'int8'"),
      ("type", {"model_type": "llama", "hidden_size": "64"}, r"hidden_size='64'"),
      ("range", {"model_type": "qwen2", "num_hidden_layers": 0}, r"num_hidden_layers=0"),
      ("tie_type", {"model_type": "qwen2", "tie_word_embeddings": "yes"}, "tie_word_embeddings"),
      ("theta", {"model_type": "llama", "rope_theta": -1.0}, "rope_theta"),
      ("llama3", {"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}}, "llama3"),
  )
  def test_rejects(self, hf, match):
    with self.assertRaisesRegex(ValueError, match):
      hf_config.model_config_from_hf(hf)


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
