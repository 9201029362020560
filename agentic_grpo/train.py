"""`run(config, workdir)`: supervised warm-start, then Agentic GRPO, with evaluation and resume.

Phases (DESIGN.md §1, §3):

1. **Warm-start** (`warmstart.steps` > 0): token cross-entropy on reference episodes of training
   tasks (`references.reference_segments`), so that a small model from scratch writes well-formed
   stages. Its final parameters are also the frozen reference policy of the KL term.
2. **Agentic GRPO** (`rl.num_steps` learner updates): `agent.loop.AgentLoop` keeps
   `rl.batches_in_flight` episode batches in flight and feeds `replay.StagedReplay`; the learner
   updates on provisional items as soon as a group completes a stage (before that batch's next
   stage is sampled) and on corrections once the final rewards arrive. With stage rewards and
   corrections off (`experiments/outcome_grpo.py`) the same code is outcome-only GRPO.

Evaluation on a fixed held-out split (`task.eval_split`, `task.eval_size` tasks): greedy pass@1
(the share of tasks whose final code passes every hidden test) every `eval.every` steps, at the
end of the warm-start and at the end; sampled pass@k (the unbiased estimator of Chen et al.,
2021, "Evaluating Large Language Models Trained on Code", from `eval.num_samples` samples per
task) at the end of the warm-start and at the end.

Outputs in `workdir`: `metrics.jsonl` (one JSON object per logged step: `step` (global: warm-start
steps then RL steps), `phase` (`warmstart` | `rl`), losses, rewards per stage, clip fraction, KL,
staleness drops, corrections, errors, tokens/s, seconds, and `eval/...` when evaluated),
TensorBoard events in `workdir/tb`, checkpoints in `workdir/checkpoints` (everything needed to
resume exactly: learner state, replay, in-flight episodes, data position), `config.json`, and
`learning_curve.png` at the end. A run restarted with the same workdir resumes where it stopped.

Multi-process runs (`jax.distributed`, one process per host): process `p` of `P` draws only its
own tasks (training stream positions `p, p + P, ...`; warm-start batches and held-out tasks
likewise split), runs its own episodes, sandbox work and `StagedReplay`, and contributes
`rows_per_update / P` rows to each global update batch. Whatever must be the same everywhere is
agreed with a small collective: per loop iteration, whether to update (every process has its
share of rows ready, or the loop is about to sample and some process has rows) and the length
bucket (the longest any process needs); per sampler call, the prompt bucket; per update, whether
any process had a row. Logged rewards, counts and evaluation results are gathered from every
process; process 0 writes them. Each process's replay, in-flight episodes and data position go
into the checkpoint as its own row (`checkpointing`), so a restart resumes each process exactly.
"""

import collections
import dataclasses
import io
import json
import math
import os
import re
import time
from typing import Any, Callable, Optional

from absl import logging
from etils import epath
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo import checkpointing
from agentic_grpo import config as config_lib
from agentic_grpo import config_drift
from agentic_grpo import learner
from agentic_grpo import parallel
from agentic_grpo import replay as replay_lib
from agentic_grpo.agent import loop as loop_lib
from agentic_grpo.agent import references
from agentic_grpo.agent import sandbox
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import streams
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.core import losses as losses_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.models import placement
from agentic_grpo.models import sampler as sampler_lib
from agentic_grpo.models import tokenizers
from agentic_grpo.models import transformer
from agentic_grpo.tasks import sources

# Metric names TensorBoard keeps unchanged as tags (tensorboardX replaces any other character).
_TAG = re.compile(r"[-\w./]+")
# Unlimited training streams: warm-start tasks start at this index, RL tasks at 0.
_WARMSTART_OFFSET = 1 << 24


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from `n` samples of which `c` are correct (Chen et al., 2021, eq. 1).

  `1 - C(n - c, k) / C(n, k)`, computed as a stable product.

  Raises:
    ValueError: unless `0 <= c <= n` and `1 <= k <= n`.
  """
  if not (0 <= c <= n and 1 <= k <= n):
    raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def paired_gain(before: np.ndarray, after: np.ndarray) -> tuple[float, float]:
  """Mean per-task gain `after - before` and its standard error, for results on the same tasks.

  Both evaluations run the same held-out tasks, so the difference of their pass rates is judged
  by the per-task differences `d_i = after_i - before_i` (the paired design of McNemar's test,
  McNemar, 1947): gain `mean(d)`, standard error `std(d, ddof=1) / sqrt(n)`. Tasks both runs
  solve (or both fail) add no variance, so this is much tighter than the unpaired
  `sqrt(p (1 - p) / n)` of each rate.

  Args:
    before, after: `[n]` per-task results (bool or float in [0, 1]), same task order, n >= 2.

  Returns:
    `(gain, stderr)` as floats.

  Raises:
    ValueError: for shapes that differ or are not 1-D, or fewer than 2 tasks.
  """
  before = np.asarray(before, np.float64)
  after = np.asarray(after, np.float64)
  if before.ndim != 1 or before.shape != after.shape:
    raise ValueError(f"before and after must be 1-D with the same shape, got "
                     f"{before.shape} and {after.shape}")
  if before.size < 2:
    raise ValueError(f"need at least 2 tasks for a standard error, got {before.size}")
  d = after - before
  return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))


def rl_optimizer(cfg: config_lib.TrainConfig):
  """The RL phase's optimizer: `optim`, with its schedule spanning `rl.num_steps` updates."""
  return learner.make_optimizer(
      cfg.optim, decay_steps=cfg.rl.num_steps if cfg.optim.schedule == "cosine" else 0,
      final_lr_fraction=cfg.optim.final_lr_fraction)


