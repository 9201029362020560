"""Held-out evaluation: greedy pass@1 with its standard error, the paired gain over the
warm-start, stage rewards and sampled pass@k (`evaluate`), the headroom of RL (`headroom`:
pass@1 and pass@G at the RL temperature, held-out and training tasks); the estimators
`pass_at_k` and `paired_gain`, and `sampled_pass_at_k` (the sampled episodes behind both).

Sampling keys (the agent loop's `rng_counter`, counted down per sampler call) are disjoint from
the training stream's (positive) and from each other: greedy episodes from -1, pass@k samples
from `-(1 << 20)`, the headroom's held-out samples from `-(2 << 20)`, its training-task samples
from `-(3 << 20)`. So each number is a function of the parameters and the seed alone.
"""

import math
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
import numpy as np

from agentic_grpo.agent import loop as loop_lib
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import streams
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import sampling


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


# First sampling counters (module docstring).
_SAMPLED_RNG = -(1 << 20)
_HEADROOM_HELDOUT_RNG = -(2 << 20)
_HEADROOM_TRAIN_RNG = -(3 << 20)


def _padded(comp: components_lib.Components, own: list, total: int, split: str) -> list:
  """This process's tasks `own` (its share of `total` tasks of `split`), padded with its last
  one (or the split's first) to the largest share, so that every process makes the same
  sampler calls."""
  padding = list(own[-1:]) or [comp.tasks.task(split, 0)]
  return list(own) + padding * (comp.coord.eval_width(total) - len(own))


def sampled_pass_at_k(comp: components_lib.Components, agent: loop_lib.AgentLoop, params: Any,
                      own: list, total: int, split: str, *, num_samples: int,
                      ks: Sequence[int], rng_counter: int,
                      workflow_factory: Callable[[], Any],
                      sample_fn: Optional[loop_lib.SampleFn] = None) -> dict[int, float]:
  """Unbiased pass@k (`pass_at_k`, Chen et al., 2021) of `num_samples` sampled episodes per
  task, averaged over `total` tasks of `split` (every process's share gathered).

  Args:
    comp, agent, params: as in `evaluate`.
    own: this process's share of the tasks (`parallel.process_slice(total)`; all of them in
      one process).
    total: tasks over all processes.
    split: their split (padding of an empty share).
    num_samples: episodes per task (n of pass@k).
    ks: the k of pass@k, each in [1, num_samples].
    rng_counter: the first sampling counter (module docstring).
    workflow_factory: the workflow that scores the episodes; an episode passes when its final
      reward is >= 1.
    sample_fn: the sampler (`agent.loop.SampleFn`); the agent loop's own (`rl.temperature`)
      when None.

  Returns:
    `{k: pass@k}`, floats in [0, 1], the same in every process.
  """
  tasks = _padded(comp, own, total, split)
  final, _ = agent.run_episodes(params, tasks, greedy=False, repeats=num_samples,
                                rng_counter=rng_counter, workflow_factory=workflow_factory,
                                sample_fn=sample_fn)
  final = comp.coord.gather_task_rows(final, len(own), total)
  correct = (final >= 1.0).sum(axis=1)
  return {k: float(np.mean([pass_at_k(num_samples, int(c), k) for c in correct])) for k in ks}


def headroom(comp: components_lib.Components, agent: loop_lib.AgentLoop, params: Any, *,
             workflow_factory: Callable[[], Any]) -> dict[str, float]:
  """What RL can still gain: pass@1 and pass@G of G = `rl.group_size` attempts per task drawn
  as the RL phase draws them (the agent loop's sampler: `rl.temperature`, `rl.top_k`,
  `rl.top_p`), on `components.headroom_sizes(cfg, tasks)` held-out and training tasks (each
  task once: no more than a finite split holds).

  pass@1 is the expected reward of one attempt; pass@G the share of tasks whose group of G
  holds a pass, i.e. (with all-or-nothing rewards) of groups that would carry learning signal
  unless all G pass. A gap between them is room for RL; pass@G near pass@1 means the groups
  tie. Training tasks are the first of the training split (the RL phase's first tasks when the
  stream is endless).

  Returns:
    `headroom/heldout_pass_at_1`, `headroom/heldout_pass_at_G`, and with training tasks
    `headroom/train_pass_at_1`, `headroom/train_pass_at_G` (floats in [0, 1]); empty when
    `eval.headroom_tasks` is 0.
  """
  cfg = comp.cfg
  g = cfg.rl.group_size
  heldout, train = comp.headroom_totals if any(comp.headroom_totals) else (
      components_lib.headroom_sizes(cfg, comp.tasks))
  out = {}
  for name, own, total, split, counter in (
      ("heldout", comp.headroom_tasks, heldout, cfg.task.eval_split, _HEADROOM_HELDOUT_RNG),
      ("train", comp.headroom_train_tasks, train, "train", _HEADROOM_TRAIN_RNG)):
    if not total:
      continue
    p = sampled_pass_at_k(comp, agent, params, own, total, split, num_samples=g, ks=(1, g),
                          rng_counter=counter, workflow_factory=workflow_factory)
    out[f"headroom/{name}_pass_at_1"] = p[1]
    out[f"headroom/{name}_pass_at_G"] = p[g]
  return out


