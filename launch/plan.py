r"""Per-device memory of a training run, computed from shapes before paying for a pod.

For a model preset, a `(data, fsdp, tensor)` mesh and the batch shapes, prints
what each device holds: parameters, gradients, optimizer state (the learner's
own optimizer, from `jax.eval_shape`), the sampler's KV cache, and an estimate
of the learner's activations. Shardings are the ones the run would use
(`agentic_grpo.parallel` and `models.placement` with the default logical axis rules, on an
`AbstractMesh`: no devices needed), including the replication of dimensions
the mesh does not divide.

  python -m launch.plan --model=qwen2_7b --mesh=1,8,4 --learner_rows=64 \
      --seq_len=4096 --micro_batches=4 --sample_rows=128 --cache_len=4096 --hbm_gib=95

`--hf_config=PATH` sizes the Hugging Face model to be loaded instead of a preset:
PATH is its `config.json` or the checkpoint directory holding it (read with
`models.hf_config`, the same reader the run uses; `--param_dtype` overrides the
checkpoint's dtype as `config.model.param_dtype` would).

Activations are an estimate of what the backward pass keeps (no
rematerialisation, as the model is written): per layer and token the block
input, both norm outputs, q/k/v, attention probabilities and output, the MLP
gate/up/hidden, in the compute dtype, plus the float32 softmax output (the
attention is materialised: `[rows, heads, T, T]` per layer, the term that
dominates at long T), and three float32 `[rows, T, V]` tensors for the
logits, their log-softmax and the entropy. Rows per device are those of one
micro-batch; when the batch mesh axes do not divide a micro-batch's rows they
are not split (as `parallel.batch_sharding` does), so choose
`learner_rows / micro_batches` as a multiple of `data * fsdp`. XLA may fuse
some of these away or keep temporaries this count misses; treat the figure
as a planning number, not a bound.

Exit codes (`agentic_grpo/exit_codes.py`): 0 the table (and, with `--hbm_gib`, the layout
fits), 80 (`DOES_NOT_FIT`) the layout does not fit `--hbm_gib` per device (the table is printed
first), 78 an input mistake (one line naming the flag and the fix: a bad `--mesh` or size, an
`--hf_config` that is missing or of an unsupported or inconsistent architecture), 1 a crash (a
bug, with its traceback).
"""

import dataclasses
import sys
from typing import Optional, Sequence

from absl import app
from absl import flags
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import exit_codes
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo.models import hf_config
from agentic_grpo.models import placement
from agentic_grpo.models import presets
from agentic_grpo.models import transformer
from launch import common_flags

_MODEL = flags.DEFINE_string("model", "qwen2_7b", f"model preset: {presets.PRESETS}")
_HF_CONFIG = flags.DEFINE_string(
    "hf_config", "", "a Hugging Face config.json (or its directory) to size instead of --model")
_PARAM_DTYPE = flags.DEFINE_enum(
    "param_dtype", "", ["", "float32", "bfloat16", "float16"],
    "parameter dtype ('' = the preset's or the checkpoint's)")
_MESH = flags.DEFINE_string(
    "mesh", "1,1,1", "data,fsdp,tensor sizes (one may be -1, with --num_devices); default one "
    "device")
_NUM_DEVICES = flags.DEFINE_integer("num_devices", 0,
                                    "devices in the slice (0 = product of --mesh)")
