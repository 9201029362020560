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
* continuous: `continuous.sample` with `batch` slots over all requests;
* transformers (at `hf_batches`): `generate` of a `transformers` Llama with the same weights
  (made and saved by `hf_generate_worker.py` in its own environment, `requirements-hf.txt`, and
  read into ours by `hf_import`), greedy, over the same chunks of `batch` requests left-padded,
  each row stopped at its drawn length by a per-row stopping criterion: the static batching of
  the library most rollouts are written with. It times itself in its process (one untimed run
  first, then the median of `repeats`), one torch thread, as the sampler benchmark does.

Useful tokens are generated tokens that are not padding (the sum of `lengths`, stop tokens
included). Compilation is excluded (a first run of each side on the same workload); the timed
runs alternate sides and the median is reported. Prefill tokens: the prompt slots each side
computes (its padding included) against the prompts' real tokens.

Conversations (`--workload=conversations`, `run_conversations`): episodes of 4 stages whose
context grows, each stage's prompt the previous prompt + the previous completion + a new
opening of `--opening_min`..`--opening_max` random tokens (a tool result, a user turn);
completion lengths drawn per stage as above and made to stop there the same way (the stop
sequences come from a run without stops of each stage's prompts, done once beforehand, so both
sides see the same conversations). Each side runs the 4 stages in turn, one
`continuous.sample` call per stage over all episodes with `batch` slots:

* re-prefill: `reuse_prefix='never'`, every stage's prompt prefilled whole;
* reuse: each stage's conversations saved (`save_keys=(episode, stage)`) into a fresh
  `prefix_cache.PrefixCache` of `--budget_mib` and the next stage started from them
  (`prefix_keys=(episode, stage - 1)`, `reuse_prefix='same_version'`).

Reported: useful tokens/s over the 4 stages, and prefill tokens per episode (prompt slots
computed, padding included; the real prompt tokens; the tokens taken from saved rows).

Usage:
  python -m benchmarks.continuous_bench --batches=64,256 --requests_per_slot=4
  python -m benchmarks.continuous_bench --workload=conversations --batches=16,64
  python -m benchmarks.run --only continuous,continuous_prefix [--quick]
