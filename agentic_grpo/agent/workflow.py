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

    wf = Workflow(WorkflowConfig(), pool)
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
import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import numpy as np

from agentic_grpo.agent import chat_format  # pylint: disable=unused-import (registers 'chat')
from agentic_grpo.agent import episodes as episodes_lib
from agentic_grpo.agent import execution
from agentic_grpo.agent import pieces  # pylint: disable=unused-import (the `pieces` stage kind)
from agentic_grpo.agent import prompts
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.tasks import task as task_lib

FINAL = "final"  # the error-count key of the final reward


@dataclasses.dataclass(frozen=True)
class WorkflowConfig:
  """Which stages run, how they are rendered and rewarded: the run config's `workflow` section.

  Attributes:
    stages: stage kinds in order, registered in `stages.STAGES` (`hypothesis`, `code`,
      `tests`, `debug`, `pieces`); `debug` expands into `max_debug_rounds` stages named
      `debug_1`, `debug_2`, ...; `pieces` (alone: long-horizon tasks, `agent.pieces`) into
      `num_pieces` stages `g1`, `g2`, ...
    prompt_format: how episodes are written as text, registered in
      `prompts.PROMPT_FORMATS` (`tags`: `<hyp>`/`</hyp>`-style special tokens of the byte
      tokenizer; `chat`: user and assistant turns rendered with a pretrained model's chat
      template, `agent.chat_format`).
    max_debug_rounds: debug rounds (>= 0; 0 drops the debug stages).
    num_agent_tests: k, the number of new tests the tests stage asks for.
    max_obs_chars: observations are cut to this many characters (whole lines).
    max_value_chars: a value shown in an observation is cut to this many characters.
    stage_rewards: score every stage on completion. False is outcome-only GRPO: the same
      episodes, updated only once the final reward is known; the workflow then skips the stage
      rewards' sandbox runs (rewards 0 with `valid=False`; the final reward is always computed).
    max_new_tokens: bound on every stage's generation (tokens).
    reference_debug: what the reference episode's debug stages output: `keep` or `restate`
      (repeat the reference code).
    min_test_input_len: an agent-written test earns reward only if every list, tuple or string
      argument has at least this many elements: `[]->[]` agrees with the reference of most list
      functions and says nothing about them, so it must not be a free reward.
    reward_mode: how the code-running rewards count tests: `fraction` (of tests passed) or
      `all_pass` (1 if every test passes, else 0). It applies to the final reward (hidden
      tests: `all_pass` is what pass@1 counts) and to the code and debug stage rewards (public
      and verified own tests). Partial credit rewards wrong programs that agree with the
      reference on some inputs (`max` for `min` on one-element lists, `x` for `sorted(x)`).
    reference_fix_fraction: the share of reference episodes (drawn per task id) whose first
      code is a *near miss* (`synthetic.near_miss`: a wrong program one edit from the
      reference that fails a public example), followed by the first debug stage's observation
      of its failures and the reference code as the fix. Needs a debug stage; tasks without a
      near miss (not synthetic) keep the plain reference episode. So the warm-start shows what
      debugging is for, not only `keep` after passing code.
    num_pieces: K (>= 2), the stages of the `pieces` kind: one per piece of a long-horizon task
      (must equal the tasks' `task.depths`).
    final_reward_delay_s: seconds the final reward waits before it is computed (>= 0): a slow
      remote judge. The agent loop computes it in its background job, so with several episode
      batches in flight only the finishing batch (and evaluation) waits.

  Raises:
    ValueError: at construction, naming the first bad field (`config.workflow.<field>`).
  """
  stages: tuple[str, ...] = ("hypothesis", "code", "tests", "debug")
  prompt_format: str = "tags"
  max_debug_rounds: int = 1
  num_agent_tests: int = 2
  max_obs_chars: int = 120
  max_value_chars: int = 32
  stage_rewards: bool = True
  max_new_tokens: int = 64
  reference_debug: str = stages_lib.KEEP
  min_test_input_len: int = 2
  reward_mode: str = stages_lib.FRACTION
  reference_fix_fraction: float = 0.0
  num_pieces: int = 4
  final_reward_delay_s: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, "stages", tuple(self.stages))
    self.validate("workflow")

  def validate(self, path: str) -> None:
    """Checks every field; errors name `config.<path>.<field>`.

    Raises:
      ValueError: naming the first bad field and its value.
    """
    def check(cond, name, msg, value):
      if not cond:
        raise ValueError(f"config.{path}.{name} {msg}, got {value!r}")

    stages, kinds = self.stages, stages_lib.STAGES.names()
    check(stages and all(s in stages_lib.STAGES for s in stages)
          and len(set(stages)) == len(stages), "stages",
          f"must be distinct stage kinds from {kinds}", stages)
    if "pieces" in stages:
      check(stages == ("pieces",), "stages", "must be ('pieces',) alone when it has 'pieces'",
            stages)
    else:
      check("code" in stages, "stages", "must include 'code' (the final reward needs code)",
            stages)
      for later in ("tests", "debug"):
        check(later not in stages or stages.index(later) > stages.index("code"), "stages",
              f"must have {later!r} after 'code'", stages)
    check(self.final_reward_delay_s >= 0.0, "final_reward_delay_s", "must be >= 0",
          self.final_reward_delay_s)
    for name, low in (("max_debug_rounds", 0), ("num_pieces", 2), ("num_agent_tests", 1), ("max_obs_chars", 8),
                      ("max_value_chars", 4), ("max_new_tokens", 1), ("min_test_input_len", 0)):
      value = getattr(self, name)
      check(isinstance(value, int) and not isinstance(value, bool) and value >= low, name,
            f"must be an int >= {low}", value)
    formats = prompts.PROMPT_FORMATS.names()
    check(self.prompt_format in prompts.PROMPT_FORMATS, "prompt_format",
          f"must be one of {formats}", self.prompt_format)
    check(self.reward_mode in stages_lib.REWARD_MODES, "reward_mode",
          f"must be one of {stages_lib.REWARD_MODES}", self.reward_mode)
    check(self.reference_debug in stages_lib.REFERENCE_DEBUG, "reference_debug",
          f"must be one of {stages_lib.REFERENCE_DEBUG}", self.reference_debug)
    check(0.0 <= self.reference_fix_fraction <= 1.0, "reference_fix_fraction",
          "must be in [0, 1]", self.reference_fix_fraction)

  @classmethod
  def from_mapping(cls, cfg: Mapping[str, Any]) -> "WorkflowConfig":
    """From a dict or `ml_collections.ConfigDict` with (a subset of) the fields above.

    Raises:
      ValueError: for an unknown key or a bad value.
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    items = dict(cfg.items())
    unknown = sorted(set(items) - fields)
    if unknown:
      raise ValueError(f"unknown workflow config keys {unknown}; known: {sorted(fields)}")
    return cls(**items)


class Workflow:
  """Runs batches of episodes through the configured stages; see the module docstring.

  Attributes:
    config: the `WorkflowConfig`.
    pool: the sandbox pool.
    prompt_format: the `prompts.PromptFormat` named by `config.prompt_format`.
    stages: the expanded stage list (`debug` -> `debug_1..R`).
    error_counts: `Counter` of parser/reward/sandbox exceptions by stage name (and `final`).
  """

  def __init__(self, config: WorkflowConfig = WorkflowConfig(), pool=None, *,
               tokenizer: Any = None):
    """Builds the prompt format and the stage list.

    Args:
      config: workflow options.
      pool: a `sandbox.SandboxPool` (anything with `map(programs) -> list[RunResult]`); may
        be None only for `references.reference_segments`.
      tokenizer: the run's tokenizer, for prompt formats that render with it (`chat` needs
        its chat template and end-of-generation ids; `tags` ignores it).

    Raises:
      ValueError: if `config` is not a `WorkflowConfig`, the prompt format has no
        delimiters for a configured stage kind, or it cannot work with `tokenizer`.
    """
    if not isinstance(config, WorkflowConfig):
      raise ValueError(f"config must be a WorkflowConfig, got {type(config).__name__}")
    self.config = config
    self.pool = pool
    self.prompt_format = prompts.PROMPT_FORMATS.get(config.prompt_format)(tokenizer)
    self.stages: tuple[stages_lib.Stage, ...] = tuple(
        stage for kind in config.stages
        for stage in stages_lib.STAGES.get(kind).expand(config, self.prompt_format))
    self.error_counts: collections.Counter = collections.Counter()

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
    finished all stages or stopped early. `num_passed`/`num_tests` always count tests.

    Raises:
      ValueError: for an empty batch or an episode with an open stage.
    """
    if not episodes:
      raise ValueError("episodes must be non-empty")
    for i, ep in enumerate(episodes):
      if ep.pending_opening is not None:
        raise ValueError(f"episodes[{i}] has an open stage; close it before finish")
    if self.config.final_reward_delay_s:
      time.sleep(self.config.final_reward_delay_s)  # a slow judge
    guard = execution.Guard(FINAL, self.error_counts)
    programs = [None if ep.code is None
                else guard(lambda ep=ep: execution.hidden_program(ep.task, ep.code, self.pool),
                                         None)
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
