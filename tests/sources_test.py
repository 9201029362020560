"""Tests for agentic_grpo.models.sources, hf_export and agentic_grpo.exporting.

Tiny random Qwen3 and Qwen2 checkpoints are written here (random parameters
through `hf_export`, a BPE tokenizer trained with the `tokenizers` library, a
chat template and a generation config), loaded onto a (2, 2, 2) mesh of 8
devices in the learner's shardings, sampled to their end-of-turn token,
updated once, saved and restored with Orbax, and exported.
"""

import dataclasses
import json
import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from agentic_grpo import config as config_lib
from agentic_grpo import exporting
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo import train
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.core import types as core_types
from agentic_grpo.models import hf_export
from agentic_grpo.models import hf_import
from agentic_grpo.models import placement
from agentic_grpo.models import sampler
from agentic_grpo.models import sources
from agentic_grpo.models import tokenizers
from agentic_grpo.models import transformer
from agentic_grpo.train import device as train_device

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_VOCAB = 320  # embedding rows; the tokenizer has fewer ids (as Qwen's padded embeddings)
_CONFIGS = {
    "qwen3": transformer.ModelConfig(
        vocab_size=_VOCAB, d_model=32, n_layers=2, n_heads=3, n_kv_heads=1, head_dim=10,
        mlp_dim=48, qk_norm=True, tie_embeddings=True, rope_theta=1e6, max_seq_len=512),
    "qwen2": transformer.ModelConfig(
        vocab_size=_VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
        mlp_dim=48, qkv_bias=True, tie_embeddings=False, rope_theta=1e6, max_seq_len=512),
}


def _train_tokenizer(path: str) -> dict[str, int]:
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=_SPECIALS, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["def add(a, b):\n    return a + b\n", "write a function\n"] * 20,
                          trainer)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "chat_template": _CHAT_TEMPLATE}, f)
  return {s: tok.token_to_id(s) for s in _SPECIALS}


def write_checkpoint(path: str, family: str, seed: int = 0) -> None:
  """A random checkpoint whose greedy continuation of any prompt is `<|im_end|>`."""
  os.makedirs(path)
  ids = _train_tokenizer(path)
  config = _CONFIGS[family]
  _, params = transformer.init_model(config, seed)
  end_of_turn = ids["<|im_end|>"]
  # Residual coordinate 0 large and positive for every token; the final norm keeps only it;
  # the output row of <|im_end|> is the largest along it.
  embed = np.asarray(params["embed"][...]).copy()
  embed[:, 0] = 20.0
  norm = np.zeros(config.d_model, np.float32)
  norm[0] = 1.0
  if config.tie_embeddings:
    embed[end_of_turn, 0] = 40.0
  else:
    head = np.asarray(params["lm_head"][...]).copy()
    head[0, :] = 0.0
    head[0, end_of_turn] = 10.0
    params["lm_head"].set_value(head)
  params["embed"].set_value(embed)
  params["final_norm"]["scale"].set_value(norm)
  tmp = path + ".w"
  hf_export.export_hf(tmp, config, params, generation=hf_export.generation_config(
      [ids["<|endoftext|>"], end_of_turn], pad_id=ids["<|endoftext|>"]))
  for name in os.listdir(tmp):
    shutil.move(os.path.join(tmp, name), path)
  os.rmdir(tmp)


def _section(path: str, **kwargs) -> config_lib.ModelSection:
  return config_lib.ModelSection(source="hf", path=path, **kwargs)


def _leaves_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class PresetTest(absltest.TestCase):

  def test_preset_source_is_todays_random_init(self):
    source = sources.open_model(config_lib.ModelSection(), min_seq_len=300)
    self.assertEqual(source.model_config.vocab_size, source.tokenizer.vocab_size)
    self.assertEqual(source.model_config.max_seq_len, 512)
    sm = placement.shard_model(source.model_config, parallel.make_mesh((2, 2, 2)))
    _leaves_equal(source.params(sm, 7), placement.init_params(sm, source.model_config, 7))
    bf16 = sources.open_model(config_lib.ModelSection(param_dtype="bfloat16"))
    self.assertEqual(bf16.model_config.param_dtype, np.dtype("bfloat16"))




