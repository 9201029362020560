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
older (`rope_theta`, `rope_scaling`) config layouts are read. Keys that
`config.json` omits take each family's own transformers defaults
(`HF_DEFAULTS`): Qwen2's output head, for one, is untied unless the config says
otherwise.
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
# Known families the policy cannot run, with the reason (checked before anything is read).
_QWEN3 = ("per-head q/k RMSNorm (q_norm, k_norm); its defaults also differ from Qwen2's: "
          "head_dim 128, no q/k/v bias")
_UNSUPPORTED = {"Qwen3ForCausalLM": _QWEN3, "qwen3": _QWEN3}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# What transformers uses for a key that `config.json` omits (the `LlamaConfig` / `Qwen2Config`
# class defaults, the same in transformers 4.x and 5.x). `None` means "derived": head_dim =
# hidden_size // num_attention_heads, num_key_value_heads = num_attention_heads. Qwen2 differs
# from Llama in num_key_value_heads (32, not the head count), max_position_embeddings, the
# vocabulary, and its q/k/v bias (always on, no config key); neither ties its output head by
# default. (Qwen3Config, for reference: as Qwen2 but head_dim 128 and attention_bias False.)
HF_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
              "head_dim": None, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "rope_theta": 10_000.0, "tie_word_embeddings": False, "attention_bias": False,
              "mlp_bias": False, "hidden_act": "silu"},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "head_dim": None, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "rope_theta": 10_000.0, "tie_word_embeddings": False, "use_sliding_window": False,
              "hidden_act": "silu"},
}


def _read_config(path: str) -> dict[str, Any]:
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise ValueError(f"no config.json in checkpoint path {path!r}")
  try:
    with open(file, encoding="utf-8") as f:
      hf = json.load(f)
  except (ValueError, RecursionError) as e:  # JSON or UTF-8 errors, absurd nesting
    raise ValueError(f"config.json in {path!r} is not valid JSON: {e}") from e
  if not isinstance(hf, dict):
    raise ValueError(f"config.json in {path!r} must be a JSON object, got {type(hf).__name__}")
  return hf


def _family(hf: dict[str, Any]) -> str:
  """`llama` or `qwen2`, from `architectures` (else `model_type`)."""
  archs = hf.get("architectures") or []
  archs = archs if isinstance(archs, list) else [archs]
  model_type = hf.get("model_type")
  for name in list(archs) + [model_type]:
    if isinstance(name, str) and name in _UNSUPPORTED:
      raise ValueError(f"unsupported architecture {name!r} ({_UNSUPPORTED[name]}); supported: "
                       f"{sorted(SUPPORTED_ARCHITECTURES)}")
  known = [a for a in archs if a in SUPPORTED_ARCHITECTURES]
  if known:
    return SUPPORTED_ARCHITECTURES[known[0]]
  if model_type in SUPPORTED_ARCHITECTURES.values():
    return model_type
  raise ValueError(f"unsupported architecture {archs or model_type!r}; supported: "
                   f"{sorted(SUPPORTED_ARCHITECTURES)}")


def _getter(hf: dict[str, Any], family: str):
  """`get(key, kind)`: `hf[key]` (the family's default when absent or null), checked."""
  defaults = HF_DEFAULTS[family]

  def get(key: str, kind: type):
    value = hf.get(key)
    value = defaults[key] if value is None else value
    ok = (isinstance(value, bool) if kind is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
          and (kind is float or float(value).is_integer()))
    if not ok:
      raise ValueError(f"config.json {key}={value!r}: expected a "
                       f"{'bool' if kind is bool else 'positive ' + kind.__name__}")
    return kind(value)

  return get


def _rope(hf: dict[str, Any], family: str):
  """`(rope_theta, Llama3RopeScaling or None)`; both config layouts."""
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  if not isinstance(rope, dict):
    raise ValueError(f"config.json rope_parameters must be an object, got {rope!r:.80}")
  theta = rope.get("rope_theta", hf.get("rope_theta"))
  theta = HF_DEFAULTS[family]["rope_theta"] if theta is None else theta
  if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
    raise ValueError(f"config.json rope_theta={theta!r}: expected a positive number")
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type == "default":
    return float(theta), None
  if rope_type != "llama3":
    raise ValueError(f"unsupported rope_type {rope_type!r}; supported: 'default', 'llama3'")
  try:
    return float(theta), transformer.Llama3RopeScaling(
        factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position=int(rope.get("original_max_position_embeddings")
                                  or hf.get("max_position_embeddings")
                                  or HF_DEFAULTS[family]["max_position_embeddings"]))
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"config.json llama3 rope_parameters incomplete or malformed: {e!r}") from e


def model_config_from_hf(hf: dict[str, Any], *, dtype=None, param_dtype=None) -> transformer.ModelConfig:
  """`ModelConfig` for a Hugging Face `config.json` dict.

  A key the dict omits (or sets to null) takes the family's transformers default
  (`HF_DEFAULTS`), as `from_pretrained` would: e.g. a Qwen2 config without
  `tie_word_embeddings` has an untied output head, one without `num_key_value_heads` has 32.

  Args:
    hf: the parsed `config.json`.
    dtype, param_dtype: override the compute / storage dtype (default: the
      checkpoint's `dtype` / `torch_dtype`, else float32).

  Raises:
    ValueError: an unsupported architecture (Qwen3 included), activation, rope type, MLP or
      output-projection bias, or sliding-window attention; a value of the wrong type or range
      (naming the key).
  """
  family = _family(hf)
  get = _getter(hf, family)
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; only 'silu' (SwiGLU)")
  # Qwen2 has no MLP or o_proj bias whatever the config says; Llama's flags add them.
  if family == "llama" and get("mlp_bias", bool):
    raise ValueError("unsupported mlp_bias=true")
  if family == "llama" and get("attention_bias", bool):
    raise ValueError("unsupported attention_bias=true for llama (o_proj bias)")
  if family == "qwen2" and get("use_sliding_window", bool):
    raise ValueError("unsupported use_sliding_window=true")
  theta, scaling = _rope(hf, family)
  stored = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if stored not in _DTYPES:
    raise ValueError(f"unsupported checkpoint dtype {stored!r}; supported: {sorted(_DTYPES)}")
  param_dtype = param_dtype or _DTYPES[stored]
  n_heads, d_model = get("num_attention_heads", int), get("hidden_size", int)
  # A null num_key_value_heads (given, or Llama's default) means as many as the query heads.
  kv = hf.get("num_key_value_heads", HF_DEFAULTS[family]["num_key_value_heads"])
  n_kv = n_heads if kv is None else get("num_key_value_heads", int)
  head_dim = d_model // n_heads if hf.get("head_dim") is None else get("head_dim", int)
  return transformer.ModelConfig(
      vocab_size=get("vocab_size", int),
      d_model=d_model,
      n_layers=get("num_hidden_layers", int),
      n_heads=n_heads,
      n_kv_heads=n_kv,
      head_dim=head_dim,
      mlp_dim=get("intermediate_size", int),
      rope_theta=theta,
      qkv_bias=family == "qwen2",
      tie_embeddings=get("tie_word_embeddings", bool),
      norm_eps=get("rms_norm_eps", float),
      max_seq_len=get("max_position_embeddings", int),
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
