r"""RL-phase episodes per second: this tree against an earlier revision, same run settings.

A side is a source tree: this checkout, or a revision checked out by `git worktree` into a
temporary folder (`--baseline`, e.g. `fe0bf4e`). Each (task, side) trains in a fresh process
that imports that side's package (its tree first on `sys.path`), builds that side's run config
of the task and applies the same settings to it (`SETTINGS`: the baseline revision's own
pipeline-benchmark config of the task, written out field by field, so that both sides run one
config), plus this tree's speed options (`SPEED`: layout and sampling options that change no
update's loss, and `correction.supersede_queued`, which changes which update a segment's credit
arrives in but not the segment's total advantage). Before training, the child writes its
resolved config; the parent checks that the two sides' configs agree on every field both have,
except `SPEED`'s, and stops naming the first that differs.

Measured from each run's `metrics.jsonl` (keys both revisions log): RL episodes finished
(`loop/episodes` at the last RL row) over the RL phase's wall seconds (the sum of the RL rows'
`pipeline/wall_seconds`: evaluation excluded, compilations included), and the same after the
first `--settle` updates (compilations mostly behind). The sides run one after the other on
the same machine, baseline first per task; the machine should be otherwise idle.

Episodes finish a batch at a time (the long-horizon task's 128 at once), and a side that needs
fewer updates per episode finishes more of them in the same updates, so the last count of a
run can fall just after a batch landed or just before. The headline ratio is therefore taken
at equal episodes: each side's RL seconds until it had finished `N` episodes, `N` the larger
of the counts both sides reached (`seconds_to_episodes`), the baseline's seconds over ours
(`TASK_equal_episodes_speedup`; `TASK_speedup` stays the end-of-run ratio).

Usage:
  python -m benchmarks.rl_speed --baseline=fe0bf4e [--tasks=default,long_horizon]
  python -m benchmarks.rl_speed --baseline=fe0bf4e --tasks=default --rl_steps=60
"""

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any, Optional, Sequence

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
TASKS = ("default", "long_horizon")

# The baseline's (fe0bf4e) pipeline-benchmark config of each task, as overrides of this tree's
# task config: fields whose defaults have changed since (the default task's sampling
# temperature and RL learning rate, prompt examples and teacher, the evaluation's pass@k; the
# long-horizon arm's baseline), and dynamic sampling and the KL penalty held off (the baseline's
# behaviour), whatever the task config sets.
_COMMON = ("rl.temperature=0.5", "task.ambiguity_target=0.3", "task.num_public=(2, 3)",
           "workflow.reference_error_rate=0.0", "eval.headroom_tasks=0",
           "eval.headroom_train_tasks=0", "checkpoint.keep_warmstart=False", "eval.k=(1, 2)",
           "rl.dynamic_sampling=False", "loss.kl_beta=0.0")
SETTINGS = {"default": _COMMON + ("optim.learning_rate=1e-4",),
            "long_horizon": _COMMON + ("correction.baseline='previous_stage'",)}
# This tree's speed options: fields the baseline lacks, that change how an update is laid out or
# sampled but not its loss (`config_drift`'s may-change set); and `correction.supersede_queued`,
# which changes which updates a segment's credit arrives in (a provisional update still queued
# when the outcome lands is folded into the outcome row) but not any segment's total advantage.
SPEED = ("rl.pack_prefix", "rl.packed_buckets", "rl.sampler", "rl.sampler_slots",
         "rl.reuse_prefix", "rl.prefix_cache_mb", "rl.shared_prefill", "rl.precompile_rows",
         "rl.update_chunk_rows", "rl.sampler_compact_to", "model.causal_block",
         "model.attention_backward",
         "rl.loss_slot_fractions", "rl.prefill_widths",
         "correction.supersede_queued")
# Fields of this tree the baseline lacks whose values here are the baseline's behaviour.
ABSENT_OK = {"checkpoint.keep_warmstart": False, "eval.headroom_tasks": 0,
             "eval.headroom_train_tasks": 0, "task.num_public": [2, 3],
             "workflow.reference_error_rate": 0.0, "log.transcripts": 2,
             "log.transcripts_every": 0, "log.wandb": False, "log.wandb_mode": "",
             "log.wandb_project": "agentic_grpo", "rl.dynamic_sampling": False,
             "rl.dynamic_sampling_max_batches": 10, "rl.final_reward_lag": 0, "rl.ppo_epochs": 1,
             "rl.pass_rate_filter": [], "task.float_tolerance": -1.0,
             "workflow.final_reward_jitter_s": 0.0, "correction.negative_weight": 1.0}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
  return out


