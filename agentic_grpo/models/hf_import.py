"""Loads Hugging Face Llama / Qwen2 / Qwen3 safetensors checkpoints straight into their shards.

Two steps, so that every check happens before any device memory is spent:

1. `open_hf_checkpoint(path)` reads `config.json` (`hf_config`) and the
   safetensors headers (`model.safetensors`, or the shards listed in
   `model.safetensors.index.json`), and checks that every tensor the config
   implies is present, in an allowed dtype, with the implied shape, and that
   no file is truncated. It reads no tensor data.
2. `load_params(checkpoint, shardings)` builds each parameter as a global
   `jax.Array` in its sharding: for each addressable device it reads only
   that device's block through safetensors' lazy `get_slice`, maps it to our
   layout, casts it to the param dtype on the host and puts it on the device
   (`jax.make_array_from_single_device_arrays`). A process therefore reads
   only the slices its devices hold, and its host staging memory is one
   device block at a time.

The table of Hugging Face tensors and our parameters (`hf_layout.tensor_specs`), and the
reading of one block of a parameter from its tensor (`hf_layout.read_slice`), are `hf_layout`'s.
"""

import dataclasses
import gc
import json
import os
from typing import Any, Optional

from flax import nnx
from flax import traverse_util
import jax
import numpy as np
from safetensors import safe_open

from agentic_grpo import errors
from agentic_grpo.models import hf_config
from agentic_grpo.models import hf_layout
from agentic_grpo.models import transformer

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# safetensors dtype names a checkpoint tensor may be stored in (cast to the param dtype on read).
ALLOWED_TENSOR_DTYPES = ("BF16", "F16", "F32")

@dataclasses.dataclass(frozen=True)
class HFCheckpoint:
  """A checked checkpoint directory; holds no tensor data.

  Attributes:
    path: the directory.
    hf: the parsed `config.json`.
    config: the `ModelConfig` (with the requested dtypes).
    files: tensor name -> safetensors file.
    specs: parameter path -> `hf_layout.TensorSpec`.
  """
  path: str
  hf: dict[str, Any]
  config: transformer.ModelConfig
  files: dict[str, str]
  specs: dict[tuple, hf_layout.TensorSpec]


