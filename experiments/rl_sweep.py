r"""RL settings compared over seeds: each arm's RL phase from every run's own warm-start.

One run's paired gain has a standard error that counts only the held-out tasks' sampling; the
RL trajectory itself (which groups were drawn, which tokens sampled) moves a seed's gain by more
than that (docs/learning.md: a standard deviation of 0.04 over four seeds against 0.015 within
one run). A setting is judged here by its gain over several seeds, each seed's arms starting
from the same warm-start checkpoint, and compared with the runs' own RL phases seed by seed:

    python -m experiments.rl_sweep --runs=W0,W1,W2,W3 --root=DIR \
        --arm='lr3: optim.learning_rate=3e-4' --arm='g16: rl.group_size=16 rl.tasks_per_batch=8'

* **The runs** (`--runs`): finished runs of one config with different `seed`s, each with its
  warm-start's last checkpoint kept (`checkpoint.keep_warmstart`, the default), e.g. `make train
  ARGS=--config.seed=S` for S = 0..3. Their own RL phases are the reference arm, `run`. Runs
  whose saved configs differ in any field but `seed` and `log.*` are refused, naming the fields.
* **An arm** (`--arm='NAME: SECTION.FIELD=VALUE ...'`, overrides separated by spaces): the run's
  saved config with the overrides, its RL phase trained in `ROOT/NAME/seedS` from a copy of the
  run's warm-start checkpoint and warm-start rows (`warmstart_control.seed`), as `make train`
  would have continued with those settings. Overrides of `seed`, `model`, `task` and `warmstart`
  are refused: they would change the warm-start or the held-out tasks the gains are paired on.
  A finished arm-seed leaves `done.json` and is read, not trained, when the command runs
  again; an unfinished one resumes from its own checkpoint (`train.run`), so a sweep can span
  sittings. Copies of the command with different arms can run side by side on one root (each
  arm-seed holds its workdir's lock while it trains); a last run with every arm, all finished,
  writes the whole report.
* **The report** (`ROOT/sweep.md` and `ROOT/sweep.json`): per arm and seed the final held-out
  greedy pass@1 and its paired gain over the warm-start (± the run's own paired standard
  error, `train.paired_gain`); per arm the mean gain over seeds ± its standard error over
  seeds (`std(ddof=1) / sqrt(S)`, the trajectories' spread included); and per arm its paired
  difference from `run`, seed by seed (both from the same warm-start and evaluated on the same
  held-out tasks), as mean ± standard error over seeds.

Each arm-seed's evaluation is its run's settings' (`eval.*`), unless the arm overrides them
(e.g. `eval.num_samples=0 eval.headroom_tasks=0` for greedy pass@1 alone, which is all the
report reads).
"""

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import config_drift
from agentic_grpo import train
from agentic_grpo.checkpoint import run_lock
from agentic_grpo.train import eval_only
from experiments import warmstart_control

DONE = "done.json"
ARM = "arm.json"  # written when an arm-seed is seeded: what it trains
REFERENCE = "run"
# Config sections an arm may not override: they would change the warm-start, the held-out tasks
# its gain is paired on, or how they are judged. Of `workflow`, only the fields of `WORKFLOW_OK`
# (how RL credits the episodes, not what an episode is or how it is judged).
FROZEN = ("seed", "model", "task", "warmstart", "sandbox", "workflow")
WORKFLOW_OK = ("workflow.stage_rewards", "workflow.reward_mode",
               "workflow.final_reward_delay_s", "workflow.final_reward_jitter_s")


class SweepError(ValueError):
  """The sweep cannot run as asked (a malformed arm, a run without a kept warm-start
  checkpoint, two runs of one seed, ...); the message says why."""


@dataclasses.dataclass(frozen=True)
class Arm:
  """A named set of config overrides (`SECTION.FIELD=VALUE` strings)."""
  name: str
  overrides: tuple[str, ...]