def stage_metrics(stages: dict[str, np.ndarray]) -> dict[str, float]:
  """Per stage, from the evaluation's stage rewards (scored with `reward_mode='fraction'`, in
  [0, 1]): `eval/reward/<stage>`, their mean (for a code-running stage the fraction of its
  checks passed), and `eval/stage_pass/<stage>`, the share of episodes whose stage passed all
  its checks (reward >= 1): the stage reward a run with `workflow.reward_mode='all_pass'` is
  trained on. The two differ by the partial passes: a long-horizon piece that passes 2 of its
  3 examples adds 2/3 to the first and 0 to the second.
  """
  out = {}
  for name, r in stages.items():
    r = np.asarray(r, np.float64)
    out[f"eval/reward/{name}"] = float(np.mean(r))
    out[f"eval/stage_pass/{name}"] = float(np.mean(r >= 1.0))
  return out


def evaluate(comp: components_lib.Components, agent: loop_lib.AgentLoop, params: Any, *,
             sampled: bool, baseline: Optional[np.ndarray] = None
             ) -> tuple[dict[str, float], np.ndarray]:
  """Held-out metrics: greedy pass@1, hidden-test fraction, stage rewards, sampled pass@k.

  `params` is the policy to evaluate (`DeviceSide.policy`, an opaque handle).

  The held-out tasks are `comp.eval_count` distinct ones: `task.eval_size`, or the whole
  held-out split when it is smaller (each task once, never repeated: `components.eval_count`).

  Returns `(metrics, passed)`: `passed` is `[comp.eval_count]` bool, greedy pass per held-out
  task (in task order). `metrics` holds `eval/pass_at_1` with its binomial standard error
  `eval/pass_at_1_stderr` over those tasks, `eval/num_tasks` (how many), the stage rewards
  (`stage_metrics`: `eval/reward/<stage>` and `eval/stage_pass/<stage>`), and, given `baseline`
  (an earlier `passed`, e.g. the warm-start's), the paired gain over it `eval/pass_at_1_gain`
  with `eval/pass_at_1_gain_stderr` (`paired_gain`).

  With `sampled`, also sampled pass@k (`eval.num_samples` per task at `eval.temperature`:
  `eval/pass_at_<k>_sampled`) and the headroom at the RL temperature (`headroom/...`,
  `headroom`).

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
  total = comp.eval_count
  tasks = _padded(comp, comp.eval_tasks, total, cfg.task.eval_split)
  gather = lambda x: comp.coord.gather_task_rows(x, own, total)
  final, stages = agent.run_episodes(params, tasks, greedy=True, rng_counter=-1,
                                     workflow_factory=factory)
  final = gather(final)
  stages = {name: gather(r) for name, r in stages.items()}
  passed = final[:, 0] >= 1.0
  p1 = float(np.mean(passed))
  out = {"eval/pass_at_1": p1,
         "eval/pass_at_1_stderr": math.sqrt(p1 * (1.0 - p1) / max(len(passed), 1)),
         "eval/hidden_frac": float(np.mean(final[:, 0])),
         "eval/num_tasks": float(len(passed))}
  if baseline is not None and len(baseline) != len(passed):
    logging.warning("no paired gain: the warm-start was evaluated on %d held-out tasks, this "
                    "evaluation on %d (task.eval_size or the held-out split changed?)",
                    len(baseline), len(passed))
  elif baseline is not None and len(passed) > 1:
    out["eval/pass_at_1_gain"], out["eval/pass_at_1_gain_stderr"] = paired_gain(baseline, passed)
  out.update(stage_metrics(stages))
  if sampled and cfg.eval.num_samples > 0:
    p = sampled_pass_at_k(
        comp, agent, params, comp.eval_tasks, total, cfg.task.eval_split,
        num_samples=cfg.eval.num_samples, ks=cfg.eval.k, rng_counter=_SAMPLED_RNG,
        workflow_factory=factory,
        sample_fn=sampling.make_sample_fn(comp, cfg.seed, temperature=cfg.eval.temperature))
    out.update({f"eval/pass_at_{k}_sampled": v for k, v in p.items()})
  if sampled:
    out.update(headroom(comp, agent, params, workflow_factory=factory))
  out["eval/timeouts"] = float(comp.coord.total(int(counting.pop_counts().get("timeout", 0))))
  out["eval/seconds"] = time.time() - t0
  return out, passed

