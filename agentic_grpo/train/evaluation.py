"""Held-out evaluation: greedy pass@1 with its standard error, the paired gain over the
warm-start, stage rewards and sampled pass@k (`evaluate`); the estimators `pass_at_k` and
`paired_gain`.
"""

import math
import time
from typing import Any, Optional

from absl import logging
import numpy as np

from agentic_grpo.agent import loop as loop_lib
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import streams
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import device as device_lib


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


def evaluate(comp: components_lib.Components, agent: loop_lib.AgentLoop, params: Any, *,
             sampled: bool, baseline: Optional[np.ndarray] = None
             ) -> tuple[dict[str, float], np.ndarray]:
  """Held-out metrics: greedy pass@1, hidden-test fraction, stage rewards, sampled pass@k.

  `params` is the policy to evaluate (`DeviceSide.policy`, an opaque handle).

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
  width = comp.coord.eval_width(cfg.task.eval_size)  # tasks run by every process
  padding = comp.eval_tasks[-1:] or [comp.tasks.task(cfg.task.eval_split, 0)]
  tasks = list(comp.eval_tasks) + padding * (width - own)
  gather = lambda x: comp.coord.gather_task_rows(x, own, cfg.task.eval_size)
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
        sample_fn=device_lib.make_sample_fn(comp, cfg.seed, temperature=cfg.eval.temperature))
    final_s = gather(final_s)
    correct = (final_s >= 1.0).sum(axis=1)
    for k in cfg.eval.k:
      out[f"eval/pass_at_{k}_sampled"] = float(np.mean([pass_at_k(n, int(c), k) for c in correct]))
  out["eval/timeouts"] = float(comp.coord.total(int(counting.pop_counts().get("timeout", 0))))
  out["eval/seconds"] = time.time() - t0
  return out, passed