def parse_arm(text: str) -> Arm:
  """`'NAME: SECTION.FIELD=VALUE ...'` (overrides separated by whitespace) as an `Arm`.

  Raises:
    SweepError: no `:`, a name that is empty, `run` or not a plain word (letters, digits, `_`,
      `-`, `.`), no overrides, an override without `=`, or one of a `FROZEN` section (but
      `WORKFLOW_OK`'s).
  """
  name, sep, rest = text.partition(":")
  name, overrides = name.strip(), tuple(rest.split())
  if not sep:
    raise SweepError(f"--arm must be 'NAME: SECTION.FIELD=VALUE ...', got {text!r}")
  if (not name or name == REFERENCE
      or not all(ch.isalnum() or ch in "_-." for ch in name) or name.startswith(".")):
    raise SweepError(f"arm name must be a plain word (letters, digits, _ - .), not "
                     f"{REFERENCE!r}, got {name!r}")
  if not overrides:
    raise SweepError(f"arm {name!r} has no overrides: its runs would be the runs' own "
                     f"(the reference arm {REFERENCE!r})")
  for item in overrides:
    path = item.partition("=")[0]
    if "=" not in item:
      raise SweepError(f"arm {name!r}: override {item!r} must be SECTION.FIELD=VALUE")
    if path.split(".")[0] in FROZEN and path.strip() not in WORKFLOW_OK:
      raise SweepError(f"arm {name!r}: override {item!r} changes {path.split('.')[0]!r}, which "
                       f"would change the warm-start, the held-out tasks or their judging "
                       f"(refused: {FROZEN}, except {WORKFLOW_OK})")
  return Arm(name, overrides)


def arm_config(run_cfg: config_lib.TrainConfig, arm: Arm) -> config_lib.TrainConfig:
  """The run's saved config with the arm's overrides, validated.

  Raises:
    SweepError: an override that names no field or has the wrong type, or a config that does
      not validate (the message names the field).
  """
  c = ml_collections.ConfigDict(config_lib.to_dict(run_cfg))
  try:
    config_lib.apply_overrides(c, arm.overrides)
    return config_lib.from_config_dict(c)
  except ValueError as e:
    raise SweepError(f"arm {arm.name!r}: {e}") from e


def workdir(root: str, arm: str, seed: int) -> str:
  return os.path.join(root, arm, f"seed{seed}")


def final_result(rows: Sequence[dict[str, Any]]) -> Optional[dict[str, float]]:
  """The last evaluated RL row's held-out numbers: `step`, `pass_at_1`, `gain`, `stderr` (its
  paired gain over the warm-start) and `warmstart` (the warm-start's pass@1); None when no RL
  row holds an evaluation with a paired gain."""
  warm = next((r["eval/pass_at_1"] for r in rows
               if r.get("phase") == "warmstart" and "eval/pass_at_1" in r), None)
  done = [r for r in rows if r.get("phase") == "rl" and "eval/pass_at_1_gain" in r]
  if not done or warm is None:
    return None
  r = done[-1]
  return {"step": int(r["step"]), "pass_at_1": float(r["eval/pass_at_1"]),
          "gain": float(r["eval/pass_at_1_gain"]),
          "stderr": float(r["eval/pass_at_1_gain_stderr"]), "warmstart": float(warm)}


def _rows(wd: str) -> list[dict[str, Any]]:
  return warmstart_control._rows(wd)  # pylint: disable=protected-access


def run_result(run: str, cfg: config_lib.TrainConfig) -> dict[str, float]:
  """The reference arm's result: the finished run's own final evaluation.

  Raises:
    SweepError: the run has not finished its RL phase (its last RL step is not
      `warmstart.steps + rl.num_steps`, or it has no evaluated RL row).
  """
  result = final_result(_rows(run))
  want = cfg.warmstart.steps + cfg.rl.num_steps
  if result is None or result["step"] != want:
    raise SweepError(f"{run} has not finished its RL phase (its last evaluated RL step is "
                     f"{None if result is None else result['step']}, not {want})")
  return result