# ------------------------------------------------------------------------------ components


@dataclasses.dataclass
class Components:
  """Everything a run is built from (exposed for tests and notebooks)."""
  cfg: config_lib.TrainConfig
  tokenizer: Any
  model_config: transformer.ModelConfig
  graphdef: Any
  tasks: sources.TaskSource
  eval_tasks: list  # this process's share of the held-out tasks (all of them in one process)
  pool: Any
  counting_pool: streams.CountingPool
  workflow_factory: Callable[[], workflow_lib.Workflow]
  make_workflow: Callable[..., workflow_lib.Workflow]
  num_stages: int
  stage_names: tuple
  mesh: jax.sharding.Mesh
  sharded_model: Any
  shardings: learner.Shardings


def build(cfg: config_lib.TrainConfig, *, pool=None,
          workflow_factory: Optional[Callable[..., workflow_lib.Workflow]] = None) -> Components:
  """Builds tokenizer, model structure, task source, sandbox pool and workflow factory.

  Args:
    cfg: the run config.
    pool: a sandbox pool to use instead of a new `SandboxPool` (tests).
    workflow_factory: `(WorkflowConfig, pool) -> Workflow` instead of `Workflow` (tests); the
      config is `cfg.workflow` (with `stage_rewards` and `reward_mode` replaced for evaluation).

  Raises:
    ValueError: `config.model.source='hf'` or `config.model.param_dtype` (read by
      `models.sources`, not yet by this builder).
  """
  if cfg.model.source != "preset" or cfg.model.param_dtype:
    raise ValueError(f"config.model.source={cfg.model.source!r} / config.model.param_dtype="
                     f"{cfg.model.param_dtype!r}: the run builds presets only so far; "
                     f"models.sources.load_model and python -m launch.export read them")
  tok = tokenizers.ByteTokenizer()
  overrides = cfg.model.overrides()
  overrides.setdefault("max_seq_len", max(cfg.rl.buckets[-1] + cfg.workflow.max_new_tokens, 512))
  model_config = transformer.get_model_config(cfg.model.preset, vocab_size=tok.vocab_size,
                                              **overrides)
  needed = cfg.rl.buckets[-1] + cfg.workflow.max_new_tokens
  if model_config.max_seq_len < needed:
    raise ValueError(f"config.model.max_seq_len must be >= rl.buckets[-1] + "
                     f"workflow.max_new_tokens = {needed}, got {model_config.max_seq_len}")
  graphdef, _ = transformer.abstract_model(model_config)
  tasks = sources.TASK_SOURCES.get(cfg.task.source)(cfg.task)
  share = parallel.process_slice(cfg.task.eval_size)
  eval_tasks = [tasks.task(cfg.task.eval_split, i) for i in range(share.start, share.stop)]
  if pool is None:
    pool = sandbox.SandboxPool(max_workers=cfg.sandbox.workers, limits=sandbox.Limits(
        cpu_seconds=cfg.sandbox.cpu_s, wall_seconds=cfg.sandbox.timeout_s,
        memory_bytes=cfg.sandbox.memory_mb * 2**20),
        isolation=sandbox.Isolation(min_level=cfg.sandbox.min_isolation))
  counting = streams.CountingPool(pool)
  cls = workflow_factory or workflow_lib.Workflow
  make = lambda pool, **overrides: cls(dataclasses.replace(cfg.workflow, **overrides), pool)
  factory = lambda: make(counting)
  probe = factory()
  mesh = parallel.make_mesh(cfg)
  sharded_model, shardings = learner.learner_shardings(
      model_config, mesh, rl_optimizer(cfg), cfg.mesh.rules(),
      with_reference=cfg.loss.kl_beta > 0)
  return Components(cfg, tok, model_config, graphdef, tasks, eval_tasks, pool, counting, factory,
                    make, probe.num_stages, probe.stage_names, mesh, sharded_model, shardings)


