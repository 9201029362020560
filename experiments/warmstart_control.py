r"""The warm-start control: the RL phase's minutes spent on more warm-start steps instead.

A reviewer's question of any RL gain: would the same minutes of the supervised warm-start have
bought it too? From a finished run's workdir (its `config.json`, `metrics.jsonl` and the
warm-start's kept last checkpoint, `checkpoint.keep_warmstart`), this continues the
warm-start from that very checkpoint for N more steps and compares, on the same held-out tasks:

    python -m experiments.warmstart_control --run=WORKDIR [--out=DIR] [--steps=N] \
        [--schedule=final|stretched]

1. **N** = round(`rl/seconds` / warm-start seconds per step), unless `--steps` is given.
   `rl/seconds` is the RL phase's wall seconds, evaluation excluded (the final RL row of
   `metrics.jsonl`, `train/metric_rows.py`); the warm-start's seconds per step is the mean over its
   logged rows' intervals (`seconds` differences over step differences; the interval up to the
   first row, which holds start-up and compilation, and an interval across a resume are left
   out; the warm-start's end-of-phase evaluation falls after its row's `seconds`, so no
   interval holds it). Both include the checkpoints written in those intervals.
2. **The control** (in `--out`, default `WORKDIR/warmstart_control`): the out directory is
   seeded with a copy of the warm-start's last checkpoint (global step `ws` =
   `warmstart.steps`; only that step, verified first) and the warm-start rows of the run's
   `metrics.jsonl`, as `experiments/ablation.py` seeds an arm, and `train.run` resumes it with
   the run's config except `warmstart.steps = ws + N`, `rl.num_steps = 0`, and the learning
   rate (`--schedule`), stopped at the end of the warm-start (global step `ws + N`, checkpointed
   and evaluated as a warm-start's end is). The warm-start batches of steps `ws .. ws + N - 1`
   are the ones the warm-start's data stream would have given next (each batch is a function of
   its step), the AdamW moments and step count are the checkpoint's.
3. **Evaluation**: the run's warm-start checkpoint (step `ws`), the run's final checkpoint (the
   newest intact one, the final RL row's step) and the control's last checkpoint, each with
   `train.eval_only.evaluate_checkpoint` (greedy pass@1 per held-out task; each writes
   `eval/step_<N>.json` and an `eval_only` row into its own workdir: the run's two into the
   run's workdir, beside its training rows, which they leave unchanged), then the paired gains
   (`train.evaluation.paired_gain`, the mean per-task difference and its standard error): the
   control over the warm-start, RL over the warm-start (also as the run logged it,
   `eval/pass_at_1_gain` of its final row) and RL minus the control. A record already there
   with the same evaluation settings is read instead of evaluated again.

**The learning rate** (`--schedule`). The warm-start's schedule (linear warm-up, then a cosine
to `warmstart.final_lr_fraction` of the peak) is defined over `warmstart.steps`: by the
checkpoint at step `ws` it has decayed to its final rate. Raising `warmstart.steps` to `ws + N`
alone would stretch the cosine over `ws + N` steps, which at step `ws` lies above the final
rate: the continuation would jump back up (e.g. `ws = 200`, `N = 100`, 20 warm-up steps: from
0.10 to 0.35 of the peak), a learning-rate restart the warm-start never had.

* `final` (the default): the warm-start continues at its final rate
  (`warmstart.learning_rate * warmstart.final_lr_fraction`, constant: the control's config has
  that `learning_rate`, `warmup_steps = 0`, `final_lr_fraction = 1`). It is the warm-start
  exactly as it stood at the checkpoint, run for longer: the only difference from the
  warm-start RL started from is the N steps, which is what the control is to measure, and the
  loss continues without a jump. It is the reading compared by default because a restart is a
  second intervention (it can help or hurt on its own) that RL did not get either: the RL
  phase starts from the same checkpoint with its own small, separate learning rate.
  Refused when the warm-start ended before its decay began (`ws <= warmstart.warmup_steps`) or
  at rate 0.
* `stretched`: the schedule as if the warm-start had been planned `ws + N` steps long
  (`warmstart.steps = ws + N`, nothing else changed), continued from step `ws`: the rate jumps
  up to the stretched cosine's value at `ws` and decays to the final rate at `ws + N`. The
  generous reading for the control (a re-warmed tail), for when the final rate looks too small
  to move the policy in N steps.

**Outputs** in `--out`: the control's own workdir (`config.json`, `metrics.jsonl`,
checkpoints, `eval/step_<ws+N>.json`), `control.json` (every number below, the settings, and
the paths of the three evaluation records), and `done.json` once all is written. A Markdown
table is printed:

| arm | global step | held-out pass@1 | paired gain over the warm-start |
|---|---|---|---|
| warm-start | ws | ... | |
| control: N more warm-start steps | ws + N | ... | ± s.e. |
| RL | final | ... | ± s.e. |

followed by RL minus the control (paired) and RL's gain as its run logged it.

**Resumable**: rerun the same command. A finished control (`done.json`) is reported again
without training or evaluating; an interrupted one resumes (the seeding is skipped once the out
directory holds checkpoints, training resumes from the control's newest checkpoint and stops
at `ws + N`, finished evaluations are read back). An out directory holding a control of
another N or schedule is refused (`ControlError`; use another `--out`). The tool holds the
run's workdir lock throughout (the run must not be training) and the out directory's while it
seeds and trains.

It runs in one process: the run's checkpoints must be a one-process run's (a checkpoint
restores only into the number of processes that wrote it).
"""

