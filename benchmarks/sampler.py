r"""Generated tokens per second: our sampler against `transformers` `generate`, batch 16 and 64.

What `sampler_bench.py` measures, with `transformers` in its own environment
(`requirements-hf.txt`, built on first use) so that this process needs no torch: the random
Llama of the `tiny` preset's shape is made and saved by `hf_generate_worker.py`, read by
`hf_import.load_hf_checkpoint` (identical weights), and both sides decode greedily the same
prompts for the same number of new tokens (no stop token), float32. Rounds alternate which side
goes first; within a round each side reports the median of `repeats` timed runs after a warm-up
(compilation excluded). The headline per batch is the median of the per-round wall-time ratios.
`transformers` runs with one torch thread, its faster setting on a shared 2-core machine.

Usage:
  python -m benchmarks.run --only sampler [--quick]
"""

import dataclasses
import json
import pathlib
import statistics
import subprocess
import tempfile
import time

import jax
import numpy as np

from agentic_grpo.models import hf_import
from agentic_grpo.models import presets
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer
from benchmarks import report
from benchmarks import venvs

HERE = pathlib.Path(__file__).resolve().parent
# (batch, prompt tokens, new tokens)
CASES = ((16, 64, 128), (64, 128, 64))


def hf_worker(python: str, *args) -> str:
  """Runs `hf_generate_worker.py ARGS` with the `hf` environment's `python`; its stdout.

  Raises:
    RuntimeError: the worker failed (its stderr's tail in the message).
  """
  proc = subprocess.run([python, str(HERE / "hf_generate_worker.py"), *map(str, args)],
                        capture_output=True, text=True, timeout=3600, check=False)
  if proc.returncode:
    raise RuntimeError(f"hf_generate_worker failed (exit {proc.returncode}):\n"
                       f"{proc.stderr[-4000:]}")
  return proc.stdout


def hf_model_params(python: str, config, d: pathlib.Path):
  """Our `params` of a random `transformers` Llama of `config`'s shape, made by the worker and
  saved in `d` (`save_pretrained`), read back with `hf_import`: both sides run one model."""
  fields = {k: v for k, v in dataclasses.asdict(config).items()
            if isinstance(v, (int, float, bool, str))}
  hf_worker(python, "make", d, f"--config={json.dumps(fields)}")
  return hf_import.load_hf_checkpoint(d)[1]


def _ours(graphdef, params, prompts, new_tokens, repeats) -> dict:
  lengths = np.full((prompts.shape[0],), prompts.shape[1], np.int32)

  def once():
    out = sampler.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                         max_new_tokens=new_tokens, greedy=True)
    return np.asarray(jax.block_until_ready(out.tokens))

  start = time.perf_counter()
  once()
  warm = time.perf_counter() - start
  wall, cpu = [], []
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    tokens = once()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu), "warm_s": warm,
          "tokens": tokens}


def run(quick: bool = False, *, rounds: int = 3, repeats: int = 3, cases=CASES) -> dict:
  """Measures, prints the table, appends the results line; returns it.

  Args:
    quick: 16 new tokens and 16-token prompts, one round of one repeat.
    rounds: interleaved rounds.
    repeats: timed runs per side per round (median).
    cases: `(batch, prompt tokens, new tokens)` triples.
  """
  load_before = report.load_average()
  if quick:
    rounds, repeats = 1, 1
    cases = tuple((b, 16, 16) for b, _, _ in cases)
  python = venvs.python_for("hf")
  config = presets.get_model_config("tiny")
  rows, summary, versions = [], {}, {}
  with tempfile.TemporaryDirectory() as tmp:
    d = pathlib.Path(tmp)
    params = hf_model_params(python, config, d)
    graphdef, _ = transformer.abstract_model(config)
    for batch, prompt_len, new_tokens in cases:
      prompts = np.random.RandomState(1).randint(0, 256, (batch, prompt_len)).astype(np.int32)
      np.save(d / "prompts.npy", prompts)
      ours, theirs, ratios = [], [], []
      for r in range(rounds):
        for side in (("ours", "hf") if r % 2 == 0 else ("hf", "ours")):
          if side == "ours":
            ours.append(_ours(graphdef, params, prompts, new_tokens, repeats))
          else:
            out = json.loads(hf_worker(python, "time", d, f"--new_tokens={new_tokens}",
                                 f"--repeats={repeats}").strip().splitlines()[-1])
            versions.update(out.pop("versions"))
            out["tokens"] = np.load(d / "hf_tokens.npy")
            theirs.append(out)
        ratios.append(theirs[-1]["wall_s"] / ours[-1]["wall_s"])
      agree = float(np.mean(ours[-1]["tokens"] == theirs[-1]["tokens"]))
      generated = batch * new_tokens
      ratio = statistics.median(ratios)
      cpu_ratio = statistics.median(t["cpu_s"] / o["cpu_s"] for o, t in zip(ours, theirs))
      for name, runs in (("ours", ours), ("transformers", theirs)):
        rows.append([batch, prompt_len, new_tokens, name,
                     f"{generated / statistics.median(x['wall_s'] for x in runs):.0f}",
                     f"{generated / statistics.median(x['cpu_s'] for x in runs):.0f}",
                     f"{statistics.median(x['warm_s'] for x in runs):.2f}",
                     f"{ratio:.2f}x (CPU {cpu_ratio:.2f}x)" if name == "ours" else "",
                     f"{agree:.1%}" if name == "ours" else ""])
      summary[f"ratio_batch{batch}"] = round(ratio, 3)
      summary[f"ratios_batch{batch}"] = [round(x, 3) for x in ratios]
      summary[f"cpu_ratio_batch{batch}"] = round(cpu_ratio, 3)
  return report.record(
      "sampler",
      settings={"model": "tiny-shaped Llama, float32", "cases": [list(c) for c in cases],
                "rounds": rounds, "repeats": repeats, "torch_threads": 1, "quick": quick},
      header=["batch", "prompt", "new tokens", "side", "tokens/s wall", "tokens/CPU-s",
              "first call s", "ours / transformers (median of rounds)", "greedy tokens equal"],
      rows=rows, summary=summary, load_before=load_before, versions=versions)