@contextlib.contextmanager
def _run_locked(run: str, wait_s: float = 60.0):
  """Holds the run's workdir lock, waiting up to `wait_s` for it: a copy of this command with
  other arms may hold it while it copies the same warm-start checkpoint (a second or so); a
  run still training holds it for longer, and then this raises `WorkdirLockedError`."""
  deadline = time.monotonic() + wait_s
  while True:
    try:
      lock = run_lock.WorkdirLock(run).acquire()
      break
    except run_lock.WorkdirLockedError:
      if time.monotonic() > deadline:
        raise
      time.sleep(0.5)
  try:
    yield
  finally:
    lock.release()


def run_arm(run: str, root: str, arm: Arm, *, pool=None, workflow_factory=None
            ) -> dict[str, Any]:
  """Trains (or resumes, or reads back) `arm`'s RL phase from the warm-start of `run`; returns
  its `done.json` record (`final_result`'s fields, with `skipped` True when it was finished
  already).

  Raises:
    eval_only.WorkdirError: `run` is missing or holds no config.json.
    warmstart_control.ControlError: `run` has no kept, intact warm-start checkpoint.
    SweepError: see `arm_config`; an arm workdir holding (finished or not) another arm or
      another run's; an arm run that stopped before its last step.
    run_lock.WorkdirLockedError: the run is training (its lock held for over a minute), or the
      arm-seed is live in another process.
  """
  run = os.path.realpath(run)
  run_cfg = eval_only.saved_config(run)
  cfg = arm_config(run_cfg, arm)
  wd = workdir(root, arm.name, run_cfg.seed)
  done = os.path.join(wd, DONE)
  what = {"overrides": list(arm.overrides), "run": run}
  for name in (DONE, ARM):  # finished, or seeded and perhaps half trained
    path = os.path.join(wd, name)
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        record = json.load(f)
      if {k: record.get(k) for k in what} != what:
        raise SweepError(f"{wd} holds arm {record.get('overrides')} from {record.get('run')}, "
                         f"not {what['overrides']} from {run}: choose another --root or arm "
                         f"name")
      if name == DONE:
        return dict(record, skipped=True)
      break
  ws = run_cfg.warmstart.steps
  with _run_locked(run):  # the run must not train while its checkpoint is copied
    warmstart_control.plan(run, run_cfg, steps=1)  # a kept, intact warm-start checkpoint
    with run_lock.WorkdirLock(wd):
      if warmstart_control.seed(run, wd, ws):
        _write_json(os.path.join(wd, ARM), what)
        logging.info("seeded %s from checkpoint %d of %s", wd, ws, run)
  out = train.run(cfg, wd, pool=pool, workflow_factory=workflow_factory)
  want = ws + cfg.rl.num_steps
  result = final_result(_rows(wd))
  if out["step"] != want or result is None or result["step"] != want:
    raise SweepError(f"arm {arm.name!r} in {wd} stopped at step {out['step']}, not {want}")
  record = dict(result, arm=arm.name, seed=run_cfg.seed, **what)
  _write_json(done, record)
  return dict(record, skipped=False)


def _write_json(path: str, value: Any) -> None:
  """Writes `value` to `path` whole or not at all (a temporary file renamed into place)."""
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(value, f, indent=1)
  os.replace(path + ".tmp", path)


def _paired(before: Sequence[float], after: Sequence[float]) -> tuple[float, Optional[float]]:
  """`train.paired_gain` over seeds: the mean of `after - before` and its standard error
  (None with fewer than two seeds, the mean alone)."""
  if len(after) < 2:
    return (sum(after) - sum(before)) / len(after), None
  return train.paired_gain(np.asarray(before, float), np.asarray(after, float))


