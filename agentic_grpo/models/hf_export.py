"""Writes the policy as a Hugging Face checkpoint directory (the inverse of `hf_import`).

The directory holds the files `save_pretrained` writes and `from_pretrained` reads:
`config.json` (`hf_config.hf_config_from_model`, keeping the source
checkpoint's other keys), `model.safetensors` or index-sharded
`model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`
(tensor names and layouts of the table in `hf_layout`, in the param dtype,
metadata `format: pt`), `generation_config.json` and the tokenizer files of
the source checkpoint.

Parameters may be sharded over a mesh: each tensor is gathered to the host
one at a time (all processes take part; process 0 writes), so the host holds
at most one shard file's tensors. The directory is first written under a
temporary name and renamed when complete, so a crash leaves no half
checkpoint under `out_dir`.
"""

import errno
import json
import os
import shutil
from typing import Any, Optional

from flax import nnx
from flax import traverse_util
import jax
import numpy as np
from safetensors.numpy import save_file

from agentic_grpo import parallel
from agentic_grpo.models import hf_config
from agentic_grpo.models import hf_layout
from agentic_grpo.models import transformer

# Files of a checkpoint directory that describe the tokenizer (copied as they are).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model",
                   "added_tokens.json")
DEFAULT_SHARD_BYTES = 2 << 30


def to_hf_tensor(x: np.ndarray, kind: str) -> np.ndarray:
  """One parameter (our layout) as its Hugging Face tensor (see `hf_layout.TensorSpec`)."""
  if kind == "same":
    return x
  if kind == "t":
    return x.T
  if kind == "in_heads":  # [D, H, Dh] -> [H·Dh, D]
    return x.reshape(x.shape[0], -1).T
  if kind == "out_heads":  # [H, Dh, D] -> [D, H·Dh]
    return x.reshape(-1, x.shape[-1]).T
  if kind == "bias_heads":
    return x.reshape(-1)
  raise ValueError(f"unknown tensor kind {kind!r}")


def _to_host(x: jax.Array) -> np.ndarray:
  return parallel.fetch(x)  # gathered from other processes' devices where it spans them


def _shard_names(n: int) -> list[str]:
  if n == 1:
    return ["model.safetensors"]
  return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def _readable_like_the_rest(path: str) -> None:
  """Gives `path` the mode of a file `open()` creates (0666 less the umask): safetensors writes
  its files 0600, which shared storage would not let others read."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(path, 0o666 & ~umask)


def _write_tensors(tmp: str, specs: dict, flat: dict, shard_bytes: int) -> None:
  """Gathers and writes the tensors in name order, `shard_bytes` per file at most."""
  order = sorted(specs, key=lambda p: specs[p].name)
  groups, size = [[]], 0
  for path in order:
    nbytes = int(np.prod(flat[path].shape)) * np.dtype(flat[path].dtype).itemsize
    if groups[-1] and size + nbytes > shard_bytes:
      groups.append([])
      size = 0
    groups[-1].append(path)
    size += nbytes
  names = _shard_names(len(groups))
  weight_map, total = {}, 0
  for name, group in zip(names, groups):
    tensors = {}
    for path in group:
      host = _to_host(flat[path])  # every process takes part in the gather
      tensors[specs[path].name] = np.ascontiguousarray(to_hf_tensor(host, specs[path].kind))
      total += host.nbytes
    if parallel.is_primary():
      save_file(tensors, os.path.join(tmp, name), metadata={"format": "pt"})
      _readable_like_the_rest(os.path.join(tmp, name))
    weight_map.update({t: name for t in tensors})
    del tensors
  if len(names) > 1 and parallel.is_primary():
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(
          weight_map.items()))}, f, indent=2)


def generation_config(eos_ids, pad_id: Optional[int] = None,
                      bos_id: Optional[int] = None) -> dict[str, Any]:
  """A minimal `generation_config.json` ending generation on `eos_ids`."""
  eos = [int(i) for i in eos_ids]
  out: dict[str, Any] = {"eos_token_id": eos[0] if len(eos) == 1 else eos}
  if pad_id is not None:
    out["pad_token_id"] = int(pad_id)
  if bos_id is not None:
    out["bos_token_id"] = int(bos_id)
  return out


def export_hf(out_dir: str, config: transformer.ModelConfig, params: nnx.State, *,
              source_dir: Optional[str] = None,
              generation: Optional[dict[str, Any]] = None,
              shard_bytes: int = DEFAULT_SHARD_BYTES) -> str:
  """Writes `params` as a Hugging Face checkpoint directory.

  Args:
    out_dir: the directory to create; it must not exist or be empty.
    config: the model shape; `config.param_dtype` is the stored dtype.
    params: `nnx.State` of the model's parameters (any sharding).
    source_dir: the checkpoint the run started from, if any: its
      `config.json` keys are kept, its tokenizer files and
      `generation_config.json` copied.
    generation: `generation_config.json` contents when `source_dir` has none
      (see `generation_config`); None writes none.
    shard_bytes: largest safetensors file; more tensors go to further files
      with an index.

  Returns:
    `out_dir`.

  Raises:
    ValueError: `out_dir` exists and is not an empty directory; `params` do not have the
      structure of `config`; a config no Hugging Face family expresses (see
      `hf_config.hf_config_from_model`).
    FileExistsError: `out_dir` was written to by someone else while exporting (nothing is
      overwritten; the finished export is left in `<out_dir>.partial`).
  """
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise ValueError(f"export directory {out_dir!r} exists and is not a directory")
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise ValueError(f"export directory {out_dir!r} exists and is not empty")
  base = hf_config.read_config(source_dir) if source_dir else None
  hf = hf_config.hf_config_from_model(config, base)
  specs = hf_layout.tensor_specs(config, "model.")
  flat = traverse_util.flatten_dict(nnx.to_pure_dict(params))
  if set(flat) != set(specs):
    raise ValueError(f"params do not match the model config: differing paths "
                     f"{sorted(set(flat) ^ set(specs), key=str)[:5]}")
  tmp = out_dir.rstrip("/") + ".partial"
  if parallel.is_primary():
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
  _write_tensors(tmp, specs, flat, shard_bytes)
  if parallel.is_primary():
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      json.dump(hf, f, indent=2)
    copied = _copy_tokenizer(source_dir, tmp) if source_dir else False
    if not copied and generation is not None:
      with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(generation, f, indent=2)
    _move_into_place(tmp, out_dir)
  parallel.sync_processes(f"export_hf:{out_dir}")
  return out_dir


def _move_into_place(tmp: str, out_dir: str) -> None:
  """Renames the finished `tmp` to `out_dir`, atomically; never overwrites an export.

  POSIX `rename` replaces an absent or empty `out_dir` and refuses any other.

  Raises:
    FileExistsError: `out_dir` was written to while exporting; it names `out_dir` and `tmp`
      (which keeps the finished export).
  """
  try:
    os.replace(tmp, out_dir)
  except OSError as e:
    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
      raise
    raise FileExistsError(f"export directory {out_dir!r} was written to while exporting; it "
                          f"is left as it is and the finished export is in {tmp!r}") from e


def _copy_tokenizer(source_dir: str, tmp: str) -> bool:
  """Copies tokenizer files and generation_config.json; whether the latter existed."""
  for name in TOKENIZER_FILES:
    if os.path.isfile(os.path.join(source_dir, name)):
      shutil.copy(os.path.join(source_dir, name), tmp)
  gen = os.path.join(source_dir, "generation_config.json")
  if os.path.isfile(gen):
    shutil.copy(gen, tmp)
    return True
  return False
