"""Metrics of a run: `MetricsWriter` (metrics.jsonl, TensorBoard, optionally Weights & Biases
(`WandbWriter`, `log.wandb`), progress bar, sample transcripts in transcripts.jsonl every
`log.transcripts_every` updates), the learning
curve plot, the RL row assembled from every process's numbers (`rl_row`), and the headline
numbers of a finished run (`run_summary`, printed by `launch/train.py`).

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
* `rl/episodes_per_s`: training episodes finished since the last row per wall second of the
  interval (evaluation excluded, all processes); the final row adds `rl/seconds` (the RL
  phase's wall seconds so far, evaluation excluded, over resumes) and
  `rl/episodes_per_s_phase` (`loop/episodes / rl/seconds`). Wall-clock numbers, like
  `seconds`, `tokens_per_s` and `pipeline/wall_seconds`: they differ between runs.
* `eval/...` when the row evaluates (every `eval.every` updates and the final row,
  `train.evaluation.evaluate`); with samples (the warm-start's last row and the final row) also
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
import hashlib
import html
import io
import json
import math
import os
import re
from typing import Any, Optional, Sequence

from absl import logging
from etils import epath
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import parallel

# Metric names TensorBoard keeps unchanged as tags (tensorboardX replaces any other character).
_TAG = re.compile(r"[-\w./]+")
# Running totals of the replay, logged as `replay/total_<name>`.
REPLAY_TOTALS = ("stale_dropped_segments", "stale_downweighted_segments", "corrections",
                 "sign_reversals", "evicted_segments", "provisional_items", "correction_items")


class WandbWriter:
  """Weights & Biases beside TensorBoard (`log.wandb`): every numeric key of a row as the same
  name at the row's `step`, transcripts as HTML (`transcript_markdown` in a `<pre>`).

  The W&B run's id is derived from the workdir, so that a resumed run continues its W&B run
  (`resume="allow"`; rows W&B already holds for steps past the restored checkpoint are not
  replaced: W&B keeps its steps increasing). A local workdir holds the W&B files under
  `workdir/wandb` (offline: `wandb sync workdir/wandb/offline-run-*` uploads them).

  Raises (on construction):
    errors.InputError: the `wandb` package is not installed.
  """

  def __init__(self, workdir: str, cfg: config_lib.TrainConfig):
    try:
      import wandb  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise errors.InputError("config.log.wandb=True needs the wandb package: pip install "
                              "wandb (the wandb extra), or set --config.log.wandb=False") from None
    self._wandb = wandb
    local = "://" not in str(workdir)
    name = os.path.basename(os.path.normpath(str(workdir))) or "run"
    run_id = hashlib.sha256(os.path.abspath(str(workdir)).encode()
                            if local else str(workdir).encode()).hexdigest()[:16]
    if local:
      os.makedirs(workdir, exist_ok=True)
    self.run = wandb.init(project=cfg.log.wandb_project, name=name, id=run_id, resume="allow",
                          dir=str(workdir) if local else None,
                          mode=cfg.log.wandb_mode or None, config=config_lib.to_dict(cfg))

  def log(self, row: dict[str, Any]) -> None:
    """The numeric, finite keys of `row` (`step` required) at its step."""
    values = {k: v for k, v in row.items()
              if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
              and math.isfinite(v)}
    if values:
      self.run.log(values, step=int(row["step"]))

  def log_transcripts(self, step: int, rows: Sequence[dict[str, Any]]) -> None:
    text = "\n\n---\n\n".join(map(transcript_markdown, rows))
    self.run.log({"transcripts": self._wandb.Html(f"<pre>{html.escape(text)}</pre>")},
                 step=int(step))

  def close(self) -> None:
    self.run.finish()


class MetricsWriter:
  """`metrics.jsonl`, TensorBoard events and the console progress bar.

  On resume, lines of `metrics.jsonl` beyond the restored step (written after the last
  checkpoint by the stopped run) are dropped so that the file stays one consistent history.
  In a multi-process run only process 0 writes; the others keep the history in memory. A remote
  workdir (`gs://...`) gets the whole file rewritten at each write (objects cannot be appended
  to) and no TensorBoard events.

  Metric names use only the characters TensorBoard keeps in a tag (`[A-Za-z0-9_.-/]`:
  `eval/pass_at_1`, not `eval/pass@1`, which tensorboardX would rename), so that every
  TensorBoard tag equals its `metrics.jsonl` key; `write` refuses any other name.
  """

  def __init__(self, workdir: str, cfg: config_lib.TrainConfig, total_steps: int,
               resume_step: int):
    self.path = epath.Path(workdir) / "metrics.jsonl"
    self.history: list[dict[str, Any]] = []
    self.primary = parallel.is_primary()
    self.local = "://" not in str(workdir)
    if self.path.exists():
      for line in self.path.read_text().splitlines():
        if line.strip():
          row = json.loads(line)
          if row.get("step", 0) <= resume_step:
            self.history.append(row)
    self._file = self._tb = self._bar = self._wandb = None
    if not self.primary:
      return
    self.path.write_text("".join(json.dumps(row) + "\n" for row in self.history))
    if self.local:
      self._file = self.path.open("a")
    if cfg.log.tensorboard and self.local:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tb"))
    self._wandb = WandbWriter(workdir, cfg) if cfg.log.wandb else None
    if cfg.log.progress_bar:
      import tqdm  # pylint: disable=g-import-not-at-top
      self._bar = tqdm.tqdm(total=total_steps, initial=resume_step, unit="step",
                            dynamic_ncols=True, desc="train")
    self.pass1 = next((r["eval/pass_at_1"] for r in reversed(self.history)
                       if "eval/pass_at_1" in r), None)
    self.transcripts_path = epath.Path(workdir) / "transcripts.jsonl"
    if self.transcripts_path.exists():  # as metrics.jsonl: none past the restored step
      kept = [line for line in self.transcripts_path.read_text().splitlines()
              if line.strip() and json.loads(line).get("step", 0) <= resume_step]
      self.transcripts_path.write_text("".join(line + "\n" for line in kept))

  def write_transcripts(self, step: int, transcripts: Sequence[dict[str, Any]]) -> None:
    """Appends sample transcripts (`agent.loop.AgentLoop.transcripts`) at global step `step`
    to `transcripts.jsonl` (one line each, `step` added) and, as Markdown text, to TensorBoard
    (tag `transcripts`). Only process 0 writes; nothing for an empty list."""
    if not self.primary or not transcripts:
      return
    rows = [{"step": int(step), **t} for t in transcripts]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if self.local:
      with self.transcripts_path.open("a") as f:
        f.write(text)
    else:  # objects cannot be appended to
      old = self.transcripts_path.read_text() if self.transcripts_path.exists() else ""
      self.transcripts_path.write_text(old + text)
    if self._tb is not None:
      self._tb.add_text("transcripts", "\n\n---\n\n".join(map(transcript_markdown, rows)),
                        int(step))
    if self._wandb is not None:
      self._wandb.log_transcripts(step, rows)

  def write(self, row: dict[str, Any]) -> None:
    """Appends one metrics row (`step` required) to every output.

    Raises:
      ValueError: a key with a character TensorBoard would replace in a tag.
    """
    illegal = [k for k in row if not _TAG.fullmatch(k)]
    if illegal:
      raise ValueError(f"metric names must match {_TAG.pattern} (TensorBoard tags), got "
                       f"{illegal}")
    row = {k: (float(v) if isinstance(v, (np.ndarray, np.generic)) else v)
           for k, v in row.items()}
    self.history.append(row)
    # Every process, primary or not, can show its rows (`--verbosity=1`): multi-host runs
    # compare them.
    logging.vlog(1, "metrics %s", json.dumps(row))
    if "eval/pass_at_1" in row:
      self.pass1 = row["eval/pass_at_1"]
    if not self.primary:
      return
    if self._file is None:
      self.path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
    else:
      self._file.write(json.dumps(row) + "\n")
      self._file.flush()
    if self._tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and k != "step" and math.isfinite(v):
          self._tb.add_scalar(k, v, row["step"])
    if self._wandb is not None:
      self._wandb.log(row)

  def progress(self, step: int, phase: str, loss: Optional[float] = None) -> None:
    if self._bar is None:
      return
    self._bar.n = step
    post = {"phase": phase}
    if loss is not None:
      post["loss"] = f"{loss:.3f}"
    if self.pass1 is not None:
      post["pass@1"] = f"{self.pass1:.3f}"
    self._bar.set_postfix(post, refresh=False)
    self._bar.refresh()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()
      self._wandb = None
    if self._bar is not None:
      self._bar.close()


def transcript_markdown(t: dict[str, Any]) -> str:
  """One transcript (`MetricsWriter.write_transcripts`) as Markdown: the prompt, then each
  stage's opening and output in code blocks with its reward, then the final verdict."""
  def block(text: str) -> str:
    return "```\n" + text.replace("```", "` ``") + "\n```"

  parts = [f"**{t['task_id']}** (policy version {t.get('policy_version')})", block(t["prompt"])]
  for st in t["stages"]:
    if st.get("opening"):
      parts.append(block(st["opening"]))
    parts.append(f"*{st['stage']}* output (reward {st['reward']}, parsed {st['parsed']}, "
                 f"counted {st['valid']}):")
    parts.append(block(st["output"]))
  parts.append(f"final reward {t['final_reward']}; hidden tests passed {t['tests_passed']}/"
               f"{t['num_tests']}")
  return "\n\n".join(parts)


