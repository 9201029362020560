"""The four-arm ablation of DESIGN.md §7 on the long-horizon task and the embedded default.

Arms (same model, warm-start, rollout budget and learning rate; only the credit differs):

| arm | stage rewards | stage credit applied | correction |
|---|---|---|---|
| `outcome` (outcome GRPO) | no | — | — |
| `post_hoc` (MT-GRPO / GiGPO-like) | yes | after the episode (`correction.stage_credit='post_hoc'`) | no |
| `no_correction` | yes | right after each stage | no |
| `agentic` (Agentic GRPO) | yes | right after each stage | yes |

Tasks: `long_horizon` (`task.source='long_horizon'`, K pieces, `workflow.stages=('pieces',)`) and
`default`
(the embedded synthetic task of `experiments/tiny_codegen.py`). Each (task, arm, seed) run is its
own workdir `ROOT/TASK/ARM/seedN`; a finished run leaves `done.json` there and is skipped when
the command is run again, an unfinished one resumes from its checkpoint (`train.run`), so the
whole ablation can span several sittings. The warm-start is shared: it runs once per (task,
seed) in `ROOT/TASK/warmstart/seedN` (stopped at the end of the warm-start, checkpointed), and
each arm's workdir starts from a copy of that checkpoint and its metrics, so every arm's RL phase
starts from the same parameters and is compared on the same warm-start evaluation.
Every run stops at the same number of training episodes (`rl.episode_budget`): outcome-only
GRPO consumes episodes faster per update than the staged arms. The learning rate is constant
(a cosine over `rl.num_steps` would decay at different rates per arm).

Outputs in ROOT: `results.md` (per task and arm, from each run's `metrics.jsonl`) and
`curves.png` (held-out pass@1 against episodes sampled and RL seconds, one line per arm, the
band spanning the seeds).

    python -m experiments.ablation --root=ablation            # the full ablation (hours)
    python -m experiments.ablation --root=/tmp/abl --quick    # every arm, minutes

The full run of `docs/ablation.md` and `ablation/results.md` (rerun it to resume; on 2 CPU
cores, 82 minutes as three copies of the command side by side, which share the root: each run
holds its workdir's lock, and a copy skips the arms another is running):

    python -m experiments.ablation --root=ablation --shared_warmstart --seeds=3 \
        --tasks=long_horizon,default --episode_budget=1024
"""

import json
import os
import shutil
import time
from typing import Any, Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections

from agentic_grpo import config as config_lib
from agentic_grpo.checkpoint import run_lock
from experiments import ablation_report
from experiments import tiny_codegen

ARMS = {
    "outcome": dict(stage_rewards=False, correction=False, stage_credit="immediate"),
    "post_hoc": dict(stage_rewards=True, correction=False, stage_credit="post_hoc"),
    "no_correction": dict(stage_rewards=True, correction=False, stage_credit="immediate"),
    "agentic": dict(stage_rewards=True, correction=True, stage_credit="immediate"),
}
TASKS = ("long_horizon", "default")
DONE = ablation_report.DONE


