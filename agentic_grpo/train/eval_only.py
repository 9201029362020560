"""Evaluation without training: a run's checkpoint, or a model as loaded (`launch/evaluate.py`).

Two entry points, both through `evaluation.evaluate` (greedy pass@1 with its standard error,
hidden-test fraction, stage rewards and sampled pass@k, the unbiased estimator of Chen et al.,
2021, over `eval.num_samples` samples per held-out task):

* `evaluate_checkpoint(workdir, step)`: checkpoint `step` (the newest intact one when None) of
  the run in `workdir`, with the run's saved `config.json`. With the run's settings the result
  is the run's own evaluation of that step (same tasks, sampler batch and keys); an RL step's
  also has the paired gain over the warm-start's per-task results (saved in the checkpoint).
* `evaluate_model(cfg, workdir)`: the initial policy of `cfg` (`model.source='hf'`: a Hugging
  Face checkpoint as loaded; `preset`: the random init from `seed`), into a workdir that holds
  no checkpoint; recorded as step 0, its config saved as the workdir's `config.json` (as a run
  would) unless one is there already.

`with_overrides` changes the evaluation settings (`eval.num_samples`, `eval.k`,
`eval.temperature`, `task.eval_size`) of either.

Outputs (process 0), in `workdir`:
* `eval/step_<N>.json`: the settings, every metric (`eval/...`, as in training rows), the
  held-out task ids and their greedy results (`passed`);
* one row of `metrics.jsonl`, `{"step": N, "phase": "eval_only", "eval_only/<metric>": ...}`:
  the metric names with the `eval/` prefix replaced by `eval_only/`, so that a training run's
  own `eval/` curves and plots are unchanged; the row is appended (one write), so it may be
  written while the run trains;
* the same scalars as TensorBoard tags `eval_only/...` in `workdir/tb` (with
  `log.tensorboard`, local workdirs).
"""

import dataclasses
import json
import math
import os
from typing import Any, Callable, Optional, Sequence

from etils import epath
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import exit_codes
from agentic_grpo import parallel
from agentic_grpo.agent import loop as loop_lib
from agentic_grpo.agent import streams
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import run_lock
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import device as device_lib
from agentic_grpo.train import evaluation
from agentic_grpo.train import sampling
from agentic_grpo.train import session as session_lib

PHASE = "eval_only"
PREFIX = "eval_only/"


class WorkdirError(errors.InputError):
  """The workdir cannot be evaluated as asked (missing, no config.json, or it holds checkpoints
  that a model evaluation would sit beside): an input mistake (`errors.InputError`)."""


class WorkdirHeldError(WorkdirError):
  """A live run holds the workdir a model evaluation would write to (the message names it);
  reported with `exit_codes.WORKDIR_LOCKED`, as `launch.train` reports it."""
  exit_code = exit_codes.WORKDIR_LOCKED


def saved_config(workdir: str) -> config_lib.TrainConfig:
  """The run's `config.json`, validated.

  Raises:
    WorkdirError: no directory `workdir`, no `config.json` in it, or one that is not a JSON
      object.
    ValueError: an invalid saved config (naming the field; a field an older version saved
      and this one lacks is unknown; one it lacks takes its default).
  """
  path = epath.Path(workdir)
  if not path.is_dir():
    raise WorkdirError(f"workdir {workdir} does not exist")
  file = path / "config.json"
  if not file.exists():
    raise WorkdirError(f"no config.json in workdir {workdir}: not a run's workdir")
  try:
    data = json.loads(file.read_text())
  except ValueError as e:  # not UTF-8, or not JSON (a write cut short)
    raise WorkdirError(f"{file} is not readable JSON: {e}") from e
  if not isinstance(data, dict):
    raise WorkdirError(f"{file} holds a {type(data).__name__}, not a config object")
  return config_lib.from_config_dict(data)


def with_overrides(cfg: config_lib.TrainConfig, *, num_samples: Optional[int] = None,
                   k: Optional[Sequence[int]] = None, eval_size: Optional[int] = None,
                   temperature: Optional[float] = None) -> config_lib.TrainConfig:
  """`cfg` with the given evaluation settings replaced (None keeps the config's).

  Raises:
    ValueError: a setting out of range, naming its config field (e.g. `config.eval.k`).
  """
  ev = {name: v for name, v in (("num_samples", num_samples), ("temperature", temperature),
                                ("k", None if k is None else tuple(int(x) for x in k)))
        if v is not None}
  out = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, **ev))
  if eval_size is not None:
    out = dataclasses.replace(out, task=dataclasses.replace(out.task, eval_size=eval_size))
  out.validate()
  return out


