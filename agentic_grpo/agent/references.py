"""Reference episodes: the ideal episode of a task, for the supervised warm start.

`reference_segments(workflow, task)` writes the episode a perfect agent would, without running
anything: hypothesis: the reference output on the probe; code: the reference solution (as an
expression when it is a one-line `return`); tests: the k shortest hidden tests that are not
public inputs; debug: `keep` (or the code again). Observations assume that the reference passes
its public examples (true of synthetic tasks by construction; checked against a real run by the
tests).

Near-miss fix episodes (`WorkflowConfig.reference_fix_fraction`): a share of tasks, drawn per
task id, writes a near miss (`synthetic.near_miss`: a wrong program one edit from the reference
that fails a public example) as its code, shows its failures (run in process: it is the task
generator's own program) in the first debug stage, and writes the reference there as the fix.
So the warm start shows what debugging is for, not only `keep` after passing code.

An imperfect teacher (`WorkflowConfig.reference_error_rate`): a share of tasks, drawn per task
id, is written as if the task's program were its systematic confusion
(`synthetic.teacher_confusion`): the hypothesis predicts the confused program's output on the
probe and the code is the confused program. The prompt (and its public examples) stay the
task's own, so the episode is a consistent mistake of the kind a weaker model makes.
"""

import collections
import dataclasses
import hashlib
from typing import Optional

from agentic_grpo.agent import code_parsing
from agentic_grpo.agent import episodes as episodes_lib
from agentic_grpo.agent import prompts
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib


def near_miss(wf: workflow_lib.Workflow, task: task_lib.Task) -> Optional[synthetic.Program]:
  """The near miss a reference episode of `task` starts from, or None: with no debug stage,
  outside the drawn `reference_fix_fraction` of task ids, or for a task without a near miss.

  The draw is a hash of the task id (the same in every process and every run).
  """
  fraction = wf.config.reference_fix_fraction
  if fraction <= 0 or not any(isinstance(s, stages_lib.DebugStage) for s in wf.stages):
    return None
  if not _drawn("fix", task, fraction):
    return None
  return synthetic.near_miss(task)


def _drawn(salt: str, task: task_lib.Task, fraction: float) -> bool:
  """Whether `task` falls in the `fraction` of task ids drawn by a hash salted with `salt`."""
  draw = int.from_bytes(hashlib.sha256(f"{salt}:{task.task_id}".encode()).digest()[:8], "big")
  return draw / 2.0**64 < fraction


def teacher_task(wf: workflow_lib.Workflow, task: task_lib.Task) -> task_lib.Task:
  """The task as the imperfect teacher sees it: `task` itself, or, in the drawn
  `reference_error_rate` share of task ids, `task` with the reference solution and probe
  output of its systematic confusion (`synthetic.teacher_confusion`). Prompt, examples and
  tests are unchanged. The draw is a hash of the task id (the same in every process and run)."""
  rate = wf.config.reference_error_rate
  if rate <= 0 or not _drawn("teacher", task, rate):
    return task
  wrong = synthetic.teacher_confusion(task)
  if wrong is None:
    return task
  probe = wrong(task.probe[0]) if task.probe is not None and len(task.probe) == 1 else (
      task.probe_expected)
  return dataclasses.replace(task, reference_solution=wrong.source(task.entry_point,
                                                                   task.param_names[0]),
                             probe_expected=probe)


def reference_outputs(wf: workflow_lib.Workflow, task: task_lib.Task) -> list[str]:
  """The ideal output of every stage of `wf` for `task` (closing delimiter included).

  Raises:
    ValueError: if the task has no reference solution.
  """
  return [s.output for s in reference_segments(wf, task)]


def reference_segments(wf: workflow_lib.Workflow, task: task_lib.Task
                       ) -> list[episodes_lib.Segment]:
  """The ideal episode of `task` under workflow `wf`, one segment per stage (see the module
  docstring). Runs nothing (`wf.pool` may be None).

  Raises:
    ValueError: if the task has no reference solution.
  """
  if task.reference_solution is None:
    raise ValueError(f"task {task.task_id!r} has no reference_solution")
  task = teacher_task(wf, task)
  fmt = wf.prompt_format
  ep = episodes_lib.Episode(task=task)
  miss = near_miss(wf, task)
  fixed = False
  for k, stage in enumerate(wf.stages):
    is_debug = isinstance(stage, stages_lib.DebugStage)
    if is_debug:
      attempt = miss if (miss is not None and not fixed) else None
      turn = prompts.Turn(observation=stage.reference_observation(ep, attempt))
    else:
      turn = stage.turns([ep], None, execution.Guard(stage.name, collections.Counter()))[0]
    opening = fmt.environment_turn(stage.kind, turn, prompt=task.prompt if k == 0 else "",
                                   task_kind=task.kind)
    if miss is not None and isinstance(stage, stages_lib.CodeStage):
      body = miss.expression(task.param_names[0])  # the failing first attempt
    elif miss is not None and is_debug and not fixed:
      body, fixed = code_parsing.compact_reference(task), True  # the fix
    else:
      body = stage.reference_output(ep)
    try:
      stage.apply(ep, stage.parse(body, ep))
      if isinstance(stage, stages_lib.TestsStage):
        ep.verified_tests = ep.own_tests
    except episodes_lib.ParseError:
      pass
    ep.segments.append(episodes_lib.Segment(stage.name, opening, fmt.end_output(stage.kind,
                                                                                body)))
  return ep.segments