class BuilderTest(parameterized.TestCase):
  """The run's own component builder (`train.build`) takes the model from `model.source`."""

  @parameterized.parameters("qwen3", "qwen2")
  def test_build_loads_the_checkpoint_into_the_learner_state(self, family):
    ckpt_dir = os.path.join(self.create_tempdir().full_path, family)
    write_checkpoint(ckpt_dir, family)
    cfg = config_lib.from_config_dict({
        "model": {"source": "hf", "path": ckpt_dir}, "mesh": {"data": 2, "fsdp": 2, "tensor": 2},
        "rl": {"buckets": (96, 128)}, "workflow": {"max_new_tokens": 32},
        "warmstart": {"seq_len": 128}})
    comp = train.build(cfg, pool=object())
    self.assertEqual(comp.model_config, _CONFIGS[family])
    self.assertIsInstance(comp.tokenizer, tokenizers.HFTokenizer)
    params = train_device.DeviceSide(comp).policy
    want = sources.open_model(cfg.model).params(comp.sharded_model, 0)
    _leaves_equal(params, want)
    for leaf, sharding in zip(jax.tree.leaves(params),
                              jax.tree.leaves(comp.sharded_model.param_shardings), strict=True):
      self.assertEqual(leaf.sharding, sharding)

  def test_build_names_a_bad_model_path(self):
    cfg = config_lib.from_config_dict({"model": {"source": "hf", "path": "/nonexistent/ckpt"}})
    with self.assertRaisesRegex(ValueError, "nonexistent"):
      train.build(cfg, pool=object())

  def test_run_with_a_damaged_checkpoint_writes_nothing_into_the_workdir(self):
    ckpt_dir = os.path.join(self.create_tempdir().full_path, "qwen2")
    write_checkpoint(ckpt_dir, "qwen2")
    shard = os.path.join(ckpt_dir, "model.safetensors")
    with open(shard, "r+b") as f:
      f.truncate(os.path.getsize(shard) // 2)
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    cfg = config_lib.from_config_dict({
        "model": {"source": "hf", "path": ckpt_dir}, "rl": {"buckets": (96, 128)},
        "workflow": {"max_new_tokens": 32}, "warmstart": {"seq_len": 128}})
    with self.assertRaisesRegex(ValueError, "model.safetensors"):
      train.run(cfg, workdir, pool=object())
    self.assertFalse(os.path.exists(workdir) and os.listdir(workdir), workdir)


class EndToEndTest(parameterized.TestCase):

  @parameterized.parameters(("qwen3", 0.0), ("qwen2", 0.05))
  def test_load_sample_update_save_restore_export(self, family, kl_beta):
    root = self.create_tempdir().full_path
    ckpt_dir = os.path.join(root, family)
    write_checkpoint(ckpt_dir, family)
    cfg = config_lib.from_config_dict({
        "model": {"source": "hf", "path": ckpt_dir}, "mesh": {"data": 2, "fsdp": 2, "tensor": 2},
        "loss": {"kl_beta": kl_beta}})
    mesh = parallel.make_mesh(cfg)
    optimizer = learner.make_optimizer(cfg.optim)
    shard = lambda c: learner.learner_shardings(  # pylint: disable=g-long-lambda
        c, mesh, optimizer, cfg.mesh.rules(), with_reference=kl_beta > 0)[0]
    model_config, graphdef, params, tok = sources.load_model(cfg.model, shard, 0,
                                                             min_seq_len=128)
    self.assertEqual(model_config, dataclasses.replace(_CONFIGS[family]))
    sm, sh = learner.learner_shardings(model_config, mesh, optimizer, cfg.mesh.rules(),
                                       with_reference=kl_beta > 0)
    for leaf, want in zip(jax.tree.leaves(params), jax.tree.leaves(sm.param_shardings),
                          strict=True):
      self.assertEqual(leaf.sharding, want)
    self.assertLen(mesh.devices.flat, 8)

    # Sample a chat-templated prompt until an end-of-turn id.
    end_of_turn = tok.token_id("<|im_end|>")
    self.assertIn(end_of_turn, tok.eos_ids)
    self.assertIn(tok.token_id("<|endoftext|>"), tok.eos_ids)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "add(a, b)"}]))
    prompts = np.zeros((8, 32), np.int32)
    prompts[:, :len(prompt)] = prompt
    lengths = np.full((8,), len(prompt), np.int32)
    out = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                         max_new_tokens=6, greedy=True, stop_token_ids=list(tok.eos_ids),
                         pad_id=tok.pad_id,
                         shardings=sampler.sampler_shardings(model_config, mesh,
                                                             cfg.mesh.rules()))
    np.testing.assert_array_equal(out.finish_reason, [sampler.FINISH_STOP] * 8)
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, 0], [end_of_turn] * 8)

    # One update step, with the reference policy from the same parameters when kl_beta > 0.
    ref = jax.device_put(jax.tree.map(jax.numpy.copy, params), sh.ref_params) if kl_beta else None
    state = jax.device_put(learner.init_state(params, optimizer, 0), sh.state)
    tokens, _, _, loss_mask = sampler.join_prompt_completion(prompts, lengths, out.tokens,
                                                              out.lengths)
    n, t = tokens.shape
    batch = parallel.put_batch(core_types.UpdateBatch(
        tokens=np.asarray(tokens, np.int32), loss_mask=np.asarray(loss_mask, bool),
        behaviour_logprobs=np.zeros((n, t), np.float32),
        advantages=np.linspace(-1, 1, n, dtype=np.float32)[:, None].repeat(t, 1),
        sample_weights=np.ones((n,), np.float32)).check(), mesh, cfg.mesh.rules())
    update = learner.make_update_step(graphdef, cfg, optimizer, shardings=sh)
    state, metrics = update(state, batch, ref)
    self.assertEqual(int(jax.device_get(metrics["update_skipped"])), 0)
    self.assertEqual(int(state.step), 1)

    # Orbax save and restore in a run's workdir, then export it and import the export.
    workdir = os.path.join(root, "run")
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(config_lib.to_dict(cfg), f)
    ckpt = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))
    tree = {"state": state, "ref": ref} if kl_beta else {"state": state}
    ckpt.save(1, tree, {}, {"phase": "rl", "step": 1, "counters": {}})
    _, _, step, restored = exporting.restore_params(workdir, 1)
    self.assertEqual(step, 1)
    _leaves_equal(restored, state.params)
    for leaf, want in zip(jax.tree.leaves(restored), jax.tree.leaves(sm.param_shardings),
                          strict=True):
      self.assertEqual(leaf.sharding, want)  # read straight into the learner's shardings
    out_dir = exporting.export_run(workdir, os.path.join(root, "exported"), 1)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
      self.assertTrue(os.path.isfile(os.path.join(out_dir, name)), name)
    config2, params2 = hf_import.load_hf_checkpoint(out_dir)
    self.assertEqual(config2, model_config)
    _leaves_equal(params2, state.params)
    with self.assertRaisesRegex(ValueError, "exists and is not empty"):
      exporting.export_run(workdir, out_dir, 1)