def summarise(results: dict[str, dict[int, dict[str, float]]]) -> dict[str, Any]:
  """Per arm: the mean gain over seeds and its standard error, and the paired difference from
  the reference arm (`run`) over the seeds both have.

  Args:
    results: `{arm: {seed: final_result}}`, with `run` among the arms.

  Returns:
    `{arm: {"seeds", "gain", "gain_se", "pass_at_1", "diff", "diff_se"}}` (`*_se` None with
    fewer than two seeds; `diff` 0 for `run` itself).
  """
  ref = results[REFERENCE]
  out = {}
  for arm, by_seed in results.items():
    seeds = sorted(by_seed)
    gain, gain_se = _paired([0.0] * len(seeds), [by_seed[s]["gain"] for s in seeds])
    shared = [s for s in seeds if s in ref]
    diff, diff_se = _paired([ref[s]["pass_at_1"] for s in shared],
                            [by_seed[s]["pass_at_1"] for s in shared])
    out[arm] = {"seeds": seeds, "gain": gain, "gain_se": gain_se,
                "pass_at_1": sum(by_seed[s]["pass_at_1"] for s in seeds) / len(seeds),
                "diff": diff, "diff_se": diff_se}
  return out


def _pm(x: float, se: Optional[float]) -> str:
  return f"{x:+.3f}" + ("" if se is None else f" ± {se:.3f}")


def markdown(results: dict[str, dict[int, dict[str, float]]], arms: Sequence[Arm]) -> str:
  """`sweep.md`: the per-seed table and the per-arm summary."""
  summary = summarise(results)
  seeds = sorted({s for by in results.values() for s in by})
  overrides = {a.name: " ".join(a.overrides) for a in arms}
  overrides[REFERENCE] = "(the runs' own RL phase)"
  lines = ["| arm | overrides | " + " | ".join(f"seed {s}" for s in seeds)
           + " | mean gain ± s.e. (seeds) | minus `run`, paired by seed |",
           "|---|---|" + "---|" * len(seeds) + "---|---|"]
  for arm, by_seed in results.items():
    cells = [f"{by_seed[s]['pass_at_1']:.3f} ({by_seed[s]['gain']:+.3f} ± "
             f"{by_seed[s]['stderr']:.3f})" if s in by_seed else "" for s in seeds]
    m = summary[arm]
    diff = "" if arm == REFERENCE else _pm(m["diff"], m["diff_se"])
    lines.append(f"| {arm} | {overrides[arm]} | " + " | ".join(cells)
                 + f" | {_pm(m['gain'], m['gain_se'])} | {diff} |")
  warm = {s: next(by[s]["warmstart"] for by in results.values() if s in by) for s in seeds}
  lines += ["", "Cells: held-out greedy pass@1 at the end (paired gain over the warm-start ± "
            "its standard error over held-out tasks). Warm-starts: "
            + ", ".join(f"seed {s} {warm[s]:.3f}" for s in seeds) + "."]
  return "\n".join(lines) + "\n"


# Config fields the runs may differ in besides `seed`: how a run reports, not what it computes.
RUN_FREE = ("log.",)


def _check_one_config(cfgs: dict[str, config_lib.TrainConfig]) -> None:
  """Raises `SweepError` naming the fields where two runs' configs differ (other than `seed`
  and `RUN_FREE`; `config_drift.changes`): the report pairs arms with the runs seed by seed, as
  one config's seeds."""
  (first, first_cfg), *rest = cfgs.items()
  saved = json.loads(json.dumps(config_lib.to_dict(dataclasses.replace(first_cfg, seed=0))))
  for run, cfg in rest:
    differ = [c for c in config_drift.changes(saved, dataclasses.replace(cfg, seed=0))
              if not c.field.startswith(RUN_FREE)]
    if differ:
      raise SweepError(
          f"the runs must be seeds of one config, but {run} differs from {first} in "
          + ", ".join(f"{c.field} ({c.old!r} against {c.new!r})" for c in differ))


