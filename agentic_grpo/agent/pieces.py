"""The piece-by-piece workflow of long-horizon tasks: K code stages, each checked on completion.

`PiecesWorkflow` runs `tasks.long_horizon` tasks with the batched API of `workflow.Workflow`
(`start`, `open_stage`, `close_stage`, `finish`, `reference_segments`), so the agent loop, the
replay and the trainer use it unchanged. Stage k (named `g1` ... `gK`) opens with piece k's
signature and public examples; the model writes the piece between the code delimiters, as an
expression of `x` or a `def`:

    f(x:list[int])->int                 <- task prompt (opening of stage 1)
    g1(x:list[int])->list[int]
    [3,1,2]->[1,2,3]
    [5,4]->[4,5]<code>sorted(x)</code>   <- piece 1
    g2(x:list[int])->list[int]          <- opening of stage 2
    ...

Stage reward (as soon as the piece is written): the piece run in the sandbox on its own public
examples, 1/0 for all passed with `reward_mode='all_pass'`, else the fraction passed. These
checks are imperfect proxies: a piece's examples may not single it out
(`long_horizon.piece_ambiguity`). The final reward runs the composed program `f` (every piece
written, then `def f(x): return gK(...g1(x))`) on the task's hidden tests; a piece that did not
parse leaves its function undefined, and `f` fails.

`final_reward_delay_s` models a slow remote judge: `finish` sleeps that long before scoring. The
agent loop calls `finish` in its background sandbox job, so with several episode batches in
flight the delay holds back only the finishing batch (and evaluation, which waits for it).

Of `WorkflowConfig`, only `stage_rewards` and `reward_mode` apply; the stage list comes from the
task (`num_pieces`).
"""

import time
from typing import Optional, Sequence

from agentic_grpo.agent import sandbox
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.tasks import long_horizon
from agentic_grpo.tasks import task as task_lib


def _piece(episode: workflow_lib.Episode, index: int) -> long_horizon.Piece:
  pieces = long_horizon.pieces(episode.task)
  if len(pieces) <= index:
    raise ValueError(f"task {episode.task.task_id!r} has {len(pieces)} pieces, the workflow "
                     f"asks for piece {index + 1}")
  return pieces[index]


class PieceStage(workflow_lib.Stage):
  """Write piece `index` of the program; reward = its public examples passed."""

  kind = "code"  # the code stage's delimiters

  def __init__(self, name: str, config: workflow_lib.WorkflowConfig, index: int):
    super().__init__(name, config)
    self.index = index

  def openings(self, episodes, pool, guard):
    del pool
    out = []
    for ep in episodes:
      def render(ep=ep):
        p = _piece(ep, self.index)
        return "\n".join([p.signature] + [task_lib.format_example(e) for e in p.examples])
      out.append("\n" + guard(render, "?") + self.open_token)
    return out

  def parse(self, body, episode):
    p = _piece(episode, self.index)
    return workflow_lib.parse_code(body, p.as_task(episode.task.task_id))

  def apply(self, episode, parsed):
    episode.code = (episode.code or "") + parsed

  def score(self, episodes, parsed, pool, guard):
    programs = []
    for ep, source in zip(episodes, parsed):
      if not isinstance(source, str):  # unparsed
        programs.append(None)
        continue
      programs.append(guard(lambda ep=ep, source=source: sandbox.Program(
          source, _piece(ep, self.index).name, io_tests=tuple(
              sandbox.IOTest(e.args, e.expected) for e in _piece(ep, self.index).examples)),
                            None))
    results = workflow_lib._map(pool, programs, guard)  # pylint: disable=protected-access
    all_pass = self.config.reward_mode == workflow_lib.ALL_PASS
    out = []
    for r in results:
      if r is None or r.num_tests == 0:
        out.append(0.0)
      elif all_pass:
        out.append(float(r.num_passed >= r.num_tests))
      else:
        out.append(min(1.0, r.num_passed / r.num_tests))
    return out

  def reference_output(self, episode):
    return _piece(episode, self.index).reference_expression


class PiecesWorkflow(workflow_lib.Workflow):
  """K piece stages over long-horizon tasks; see the module docstring.

  Attributes (beyond `Workflow`'s):
    num_pieces: K, the stages (pieces) per episode.
    final_reward_delay_s: seconds `finish` waits before scoring.
  """

  def __init__(self, config: workflow_lib.WorkflowConfig = workflow_lib.WorkflowConfig(),
               pool=None, *, num_pieces: int = 4, final_reward_delay_s: float = 0.0):
    """Builds the K piece stages.

    Args:
      config: workflow options (`stage_rewards`, `reward_mode` apply).
      pool: a sandbox pool (`map(programs) -> list[RunResult]`); None only for
        `reference_segments`.
      num_pieces: K >= 2; must equal the tasks' `LongHorizonConfig.num_stages`.
      final_reward_delay_s: >= 0 seconds of judge latency before the final reward.

    Raises:
      ValueError: for a bad `num_pieces` or `final_reward_delay_s`.
    """
    if not isinstance(num_pieces, int) or num_pieces < 2:
      raise ValueError(f"num_pieces must be an int >= 2, got {num_pieces!r}")
    if not final_reward_delay_s >= 0.0:
      raise ValueError(f"final_reward_delay_s must be >= 0, got {final_reward_delay_s!r}")
    self.num_pieces = num_pieces
    self.final_reward_delay_s = float(final_reward_delay_s)
    super().__init__(config, pool)

  def _expand(self, config):  # pylint: disable=arguments-differ
    return [PieceStage(long_horizon.piece_name(k), config, k) for k in range(self.num_pieces)]

  def finish(self, episodes: Sequence[workflow_lib.Episode]) -> workflow_lib.FinalResult:
    """Composes each episode's pieces into `f` and scores it on the hidden tests (after
    `final_reward_delay_s`); see `Workflow.finish`.

    Raises:
      ValueError: for an empty batch or an episode with an open stage.
    """
    if not episodes:
      raise ValueError("episodes must be non-empty")
    for i, ep in enumerate(episodes):
      if ep.pending_opening is not None:
        raise ValueError(f"episodes[{i}] has an open stage; close it before finish")
    for ep in episodes:
      if ep.code is not None:
        ep.code += long_horizon.composition(self.num_pieces)
    if self.final_reward_delay_s:
      time.sleep(self.final_reward_delay_s)
    return super().finish(episodes)


def factory(num_pieces: int, final_reward_delay_s: float = 0.0):
  """`(WorkflowConfig, pool) -> PiecesWorkflow`, the trainer's `workflow_factory` form."""
  def make(config: workflow_lib.WorkflowConfig, pool: Optional[object] = None):
    return PiecesWorkflow(config, pool, num_pieces=num_pieces,
                          final_reward_delay_s=final_reward_delay_s)
  return make
