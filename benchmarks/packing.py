r"""The update step on realistic batches, rows one per item against shared-prefix packing.

The batches are the default run's (`experiments/tiny_codegen.py`: the tiny model, G = 8,
`rl.rows_per_update` = 64, `rl.buckets` = (128, 192)): the replay (`replay.StagedReplay`, as
`train.session` builds it) is fed 8 groups of synthetic tasks, each member's rows the task's
own prompt (the embedded task generator, tokenised as the agent loop does) followed by
generated stage outputs of realistic lengths (the reference episode's, longer by up to 20
tokens for code, random tokens: only lengths and sharing matter here); stage rewards and final
rewards are random, so every row has a non-zero advantage. Per update kind (the stage-0
provisional update, the stage-1 provisional update, the correction update) the same items are
taken with and without `rl.pack_prefix` and each batch's update step is timed: rounds
alternate the two layouts, the first `warmup` steps of each (compilation) are reported apart,
and the median of the rest is its time; wall and process CPU time (all threads) both.

Usage:
  python -m benchmarks.run --only packing [--quick]
"""

import dataclasses
import statistics
import time

import numpy as np

from benchmarks import report

KINDS = ("stage0_provisional", "stage1_provisional", "correction")


def _config():
  from agentic_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from experiments import tiny_codegen  # pylint: disable=g-import-not-at-top
  return config_lib.from_config_dict(tiny_codegen.get_config())


def batches(cfg, seed: int = 0):
  """`{kind: (plain Batch, packed Batch)}` of the same items (module docstring)."""
  # pylint: disable=g-import-not-at-top
  from agentic_grpo import replay as replay_lib
  from agentic_grpo.agent import references
  from agentic_grpo.core import losses as losses_lib
  from agentic_grpo.replay import batching
  from agentic_grpo.train import components
  # pylint: enable=g-import-not-at-top
  comp = components.build(cfg)
  wf = comp.workflow_factory()
  tok = comp.tokenizer
  g, n_tasks = cfg.rl.group_size, cfg.rl.rows_per_update // cfg.rl.group_size
  packing = batching.PrefixPacking(cfg.rl.packed_lengths())
  tasks = [comp.tasks.task("train", t) for t in range(n_tasks)]
  segments = [references.reference_segments(wf, task)[:2] for task in tasks]
  out = {}
  for packed in (False, True):
    replay = replay_lib.StagedReplay(
        group_size=g, num_stages=2, scale=cfg.correction.scale,
        pack_corrections=losses_lib.segments_additive(cfg.loss.ratio_level,
                                                      cfg.loss.aggregation),
        prefix_packing=packing if packed else None)
    rng = np.random.default_rng(seed)  # the same rows for both layouts
    rows = {}
    for t in range(n_tasks):
      eps = list(range(t * g, (t + 1) * g))
      replay.add_group(t, eps)
      rows.update({e: np.zeros((0,), np.int32) for e in eps})
    taken = {}
    for k in range(2):
      for t in range(n_tasks):
        seg = segments[t][k]
        eps = list(range(t * g, (t + 1) * g))
        opening = np.asarray(tok.encode(seg.opening), np.int32)
        ref_len = len(tok.encode(seg.output))
        toks, masks, blps = [], [], []
        for e in eps:
          extra = int(rng.integers(-2, 5)) if k == 0 else int(rng.integers(0, 21))
          n = int(np.clip(ref_len + extra, 1, cfg.workflow.max_new_tokens))
          gen = rng.integers(0, 256, n).astype(np.int32)
          row = np.concatenate([rows[e], opening, gen]).astype(np.int32)
          mask = np.zeros(row.shape, bool)
          mask[-n:] = True
          rows[e] = row
          toks.append(row)
          masks.append(mask)
          blps.append(np.where(mask, -1.0, 0.0).astype(np.float32))
        replay.add_stage(eps, k, toks, masks, blps, 0, rng.random(g))
      taken[KINDS[k]] = _take(replay, cfg)
    for t in range(n_tasks):
      replay.finish(list(range(t * g, (t + 1) * g)), rng.random(g))
    taken["correction"] = _take(replay, cfg)
    for kind, batch in taken.items():
      out.setdefault(kind, [None, None])[int(packed)] = batch
  return {k: tuple(v) for k, v in out.items()}