def _tensor_files(path: str) -> dict[str, str]:
  """Tensor name -> safetensors file, from the index or the single file's header."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.isfile(index):
    try:
      with open(index, encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
      raise errors.InputError(f"{index} is not a valid safetensors index: {e!r}") from e
    files = {}
    for name, shard in weight_map.items():
      file = os.path.join(path, shard)
      if not os.path.isfile(file):
        raise errors.InputError(f"shard {shard!r} of tensor {name!r} listed in {index} is missing")
      files[name] = file
    return files
  if os.path.isfile(single):
    return {name: single for name in _header(single)}
  raise errors.InputError(f"no model.safetensors or model.safetensors.index.json in {path!r}")


def _header(file: str) -> dict[str, tuple[tuple[int, ...], str]]:
  """Tensor name -> (shape, safetensors dtype) of one file; checks it is not truncated."""
  try:
    with safe_open(file, framework="np") as f:
      out = {}
      for name in f.keys():
        s = f.get_slice(name)
        out[name] = (tuple(s.get_shape()), s.get_dtype())
      return out
  except Exception as e:  # safetensors raises its own error type for damaged files
    raise errors.InputError(f"safetensors file {file!r} is unreadable or truncated: {e}") from e


def open_hf_checkpoint(path: str, *, dtype=None, param_dtype=None) -> HFCheckpoint:
  """Checks a checkpoint directory without reading tensor data.

  Args:
    path: directory with `config.json` and `model.safetensors` or a sharded
      `model.safetensors.index.json` (as written by `save_pretrained`).
    dtype: compute dtype override (default: the param dtype).
    param_dtype: storage dtype override (default: the checkpoint's dtype).

  Raises:
    errors.InputError (a ValueError): missing, unreadable or truncated files; an unsupported
      architecture or option (see `hf_config.model_config_from_hf`; the message names the
      checkpoint); a missing or unexpected tensor; a tensor whose shape disagrees with
      `config.json` (naming the tensor and both shapes) or stored in a dtype outside
      `ALLOWED_TENSOR_DTYPES`.
  """
  if not os.path.isdir(path):
    raise errors.InputError(f"checkpoint path {path!r} is not a directory")
  hf = hf_config.read_config(path)
  try:
    config = hf_config.model_config_from_hf(hf, dtype=dtype, param_dtype=param_dtype)
  except errors.InputError as e:
    raise errors.InputError(f"checkpoint {path!r}: {e}") from None
  files = _tensor_files(path)
  prefix = "model." if any(n.startswith("model.") for n in files) else ""
  specs = hf_layout.tensor_specs(config, prefix)
  expected = {s.name: s.hf_shape for s in specs.values()}
  missing = sorted(set(expected) - set(files))
  if missing:
    raise errors.InputError(f"checkpoint {path!r} is missing tensor(s) {missing[:5]}"
                     f"{' ...' if len(missing) > 5 else ''}")
  unexpected = sorted(n for n in set(files) - set(expected)
                      if not n.endswith(_IGNORED_SUFFIXES)
                      and not (config.tie_embeddings and n == "lm_head.weight"))
  if unexpected:
    raise errors.InputError(f"checkpoint {path!r} has unexpected tensor(s) {unexpected[:5]} for "
                     f"this config")
  headers: dict[str, dict] = {}
  for name in sorted(expected):
    file = files[name]
    if file not in headers:
      headers[file] = _header(file)
    if name not in headers[file]:
      raise errors.InputError(f"tensor {name!r} is listed for {file!r} but not stored there")
    shape, stored = headers[file][name]
    if shape != expected[name]:
      raise errors.InputError(f"tensor {name!r} has shape {shape}, expected {expected[name]} "
                       f"from config.json")
    if stored not in ALLOWED_TENSOR_DTYPES:
      raise errors.InputError(f"tensor {name!r} is stored as {stored}; allowed: "
                       f"{list(ALLOWED_TENSOR_DTYPES)}")
  return HFCheckpoint(path, hf, config, files, specs)


def _single_device_shardings(abstract: nnx.State) -> Any:
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda _: device, abstract)


def load_params(checkpoint: HFCheckpoint, shardings: Optional[nnx.State] = None) -> nnx.State:
  """The checkpoint's parameters, each built in its shards.

  Args:
    checkpoint: from `open_hf_checkpoint`.
    shardings: `nnx.State` of `jax.sharding.Sharding`s shaped like the model's
      parameters (e.g. `placement.shard_model(config, mesh).param_shardings`
      or the learner's); default: everything on the first device.

  Returns:
    `nnx.State` of `nnx.Param`s with global `jax.Array` leaves in
    `checkpoint.config.param_dtype`. Each process reads, for each tensor, only
    the slices its addressable devices hold (each distinct slice once; copies
    of a slice on other local devices are device-to-device).

  Raises:
    ValueError: `shardings` does not have the model's parameter structure.
  """
  config = checkpoint.config
  _, params = transformer.abstract_model(config)
  shardings = _single_device_shardings(params) if shardings is None else shardings
  try:
    by_path = nnx.to_pure_dict(shardings)
  except Exception as e:
    raise ValueError(f"shardings must be an nnx.State like the parameters: {e!r}") from e
  flat_shardings = traverse_util.flatten_dict(by_path)
  if set(flat_shardings) != set(checkpoint.specs):
    raise ValueError(f"shardings do not match the model's parameters: differing paths "
                     f"{sorted(set(flat_shardings) ^ set(checkpoint.specs), key=str)[:5]}")
  pd = np.dtype(config.param_dtype)
  by_file: dict[str, list[tuple]] = {}
  for path, spec in checkpoint.specs.items():
    by_file.setdefault(checkpoint.files[spec.name], []).append(path)
  arrays = {}
  for file, paths in sorted(by_file.items()):
    with safe_open(file, framework="np") as f:
      for path in paths:
        spec = checkpoint.specs[path]
        arrays[path] = _load_one(f.get_slice(spec.name), spec, config.head_dim,
                                 flat_shardings[path], pd)
  nnx.replace_by_pure_dict(params, traverse_util.unflatten_dict(arrays),
                           replace_fn=lambda var, x: var.replace(x))
  return params


# Largest read from a safetensors file at once: a block is filled in pieces of whole Hugging
# Face rows, so that reading a column range (which reads whole rows) and casting cost at most
# this much beyond the block itself.
_READ_CHUNK_BYTES = 16 << 20
# The parameter axis that runs along the Hugging Face tensor's rows (its first axis).
_ROW_AXIS = {"same": 0, "t": 1, "in_heads": 1, "out_heads": 2, "bias_heads": 0}


def _read_block(tensor, spec: hf_layout.TensorSpec, head_dim: int, index: tuple,
                shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
  """`hf_layout.read_slice` cast to `dtype`, read in pieces of at most ~`_READ_CHUNK_BYTES`."""
  bounds = hf_layout.bounds(index, shape)
  out = np.empty([b - a for a, b in bounds], dtype)
  axis = _ROW_AXIS[spec.kind]
  hf_row_elems = int(np.prod(spec.hf_shape[1:], dtype=np.int64))
  # One step along `axis` covers head_dim HF rows for the head kinds, one row otherwise.
  rows_per_step = head_dim if spec.kind == "in_heads" else 1
  item = max(np.dtype(dtype).itemsize, 4)
  step = max(1, _READ_CHUNK_BYTES // max(1, hf_row_elems * rows_per_step * item))
  start, stop = bounds[axis]
  for lo in range(start, stop, step):
    hi = min(stop, lo + step)
    sub = list(bounds)
    sub[axis] = (lo, hi)
    piece = hf_layout.read_slice(tensor, spec.kind, head_dim,
                                 tuple(slice(a, b) for a, b in sub), shape)
    target = [slice(None)] * len(shape)
    target[axis] = slice(lo - start, hi - start)
    out[tuple(target)] = piece
  return out


def _load_one(tensor, spec: hf_layout.TensorSpec, head_dim: int, sharding,
              dtype: np.dtype) -> jax.Array:
  """One global array from this process's device blocks.

  Each distinct block is read and cast once and put on its first device right
  away; a device holding a copy of a block already placed gets it device to
  device. So at most one block of host staging memory is alive at a time
  (`jax.make_array_from_callback` would hold every local block of the tensor
  until all of them are read).
  """
  shape = hf_layout.param_shape(spec, head_dim)
  placed: dict[tuple, jax.Array] = {}
  shards = []
  for device, index in sharding.addressable_devices_indices_map(shape).items():
    key = tuple(map(tuple, hf_layout.bounds(index, shape)))
    if key in placed:
      shards.append(jax.device_put(placed[key], device))
      continue
    block = _read_block(tensor, spec, head_dim, index, shape, dtype)
    placed[key] = jax.device_put(block, device)
    placed[key].block_until_ready()
    if block.nbytes > _READ_CHUNK_BYTES:
      del block
      gc.collect(0)  # the transfer leaves the host block in a reference cycle: free it now
    shards.append(placed[key])
  return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def load_hf_checkpoint(
    path: str,
    *,
    dtype=None,
    param_dtype=None,
    shardings=None,
) -> tuple[transformer.ModelConfig, nnx.State]:
  """Checks and loads a Llama, Qwen2 or Qwen3 safetensors checkpoint directory.

  Example (one device; `models.sources.open_model` does the same for a run's config and also
  brings the tokenizer):

    config, params = load_hf_checkpoint("/models/qwen2.5-0.5b", param_dtype=jnp.bfloat16)
    graphdef, _ = transformer.abstract_model(config)
    logits, _ = transformer.apply(graphdef, params, tokens, positions)  # [N, T, V] float32

  Args:
    path: a local directory as `save_pretrained` writes it: `config.json` and
      `model.safetensors`, or the shards listed in `model.safetensors.index.json` (no
      tokenizer needed here; `models.tokenizers.HFTokenizer(path)` reads `tokenizer.json`).
      Remote paths (`gs://`, `hf://`) go through `models.sources.resolve_path` first.
    dtype: the compute dtype of activations (a JAX dtype such as `jnp.bfloat16`, or its
      name); default: `param_dtype`.
    param_dtype: the dtype the parameters are stored in on device (each tensor is cast on the
      host as it is read); default: the checkpoint's `dtype` / `torch_dtype` in
      `config.json`, else float32.
    shardings: where each parameter goes: an `nnx.State` of `jax.sharding.Sharding`s shaped
      like the parameters (e.g. `placement.shard_model(config, mesh).param_shardings`), or a
      function `ModelConfig -> shardings` (the shardings depend on the shape read from
      `config.json`); default: everything on the first device. Each process reads only the
      slices its devices hold.

  Returns:
    `(config, params)`: the `transformer.ModelConfig` read from `config.json` (with the
    dtypes asked for; `config.vocab_size` is the embedding's rows, which may exceed the
    tokenizer's ids) and an `nnx.State` of `nnx.Param`s with global `jax.Array` leaves in
    `param_dtype`. `transformer.abstract_model(config)[0]` is the matching `graphdef`, and
    `transformer.apply(graphdef, params, ...)` runs the model.

  Raises:
    errors.InputError (a ValueError): see `open_hf_checkpoint`; raised before any tensor is
      read.
    ValueError: `shardings` not shaped like the parameters.
  """
  checkpoint = open_hf_checkpoint(path, dtype=dtype, param_dtype=param_dtype)
  if callable(shardings):
    shardings = shardings(checkpoint.config)
  return checkpoint.config, load_params(checkpoint, shardings)
