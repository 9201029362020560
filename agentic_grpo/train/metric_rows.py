"""The rows of a run's metrics: every key, and the math that makes the rows.

`rl_row` assembles the RL row from every process's numbers, `pipeline_times` and
`pipeline_shapes` its `pipeline/...` keys, `run_summary` and `summary_line` the headline
numbers of a finished run (printed by `launch/train.py`). `train/metrics.py` writes the rows.

Every key of a row goes to `metrics.jsonl` and, as the same tag, to TensorBoard. Keys of RL rows
(`phase="rl"`, one row every `log.every` updates; "since the last row" below), besides the
`pipeline/...` keys further down:

* `reward/<stage>` (each workflow stage by name, e.g. `reward/hypothesis`, `reward/code`) and
  `reward/final`: the mean sampled reward on the training stream of the episode batches whose
  stage (or whose final reward) was harvested since the last row (a stage's mean over its
  scored members; 0 for a batch where none was scored); `train/pass_rate`: the share of those
  episodes whose final reward is >= 1. A key is absent from a row in which no batch reached
  that stage; `parsed/<stage>`: the share of outputs that parsed.
* `signal/tied_groups_<stage>` and `signal/tied_groups_final`: of the same batches, the share
  of groups whose rewards (that stage's, among its scored members, or the final ones) are all
  equal (`core.advantages.tied_groups`): groups whose group-relative advantage is 0 for every
  member, i.e. no learning signal (before any `correction.baseline`). The final row adds
  `signal/tied_groups_final_phase`, the share over every group the RL phase finished
  (`loop/tied_groups_final` over `loop/episodes / G`).
* `loss/<metric>`: the mean over the updates since the last row of the update step's metrics
  (`learner.make_update_step`): `loss/loss`, `loss/pg_loss`, `loss/kl`, `loss/clip_fraction`,
  ..., and `loss/entropy`, the token-level entropy (nats) of the sampling distribution (at
  `rl.temperature`, with `rl.top_k` / `rl.top_p`) at the update's loss tokens, aggregated like
  the policy loss (`loss.entropy_coef` > 0 adds it to the objective as a bonus).
* `replay/...` (per update, averaged, and running totals `replay/total_...`), `counts/...`
  and `loop/...` (running counters, summed over processes; `loop/episodes`: finished training
  episodes), `tokens_per_s`, `seconds` (since the run started).
* `final/latency_versions`, `final/latency_s` and `final/wait_s`: of the final rewards fed to
  the replay since the last row (`agent.loop`: `rl.final_reward_lag` harvests after the last
  stage), the mean policy versions from the last stage's sampling to the final reward in the
  replay (all processes), and on process 0's clock the mean seconds from the last stage
  scored to it and the seconds the loop waited for a judge that was due but not done;
  `final/latency_versions_mean`, `final/latency_versions_p95`, `final/latency_s_mean` and
  `final/latency_s_p95`: the same latencies over the run so far (the latest 4,096 batches per
  process; the seconds since the process started or resumed; processes' means averaged, their
  p95 the highest).
* `rl/episodes_per_s`: training episodes finished since the last row per wall second of the
  interval (evaluation excluded, all processes); the final row adds `rl/seconds` (the RL
  phase's wall seconds so far, evaluation excluded, over resumes) and
  `rl/episodes_per_s_phase` (`loop/episodes / rl/seconds`). Wall-clock numbers, like
  `seconds`, `tokens_per_s` and `pipeline/wall_seconds`: they differ between runs.
* `eval/...` when the row evaluates (every `eval.every` updates and the final row,
  `train.evaluation.evaluate`), greedy on the held-out tasks; per stage `eval/reward/<stage>`
  (scored as fractions: the mean fraction of the stage's checks passed) and
  `eval/stage_pass/<stage>` (the share of episodes whose stage passed all its checks, the
  reward of `workflow.reward_mode='all_pass'`, `evaluation.stage_metrics`); with samples (the warm-start's last row and the final row) also
  `eval/pass_at_<k>_sampled` and the headroom: `headroom/heldout_pass_at_1` and
  `headroom/heldout_pass_at_G` (G = `rl.group_size` attempts per held-out task at
  `rl.temperature`: the expected reward of one attempt and the share of tasks whose group holds
  a pass; `eval.headroom_tasks`), `headroom/train_pass_at_1` and `headroom/train_pass_at_G` (the
  same on training tasks, `eval.headroom_train_tasks`).

The `pipeline/...` keys of an RL row (`rl_row`, `pipeline_times`) describe the interval since
the previous row:

* wall-clock shares (host-side timers of `train.rl_phase`; they differ between runs):
  `pipeline/wall_seconds` (the interval, evaluation excluded), `pipeline/learner_busy_fraction`
  (taking batches, dispatching updates, and waiting for them: before sampling with the new
  parameters and when reading their metrics), `pipeline/sampler_busy_fraction` (the sampler),
  `pipeline/sandbox_busy_fraction` (harvesting sandbox jobs: waiting for them and feeding the
  replay), and `pipeline/learner_idle_fraction` (1 - the learner's share);
* update shapes (deterministic, part of the exact-resume history): each update is of the kind
  (`provisional`, `correction`, `final` = outcome-only target) most of its rows are; per kind
  `pipeline/updates_<kind>`, `pipeline/rows_<kind>` (real rows), `pipeline/row_slots_<kind>`
  (rows of the compiled batch), `pipeline/row_padding_<kind>` (`1 - rows / row_slots`),
  `pipeline/loss_tokens_<kind>`, `pipeline/token_slots_<kind>` and `pipeline/token_padding_<kind>`
  (`1 - loss_tokens / token_slots`: context tokens count too, as in `replay/padding_fraction`);
  over all updates `pipeline/row_padding_fraction`.
"""
import collections
from typing import Any, Sequence