def checkpoint_step(workdir: str, step: Optional[int]) -> int:
  """The step to evaluate: `step`, checked to be there, or the newest intact one when None.

  Raises:
    checkpointer.MissingCheckpointError: no checkpoint at all, or none at `step` (listing the
      steps there).
    checkpointer.CheckpointIntegrityError: checkpoints exist but none is intact (`step` None),
      or checkpoint `step` is damaged.
  """
  directory = os.path.join(workdir, "checkpoints")
  if not checkpointer.Checkpointer.exists(directory):
    raise checkpointer.MissingCheckpointError(f"no checkpoint in {directory}")
  ckpt = checkpointer.Checkpointer(directory)
  try:
    return int(ckpt.intact_step()) if step is None else ckpt.require(step)
  finally:
    ckpt.close()


def evaluate_checkpoint(workdir: str, step: Optional[int] = None, *,
                        cfg: Optional[config_lib.TrainConfig] = None, pool=None,
                        workflow_factory=None,
                        on_start: Optional[Callable[[], None]] = None) -> dict[str, Any]:
  """Evaluates checkpoint `step` of the run in `workdir`; writes and returns the result.

  Args:
    workdir: the run's directory (`config.json`, `checkpoints/`).
    step: the checkpoint's global step; None: the newest intact one.
    cfg: the config to evaluate with (default: the saved one); e.g.
      `with_overrides(saved_config(workdir), ...)`. Its model must be the run's.
    pool: a sandbox pool to use (default: a new one from `cfg.sandbox`, closed at the end).
    workflow_factory: as `train.run`'s (tests).
    on_start: as `train.run`'s: called once the startup checks (config, checkpoint, model
      source, tasks, prompt lengths) have passed, before the evaluation.

  Returns:
    The record written to `eval/step_<N>.json` (see `_record`).

  Raises:
    WorkdirError, checkpointer.MissingCheckpointError,
      checkpointer.CheckpointIntegrityError: see `saved_config` and `checkpoint_step`.
    ValueError: an invalid config, or a checkpoint whose shapes are not the config's.
  """
  cfg = cfg if cfg is not None else saved_config(workdir)
  step = checkpoint_step(workdir, step)
  ckpt = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))

  def params_of(comp):
    params, meta = device_lib.restore_policy(comp, ckpt, step)
    warm = meta.get("warmstart_passed")  # the baseline of an RL step's paired gain
    if warm is None or meta["phase"] != "rl":
      return params, None
    return params, np.asarray(warm, bool)

  try:
    return _evaluate(cfg, workdir, step, "checkpoint", params_of, pool, workflow_factory,
                     on_start)
  finally:
    ckpt.close()


def evaluate_model(cfg: config_lib.TrainConfig, workdir: str, *, pool=None,
                   workflow_factory=None,
                   on_start: Optional[Callable[[], None]] = None) -> dict[str, Any]:
  """Evaluates the initial policy of `cfg` (e.g. a Hugging Face checkpoint as loaded) as step 0.

  `pool`, `workflow_factory`, `on_start`: as `evaluate_checkpoint`'s.

  Raises:
    WorkdirError: `workdir` holds a run's checkpoints (evaluate them with
      `evaluate_checkpoint`, or choose another workdir); `WorkdirHeldError`, one, when a live
      run holds its lock.
    ValueError: an invalid config or model source (naming the field or file).
  """
  if checkpointer.Checkpointer.exists(os.path.join(workdir, "checkpoints")):
    raise WorkdirError(f"workdir {workdir} holds a run's checkpoints: evaluate them without a "
                       f"config, or give a fresh workdir to evaluate the model as loaded")
  # It writes config.json and step 0 as a run would: not into a run's workdir while it runs.
  lock = run_lock.WorkdirLock(workdir, enabled=parallel.is_primary())
  try:
    lock.acquire()
  except run_lock.WorkdirLockedError as e:
    raise WorkdirHeldError(str(e)) from e
  try:
    return _evaluate(cfg, workdir, 0, "model",
                     lambda comp: (device_lib.initial_policy(comp), None), pool,
                     workflow_factory, on_start)
  finally:
    lock.release()


def _evaluate(cfg, workdir, step, source, params_of, pool, workflow_factory,
              on_start=None) -> dict[str, Any]:
  """Builds the run's components, evaluates `params_of(comp)`, writes the outputs."""
  comp = components_lib.build(cfg, pool=pool, workflow_factory=workflow_factory)
  try:
    if on_start is not None:
      on_start()
    params, baseline = params_of(comp)
    agent = _agent(comp)
    try:
      metrics, passed = evaluation.evaluate(comp, agent, params, sampled=True,
                                            baseline=baseline)
    finally:
      agent.close()
  finally:
    if pool is None:
      comp.pool.close()
  record = _record(comp, workdir, step, source, metrics, passed)
  if comp.coord.is_primary:
    _write(cfg, workdir, record)
  return record


