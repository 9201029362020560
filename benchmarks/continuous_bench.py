r"""Useful tokens per second on a long-tailed workload: continuous against static batching.

A rollout's completions have a long tail: most are short, a few run to the limit. Here each
request's completion length is drawn from a log-normal with median `max_new_tokens / 8`
(`--sigma`, default 1), capped at `max_new_tokens`. The model is a random one of the `tiny`
preset's shape (float32, CPU by default), decoding greedily, and a request is made to stop at
its drawn length `l` honestly, by the sampler's own stop rule: its stop sequence is its own
greedy completion's first `l` tokens (computed once beforehand by the static sampler without
stops), which its last `l` generated tokens equal first at length `l`. Both sides get the same
requests, prompts (ragged, `--prompt_min`..`--prompt_max` tokens) and stop tables:

* static: `sampler.sample` over consecutive chunks of `batch` requests; each chunk decodes
  until its longest row stops;
* continuous: `continuous.sample` with `batch` slots over all requests.

Useful tokens are generated tokens that are not padding (the sum of `lengths`, stop tokens
included). Compilation is excluded (a first run of each side on the same workload); the timed
runs alternate sides and the median is reported. Prefill tokens: the prompt slots each side
computes (its padding included) against the prompts' real tokens.

Usage:
  python -m benchmarks.continuous_bench --batches=64,256 --requests_per_slot=4
  python -m benchmarks.run --only continuous [--quick]
"""

import statistics
import time

from absl import app
from absl import flags
import jax
import numpy as np

from agentic_grpo.models import continuous
from agentic_grpo.models import sampler
from agentic_grpo.models import transformer
from benchmarks import report


def workload(n: int, max_new_tokens: int, prompt_min: int, prompt_max: int, sigma: float,
             seed: int = 0):
  """Prompts `[n, prompt_max]`, their lengths `[n]`, drawn completion lengths `[n]` in
  `[1, max_new_tokens]` (log-normal, median `max_new_tokens / 8`)."""
  rng = np.random.RandomState(seed)
  lengths = rng.randint(prompt_min, prompt_max + 1, (n,)).astype(np.int32)
  prompts = rng.randint(3, 256, (n, prompt_max)).astype(np.int32)
  prompts[np.arange(prompt_max)[None] >= lengths[:, None]] = 0
  drawn = np.exp(np.log(max_new_tokens / 8) + sigma * rng.standard_normal(n))
  return prompts, lengths, np.clip(np.round(drawn), 1, max_new_tokens).astype(np.int32)


def _static(graphdef, params, prompts, lengths, batch, new_tokens, stops):
  outs = []
  for start in range(0, prompts.shape[0], batch):
    rows = slice(start, start + batch)
    outs.append(sampler.sample(graphdef, params, prompts[rows], lengths[rows],
                               jax.random.key(0), max_new_tokens=new_tokens, greedy=True,
                               stop_sequences=None if stops is None else stops[rows]))
  lengths_out = np.concatenate([np.asarray(jax.block_until_ready(o.lengths)) for o in outs])
  bucket = sampler.prompt_bucket(int(lengths.max()))
  prefill = sum(min(batch, prompts.shape[0] - s) for s in range(0, prompts.shape[0], batch))
  return lengths_out, prefill * bucket


def _continuous(graphdef, params, prompts, lengths, batch, new_tokens, stops):
  out, stats = continuous.sample_with_stats(
      graphdef, params, prompts, lengths, jax.random.key(0), max_new_tokens=new_tokens,
      greedy=True, stop_sequences=stops, slots=batch)
  return np.asarray(jax.block_until_ready(out.lengths)), stats.prefill_tokens