def plot_learning_curve(history: list[dict[str, Any]], path: str) -> None:
  """Held-out pass@1 and training rewards against the global step, as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  ev = [r for r in history if "eval/pass_at_1" in r]
  if ev:
    ax1.errorbar([r["step"] for r in ev], [r["eval/pass_at_1"] for r in ev],
                 yerr=[r.get("eval/pass_at_1_stderr", 0.0) for r in ev], fmt="o-", capsize=3,
                 label="greedy pass@1 (held-out, ±1 s.e.)")
    ax1.plot([r["step"] for r in ev], [r["eval/hidden_frac"] for r in ev], "s--",
             label="hidden tests passed (fraction)")
  ws = [r["step"] for r in history if r.get("phase") == "warmstart"]
  if ws:
    ax1.axvline(max(ws), color="gray", lw=0.8, ls=":", label="end of warm-start")
  ax1.set_xlabel("step")
  ax1.set_ylim(0, 1)
  ax1.legend(loc="lower right")
  ax1.set_title("held-out evaluation")
  rl = [r for r in history if r.get("phase") == "rl" and "reward/final" in r]
  if rl:
    ax2.plot([r["step"] for r in rl], [r["reward/final"] for r in rl], label="final reward")
    # Stage rewards are logged at the step their stage closed, not only with the final reward.
    rl_all = [r for r in history if r.get("phase") == "rl"]
    for key in sorted({k for r in rl_all for k in r
                       if k.startswith("reward/") and k != "reward/final"}):
      pts = [(r["step"], r[key]) for r in rl_all if key in r]
      ax2.plot(*zip(*pts), alpha=0.6, label=key.split("/", 1)[1])
  ax2.set_xlabel("step")
  ax2.set_title("training rewards")
  if rl:
    ax2.legend(loc="lower right", fontsize=8)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100)
  plt.close(fig)
  epath.Path(path).write_bytes(buf.getvalue())


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
RL_TIMES = ("rl/episodes_per_s", "rl/seconds", "rl/episodes_per_s_phase")


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
    (`rl/episodes_per_s_phase`).
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
  return out


def summary_line(summary: dict[str, float], *, group_size: int, temperature: float) -> str:
  """The RL line of the end-of-run summary from `run_summary`'s numbers, e.g.

  `RL: headroom (held-out pass@1 -> pass@8 at T=0.5): warm-start 0.301 -> 0.512, end 0.320 ->
  0.498; tied groups (final reward) 0.620; entropy 0.412 -> 0.377 nats; RL 14.2 episodes/s`

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
  return "RL: " + "; ".join(parts) if parts else ""


def rl_row(everyone: Sequence[dict[str, Any]], updates: Sequence[dict[str, Any]]
           ) -> dict[str, float]:
  """The RL metrics of one logged row from every process's numbers since the last row.

  Args:
    everyone: per process (in process order) a dict with `harvest` (`{key: [values]}` of its
      episode metrics), `stats` (per update, its batch's replay stats), `replay` (its
      `REPLAY_TOTALS`), `counts` and `loop` (counters), `position` and `epoch` (its task
      stream).
    updates: host metrics of the updates since the last row (the same in every process).

  Returns:
    Means over episodes (`reward/...`) and updates (`loss/...`, `replay/...`; an update's batch
    stats summed over processes, its padding fraction averaged), replay totals and counters
    summed over processes, the data position summed, the epoch the lowest, and the update
    shapes (`pipeline_shapes`).
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
  row["loop/data_position"] = float(sum(p["position"] for p in everyone))
  row["loop/epoch"] = float(min(p["epoch"] for p in everyone))
  return row