def sft_batch(comp: Components, tasks) -> core_types.SFTBatch:
  """Reference episodes as a warm-start batch `[len(tasks), warmstart.seq_len]`.

  Environment text (openings, observations) is context only; the reference stage outputs are
  the loss tokens. Episodes longer than `seq_len` are cut.
  """
  seq_len = comp.cfg.warmstart.seq_len
  wf = comp.workflow_factory()
  tok = comp.tokenizer
  tokens = np.full((len(tasks), seq_len), tok.pad_id, np.int32)
  mask = np.zeros((len(tasks), seq_len), bool)
  for r, task in enumerate(tasks):
    ids, m = [], []
    for seg in references.reference_segments(wf, task):
      opening, output = tok.encode(seg.opening), tok.encode(seg.output)
      ids += opening + output
      m += [False] * len(opening) + [True] * len(output)
    n = min(len(ids), seq_len)
    tokens[r, :n] = ids[:n]
    mask[r, :n] = m[:n]
  return core_types.SFTBatch(tokens, mask)


def make_sample_fn(comp: Components, seed: int, temperature: Optional[float] = None):
  """The agent loop's `sample_fn`: the KV-cache sampler with the run's sampling transform.

  `temperature` defaults to `rl.temperature` (the behaviour policy's); evaluation passes
  `eval.temperature`. `rl.top_k` / `rl.top_p` apply either way.

  Jitted over the run's mesh with explicit shardings (`sampler_lib.sampler_shardings`). In a
  multi-process run it is a collective: each process passes its own rows, the processes agree
  on the prompt bucket (the longest prompt of any), one program samples every process's rows,
  and each gets its own rows back.
  """
  cfg = comp.cfg
  transform = cfg.rl.transform(temperature)
  tok = comp.tokenizer
  wf = comp.workflow_factory()
  stop_ids = [tok.token_id(s) for s in wf.stop_tokens()]
  base = jax.random.key(seed)
  shardings = sampler_lib.sampler_shardings(comp.model_config, comp.mesh, cfg.mesh.rules())

  def sample_fn(params, prompts, lengths, counter, greedy):
    key = jax.random.fold_in(base, np.uint32(counter % (1 << 32)))
    buckets = cfg.rl.buckets
    if jax.process_count() > 1:
      longest = int(parallel.host_allgather(np.int64(np.max(lengths))).max())
      buckets = (sampler_lib.prompt_bucket(longest, cfg.rl.buckets),)
    out = sampler_lib.sample(
        comp.graphdef, params, prompts, lengths, key, max_new_tokens=cfg.workflow.max_new_tokens,
        transform=transform, greedy=greedy,
        stop_token_ids=stop_ids, pad_id=tok.pad_id, prompt_buckets=buckets,
        shardings=shardings)
    return parallel.local_rows((out.tokens, out.lengths, out.logprobs))

  return sample_fn


# ------------------------------------------------------------------------------ metrics


class MetricsWriter:
  """`metrics.jsonl`, TensorBoard events and the console progress bar.

  On resume, lines of `metrics.jsonl` beyond the restored step (written after the last
  checkpoint by the stopped run) are dropped so that the file stays one consistent history.
  In a multi-process run only process 0 writes; the others keep the history in memory. A remote
  workdir (`gs://...`) gets the whole file rewritten at each write (objects cannot be appended
  to) and no TensorBoard events.

  Metric names use only the characters TensorBoard keeps in a tag (`[A-Za-z0-9_.-/]`:
  `eval/pass_at_1`, not `eval/pass@1`, which tensorboardX would rename), so that every
  TensorBoard tag equals its `metrics.jsonl` key; `write` refuses any other name.
  """

  def __init__(self, workdir: str, cfg: config_lib.TrainConfig, total_steps: int,
               resume_step: int):
    self.path = epath.Path(workdir) / "metrics.jsonl"
    self.history: list[dict[str, Any]] = []
    self.primary = jax.process_index() == 0
    self.local = "://" not in str(workdir)
    if self.path.exists():
      for line in self.path.read_text().splitlines():
        if line.strip():
          row = json.loads(line)
          if row.get("step", 0) <= resume_step:
            self.history.append(row)
    self._file = self._tb = self._bar = None
    if not self.primary:
      return
    self.path.write_text("".join(json.dumps(row) + "\n" for row in self.history))
    if self.local:
      self._file = self.path.open("a")
    if cfg.log.tensorboard and self.local:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tb"))
    if cfg.log.progress_bar:
      import tqdm  # pylint: disable=g-import-not-at-top
      self._bar = tqdm.tqdm(total=total_steps, initial=resume_step, unit="step",
                            dynamic_ncols=True, desc="train")
    self.pass1 = next((r["eval/pass_at_1"] for r in reversed(self.history)
                       if "eval/pass_at_1" in r), None)

  def write(self, row: dict[str, Any]) -> None:
    """Appends one metrics row (`step` required) to every output.

    Raises:
      ValueError: a key with a character TensorBoard would replace in a tag.
    """
    illegal = [k for k in row if not _TAG.fullmatch(k)]
    if illegal:
      raise ValueError(f"metric names must match {_TAG.pattern} (TensorBoard tags), got "
                       f"{illegal}")
    row = {k: (float(v) if isinstance(v, (np.ndarray, np.generic, jax.Array)) else v)
           for k, v in row.items()}
    self.history.append(row)
    # Every process, primary or not, can show its rows (`--verbosity=1`): multi-host runs
    # compare them.
    logging.vlog(1, "metrics %s", json.dumps(row))
    if "eval/pass_at_1" in row:
      self.pass1 = row["eval/pass_at_1"]
    if not self.primary:
      return
    if self._file is None:
      self.path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
    else:
      self._file.write(json.dumps(row) + "\n")
      self._file.flush()
    if self._tb is not None:
      for k, v in row.items():
        if isinstance(v, (int, float)) and k != "step" and math.isfinite(v):
          self._tb.add_scalar(k, v, row["step"])

  def progress(self, step: int, phase: str, loss: Optional[float] = None) -> None:
    if self._bar is None:
      return
    self._bar.n = step
    post = {"phase": phase}
    if loss is not None:
      post["loss"] = f"{loss:.3f}"
    if self.pass1 is not None:
      post["pass@1"] = f"{self.pass1:.3f}"
    self._bar.set_postfix(post, refresh=False)
    self._bar.refresh()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._bar is not None:
      self._bar.close()