def compare_configs(base: dict[str, Any], ours: dict[str, Any]) -> list[str]:
  """The fields on which two resolved (flattened) configs differ: every field both have,
  except `SPEED`'s; a field only ours has must hold its `ABSENT_OK` value, unless in `SPEED`."""
  bad = []
  for k in sorted(set(base) | set(ours)):
    if k.startswith(SPEED):
      continue
    if k not in base:
      if k not in ABSENT_OK or ours[k] != ABSENT_OK[k]:
        bad.append(f"{k}: absent in the baseline, {ours[k]!r} here")
    elif k not in ours:
      bad.append(f"{k}: {base[k]!r} in the baseline, absent here")
    elif base[k] != ours[k]:
      bad.append(f"{k}: {base[k]!r} in the baseline, {ours[k]!r} here")
  return bad


def summarise(rows: Sequence[dict[str, Any]], settle: int) -> dict[str, float]:
  """Episodes/s of the RL phase (all RL rows) and after the first `settle` updates."""
  rl = [r for r in rows if r.get("phase") == "rl"]
  if not rl:
    raise ValueError("the run logged no RL row")
  # Episodes finished by each RL row: a row without the counter has the last one logged.
  finished, last = [], 0.0
  for r in rl:
    last = float(r.get("loop/episodes", last))
    finished.append(last)
  wall = sum(r.get("pipeline/wall_seconds", 0.0) for r in rl)
  episodes = finished[-1]
  out = {"updates": len(rl), "episodes": episodes, "rl_wall_s": round(wall, 2),
         "episodes_per_s": round(episodes / wall, 3)}
  if len(rl) > settle:
    later = rl[settle:]
    w = sum(r.get("pipeline/wall_seconds", 0.0) for r in later)
    e = episodes - finished[settle - 1] if settle else episodes
    out.update(settled_wall_s=round(w, 2), settled_episodes=e,
               settled_episodes_per_s=round(e / w, 3))
  for part in ("learner", "sampler", "sandbox"):
    busy = sum(r.get(f"pipeline/{part}_busy_fraction", 0.0) * r.get("pipeline/wall_seconds", 0.0)
               for r in rl)
    out[f"{part}_s"] = round(busy, 1)
  out["token_slots"] = sum(v for r in rl for k, v in r.items()
                           if k.startswith("pipeline/token_slots_"))
  return out


def seconds_to_episodes(rows: Sequence[dict[str, Any]], n: float) -> float:
  """The RL phase's wall seconds (`pipeline/wall_seconds` summed over RL rows) up to and
  including the first RL row whose `loop/episodes` is at least `n`.

  Raises:
    ValueError: the run never finished `n` episodes.
  """
  wall = 0.0
  for r in (r for r in rows if r.get("phase") == "rl"):
    wall += r.get("pipeline/wall_seconds", 0.0)
    if r.get("loop/episodes", -1.0) >= n:
      return wall
  raise ValueError(f"the run never finished {n} episodes")


def _child(argv: Sequence[str]) -> None:
  """`child TREE TASK WORKDIR WARMSTART_STEPS RL_STEPS [KEY=VALUE ...]`: trains one side."""
  tree, task, workdir, ws, steps, *overrides = argv
  sys.path.insert(0, tree)
  from benchmarks import pipeline  # pylint: disable=g-import-not-at-top (the side's own)
  from agentic_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from agentic_grpo import train  # pylint: disable=g-import-not-at-top
  c = pipeline.task_config(task, False)
  c.warmstart.steps = int(ws)
  c.rl.num_steps = int(steps)
  if overrides:  # this tree's side only (the baseline may predate `apply_overrides`)
    config_lib.apply_overrides(c, overrides)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "resolved_config.json"), "w") as f:
    json.dump(_flat(c.to_dict()), f, default=str)
  if os.environ.get("RL_SPEED_CONFIG_ONLY"):
    return
  train.run(config_lib.from_config_dict(c), workdir)


def _run_child(python: str, tree: pathlib.Path, task: str, workdir: str, ws: int, steps: int,
               overrides: Sequence[str], config_only: bool = False) -> None:
  env = dict(os.environ, PYTHONPATH=str(tree))
  if config_only:
    env["RL_SPEED_CONFIG_ONLY"] = "1"
  subprocess.run([python, str(HERE / "rl_speed.py"), "child", str(tree), task, workdir,
                  str(ws), str(steps), *overrides], check=True, env=env, cwd=str(tree))


@contextlib.contextmanager
def _worktree(revision: str):
  """A temporary `git worktree` of `revision` (removed afterwards)."""
  tmp = tempfile.mkdtemp(prefix="rl_speed_")
  path = os.path.join(tmp, "tree")
  subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", path, revision],
                 check=True, capture_output=True)
  try:
    yield pathlib.Path(path)
  finally:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", path],
                   check=False, capture_output=True)


