"""The staged coding workflow: runs batches of episodes through the configured stages.

An *episode* is one attempt at one `Task` (`episodes.Episode`): a sequence of *segments*, one
per stage (`stages.STAGES`: hypothesis -> code -> tests -> debug x R), each an environment
**opening** (the task prompt before the first stage, the turn the stage asks for, written by
the prompt format; never trained on) followed by the model's **output**, which ends with the
stage's closing delimiter (trained on). With the default `tags` prompt format an episode of a
synthetic task reads

    f(x:list[int])->list[int]            <- task prompt   (opening of stage 0)
    [3,1,2]->[4,3,5]
    [5]->[7]
    [2,9,4]-><hyp>                       <- probe         (opening)
    [4,11,6]</hyp>                       <- hypothesis    (output)
    <code>sorted(x)</code>               <- code: an expression of the parameters, or a `def`
    <tests>[4,1]->[1,4]                  <- tests: k lines ARGS->EXPECTED
    [7]->[7]</tests>
    <obs>3/5                             <- observation: passed/total on public + own tests,
    [3,1,2]->[4,3,5] got [1,2,3]            then the failures
    ...</obs><debug>[v+2 for v in x]</debug>   <- debug: revised code, or `keep`

Stage rewards are in [0, 1] (see `agent.stages`). The final reward is the fraction of hidden
tests passed by the last version of the code (1/0 for all of them with `reward_mode='all_pass'`).

Unparseable output (no closing delimiter, or text the stage's parser rejects) gets reward 0
and the episode continues with its state unchanged. A stage that does not apply to a task
(no probe, no public examples, no reference solution) reports `valid=False` and reward 0.
Parsers and reward code never raise out of the workflow: an exception there gives reward 0
and is counted in `Workflow.error_counts[stage_name]` for the trainer to log.

Batched use by the trainer's agent loop (all episodes of a batch advance in lock-step; each
stage's sandbox work is one `SandboxPool.map` call over all episodes):

    wf = Workflow(workflow_config.WorkflowConfig(), pool)
    episodes = wf.start(tasks_repeated_G_times)
    for _ in wf.stages:
      wf.open_stage(episodes)                      # renders openings (debug: runs the code)
      outputs = sample([e.context for e in episodes])   # text, ending with the close token
      result = wf.close_stage(episodes, outputs)   # StageResult: rewards/valid/parsed [N]
    final = wf.finish(episodes)                    # FinalResult: rewards [N]

Outcome-only GRPO runs the same workflow and ignores the stage rewards (or sets
`stage_rewards=False` to skip their sandbox runs). `references.reference_segments(wf, task)`
gives the ideal episode (for the supervised warm start) without running anything.
"""

import collections
import random
import time
from typing import Any, Callable, Sequence

from absl import logging
import numpy as np

from agentic_grpo.agent import episodes as episodes_lib
from agentic_grpo.agent import prompts
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import workflow_config
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import task as task_lib

FINAL = "final"  # the error-count key of the final reward


