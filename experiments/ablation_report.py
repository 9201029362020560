"""`results.md` and `curves.png` of an ablation root (`experiments/ablation.py`).

Everything is read from each run's `metrics.jsonl`:

* final held-out pass@1: the run's last `eval/pass_at_1`; mean ± standard error over seeds;
* gain against the warm-start: per seed, the arm's final pass@1 minus its warm-start's (the
  same held-out tasks), mean ± s.e. over seeds: what RL added at all;
* gain against outcome GRPO: per seed, the arm's final pass@1 minus outcome GRPO's with the
  same seed (same warm-start, same held-out tasks), mean ± s.e. over seeds;
* rollouts (episodes sampled: tasks drawn, `loop/data_position`, times G; the stage arms
  update on episodes still running, so completed episodes would undercount them) and RL
  seconds until a held-out evaluation first reaches outcome GRPO's final pass@1 (its mean over
  seeds), mean over the seeds that reach it;
* gradient-norm variance (`loss/grad_norm` over the RL updates), clip fraction
  (`loss/clip_fraction`), KL to the behaviour policy (`loss/approx_kl`), means over updates;
* sign reversals: the share of provisional stage advantages whose target advantage has the
  other sign (`replay/total_sign_reversals / replay/total_provisional_items`; 0 items: n/a);
* second table: RL updates, and the held-out stage pass rate (the mean over stages of
  `eval/stage_pass/<stage>`, greedy: the share of stages that pass all their checks, the
  stage reward the arms are trained on with `reward_mode='all_pass'`; for long_horizon the
  share of pieces that pass all their own examples) at the warm-start and at the end, with its
  paired gain, and the mean fraction of the checks passed (`eval/reward/<stage>`), which also
  counts partial passes. Rows written before `eval/stage_pass` existed have the fraction only
  (n/a in the pass column);
* learner idle fraction: the share of the RL loop's wall-clock spent in the agent loop
  (sampling, waiting for the sandbox) rather than dispatching updates
  (`loop/learner_idle_fraction`, mean over log intervals).

Only finished runs (those with `done.json`) are reported: a partial curve would skew the means.
RL seconds count from the end of the warm-start; `seconds` restarts when a run resumes, so the
time of a resumed run is stitched from its segments.
"""

import json
import math
import os
from typing import Any, Optional, Sequence

import numpy as np

OUTCOME = "outcome"
DONE = "done.json"  # a finished run's marker (written by experiments/ablation.py)


def load_run(path: str) -> Optional[dict[str, Any]]:
  """One run's curves and statistics from `path/metrics.jsonl`; None if it has no RL eval."""
  f = os.path.join(path, "metrics.jsonl")
  if not os.path.exists(f):
    return None
  with open(f) as fh:
    rows = [json.loads(line) for line in fh if line.strip()]
  offset, last, stitched = 0.0, 0.0, []
  for r in rows:  # `seconds` restarts from 0 in a resumed run
    s = float(r.get("seconds", last - offset))
    if s + offset < last:
      offset = last
    last = s + offset
    stitched.append(last)
  evals = [(r, t) for r, t in zip(rows, stitched) if "eval/pass_at_1" in r]
  warm = [(r, t) for r, t in evals if r.get("phase") == "warmstart"]
  rl = [(r, t) for r, t in evals if r.get("phase") == "rl"]
  if not rl:
    return None
  t0 = warm[-1][1] if warm else 0.0
  group = _group_size(path)
  curve = ([(0.0, 0.0, warm[-1][0]["eval/pass_at_1"])] if warm else []) + [
      (_rollouts(r, group), t - t0, float(r["eval/pass_at_1"])) for r, t in rl]
  upd = [r for r in rows if r.get("phase") == "rl"]
  col = lambda k: [float(r[k]) for r in upd if k in r and math.isfinite(float(r[k]))]
  last_rl = upd[-1]
  # Provisional items that reached the learner: superseded ones (`correction.supersede_queued`)
  # never did, and cannot reverse.
  items = (float(last_rl.get("replay/total_provisional_items", 0.0))
           - float(last_rl.get("replay/total_superseded_provisional_items", 0.0)))
  return {
      "curve": curve,
      "final": curve[-1][2],
      "warm": curve[0][2] if warm else math.nan,
      # Rows that carry an update's loss: an evaluation row of its own is not an update.
      "updates": len({r["step"] for r in upd if "loss/grad_norm" in r}),
      "stage_warm": _stage_rate(warm[-1][0]) if warm else math.nan,
      "stage_final": _stage_rate(rl[-1][0]),
      "fraction_warm": _stage_rate(warm[-1][0], "eval/reward/") if warm else math.nan,
      "fraction_final": _stage_rate(rl[-1][0], "eval/reward/"),
      "grad_norm_var": float(np.var(col("loss/grad_norm"))) if col("loss/grad_norm") else math.nan,
      "clip_fraction": _mean(col("loss/clip_fraction")),
      "kl": _mean(col("loss/approx_kl")),
      "idle": _mean(col("loop/learner_idle_fraction")),
      "sign_reversal_share": (float(last_rl.get("replay/total_sign_reversals", 0.0)) / items
                              if items else math.nan),
  }


