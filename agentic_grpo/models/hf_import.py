"""Loads Hugging Face Llama / Qwen2 safetensors checkpoints into the policy.

`load_hf_checkpoint(path)` reads `config.json` and the weights
(`model.safetensors`, or shards listed in `model.safetensors.index.json`) with
`safetensors`, builds the matching `transformer.ModelConfig` and maps every
tensor to its parameter:

| Hugging Face tensor (`model.` prefix) | shape | parameter | shape |
|---|---|---|---|
| `embed_tokens.weight` | `[V, D]` | `embed` | `[V, D]` |
| `lm_head.weight` (untied only) | `[V, D]` | `lm_head` | `[D, V]` |
| `layers.i.self_attn.{q,k,v}_proj.weight` | `[H·Dh, D]` | `layers.i.attn.{q,k,v}` | `[D, H, Dh]` |
| `layers.i.self_attn.{q,k,v}_proj.bias` (Qwen2) | `[H·Dh]` | `layers.i.attn.{q,k,v}_bias` | `[H, Dh]` |
| `layers.i.self_attn.o_proj.weight` | `[D, H·Dh]` | `layers.i.attn.o` | `[H, Dh, D]` |
| `layers.i.mlp.{gate,up}_proj.weight` | `[F, D]` | `layers.i.mlp.{gate,up}` | `[D, F]` |
| `layers.i.mlp.down_proj.weight` | `[D, F]` | `layers.i.mlp.down` | `[F, D]` |
| `layers.i.{input,post_attention}_layernorm.weight` | `[D]` | `layers.i.{attn,mlp}_norm.scale` | `[D]` |
| `norm.weight` | `[D]` | `final_norm.scale` | `[D]` |

Rotary embeddings use the same "rotate half" layout as Hugging Face, so q/k
need no permutation. Both the transformers 5 (`rope_parameters`) and the
older (`rope_theta`, `rope_scaling`) config layouts are read.
"""

import json
import os
from typing import Any, Optional

from flax import nnx
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from agentic_grpo.models import transformer

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _read_config(path: str) -> dict[str, Any]:
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise ValueError(f"no config.json in checkpoint path {path!r}")
  with open(file, encoding="utf-8") as f:
    return json.load(f)