def sweep(runs: Sequence[str], root: str, arms: Sequence[Arm], *, pool=None,
          workflow_factory=None) -> dict[str, Any]:
  """Runs every (arm, run) not finished yet, then writes and returns the report
  (`sweep.json`: `results` `{arm: {seed: final_result}}`, `summary`, `markdown`).

  Raises:
    SweepError: no runs, two runs of one seed, runs whose configs differ in more than the seed
      (and `RUN_FREE`), two arms of one name, or as `run_result` and `run_arm`.
  """
  if not runs:
    raise SweepError("--runs must name at least one finished run's workdir")
  names = [a.name for a in arms]
  if len(set(names)) != len(names):
    raise SweepError(f"arm names must differ, got {names}")
  seeds = [eval_only.saved_config(run).seed for run in runs]
  if len(set(seeds)) != len(seeds):
    raise SweepError(f"the runs must have different seeds, got "
                     f"{dict(zip(runs, seeds, strict=True))}")
  runs = [os.path.realpath(r) for r in runs]
  cfgs = {run: eval_only.saved_config(run) for run in runs}
  _check_one_config(cfgs)
  results: dict[str, dict[int, dict[str, float]]] = {
      REFERENCE: {cfgs[r].seed: run_result(r, cfgs[r]) for r in runs}}
  for arm in arms:
    results[arm.name] = {}
    for run in runs:
      record = run_arm(run, root, arm, pool=pool, workflow_factory=workflow_factory)
      results[arm.name][cfgs[run].seed] = {k: record[k] for k in
                                           ("step", "pass_at_1", "gain", "stderr", "warmstart")}
      logging.info("arm %s seed %d: pass@1 %.3f (gain %+.3f)%s", arm.name, cfgs[run].seed,
                   record["pass_at_1"], record["gain"], " (read back)" if record["skipped"]
                   else "")
  text = markdown(results, arms)
  report = {"runs": list(runs), "arms": {a.name: list(a.overrides) for a in arms},
            "results": {a: {str(s): v for s, v in by.items()} for a, by in results.items()},
            "summary": summarise(results), "markdown": text}
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "sweep.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(root, "sweep.md"), "w", encoding="utf-8") as f:
    f.write(text)
  return report


# The program's flags (`flags.FlagHolder`s), set by `define_flags`.
_RUNS = _ROOT = _ARMS = None


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not _RUNS.value or not _ROOT.value:
    raise app.UsageError("--runs and --root are required")
  try:
    arms = [parse_arm(a) for a in _ARMS.value or ()]
    report = sweep(list(_RUNS.value), _ROOT.value, arms)
  except (SweepError, warmstart_control.ControlError, eval_only.WorkdirError,
          config_drift.ConfigDriftError) as e:
    raise app.UsageError(str(e)) from e
  except run_lock.WorkdirLockedError as e:
    raise app.UsageError(f"{e} (a run's lock is held while it trains, or while "
                         f"experiments.warmstart_control works on it: rerun the sweep when it "
                         f"is done; finished arm-seeds are read back)") from e
  print(report["markdown"], flush=True)
  print(f"written: {os.path.join(_ROOT.value, 'sweep.md')}", flush=True)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines `--runs`, `--root` and `--arm` on `flag_values` (called when the module runs as a
  program, not on import: see `warmstart_control.define_flags`)."""
  global _RUNS, _ROOT, _ARMS  # pylint: disable=global-statement
  _RUNS = flags.DEFINE_list("runs", None, "Workdirs of finished runs of one config, one per seed "
                            "(each with its warm-start's kept checkpoint).",
                            flag_values=flag_values)
  _ROOT = flags.DEFINE_string("root", None, "Where the arms' workdirs and the report go.",
                              flag_values=flag_values)
  _ARMS = flags.DEFINE_multi_string("arm", [], "An arm: 'NAME: SECTION.FIELD=VALUE ...'.",
                                    flag_values=flag_values)


if __name__ == "__main__":
  define_flags()
  app.run(main)