def run(baseline: str, tasks: Sequence[str] = TASKS, *, warmstart_steps: int = 150,
        rl_steps: Optional[dict[str, int]] = None, settle: int = 10,
        speed: Sequence[str] = (), root: Optional[str] = None) -> dict:
  """Trains every (task, side) and prints the table; appends the results line; returns it.

  Args:
    baseline: a git revision of this repository.
    tasks: of `TASKS`.
    warmstart_steps: both sides' warm-start steps.
    rl_steps: RL updates per task (default: 60 on the default task, 30 on the long-horizon).
    settle: updates left out of the settled rate.
    speed: extra `KEY=VALUE` settings of this tree's `SPEED` fields (this side only).
    root: where the runs' workdirs go (default: a temporary folder); a finished run there is
      read, not run again.

  Raises:
    ValueError: an unknown task, a speed setting outside `SPEED`, or configs that differ.
  """
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  unknown = [t for t in tasks if t not in TASKS]
  if unknown:
    raise ValueError(f"tasks must be of {TASKS}, got {unknown}")
  bad = [s for s in speed if not s.split("=", 1)[0].startswith(SPEED)]
  if bad:
    raise ValueError(f"speed settings must set fields of {SPEED}, got {bad}")
  steps = {"default": 60, "long_horizon": 30, **(rl_steps or {})}
  load_before = report.load_average()
  root = root or tempfile.mkdtemp(prefix="rl_speed_runs_")
  rows, summary = [], {}
  with _worktree(baseline) as base_tree:
    for task in tasks:
      got, logged = {}, {}
      for side, tree in (("baseline", base_tree), ("ours", ROOT)):
        wd = os.path.join(root, task, side)
        overrides = () if side == "baseline" else (*SETTINGS[task], *speed)
        if not os.path.exists(os.path.join(wd, "DONE")):
          _run_child(sys.executable, tree, task, wd, warmstart_steps, steps[task], overrides,
                     config_only=True)
          if side == "ours":
            differ = compare_configs(
                json.load(open(os.path.join(root, task, "baseline", "resolved_config.json"))),
                json.load(open(os.path.join(wd, "resolved_config.json"))))
            if differ:
              raise ValueError(f"{task}: the sides' configs differ: " + "; ".join(differ))
          _run_child(sys.executable, tree, task, wd, warmstart_steps, steps[task], overrides)
          open(os.path.join(wd, "DONE"), "w").close()
        with open(os.path.join(wd, "metrics.jsonl")) as f:
          logged[side] = [json.loads(line) for line in f]
        got[side] = summarise(logged[side], settle)
      # Both sides at the same episode count (the module docstring).
      common = min(got["baseline"]["episodes"], got["ours"]["episodes"])
      to_common = {side: seconds_to_episodes(logged[side], common) for side in logged}
      for side in ("baseline", "ours"):
        g = got[side]
        rows.append([task, baseline if side == "baseline" else "this tree", g["updates"],
                     int(g["episodes"]), g["rl_wall_s"], g["episodes_per_s"],
                     g.get("settled_episodes_per_s", ""), int(common),
                     round(to_common[side], 1), round(common / to_common[side], 3),
                     g["learner_s"], g["sampler_s"], g["sandbox_s"], g["token_slots"]])
      # `_speedup` keeps its meaning in earlier records (the end of the run).
      summary[f"{task}_equal_episodes_speedup"] = round(
          to_common["baseline"] / to_common["ours"], 3)
      summary[f"{task}_speedup"] = round(
          got["ours"]["episodes_per_s"] / got["baseline"]["episodes_per_s"], 3)
      if "settled_episodes_per_s" in got["ours"] and "settled_episodes_per_s" in got["baseline"]:
        summary[f"{task}_settled_speedup"] = round(
            got["ours"]["settled_episodes_per_s"] / got["baseline"]["settled_episodes_per_s"], 3)
  return report.record(
      "rl_speed",
      settings={"baseline": baseline, "tasks": list(tasks), "warmstart_steps": warmstart_steps,
                "rl_steps": steps, "settle": settle, "speed": list(speed)},
      header=["task", "side", "updates", "episodes", "RL wall s", "episodes/s",
              f"episodes/s after {settle} updates", "equal episodes N", "RL s to N",
              "episodes/s to N", "learner s", "sampler s", "sandbox s", "learner token slots"],
      rows=rows, summary=summary, load_before=load_before)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1 and argv[1] == "child":
    _child(argv[2:])
    return
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  baseline = flags.DEFINE_string("baseline", "fe0bf4e", "Git revision to compare against.")
  tasks = flags.DEFINE_list("tasks", list(TASKS), "Tasks to run.")
  ws = flags.DEFINE_integer("warmstart_steps", 150, "Warm-start steps of both sides.")
  steps = flags.DEFINE_list("rl_steps", [], "TASK=N RL updates (default 60 and 30).")
  settle = flags.DEFINE_integer("settle", 10, "Updates left out of the settled rate.")
  speed = flags.DEFINE_multi_string("speed", [], "KEY=VALUE of a SPEED field (this side).")
  root = flags.DEFINE_string("root", "", "Workdirs' folder (finished runs are read).")

  def _main(_):
    run(baseline.value, tasks.value, warmstart_steps=ws.value,
        rl_steps={k: int(v) for k, v in (s.split("=") for s in steps.value)},
        settle=settle.value, speed=speed.value, root=root.value or None)

  app.run(_main)


if __name__ == "__main__":
  main(sys.argv)