_LEARNER_ROWS = flags.DEFINE_integer("learner_rows", 64, "rows N per learner update")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 2048, "tokens T per learner row")
_MICRO = flags.DEFINE_integer("micro_batches", 1, "micro-batches per update")
_SAMPLE_ROWS = flags.DEFINE_integer("sample_rows", 64, "rows sampled at once (B*G)")
_CACHE_LEN = flags.DEFINE_integer("cache_len", 2048, "KV-cache slots (prompt + new tokens)")
_HBM = flags.DEFINE_float("hbm_gib", 0.0, "memory per device in GiB, to check the fit (0 = skip)")

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-device bytes of each part of a run.

  Attributes:
    mesh_shape: `(data, fsdp, tensor)`.
    num_params: parameters of the model.
    params, grads, opt_state, kv_cache, activations: bytes per device (the
      largest over devices where shards differ). `grads` are float32; `opt_state`
      counts AdamW's moments and, for low-precision parameters, the float32
      master copy (`learner.TrainState.master`).
    rows_per_device: learner rows per device and micro-batch.
    sample_rows_per_device: sampler rows per device.
  """
  mesh_shape: tuple[int, int, int]
  num_params: int
  params: int
  grads: int
  opt_state: int
  kv_cache: int
  activations: int
  rows_per_device: int
  sample_rows_per_device: int

  @property
  def total(self) -> int:
    """Learner step peak: parameters, gradients, optimizer state, activations."""
    return self.params + self.grads + self.opt_state + self.activations

  @property
  def sampling_total(self) -> int:
    """Sampler peak: parameters and KV cache (the learner's state stays resident)."""
    return self.params + self.opt_state + self.kv_cache


def _tree_bytes(abstract, shardings) -> int:
  total = 0
  for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)):
    total += int(np.prod(s.shard_shape(tuple(a.shape)), dtype=np.int64)) * np.dtype(a.dtype).itemsize
  return total


def _split(dim: int, ways: int) -> int:
  """Per-device size of a dimension split `ways` ways, or whole if indivisible."""
  return dim // ways if dim % ways == 0 else dim


