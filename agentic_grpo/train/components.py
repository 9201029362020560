"""`Components` and `build(cfg)`: everything a run is built from, as a short sequence of calls.

Host side: the task source, the held-out tasks of this process (and its shares of the
headroom's held-out and training tasks), the sandbox pool and the workflow factory. Device side (through the door, `train.device.build_model`): tokenizer, model
structure, mesh and learner shardings. The coordinator of the run's processes
(`train.coordination`). `build` also checks at startup what the config allows to check before
any step: that the tasks' first prompts fit the largest length bucket (`check_prompt_lengths`).
"""

import dataclasses
from typing import Any, Callable, Optional

from absl import logging
import jax

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo import parallel
from agentic_grpo import sandbox
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.sandbox import checked_sources
from agentic_grpo.tasks import sources
from agentic_grpo.train import coordination
from agentic_grpo.train import device as device_lib

# Tasks whose first prompt `check_prompt_lengths` measures.
_PROBE_TASKS = 8


class StartupCheckError(errors.InputError):
  """The config cannot do what it asks (found before the first step); names the field to
  change (an input mistake: `errors.InputError`)."""


@dataclasses.dataclass
class Components:
  """Everything a run is built from (exposed for tests and notebooks)."""
  cfg: config_lib.TrainConfig
  tokenizer: Any
  model_config: Any  # models.transformer.ModelConfig
  graphdef: Any
  tasks: sources.TaskSource
  eval_tasks: list  # this process's share of the held-out tasks (all of them in one process)
  pool: Any
  workflow_factory: Callable[[], workflow_lib.Workflow]
  make_workflow: Callable[..., workflow_lib.Workflow]
  num_stages: int
  stage_names: tuple
  mesh: jax.sharding.Mesh
  sharded_model: Any  # models.placement.ShardedModel
  shardings: Any  # learner.Shardings
  coord: coordination.Coordinator
  model_source: Any  # models.sources.ModelSource: where the initial parameters come from
  # This process's shares of the headroom's held-out and training tasks (`headroom_sizes`).
  headroom_tasks: list = dataclasses.field(default_factory=list)
  headroom_train_tasks: list = dataclasses.field(default_factory=list)
  # Held-out tasks evaluated over all processes (`eval_count`): `task.eval_size`, or the
  # held-out split's size when it is smaller (each task once); 0: `task.eval_size`.
  eval_total: int = 0
  # `(held-out, training)` headroom task counts over all processes (`headroom_sizes`).
  headroom_totals: tuple = (0, 0)

  @property
  def eval_count(self) -> int:
    """Distinct held-out tasks evaluated over all processes (`eval_count`)."""
    return self.eval_total or self.cfg.task.eval_size


def split_size(tasks: Any, split: str) -> Optional[int]:
  """Tasks in `split` of a finite source (one with `size(split)`), None for an endless one."""
  size = getattr(tasks, "size", None)
  return None if size is None else int(size(split))


def eval_count(cfg: config_lib.TrainConfig, tasks: Any) -> int:
  """Held-out tasks an evaluation scores: `task.eval_size`, or all of the held-out split when it
  has fewer (a finite source cycles its split: each task is evaluated once, never repeated, so
  that pass@1, its standard error and the paired gain are over distinct tasks).

  Logs a warning saying so when the split is smaller than asked.
  """
  asked = cfg.task.eval_size
  have = split_size(tasks, cfg.task.eval_split)
  if have is None or have >= asked:
    return asked
  logging.warning("the held-out split (%s) has %d task(s), fewer than task.eval_size=%d: each "
                  "is evaluated once (%d held-out tasks; standard errors and paired gains over "
                  "those)", cfg.task.eval_split, have, asked, have)
  return have


def headroom_sizes(cfg: config_lib.TrainConfig, tasks: Any = None) -> tuple[int, int]:
  """`(held-out, training)` task counts of the headroom evaluation (`config.EvalSection`):
  `eval.headroom_tasks` capped at `task.eval_size`; `eval.headroom_train_tasks` capped at
  that (the training figure is read against the held-out one and needs no more tasks) and at
  `task.train_size` when the training pool is finite. Given the task source `tasks`, also
  capped at the sizes of a finite source's splits (each task counted once)."""
  heldout = min(cfg.eval.headroom_tasks, cfg.task.eval_size)
  train = min(cfg.eval.headroom_train_tasks, heldout)
  if cfg.task.train_size:
    train = min(train, cfg.task.train_size)
  if tasks is not None:
    for_heldout, for_train = (split_size(tasks, cfg.task.eval_split),
                              split_size(tasks, "train"))
    heldout = heldout if for_heldout is None else min(heldout, for_heldout)
    train = train if for_train is None else min(train, for_train)
  return heldout, train


