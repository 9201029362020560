"""`run(config, workdir)`: supervised warm-start, then Agentic GRPO, with evaluation and resume.

Read top to bottom, a run is (`_run`): build the components, restore the latest checkpoint,
warm-start (`warmstart.run_phase`), Agentic GRPO (`rl_phase.run_phase`), a final checkpoint,
the learning-curve plot. Periodic actions (log, eval, checkpoint) all go through
`session.periodic`. The same code runs one process and many: `train.coordination` is the only
place that knows the difference.

Phases (docs/design.md §1, §3):

1. **Warm-start** (`warmstart.steps` > 0): token cross-entropy on reference episodes of training
   tasks, so that a small model from scratch writes well-formed stages. Its final parameters
   are also the frozen reference policy of the KL term.
2. **Agentic GRPO** (`rl.num_steps` learner updates): the learner updates on provisional items
   as soon as a group completes a stage (before that batch's next stage is sampled) and on
   corrections once the final rewards arrive.

Evaluation on a fixed held-out split (`task.eval_split`, `task.eval_size` tasks; a smaller split:
each of its tasks once): greedy pass@1 every `eval.every` steps, at the end of the warm-start
and at the end; sampled pass@k (Chen et al., 2021) and the headroom of RL (pass@1 and pass@G
at the RL temperature, held-out and training tasks) at the end of the warm-start and at the end
(`evaluation.evaluate`).

Outputs in `workdir`: `metrics.jsonl` (one JSON object per logged step: `step` (global:
warm-start steps then RL steps), `phase` (`warmstart` | `rl`), losses, rewards per stage, clip
fraction, KL, entropy, tied groups, staleness drops, corrections, errors, tokens/s, episodes/s,
seconds, and `eval/...` and `headroom/...` when evaluated; the keys are listed in
`train/metric_rows.py`), TensorBoard events in `workdir/tb`, checkpoints in `workdir/checkpoints`
(everything needed to resume exactly), `config.json`, and `learning_curve.png` at the end. A
run restarted with the same workdir resumes where it stopped.

Multi-process runs (`jax.distributed`, one process per host): process `p` of `P` draws only its
own tasks (training stream positions `p, p + P, ...`; warm-start batches and held-out tasks
likewise split), runs its own episodes, sandbox work and `StagedReplay`, and contributes
`rows_per_update / P` rows to each global update batch; the agreements are
`train.coordination`'s. Process 0 writes metrics. Each process's replay, in-flight episodes
and data position go into the checkpoint as its own row (`checkpoint.checkpointer`).

Ends: SIGTERM / SIGINT finish the current step, write a checkpoint and raise
`preemption.Preempted`. A run that ends without doing what it was asked (the RL phase stopped
early, every update skipped as non-finite) returns the reason as `result["incomplete"]`.
"""

import json
import os
import time
from typing import Any, Callable, Optional

from absl import logging
from etils import epath
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import config_drift
from agentic_grpo import parallel
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import run_lock
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import metric_rows
from agentic_grpo.train import metrics as metrics_lib
from agentic_grpo.train import preemption
from agentic_grpo.train import rl_phase
from agentic_grpo.train import session as session_lib
from agentic_grpo.train import warmstart


def run(config, workdir: str, *, pool=None, workflow_factory=None,
        stop_after: Optional[int] = None, transfer_guard: str = "allow",
        on_start: Optional[Callable[[], None]] = None) -> dict[str, Any]:
  """Trains (or resumes) a run in `workdir`; returns the last evaluation and run facts.

  Args:
    config: a `TrainConfig` or a `ConfigDict` (validated by `config.from_config_dict`).
    workdir: output directory; an existing checkpoint there is resumed.
    pool: sandbox pool to use (default: a new `SandboxPool` from `config.sandbox`).
    workflow_factory: `(WorkflowConfig, pool) -> Workflow` (tests inject faults with it).
    stop_after: stop (after checkpointing) once this global step is reached, as if the
      process had been stopped there (tests of resume).
    transfer_guard: `jax.transfer_guard` level of the hot loop's device calls; tests pass
      "disallow" so that a hidden host-device copy fails loudly.
    on_start: called once the run has passed its startup checks (workdir lock, resume, model
      source, tasks, prompt lengths), before anything is written to `workdir` (the launcher
      prints the workdir and logs the config there, so that a refused run prints only its
      error).

  Returns:
    `step` (the last global step), `phase`, `seconds`, `warmstart_pass_at_1`,
    `final_pass_at_1`, `last_eval` (the last evaluation's metrics), `summary` (headroom,
    tied groups, entropy and RL episodes per second: `metrics.run_summary`), `state` (the
    learner state) and `incomplete`: None, or why the run did not do what it was asked.

  Raises:
    errors.InputError (a ValueError): an input mistake found before the first step, naming
      the field and the fix: an invalid config, a missing or unusable data file, model
      directory or checkpoint, an empty split, a model too short for `rl.buckets`;
      `components.StartupCheckError` (e.g. prompts too long for `rl.buckets`) is one.
    config_drift.ConfigDriftError: a resume whose config changes fields that the saved state
      depends on (`config_drift.FIXED`); the workdir's `config.json` is left as it was.
    preemption.Preempted: a SIGTERM / SIGINT stopped the run after a checkpoint.
    device.NonFiniteUpdatesError: `rl.max_skipped_updates` non-finite updates in a row.
    run_lock.WorkdirLockedError: another live process (or this one) runs in `workdir` (its
      holder named); nothing is written.
  """
  cfg = config if isinstance(config, config_lib.TrainConfig) else config_lib.from_config_dict(
      config)
  lock = _lock_workdir(workdir)
  try:
    return _locked_run(cfg, workdir, pool, workflow_factory, stop_after, transfer_guard,
                       on_start)
  finally:
    lock.release()