class RoundTripTest(parameterized.TestCase):

  @parameterized.parameters("qwen3_tied_odd_heads", "qwen3_untied_sharded", "qwen2_tied_bias",
                            "qwen2_odd_heads", "llama_untied_rope", "llama_odd_heads")
  def test_import_export_import_is_exact(self, case):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf", case)
    mesh = parallel.make_mesh((2, 2, 2))
    config, params = hf_import.load_hf_checkpoint(
        path, shardings=lambda c: placement.shard_model(c, mesh).param_shardings)
    out = os.path.join(self.create_tempdir().full_path, "out")
    hf_export.export_hf(out, config, params, source_dir=path, shard_bytes=30_000)
    self.assertTrue(os.path.isfile(os.path.join(out, "model.safetensors.index.json")))
    config2, params2 = hf_import.load_hf_checkpoint(out)
    self.assertEqual(config2, config)
    _leaves_equal(params2, params)
    # The tensors themselves are the source's, bit for bit.
    src = {}
    for f in os.listdir(path):
      if f.endswith(".safetensors"):
        src.update(load_file(os.path.join(path, f)))
    dst = {}
    for f in os.listdir(out):
      if f.endswith(".safetensors"):
        dst.update(load_file(os.path.join(out, f)))
    self.assertEqual(set(dst), set(src))
    for name, value in src.items():
      np.testing.assert_array_equal(dst[name], value, err_msg=name)