def plot_learning_curve(history: list[dict[str, Any]], path: str) -> None:
  """Held-out pass@1 and training rewards against the global step, as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  ev = [r for r in history if "eval/pass_at_1" in r]
  if ev:
    ax1.errorbar([r["step"] for r in ev], [r["eval/pass_at_1"] for r in ev],
                 yerr=[r.get("eval/pass_at_1_stderr", 0.0) for r in ev], fmt="o-", capsize=3,
                 label="greedy pass@1 (held-out, ±1 s.e.)")
    ax1.plot([r["step"] for r in ev], [r["eval/hidden_frac"] for r in ev], "s--",
             label="hidden tests passed (fraction)")
  ws = [r["step"] for r in history if r.get("phase") == "warmstart"]
  if ws:
    ax1.axvline(max(ws), color="gray", lw=0.8, ls=":", label="end of warm-start")
  ax1.set_xlabel("step")
  ax1.set_ylim(0, 1)
  ax1.legend(loc="lower right")
  ax1.set_title("held-out evaluation")
  rl = [r for r in history if r.get("phase") == "rl" and "reward/final" in r]
  if rl:
    ax2.plot([r["step"] for r in rl], [r["reward/final"] for r in rl], label="final reward")
    # Stage rewards are logged at the step their stage closed, not only with the final reward.
    rl_all = [r for r in history if r.get("phase") == "rl"]
    for key in sorted({k for r in rl_all for k in r
                       if k.startswith("reward/") and k != "reward/final"}):
      pts = [(r["step"], r[key]) for r in rl_all if key in r]
      ax2.plot(*zip(*pts), alpha=0.6, label=key.split("/", 1)[1])
  ax2.set_xlabel("step")
  ax2.set_title("training rewards")
  if rl:
    ax2.legend(loc="lower right", fontsize=8)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100)
  plt.close(fig)
  epath.Path(path).write_bytes(buf.getvalue())


# ------------------------------------------------------------------------------ evaluation


def evaluate(comp: Components, agent: loop_lib.AgentLoop, params, *, sampled: bool,
             baseline: Optional[np.ndarray] = None) -> tuple[dict[str, float], np.ndarray]:
  """Held-out metrics: greedy pass@1, hidden-test fraction, stage rewards, sampled pass@k.

  Returns `(metrics, passed)`: `passed` is `[task.eval_size]` bool, greedy pass per held-out
  task (in task order). `metrics` holds `eval/pass_at_1` with its binomial standard error
  `eval/pass_at_1_stderr`, and, given `baseline` (an earlier `passed`, e.g. the warm-start's),
  the paired gain over it `eval/pass_at_1_gain` with `eval/pass_at_1_gain_stderr` (`paired_gain`).

  Evaluation episodes score every stage (also for outcome-only runs) and count their sandbox
  verdicts apart from training's (`eval/timeouts`). In a multi-process run each process runs
  its share of the held-out tasks (padded to the largest share, so that every process makes
  the same sampler calls) and the per-task results of all processes are gathered: the metrics
  are those of the whole held-out set, the same in every process.
  """
  cfg = comp.cfg
  t0 = time.time()
  counting = streams.CountingPool(comp.pool)
  # Hidden-test fractions for `eval/hidden_frac`; pass@1 counts the episodes that pass all.
  factory = lambda: comp.make_workflow(counting, stage_rewards=True,
                                       reward_mode=stages_lib.FRACTION)
  own = len(comp.eval_tasks)
  width = -(-cfg.task.eval_size // jax.process_count())  # tasks run by every process
  padding = comp.eval_tasks[-1:] or [comp.tasks.task(cfg.task.eval_split, 0)]
  tasks = list(comp.eval_tasks) + padding * (width - own)
  gather = lambda x: _gather_task_rows(x, own, cfg.task.eval_size)
  final, stages = agent.run_episodes(params, tasks, greedy=True, rng_counter=-1,
                                     workflow_factory=factory)
  final = gather(final)
  stages = {name: gather(r) for name, r in stages.items()}
  passed = final[:, 0] >= 1.0
  p1 = float(np.mean(passed))
  out = {"eval/pass_at_1": p1,
         "eval/pass_at_1_stderr": math.sqrt(p1 * (1.0 - p1) / max(len(passed), 1)),
         "eval/hidden_frac": float(np.mean(final[:, 0]))}
  if baseline is not None and len(baseline) != len(passed):
    logging.warning("no paired gain: the warm-start was evaluated on %d held-out tasks, this "
                    "evaluation on %d (task.eval_size changed?)", len(baseline), len(passed))
  elif baseline is not None and len(passed) > 1:
    out["eval/pass_at_1_gain"], out["eval/pass_at_1_gain_stderr"] = paired_gain(baseline, passed)
  for name, r in stages.items():
    out[f"eval/reward/{name}"] = float(np.mean(r))
  n = cfg.eval.num_samples
  if sampled and n > 0:
    final_s, _ = agent.run_episodes(
        params, tasks, greedy=False, repeats=n, rng_counter=-(1 << 20), workflow_factory=factory,
        sample_fn=make_sample_fn(comp, cfg.seed, temperature=cfg.eval.temperature))
    final_s = gather(final_s)
    correct = (final_s >= 1.0).sum(axis=1)
    for k in cfg.eval.k:
      out[f"eval/pass_at_{k}_sampled"] = float(np.mean([pass_at_k(n, int(c), k) for c in correct]))
  timeouts = np.int64(counting.pop_counts().get("timeout", 0))
  out["eval/timeouts"] = float(parallel.host_allgather(timeouts).sum())
  out["eval/seconds"] = time.time() - t0
  return out, passed


def _gather_task_rows(x: np.ndarray, own: int, total: int) -> np.ndarray:
  """Per-task results `[width, ...]` of every process (its first `own` rows real), joined in
  task order: `[total, ...]`. The process shares are `parallel.process_slice(total)`."""
  count = jax.process_count()
  if count == 1:
    return x[:own]
  everything = parallel.host_allgather(x)
  sizes = [len(range(total)[parallel.process_slice(total, p, count)]) for p in range(count)]
  return np.concatenate([everything[p, :sizes[p]] for p in range(count)])


# ------------------------------------------------------------------------------ the run


def _mean_rows(rows: list[dict[str, float]]) -> dict[str, float]:
  acc = collections.defaultdict(list)
  for r in rows:
    for k, v in r.items():
      acc[k].append(v)
  return {k: float(np.mean(v)) for k, v in acc.items()}


def _sum_rows(rows: list[dict[str, float]]) -> dict[str, list[float]]:
  """`{key: [sum, count]}` of metric rows (to be merged across processes)."""
  acc: dict[str, list[float]] = {}
  for r in rows:
    for k, v in r.items():
      a = acc.setdefault(k, [0.0, 0])
      a[0] += float(v)
      a[1] += 1
  return acc


def run(config, workdir: str, *, pool=None, workflow_factory=None,
        stop_after: Optional[int] = None) -> dict[str, Any]:
  """Trains (or resumes) a run in `workdir`; returns the last evaluation and run facts.

  Args:
    config: a `TrainConfig` or a `ConfigDict` (validated by `config.from_config_dict`).
    workdir: output directory; an existing checkpoint there is resumed.
    pool: sandbox pool to use (default: a new `SandboxPool` from `config.sandbox`).
    workflow_factory: `(WorkflowConfig, pool) -> Workflow` (tests inject faults with it).
    stop_after: stop (after checkpointing) once this global step is reached, as if the
      process had been stopped there (tests of resume).

  Raises:
    ValueError: an invalid config (naming the field).
    config_drift.ConfigDriftError: a resume whose config changes fields that the saved state
      depends on (`config_drift.FIXED`); the workdir's `config.json` is left as it was.
  """
  cfg = config if isinstance(config, config_lib.TrainConfig) else config_lib.from_config_dict(
      config)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  saved = epath.Path(workdir) / "config.json"
  if saved.exists() and checkpointing.Checkpointer.exists(os.path.join(workdir, "checkpoints")):
    for change in config_drift.check(json.loads(saved.read_text()), cfg, where=workdir):
      logging.info("resuming with config.%s", change)
  if jax.process_index() == 0:  # written only once the config is accepted
    saved.write_text(json.dumps(config_lib.to_dict(cfg), indent=1))
  own_pool = pool is None
  comp = build(cfg, pool=pool, workflow_factory=workflow_factory)
  try:
    return _run(comp, workdir, stop_after)
  finally:
    if own_pool:
      comp.pool.close()


def _run(comp: Components, workdir: str, stop_after: Optional[int]) -> dict[str, Any]:
  cfg = comp.cfg
  sh = comp.shardings
  ws_steps, rl_steps = cfg.warmstart.steps, cfg.rl.num_steps
  total = ws_steps + rl_steps
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                    max_to_keep=cfg.checkpoint.max_to_keep)
  ws_opt = learner.make_optimizer(cfg.optim, learning_rate=cfg.warmstart.learning_rate,
                                  warmup_steps=cfg.warmstart.warmup_steps, decay_steps=ws_steps,
                                  final_lr_fraction=cfg.warmstart.final_lr_fraction)
  rl_opt = rl_optimizer(cfg)
  params0 = placement.init_params(comp.sharded_model, comp.model_config,
                                  jax.random.key(cfg.seed))
  n_proc = jax.process_count()
  multi = n_proc > 1
  if multi:
    for name, value in (("rl.rows_per_update", cfg.rl.rows_per_update),
                        ("warmstart.batch_size", cfg.warmstart.batch_size)):
      if value % n_proc:
        raise ValueError(f"config.{name} must be a multiple of the number of processes "
                         f"({n_proc}), got {value}")
  # Each process places its own rows of the global batch (multi-process) or the whole batch.
  place = parallel.shard_batch if multi else parallel.put_batch
  put = lambda batch: place(batch.check(), comp.mesh, cfg.mesh.rules())
  use_kl = cfg.loss.kl_beta > 0

  replay = replay_lib.StagedReplay(
      group_size=cfg.rl.group_size, num_stages=comp.num_stages,
      stage_rewards=cfg.workflow.stage_rewards, correction=cfg.correction.enabled,
      target_mode=cfg.correction.target, gamma=cfg.correction.gamma, beta=cfg.correction.beta,
      scale=cfg.correction.scale, baseline=cfg.correction.baseline,
      max_staleness=cfg.correction.max_staleness,
      staleness_mode=cfg.correction.staleness_mode, capacity=cfg.replay.capacity,
      when_full=cfg.replay.when_full, skip_zero_advantage=cfg.replay.skip_zero_advantage,
      pack_corrections=cfg.replay.pack_corrections and losses_lib.segments_additive(
          cfg.loss.ratio_level, cfg.loss.aggregation))
  get_train = lambda i: comp.tasks.task("train", i)
  shard = {"shard_index": jax.process_index(), "shard_count": n_proc}
  rl_stream = streams.TaskStream(get_train, pool_size=cfg.task.train_size, seed=cfg.seed,
                                 **shard)
  ws_stream = streams.TaskStream(
      (lambda i: get_train(i + _WARMSTART_OFFSET)) if not cfg.task.train_size else get_train,
      pool_size=cfg.task.train_size, seed=cfg.seed + 1, **shard)
  agent = loop_lib.AgentLoop(
      workflow_factory=comp.workflow_factory, tokenizer=comp.tokenizer, replay=replay,
      stream=rl_stream, sample_fn=make_sample_fn(comp, cfg.seed),
      tasks_per_batch=cfg.rl.tasks_per_batch, group_size=cfg.rl.group_size,
      batches_in_flight=cfg.rl.batches_in_flight, max_context=cfg.rl.buckets[-1],
      max_new_tokens=cfg.workflow.max_new_tokens, stage_rewards=cfg.workflow.stage_rewards)

  # ---- state: fresh or restored
  phase, step = "warmstart", 0  # step: global step (warm-start steps, then RL updates)
  ref_params = None
  state = jax.device_put(learner.init_state(params0, ws_opt if ws_steps else rl_opt, cfg.seed),
                         sh.state)
  counters: collections.Counter = collections.Counter()
  # Greedy pass per held-out task at the end of the warm-start: the baseline of the paired gain.
  warm_passed: Optional[np.ndarray] = None
  if ckpt.latest_step() is not None:
    # The reference policy exists (and is saved) from the start of the RL phase on.
    with_ref = use_kl and ckpt.read_meta()["phase"] == "rl"
    abstract = {"state": state, "ref": params0} if with_ref else {"state": state}
    try:
      restored, host, meta = ckpt.restore(None, abstract)
    except ValueError as e:  # Orbax: the saved tree differs from `abstract`.
      raise ValueError(f"cannot resume from {ckpt.directory}: the checkpoint does not match "
                       f"this config (e.g. loss.kl_beta > 0 now but the RL phase was saved "
                       f"without a reference policy): {e}") from e
    state = jax.device_put(restored["state"], sh.state)
    if with_ref:
      ref_params = jax.device_put(restored["ref"], sh.ref_params)
    phase, step = meta["phase"], int(meta["step"])
    counters = collections.Counter(meta["counters"])
    if meta.get("warmstart_passed") is not None:
      warm_passed = np.asarray(meta["warmstart_passed"], bool)
    if phase == "rl":
      replay.load_state_dict(host["replay"], meta["replay"])
      agent.load_state_dict(host["loop"], meta["loop"])
    logging.info("resumed %s at global step %d", phase, step)
  metrics = MetricsWriter(workdir, cfg, total, step)

  def save():
    tree = {"state": state, "ref": ref_params} if ref_params is not None else {"state": state}
    host, meta = {}, {"phase": phase, "step": step, "counters": dict(counters),
                      "warmstart_passed": (None if warm_passed is None
                                           else [int(v) for v in warm_passed])}
    if phase == "rl":
      host["replay"], meta["replay"] = replay.state_dict()
      host["loop"], meta["loop"] = agent.state_dict()
      meta["data_position"] = rl_stream.position
    ckpt.save(step, tree, host, meta)

  def maybe_checkpoint(force=False):
    every = cfg.checkpoint.every
    if force or (every and step % every == 0):
      if ckpt.latest_step() != step:
        save()

  def stopping() -> bool:
    return stop_after is not None and step >= stop_after

  last_eval: dict[str, Any] = {}
  t_start = time.time()
  try:
    # ---- phase 1: warm-start
    if phase == "warmstart" and ws_steps:
      sft_step = learner.make_sft_step(comp.graphdef, cfg, ws_opt, shardings=sh)
      bs = cfg.warmstart.batch_size // n_proc  # this process's rows

      def host_batch(s):  # The batch of warm-start step s: a pure function of s.
        ws_stream.position = s * bs
        return sft_batch(comp, ws_stream.take(bs)[1])

      next_batch = host_batch(step)
      while step < ws_steps and not stopping():
        t0 = time.time()
        batch = put(next_batch)
        state, m = sft_step(state, batch)  # Dispatched asynchronously:
        step += 1
        if step < ws_steps:
          next_batch = host_batch(step)  # the next batch is built while the device works.
        m = jax.device_get(m)
        learner.check_skipped_updates([m], cfg.rl.max_skipped_updates, step)
        if step % cfg.log.every == 0 or step == ws_steps:
          dt = time.time() - t0
          row = {"step": step, "phase": "warmstart", "seconds": time.time() - t_start,
                 "warmstart/loss": m["loss"], "warmstart/token_accuracy": m["token_accuracy"],
                 "grad_norm": m["grad_norm"], "update_skipped": m["update_skipped"],
                 "tokens_per_s": float(batch.loss_mask.size) / max(dt, 1e-9)}
          if step == ws_steps:
            last_eval, warm_passed = evaluate(comp, agent, state.params, sampled=True)
            row.update(last_eval)
          metrics.write(row)
        metrics.progress(step, "warmstart", float(m["loss"]))
        maybe_checkpoint()
    elif phase == "warmstart" and not stopping():
      last_eval, warm_passed = evaluate(comp, agent, state.params, sampled=True)
      metrics.write(dict(step=step, phase="warmstart", seconds=time.time() - t_start,
                         **last_eval))

    # ---- phase 2: Agentic GRPO
    if phase == "warmstart" and step >= ws_steps and not stopping():
      phase = "rl"
      params = state.params
      if use_kl:
        ref_params = jax.device_put(jax.tree.map(jnp.copy, params), sh.ref_params)
      state = jax.device_put(learner.init_state(params, rl_opt, cfg.seed + 1), sh.state)
    if phase == "rl":
      update = learner.make_update_step(comp.graphdef, cfg, rl_opt, shardings=sh)
      rows = cfg.rl.rows_per_update // n_proc  # this process's rows of each update
      pending_rows: list[dict[str, float]] = []
      harvest_rows: list[dict[str, float]] = []  # this process's episodes
      log_state = {"t": time.time(), "tokens": 0, "logged": -1}

      pending_updates: list[tuple[Any, dict[str, float]]] = []
      totals = ("stale_dropped_segments", "stale_downweighted_segments", "corrections",
                "sign_reversals", "evicted_segments", "provisional_items", "correction_items")

      def log_rl(final: bool):
        nonlocal last_eval
        # Update metrics stay on device until here, so that host work overlaps the updates.
        updates = jax.device_get(pending_updates)
        pending_updates.clear()
        learner.check_skipped_updates([m for m, _ in updates], cfg.rl.max_skipped_updates, step)
        counters.update(comp.counting_pool.pop_counts())
        counters.update(agent.pop_counts())
        local = {"harvest": _sum_rows(harvest_rows), "counts": dict(counters),
                 "loop": dict(agent.counters), "position": rl_stream.position,
                 "epoch": rl_stream.epoch(),
                 "stats": [{k: float(v) for k, v in stats.items()} for _, stats in updates],
                 "replay": {k: replay.counters.get(k, 0) for k in totals}}
        # Every process's numbers (one collective; itself alone in a one-process run).
        everyone = parallel.allgather_json(local) if multi else [local]
        for i, (m_dev, stats) in enumerate(updates):
          if multi:  # the batch's rows came from every process
            stats = collections.Counter()
            for p in everyone:
              stats.update(p["stats"][i])
            stats["padding_fraction"] = float(np.mean([p["stats"][i]["padding_fraction"]
                                                       for p in everyone]))
          pending_rows.append({f"loss/{k}": float(v) for k, v in m_dev.items()})
          pending_rows[-1].update({f"replay/{k}": float(v) for k, v in stats.items()})
        now = time.time()
        row = {"step": step, "phase": "rl", "seconds": now - t_start,
               "tokens_per_s": log_state["tokens"] / max(now - log_state["t"], 1e-9)}
        if multi:
          row.update(_mean_rows(pending_rows))
          harvest = collections.defaultdict(lambda: [0.0, 0])
          for p in everyone:
            for k, (total, n) in p["harvest"].items():
              harvest[k][0] += total
              harvest[k][1] += n
          row.update({k: total / n for k, (total, n) in harvest.items()})
        else:
          row.update(_mean_rows(harvest_rows + pending_rows))
        for k in totals:
          row[f"replay/total_{k}"] = float(sum(p["replay"][k] for p in everyone))
        for group, prefix in (("counts", "counts"), ("loop", "loop")):
          merged = collections.Counter()
          for p in everyone:
            merged.update(p[group])
          row.update({f"{prefix}/{k}": float(v) for k, v in merged.items()})
        row["loop/data_position"] = float(sum(p["position"] for p in everyone))
        row["loop/epoch"] = float(min(p["epoch"] for p in everyone))
        if final or (cfg.eval.every and (step - ws_steps) % cfg.eval.every == 0):
          last_eval, _ = evaluate(comp, agent, state.params, sampled=final,
                                  baseline=warm_passed)
          row.update(last_eval)
        metrics.write(row)
        pending_rows.clear()
        harvest_rows.clear()
        log_state.update(t=time.time(), tokens=0, logged=step)

      idle_batches = 0
      buckets = cfg.rl.buckets
      while step < total and not stopping():
        version = step - ws_steps
        if multi:
          # The processes agree on whether to update and on the length bucket.
          ready = replay.num_ready
          want = (sampler_lib.prompt_bucket(replay.ready_lengths()[0], cfg.rl.buckets)
                  if ready else 0)
          agreed = parallel.host_allgather(np.array([ready, want, idle_batches], np.int64))
          if cfg.rl.max_idle_batches and agreed[:, 2].min() >= cfg.rl.max_idle_batches:
            logging.warning("%d episode batches in a row gave no learning signal on every "
                            "process (all advantages 0); ending the RL phase at step %d",
                            int(agreed[:, 2].min()), step)
            counters["rl_ended_without_signal"] += int(jax.process_index() == 0)
            break
          go = agreed[:, 0].min() >= rows or (agent.phase == "sample" and agreed[:, 0].max() > 0)
          buckets = (int(agreed[:, 1].max()),)
        else:
          go = replay.num_ready >= rows or (agent.phase == "sample" and replay.num_ready > 0)
        if go:
          batch = replay.take(rows, version, buckets) if replay.num_ready else None
          if multi and not parallel.host_allgather(np.int64(batch is not None)).any():
            continue  # no process has a row with a loss token
          if batch is None and not multi:
            continue
          stats = batch.stats if batch is not None else {
              "rows": 0, "loss_tokens": 0, "padding_fraction": 1.0}
          device_batch = put(batch.update if batch is not None
                             else core_types.UpdateBatch.padding(rows, buckets[0]))
          state, m = update(state, device_batch, ref_params)
          step += 1
          idle_batches = 0
          pending_updates.append((m, stats))
          log_state["tokens"] += int(device_batch.loss_mask.size)
          eval_due = cfg.eval.every and (step - ws_steps) % cfg.eval.every == 0
          if (step % cfg.log.every == 0 or eval_due) and step < total:
            log_rl(final=False)
          metrics.progress(step, "rl")
          if step < total:
            maybe_checkpoint()
          continue
        harvested = agent.step(state.params, version)
        if harvested:
          harvest_rows.append(harvested)
          if "reward/final" in harvested:
            idle_batches += 1
            if (cfg.rl.max_idle_batches and idle_batches >= cfg.rl.max_idle_batches
                and not multi):  # (multi-process: agreed at the top of the loop)
              logging.warning("%d episode batches in a row gave no learning signal (all "
                              "advantages 0); ending the RL phase at step %d", idle_batches, step)
              counters["rl_ended_without_signal"] += 1
              break
      if not stopping():
        log_rl(final=True)
        metrics.progress(step, "rl")  # the bar shows the final evaluation's pass@1
    maybe_checkpoint(force=True)
  finally:
    metrics.close()
    agent.close()
  if cfg.log.plot and not stopping() and metrics.primary:
    plot_learning_curve(metrics.history, os.path.join(workdir, "learning_curve.png"))
  warm = next((r for r in metrics.history if r.get("phase") == "warmstart"
               and "eval/pass_at_1" in r), {})
  return {"step": step, "phase": phase, "seconds": time.time() - t_start,
          "warmstart_pass_at_1": warm.get("eval/pass_at_1"),
          "final_pass_at_1": metrics.pass1, "last_eval": last_eval, "state": state}