def run(quick: bool = False, *, batches=(64, 256), requests_per_slot: int = 4,
        new_tokens: int = 256, prompt_min: int = 16, prompt_max: int = 64, sigma: float = 1.0,
        repeats: int = 3) -> dict:
  """Measures, prints the table, appends the results line; returns it.

  Args:
    quick: batches 8 and 16, 64 new tokens, one repeat.
    batches: static batch = continuous slots.
    requests_per_slot: requests per run = `requests_per_slot * batch`.
    new_tokens: `max_new_tokens`.
    prompt_min, prompt_max: prompt lengths, uniform.
    sigma: log-normal sigma of the completion lengths.
    repeats: timed runs per side (median).
  """
  load_before = report.load_average()
  if quick:
    batches, new_tokens, repeats = (8, 16), 64, 1
  config = transformer.get_model_config("tiny")
  graphdef, params = transformer.init_model(config, jax.random.key(0))
  rows, summary = [], {}
  for batch in batches:
    n = requests_per_slot * batch
    prompts, lengths, drawn = workload(n, new_tokens, prompt_min, prompt_max, sigma)
    free = np.concatenate([
        np.asarray(sampler.sample(graphdef, params, prompts[s:s + batch], lengths[s:s + batch],
                                  jax.random.key(0), max_new_tokens=new_tokens,
                                  greedy=True).tokens) for s in range(0, n, batch)])
    # Request i's one stop sequence: its own greedy completion's first drawn[i] tokens.
    stops = [[free[i, :length].tolist()] for i, length in enumerate(drawn)]
    sides = {"static": _static, "continuous": _continuous}
    timings = {name: [] for name in sides}
    results = {}
    for name, fn in sides.items():  # warm-up: compilation
      fn(graphdef, params, prompts, lengths, batch, new_tokens, stops)
    for r in range(repeats):
      for name in (("static", "continuous") if r % 2 == 0 else ("continuous", "static")):
        start = time.perf_counter()
        results[name] = sides[name](graphdef, params, prompts, lengths, batch, new_tokens,
                                    stops)
        timings[name].append(time.perf_counter() - start)
    wall = {name: statistics.median(t) for name, t in timings.items()}
    useful = {name: int(results[name][0].sum()) for name in sides}
    speed = {name: useful[name] / wall[name] for name in sides}
    ratio = speed["continuous"] / speed["static"]
    for name in sides:
      rows.append([batch, n, new_tokens, name, f"{useful[name]}", f"{wall[name]:.2f}",
                   f"{speed[name]:.0f}", f"{results[name][1]}", f"{int(lengths.sum())}",
                   f"{np.mean(results[name][0] == drawn):.1%}",
                   f"{ratio:.2f}x" if name == "continuous" else ""])
    summary[f"ratio_batch{batch}"] = round(ratio, 3)
    summary[f"mean_length_batch{batch}"] = round(float(drawn.mean()), 1)
  return report.record(
      "continuous",
      settings={"model": "tiny preset, random, float32", "batches": list(batches),
                "requests_per_slot": requests_per_slot, "new_tokens": new_tokens,
                "prompt_lengths": [prompt_min, prompt_max], "sigma": sigma,
                "median_length": new_tokens / 8, "repeats": repeats, "quick": quick,
                "greedy": True},
      header=["batch / slots", "requests", "max new", "side", "useful tokens", "wall s",
              "useful tokens/s", "prefill tokens", "prompt tokens", "lengths as drawn",
              "continuous / static"],
      rows=rows, summary=summary, load_before=load_before)


def main(argv):
  del argv
  run(_QUICK.value, batches=tuple(int(b) for b in _BATCHES.value),
      requests_per_slot=_PER_SLOT.value, new_tokens=_NEW_TOKENS.value, repeats=_REPEATS.value)


if __name__ == "__main__":
  # Flags only when run as a program: `benchmarks.run` imports this module and has its own.
  _BATCHES = flags.DEFINE_list("batches", ["64", "256"], "Static batch sizes = slots.")
  _PER_SLOT = flags.DEFINE_integer("requests_per_slot", 4, "Requests per run per slot.")
  _NEW_TOKENS = flags.DEFINE_integer("new_tokens", 256, "max_new_tokens.")
  _REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per side (median).")
  _QUICK = flags.DEFINE_bool("quick", False, "Small shapes, one repeat.")
  app.run(main)