import numpy as np

# Running totals of the replay, logged as `replay/total_<name>`.
REPLAY_TOTALS = ("stale_dropped_segments", "stale_downweighted_segments", "corrections",
                 "sign_reversals", "evicted_segments", "provisional_items", "correction_items",
                 "superseded_provisional_items")


def mean_rows(rows: Sequence[dict[str, float]]) -> dict[str, float]:
  """Per key, the mean of the rows that have it (keys in order of first appearance)."""
  return {k: float(np.mean(v)) for k, v in values_by_key(rows).items()}


def values_by_key(rows: Sequence[dict[str, float]]) -> dict[str, list[float]]:
  """Per key, the values of the rows that have it, in row order."""
  acc = collections.defaultdict(list)
  for r in rows:
    for k, v in r.items():
      acc[k].append(v)
  return dict(acc)


UPDATE_KINDS = ("provisional", "correction", "final")
# The wall-clock keys of a row (they differ between otherwise identical runs).
PIPELINE_TIMES = ("pipeline/wall_seconds", "pipeline/learner_busy_fraction",
                  "pipeline/sampler_busy_fraction", "pipeline/sandbox_busy_fraction",
                  "pipeline/learner_idle_fraction")


def pipeline_times(busy: dict[str, float], wall: float) -> dict[str, float]:
  """The wall-clock `pipeline/...` keys from `{learner, sampler, sandbox}` busy seconds in an
  interval of `wall` seconds (module docstring); fractions clipped to [0, 1]."""
  wall = max(wall, 1e-9)
  row = {"pipeline/wall_seconds": wall}
  for part in ("learner", "sampler", "sandbox"):
    row[f"pipeline/{part}_busy_fraction"] = min(1.0, busy.get(part, 0.0) / wall)
  row["pipeline/learner_idle_fraction"] = 1.0 - row["pipeline/learner_busy_fraction"]
  return row


def pipeline_shapes(update_stats: Sequence[dict[str, float]]) -> dict[str, float]:
  """The update-shape `pipeline/...` keys (module docstring) of updates' batch stats (summed
  over processes: `rows`, `rows_<kind>`, `row_slots`, `loss_tokens`, `token_slots`)."""
  sums = collections.defaultdict(float)
  for stats in update_stats:
    counts = [stats.get(f"rows_{k}", 0.0) for k in UPDATE_KINDS]
    kind = UPDATE_KINDS[int(np.argmax(counts))]
    sums[f"updates_{kind}"] += 1
    sums[f"rows_{kind}"] += stats.get("rows", 0.0)
    sums[f"row_slots_{kind}"] += stats.get("row_slots", 0.0)
    sums[f"loss_tokens_{kind}"] += stats.get("loss_tokens", 0.0)
    sums[f"token_slots_{kind}"] += stats.get("token_slots", 0.0)
  row = {f"pipeline/{k}": v for k, v in sums.items()}
  for kind in UPDATE_KINDS:
    if sums[f"row_slots_{kind}"]:
      row[f"pipeline/row_padding_{kind}"] = 1.0 - sums[f"rows_{kind}"] / sums[f"row_slots_{kind}"]
      row[f"pipeline/token_padding_{kind}"] = (
          1.0 - sums[f"loss_tokens_{kind}"] / sums[f"token_slots_{kind}"])
  slots = sum(sums[f"row_slots_{k}"] for k in UPDATE_KINDS)
  if slots:
    row["pipeline/row_padding_fraction"] = 1.0 - sum(
        sums[f"rows_{k}"] for k in UPDATE_KINDS) / slots
  return row


