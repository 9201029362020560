r"""The accelerator run of `accelerator.sh`: a Qwen2.5-0.5B-shaped random model in bfloat16.

On the first GPU or TPU device: `update_flops` (the update step's model FLOP/s against the
chip's published dense bf16 peak, `PUBLISHED_PEAKS`; against the measured matmul peak where the
chip is not in the table), `sampler` (our tokens/s at batch 16 and 64; `transformers` is not
installed on the accelerator host), `continuous` and `continuous_prefix` (`continuous_bench`:
continuous against static batching on the long-tailed workload at batch 64 and 256, and reused
conversation prefixes against re-prefill on the 4-stage conversations at 16 and 64 slots) and
`grpo_step` (our steady-state GRPO iterations/s; Tunix is left out for the same reason). Every part has its own time limit and a failing part is recorded
as failed, so that one run always leaves a results file.

Usage (accelerator.sh does this):
  python -m benchmarks.accelerator --results=FILE [--preset=qwen2_0_5b]
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.models import presets
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer
from benchmarks import continuous_bench
from benchmarks import report
from benchmarks import update_flops


# Dense bf16 peak FLOP/s by `device_kind` prefix (vendor data sheets, without sparsity).
PUBLISHED_PEAKS = {
    "NVIDIA H200": 989e12, "NVIDIA H100": 989e12, "NVIDIA GH200": 989e12,
    "NVIDIA A100": 312e12, "NVIDIA L4": 121e12, "NVIDIA A10": 125e12, "NVIDIA L40S": 362e12,
    "NVIDIA B200": 2250e12, "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
    "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
}


def published_peak(kind: str):
  """The table's peak for `kind` (longest matching prefix), or None."""
  matches = [k for k in PUBLISHED_PEAKS if kind.startswith(k)]
  return PUBLISHED_PEAKS[max(matches, key=len)] if matches else None


def _sampler(preset: str) -> dict:
  load_before = report.load_average()
  config = presets.get_model_config(preset)
  graphdef, params = transformer.init_model(config, 0)
  rows = []
  for batch, prompt_len, new_tokens in ((16, 128, 128), (64, 128, 128)):
    prompts = np.random.RandomState(1).randint(0, config.vocab_size, (batch, prompt_len))
    lengths = np.full((batch,), prompt_len, np.int32)

    def once():
      out = sampler.sample(graphdef, params, prompts.astype(np.int32), lengths,
                           jax.random.key(0), max_new_tokens=new_tokens, greedy=True)
      return jax.block_until_ready(out.tokens)

    start = time.perf_counter()
    once()
    warm = time.perf_counter() - start
    times = []
    for _ in range(3):
      start = time.perf_counter()
      once()
      times.append(time.perf_counter() - start)
    rows.append([batch, prompt_len, new_tokens, f"{batch * new_tokens / statistics.median(times):.0f}",
                 f"{warm:.1f}"])
  return report.record(
      "sampler_accelerator", settings={"preset": preset, "dtype": "bfloat16"},
      header=["batch", "prompt", "new tokens", "tokens/s (median of 3)", "first call s"],
      rows=rows, summary={}, load_before=load_before)


def _grpo_step(preset: str, timeout: int) -> dict:
  load_before = report.load_average()
  here = pathlib.Path(__file__).resolve().parent
  args = [sys.executable, str(here / "grpo_ours_worker.py"), f"--preset={preset}",
          "--group=8", "--prompts=8", "--prompt_len=128", "--new_tokens=128", "--iterations=3",
          "--warmup=2", "--devices=1"]
  env = dict(os.environ, PYTHONPATH=str(here.parent))
  proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                        check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise RuntimeError(f"grpo_ours_worker failed (exit {proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")
  out = json.loads(lines[-1])
  step = statistics.median(out["times"])
  return report.record(
      "grpo_step_accelerator",
      settings={"preset": preset, "group": 8, "prompts": 8, "prompt_len": 128,
                "new_tokens": 128},
      header=["side", "it/s (median)", "s/it", "warm-up s"],
      rows=[["ours", f"{1 / step:.2f}", f"{step:.3f}", f"{out['compile_s']:.1f}"]],
      summary={"iterations_per_s": round(1 / step, 3)}, load_before=load_before)


def main(argv):
  del argv
  report.RESULTS = pathlib.Path(_RESULTS.value)
  device = jax.devices()[0]
  print(f"device: {device.device_kind} ({jax.default_backend()}), preset {_PRESET.value}",
        flush=True)
  peak = published_peak(device.device_kind)
  parts = {
      "update_flops": lambda: update_flops.run(
          preset=_PRESET.value, peaks={"bfloat16": peak} if peak else None,
          rows=_UPDATE_ROWS.value, length=512, dtypes=(("bfloat16", jnp.bfloat16),),
          matmul_size=_MATMUL.value),
      "sampler": lambda: _sampler(_PRESET.value),
      "continuous": lambda: continuous_bench.run(batches=(64, 256), requests_per_slot=2,
                                                 new_tokens=256, repeats=1,
                                                 preset=_PRESET.value),
      "continuous_prefix": lambda: continuous_bench.run_conversations(
          batches=(16, 64), episodes_per_slot=2, new_tokens=128, repeats=1,
          preset=_PRESET.value),
      "grpo_step": lambda: _grpo_step(_PRESET.value, _PART_TIMEOUT.value),
  }
  failed = []
  for name in _ONLY.value:
    start = time.perf_counter()
    try:
      parts[name]()
    except Exception as e:  # pylint: disable=broad-except
      failed.append(name)
      print(f"!! {name} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
      with open(report.RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps({"benchmark": name, "failed": f"{type(e).__name__}: {e}"[:2000],
                            "machine": report.machine()}) + "\n")
    print(f"== {name} took {time.perf_counter() - start:.0f} s", flush=True)
  if failed:
    sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
  # Flags only when run as a program: tests and other modules import this one next to
  # programs that define the same flag names (tests/launch_imports_test.py).
  _RESULTS = flags.DEFINE_string("results", str(report.RESULTS), "JSON-lines file appended to.")
  _PRESET = flags.DEFINE_string("preset", "qwen2_0_5b",
                                "Model shape (Qwen2.5-0.5B has the shape of `qwen2_0_5b`).")
  _ONLY = flags.DEFINE_list("only", ["update_flops", "sampler", "continuous",
                                     "continuous_prefix", "grpo_step"], "Parts to run.")
  _PART_TIMEOUT = flags.DEFINE_integer("part_timeout", 150, "Seconds allowed for grpo_step.")
  _MATMUL = flags.DEFINE_integer("matmul_size", 8192,
                                 "Side of the matmul measuring the peak (where none is published).")
  _UPDATE_ROWS = flags.DEFINE_integer("update_rows", 16, "Rows of 512 tokens per update.")
  app.run(main)