def _lock_workdir(workdir: str) -> run_lock.WorkdirLock:
  """One live run per workdir, whoever calls (the launcher, the ablation, a notebook): two
  would interleave checkpoints and metrics. Process 0 takes the lock; every process learns
  whether it got it, so all of them raise together.

  Raises:
    run_lock.WorkdirLockedError: another live process holds the workdir.
  """
  lock = run_lock.WorkdirLock(workdir, enabled=parallel.is_primary())
  try:
    lock.acquire()
    taken = None
  except run_lock.WorkdirLockedError as e:
    taken = e
  if not parallel.host_allgather(np.int64(taken is None)).all():
    lock.release()
    taken = taken or run_lock.WorkdirLockedError(workdir, {"host": "(see process 0)"})
  if taken is not None:
    raise taken
  return lock


def _locked_run(cfg, workdir, pool, workflow_factory, stop_after, transfer_guard, on_start):
  check_resume(cfg, workdir)
  own_pool = pool is None
  # The model source, tasks and prompt lengths are checked here, before any device memory is
  # spent and before anything is written into the workdir.
  comp = components_lib.build(cfg, pool=pool, workflow_factory=workflow_factory)
  try:
    if on_start is not None:
      on_start()
    save_config(cfg, workdir)
    with preemption.StopRequest() as stop:
      return _run(comp, workdir, stop_after, stop, transfer_guard)
  finally:
    if own_pool:
      comp.pool.close()


def check_resume(cfg: config_lib.TrainConfig, workdir: str) -> None:
  """Checks a resume's config against the workdir's saved one (nothing to check when fresh).

  Raises:
    config_drift.ConfigDriftError: see `run`; `config.json` is then left as it was.
  """
  saved = epath.Path(workdir) / "config.json"
  if saved.exists() and checkpointer.Checkpointer.exists(os.path.join(workdir, "checkpoints")):
    for change in config_drift.check(json.loads(saved.read_text()), cfg, where=workdir):
      logging.info("resuming with config.%s", change)


def save_config(cfg: config_lib.TrainConfig, workdir: str) -> None:
  """Writes the accepted config as the workdir's `config.json` (process 0)."""
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  if parallel.is_primary():
    (epath.Path(workdir) / "config.json").write_text(
        json.dumps(config_lib.to_dict(cfg), indent=1))


def _run(comp: components_lib.Components, workdir: str, stop_after: Optional[int],
         stop: preemption.StopRequest, transfer_guard: str) -> dict[str, Any]:
  s = session_lib.Session(comp, workdir, stop_after=stop_after, stop=stop,
                          transfer_guard=transfer_guard)
  try:
    s.restore()
    warmstart.run_phase(s)
    rl = rl_phase.run_phase(s)
    s.checkpoint(force=True, rl_phase=rl.state_dict if s.phase == "rl" else None)
  finally:
    s.close()
  if s.preempted:
    raise preemption.Preempted(s.step, s.signal_name or "a signal")
  if comp.cfg.log.plot and not s.stopping() and s.coord.is_primary:
    metrics_lib.plot_learning_curve(s.metrics.history,
                                    os.path.join(workdir, "learning_curve.png"))
  warm = next((r for r in s.metrics.history if r.get("phase") == "warmstart"
               and "eval/pass_at_1" in r), {})
  return {"step": s.step, "phase": s.phase, "seconds": time.time() - s.t_start,
          "warmstart_pass_at_1": warm.get("eval/pass_at_1"),
          "final_pass_at_1": s.metrics.pass1, "last_eval": s.last_eval,
          "summary": metric_rows.run_summary(s.metrics.history),
          "state": s.device.state, "incomplete": rl.verdict()}