# The wall-clock keys of RL rows besides `PIPELINE_TIMES`, `seconds` and `tokens_per_s`.
RL_TIMES = ("rl/episodes_per_s", "rl/seconds", "rl/episodes_per_s_phase", "final/latency_s",
            "final/wait_s", "final/latency_s_mean", "final/latency_s_p95")
# Every wall-clock key of a row: they differ between otherwise identical runs (a resumed run
# and an uninterrupted one, two processes), every other key must not.
WALL_CLOCK = ("seconds", "tokens_per_s", "eval/seconds", "loop/learner_idle_fraction",
              *PIPELINE_TIMES, *RL_TIMES)
# The run's final-reward latencies of an RL row, `final/<name>` (`AgentLoop.final_latency`).
_LATENCY = ("latency_s_mean", "latency_s_p95", "latency_versions_mean", "latency_versions_p95")


def rl_phase_totals(row: dict[str, float], rl_seconds: float,
                    group_size: int) -> dict[str, float]:
  """The whole-phase keys of the RL phase's final row (module docstring).

  Args:
    row: the final row so far (its `loop/episodes` and `loop/tied_groups_final`, summed over
      processes; absent counts as 0).
    rl_seconds: wall seconds of the RL phase (evaluation excluded).
    group_size: G, episodes per group.

  Returns:
    `rl/seconds`, `rl/episodes_per_s_phase` (episodes per second) and, once a group has
    finished, `signal/tied_groups_final_phase` (a share in [0, 1]).
  """
  episodes = row.get("loop/episodes", 0.0)
  out = {"rl/seconds": rl_seconds, "rl/episodes_per_s_phase": episodes / max(rl_seconds, 1e-9)}
  if episodes:
    out["signal/tied_groups_final_phase"] = (row.get("loop/tied_groups_final", 0.0)
                                            / (episodes / group_size))
  return out


_HEADROOM = ("heldout_pass_at_1", "heldout_pass_at_G", "train_pass_at_1", "train_pass_at_G")


