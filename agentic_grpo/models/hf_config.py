"""Hugging Face `config.json` <-> `transformer.ModelConfig`, for Llama, Qwen2 and Qwen3.

`model_config_from_hf` reads a `config.json` dict the way `from_pretrained`
does: keys the dict omits take each family's own transformers defaults
(`HF_DEFAULTS`), both the transformers 5 (`rope_parameters`) and the older
(`rope_theta`, `rope_scaling`) rotary layouts are accepted, and anything the
policy cannot run (another architecture, activation, rope type, MLP bias,
sliding-window attention) is a `ValueError` naming it. `hf_config_from_model`
is the inverse used by the exporter.
"""

import json
import os
from typing import Any, Optional

import jax.numpy as jnp

from agentic_grpo import errors
from agentic_grpo.models import transformer

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                           "Qwen3ForCausalLM": "qwen3"}
ARCHITECTURE_OF_FAMILY = {family: arch for arch, family in SUPPORTED_ARCHITECTURES.items()}
# Checkpoint / parameter dtypes a config may ask for (`dtype` or `torch_dtype` in config.json).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# What transformers uses for a key that `config.json` omits (the `LlamaConfig` / `Qwen2Config` /
# `Qwen3Config` class defaults, the same in transformers 4.x and 5.x). `None` means "derived":
# head_dim = hidden_size // num_attention_heads, num_key_value_heads = num_attention_heads.
# Qwen2 differs from Llama in num_key_value_heads (32, not the head count),
# max_position_embeddings, the vocabulary, and its q/k/v bias (always on, no config key);
# none ties its output head by default. Qwen3 is as Qwen2 but with head_dim 128 (explicit, not
# derived), attention_bias False (a config key, as Llama's) and per-head q/k RMSNorm (always on,
# no config key).
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
    "qwen3": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "rope_theta": 10_000.0, "tie_word_embeddings": False, "attention_bias": False,
              "use_sliding_window": False, "hidden_act": "silu"},
}


def read_config(path: str) -> dict[str, Any]:
  """The parsed `config.json` of a checkpoint directory, or of a `config.json` file path.

  Raises:
    errors.InputError (a ValueError): the file is missing, not valid JSON, or not a JSON
      object.
  """
  file = path if os.path.isfile(path) else os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise errors.InputError(f"no config.json in checkpoint path {path!r}")
  try:
    with open(file, encoding="utf-8") as f:
      hf = json.load(f)
  except (ValueError, RecursionError) as e:  # JSON or UTF-8 errors, absurd nesting
    raise errors.InputError(f"config.json in {path!r} is not valid JSON: {e}") from e
  if not isinstance(hf, dict):
    raise errors.InputError(f"config.json in {path!r} must be a JSON object, got {type(hf).__name__}")
  return hf


def family(hf: dict[str, Any]) -> str:
  """`llama`, `qwen2` or `qwen3`, from `architectures` (else `model_type`).

  `transformers` builds a checkpoint's model from its `model_type`; a config whose
  `architectures` names another family would load here as one model and there as another, so
  the two must agree when both are given.

  Raises:
    errors.InputError (a ValueError): neither names a supported architecture (the message
      names the value found and the supported ones), or `architectures` and `model_type` name
      different families.
  """
  archs = hf.get("architectures") or []
  archs = archs if isinstance(archs, list) else [archs]
  known = [a for a in archs if isinstance(a, str) and a in SUPPORTED_ARCHITECTURES]
  model_type = hf.get("model_type")
  if known:
    fam = SUPPORTED_ARCHITECTURES[known[0]]
    if isinstance(model_type, str) and model_type and model_type != fam:
      raise errors.InputError(
          f"config.json architectures {archs} (family {fam!r}) and model_type {model_type!r} "
          f"disagree (transformers builds the model_type's): correct one of them so that both "
          f"name one family of {sorted(HF_DEFAULTS)}")
    return fam
  if isinstance(model_type, str) and model_type in HF_DEFAULTS:
    return model_type
  found = archs[0] if len(archs) == 1 else (archs or model_type)
  raise errors.InputError(f"unsupported architecture {found!r}; supported: "
                   f"{sorted(SUPPORTED_ARCHITECTURES)}")


