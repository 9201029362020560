r"""Where the RL loop's wall time goes, and how full its updates are: short runs, read back.

For the default run (`experiments/tiny_codegen.py`) and the long-horizon task (the `agentic`
arm of `experiments/ablation.py`, `task.source='long_horizon'`), trains a short run into a
temporary workdir and reads its `metrics.jsonl`: the `pipeline/...` keys that `train.rl_phase`
logs every row (`train/metric_rows.py`). The first RL row (it holds the update step's compilations)
is left out of the time shares ("after warm-up"); the update shapes count every update.

Reported per task: the share of wall time the host spends on the learner (taking batches,
dispatching updates, waiting for them), the sampler and the sandbox; the learner's idle share;
the token slots of an update's batch (mean over updates: rows times row length, what the
learner computes); and per update kind (provisional, correction, final = outcome-only target)
the updates, real rows per update, and the padding fraction of the learner's row slots and
token slots. With shared-prefix packing (`rl.pack_prefix`) a row holds several items (replay
rows): `items/update` counts those.

Each run is a fresh process (`python -m benchmarks.pipeline TASK WORKDIR [quick] [KEY=VALUE
...]`, `KEY` a `section.field` of the run config, `VALUE` a Python literal): its own
compilations, and the experiments' flags apart from the suite's.

Usage:
  python -m benchmarks.run --only pipeline [--quick]
  python -m benchmarks.pipeline default /tmp/packed quick rl.pack_prefix=True   # one run
  python -m benchmarks.pipeline read WORKDIR_OR_METRICS...    # runs that already finished
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Sequence

import ml_collections

from agentic_grpo import config as config_lib
from benchmarks import report

TASKS = ("default", "long_horizon")
KINDS = ("provisional", "correction", "final")


def task_config(task: str, quick: bool,
                overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The run config of one task: a short RL phase, logged every step, no checkpoints;
  `overrides`: `SECTION.FIELD=VALUE` strings set last (`config.apply_overrides`).

  Raises:
    ValueError: for a task not in `TASKS`, or a bad override (`config.apply_overrides`).
  """
  if task not in TASKS:
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")
  if task == "default":
    from experiments import tiny_codegen  # pylint: disable=g-import-not-at-top
    c = tiny_codegen.get_config()
  else:
    # Only in the child process: `experiments.ablation` defines absl flags (`--quick`) that
    # `benchmarks.run` defines too.
    from experiments import ablation  # pylint: disable=g-import-not-at-top
    c = ablation.arm_config("long_horizon", "agentic", seed=0)
    c.rl.episode_budget = 0
  c.rl.num_steps = 6 if quick else 40
  if quick:
    # Fewer warm-start steps, but enough that groups do not all tie (no update at all).
    c.warmstart.steps = 150
  c.task.eval_size = 16
  c.eval.every = 0
  c.eval.num_samples = 0
  c.log.every = 1
  c.log.progress_bar = False
  c.log.plot = False
  c.log.tensorboard = False
  c.checkpoint.every = 0
  config_lib.apply_overrides(c, overrides)
  return c


def summarise(rows: list[dict[str, Any]]) -> dict[str, float]:
  """Time shares (RL rows after the first) and update shapes (every RL row) of a run's
  `metrics.jsonl` rows."""
  rl = [r for r in rows if r.get("phase") == "rl"]
  timed = rl[1:] or rl
  wall = sum(r.get("pipeline/wall_seconds", 0.0) for r in timed)
  out = {"rl_rows": len(rl), "wall_s": round(wall, 2)}
  updates = sum(r.get(f"pipeline/updates_{k}", 0.0) for r in rl for k in KINDS)
  slots = sum(r.get(f"pipeline/token_slots_{k}", 0.0) for r in rl for k in KINDS)
  out["token_slots_per_update"] = round(slots / updates, 1) if updates else 0.0
  items = [r.get("replay/items", r.get("replay/rows", 0.0)) for r in rl]
  out["items_per_update"] = round(sum(items) / len(items), 2) if items else 0.0
  for part in ("learner", "sampler", "sandbox"):
    busy = sum(r.get(f"pipeline/{part}_busy_fraction", 0.0) * r.get("pipeline/wall_seconds", 0.0)
               for r in timed)
    out[f"{part}_busy"] = round(busy / wall, 3) if wall else 0.0
  out["learner_idle"] = round(1.0 - out["learner_busy"], 3)
  sums = collections.Counter()
  for r in rl:
    for k, v in r.items():
      if k.startswith("pipeline/") and any(
          k.startswith(f"pipeline/{f}_") for f in ("updates", "rows", "row_slots", "loss_tokens",
                                                     "token_slots")):
        sums[k[len("pipeline/"):]] += v
  for kind in KINDS:
    n = sums[f"updates_{kind}"]
    out[f"updates_{kind}"] = int(n)
    if n:
      out[f"rows_per_update_{kind}"] = round(sums[f"rows_{kind}"] / n, 2)
      out[f"row_padding_{kind}"] = round(1 - sums[f"rows_{kind}"] / sums[f"row_slots_{kind}"], 3)
      out[f"token_padding_{kind}"] = round(
          1 - sums[f"loss_tokens_{kind}"] / sums[f"token_slots_{kind}"], 3)
  slots = sum(sums[f"row_slots_{k}"] for k in KINDS)
  if slots:
    out["row_padding"] = round(1 - sum(sums[f"rows_{k}"] for k in KINDS) / slots, 3)
  return out


