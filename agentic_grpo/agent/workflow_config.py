"""`WorkflowConfig`: which stages run, how they are rendered and rewarded.

The run config's `workflow` section (`config.TrainConfig.workflow`) and the argument of
`workflow.Workflow`; checked at construction against the stage and prompt-format registries
(`stages.STAGES`, `prompts.PROMPT_FORMATS`), into which this module's imports register the
`chat` prompt format and the `pieces` stage kind.
"""

import dataclasses
from typing import Any, Mapping

from agentic_grpo.agent import chat_format  # pylint: disable=unused-import (registers 'chat')
from agentic_grpo.agent import pieces  # pylint: disable=unused-import (the `pieces` stage kind)
from agentic_grpo.agent import prompts
from agentic_grpo.agent import stages as stages_lib


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
      It also bounds what a looping stdio program costs (`execution.program`): with `all_pass`
      its job stops at the first test in error; with `fraction` at `config.sandbox.
      job_budget_s` of wall clock.
    reference_fix_fraction: the share of reference episodes (drawn per task id) whose first
      code is a *near miss* (`synthetic.near_miss`: a wrong program one edit from the
      reference that fails a public example), followed by the first debug stage's observation
      of its failures and the reference code as the fix. Needs a debug stage; tasks without a
      near miss (not synthetic) keep the plain reference episode. So the warm-start shows what
      debugging is for, not only `keep` after passing code.
    reference_error_rate: the share of reference episodes (drawn per task id) written by an
      *imperfect teacher* that confuses the task's program with its systematic confusion
      (`synthetic.teacher_confusion`: `add1` as `add2`, `max` as `min`): the hypothesis
      predicts the confused program's output and the code writes it. Supervised data from a
      weaker model or a hurried annotator has such habits; above 0.5 the warm-started policy's
      greedy answer is the teacher's mistake while its samples still find the right program,
      the headroom RL with verifiable rewards exists to use (docs/learning.md). Tasks without
      a confusion (not synthetic) keep the plain reference episode. 0 = a perfect teacher.
    num_pieces: K (>= 2), the stages of the `pieces` kind: one per piece of a long-horizon task
      (must equal the tasks' `task.depths`).
    final_reward_delay_s: seconds the final reward waits before it is computed (>= 0): a slow
      remote judge, on top of what the hidden tests themselves cost. The agent loop computes
      it in a background job of its own; when it lands in the replay is the loop's
      `rl.final_reward_lag`, not the judge's speed (`agent.loop`).
    final_reward_jitter_s: a further wait drawn uniformly in `[0, final_reward_jitter_s]`
      seconds per final judgement (>= 0), from a generator of its own (not the run's seed): a
      remote judge whose latency varies. Results do not depend on it; only how long the loop
      waits for a final reward that is due.

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
  reference_error_rate: float = 0.0
  num_pieces: int = 4
  final_reward_delay_s: float = 0.0
  final_reward_jitter_s: float = 0.0

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
    for name in ("final_reward_delay_s", "final_reward_jitter_s"):
      check(getattr(self, name) >= 0.0, name, "must be >= 0", getattr(self, name))
    for name, low in (("max_debug_rounds", 0), ("num_pieces", 2), ("num_agent_tests", 1),
                      ("max_obs_chars", 8), ("max_value_chars", 4), ("max_new_tokens", 1),
                      ("min_test_input_len", 0)):
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
    check(0.0 <= self.reference_error_rate <= 1.0, "reference_error_rate",
          "must be in [0, 1]", self.reference_error_rate)

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
