"""Episode records of the staged workflow: segments, episode state and per-batch results.

An *episode* is one attempt at one `Task`: a sequence of *segments*, one per stage, each an
environment **opening** (never trained on) followed by the model's **output** (trained on).
The `Workflow` mutates episodes; stages read them and record their parsed values on them.
"""

import dataclasses
from typing import Optional

import numpy as np

from agentic_grpo.tasks import task as task_lib


class ParseError(ValueError):
  """A stage output the stage's parser rejects (reward 0; not counted as an error)."""


@dataclasses.dataclass(frozen=True)
class Segment:
  """One stage of an episode: environment text, then model text (with the close token)."""
  stage: str
  opening: str
  output: str


@dataclasses.dataclass
class Episode:
  """State of one attempt at a task. Mutated only by the `Workflow` (and its stages).

  Attributes:
    task: the task.
    segments: completed stages.
    pending_opening: opening of the stage now being generated, or None.
    code: runnable source of the current code (with the task's code context), or None.
    own_tests: the agent's parsed tests (at most k).
    verified_tests: those of `own_tests` that agree with the reference and are new.
    stage_rewards, stage_valid, stage_parsed: per completed stage.
    final_reward: set by `Workflow.finish`.
  """
  task: task_lib.Task
  segments: list[Segment] = dataclasses.field(default_factory=list)
  pending_opening: Optional[str] = None
  code: Optional[str] = None
  own_tests: tuple[task_lib.Example, ...] = ()
  verified_tests: tuple[task_lib.Example, ...] = ()
  stage_rewards: list[float] = dataclasses.field(default_factory=list)
  stage_valid: list[bool] = dataclasses.field(default_factory=list)
  stage_parsed: list[bool] = dataclasses.field(default_factory=list)
  final_reward: Optional[float] = None

  @property
  def stage_index(self) -> int:
    return len(self.segments)

  @property
  def text(self) -> str:
    """All completed segments, concatenated."""
    return "".join(s.opening + s.output for s in self.segments)

  @property
  def context(self) -> str:
    """The sampler's prompt: completed segments plus the pending opening."""
    return self.text + (self.pending_opening or "")


@dataclasses.dataclass(frozen=True)
class StageResult:
  """Outcome of one stage over a batch of N episodes.

  Attributes:
    stage: stage name.
    rewards: `[N]` float32 in [0, 1].
    valid: `[N]` bool; False where the stage does not apply to the task (reward 0).
    parsed: `[N]` bool; False where the output was unparseable (reward 0).
    errors: parser/reward exceptions in this call (also added to `Workflow.error_counts`).
  """
  stage: str
  rewards: np.ndarray
  valid: np.ndarray
  parsed: np.ndarray
  errors: int


@dataclasses.dataclass(frozen=True)
class FinalResult:
  """Final rewards over a batch: `rewards [N]` float32, `num_passed`/`num_tests` `[N]` int32."""
  rewards: np.ndarray
  num_passed: np.ndarray
  num_tests: np.ndarray
  errors: int