def arm_config(task: str, arm: str, seed: int, quick: bool = False, *, num_stages: int = 4,
               final_reward_delay_s: float = 0.0,
               final_reward_lag: int = 0) -> ml_collections.ConfigDict:
  """The run config of one (task, arm, seed); `num_stages` and `final_reward_delay_s` apply to
  the long-horizon task, `final_reward_lag` (`rl.final_reward_lag`: agent-loop harvests from a
  batch's last stage to its final reward in the replay) to both, the same in every arm.

  Raises:
    ValueError: for an unknown task or arm.
  """
  if task not in TASKS or arm not in ARMS:
    raise ValueError(f"task must be in {TASKS} and arm in {tuple(ARMS)}, got {task!r}, {arm!r}")
  c = tiny_codegen.get_config()
  c.seed = seed
  c.optim.schedule = "constant"
  c.rl.num_steps = 100_000  # the episode budget ends the phase
  c.rl.episode_budget = 1024
  c.task.eval_size = 256
  c.eval.every = 10
  c.eval.num_samples = 0
  c.eval.headroom_tasks = 0  # 24 runs: the warm-start's headroom is the same in every arm
  c.log.every = 1
  c.log.progress_bar = False
  c.checkpoint.every = 20
  c.rl.final_reward_lag = final_reward_lag
  if task == "long_horizon":
    c.task.source = "long_horizon"
    c.task.depths = (num_stages,)
    c.workflow.stages = ("pieces",)
    c.workflow.num_pieces = num_stages
    c.workflow.final_reward_delay_s = final_reward_delay_s
    # Episodes of about 330 tokens (K = 4; 420 at most): pieces are one primitive each.
    c.workflow.max_new_tokens = 32
    c.loss.max_tokens = 32
    c.rl.buckets = (256, 448)
    # A third piece's prompts are 200-320 tokens: its whole-prompt prefill at 320 or 384 slots
    # instead of the 448 bucket's (docs/benchmarks.md, "Narrower prefills").
    c.rl.prefill_widths = (320, 384)
    c.rl.packed_buckets = (512,)  # one packed row length (the default task's reason)
    # Updates of 1-64 packed rows: chunks of 2 (4 before: 5.5% more token slots of padding in
    # the benchmark's 30 updates, docs/benchmarks.md, "Loss slots").
    c.rl.update_chunk_rows = 2
    # About 24 loss tokens in a packed row of 512 slots: the last block and the output head at
    # those slots only (a quarter of the row's when they fit), the same update up to float
    # rounding (docs/benchmarks.md, "Loss slots").
    c.rl.loss_slot_fractions = (0.25,)
    # The attention's backward written out (`models.attention`): the same forward, gradients
    # up to float rounding, an update step about 10% faster (docs/benchmarks.md).
    c.model.attention_backward = "explicit"
    c.warmstart.seq_len = 448
    c.warmstart.steps = 300
    # A smaller RL step than the default task's 1e-4: a first full-budget seed at 1e-4 lost
    # 2 to 4 points of held-out pass@1 in every arm, outcome GRPO's 8 updates included
    # (docs/ablation.md). Pass@1 needs all K pieces right, so it amplifies per-piece noise.
    c.optim.learning_rate = 3e-5
    # Each piece is its own check: no previous-stage baseline (the default task's, where the
    # code stage builds on the hypothesis). With it a piece was credited with its pass minus
    # the previous piece's, another primitive's: at the warm-start 11% of passing pieces got a
    # negative provisional advantage, and outcome GRPO's target on pieces 2..K was not the
    # outcome's (docs/ablation.md, "Diagnosis of the stage arms").
    c.correction.baseline = "none"
  spec = ARMS[arm]
  # Every stage's provisional update is made, as the arms are defined (DESIGN.md §7): the
  # default task's `supersede_queued` would fold the last stage's provisional rows into the
  # outcome row in the `agentic` arm alone (with lag 0), a difference the module docstring's
  # table does not name. `--set=correction.supersede_queued=True` turns it on for every arm.
  c.correction.supersede_queued = False
  # The ablation's budget is episodes: dynamic sampling would spend about half of it on groups
  # it drops, and its measured arms (docs/ablation.md) ran without it and without a KL penalty,
  # whatever the default task sets. `--set=rl.dynamic_sampling=True --set=loss.kl_beta=0.04`
  # turns them on.
  c.rl.dynamic_sampling = False
  c.loss.kl_beta = 0.0
  c.workflow.stage_rewards = spec["stage_rewards"]
  c.correction.enabled = spec["correction"]
  c.correction.stage_credit = spec["stage_credit"]
  if quick:
    _shrink(c, task)
  return c