def run_task(task: str, quick: bool) -> dict[str, float]:
  """Trains the short run of `task` in a fresh process and a temporary workdir; returns
  `summarise` of it.

  Raises:
    subprocess.CalledProcessError: the run failed.
  """
  with tempfile.TemporaryDirectory() as workdir:
    args = [sys.executable, "-m", "benchmarks.pipeline", task, workdir] + (["quick"] * quick)
    subprocess.run(args, check=True)
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      return summarise([json.loads(line) for line in f if line.strip()])


def _pct(x):
  return "-" if x is None else f"{100 * x:.0f}%"


def run(quick: bool = False) -> dict:
  """Measures both tasks, prints the table, appends the results line; returns it."""
  load_before = report.load_average()
  got = {task: run_task(task, quick) for task in TASKS}
  return report.record(
      "pipeline",
      settings={"quick": quick, "tasks": list(TASKS),
                "rl_steps": task_config("default", quick).rl.num_steps},
      header=["task"] + HEADER, rows=table_rows(got), summary=got, load_before=load_before)


HEADER = ["updates of kind", "RL wall s", "learner busy", "sampler busy", "sandbox busy",
          "learner idle", "updates", "token slots/update", "items/update", "rows/update",
          "row padding", "token padding"]


def table_rows(got: dict[str, dict[str, float]]) -> list[list[Any]]:
  """The table's rows for `{label: summarise(...)}`: one row per run, then one per update kind
  the run made."""
  rows = []
  for label, s in got.items():
    rows.append([label, "all", f"{s['wall_s']:.0f}", _pct(s["learner_busy"]),
                 _pct(s["sampler_busy"]), _pct(s["sandbox_busy"]), _pct(s["learner_idle"]),
                 sum(s[f"updates_{k}"] for k in KINDS),
                 f"{s.get('token_slots_per_update', 0):.0f}", f"{s.get('items_per_update', 0):.1f}",
                 "-", _pct(s.get("row_padding")), "-"])
    for kind in KINDS:
      if s[f"updates_{kind}"]:
        rows.append([label, kind, "", "", "", "", "", s[f"updates_{kind}"], "", "",
                     f"{s[f'rows_per_update_{kind}']:.1f}", _pct(s[f"row_padding_{kind}"]),
                     _pct(s[f"token_padding_{kind}"])])
  return rows


def read(paths: list[str]) -> dict[str, dict[str, float]]:
  """`summarise` of finished runs' `metrics.jsonl` (each path a file or a workdir), keyed by
  path; prints the table. Reads any run, e.g. every run of an ablation:
  `python -m benchmarks.pipeline read ablation/long_horizon/*/seed*`.

  Raises:
    FileNotFoundError: a path has no metrics.jsonl.
  """
  got = {}
  for path in paths:
    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    with open(file, encoding="utf-8") as f:
      got[path] = summarise([json.loads(line) for line in f if line.strip()])
  print(report.table("pipeline of finished runs", ["run"] + HEADER, table_rows(got)))
  return got


def _train(argv: list[str]) -> None:
  """The child process of `run_task`: `TASK WORKDIR [quick] [KEY=VALUE ...]`."""
  from agentic_grpo import train  # pylint: disable=g-import-not-at-top (JAX start-up)
  task, workdir = argv[:2]
  rest = argv[2:]
  quick = "quick" in rest
  train.run(task_config(task, quick, [a for a in rest if "=" in a]), workdir)


if __name__ == "__main__":
  if sys.argv[1:2] == ["read"]:
    read(sys.argv[2:])
  else:
    _train(sys.argv[1:])