def make_plan(model_config: transformer.ModelConfig, mesh_shape: Sequence[int], *,
              learner_rows: int, seq_len: int, micro_batches: int = 1,
              sample_rows: int, cache_len: int,
              optim: Optional[config_lib.OptimSection] = None,
              rules: Optional[parallel.Rules] = None) -> Plan:
  """Per-device memory of a run.

  Args:
    model_config: the model shape.
    mesh_shape: `(data, fsdp, tensor)`, all positive.
    learner_rows: rows N of one learner update (all devices together).
    seq_len: tokens T per learner row.
    micro_batches: the update is computed in this many micro-batches.
    sample_rows: rows sampled at once (B*G, all devices together).
    cache_len: KV-cache slots per sampled row.
    optim: optimizer section (default: the config's defaults).
    rules: logical axis rules (default `parallel.DEFAULT_RULES`).

  Returns:
    A `Plan`.

  Raises:
    errors.InputError (a ValueError): non-positive sizes, or `micro_batches` not dividing
      `learner_rows` (named as the flags of `launch.plan`).
    ValueError: a mesh shape of a non-positive size (`parallel.resolve_mesh_shape`).
  """
  for name, v in (("learner_rows", learner_rows), ("seq_len", seq_len),
                  ("micro_batches", micro_batches), ("sample_rows", sample_rows),
                  ("cache_len", cache_len)):
    if v <= 0:
      raise errors.InputError(f"--{name} must be positive, got {v}")
  if learner_rows % micro_batches:
    raise errors.InputError(f"--micro_batches ({micro_batches}) must divide --learner_rows "
                            f"({learner_rows})")
  mesh_shape = tuple(int(s) for s in mesh_shape)
  parallel.resolve_mesh_shape(mesh_shape, int(np.prod(mesh_shape)))  # validates
  mesh = jax.sharding.AbstractMesh(mesh_shape, parallel.MESH_AXES)
  sm = placement.shard_model(model_config, mesh, rules)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), sm.abstract_params)
  params = _tree_bytes(abstract, sm.param_shardings)
  num_params = transformer.param_count(abstract)
  # The learner accumulates float32 gradients over micro-batches: accumulator plus one
  # micro-batch's.
  grads = _tree_bytes(jax.eval_shape(learner.to_master, abstract), sm.param_shardings) * (
      2 if micro_batches > 1 else 1)
  tx = learner.make_optimizer(optim or config_lib.OptimSection())
  # AdamW's moments, and the float32 master copy of low-precision parameters.
  abstract_state = jax.eval_shape(lambda p: learner.init_state(p, tx, 0), abstract)
  optimizer_side = (abstract_state.opt_state, abstract_state.master)
  opt_state = _tree_bytes(optimizer_side, placement.tree_shardings_like(optimizer_side, sm))

  c = model_config
  cache_sh = placement.kv_cache_shardings(c, mesh, sample_rows, cache_len, rules)
  cache_abs = jax.eval_shape(lambda: transformer.init_cache(c, sample_rows, cache_len))
  kv_cache = _tree_bytes(cache_abs, cache_sh)

  rows = learner_rows // micro_batches
  row_spec = parallel.batch_sharding(mesh, (rows, seq_len), rules).spec[0]
  row_axes = (row_spec,) if isinstance(row_spec, str) else tuple(row_spec or ())
  row_ways = int(np.prod([mesh.shape[a] for a in row_axes]))
  n = rows // row_ways
  sample_row_spec = cache_sh.valid.spec[0]
  sample_axes = (sample_row_spec,) if isinstance(sample_row_spec, str) else tuple(
      sample_row_spec or ())
  n_sample = sample_rows // int(np.prod([mesh.shape[a] for a in sample_axes]))
  t = mesh.shape["tensor"]
  h, kv = _split(c.n_heads, t), _split(c.n_kv_heads, t)
  f, v = _split(c.mlp_dim, t), _split(c.vocab_size, t)
  b = np.dtype(c.dtype).itemsize
  d, dh, seq = c.d_model, c.head_dim, seq_len
  per_token_layer = b * (
      2 * d                      # block input, attention-norm output
      + (h + 2 * kv) * dh        # q, k, v
      + h * seq                  # attention probabilities
      + h * dh + d               # attention output, residual after attention
      + d                        # MLP-norm output
      + 3 * f                    # gate, up, silu(gate) * up
  ) + 4 * h * seq                # float32 softmax output
  activations = n * seq * (c.n_layers * per_token_layer + 3 * 4 * v)
  return Plan(mesh_shape=mesh_shape, num_params=num_params, params=params, grads=grads,
              opt_state=opt_state, kv_cache=kv_cache, activations=int(activations),
              rows_per_device=n, sample_rows_per_device=n_sample)


def format_count(n: int) -> str:
  """A count legible at any size: `950`, `12.3K`, `1.00M`, `494M`, `8.19B` (three significant
  digits above 1,000).

  Raises:
    ValueError: a negative count.
  """
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  if n < 1000:
    return str(int(n))
  for scale, suffix in ((1e3, "K"), (1e6, "M"), (1e9, "B"), (1e12, "T")):
    value = n / scale
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    text = f"{value:.{digits}f}"
    if float(text) < 1000 or suffix == "T":  # 999,999 is 1.00M, not 1000K
      return text + suffix
  raise AssertionError("unreachable")


def fits(plan: Plan, hbm_gib: float) -> bool:
  """Whether the learner step and the sampler each fit in `hbm_gib` GiB per device."""
  return max(plan.total, plan.sampling_total) / GIB <= hbm_gib


