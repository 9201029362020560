"""Config sections of how a run executes and reports: evaluation, checkpoints, logs and the
device mesh (the sandbox's section lives with it: `sandbox/sections.py`)."""

import dataclasses

from agentic_grpo import field_checks as checks


@dataclasses.dataclass(frozen=True)
class EvalSection:
  """Held-out evaluation: greedy pass@1 and sampled pass@k (Chen et al., 2021), the samples
  drawn at `temperature` (with `rl.top_k` / `rl.top_p`).

  At the end of the warm-start and at the end of the run (the evaluations with samples), the
  *headroom* of RL: `rl.group_size` (G) attempts per task drawn as the RL phase draws them (at
  `rl.temperature`, with `rl.top_k` / `rl.top_p`), scored by pass@1 and pass@G, on the first
  `headroom_tasks` held-out tasks and on the first `headroom_train_tasks` training tasks
  (`train.evaluation.headroom`). pass@G is the share of tasks whose group holds a pass.

  Attributes:
    every: evaluate every this many RL steps (0 = only at the phase ends).
    num_samples: samples per task for pass@k (0 = greedy only).
    k: the k of pass@k, each in [1, num_samples].
    temperature: sampling temperature of pass@k samples (> 0).
    headroom_tasks: held-out tasks of the headroom's pass@1 and pass@G at the RL temperature
      (the first ones of the held-out split, at most task.eval_size; 0 = no headroom).
    headroom_train_tasks: training-split tasks of the headroom (the first ones, at most
      as many as the held-out headroom's and task.train_size when set; 0 = none).
  """
  every: int = 20
  num_samples: int = 4
  k: tuple[int, ...] = (1, 4)
  temperature: float = 1.0
  headroom_tasks: int = 256
  headroom_train_tasks: int = 128

  def validate(self, path: str) -> None:
    checks.check(self.every >= 0, f"{path}.every", "must be >= 0 (0 = only at the ends)",
                 self.every)
    checks.check(self.num_samples >= 0, f"{path}.num_samples", "must be >= 0", self.num_samples)
    if self.num_samples:
      checks.check(all(1 <= k <= self.num_samples for k in self.k), f"{path}.k",
                   f"must be in [1, num_samples={self.num_samples}]", self.k)
    checks.check(self.temperature > 0, f"{path}.temperature", "must be > 0", self.temperature)
    checks.check(self.headroom_tasks >= 0, f"{path}.headroom_tasks", "must be >= 0 (0 = off)",
                 self.headroom_tasks)
    checks.check(self.headroom_train_tasks >= 0, f"{path}.headroom_train_tasks",
                 "must be >= 0 (0 = off)", self.headroom_train_tasks)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
  """Orbax checkpoints: every `every` learner steps (0 = only at the end).

  Attributes:
    every: checkpoint every this many steps (0 = only at the end).
    max_to_keep: newest checkpoints kept (besides the warm-start's, with keep_warmstart).
    keep_warmstart: checkpoint the end of the warm-start (global step warmstart.steps) whatever
      `every` says, and never delete it by rotation: later runs can start from it
      (experiments/warmstart_control.py). No effect when warmstart.steps is 0.
  """
  every: int = 20
  max_to_keep: int = 2
  keep_warmstart: bool = True

  def validate(self, path: str) -> None:
    checks.check(self.every >= 0, f"{path}.every", "must be >= 0", self.every)
    checks.check(self.max_to_keep >= 1, f"{path}.max_to_keep", "must be >= 1", self.max_to_keep)