def _getter(hf: dict[str, Any], fam: str):
  """`get(key, kind)`: `hf[key]` (the family's default when absent or null), checked."""
  defaults = HF_DEFAULTS[fam]

  def get(key: str, kind: type):
    value = hf.get(key)
    value = defaults[key] if value is None else value
    ok = (isinstance(value, bool) if kind is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
          and (kind is float or float(value).is_integer()))
    if not ok:
      raise errors.InputError(f"config.json {key}={value!r}: expected a "
                       f"{'bool' if kind is bool else 'positive ' + kind.__name__}")
    return kind(value)

  return get


def _rope(hf: dict[str, Any], fam: str):
  """`(rope_theta, Llama3RopeScaling or None)`; both config layouts."""
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  if not isinstance(rope, dict):
    raise errors.InputError(f"config.json rope_parameters must be an object, got {rope!r:.80}")
  theta = rope.get("rope_theta", hf.get("rope_theta"))
  theta = HF_DEFAULTS[fam]["rope_theta"] if theta is None else theta
  if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
    raise errors.InputError(f"config.json rope_theta={theta!r}: expected a positive number")
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type == "default":
    return float(theta), None
  if rope_type != "llama3":
    raise errors.InputError(f"unsupported rope_type {rope_type!r}; supported: 'default', 'llama3'")
  try:
    return float(theta), transformer.Llama3RopeScaling(
        factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position=int(rope.get("original_max_position_embeddings")
                                  or hf.get("max_position_embeddings")
                                  or HF_DEFAULTS[fam]["max_position_embeddings"]))
  except (KeyError, TypeError, ValueError) as e:
    raise errors.InputError(f"config.json llama3 rope_parameters incomplete or malformed: {e!r}") from e


def stored_dtype(hf: dict[str, Any]) -> str:
  """The checkpoint dtype name from `dtype` / `torch_dtype` (default float32).

  Raises:
    ValueError: a dtype outside `DTYPES` (e.g. a quantised checkpoint).
  """
  stored = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if stored not in DTYPES:
    raise errors.InputError(f"unsupported checkpoint dtype {stored!r}; supported: {sorted(DTYPES)}")
  return stored


def _check_options(hf: dict[str, Any], fam: str, get) -> None:
  if hf.get("hidden_act", "silu") != "silu":
    raise errors.InputError(f"unsupported hidden_act {hf['hidden_act']!r}; only 'silu' (SwiGLU)")
  # Qwen2 has no MLP or o_proj bias whatever the config says; Llama's flags add them.
  if fam == "llama" and get("mlp_bias", bool):
    raise errors.InputError("unsupported mlp_bias=true")
  if fam in ("llama", "qwen3") and get("attention_bias", bool):
    raise errors.InputError(f"unsupported attention_bias=true for {fam}")
  if fam in ("qwen2", "qwen3") and get("use_sliding_window", bool):
    raise errors.InputError("unsupported use_sliding_window=true")
  if hf.get("quantization_config") is not None:
    raise errors.InputError("unsupported quantization_config: quantised checkpoints are not loaded")


