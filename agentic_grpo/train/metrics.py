"""Writers of a run's metrics: `MetricsWriter` (metrics.jsonl, TensorBoard, optionally Weights &
Biases (`WandbWriter`, `log.wandb`), progress bar, sample transcripts in transcripts.jsonl every
`log.transcripts_every` updates) and the learning curve plot.

What a row holds, every key of it, and the row math (the RL row assembled from every
process's numbers, the headline numbers of a finished run) are `train/metric_rows.py`.
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
# RL rows averaged into the progress bar's training pass rate (`MetricsWriter.postfix`).
_TRAIN_PASS_ROWS = 10


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
    self.pass1 = next((r["eval/pass_at_1"] for r in reversed(self.history)
                       if "eval/pass_at_1" in r), None)
    # The training stream's pass rate over the last RL rows (the bar's `train`), so that the
    # bar moves between evaluations.
    self.train_pass: collections.deque = collections.deque(
        (r["train/pass_rate"] for r in self.history if "train/pass_rate" in r),
        maxlen=_TRAIN_PASS_ROWS)
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
    if "train/pass_rate" in row:
      self.train_pass.append(float(row["train/pass_rate"]))
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
    """Moves the progress bar to global step `step` and sets its fields (`postfix`)."""
    if self._bar is None:
      return
    self._bar.n = step
    self._bar.set_postfix(self.postfix(phase, loss), refresh=False)
    self._bar.refresh()

  def postfix(self, phase: str, loss: Optional[float] = None) -> dict[str, str]:
    """The progress bar's fields: `phase`, the warm-start's `loss`, `pass@1` (the last
    held-out evaluation's greedy pass@1) and, in the RL phase, `train` (the training stream's
    pass rate, `train/pass_rate`, averaged over the last `_TRAIN_PASS_ROWS` rows that carry
    it: sampled episodes on training tasks, not the held-out greedy pass@1)."""
    post = {"phase": phase}
    if loss is not None:
      post["loss"] = f"{loss:.3f}"
    if self.pass1 is not None:
      post["pass@1"] = f"{self.pass1:.3f}"
    if phase == "rl" and self.train_pass:
      post["train"] = f"{sum(self.train_pass) / len(self.train_pass):.3f}"
    return post

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
