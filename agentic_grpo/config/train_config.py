"""`TrainConfig`, the whole run's config, and its building from a `ConfigDict` (types checked,
unknown fields refused, every section validated)."""

import dataclasses
import difflib
import types
import typing
from typing import Any, Mapping, Union

from absl import logging

from agentic_grpo import errors
from agentic_grpo.agent import workflow_config
from agentic_grpo.config import algorithm
from agentic_grpo import field_checks as checks
from agentic_grpo.config import model_task
from agentic_grpo.config import optimization
from agentic_grpo.config import runtime
from agentic_grpo.learner import sections as learner_sections
from agentic_grpo.replay import sections as replay_sections
from agentic_grpo.sandbox import sections as sandbox_sections


SECTION_ORDER = ("model", "task", "workflow", "sandbox", "rl", "loss", "correction", "replay",
                 "optim", "warmstart", "eval", "checkpoint", "log", "mesh")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything `train.run` needs.

  Attributes:
    seed: seed of parameters, sampling and the data order.
    model: the policy model.
    task: the task source.
    workflow: the agent workflow.
    sandbox: the code sandbox.
    rl: the Agentic GRPO phase.
    loss: the policy loss.
    correction: retroactive corrections and advantages.
    replay: the staged replay.
    optim: the RL optimizer.
    warmstart: the supervised warm-start.
    eval: held-out evaluation.
    checkpoint: checkpoints.
    log: metric outputs.
    mesh: the device mesh.
  """
  seed: int = 0
  model: model_task.ModelSection = model_task.ModelSection()
  task: model_task.TaskSection = model_task.TaskSection()
  workflow: workflow_config.WorkflowConfig = workflow_config.WorkflowConfig()
  sandbox: sandbox_sections.SandboxSection = sandbox_sections.SandboxSection()
  rl: algorithm.RLSection = algorithm.RLSection()
  loss: learner_sections.LossSection = learner_sections.LossSection()
  correction: replay_sections.CorrectionSection = replay_sections.CorrectionSection()
  replay: replay_sections.ReplaySection = replay_sections.ReplaySection()
  optim: learner_sections.OptimSection = learner_sections.OptimSection()
  warmstart: optimization.WarmstartSection = optimization.WarmstartSection()
  eval: runtime.EvalSection = runtime.EvalSection()
  checkpoint: runtime.CheckpointSection = runtime.CheckpointSection()
  log: runtime.LogSection = runtime.LogSection()
  mesh: runtime.MeshSection = runtime.MeshSection()

  def validate(self) -> None:
    """Checks every section and the constraints between sections."""
    for name in SECTION_ORDER:
      getattr(self, name).validate(name)
    bucket = self.rl.buckets[-1]
    checks.check(self.warmstart.seq_len <= bucket, "warmstart.seq_len",
                 f"must be <= the largest rl.buckets entry ({bucket})", self.warmstart.seq_len)
    checks.check(self.replay.capacity >= self.rl.group_size * len(self.workflow.stages),
                 "replay.capacity", f"must be >= rl.group_size * number of stages "
                 f"({self.rl.group_size * len(self.workflow.stages)})", self.replay.capacity)
    checks.check(self.rl.max_skipped_updates <= self.optim.max_consecutive_nonfinite,
                 "rl.max_skipped_updates", f"must be <= optim.max_consecutive_nonfinite "
                 f"({self.optim.max_consecutive_nonfinite}), past which non-finite updates are "
                 "applied", self.rl.max_skipped_updates)
    if (self.workflow.stage_rewards and self.correction.enabled
        and self.loss.aggregation != "seq_mean_token_sum_norm"):
      logging.warning(
          "loss.aggregation=%r normalises each update by its own contents, so a segment's "
          "provisional update (in a small batch) and its correction (in a later, larger batch) "
          "do not add up to the target advantage's update; use 'seq_mean_token_sum_norm' "
          "(a constant normaliser) for Agentic GRPO corrections.", self.loss.aggregation)


def _convert(value: Any, tp: Any, path: str) -> Any:
  """Checks/converts a leaf value to the annotated type `tp`."""
  origin = typing.get_origin(tp)
  if tp is bool:
    checks.check(isinstance(value, bool), path, "must be a bool", value)
    return value
  if tp is int:
    checks.check(isinstance(value, int) and not isinstance(value, bool), path, "must be an int",
                 value)
    return value
  if tp is float:
    checks.check(isinstance(value, (int, float)) and not isinstance(value, bool), path,
                 "must be a number", value)
    return float(value)
  if tp is str:
    checks.check(isinstance(value, str), path, "must be a str", value)
    return value
  if origin is tuple:
    checks.check(isinstance(value, (tuple, list)), path, "must be a tuple", value)
    (elem, _) = typing.get_args(tp)
    return tuple(_convert(v, elem, f"{path}[{i}]") for i, v in enumerate(value))
  if origin in (Union, types.UnionType):
    raise TypeError(f"unsupported annotation {tp} at {path}")
  return value


def _build(cls, data: Mapping[str, Any], path: str):
  """Builds dataclass `cls` from a mapping, naming unknown or ill-typed fields."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(data) - set(fields))
  if unknown:
    prefix = f"config.{path}." if path else "config."
    hints = [f"{prefix}{u} -> {prefix}{m[0]}?" for u in unknown
             if (m := difflib.get_close_matches(u, list(fields), n=1, cutoff=0.6))]
    raise errors.InputError(f"unknown config field(s) {[prefix + u for u in unknown]}"
                     f"{' (did you mean ' + ', '.join(hints) + ')' if hints else ''}; known: "
                     f"{sorted(fields)}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, value in data.items():
    sub = f"{path}.{name}" if path else name
    tp = hints[name]
    if dataclasses.is_dataclass(tp):
      checks.check(isinstance(value, Mapping), sub, "must be a section (dict)", value)
      kwargs[name] = _build(tp, value, sub)
    else:
      kwargs[name] = _convert(value, tp, sub)
  return cls(**kwargs)


def from_config_dict(config: Any) -> TrainConfig:
  """Builds and validates a `TrainConfig` from a `ConfigDict` (or a plain nested dict).

  Missing fields take the dataclass defaults.

  Raises:
    errors.InputError (a ValueError): naming the dotted field path of an unknown field, an
      ill-typed value, or a value out of range; or `config` is neither.
  """
  if hasattr(config, "to_dict"):
    data = config.to_dict()
  elif isinstance(config, Mapping):
    data = dict(config)
  else:
    raise errors.InputError(f"the config is a value of type {type(config).__name__}, not a "
                            f"ConfigDict or a mapping: a config file's get_config() must "
                            f"return one")
  try:
    cfg = _build(TrainConfig, data, "")
    cfg.validate()
  except errors.InputError:
    raise
  except ValueError as e:  # a section's own check of its values: the config is the input
    raise errors.InputError(str(e)) from e
  return cfg


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
  """The config as a plain nested dict (JSON-serialisable; tuples become lists in JSON)."""
  return dataclasses.asdict(cfg)