import dataclasses
import json
import os
import shutil
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
from absl import logging

from agentic_grpo import config as config_lib
from agentic_grpo import train
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import integrity as checkpoint_integrity
from agentic_grpo.checkpoint import run_lock
from agentic_grpo.train import eval_only

DONE = "done.json"
REPORT = "control.json"
OUT_NAME = "warmstart_control"
SCHEDULES = ("final", "stretched")


class ControlError(ValueError):
  """The run cannot be controlled as asked (no kept warm-start checkpoint, an unfinished run,
  an out directory holding another control, ...); the message says why."""


def _rows(workdir: str) -> list[dict[str, Any]]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise ControlError(f"no metrics.jsonl in {workdir}")
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def warmstart_rows(rows: Sequence[dict[str, Any]], ws: int) -> list[dict[str, Any]]:
  """The warm-start's training rows (phase `warmstart`, steps <= `ws`), in order."""
  return [r for r in rows if r.get("phase") == "warmstart" and r.get("step", 0) <= ws]


def seconds_per_step(rows: Sequence[dict[str, Any]]) -> Optional[float]:
  """Mean wall seconds per step over consecutive rows' intervals (module docstring, 1.), or
  None when no interval is usable (fewer than two rows of one process)."""
  seconds = steps = 0.0
  for a, b in zip(rows, rows[1:]):
    dt, ds = b["seconds"] - a["seconds"], b["step"] - a["step"]
    if ds > 0 and dt > 0:  # dt <= 0: a resume restarted the clock in between
      seconds, steps = seconds + dt, steps + ds
  return seconds / steps if steps else None