def _agent(comp: components_lib.Components) -> loop_lib.AgentLoop:
  """An agent loop shaped as the run's (`Session`'s): the same sampler batch `B * G` and
  sampling keys, so that evaluations match the run's own. Its replay and stream stay unused."""
  cfg = comp.cfg
  stream = streams.TaskStream(lambda i: comp.tasks.task("train", i),
                              pool_size=cfg.task.train_size, seed=cfg.seed)
  return loop_lib.AgentLoop(
      workflow_factory=comp.workflow_factory, tokenizer=comp.tokenizer,
      replay=session_lib.make_replay(comp), stream=stream,
      sample_fn=sampling.make_sample_fn(comp, cfg.seed),
      tasks_per_batch=cfg.rl.tasks_per_batch, group_size=cfg.rl.group_size,
      batches_in_flight=1, max_context=cfg.rl.buckets[-1],
      max_new_tokens=cfg.workflow.max_new_tokens, stage_rewards=cfg.workflow.stage_rewards)


def _record(comp, workdir, step, source, metrics, passed) -> dict[str, Any]:
  """The JSON record of one evaluation: what was evaluated, how, and every number."""
  cfg = comp.cfg
  # Each held-out task once: `task.eval_size`, or the whole split when it is smaller.
  ids = [comp.tasks.task(cfg.task.eval_split, i).task_id for i in range(comp.eval_count)]
  return {"step": int(step), "source": source, "workdir": str(workdir),
          "model": {"source": cfg.model.source, "path": cfg.model.path,
                    "preset": cfg.model.preset},
          "task": {"source": cfg.task.source, "path": cfg.task.path,
                   "eval_split": cfg.task.eval_split, "eval_size": cfg.task.eval_size},
          "eval": {"num_samples": cfg.eval.num_samples, "k": list(cfg.eval.k),
                   "temperature": cfg.eval.temperature,
                   "headroom_tasks": cfg.eval.headroom_tasks,
                   "headroom_train_tasks": cfg.eval.headroom_train_tasks},
          "seed": cfg.seed, "metrics": {k: float(v) for k, v in metrics.items()},
          "task_ids": ids, "passed": [int(p) for p in passed]}


def _write(cfg: config_lib.TrainConfig, workdir: str, record: dict[str, Any]) -> None:
  """`eval/step_<N>.json`, a `metrics.jsonl` row and TensorBoard scalars (module docstring)."""
  root = epath.Path(workdir)
  (root / "eval").mkdir(parents=True, exist_ok=True)
  if record["source"] == "model" and not (root / "config.json").exists():
    (root / "config.json").write_text(json.dumps(config_lib.to_dict(cfg), indent=1))
  (root / "eval" / f"step_{record['step']}.json").write_text(json.dumps(record, indent=1))
  row = {"step": record["step"], "phase": PHASE}
  row.update(metric_row(record["metrics"]))
  line = json.dumps(row) + "\n"
  metrics_file = root / "metrics.jsonl"
  if "://" in str(workdir):  # objects cannot be appended to
    old = metrics_file.read_text() if metrics_file.exists() else ""
    metrics_file.write_text(old + line)
    return
  with open(os.fspath(metrics_file), "a", encoding="utf-8") as f:
    f.write(line)
  if cfg.log.tensorboard:
    import tensorboardX  # pylint: disable=g-import-not-at-top
    with tensorboardX.SummaryWriter(os.path.join(workdir, "tb")) as tb:
      for k, v in row.items():
        if k not in ("step", "phase") and math.isfinite(v):
          tb.add_scalar(k, v, row["step"])


def metric_row(metrics: dict[str, float]) -> dict[str, float]:
  """Evaluation metrics renamed for `metrics.jsonl` and TensorBoard: `eval/x` -> `eval_only/x`."""
  return {PREFIX + k.split("/", 1)[1] if k.startswith("eval/") else PREFIX + k: float(v)
          for k, v in metrics.items()}


def summary(record: dict[str, Any]) -> str:
  """One line: what was evaluated, greedy pass@1 ± s.e., the paired gain, sampled pass@k."""
  m = record["metrics"]
  what = (f"checkpoint {record['step']} of {record['workdir']}" if record["source"] ==
          "checkpoint" else f"{record['model']['path'] or record['model']['preset']} as loaded")
  count = len(record.get("task_ids") or []) or record["task"]["eval_size"]
  fewer = (f" (the whole held-out split, fewer than eval_size={record['task']['eval_size']}: "
           f"each once)" if count < record["task"]["eval_size"] else "")
  line = (f"eval: {what} on {count} held-out {record['task']['source']} tasks{fewer}: greedy pass@1 {m['eval/pass_at_1']:.3f} ± {m['eval/pass_at_1_stderr']:.3f} "
          f"s.e., hidden tests {m['eval/hidden_frac']:.3f}")
  if "eval/pass_at_1_gain" in m:
    line += (f", paired gain over the warm-start {m['eval/pass_at_1_gain']:+.3f} ± "
             f"{m['eval/pass_at_1_gain_stderr']:.3f}")
  sampled = [f"pass@{k} {m[f'eval/pass_at_{k}_sampled']:.3f}" for k in record["eval"]["k"]
             if f"eval/pass_at_{k}_sampled" in m]
  if sampled:
    line += (f"; sampled (n={record['eval']['num_samples']}, T={record['eval']['temperature']}):"
             f" {', '.join(sampled)}")
  return line
