r"""Achieved FLOP/s of the learner's update step against this machine's matmul peak.

The update step is `learner.make_update_step` (policy loss, AdamW, one micro-batch) on the
compute-bound shape of 4 layers, d_model 512 (8 heads of 64, 4 KV heads, MLP 2048, byte
vocabulary), 64 rows x 256 tokens. The peak is a large square `jnp.dot` measured in the same
process, interleaved with the update steps: float32, and bfloat16 inputs with float32
accumulation (`preferred_element_type`), the form our `bfloat16` compute dtype takes. The update
runs once with the model's compute dtype float32 (compared with the f32 peak) and once with
`dtype=bfloat16` (parameters and optimizer float32; compared with the bf16-in/f32-acc peak).

FLOPs are counted two ways: the model FLOPs (matmuls only: 3 x forward, forward =
2 x matmul parameters x tokens + 4 x layers x heads x head_dim x tokens x T for the attention
scores and the weighted sum over all T keys, as computed), and XLA's own count for the compiled
step (`cost_analysis`, which adds the element-wise work). Utilisation is model FLOPs / time /
peak. `accelerator_peak_flops` (set by accelerator.sh) replaces the measured peak by the chip's
published one.

Usage:
  python -m benchmarks.run --only update_flops [--quick]
"""

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import learner
from agentic_grpo.core import types as core_types
from agentic_grpo.models import presets
from agentic_grpo.models import transformer
from benchmarks import report


def model_config(dtype=jnp.float32, preset: str = "") -> transformer.ModelConfig:
  """The compute-bound shape (or `preset`, e.g. `qwen2_0_5b`) with compute dtype `dtype`."""
  if preset:
    return presets.get_model_config(preset, dtype=dtype, param_dtype=jnp.float32)
  return presets.get_model_config("tiny", d_model=512, n_layers=4, n_heads=8, n_kv_heads=4,
                                  head_dim=64, mlp_dim=2048, dtype=dtype)


def model_flops(c: transformer.ModelConfig, rows: int, length: int) -> float:
  """Matmul FLOPs of one update (forward + backward = 3 x forward) on `rows x length` tokens."""
  per_layer = c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads) + 3 * c.d_model * c.mlp_dim
  matmul_params = c.n_layers * per_layer + c.d_model * c.vocab_size
  tokens = rows * length
  attention = 4 * c.n_layers * c.n_heads * c.head_dim * tokens * length
  return 3.0 * (2.0 * matmul_params * tokens + attention)


def matmul_peak(dtype, size: int, repeats: int) -> float:
  """Median FLOP/s of a jitted `[size, size] @ [size, size]` (float32 accumulation)."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((size, size)), dtype)
  b = jnp.asarray(rng.standard_normal((size, size)), dtype)
  f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  f(a, b).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    f(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2.0 * size ** 3 / statistics.median(times)


def _batch(rows, length, vocab):
  rng = np.random.default_rng(0)
  mask = np.ones((rows, length), bool)
  mask[:, : length // 4] = False  # a prompt part, as in a real row
  return core_types.UpdateBatch(
      tokens=rng.integers(0, vocab, (rows, length)).astype(np.int32), loss_mask=mask,
      behaviour_logprobs=np.where(mask, -5.0, 0.0).astype(np.float32),
      advantages=np.where(mask, rng.standard_normal((rows, length)), 0.0).astype(np.float32),
      sample_weights=np.ones((rows,), np.float32))


class UpdateTimer:
  """A compiled update step on one model config, timed one step at a time."""

  def __init__(self, config: transformer.ModelConfig, rows: int, length: int):
    cfg = config_lib.TrainConfig()
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, rows_per_update=rows))
    graphdef, params = transformer.init_model(config, 0)
    opt = learner.make_optimizer(cfg.optim)
    step = learner.make_update_step(graphdef, cfg, opt)
    self.state = learner.init_state(params, opt, 0)
    self.batch = jax.device_put(_batch(rows, length, config.vocab_size))
    start = time.perf_counter()
    # The executable the learner's jit would build; compiled once here to read XLA's count.
    self.step = step.lower(self.state, self.batch, None).compile()
    cost = self.step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    self.xla_flops = float((cost or {}).get("flops", float("nan")))
    self.state, _ = self.step(self.state, self.batch, None)
    jax.block_until_ready(self.state)
    self.compile_s = time.perf_counter() - start
    self.times = []

  def once(self) -> None:
    start = time.perf_counter()
    self.state, metrics = self.step(self.state, self.batch, None)
    jax.block_until_ready(metrics)
    self.times.append(time.perf_counter() - start)


_DTYPES = (("float32", jnp.float32), ("bfloat16", jnp.bfloat16))


def run(quick: bool = False, *, preset: str = "", peaks: dict | None = None,
        rows: int = 64, length: int = 256, dtypes=_DTYPES, matmul_size: int = 2048) -> dict:
  """Measures, prints the table, appends the results line; returns it.

  Args:
    quick: 16 rows, fewer repeats (a smoke run, not a measurement).
    preset: a model preset instead of the compute-bound shape (accelerator.sh: `qwen2_0_5b`).
    peaks: `{"float32": FLOP/s, "bfloat16": FLOP/s}` published peaks to compare with instead of
      the measured matmul peaks.
    rows, length: the update batch.
    dtypes: `(name, compute dtype)` pairs to run; the name keys `peaks`.
    matmul_size: side of the square matmul that measures the peak.
  """
  load_before = report.load_average()
  if quick:
    rows = min(rows, 16)
  repeats = 3 if quick else 5
  size = min(1024, matmul_size) if quick else matmul_size
  timers = {name: UpdateTimer(model_config(dt, preset), rows, length) for name, dt in dtypes}
  measured = {name: [] for name, _ in dtypes}
  for _ in range(repeats):  # interleaved: peak, update, peak, update...
    for name, dt in dtypes:
      measured[name].append(matmul_peak(dt, size, 3))
      timers[name].once()
  rows_out, summary = [], {}
  for name, dt in dtypes:
    timer = timers[name]
    c = model_config(dt, preset)
    flops = model_flops(c, rows, length)
    step_s = statistics.median(timer.times)
    peak = (peaks or {}).get(name) or statistics.median(measured[name])
    achieved = flops / step_s
    rows_out.append([name, f"{step_s:.3f}", f"{achieved / 1e9:.1f}", f"{timer.xla_flops / step_s / 1e9:.1f}",
                     f"{peak / 1e9:.1f}", f"{achieved / peak:.1%}", f"{timer.compile_s:.1f}"])
    summary[f"utilisation_{name}"] = round(achieved / peak, 3)
    summary[f"step_s_{name}"] = round(step_s, 4)
  return report.record(
      "update_flops",
      settings={"preset": preset or "4 layers, d 512, 8/4 heads, mlp 2048", "rows": rows,
                "length": length, "repeats": repeats, "peak": "published" if peaks else
                f"measured {size}^3 matmul", "quick": quick},
      header=["compute dtype", "step s (median)", "model GFLOP/s", "XLA-count GFLOP/s",
              "peak GFLOP/s", "model FLOPs / peak", "compile + first step s"],
      rows=rows_out, summary=summary, load_before=load_before)