def final_rl_row(rows: Sequence[dict[str, Any]]) -> Optional[dict[str, Any]]:
  """The RL phase's final row (the last `rl` row, which holds `rl/seconds`), or None."""
  rl = [r for r in rows if r.get("phase") == "rl"]
  return rl[-1] if rl and "rl/seconds" in rl[-1] else None


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the control does: from the run's warm-start step `ws`, `steps` more (`steps_from`:
  'budget' or 'flag'), against the run's final step `rl_step`; the budget's numbers."""
  ws: int
  steps: int
  steps_from: str
  rl_step: int
  rl_seconds: Optional[float]
  warmstart_seconds_per_step: Optional[float]

  @property
  def control_step(self) -> int:
    return self.ws + self.steps


def plan(run: str, cfg: config_lib.TrainConfig, steps: Optional[int] = None) -> Plan:
  """The control's plan for the finished run in `run` (checked; nothing is written).

  Raises:
    ControlError: no warm-start, no kept warm-start checkpoint (or a damaged one), an
      unfinished run (no final RL row, or its newest checkpoint is not that row's step), or no
      way to estimate N without `steps`.
  """
  ws = cfg.warmstart.steps
  if ws <= 0:
    raise ControlError(f"the run in {run} has no warm-start (warmstart.steps = {ws})")
  if steps is not None and steps < 1:
    raise ControlError(f"--steps must be >= 1, got {steps}")
  rows = _rows(run)
  last = final_rl_row(rows)
  if last is None:
    raise ControlError(f"{run}/metrics.jsonl has no final RL row (with rl/seconds): the run "
                       f"has not finished its RL phase")
  directory = os.path.join(run, "checkpoints")
  if not checkpointer.Checkpointer.exists(directory):
    raise ControlError(f"no checkpoints in {run}")
  ckpt = checkpointer.Checkpointer(directory)
  try:
    if ws not in ckpt.all_steps():
      raise ControlError(
          f"the warm-start's last checkpoint (step {ws}) is not in {directory} (steps "
          f"{ckpt.all_steps()}): it was rotated away; runs keep it with "
          f"checkpoint.keep_warmstart=True")
    damaged = ckpt.problems(ws)
    if damaged:
      raise ControlError(f"the warm-start's checkpoint is damaged: "
                         f"{checkpoint_integrity.describe(ws, damaged)}")
    final = ckpt.intact_step()
    if final != last["step"] or final <= ws:
      raise ControlError(f"the newest intact checkpoint of {run} is step {final}, not the final "
                         f"RL row's step {last['step']}: the run is unfinished or damaged")
  finally:
    ckpt.close()
  per_step = seconds_per_step(warmstart_rows(rows, ws))
  rl_seconds = float(last["rl/seconds"])
  if steps is None:
    if per_step is None:
      raise ControlError(f"the warm-start rows of {run} give no seconds per step (fewer than "
                         f"two rows of one process): pass --steps")
    steps, steps_from = max(1, round(rl_seconds / per_step)), "budget"
  else:
    steps_from = "flag"
  return Plan(ws, int(steps), steps_from, int(final), rl_seconds, per_step)


def control_config(cfg: config_lib.TrainConfig, ws: int, steps: int,
                   schedule: str = "final") -> config_lib.TrainConfig:
  """The run's config `cfg` continued `steps` warm-start steps past `ws`, without RL, at the
  learning rate of `schedule` (module docstring).

  Raises:
    ControlError: an unknown schedule, or `final` for a warm-start that ended in its warm-up
      or at rate 0.
  """
  w = cfg.warmstart
  if schedule == "final":
    rate = w.learning_rate * w.final_lr_fraction
    if ws <= w.warmup_steps or rate <= 0:
      raise ControlError(
          f"--schedule=final: the warm-start ended {'in its warm-up' if rate > 0 else 'at rate 0'}"
          f" (warmstart.steps={ws}, warmup_steps={w.warmup_steps}, final_lr_fraction="
          f"{w.final_lr_fraction}); use --schedule=stretched")
    warm = dataclasses.replace(w, steps=ws + steps, learning_rate=rate, warmup_steps=0,
                               final_lr_fraction=1.0)
  elif schedule == "stretched":
    warm = dataclasses.replace(w, steps=ws + steps)
  else:
    raise ControlError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
  out = dataclasses.replace(cfg, warmstart=warm, rl=dataclasses.replace(cfg.rl, num_steps=0))
  out.validate()
  return out


def seed(run: str, out: str, ws: int) -> bool:
  """Starts `out` from the run's checkpoint `ws` and its warm-start rows (unless `out` holds
  checkpoints already: a control in progress resumes from its own); returns whether it
  seeded. The checkpoint is copied into a temporary directory renamed into place, so a killed
  seeding leaves no half copy behind."""
  if os.path.exists(os.path.join(out, "checkpoints")):
    return False
  os.makedirs(out, exist_ok=True)
  rows = warmstart_rows(_rows(run), ws)
  with open(os.path.join(out, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  tmp = os.path.join(out, "checkpoints.tmp")
  shutil.rmtree(tmp, ignore_errors=True)  # a copy a killed seeding left half done
  shutil.copytree(os.path.join(run, "checkpoints", str(ws)), os.path.join(tmp, str(ws)))
  os.rename(tmp, os.path.join(out, "checkpoints"))
  return True


def _settings(cfg: config_lib.TrainConfig) -> dict[str, Any]:
  """The evaluation settings of an `eval/step_<N>.json` record of `cfg` (`eval_only`)."""
  return {"task": {"source": cfg.task.source, "path": cfg.task.path,
                   "eval_split": cfg.task.eval_split, "eval_size": cfg.task.eval_size},
          "eval": {"num_samples": cfg.eval.num_samples, "k": list(cfg.eval.k),
                   "temperature": cfg.eval.temperature,
                   "headroom_tasks": cfg.eval.headroom_tasks,
                   "headroom_train_tasks": cfg.eval.headroom_train_tasks},
          "seed": cfg.seed}


def evaluation(workdir: str, step: int, cfg: config_lib.TrainConfig, *, pool=None,
               workflow_factory=None) -> dict[str, Any]:
  """The `eval_only` record of checkpoint `step` of `workdir` (run with its `config.json`,
  `cfg`): read back when `eval/step_<step>.json` holds one with `cfg`'s settings, else
  evaluated (`eval_only.evaluate_checkpoint`, which writes it)."""
  path = os.path.join(workdir, "eval", f"step_{step}.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    if record.get("source") == "checkpoint" and record.get("step") == step and all(
        record.get(k) == v for k, v in _settings(cfg).items()):
      logging.info("read %s", path)
      return record
    logging.warning("%s holds an evaluation with other settings: evaluating again", path)
  return eval_only.evaluate_checkpoint(workdir, step, pool=pool,
                                       workflow_factory=workflow_factory)


def _gain(before, after) -> dict[str, float]:
  gain, stderr = train.paired_gain(before, after)
  return {"gain": gain, "stderr": stderr}


def report(p: Plan, schedule: str, cfg: config_lib.TrainConfig, records: dict[str, Any],
           last_rl_row: dict[str, Any], control_rows: Sequence[dict[str, Any]], *, run: str,
           out: str) -> dict[str, Any]:
  """`control.json`: the plan, the settings and the paired gains from the three records
  (`warmstart`, `control`, `rl`: `eval_only` records).

  Raises:
    ControlError: the records are not of the same held-out tasks.
  """
  ids = {name: r["task_ids"] for name, r in records.items()}
  if len({json.dumps(v) for v in ids.values()}) != 1:
    raise ControlError(f"the evaluations are not of the same held-out tasks: {ids}")
  passed = {name: r["passed"] for name, r in records.items()}
  logged = {k: last_rl_row[f"eval/pass_at_1_gain{s}"] for k, s in (("gain", ""),
                                                                  ("stderr", "_stderr"))
            if f"eval/pass_at_1_gain{s}" in last_rl_row}
  return {
      "run": os.path.abspath(run), "out": os.path.abspath(out),
      "warmstart_step": p.ws, "control_step": p.control_step, "rl_step": p.rl_step,
      "steps": p.steps, "steps_from": p.steps_from, "rl_seconds": p.rl_seconds,
      "warmstart_seconds_per_step": p.warmstart_seconds_per_step,
      "control_seconds_per_step": seconds_per_step(
          [r for r in warmstart_rows(control_rows, p.control_step) if r["step"] > p.ws]),
      "schedule": schedule, "control_warmstart": dataclasses.asdict(cfg.warmstart),
      "eval_tasks": len(ids["rl"]), "task_ids": ids["rl"],
      "pass_at_1": {name: float(sum(v) / len(v)) for name, v in passed.items()},
      "gain": {"control": _gain(passed["warmstart"], passed["control"]),
               "rl": _gain(passed["warmstart"], passed["rl"]),
               "rl_minus_control": _gain(passed["control"], passed["rl"])},
      "rl_gain_logged": logged,
      "records": {name: os.path.join(os.path.abspath(r["workdir"]), "eval",
                                     f"step_{r['step']}.json") for name, r in records.items()},
  }


def markdown(r: dict[str, Any]) -> str:
  """The printed table of a `control.json` record (module docstring)."""
  how = (f"N = round(RL seconds {r['rl_seconds']:.1f} / {r['warmstart_seconds_per_step']:.3f} "
         f"s per warm-start step)" if r["steps_from"] == "budget" else "N from --steps")
  fmt = lambda g: f"{g['gain']:+.3f} ± {g['stderr']:.3f}"
  p, g = r["pass_at_1"], r["gain"]
  lines = [
      f"Warm-start control of {r['run']}: {r['steps']} more warm-start steps ({how}; learning "
      f"rate: {r['schedule']}), greedy pass@1 on the same {r['eval_tasks']} held-out tasks, "
      f"paired gains (mean per-task difference ± s.e.):", "",
      "| arm | global step | held-out pass@1 | paired gain over the warm-start |",
      "|---|---|---|---|",
      f"| warm-start | {r['warmstart_step']} | {p['warmstart']:.3f} | |",
      f"| control: {r['steps']} more warm-start steps | {r['control_step']} | "
      f"{p['control']:.3f} | {fmt(g['control'])} |",
      f"| RL | {r['rl_step']} | {p['rl']:.3f} | {fmt(g['rl'])} |", "",
      f"RL minus control (paired): {fmt(g['rl_minus_control'])}"]
  if "gain" in r["rl_gain_logged"] and "stderr" in r["rl_gain_logged"]:
    lines[-1] += f"; RL's gain as its run logged it: {fmt(r['rl_gain_logged'])}"
  return "\n".join(lines) + "\n"


def _check_out(out: str, p: Plan, schedule: str, cfg: config_lib.TrainConfig) -> None:
  """Refuses an out directory that holds a control of another plan."""
  done = os.path.join(out, DONE)
  if os.path.exists(done):
    with open(done, encoding="utf-8") as f:
      marker = json.load(f)
    if (marker.get("steps"), marker.get("schedule")) != (p.steps, schedule):
      raise ControlError(f"{out} holds a finished control of {marker.get('steps')} steps "
                         f"(schedule {marker.get('schedule')}), not {p.steps} ({schedule}): "
                         f"choose another --out")
  saved = os.path.join(out, "config.json")
  if os.path.exists(saved):
    with open(saved, encoding="utf-8") as f:
      had = json.load(f).get("warmstart")
    want = config_lib.to_dict(cfg)["warmstart"]
    if had != want:
      raise ControlError(f"{out} holds a control with warmstart {had}, not {want}: choose "
                         f"another --out")


def run_control(run: str, out: Optional[str] = None, steps: Optional[int] = None,
                schedule: str = "final", *, pool=None, workflow_factory=None
                ) -> dict[str, Any]:
  """Runs (or resumes, or reports again) the warm-start control of the finished run in `run`
  (module docstring); returns the `control.json` record, with `skipped` True when it was
  finished already.

  Args:
    run: the finished run's workdir.
    out: the control's directory (default `run/warmstart_control`).
    steps: N (default: from the RL phase's seconds).
    schedule: 'final' or 'stretched'.
    pool, workflow_factory: as `train.run`'s (tests).

  Raises:
    eval_only.WorkdirError: `run` is missing or holds no config.json.
    ControlError: see `plan`, `control_config`, `report`, and an out directory holding a
      control of another plan.
    run_lock.WorkdirLockedError: the run (or the control) is live in another process.
  """
  out = out or os.path.join(run, OUT_NAME)
  run_cfg = eval_only.saved_config(run)  # before the lock, which would create a missing `run`
  with run_lock.WorkdirLock(run):  # the run must not train while its checkpoints are read
    p = plan(run, run_cfg, steps)
    cfg = control_config(run_cfg, p.ws, p.steps, schedule)
    _check_out(out, p, schedule, cfg)
    if os.path.exists(os.path.join(out, DONE)):
      with open(os.path.join(out, REPORT), encoding="utf-8") as f:
        result = json.load(f)
      logging.info("the control in %s is finished: reporting it again", out)
      return dict(result, skipped=True)
    _train(run, out, p, cfg, pool, workflow_factory)
    records = {
        "warmstart": evaluation(run, p.ws, run_cfg, pool=pool,
                                workflow_factory=workflow_factory),
        "control": evaluation(out, p.control_step, cfg, pool=pool,
                              workflow_factory=workflow_factory),
        "rl": evaluation(run, p.rl_step, run_cfg, pool=pool, workflow_factory=workflow_factory)}
    result = report(p, schedule, cfg, records, final_rl_row(_rows(run)), _rows(out), run=run,
                    out=out)
    with open(os.path.join(out, REPORT), "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
    with open(os.path.join(out, DONE), "w", encoding="utf-8") as f:
      json.dump({"steps": p.steps, "schedule": schedule, "control_step": p.control_step}, f)
  return dict(result, skipped=False)


def _train(run: str, out: str, p: Plan, cfg: config_lib.TrainConfig, pool,
           workflow_factory) -> None:
  """Seeds `out` (once) and trains the control to `ws + N` (skipped once it is there)."""
  directory = os.path.join(out, "checkpoints")
  if checkpointer.Checkpointer.exists(directory):
    ckpt = checkpointer.Checkpointer(directory)
    try:
      if ckpt.intact_step() == p.control_step:
        return
    finally:
      ckpt.close()
  with run_lock.WorkdirLock(out):  # never seed under a control in progress
    if seed(run, out, p.ws):
      logging.info("seeded %s from checkpoint %d of %s", out, p.ws, run)
  logging.info("training the control in %s: warm-start steps %d to %d", out, p.ws,
               p.control_step)
  result = train.run(cfg, out, pool=pool, workflow_factory=workflow_factory,
                     stop_after=p.control_step)
  if result["step"] != p.control_step:
    raise ControlError(f"the control in {out} stopped at step {result['step']}, not "
                       f"{p.control_step}")


# The program's flags (`flags.FlagHolder`s), set by `define_flags`.
_RUN = _OUT = _STEPS = _SCHEDULE = None


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not _RUN.value:
    raise app.UsageError("--run is required: a finished run's workdir")
  try:
    result = run_control(_RUN.value, _OUT.value, _STEPS.value, _SCHEDULE.value)
  except (ControlError, eval_only.WorkdirError) as e:
    raise app.UsageError(str(e)) from e
  print(markdown(result), flush=True)
  print(f"written: {os.path.join(result['out'], REPORT)}", flush=True)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the program's flags (`--run`, `--out`, `--steps`, `--schedule`) on `flag_values`.

  Called when the module runs as a program, not on import: tests and other modules import this
  one next to programs that define the same flag names (tests/launch_imports_test.py). A test
  passes its own `flags.FlagValues()` and parses it before calling `main`.
  """
  global _RUN, _OUT, _STEPS, _SCHEDULE  # pylint: disable=global-statement
  _RUN = flags.DEFINE_string("run", None, "Workdir of a finished run (config.json, "
                             "metrics.jsonl, the warm-start's kept checkpoint).",
                             flag_values=flag_values)
  _OUT = flags.DEFINE_string("out", None, f"The control's directory (default: RUN/{OUT_NAME}).",
                             flag_values=flag_values)
  _STEPS = flags.DEFINE_integer("steps", None, "More warm-start steps (default: the RL phase's "
                                "seconds over the warm-start's seconds per step).",
                                flag_values=flag_values)
  _SCHEDULE = flags.DEFINE_enum("schedule", "final", SCHEDULES, "The control's learning rate: "
                                "'final' (the warm-start's final rate, constant) or 'stretched' "
                                "(its schedule over warmstart.steps + N, continued).",
                                flag_values=flag_values)


if __name__ == "__main__":
  define_flags()
  app.run(main)