def _group_size(path: str) -> Optional[int]:
  """`rl.group_size` of the run's `config.json`, or None without one."""
  try:
    with open(os.path.join(path, "config.json")) as f:
      return int(json.load(f)["rl"]["group_size"])
  except (OSError, KeyError, ValueError):
    return None


def _rollouts(row: dict[str, Any], group: Optional[int]) -> float:
  """Episodes sampled by this row: tasks drawn (`loop/data_position`) x G. Completed episodes
  (`loop/episodes`) would undercount the stage arms, which update on episodes still running."""
  if group is not None and "loop/data_position" in row:
    return float(row["loop/data_position"]) * group
  return float(row.get("loop/episodes", 0.0))


def _stage_rate(row: dict[str, Any], prefix: str = "eval/stage_pass/") -> float:
  """Mean over stages of one evaluation row's `prefix<stage>` values, nan if none: the share
  of stages that pass all their checks (`eval/stage_pass/`), or with `prefix='eval/reward/'`
  the mean fraction of the checks passed."""
  xs = [float(v) for k, v in row.items() if k.startswith(prefix)]
  return float(np.mean(xs)) if xs else math.nan


def _mean(xs: Sequence[float]) -> float:
  return float(np.mean(xs)) if len(xs) else math.nan


def _mean_se(xs: Sequence[float]) -> str:
  xs = [x for x in xs if not math.isnan(x)]
  if not xs:
    return "n/a"
  if len(xs) == 1:
    return f"{xs[0]:.3f}"
  return f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1) / math.sqrt(len(xs)):.3f}"


def _signed_mean_se(xs: Sequence[float]) -> str:
  text = _mean_se(xs)
  return text if text == "n/a" or text.startswith("-") else "+" + text


def _reach(curve, target: float) -> tuple[Optional[float], Optional[float]]:
  """(episodes, seconds) of the first evaluation at or above `target`, or (None, None)."""
  for episodes, seconds, p in curve:
    if p >= target - 1e-12:
      return episodes, seconds
  return None, None