def _shrink(c: ml_collections.ConfigDict, task: str) -> None:
  """A micro model, a few warm-start steps and a budget of a few episode batches."""
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
  c.warmstart.update(steps=2, batch_size=4)
  c.rl.update(tasks_per_batch=2, group_size=2, rows_per_update=4, batches_in_flight=2,
              episode_budget=8)
  c.rl.buckets = c.rl.buckets[-1:]
  c.workflow.max_new_tokens = 12
  c.loss.max_tokens = 12
  c.task.eval_size = 4
  c.eval.every = 2
  c.replay.skip_zero_advantage = False  # a random model's groups tie: still take steps
  c.checkpoint.every = 0
  c.log.plot = False
  c.log.tensorboard = False
  del task


_WAIT_S = 30.0  # between looks at a warm-start another invocation is training


def workdir(root: str, task: str, arm: str, seed: int) -> str:
  return os.path.join(root, task, arm, f"seed{seed}")


def _warm_start(train, root: str, task: str, seed: int, options: dict[str, Any]) -> str:
  """The shared warm-start of (task, seed): run (or resumed) to its end; returns its workdir."""
  wd = os.path.join(root, task, "warmstart", f"seed{seed}")
  while not os.path.exists(os.path.join(wd, DONE)):
    cfg = config_lib.from_config_dict(arm_config(task, "outcome", seed, **options))
    logging.info("warm-start %s", wd)
    try:
      train.run(cfg, wd, stop_after=cfg.warmstart.steps)
    except run_lock.WorkdirLockedError as e:  # another invocation trains it: wait for it
      logging.info("waiting for the warm-start: %s", e)
      time.sleep(_WAIT_S)
      continue
    with open(os.path.join(wd, DONE), "w") as f:
      json.dump({"step": cfg.warmstart.steps}, f)
  return wd


def _seed_from(warm: str, wd: str) -> None:
  """Starts `wd` from the shared warm-start's checkpoint and metrics (unless it has its own)."""
  if os.path.exists(os.path.join(wd, "checkpoints")):
    return  # a run in progress: it resumes from its own checkpoint
  os.makedirs(wd, exist_ok=True)
  shutil.copy(os.path.join(warm, "metrics.jsonl"), os.path.join(wd, "metrics.jsonl"))
  tmp = os.path.join(wd, "checkpoints.tmp")
  shutil.rmtree(tmp, ignore_errors=True)  # a copy a killed seeding left half done
  shutil.copytree(os.path.join(warm, "checkpoints"), tmp)
  os.rename(tmp, os.path.join(wd, "checkpoints"))  # absent (checked above): nothing overwritten


def run_all(root: str, tasks: Sequence[str], arms: Sequence[str], seeds: Sequence[int], *,
            quick: bool = False, num_stages: int = 4, final_reward_delay_s: float = 0.0,
            final_reward_lag: int = 0, episode_budget: int = 0,
            overrides: Sequence[str] = (), shared_warmstart: bool = False) -> list[str]:
  """Runs (or resumes, or skips) every (task, arm, seed); returns the workdirs run now.

  With `shared_warmstart` every seed of a task starts from seed 0's warm-start
  (`ROOT/TASK/warmstart/seed0`); the arm runs keep their own seed (RL sampling keys).
  `episode_budget` replaces the config's when > 0. `overrides` (`SECTION.FIELD=VALUE`, e.g.
  `optim.learning_rate=1e-4`: the same in every arm's RL phase; the shared warm-start keeps its
  own config) are applied last (`config.apply_overrides`).

  Raises:
    ValueError: a malformed override, or one that names no config field.

  Several invocations may share `root` (e.g. one per core): each run holds its workdir's lock
  (`run_lock`), an arm another invocation is running is skipped, and a warm-start another
  invocation is training is waited for.
  """
  from agentic_grpo import train  # pylint: disable=g-import-not-at-top (JAX start-up)
  ran = []
  options = dict(quick=quick, num_stages=num_stages, final_reward_delay_s=final_reward_delay_s,
                 final_reward_lag=final_reward_lag)
  for task in tasks:
    for seed in seeds:  # seeds outermost: a partial ablation still pairs arms per seed
      todo = [a for a in arms
              if not os.path.exists(os.path.join(workdir(root, task, a, seed), DONE))]
      if not todo:
        logging.info("skipping %s seed %d (every arm finished)", task, seed)
        continue
      warm = _warm_start(train, root, task, 0 if shared_warmstart else seed, options)
      for arm in todo:
        wd = workdir(root, task, arm, seed)
        if os.path.exists(os.path.join(wd, DONE)):
          continue  # finished meanwhile by another invocation on the same root
        cfg = arm_config(task, arm, seed, **options)
        if episode_budget:
          cfg.rl.episode_budget = episode_budget
        config_lib.apply_overrides(cfg, overrides)
        try:
          with run_lock.WorkdirLock(wd):  # never seed under a run in progress
            _seed_from(warm, wd)
          logging.info("running %s", wd)
          out = train.run(config_lib.from_config_dict(cfg), wd)
        except run_lock.WorkdirLockedError as e:  # another invocation runs this arm
          logging.info("skipping %s: %s", wd, e)
          continue
        with open(os.path.join(wd, DONE), "w") as f:
          json.dump({"step": out["step"], "final_pass_at_1": out["final_pass_at_1"],
                     "warmstart_pass_at_1": out["warmstart_pass_at_1"]}, f)
        ran.append(wd)
  return ran