def model_config_from_hf(hf: dict[str, Any], *, dtype=None,
                         param_dtype=None) -> transformer.ModelConfig:
  """`ModelConfig` for a Hugging Face `config.json` dict.

  A key the dict omits (or sets to null) takes the family's transformers default
  (`HF_DEFAULTS`), as `from_pretrained` would: e.g. a Qwen2 config without
  `tie_word_embeddings` has an untied output head, one without `num_key_value_heads` has 32.

  Args:
    hf: the parsed `config.json`.
    dtype, param_dtype: override the compute / storage dtype (default: the
      checkpoint's `dtype` / `torch_dtype`, else float32). Any float dtype.

  Raises:
    errors.InputError (a ValueError): an unsupported architecture (or `architectures` and
      `model_type` of different families), activation, rope type, MLP or output-projection
      bias, sliding-window attention, quantisation or checkpoint dtype; a value of the wrong
      type or range (naming the key).
  """
  fam = family(hf)
  get = _getter(hf, fam)
  _check_options(hf, fam, get)
  theta, scaling = _rope(hf, fam)
  param_dtype = param_dtype or DTYPES[stored_dtype(hf)]
  n_heads, d_model = get("num_attention_heads", int), get("hidden_size", int)
  # A null num_key_value_heads (given, or Llama's default) means as many as the query heads.
  kv = hf.get("num_key_value_heads", HF_DEFAULTS[fam]["num_key_value_heads"])
  n_kv = n_heads if kv is None else get("num_key_value_heads", int)
  head_dim = (get("head_dim", int) if HF_DEFAULTS[fam]["head_dim"] or hf.get("head_dim")
              else d_model // n_heads)
  return transformer.ModelConfig(
      vocab_size=get("vocab_size", int),
      d_model=d_model,
      n_layers=get("num_hidden_layers", int),
      n_heads=n_heads,
      n_kv_heads=n_kv,
      head_dim=head_dim,
      mlp_dim=get("intermediate_size", int),
      rope_theta=theta,
      qkv_bias=fam == "qwen2",
      qk_norm=fam == "qwen3",
      tie_embeddings=get("tie_word_embeddings", bool),
      norm_eps=get("rms_norm_eps", float),
      max_seq_len=get("max_position_embeddings", int),
      dtype=dtype or param_dtype,
      param_dtype=param_dtype,
      rope_scaling=scaling,
  )


def family_of_model(config: transformer.ModelConfig) -> str:
  """The Hugging Face family that runs `config`: q/k norm -> qwen3, q/k/v bias -> qwen2.

  Raises:
    ValueError: both q/k/v bias and q/k norm (no supported family has both).
  """
  if config.qk_norm and config.qkv_bias:
    raise ValueError("no supported Hugging Face family has both qkv_bias and qk_norm")
  return "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"


def hf_config_from_model(config: transformer.ModelConfig,
                         base: Optional[dict[str, Any]] = None) -> dict[str, Any]:
  """A `config.json` dict describing `config` (the inverse of `model_config_from_hf`).

  Args:
    config: the model shape.
    base: the original checkpoint's `config.json`, if any: its other keys
      (token ids, `transformers_version`, ...) are kept, the shape keys
      overwritten.

  Returns:
    A dict with every shape key explicit (no family default relied on), the
    rotary settings in both the transformers 5 (`rope_parameters`) and the
    older (`rope_theta`, `rope_scaling`) layouts, and `dtype` /
    `torch_dtype` naming `config.param_dtype`.

  Raises:
    ValueError: a config no supported family can express, or a param dtype
      outside `DTYPES`.
  """
  fam = family_of_model(config)
  dtype_name = jnp.dtype(config.param_dtype).name
  if dtype_name not in DTYPES:
    raise ValueError(f"param_dtype {dtype_name!r} cannot be exported; supported: "
                     f"{sorted(DTYPES)}")
  hf = dict(base or {})
  hf.pop("rope_scaling", None)
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
  s = config.rope_scaling
  if s is not None:
    rope.update(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position)
  hf.update(
      architectures=[ARCHITECTURE_OF_FAMILY[fam]], model_type=fam, hidden_act="silu",
      vocab_size=config.vocab_size, hidden_size=config.d_model,
      intermediate_size=config.mlp_dim, num_hidden_layers=config.n_layers,
      num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads,
      head_dim=config.head_dim, max_position_embeddings=config.max_seq_len,
      rms_norm_eps=config.norm_eps, tie_word_embeddings=config.tie_embeddings,
      rope_theta=config.rope_theta, rope_parameters=rope, dtype=dtype_name,
      torch_dtype=dtype_name)
  if s is not None:
    hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
  if fam == "llama":
    hf.update(attention_bias=False, mlp_bias=False)
  elif fam == "qwen3":
    hf.update(attention_bias=False, use_sliding_window=False)
  else:
    hf.update(use_sliding_window=False)
  return hf