def run_summary(history: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Headline numbers of a run from its rows (for the end-of-run line of `launch/train.py`).

  Returns (each only when the run logged it):
    `warmstart/<h>` and `final/<h>` for the headroom keys `headroom/<h>` of the warm-start's
    evaluation and of the RL phase's last one (`h` in `heldout_pass_at_1`,
    `heldout_pass_at_G`, `train_pass_at_1`, `train_pass_at_G`); `tied_groups_final` (the RL
    phase's `signal/tied_groups_final_phase`); `entropy_first` and `entropy_last` (nats,
    `loss/entropy` of the first and last RL rows that have it); `episodes_per_s`
    (`rl/episodes_per_s_phase`); `final_latency_s_mean`, `final_latency_s_p95`,
    `final_latency_versions_mean` and `final_latency_versions_p95` (the last RL row's
    `final/latency_...`).
  """
  out = {}
  rl = [r for r in history if r.get("phase") == "rl"]
  for name, rows in (("warmstart", [r for r in history if r.get("phase") == "warmstart"]),
                     ("final", rl)):
    evaluated = [r for r in rows if "headroom/heldout_pass_at_1" in r]
    if evaluated:
      out.update({f"{name}/{h}": float(evaluated[-1][f"headroom/{h}"]) for h in _HEADROOM
                  if f"headroom/{h}" in evaluated[-1]})
  entropy = [r["loss/entropy"] for r in rl if "loss/entropy" in r]
  if entropy:
    out["entropy_first"], out["entropy_last"] = float(entropy[0]), float(entropy[-1])
  last = next((r for r in reversed(rl) if "rl/episodes_per_s_phase" in r), {})
  for key, name in (("signal/tied_groups_final_phase", "tied_groups_final"),
                    ("rl/episodes_per_s_phase", "episodes_per_s")):
    if key in last:
      out[name] = float(last[key])
  latency = next((r for r in reversed(rl) if any(f"final/{k}" in r for k in _LATENCY)), {})
  for key in _LATENCY:
    if f"final/{key}" in latency:
      out[f"final_{key}"] = float(latency[f"final/{key}"])
  return out



def summary_line(summary: dict[str, float], *, group_size: int, temperature: float) -> str:
  """The RL line of the end-of-run summary from `run_summary`'s numbers, e.g.

  `RL: headroom (held-out pass@1 -> pass@8 at T=0.5): warm-start 0.301 -> 0.512, end 0.320 ->
  0.498; tied groups (final reward) 0.620; entropy 0.412 -> 0.377 nats; RL 14.2 episodes/s;
  final reward 2.31 s (p95 4.02 s), 3.0 versions (p95 5.0) after the last stage`

  with only the parts the run logged; "" when none.
  """
  parts = []
  ends = [(name, summary[f"{key}/heldout_pass_at_1"], summary[f"{key}/heldout_pass_at_G"])
          for name, key in (("warm-start", "warmstart"), ("end", "final"))
          if f"{key}/heldout_pass_at_G" in summary]
  if ends:
    parts.append(f"headroom (held-out pass@1 -> pass@{group_size} at T={temperature:g}): "
                 + ", ".join(f"{name} {p1:.3f} -> {pg:.3f}" for name, p1, pg in ends))
  if "tied_groups_final" in summary:
    parts.append(f"tied groups (final reward) {summary['tied_groups_final']:.3f}")
  if "entropy_first" in summary:
    parts.append(f"entropy {summary['entropy_first']:.3f} -> {summary['entropy_last']:.3f} "
                 f"nats")
  if "episodes_per_s" in summary:
    parts.append(f"RL {summary['episodes_per_s']:.1f} episodes/s")
  late = []
  if "final_latency_s_mean" in summary:
    late.append(f"{summary['final_latency_s_mean']:.2f} s (p95 "
                f"{summary['final_latency_s_p95']:.2f} s)")
  if "final_latency_versions_mean" in summary:
    late.append(f"{summary['final_latency_versions_mean']:.1f} versions (p95 "
                f"{summary['final_latency_versions_p95']:.1f})")
  if late:
    parts.append(f"final reward {', '.join(late)} after the last stage")
  return "RL: " + "; ".join(parts) if parts else ""


def rl_row(everyone: Sequence[dict[str, Any]], updates: Sequence[dict[str, Any]]
           ) -> dict[str, float]:
  """The RL metrics of one logged row from every process's numbers since the last row.

  Args:
    everyone: per process (in process order) a dict with `harvest` (`{key: [values]}` of its
      episode metrics), `stats` (per update, its batch's replay stats), `replay` (its
      `REPLAY_TOTALS`), `counts` and `loop` (counters), `position` and `epoch` (its task
      stream), and optionally `final_latency` (`AgentLoop.final_latency`).
    updates: host metrics of the updates since the last row (the same in every process).

  Returns:
    Means over episodes (`reward/...`) and updates (`loss/...`, `replay/...`; an update's batch
    stats summed over processes, its padding fraction averaged), replay totals and counters
    summed over processes, the data position summed, the epoch the lowest, and the update
    shapes (`pipeline_shapes`), the run's final-reward latencies (means averaged over the
    processes that have one, p95 the highest).
  """
  harvest = collections.defaultdict(list)
  for p in everyone:
    for k, values in p["harvest"].items():
      harvest[k].extend(values)
  update_rows, update_stats = [], []
  for i, m in enumerate(updates):
    stats = collections.Counter()
    for p in everyone:  # the batch's rows came from every process
      stats.update(p["stats"][i])
    stats["padding_fraction"] = float(np.mean([p["stats"][i]["padding_fraction"]
                                               for p in everyone]))
    update_stats.append(dict(stats))
    update_rows.append({f"loss/{k}": float(v) for k, v in m.items()})
    update_rows[-1].update({f"replay/{k}": float(v) for k, v in stats.items()})
  row = {k: float(np.mean(v)) for k, v in harvest.items()}
  row.update(mean_rows(update_rows))
  row.update(pipeline_shapes(update_stats))
  for k in REPLAY_TOTALS:
    row[f"replay/total_{k}"] = float(sum(p["replay"][k] for p in everyone))
  for group in ("counts", "loop"):
    merged = collections.Counter()
    for p in everyone:
      merged.update(p[group])
    row.update({f"{group}/{k}": float(v) for k, v in merged.items()})
  # A process has the seconds only for final rewards landed since it started (a resumed one
  # may have the versions alone), and none before its first landing.
  for key in _LATENCY:
    values = [p["final_latency"][f"final/{key}"] for p in everyone
              if f"final/{key}" in p.get("final_latency", {})]
    if values:
      pick = max if key.endswith("_p95") else np.mean
      row[f"final/{key}"] = float(pick(values))
  row["loop/data_position"] = float(sum(p["position"] for p in everyone))
  row["loop/epoch"] = float(min(p["epoch"] for p in everyone))
  return row