def main(argv: Sequence[str]) -> None:
  del argv
  bad = sorted(set(_TASKS.value) - set(TASKS)) + sorted(set(_ARMS.value) - set(ARMS))
  if not _TASKS.value or not _ARMS.value:
    raise app.UsageError(f"--tasks and --arms must name at least one each; tasks: {TASKS}, "
                         f"arms: {tuple(ARMS)}")
  if bad:
    raise app.UsageError(f"unknown tasks or arms {bad}; tasks: {TASKS}, arms: {tuple(ARMS)}")
  seeds = range(1 if _QUICK.value else _SEEDS.value)
  run_all(_ROOT.value, _TASKS.value, _ARMS.value, seeds, quick=_QUICK.value,
          num_stages=_STAGES.value, final_reward_delay_s=_DELAY.value,
          final_reward_lag=_LAG.value, episode_budget=_BUDGET.value,
          overrides=_SET.value, shared_warmstart=_SHARED.value)
  ablation_report.write(_ROOT.value, _TASKS.value, _ARMS.value, list(seeds))


if __name__ == "__main__":
  # Flags only when run as a program: tests and other modules import this one next to
  # programs that define the same flag names (tests/launch_imports_test.py).
  _ROOT = flags.DEFINE_string("root", "ablation", "Directory of the runs and the results.")
  _QUICK = flags.DEFINE_bool("quick", False, "Micro model and budgets: every arm in minutes.")
  _SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds per (task, arm) (--quick: 1).")
  _TASKS = flags.DEFINE_list("tasks", list(TASKS), f"Tasks, from {TASKS}.")
  _ARMS = flags.DEFINE_list("arms", list(ARMS), f"Arms, from {tuple(ARMS)}.")
  _STAGES = flags.DEFINE_integer("num_stages", 4, "K, pieces of a long-horizon task.")
  _DELAY = flags.DEFINE_float("final_reward_delay_s", 0.0,
                              "Latency of the long-horizon final judge (seconds).")
  _LAG = flags.DEFINE_integer(
      "final_reward_lag", 0, "Agent-loop harvests from a batch's last stage to its final reward "
      "landing in the replay (rl.final_reward_lag), the same in every arm.")
  _BUDGET = flags.DEFINE_integer("episode_budget", 0,
                                 "Training episodes per run (0: the config's default).")
  _SET = flags.DEFINE_multi_string(
      "set", [], "SECTION.FIELD=VALUE applied to every arm's config, e.g. "
      "--set=optim.learning_rate=1e-4 --set=rl.rows_per_update=16 (the shared warm-start keeps "
      "its own config).")
  _SHARED = flags.DEFINE_bool(
      "shared_warmstart", False, "One warm-start per task (seed 0's), shared by every seed: the "
      "seeds then differ in the RL phase only (its sampling keys); the cheap choice on a CPU.")
  app.run(main)