"""

import collections
import json
import pathlib
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax
import numpy as np

from agentic_grpo.models import continuous
from agentic_grpo.models import prefix_cache
from agentic_grpo.models import presets
from agentic_grpo.models import sampler
from agentic_grpo.models import sampling_rules
from agentic_grpo.models import transformer
from benchmarks import report
from benchmarks import sampler as sampler_benchmark
from benchmarks import venvs


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
  bucket = sampling_rules.prompt_bucket(int(lengths.max()))
  prefill = sum(min(batch, prompts.shape[0] - s) for s in range(0, prompts.shape[0], batch))
  return lengths_out, prefill * bucket


def _continuous(graphdef, params, prompts, lengths, batch, new_tokens, stops):
  out, stats = continuous.sample_with_stats(
      graphdef, params, prompts, lengths, jax.random.key(0), max_new_tokens=new_tokens,
      greedy=True, stop_sequences=stops, slots=batch)
  return np.asarray(jax.block_until_ready(out.lengths)), stats.prefill_tokens


def _hf_long_tail(python: str, d: pathlib.Path, prompts, lengths, drawn, batch: int,
                  new_tokens: int, repeats: int):
  """`transformers` `generate` on the workload: `(lengths generated [n], median wall s,
  versions)`."""
  np.save(d / "lt_prompts.npy", prompts)
  np.save(d / "lt_lengths.npy", lengths)
  np.save(d / "lt_drawn.npy", drawn)
  out = json.loads(sampler_benchmark.hf_worker(python, "longtail", d, f"--batch={batch}",
                              f"--new_tokens={new_tokens}", f"--repeats={repeats}"
                              ).strip().splitlines()[-1])
  return np.load(d / "hf_lengths.npy"), out["wall_s"], out["versions"]


def _timed_sides(calls, repeats: int):
  """Runs each of `calls` (`{side: () -> result}`) once untimed (compilation), then `repeats`
  timed rounds in alternating side order; returns `({side: last result}, {side: median
  seconds})`."""
  names = tuple(calls)
  for call in calls.values():
    call()
  results, timings = {}, {name: [] for name in names}
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      start = time.perf_counter()
      results[name] = calls[name]()
      timings[name].append(time.perf_counter() - start)
  return results, {name: statistics.median(t) for name, t in timings.items()}


def run(quick: bool = False, *, batches=(64, 256), requests_per_slot: int = 4,
        new_tokens: int = 256, prompt_min: int = 16, prompt_max: int = 64, sigma: float = 1.0,
        repeats: int = 3, preset: str = "tiny", hf_batches=(64,)) -> dict:
  """Measures, prints the table, appends the results line; returns it.

  Args:
    quick: batches 8 and 16, 64 new tokens, one repeat.
    batches: static batch = continuous slots.
    requests_per_slot: requests per run = `requests_per_slot * batch`.
    new_tokens: `max_new_tokens`.
    prompt_min, prompt_max: prompt lengths, uniform.
    sigma: log-normal sigma of the completion lengths.
    repeats: timed runs per side (median).
    preset: the random model's shape (`presets.get_model_config`; its own dtype).
    hf_batches: the batches at which `transformers` `generate` runs too (module docstring; its
      environment is built on first use); () for none. Quick runs have none.
  """
  load_before = report.load_average()
  if quick:
    batches, new_tokens, repeats, hf_batches = (8, 16), 64, 1, ()
  hf_batches = tuple(b for b in hf_batches if b in batches)
  config = presets.get_model_config(preset)
  with tempfile.TemporaryDirectory() as tmp:
    python = venvs.python_for("hf") if hf_batches else None
    if hf_batches:
      graphdef, _ = transformer.abstract_model(config)
      params = sampler_benchmark.hf_model_params(python, config, pathlib.Path(tmp))
    else:
      graphdef, params = transformer.init_model(config, jax.random.key(0))
    return _run_long_tail(graphdef, params, config, python, pathlib.Path(tmp), quick=quick,
                          batches=batches, requests_per_slot=requests_per_slot,
                          new_tokens=new_tokens, prompt_min=prompt_min, prompt_max=prompt_max,
                          sigma=sigma, repeats=repeats, preset=preset, hf_batches=hf_batches,
                          load_before=load_before)


def _run_long_tail(graphdef, params, config, python, tmp, *, quick, batches, requests_per_slot,
                   new_tokens, prompt_min, prompt_max, sigma, repeats, preset, hf_batches,
                   load_before) -> dict:
  rows, summary, versions = [], {}, {}
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
    results, wall = _timed_sides(
        {name: lambda fn=fn: fn(graphdef, params, prompts, lengths, batch, new_tokens, stops)
         for name, fn in sides.items()}, repeats)
    names = list(sides)
    if batch in hf_batches:
      hf_lengths, wall["transformers"], v = _hf_long_tail(python, tmp, prompts, lengths, drawn,
                                                          batch, new_tokens, repeats)
      versions.update(v)
      bucket_rows = sum(min(batch, n - s) * int(lengths[s:s + batch].max())
                        for s in range(0, n, batch))
      results["transformers"] = (hf_lengths, bucket_rows)
      names.append("transformers")
    useful = {name: int(results[name][0].sum()) for name in names}
    speed = {name: useful[name] / wall[name] for name in names}
    ratio = speed["continuous"] / speed["static"]
    for name in names:
      rows.append([batch, n, new_tokens, name, f"{useful[name]}", f"{wall[name]:.2f}",
                   f"{speed[name]:.0f}", f"{results[name][1]}", f"{int(lengths.sum())}",
                   f"{np.mean(results[name][0] == drawn):.1%}",
                   f"{ratio:.2f}x" if name == "continuous" else "",
                   f"{speed['continuous'] / speed['transformers']:.2f}x"
                   if name == "continuous" and "transformers" in speed else ""])
    summary[f"ratio_batch{batch}"] = round(ratio, 3)
    if "transformers" in speed:
      summary[f"vs_transformers_batch{batch}"] = round(
          speed["continuous"] / speed["transformers"], 3)
      summary[f"static_vs_transformers_batch{batch}"] = round(
          speed["static"] / speed["transformers"], 3)
    summary[f"mean_length_batch{batch}"] = round(float(drawn.mean()), 1)
  return report.record(
      "continuous",
      settings={"model": f"{preset} preset, random, {jax.numpy.dtype(config.dtype).name}",
                "device": jax.devices()[0].device_kind, "batches": list(batches),
                "requests_per_slot": requests_per_slot, "new_tokens": new_tokens,
                "prompt_lengths": [prompt_min, prompt_max], "sigma": sigma,
                "median_length": new_tokens / 8, "repeats": repeats, "quick": quick,
                "greedy": True, "transformers_batches": list(hf_batches), "torch_threads": 1},
      header=["batch / slots", "requests", "max new", "side", "useful tokens", "wall s",
              "useful tokens/s", "prefill tokens", "prompt tokens", "lengths as drawn",
              "continuous / static", "continuous / transformers"],
      rows=rows, summary=summary, load_before=load_before, versions=versions)


STAGES = 4


def conversations(episodes: int, new_tokens: int, prompt_min: int, prompt_max: int,
                  opening_min: int, opening_max: int, sigma: float, free_run, seed: int = 0):
  """The `STAGES` stages of `episodes` conversations.

  Args:
    free_run: `(prompts [n, W], lengths [n]) -> [n, new_tokens]` greedy completions without
      stops.

  Returns:
    per stage `(prompts [episodes, W_k] int32, lengths [episodes] int32, stops)`, `stops` each
    episode's one stop sequence: its completion's first drawn-length tokens.
  """
  rng = np.random.RandomState(seed)
  prompts, lengths, _ = workload(episodes, new_tokens, prompt_min, prompt_max, sigma, seed)
  stages = []
  for _ in range(STAGES):
    drawn = np.exp(np.log(new_tokens / 8) + sigma * rng.standard_normal(episodes))
    drawn = np.clip(np.round(drawn), 1, new_tokens).astype(np.int32)
    free = np.asarray(free_run(prompts, lengths))
    stops = [[free[e, :drawn[e]].tolist()] for e in range(episodes)]
    stages.append((prompts, lengths, stops))
    conv = [np.concatenate([prompts[e, :lengths[e]], free[e, :drawn[e]],
                            rng.randint(3, 256, rng.randint(opening_min, opening_max + 1))])
            for e in range(episodes)]
    lengths = np.array([c.size for c in conv], np.int32)
    prompts = np.zeros((episodes, int(lengths.max())), np.int32)
    for e, c in enumerate(conv):
      prompts[e, :c.size] = c
  return stages


def _episodes(graphdef, params, stages, batch, new_tokens, budget, reuse):
  """Runs the stages in turn: (completion lengths per stage, summed `continuous.Stats`
  fields)."""
  pool = prefix_cache.PrefixCache(budget) if reuse else None
  out_lengths, totals = [], collections.Counter()
  for k, (prompts, lengths, stops) in enumerate(stages):
    n = prompts.shape[0]
    extra = {}
    if reuse:
      extra = dict(reuse_prefix="same_version", prefix_pool=pool,
                   save_keys=[(e, k) for e in range(n)] if k + 1 < len(stages) else None,
                   prefix_keys=[(e, k - 1) for e in range(n)] if k else None)
    out, stats = continuous.sample_with_stats(
        graphdef, params, prompts, lengths, jax.random.key(0), max_new_tokens=new_tokens,
        greedy=True, stop_sequences=stops, slots=batch, **extra)
    out_lengths.append(np.asarray(jax.block_until_ready(out.lengths)))
    totals.update({f: getattr(stats, f) for f in ("prompt_tokens", "prefill_tokens",
                                                  "reused_tokens", "prefix_hits",
                                                  "prefix_misses", "prefix_mismatches")})
  return out_lengths, totals


def run_conversations(quick: bool = False, *, batches=(16, 64), episodes_per_slot: int = 4,
                      new_tokens: int = 128, prompt_min: int = 16, prompt_max: int = 64,
                      opening_min: int = 8, opening_max: int = 24, sigma: float = 1.0,
                      budget_mib: int = 256, repeats: int = 3, preset: str = "tiny") -> dict:
  """The conversation workload (module docstring): measures, prints the table, appends the
  results line (`continuous_prefix`); returns it.

  Args:
    quick: batch 8, 32 new tokens, one repeat.
    batches: continuous slots.
    episodes_per_slot: episodes = `episodes_per_slot * batch`.
    new_tokens: `max_new_tokens` of every stage.
    prompt_min, prompt_max: first-stage prompt lengths, uniform.
    opening_min, opening_max: new tokens per later stage, uniform.
    sigma: log-normal sigma of the completion lengths.
    budget_mib: the prefix pool's budget.
    repeats: timed runs per side (median).
    preset: the random model's shape (its own dtype; `max_seq_len` at least 4,096).
  """
  load_before = report.load_average()
  if quick:
    batches, new_tokens, repeats = (8,), 32, 1
  # The conversations outgrow the preset's 512 positions; a random model has no trained range.
  config = presets.get_model_config(preset)
  config = presets.get_model_config(preset, max_seq_len=max(4096, config.max_seq_len))
  graphdef, params = transformer.init_model(config, jax.random.key(0))
  budget = budget_mib << 20
  rows, summary = [], {}
  for batch in batches:
    episodes = episodes_per_slot * batch

    def free_run(prompts, lengths, batch=batch):
      return continuous.sample(graphdef, params, prompts, lengths, jax.random.key(0),
                               max_new_tokens=new_tokens, greedy=True, slots=batch).tokens

    stages = conversations(episodes, new_tokens, prompt_min, prompt_max, opening_min,
                           opening_max, sigma, free_run)
    sides = {"re-prefill": False, "reuse": True}
    results, wall = _timed_sides(
        {name: lambda reuse=reuse: _episodes(graphdef, params, stages, batch, new_tokens,
                                             budget, reuse)
         for name, reuse in sides.items()}, repeats)
    useful = {name: int(sum(x.sum() for x in results[name][0])) for name in sides}
    per_episode = {name: results[name][1]["prefill_tokens"] / episodes for name in sides}
    prefill_ratio = per_episode["reuse"] / per_episode["re-prefill"]
    speed_ratio = (useful["reuse"] / wall["reuse"]) / (useful["re-prefill"] / wall["re-prefill"])
    for name in sides:
      totals = results[name][1]
      rows.append([batch, episodes, new_tokens, name, useful[name], f"{wall[name]:.2f}",
                   f"{useful[name] / wall[name]:.0f}", f"{per_episode[name]:.1f}",
                   f"{totals['prompt_tokens'] / episodes:.1f}",
                   f"{totals['reused_tokens'] / episodes:.1f}",
                   f"{totals['prefix_hits']}/{totals['prefix_misses']}/"
                   f"{totals['prefix_mismatches']}",
                   f"{prefill_ratio:.1%} / {speed_ratio:.2f}x" if name == "reuse" else ""])
    summary[f"prefill_ratio_batch{batch}"] = round(prefill_ratio, 3)
    summary[f"speed_ratio_batch{batch}"] = round(speed_ratio, 3)
  return report.record(
      "continuous_prefix",
      settings={"model": f"{preset} preset (max_seq_len {config.max_seq_len}), random, "
                         f"{jax.numpy.dtype(config.dtype).name}",
                "device": jax.devices()[0].device_kind,
                "batches": list(batches), "episodes_per_slot": episodes_per_slot, "stages": STAGES,
                "new_tokens": new_tokens, "prompt_lengths": [prompt_min, prompt_max],
                "opening_lengths": [opening_min, opening_max], "sigma": sigma,
                "budget_mib": budget_mib, "repeats": repeats, "quick": quick, "greedy": True},
      header=["slots", "episodes", "max new", "side", "useful tokens", "wall s",
              "useful tokens/s", "prefill tokens / episode", "prompt tokens / episode",
              "reused tokens / episode", "prefix hits/misses/mismatches",
              "reuse / re-prefill: prefill tokens, useful tokens/s"],
      rows=rows, summary=summary, load_before=load_before)


def main(argv):
  del argv
  if _WORKLOAD.value == "conversations":
    run_conversations(_QUICK.value, batches=tuple(int(b) for b in _BATCHES.value),
                      episodes_per_slot=_PER_SLOT.value, new_tokens=_NEW_TOKENS.value,
                      repeats=_REPEATS.value)
    return
  run(_QUICK.value, batches=tuple(int(b) for b in _BATCHES.value),
      requests_per_slot=_PER_SLOT.value, new_tokens=_NEW_TOKENS.value, repeats=_REPEATS.value)


if __name__ == "__main__":
  # Flags only when run as a program: `benchmarks.run` imports this module and has its own.
  _BATCHES = flags.DEFINE_list("batches", ["64", "256"], "Static batch sizes = slots.")
  _PER_SLOT = flags.DEFINE_integer("requests_per_slot", 4, "Requests (conversations: episodes) per run per slot.")
  _NEW_TOKENS = flags.DEFINE_integer("new_tokens", 256, "max_new_tokens.")
  _REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per side (median).")
  _QUICK = flags.DEFINE_bool("quick", False, "Small shapes, one repeat.")
  _WORKLOAD = flags.DEFINE_enum("workload", "long_tail", ["long_tail", "conversations"],
                                "One request per prompt, or 4-stage conversations.")
  app.run(main)