def _fmt(x: float, spec: str = ".3f") -> str:
  return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(runs: dict[str, dict[int, dict[str, Any]]], arms: Sequence[str]) -> list[str]:
  """Markdown table lines of one task: `runs[arm][seed]` from `load_run`."""
  out = ["| arm | seeds | final pass@1 | gain vs warm-start (paired) | gain vs outcome (paired "
         "by seed) | rollouts to outcome's final | RL seconds to outcome's final | grad-norm var "
         "| clip frac | KL to behaviour | sign-reversal share | learner idle |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  base = runs.get(OUTCOME, {})
  target = float(np.mean([r["final"] for r in base.values()])) if base else None
  for arm in arms:
    rs = runs.get(arm, {})
    if not rs:
      out.append(f"| {arm} | 0 |" + " n/a |" * 10)
      continue
    gains = [r["final"] - base[s]["final"] for s, r in rs.items() if s in base]
    reach = [_reach(r["curve"], target) for r in rs.values()] if target is not None else []
    hit = [x for x in reach if x[0] is not None]
    reach_text = (f"{np.mean([e for e, _ in hit]):.0f} ({len(hit)}/{len(rs)} seeds)",
                  f"{np.mean([t for _, t in hit]):.0f} ({len(hit)}/{len(rs)} seeds)"
                  ) if hit else ("not reached", "not reached")
    stat = lambda k: _fmt(_mean([r[k] for r in rs.values() if not math.isnan(r[k])]))
    out.append(" | ".join([
        f"| {arm}", str(len(rs)), _mean_se([r["final"] for r in rs.values()]),
        _signed_mean_se([r["final"] - r["warm"] for r in rs.values()]),
        "—" if arm == OUTCOME else _signed_mean_se(gains), *reach_text,
        _fmt(_mean([r["grad_norm_var"] for r in rs.values()]), ".3g"), stat("clip_fraction"),
        stat("kl"), stat("sign_reversal_share"), stat("idle")]) + " |")
  return out


def _start_note(runs: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
  """The warm-start's pass@1 (every arm's start), and a warning when outcome GRPO ends at or
  below it (then every arm "reaches" outcome's final at 0 rollouts)."""
  warm = [r["warm"] for rs in runs.values() for r in rs.values() if not math.isnan(r["warm"])]
  if not warm:
    return []
  out = [f"Warm-start (every arm's start): held-out pass@1 {np.mean(warm):.3f}."]
  base = [r["final"] for r in runs.get(OUTCOME, {}).values()]
  if base and np.mean(base) <= np.mean(warm) + 1e-12:
    out[0] += (" Outcome GRPO ends at or below it, so every arm reaches outcome's final at 0 "
               "rollouts: compare the final pass@1 and the gains instead.")
  return out + [""]


def stage_table(runs: dict[str, dict[int, dict[str, Any]]], arms: Sequence[str]) -> list[str]:
  """Markdown lines of the second table of a task: RL updates and the held-out stage checks
  (the mean over stages of the greedy stage pass share, and of the fraction of checks passed),
  before and after RL, paired by seed."""
  out = ["| arm | RL updates (mean) | stage pass share: warm-start → end | gain vs outcome "
         "(paired by seed) | fraction of checks passed: warm-start → end |",
         "|---|---|---|---|---|"]
  base = runs.get(OUTCOME, {})
  for arm in arms:
    rs = runs.get(arm, {})
    if not rs:
      out.append(f"| {arm} | n/a | n/a | n/a | n/a |")
      continue
    gains = [r["stage_final"] - base[s]["stage_final"] for s, r in rs.items() if s in base]
    out.append(" | ".join([
        f"| {arm}", f"{_mean([r['updates'] for r in rs.values()]):.0f}",
        f"{_fmt(_mean([r['stage_warm'] for r in rs.values()]))} → "
        f"{_mean_se([r['stage_final'] for r in rs.values()])}",
        "—" if arm == OUTCOME else _signed_mean_se(gains),
        f"{_fmt(_mean([r['fraction_warm'] for r in rs.values()]))} → "
        f"{_mean_se([r['fraction_final'] for r in rs.values()])}"]) + " |")
  return out


def plot(all_runs: dict[str, dict[str, dict[int, dict[str, Any]]]], arms: Sequence[str],
         path: str) -> None:
  """`curves.png`: per task, pass@1 against episodes and against RL seconds (seed band)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  tasks = list(all_runs)
  if not tasks:
    return  # nothing to plot (and no empty figure left behind)
  fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.8 * len(tasks)), squeeze=False)
  for row, task in enumerate(tasks):
    for col, (xi, label) in enumerate(((0, "episodes sampled"), (1, "RL seconds"))):
      ax = axes[row][col]
      for arm in arms:
        curves = [r["curve"] for r in all_runs[task].get(arm, {}).values()]
        if not curves:
          continue
        end = min(c[-1][xi] for c in curves)
        grid = np.linspace(0.0, end, 50) if end > 0 else np.zeros(1)
        ys = np.array([np.interp(grid, [p[xi] for p in c], [p[2] for p in c]) for c in curves])
        line, = ax.plot(grid, ys.mean(0), label=arm)
        ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
      ax.set_xlabel(label)
      ax.set_ylabel("held-out pass@1")
      ax.set_title(f"{task}")
      ax.legend(loc="lower right", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write(root: str, tasks: Sequence[str], arms: Sequence[str], seeds: Sequence[int]) -> str:
  """Writes `root/results.md` and `root/curves.png` from the runs found; returns the markdown."""
  all_runs: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
  for task in tasks:
    all_runs[task] = {}
    for arm in arms:
      for seed in seeds:
        run_dir = os.path.join(root, task, arm, f"seed{seed}")
        if not os.path.exists(os.path.join(run_dir, DONE)):
          continue  # not finished: a partial curve would skew the means
        r = load_run(run_dir)
        if r is not None:
          all_runs[task].setdefault(arm, {})[seed] = r
  lines = ["# Ablation: outcome GRPO, post-hoc stage credit, Agentic GRPO without and with "
           "corrections", "",
           "Held-out greedy pass@1 (all hidden tests), equal training episodes per run. "
           "Columns: see `experiments/ablation_report.py`.", ""]
  for task in tasks:
    lines += [f"## {task}", ""] + _start_note(all_runs[task]) + table(all_runs[task], arms) + [
        ""] + [
        "Updates and held-out stage checks (greedy, mean over the stages: the share of stages "
        "that pass all their checks, the reward the arms are trained on; for long_horizon, the "
        "share of pieces that pass all their own examples; and the mean fraction of the checks "
        "passed, which also counts partial passes):", ""] + stage_table(
            all_runs[task], arms) + [""]
  text = "\n".join(lines)
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "results.md"), "w") as f:
    f.write(text)
  plot(all_runs, arms, os.path.join(root, "curves.png"))
  return text