def format_plan(plan: Plan, model_name: str, hbm_gib: float = 0.0) -> str:
  """A human-readable table of a `Plan` (GiB per device); with `hbm_gib` > 0, a last line
  saying whether it fits (`fits`)."""
  lines = [
      f"model {model_name}: {format_count(plan.num_params)} parameters "
      f"({plan.num_params:,})",
      f"mesh (data, fsdp, tensor) = {plan.mesh_shape}, {int(np.prod(plan.mesh_shape))} devices; "
      f"learner rows/device/micro-batch {plan.rows_per_device}, "
      f"sampler rows/device {plan.sample_rows_per_device}",
      f"  {'parameters':<28}{plan.params / GIB:10.2f} GiB",
      f"  {'gradients':<28}{plan.grads / GIB:10.2f} GiB",
      f"  {'optimizer state':<28}{plan.opt_state / GIB:10.2f} GiB",
      f"  {'activations (estimate)':<28}{plan.activations / GIB:10.2f} GiB",
      f"  {'KV cache (sampler)':<28}{plan.kv_cache / GIB:10.2f} GiB",
      f"  {'learner step peak':<28}{plan.total / GIB:10.2f} GiB",
      f"  {'sampling peak':<28}{plan.sampling_total / GIB:10.2f} GiB",
  ]
  if hbm_gib > 0:
    worst = max(plan.total, plan.sampling_total) / GIB
    verdict = "fits" if fits(plan, hbm_gib) else "does NOT fit"
    lines.append(f"  {worst:.2f} GiB of {hbm_gib:.0f} GiB per device: {verdict}")
  return "\n".join(lines)


def model_from_flags(preset: str, hf_config_path: str = "", param_dtype: str = ""
                     ) -> tuple[transformer.ModelConfig, str]:
  """`(model_config, name)` of a preset, or of a Hugging Face `config.json` when given.

  Raises:
    errors.InputError (a ValueError): an unknown preset (naming `--model`), or a
      config.json the run could not load (see `hf_config.model_config_from_hf`).
  """
  if hf_config_path:
    try:
      hf = hf_config.read_config(hf_config_path)
      config = hf_config.model_config_from_hf(hf, param_dtype=param_dtype or None)
    except errors.InputError as e:
      raise errors.InputError(f"--hf_config {hf_config_path!r}: {e}") from None
    return config, f"{hf_config.family(hf)} from {hf_config_path}"
  if preset not in presets.PRESETS:
    raise errors.InputError(f"--model must be one of {sorted(presets.PRESETS)}, got "
                            f"{preset!r} (or give --hf_config)")
  overrides = {"param_dtype": param_dtype, "dtype": param_dtype} if param_dtype else {}
  return presets.get_model_config(preset, **overrides), preset


def _mesh_shape(mesh: str, num_devices: int) -> tuple[int, int, int]:
  """`--mesh` (and `--num_devices`) resolved; an `errors.InputError` naming them."""
  try:
    sizes = tuple(int(s) for s in mesh.split(","))
  except ValueError:
    raise errors.InputError(f"--mesh must be three comma-separated ints, got {mesh!r}") from None
  if -1 in sizes and not num_devices:
    raise errors.InputError("--mesh has a -1: give --num_devices")
  try:
    return parallel.resolve_mesh_shape(sizes, num_devices or int(abs(np.prod(sizes))))
  except ValueError as e:
    raise errors.InputError(f"--mesh={mesh} --num_devices={num_devices}: {e}") from None


def main(argv):
  with common_flags.reported_errors():  # input mistakes: one line, exit code 78
    if len(argv) > 1:
      raise errors.InputError(f"unexpected arguments {argv[1:]}")
    shape = _mesh_shape(_MESH.value, _NUM_DEVICES.value)
    model_config, name = model_from_flags(_MODEL.value, _HF_CONFIG.value, _PARAM_DTYPE.value)
    plan = make_plan(model_config, shape, learner_rows=_LEARNER_ROWS.value,
                     seq_len=_SEQ_LEN.value, micro_batches=_MICRO.value,
                     sample_rows=_SAMPLE_ROWS.value, cache_len=_CACHE_LEN.value)
  print(format_plan(plan, name, _HBM.value), flush=True)
  if _HBM.value > 0 and not fits(plan, _HBM.value):
    sys.exit(exit_codes.DOES_NOT_FIT)


if __name__ == "__main__":
  app.run(main, flags_parser=common_flags.parse_flags)