def _take(replay, cfg):
  """The oldest items of one update (and no more): the kind's batch."""
  batch = replay.take(cfg.rl.rows_per_update, 0, cfg.rl.buckets)
  while replay.num_ready:  # items of another length bucket: not this benchmark's
    replay.take(cfg.rl.rows_per_update, 0, cfg.rl.buckets)
  return batch


def _time_steps(step, state, batch, ref, n):
  import jax  # pylint: disable=g-import-not-at-top
  wall, cpu = [], []
  for _ in range(n):
    t0, c0 = time.perf_counter(), time.process_time()
    state, metrics = step(state, batch, ref)
    jax.block_until_ready((state.params, metrics))
    wall.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  return state, wall, cpu


def run(quick: bool = False, *, rounds: int = 5, steps: int = 3, warmup: int = 1) -> dict:
  """Measures, prints the table, appends the results line; returns it."""
  import jax  # pylint: disable=g-import-not-at-top
  from agentic_grpo import learner  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import presets  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import transformer  # pylint: disable=g-import-not-at-top
  load_before = report.load_average()
  if quick:
    rounds, steps = 2, 2
  cfg = _config()
  cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, kl_beta=0.0))
  got = batches(cfg)
  graphdef, params = transformer.init_model(
      presets.get_model_config(cfg.model.preset), 0)
  opt = learner.make_optimizer(cfg.optim)
  step = learner.make_update_step(graphdef, cfg, opt)
  rows, summary = [], {}
  for kind in KINDS:
    plain, packed = got[kind]
    times = {"plain": ([], []), "packed": ([], [])}
    compile_s = {}
    states = {}
    for name, batch in (("plain", plain), ("packed", packed)):
      state = learner.init_state(jax.tree.map(np.copy, params), opt, 0)
      t0 = time.perf_counter()
      state, _, _ = _time_steps(step, state, batch.update, None, warmup)
      compile_s[name] = time.perf_counter() - t0
      states[name] = state
    for r in range(rounds):
      order = ("plain", "packed") if r % 2 == 0 else ("packed", "plain")
      for name in order:
        batch = plain if name == "plain" else packed
        states[name], wall, cpu = _time_steps(step, states[name], batch.update, None, steps)
        times[name][0].extend(wall)
        times[name][1].extend(cpu)
    med = {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in times.items()}
    for name, batch in (("plain", plain), ("packed", packed)):
      u = batch.update
      rows.append([kind, name, f"{u.tokens.shape[0]}x{u.tokens.shape[1]}",
                   int(u.loss_mask.size), batch.stats.get("items", batch.stats["rows"]),
                   int(u.loss_mask.sum()), f"{1e3 * med[name][0]:.0f}",
                   f"{1e3 * med[name][1]:.0f}", f"{compile_s[name]:.1f}",
                   f"{med['plain'][0] / med['packed'][0]:.2f}x "
                   f"(CPU {med['plain'][1] / med['packed'][1]:.2f}x)" if name == "packed"
                   else ""])
    summary[kind] = {
        "plain_shape": list(plain.update.tokens.shape),
        "packed_shape": list(packed.update.tokens.shape),
        "plain_ms": round(1e3 * med["plain"][0], 1), "packed_ms": round(1e3 * med["packed"][0], 1),
        "plain_cpu_ms": round(1e3 * med["plain"][1], 1),
        "packed_cpu_ms": round(1e3 * med["packed"][1], 1),
        "speedup": round(med["plain"][0] / med["packed"][0], 2),
        "cpu_speedup": round(med["plain"][1] / med["packed"][1], 2)}
    print(f"  {kind}: {summary[kind]}", flush=True)
  return report.record(
      "packing",
      settings={"quick": quick, "rounds": rounds, "steps": steps, "warmup": warmup,
                "rows_per_update": cfg.rl.rows_per_update, "buckets": list(cfg.rl.buckets),
                "packed_lengths": {str(k): v for k, v in cfg.rl.packed_lengths().items()}},
      header=["update", "layout", "batch", "token slots", "items", "loss tokens",
              "ms/step (median)", "CPU-ms/step", "warm-up s", "plain / packed"],
      rows=rows, summary=summary, load_before=load_before)
