r"""Steady-state GRPO iterations per second: ours against Tunix's `GRPOLearner`.

One iteration is rollout + reference log-probs + advantages + update, on the same model shape,
group, batch, prompt and completion lengths, and mesh, for both (see `grpo_ours_worker.py` and
`grpo_tunix_worker.py`). Wall time and the process's CPU time (all threads) per iteration are
both reported: on a shared machine the CPU-time ratio is the steadier one. Each measurement is a fresh process; rounds alternate which side goes
first, so that both see the same share of whatever else the machine runs. Per process, the first
`warmup` iterations (compilation) are reported apart, and the median of the following iteration
times is its steady-state time. The headline is the median over rounds of the per-round ratio.

Tunix runs in its own virtual environment (`requirements-tunix.txt`, built on first use).

Usage:
  python -m benchmarks.run --only grpo_step [--quick]
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys

from benchmarks import report
from benchmarks import venvs

HERE = pathlib.Path(__file__).resolve().parent

# name -> worker arguments; the two shapes of the issue that motivated this benchmark.
SHAPES = {
    "small": dict(layers=2, d_model=64, heads=4, kv_heads=2, head_dim=16, mlp=256, group=4,
                  prompts=2, prompt_len=32, new_tokens=16),
    "large": dict(layers=4, d_model=256, heads=8, kv_heads=4, head_dim=32, mlp=1024, group=8,
                  prompts=8, prompt_len=32, new_tokens=64),
}
# Timed iterations per process: the large shape takes seconds per iteration on 2 CPU cores.
ITERATIONS = {"small": 8, "large": 3}


def _worker(side: str, shape: dict, iterations: int, warmup: int, devices: int,
            python: str) -> dict:
  script = HERE / f"grpo_{side}_worker.py"
  args = [python, str(script)] + [f"--{k}={v}" for k, v in shape.items()] + [
      f"--iterations={iterations}", f"--warmup={warmup}", f"--devices={devices}"]
  env = dict(os.environ)
  if side == "ours":
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent)] + env.get("PYTHONPATH", "").split(
        os.pathsep)).rstrip(os.pathsep)
  else:
    env.pop("PYTHONPATH", None)  # Tunix's environment sees nothing of ours
  proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1800,
                        check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise RuntimeError(f"{side} worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  return json.loads(lines[-1])


def run(quick: bool = False, *, shapes=None, rounds: int = 3, iterations=None,
        warmup: int = 2, devices: int = 1) -> dict:
  """Measures, prints the table, appends the results line; returns it.

  Args:
    quick: the small shape only, one round of 3 iterations.
    shapes: names in `SHAPES` (default both).
    rounds: interleaved rounds (fresh processes of each side per round).
    iterations: timed iterations per process after `warmup` (default `ITERATIONS[shape]`).
    warmup: iterations left out of the steady-state time (compilation).
    devices: simulated CPU devices of the mesh, both sides.
  """
  load_before = report.load_average()
  shapes = list(shapes or (["small"] if quick else list(SHAPES)))
  if quick:
    rounds, iterations = 1, 2
  pythons = {"ours": sys.executable, "tunix": venvs.python_for("tunix")}
  rows, summary, versions = [], {}, {}
  for name in shapes:
    per_side = {"ours": [], "tunix": []}
    cpu_side = {"ours": [], "tunix": []}
    compile_s = {"ours": [], "tunix": []}
    for r in range(rounds):
      order = ("ours", "tunix") if r % 2 == 0 else ("tunix", "ours")
      for side in order:
        out = _worker(side, SHAPES[name], iterations or ITERATIONS[name], warmup, devices,
                      pythons[side])
        per_side[side].append(statistics.median(out["times"]))
        cpu_side[side].append(statistics.median(out["cpu_times"]))
        compile_s[side].append(out["compile_s"])
        versions.update(out.get("versions", {}))
        print(f"  {name} round {r} {side}: {1 / per_side[side][-1]:.2f} it/s, "
              f"{cpu_side[side][-1]:.3f} CPU-s/it (warm-up {out['compile_s']:.1f} s)", flush=True)
    ratios = [t / o for o, t in zip(per_side["ours"], per_side["tunix"])]
    ratio = statistics.median(ratios)
    cpu_ratios = [t / o for o, t in zip(cpu_side["ours"], cpu_side["tunix"])]
    for side in ("ours", "tunix"):
      rows.append([name, side, f"{1 / statistics.median(per_side[side]):.2f}",
                   " ".join(f"{1 / x:.2f}" for x in per_side[side]),
                   f"{statistics.median(cpu_side[side]):.3f}",
                   f"{statistics.median(compile_s[side]):.1f}",
                   f"{ratio:.2f}x (CPU {statistics.median(cpu_ratios):.2f}x)"
                   if side == "ours" else ""])
    summary[f"ratio_{name}"] = round(ratio, 3)
    summary[f"ratios_{name}"] = [round(x, 3) for x in ratios]
    summary[f"cpu_ratio_{name}"] = round(statistics.median(cpu_ratios), 3)
    summary[f"cpu_ratios_{name}"] = [round(x, 3) for x in cpu_ratios]
  return report.record(
      "grpo_step",
      settings={"shapes": {n: SHAPES[n] for n in shapes}, "rounds": rounds,
                "iterations": iterations or {n: ITERATIONS[n] for n in shapes}, "warmup": warmup, "devices": devices,
                "quick": quick},
      header=["shape", "side", "it/s (median)", "it/s per round", "CPU-s/it (median)",
              "warm-up s (median)", "ours / Tunix (median of rounds)"],
      rows=rows, summary=summary, load_before=load_before, versions=versions)