@dataclasses.dataclass(frozen=True)
class LogSection:
  """Metrics outputs.

  Attributes:
    every: log a metrics row every this many steps.
    tensorboard: write TensorBoard events to workdir/tb.
    progress_bar: show a console progress bar.
    plot: write learning_curve.png at the end.
    transcripts_every: every this many RL updates, write sample transcripts of the newest
      finished training batch (`transcripts` episodes: the prompt, each stage's opening and
      output, its reward, whether it parsed and counted, the final reward and the hidden tests
      passed) to workdir/transcripts.jsonl and, as text, to TensorBoard (tag `transcripts`);
      0 = never.
    transcripts: episodes per transcript write (the first ones of the batch: whole groups
      first).
    wandb: also log every metrics row (and the transcripts) to Weights & Biases, beside
      TensorBoard (needs the `wandb` package: the `wandb` extra); process 0 only.
    wandb_project: the W&B project.
    wandb_mode: `online`, `offline` (written under workdir/wandb, to `wandb sync` later) or ''
      (W&B's own choice: the `WANDB_MODE` environment variable, else online).
  """
  every: int = 1
  tensorboard: bool = True
  progress_bar: bool = True
  plot: bool = True
  transcripts_every: int = 0
  transcripts: int = 2
  wandb: bool = False
  wandb_project: str = "agentic_grpo"
  wandb_mode: str = ""

  def validate(self, path: str) -> None:
    checks.check(self.every >= 1, f"{path}.every", "must be >= 1", self.every)
    checks.check(self.transcripts_every >= 0, f"{path}.transcripts_every", "must be >= 0",
                 self.transcripts_every)
    checks.check(self.transcripts >= 1, f"{path}.transcripts", "must be >= 1",
                 self.transcripts)
    checks.choice(f"{path}.wandb_mode", self.wandb_mode, ("", "online", "offline"))
    checks.check(bool(self.wandb_project), f"{path}.wandb_project", "must not be empty",
                 self.wandb_project)


@dataclasses.dataclass(frozen=True)
class MeshSection:
  """Device mesh shape over axes (`data`, `fsdp`, `tensor`); -1 takes the remaining devices.

  `logical_axis_rules` overrides `parallel.DEFAULT_RULES`: pairs `(logical_axis, mesh_axes)`
  with `mesh_axes` a comma-separated list of mesh axes (`"data,fsdp"`), or `""` for replicated;
  empty means the defaults.

  Attributes:
    data: data-parallel axis size (-1 = the remaining devices).
    fsdp: fully-sharded axis size (-1 = the remaining devices).
    tensor: tensor-parallel axis size (-1 = the remaining devices).
    logical_axis_rules: `(logical_axis, "mesh,axes")` overrides of parallel.DEFAULT_RULES.
    collective_timeout_s: seconds (multi-process runs only) a process waits for its peers: a
      host collective that has not completed after it, or that fails, ends the process with a
      message naming the peers that did not reach it and exit status
      `parallel.EXIT_PEER_FAILURE` (restart to resume from the last checkpoint); it is also
      JAX's heartbeat and shutdown timeout. It must exceed the longest legitimate gap between
      two processes reaching the same collective (compilation, a slow sandbox batch,
      evaluation). 0 turns the watch off (JAX's defaults: 100 s heartbeat, 300 s shutdown);
      otherwise at least 10 s.
  """
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  logical_axis_rules: tuple[tuple[str, str], ...] = ()
  collective_timeout_s: float = 600.0

  def validate(self, path: str) -> None:
    sizes = (self.data, self.fsdp, self.tensor)
    for name, v in zip(("data", "fsdp", "tensor"), sizes):
      checks.check(v == -1 or v >= 1, f"{path}.{name}", "must be >= 1 or -1", v)
    checks.check(sizes.count(-1) <= 1, path, "may have at most one axis of size -1", sizes)
    checks.check(self.collective_timeout_s == 0 or self.collective_timeout_s >= 10,
                 f"{path}.collective_timeout_s", "must be 0 (off) or >= 10 seconds",
                 self.collective_timeout_s)
    for i, rule in enumerate(self.logical_axis_rules):
      checks.check(len(rule) == 2, f"{path}.logical_axis_rules[{i}]",
                   "must be a (logical_axis, mesh_axes) pair", rule)
      axes = [a for a in rule[1].split(",") if a]
      checks.check(all(a in ("data", "fsdp", "tensor") for a in axes),
                   f"{path}.logical_axis_rules[{i}]", "must name mesh axes data, fsdp, tensor",
                   rule)

  def rules(self):
    """The rules in `parallel`'s form (`(name, None | axis | (axes...))`), or None."""
    if not self.logical_axis_rules:
      return None
    out = []
    for name, axes in self.logical_axis_rules:
      names = tuple(a for a in axes.split(",") if a)
      out.append((name, None if not names else names[0] if len(names) == 1 else names))
    return tuple(out)