class BadInputTest(parameterized.TestCase):
  """Each error comes before any device memory is spent."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.good = os.path.join(absltest.get_default_test_tmpdir(), "bad_input_good")
    if not os.path.isdir(cls.good):
      write_checkpoint(cls.good, "qwen3")

  def _copy(self):
    path = os.path.join(self.create_tempdir().full_path, "ckpt")
    shutil.copytree(self.good, path)
    return path

  def _assert_fails_before_device(self, path, match, **kwargs):
    before = len(jax.live_arrays())
    with self.assertRaisesRegex(ValueError, match):
      sources.open_model(_section(path, **kwargs))
    self.assertEqual(len(jax.live_arrays()), before)

  def test_truncated_safetensors(self):
    path = self._copy()
    file = os.path.join(path, "model.safetensors")
    size = os.path.getsize(file)
    with open(file, "r+b") as f:
      f.truncate(size - 100)
    self._assert_fails_before_device(path, "unreadable or truncated")

  def test_missing_safetensors(self):
    path = self._copy()
    os.remove(os.path.join(path, "model.safetensors"))
    self._assert_fails_before_device(path, "no model.safetensors")

  def test_shape_disagrees_with_config(self):
    path = self._copy()
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = np.zeros((50, 32), np.float32)
    save_file(tensors, file)
    self._assert_fails_before_device(
        path, rf"tensor '{name}' has shape \(50, 32\), expected \(48, 32\) from config.json")

  def test_disallowed_dtype(self):
    path = self._copy()
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.float64)
    save_file(tensors, file)
    self._assert_fails_before_device(path, r"'model.norm.weight' is stored as F64")
    self._assert_fails_before_device(self.good, "param_dtype must be one of",
                                     param_dtype="int8")

  def test_tokenizer_larger_than_embedding(self):
    path = self._copy()
    with open(os.path.join(path, "config.json")) as f:
      hf = json.load(f)
    hf["vocab_size"] = 200
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(hf, f)
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:200]
    save_file(tensors, file)
    self._assert_fails_before_device(path, r"has \d+ ids, more than the model's embedding "
                                     r"\(200 rows")

  def test_unsupported_architecture(self):
    path = self._copy()
    with open(os.path.join(path, "config.json")) as f:
      hf = json.load(f)
    hf.update(architectures=["MixtralForCausalLM"], model_type="mixtral")
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(hf, f)
    self._assert_fails_before_device(path, r"unsupported architecture 'MixtralForCausalLM'; "
                                     r"supported: \['LlamaForCausalLM'")

  def test_paths(self):
    self._assert_fails_before_device("/nonexistent/ckpt", "is not a directory")
    with absltest.mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}):
      with self.assertRaisesRegex(ValueError, "cannot download hf://org/model: this machine "
                                  "looks offline"):
        sources.resolve_path("hf://org/model",
                             cache_dir=self.create_tempdir().full_path)
    with self.assertRaisesRegex(ValueError, "hf://org/name"):
      sources.resolve_path("hf://justaname")


if __name__ == "__main__":
  absltest.main()