class Workflow:
  """Runs batches of episodes through the configured stages; see the module docstring.

  Attributes:
    config: the `workflow_config.WorkflowConfig`.
    pool: the sandbox pool.
    prompt_format: the `prompts.PromptFormat` named by `config.prompt_format`.
    stages: the expanded stage list (`debug` -> `debug_1..R`).
    error_counts: `Counter` of parser/reward/sandbox exceptions by stage name (and `final`).
  """

  def __init__(self,
               config: workflow_config.WorkflowConfig = workflow_config.WorkflowConfig(),
               pool=None, *, tokenizer: Any = None):
    """Builds the prompt format and the stage list.

    Args:
      config: workflow options.
      pool: a `sandbox.SandboxPool` (anything with `map(programs) -> list[RunResult]`); may
        be None only for `references.reference_segments`.
      tokenizer: the run's tokenizer, for prompt formats that render with it (`chat` needs
        its chat template and end-of-generation ids; `tags` ignores it).

    Raises:
      ValueError: if `config` is not a `workflow_config.WorkflowConfig`, the prompt format has
        no delimiters for a configured stage kind, or it cannot work with `tokenizer`.
    """
    if not isinstance(config, workflow_config.WorkflowConfig):
      raise ValueError(f"config must be a WorkflowConfig, got {type(config).__name__}")
    self.config = config
    self.pool = pool
    self.prompt_format = prompts.PROMPT_FORMATS.get(config.prompt_format)(tokenizer)
    self.stages: tuple[stages_lib.Stage, ...] = tuple(
        stage for kind in config.stages
        for stage in stages_lib.STAGES.get(kind).expand(config, self.prompt_format))
    self.error_counts: collections.Counter = collections.Counter()
    # The judge's varying latency (`final_reward_jitter_s`): its own generator, not the seed's.
    self._jitter = random.Random()

  @property
  def stage_names(self) -> tuple[str, ...]:
    return tuple(s.name for s in self.stages)

  @property
  def num_stages(self) -> int:
    return len(self.stages)

  def stop_tokens(self) -> tuple[str, ...]:
    """Closing delimiters of all stages, sorted (the sampler's stop tokens)."""
    return self.prompt_format.stop_tokens([s.kind for s in self.stages])

  def pop_error_counts(self) -> dict[str, int]:
    """Returns the error counts since the last call and resets them."""
    counts = dict(self.error_counts)
    self.error_counts.clear()
    return counts

  # ----------------------------------------------------------------------------- batched API

  def start(self, tasks: Sequence[task_lib.Task]) -> list[episodes_lib.Episode]:
    """Fresh episodes, one per task (repeat a task G times for a group)."""
    for i, t in enumerate(tasks):
      if not isinstance(t, task_lib.Task):
        raise ValueError(f"tasks[{i}] must be a Task, got {type(t).__name__}")
    return [episodes_lib.Episode(task=t) for t in tasks]

  def _check_batch(self, episodes: Sequence[episodes_lib.Episode], pending: bool) -> int:
    if not episodes:
      raise ValueError("episodes must be non-empty")
    k = episodes[0].stage_index
    for i, ep in enumerate(episodes):
      if ep.stage_index != k:
        raise ValueError(f"episodes must be at the same stage; episodes[{i}] is at stage "
                         f"{ep.stage_index}, episodes[0] at {k}")
      if (ep.pending_opening is not None) != pending:
        raise ValueError(f"episodes[{i}] {'has no' if pending else 'already has an'} open stage")
    if k >= self.num_stages:
      raise ValueError(f"episodes have completed all {self.num_stages} stages")
    return k

  def open_stage(self, episodes: Sequence[episodes_lib.Episode]) -> list[str]:
    """Renders and records the opening of the next stage of every episode.

    The first stage's opening starts with the task prompt. Debug openings run the current
    code on the public examples and the episode's own tests (one pool call). Afterwards
    `episode.context` is the text to sample the stage output from.

    Returns:
      The N openings.

    Raises:
      ValueError: if the episodes are not all at the same stage without an open stage.
    """
    k = self._check_batch(episodes, pending=False)
    stage = self.stages[k]
    guard = execution.Guard(stage.name, self.error_counts)
    turns = stage.turns(episodes, self.pool, guard)
    openings = [self.prompt_format.environment_turn(stage.kind, turn,
                                                    prompt=ep.task.prompt if k == 0 else "",
                                                    task_kind=ep.task.kind)
                for ep, turn in zip(episodes, turns)]
    for ep, o in zip(episodes, openings):
      ep.pending_opening = o
    return openings

  def close_stage(self, episodes: Sequence[episodes_lib.Episode], outputs: Sequence[str]
                  ) -> episodes_lib.StageResult:
    """Parses, records and scores the model's outputs for the open stage.

    Args:
      episodes: N episodes with an open stage.
      outputs: N decoded outputs; an output should end with the stage's closing delimiter
        (text after the first delimiter is ignored; an output without one is unparseable).

    Returns:
      The `StageResult`.

    Raises:
      ValueError: on a batch mismatch (never for bad model output).
    """
    k = self._check_batch(episodes, pending=True)
    if len(outputs) != len(episodes):
      raise ValueError(f"outputs must have one entry per episode ({len(episodes)}), "
                       f"got {len(outputs)}")
    stage = self.stages[k]
    guard = execution.Guard(stage.name, self.error_counts)
    parsed = []
    for ep, out in zip(episodes, outputs):
      parsed.append(guard(lambda ep=ep, out=out: self._parse(stage, ep, out), stages_lib.UNPARSED))
    for ep, p in zip(episodes, parsed):
      if p is not stages_lib.UNPARSED:
        guard(lambda ep=ep, p=p: stage.apply(ep, p), None)
    n = len(episodes)
    if self.config.stage_rewards:
      try:
        scores = stage.score(episodes, parsed, self.pool, guard)
        if len(scores) != n:
          raise RuntimeError(f"stage {stage.name} returned {len(scores)} scores for {n}")
      except Exception:  # pylint: disable=broad-except
        logging.exception("workflow stage %s: scoring failed", stage.name)
        guard.counts[stage.name] += n
        guard.errors += n
        scores = [0.0] * n
    else:
      scores = [None] * n
    rewards = np.array([0.0 if s is None else min(max(float(s), 0.0), 1.0) for s in scores],
                       np.float32)
    valid = np.array([s is not None for s in scores], bool)
    was_parsed = np.array([p is not stages_lib.UNPARSED for p in parsed], bool)
    for i, ep in enumerate(episodes):
      ep.segments.append(
          episodes_lib.Segment(stage.name, ep.pending_opening, str(outputs[i])))
      ep.pending_opening = None
      ep.stage_rewards.append(float(rewards[i]))
      ep.stage_valid.append(bool(valid[i]))
      ep.stage_parsed.append(bool(was_parsed[i]))
    return episodes_lib.StageResult(stage.name, rewards, valid, was_parsed, guard.errors)

  @staticmethod
  def _parse(stage: stages_lib.Stage, ep: episodes_lib.Episode, output: Any) -> Any:
    if not isinstance(output, str):
      return stages_lib.UNPARSED
    body = stage.prompt_format.split_output(stage.kind, output)
    if body is None:
      return stages_lib.UNPARSED  # unterminated: the sampler ran out of tokens
    try:
      return stage.parse(body, ep)
    except episodes_lib.ParseError:
      return stages_lib.UNPARSED

  def finish(self, episodes: Sequence[episodes_lib.Episode]) -> episodes_lib.FinalResult:
    """Final rewards of each episode's last code on the hidden tests (one pool call): the
    fraction passed, or 1/0 for all passed with `reward_mode='all_pass'`. Episodes may have
    finished all stages or stopped early. `num_passed`/`num_tests` always count tests (a stdio
    job stops at its first error with `all_pass`, or at `config.sandbox.job_budget_s` with
    `fraction`: the tests it did not run count as not passed; `execution.program`).

    Raises:
      ValueError: for an empty batch or an episode with an open stage.
    """
    if not episodes:
      raise ValueError("episodes must be non-empty")
    for i, ep in enumerate(episodes):
      if ep.pending_opening is not None:
        raise ValueError(f"episodes[{i}] has an open stage; close it before finish")
    delay = self.config.final_reward_delay_s  # a slow judge
    if self.config.final_reward_jitter_s:
      delay += self._jitter.uniform(0.0, self.config.final_reward_jitter_s)
    if delay:
      time.sleep(delay)
    guard = execution.Guard(FINAL, self.error_counts)
    programs = [None if ep.code is None
                else guard(lambda ep=ep: execution.hidden_program(
                    ep.task, ep.code, self.pool,
                    all_or_nothing=self.config.reward_mode == stages_lib.ALL_PASS), None)
                for ep in episodes]
    results = execution.run_programs(self.pool, programs, guard)
    rewards, passed, total = [], [], []
    for ep, r in zip(episodes, results):
      n_hidden = len(ep.task.hidden_tests)
      if r is None:
        rewards.append(0.0)
        passed.append(0)
        total.append(n_hidden)
      else:
        def frac(r=r):
          f = min(1.0, r.num_passed / r.num_tests) if r.num_tests > 0 else 0.0
          return f if self.config.reward_mode == stages_lib.FRACTION else float(f >= 1.0)
        rewards.append(guard(frac, 0.0))
        passed.append(int(r.num_passed))
        total.append(int(r.num_tests))
      ep.final_reward = rewards[-1]
    return episodes_lib.FinalResult(np.array(rewards, np.float32), np.array(passed, np.int32),
                                    np.array(total, np.int32), guard.errors)

  def rollout(self, tasks: Sequence[task_lib.Task],
              generate: Callable[[str, list[str]], Sequence[str]]
              ) -> tuple[list[episodes_lib.Episode], list[episodes_lib.StageResult],
                         episodes_lib.FinalResult]:
    """All stages for a batch: `generate(stage_name, contexts) -> outputs` per stage."""
    episodes = self.start(tasks)
    results = []
    for stage in self.stages:
      self.open_stage(episodes)
      outputs = generate(stage.name, [ep.context for ep in episodes])
      results.append(self.close_stage(episodes, outputs))
    return episodes, results, self.finish(episodes)