def model_config_from_hf(hf: dict[str, Any], *, dtype=None, param_dtype=None) -> transformer.ModelConfig:
  """`ModelConfig` for a Hugging Face `config.json` dict.

  Args:
    hf: the parsed `config.json`.
    dtype, param_dtype: override the compute / storage dtype (default: the
      checkpoint's `dtype` / `torch_dtype`, else float32).

  Raises:
    ValueError: an unsupported architecture, activation, rope type, MLP or
      output-projection bias, or sliding-window attention.
  """
  archs = hf.get("architectures") or []
  model_type = hf.get("model_type")
  known = [a for a in archs if a in SUPPORTED_ARCHITECTURES]
  if not known and model_type not in SUPPORTED_ARCHITECTURES.values():
    raise ValueError(f"unsupported architecture {archs or model_type!r}; supported: "
                     f"{sorted(SUPPORTED_ARCHITECTURES)}")
  family = SUPPORTED_ARCHITECTURES[known[0]] if known else model_type
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU)")
  if hf.get("mlp_bias"):
    raise ValueError("unsupported mlp_bias=true")
  if family == "llama" and hf.get("attention_bias"):
    raise ValueError("unsupported attention_bias=true for llama (o_proj bias)")
  if family == "qwen2" and hf.get("use_sliding_window"):
    raise ValueError("unsupported use_sliding_window=true")
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  scaling = None
  if rope_type == "llama3":
    scaling = transformer.Llama3RopeScaling(
        factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position=int(rope["original_max_position_embeddings"]))
  elif rope_type != "default":
    raise ValueError(f"unsupported rope_type {rope_type!r}; supported: 'default', 'llama3'")
  stored = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if stored not in _DTYPES:
    raise ValueError(f"unsupported checkpoint dtype {stored!r}; supported: {sorted(_DTYPES)}")
  param_dtype = param_dtype or _DTYPES[stored]
  n_heads = int(hf["num_attention_heads"])
  d_model = int(hf["hidden_size"])
  return transformer.ModelConfig(
      vocab_size=int(hf["vocab_size"]),
      d_model=d_model,
      n_layers=int(hf["num_hidden_layers"]),
      n_heads=n_heads,
      n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
      head_dim=int(hf.get("head_dim") or d_model // n_heads),
      mlp_dim=int(hf["intermediate_size"]),
      rope_theta=float(theta),
      qkv_bias=family == "qwen2",
      tie_embeddings=bool(hf.get("tie_word_embeddings", family == "qwen2")),
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      max_seq_len=int(hf.get("max_position_embeddings", 2048)),
      dtype=dtype or param_dtype,
      param_dtype=param_dtype,
      rope_scaling=scaling,
  )


def _tensor_files(path: str) -> dict[str, str]:
  """Tensor name -> safetensors file."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.isfile(index):
    with open(index, encoding="utf-8") as f:
      weight_map = json.load(f)["weight_map"]
    files = {}
    for name, shard in weight_map.items():
      file = os.path.join(path, shard)
      if not os.path.isfile(file):
        raise ValueError(f"shard {shard!r} of tensor {name!r} listed in {index} is missing")
      files[name] = file
    return files
  if os.path.isfile(single):
    with safe_open(single, framework="np") as f:
      return {name: single for name in f.keys()}
  raise ValueError(f"no model.safetensors or model.safetensors.index.json in {path!r}")


def _expected_hf_shapes(c: transformer.ModelConfig, prefix: str) -> dict[str, tuple[int, ...]]:
  d, h, kv, dh, f, v = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size
  shapes = {f"{prefix}embed_tokens.weight": (v, d), f"{prefix}norm.weight": (d,)}
  if not c.tie_embeddings:
    shapes["lm_head.weight"] = (v, d)
  for i in range(c.n_layers):
    p = f"{prefix}layers.{i}."
    shapes.update({
        p + "self_attn.q_proj.weight": (h * dh, d),
        p + "self_attn.k_proj.weight": (kv * dh, d),
        p + "self_attn.v_proj.weight": (kv * dh, d),
        p + "self_attn.o_proj.weight": (d, h * dh),
        p + "mlp.gate_proj.weight": (f, d),
        p + "mlp.up_proj.weight": (f, d),
        p + "mlp.down_proj.weight": (d, f),
        p + "input_layernorm.weight": (d,),
        p + "post_attention_layernorm.weight": (d,),
    })
    if c.qkv_bias:
      shapes.update({
          p + "self_attn.q_proj.bias": (h * dh,),
          p + "self_attn.k_proj.bias": (kv * dh,),
          p + "self_attn.v_proj.bias": (kv * dh,),
      })
  return shapes


def _to_params(c: transformer.ModelConfig, t: dict[str, np.ndarray], prefix: str) -> dict:
  """Pure dict of parameters (our layout) from HF tensors (already shape-checked)."""
  d, h, kv, dh = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
  out: dict[str, Any] = {"embed": t[f"{prefix}embed_tokens.weight"],
                         "final_norm": {"scale": t[f"{prefix}norm.weight"]}, "layers": {}}
  if not c.tie_embeddings:
    out["lm_head"] = t["lm_head.weight"].T
  for i in range(c.n_layers):
    p = f"{prefix}layers.{i}."
    attn = {
        "q": t[p + "self_attn.q_proj.weight"].T.reshape(d, h, dh),
        "k": t[p + "self_attn.k_proj.weight"].T.reshape(d, kv, dh),
        "v": t[p + "self_attn.v_proj.weight"].T.reshape(d, kv, dh),
        "o": t[p + "self_attn.o_proj.weight"].T.reshape(h, dh, d),
    }
    if c.qkv_bias:
      attn["q_bias"] = t[p + "self_attn.q_proj.bias"].reshape(h, dh)
      attn["k_bias"] = t[p + "self_attn.k_proj.bias"].reshape(kv, dh)
      attn["v_bias"] = t[p + "self_attn.v_proj.bias"].reshape(kv, dh)
    out["layers"][i] = {
        "attn": attn,
        "attn_norm": {"scale": t[p + "input_layernorm.weight"]},
        "mlp": {"gate": t[p + "mlp.gate_proj.weight"].T, "up": t[p + "mlp.up_proj.weight"].T,
                "down": t[p + "mlp.down_proj.weight"].T},
        "mlp_norm": {"scale": t[p + "post_attention_layernorm.weight"]},
    }
  return out


def load_hf_checkpoint(
    path: str,
    *,
    dtype=None,
    param_dtype=None,
) -> tuple[transformer.ModelConfig, nnx.State]:
  """Reads a Llama or Qwen2 safetensors checkpoint directory.

  Args:
    path: directory with `config.json` and `model.safetensors` or a sharded
      `model.safetensors.index.json` (as written by `save_pretrained`).
    dtype: compute dtype override (default: the storage dtype).
    param_dtype: storage dtype override (default: the checkpoint's dtype).

  Returns:
    `(config, params)`; `transformer.abstract_model(config)[0]` is the
    matching `graphdef`, and `transformer.apply(graphdef, params, ...)` runs
    the model.

  Raises:
    ValueError: missing files; an unsupported architecture or option (see
      `model_config_from_hf`); a missing or unexpected tensor, or one whose
      shape disagrees with `config.json` (the message names the tensor).
  """
  if not os.path.isdir(path):
    raise ValueError(f"checkpoint path {path!r} is not a directory")
  config = model_config_from_hf(_read_config(path), dtype=dtype, param_dtype=param_dtype)
  files = _tensor_files(path)
  prefix = "model." if any(n.startswith("model.") for n in files) else ""
  expected = _expected_hf_shapes(config, prefix)
  missing = sorted(set(expected) - set(files))
  if missing:
    raise ValueError(f"checkpoint {path!r} is missing tensor(s) {missing[:5]}"
                     f"{' ...' if len(missing) > 5 else ''}")
  unexpected = sorted(n for n in set(files) - set(expected)
                      if not n.endswith(_IGNORED_SUFFIXES)
                      and not (config.tie_embeddings and n == "lm_head.weight"))
  if unexpected:
    raise ValueError(f"checkpoint {path!r} has unexpected tensor(s) {unexpected[:5]} for "
                     f"this config")
  by_file: dict[str, list[str]] = {}
  for name in expected:
    by_file.setdefault(files[name], []).append(name)
  tensors = {}
  for file, names in sorted(by_file.items()):
    with safe_open(file, framework="np") as f:
      for name in names:
        shape = tuple(f.get_slice(name).get_shape())
        if shape != expected[name]:
          raise ValueError(f"tensor {name!r} has shape {shape}, expected {expected[name]} "
                           f"from config.json")
        tensors[name] = f.get_tensor(name)
  pure = _to_params(config, tensors, prefix)
  _, params = transformer.abstract_model(config)
  pd = config.param_dtype
  # Cast on the host (NumPy / ml_dtypes), then one transfer per tensor.
  nnx.replace_by_pure_dict(
      params, pure, replace_fn=lambda var, x: var.replace(jnp.asarray(np.asarray(x).astype(pd))))
  return config, params
