r"""What a run's greedy programs are on the held-out tasks: right, the teacher's habit, or other.

The embedded default's warm-start imitates an imperfect teacher that writes a fixed mix-up of
each task's program (`tasks.synthetic.teacher_confusion`: `add1` as `add2`, `max` as `min`).
Pass@1 says how often the greedy program is right; this says what the others are. For each
checkpoint, the greedy episodes on the run's held-out tasks are judged twice on the hidden
inputs: against the task's program (pass@1 as the run reports it) and against the teacher's
confusion of it (the habit). What passes neither is `other`. RL that removes the habit shows
as `habit` falling; where that share goes, to `right` or to `other`, is what the pass@1 gain
does not tell:

    python -m experiments.habit_share --run=WORKDIR [--steps=300,480]

The episodes are sampled once per checkpoint and both verdicts are of the same programs (the
final judgement runs twice, `dual_judge`). One process only. Writes
`WORKDIR/habit_share.json` (`{step: {"right", "habit", "other", "both", "tasks"}}`, shares of
the held-out tasks; `both`: programs the hidden inputs cannot tell apart from either, counted
in `right` and `habit`) and prints a table. Synthetic task sources only (a task without a
program has no confusion, and its programs count as `right` or `other`).
"""

import dataclasses
import json
import os
from typing import Optional, Sequence

from absl import app
from absl import flags
import numpy as np

from agentic_grpo import parallel
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import device as device_lib
from agentic_grpo.train import eval_only

OUT = "habit_share.json"


def habit_task(task: task_lib.Task) -> Optional[task_lib.Task]:
  """`task` with its hidden tests' expected outputs those of the teacher's confusion of its
  program, or None when it has none (no synthetic program, or the identity)."""
  confused = synthetic.teacher_confusion(task)
  if confused is None:
    return None
  return dataclasses.replace(task, hidden_tests=tuple(
      task_lib.Example(e.args, confused(e.args[0])) for e in task.hidden_tests))


def dual_judge(cls: type, habit_passed: dict[str, bool]) -> type:
  """A subclass of workflow class `cls` whose final judgement is the task's (returned, as
  `cls`'s) and, of the very same programs, the habit's (`habit_task`): each task's habit
  verdict (passed every hidden test) goes to `habit_passed[task_id]`; a task without a habit
  gets False."""

  class DualJudge(cls):

    def finish(self, episodes):
      result = super().finish(episodes)
      kept = [(ep.task, ep.code, ep.final_reward) for ep in episodes]
      habits = [habit_task(ep.task) for ep in episodes]
      judged = [i for i, h in enumerate(habits) if h is not None]
      for ep in episodes:
        habit_passed[ep.task.task_id] = False
      for i in judged:
        episodes[i].task = habits[i]
      if judged:
        verdict = super().finish([episodes[i] for i in judged])
        for i, r in zip(judged, verdict.rewards, strict=True):
          habit_passed[kept[i][0].task_id] = bool(r >= 1.0)
      for ep, (task, code, reward) in zip(episodes, kept, strict=True):
        ep.task, ep.code, ep.final_reward = task, code, reward
      return result

  return DualJudge


def shares(right: np.ndarray, habit: np.ndarray) -> dict[str, float]:
  """The shares of `[n]` bool verdicts: `right`, `habit`, `other` (neither), `both`."""
  right, habit = np.asarray(right, bool), np.asarray(habit, bool)
  return {"right": float(right.mean()), "habit": float(habit.mean()),
          "other": float((~right & ~habit).mean()), "both": float((right & habit).mean()),
          "tasks": int(right.size)}


def measure(run: str, steps: Optional[Sequence[int]] = None, *, pool=None,
            workflow_factory: Optional[type] = None) -> dict[int, dict[str, float]]:
  """The shares of checkpoints `steps` of `run` (default: the warm-start's last, kept
  checkpoint and the newest one), on the run's held-out tasks, greedy. Single process.

  Args:
    run: the run's workdir.
    steps: checkpoint steps.
    pool: a sandbox pool to use (default: a new one, closed at the end).
    workflow_factory: the workflow class (default `agent.workflow.Workflow`; tests).

  Raises:
    eval_only.WorkdirError: `run` is missing or holds no config.json.
    ValueError: a run whose task source is not synthetic, or more than one process.
    FileNotFoundError, checkpointer.CheckpointIntegrityError: a missing or damaged checkpoint.
  """
  cfg = eval_only.saved_config(run)
  if cfg.task.source != "synthetic":
    raise ValueError(f"task.source must be 'synthetic' (the teacher's confusion is of a "
                     f"synthetic program), got {cfg.task.source!r}")
  if parallel.process_count() > 1:
    raise ValueError(f"habit_share runs in one process (it judges every held-out task "
                     f"itself), this one is of {parallel.process_count()}")
  comp = components_lib.build(cfg, pool=pool)
  ckpt = checkpointer.Checkpointer(os.path.join(run, "checkpoints"))
  try:
    if steps is None:
      newest = ckpt.intact_step()
      steps = sorted({s for s in (cfg.warmstart.steps, newest) if s in ckpt.all_steps()})
    agent = eval_only._agent(comp)  # pylint: disable=protected-access (the run's own shape)
    judge = dataclasses.replace(cfg.workflow, stage_rewards=True,
                                reward_mode=stages_lib.ALL_PASS)
    habit_passed: dict[str, bool] = {}
    cls = dual_judge(workflow_factory or workflow_lib.Workflow, habit_passed)
    factory = lambda: cls(judge, comp.pool, tokenizer=comp.tokenizer)
    out = {}
    try:
      for step in steps:
        params, _ = device_lib.restore_policy(comp, ckpt, step)
        habit_passed.clear()
        final, _ = agent.run_episodes(params, comp.eval_tasks, greedy=True, rng_counter=-1,
                                      workflow_factory=factory)
        habit = [habit_passed[t.task_id] for t in comp.eval_tasks]
        out[int(step)] = shares(final[:, 0] >= 1.0, np.array(habit, bool))
    finally:
      agent.close()
  finally:
    ckpt.close()
    if pool is None:
      comp.pool.close()
  return out


def table(result: dict[int, dict[str, float]]) -> str:
  lines = ["| step | right | the teacher's habit | other | both |", "|---|---|---|---|---|"]
  for step, s in sorted(result.items()):
    lines.append(f"| {step} | {s['right']:.3f} | {s['habit']:.3f} | {s['other']:.3f} | "
                 f"{s['both']:.3f} |")
  return "\n".join(lines) + "\n"


_RUN = _STEPS = None


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not _RUN.value:
    raise app.UsageError("--run is required: a run's workdir")
  steps = [int(s) for s in _STEPS.value] if _STEPS.value else None
  try:
    result = measure(_RUN.value, steps)
  except (eval_only.WorkdirError, ValueError, FileNotFoundError, RuntimeError) as e:
    raise app.UsageError(str(e)) from e
  path = os.path.join(_RUN.value, OUT)
  with open(path, "w", encoding="utf-8") as f:
    json.dump({str(k): v for k, v in result.items()}, f, indent=1)
  print(table(result), flush=True)
  print(f"written: {path}", flush=True)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines `--run` and `--steps` (see `warmstart_control.define_flags`)."""
  global _RUN, _STEPS  # pylint: disable=global-statement
  _RUN = flags.DEFINE_string("run", None, "A run's workdir.", flag_values=flag_values)
  _STEPS = flags.DEFINE_list("steps", None, "Checkpoint steps (default: the warm-start's last "
                             "and the newest).", flag_values=flag_values)


if __name__ == "__main__":
  define_flags()
  app.run(main)
