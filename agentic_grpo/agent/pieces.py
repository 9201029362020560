"""The `pieces` stage kind: a long-horizon task written piece by piece, each piece checked at once.

With `workflow.stages=("pieces",)` a `workflow.Workflow` runs `tasks.long_horizon` tasks in
`workflow.num_pieces` = K stages named `g1` ... `gK`, through the same batched API, agent loop,
replay and trainer as every other workflow. Stage k opens with piece k's signature and public
examples; the model writes the piece in the code stage's delimiters, as an expression of `x` or
a `def`:

    f(x:list[int])->int                 <- task prompt (opening of stage g1)
    g1(x:list[int])->list[int]
    [3,1,2]->[1,2,3]
    [5,4]->[4,5]<code>sorted(x)</code>   <- piece 1
    g2(x:list[int])->list[int]          <- opening of stage g2
    ...

Stage reward (as soon as the piece is written): the piece run in the sandbox on its own public
examples, 1/0 for all passed with `reward_mode='all_pass'`, else the fraction passed. These
checks are imperfect proxies: a piece's examples may not single it out
(`long_horizon.piece_ambiguity`). The episode's code is every piece written so far; the last
piece adds the composition `def f(x): return gK(...g1(x))`, which the workflow's final reward
runs on the task's hidden tests. A piece that did not parse leaves its function undefined, and
`f` fails.
"""

from typing import Any

from agentic_grpo import sandbox
from agentic_grpo.agent import code_parsing
from agentic_grpo.agent import episodes as episodes_lib
from agentic_grpo.agent import prompts
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import long_horizon
from agentic_grpo.tasks import task as task_lib

KIND = "pieces"


def _piece(episode: episodes_lib.Episode, index: int) -> long_horizon.Piece:
  pieces = long_horizon.pieces(episode.task)
  if len(pieces) <= index:
    raise ValueError(f"task {episode.task.task_id!r} has {len(pieces)} pieces, the workflow "
                     f"asks for piece {index + 1} (workflow.num_pieces must equal the tasks' "
                     f"task.depths)")
  return pieces[index]


@stages_lib.STAGES.register(KIND)
class PieceStage(stages_lib.Stage):
  """Write piece `index` of the program; reward = its public examples passed.

  Registered as the `pieces` kind, which expands into `config.num_pieces` stages (the `tags`
  prompt format writes them in the code stage's delimiters).
  """

  kind = KIND

  def __init__(self, name: str, config: Any, prompt_format: prompts.PromptFormat,
               index: int = 0):
    super().__init__(name, config, prompt_format)
    self.index = index

  @classmethod
  def expand(cls, config, prompt_format):
    return [cls(long_horizon.piece_name(k), config, prompt_format, k)
            for k in range(config.num_pieces)]

  def turns(self, episodes, pool, guard):
    del pool
    out = []
    for ep in episodes:
      def lead(ep=ep):
        p = _piece(ep, self.index)
        return "\n" + "\n".join([p.signature] + [task_lib.format_example(e) for e in p.examples])
      out.append(prompts.Turn(lead=guard(lead, "\n?")))
    return out

  def parse(self, body, episode):
    return code_parsing.parse_code(body, _piece(episode, self.index).as_task(episode.task.task_id))

  def apply(self, episode, parsed):
    episode.code = (episode.code or "") + parsed
    if self.index == self.config.num_pieces - 1:
      episode.code += long_horizon.composition(self.config.num_pieces)

  def score(self, episodes, parsed, pool, guard):
    programs = []
    for ep, source in zip(episodes, parsed):
      if source is stages_lib.UNPARSED:
        programs.append(None)
        continue
      programs.append(guard(lambda ep=ep, source=source: sandbox.Program(
          source, _piece(ep, self.index).name,
          io_tests=execution.io_tests(_piece(ep, self.index).examples)), None))
    results = execution.run_programs(pool, programs, guard)
    all_pass = self.config.reward_mode == stages_lib.ALL_PASS
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