def build(cfg: config_lib.TrainConfig, *, pool=None,
          workflow_factory: Optional[Callable[..., workflow_lib.Workflow]] = None) -> Components:
  """Builds tokenizer, model structure, task source, sandbox pool and workflow factory.

  Args:
    cfg: the run config.
    pool: a sandbox pool to use instead of a new `SandboxPool` (tests).
    workflow_factory: `(WorkflowConfig, pool, tokenizer=) -> Workflow` instead of `Workflow`
      (tests); the config is `cfg.workflow` (with `stage_rewards` and `reward_mode` replaced for
      evaluation), the tokenizer the model's (the `chat` prompt format renders with it).

  Raises:
    errors.InputError (a ValueError): an input mistake, naming the field and the fix: a model
      source that does not open or is too short for `rl.buckets` (`device.build_model`,
      `models.sources.open_model`), a data file that is missing or gives no usable task, an
      empty split (`task_source`); `StartupCheckError`, one: no task's first prompt fits the
      largest bucket (`check_prompt_lengths`).
  """
  model = device_lib.build_model(cfg)
  tasks = task_source(cfg)
  total = eval_count(cfg, tasks)
  share = parallel.process_slice(total)
  eval_tasks = [tasks.task(cfg.task.eval_split, i) for i in range(share.start, share.stop)]
  pool = pool if pool is not None else sandbox_pool(cfg)
  cls = workflow_factory or workflow_lib.Workflow
  make = lambda pool, **overrides: cls(dataclasses.replace(cfg.workflow, **overrides), pool,
                                       tokenizer=model.tokenizer)
  factory = lambda: make(pool)  # the agent loop counts each batch's verdicts
  probe = factory()
  if hasattr(probe.prompt_format, "prefix_message"):
    logging.info("prompt format %r: %s", cfg.workflow.prompt_format,
                 probe.prompt_format.prefix_message())
  heldout, train = headroom_sizes(cfg, tasks)
  # The headroom's held-out tasks are the first of the evaluation's: taken from it, not drawn
  # again (a synthetic held-out task takes about 10 ms).
  made = {(cfg.task.eval_split, i): t for i, t in zip(range(share.start, share.stop), eval_tasks)}
  own = lambda split, n: [made.get((split, i)) or tasks.task(split, i)
                          for i in range(n)[parallel.process_slice(n)]]
  comp = Components(cfg, model.tokenizer, model.model_config, model.graphdef, tasks, eval_tasks,
                    pool, factory, make, probe.num_stages, probe.stage_names,
                    model.mesh, model.sharded_model, model.shardings,
                    coordination.make_coordinator(), model.source,
                    own(cfg.task.eval_split, heldout), own("train", train), total,
                    (heldout, train))
  check_prompt_lengths(comp)
  return comp


def task_source(cfg: config_lib.TrainConfig) -> sources.TaskSource:
  """The run's tasks (`task.source` in `tasks.sources.TASK_SOURCES`): training stream and
  held-out split; a load-time reference check runs under the `sandbox` section's limits."""
  return checked_sources.open_source(cfg.task, cfg.sandbox)


def sandbox_pool(cfg: config_lib.TrainConfig) -> sandbox.SandboxPool:
  """A sandbox pool from the `sandbox` section (at least `sandbox.min_isolation`)."""
  return cfg.sandbox.pool()


def check_prompt_lengths(comp: Components) -> None:
  """Checks that the first stage's prompt of the first training tasks fits `rl.buckets`.

  The agent loop skips a stage whose context is longer than `rl.buckets[-1] -
  workflow.max_new_tokens` tokens (empty output, reward 0, not trained on). When the first
  stage's context (task prompt and opening) of every probed task is longer, every stage would be
  skipped and the run could not learn: that is an error. When some are, a warning.

  Raises:
    StartupCheckError: every probed task's first context is too long; names `rl.buckets`.
  """
  cfg = comp.cfg
  tasks = [comp.tasks.task("train", i) for i in range(_PROBE_TASKS)]
  wf = comp.make_workflow(comp.pool)
  lengths = [len(comp.tokenizer.encode(o)) for o in wf.open_stage(wf.start(tasks))]
  limit = cfg.rl.buckets[-1] - cfg.workflow.max_new_tokens
  too_long = sum(n > limit for n in lengths)
  if not too_long:
    return
  what = (f"{too_long} of {len(lengths)} probed training tasks have a first-stage context "
          f"longer than the largest bucket allows (rl.buckets[-1] - workflow.max_new_tokens = "
          f"{limit} tokens; the longest has {max(lengths)}): such stages are skipped, not "
          f"trained on")
  if too_long == len(lengths):
    raise StartupCheckError(f"config.rl.buckets={tuple(cfg.rl.buckets)}: {what}; contexts "
                            f"longer than the largest bucket: raise --config.rl.buckets to at "
                            f"least {max(lengths) + cfg.workflow.max_new_tokens}")
  logging.warning("%s; raise rl.buckets", what)
