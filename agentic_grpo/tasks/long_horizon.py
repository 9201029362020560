"""A long-horizon task family: build a program piece by piece, each piece checked on completion.

A task is a pipeline of K >= 2 typed primitives of the synthetic grammar (`tasks.synthetic`):
`f(x) = gK(...g2(g1(x)))`. An episode has K stages; stage k writes the piece `gk` (one
primitive, e.g. `sorted(x)`) from its own few public examples, and is checked as soon as it
completes by running the piece on those examples. The final program `f` composes the K pieces
and is judged on hidden tests of `f`, all or nothing, after the last stage. The prompt is the
signature of `f`; piece k's signature and examples appear only in stage k's opening:

    f(x:list[int])->int                      <- task prompt
    g1(x:list[int])->list[int]               <- stage 1 opening
    [3,1,2]->[1,2,3]
    [5,4]->[4,5]<code>sorted(x)</code>       <- piece 1
    g2(x:list[int])->list[int]
    ...

**Imperfect stage checks.** A piece's public examples are short random inputs of its own (not
the pipeline's intermediate values), so they can under-determine it: another primitive of the
same type may agree with every public example of the piece and still change `f` on a hidden
test (`sorted` and `list(dict.fromkeys(...))` agree on `[1,2]`). Such a piece earns its full
stage reward and sinks the final reward. `piece_ambiguity` measures this per piece and
`measure_ambiguity` over a split. Measured on train tasks 0..299 (K = 4, pieces of 1-4
elements, the default `PRIMITIVES`): with the default 3 examples per piece 13% of pieces are
ambiguous and 41% of tasks have at least one ambiguous piece; with 2 examples, 23% and 63%; with
K = 6 and 2 examples, 23% and 78% (`tests/long_horizon_test.py` checks the default's shares).

**Determinism and splits** follow `tasks.synthetic`: task `i` of a split is a pure function of
`(seed, split, i)`; a task's split is a stable hash of its program and piece examples, so no
held-out task (program with its examples) appears in train.

The piece data travel in the `Task` record: `metadata["program"]` is the pipeline's key
(`synthetic.Program.key`), `metadata["pieces"]` the JSON list of each piece's public examples
(`[[args, expected], ...]` per piece). `pieces(task)` reads them back.
"""

import dataclasses
import json
import random
from typing import Any, Iterator, Optional, Sequence

from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib

SOURCE = "long_horizon"
ENTRY_POINT = synthetic.ENTRY_POINT
PARAM = synthetic.PARAM

# The default pieces: every family of the synthetic grammar with one constant each (`add1`,
# `gt4`, `take2`, ...): 26 of its 49 primitives, fewer pieces to tell apart. With the whole
# grammar a ~1M-parameter model after a 150-step warm-start wrote a piece that passed its
# examples about a third of the time, so a K = 4 program almost never passed (final reward 0 in
# every training episode; docs/ablation.md). The stage checks stay as ambiguous (the rivals
# are the whole grammar): 13% of pieces, 41% of tasks.
PRIMITIVES = ("add1", "mul2", "mod2", "even", "odd", "gt4", "sort", "rev", "take2", "drop1",
              "uniq", "sum", "max", "min", "len", "upper", "srev", "ssort", "stake2", "sdrop1",
              "suniq", "dela", "repab", "dup", "slen", "counta")


@dataclasses.dataclass(frozen=True)
class LongHorizonConfig:
  """Knobs of the long-horizon task distribution.

  Attributes:
    seed: base seed; task `i` of a split depends only on (seed, split, i).
    num_stages: K, pieces per program (>= 2); one workflow stage per piece.
    piece_examples: public examples per piece (>= 1): fewer examples, more ambiguous pieces.
    piece_len: (min, max) length of a piece's public example inputs (lists or strings).
    num_hidden: hidden tests of the composed program (>= 8).
    hidden_len: (min, max) length of hidden inputs.
    string_prob: probability that the pipeline's input is a `str` rather than a `list[int]`.
    max_int: list elements are drawn from 0..max_int.
    alphabet: letters of string inputs.
    split_fractions: shares of the hash space for train, validation, test.
    primitives: names (`synthetic.BY_NAME`) of the primitives pieces are drawn from
      (default `PRIMITIVES`); empty = the whole grammar. A smaller set is an easier task (fewer pieces to tell apart); the
      stage checks' rivals (`piece_ambiguity`) stay the whole grammar, which the model may
      write.
  """
  seed: int = 0
  num_stages: int = 4
  piece_examples: int = 3
  piece_len: tuple[int, int] = (1, 4)
  num_hidden: int = 8
  hidden_len: tuple[int, int] = (2, 6)
  string_prob: float = 0.3
  max_int: int = 9
  alphabet: str = "abcdef"
  split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
  primitives: tuple[str, ...] = PRIMITIVES

  def __post_init__(self):
    if not isinstance(self.num_stages, int) or self.num_stages < 2:
      raise ValueError(f"num_stages must be an int >= 2, got {self.num_stages!r}")
    if not isinstance(self.piece_examples, int) or self.piece_examples < 1:
      raise ValueError(f"piece_examples must be an int >= 1, got {self.piece_examples!r}")
    if self.num_hidden < 8:
      raise ValueError(f"num_hidden must be >= 8, got {self.num_hidden}")
    for name in ("piece_len", "hidden_len"):
      lo, hi = getattr(self, name)
      if not 0 <= lo <= hi:
        raise ValueError(f"{name} must be (min, max) with 0 <= min <= max, got {(lo, hi)}")
    if not 0.0 <= self.string_prob <= 1.0:
      raise ValueError(f"string_prob must be in [0, 1], got {self.string_prob}")
    if self.max_int < 1 or len(set(self.alphabet)) < 3:
      raise ValueError(f"max_int must be >= 1 and alphabet have >= 3 letters, got "
                       f"{self.max_int}, {self.alphabet!r}")
    if (len(self.split_fractions) != 3 or min(self.split_fractions) <= 0
        or abs(sum(self.split_fractions) - 1.0) > 1e-9):
      raise ValueError(f"split_fractions must be 3 positive shares summing to 1, "
                       f"got {self.split_fractions}")
    unknown = sorted(set(self.primitives) - set(synthetic.BY_NAME))
    if unknown:
      raise ValueError(f"primitives must name primitives of the synthetic grammar, got "
                       f"unknown {unknown}")


@dataclasses.dataclass(frozen=True)
class Piece:
  """Piece k of a task: `name(x)` = one primitive, with its own public examples.

  Attributes:
    name: the piece's function name, `g1` ... `gK`.
    primitive: the reference primitive (`synthetic.Primitive`).
    examples: the piece's public examples (one argument each).
  """
  name: str
  primitive: synthetic.Primitive
  examples: tuple[task_lib.Example, ...]

  @property
  def program(self) -> synthetic.Program:
    return synthetic.Program(self.primitive.in_type, (self.primitive,))

  @property
  def signature(self) -> str:
    return self.program.signature(self.name)

  @property
  def reference_expression(self) -> str:
    """The reference piece as one expression of `x` (`sorted(x)`)."""
    return self.program.expression(PARAM)

  def as_task(self, parent_id: str) -> task_lib.Task:
    """The piece as a `Task` of its own (entry point `name`; its examples are public and
    hidden), for parsing and checking the piece's code."""
    return task_lib.Task(
        task_id=f"{parent_id}/{self.name}", prompt="", entry_point=self.name,
        signature=self.signature, public_examples=self.examples, hidden_tests=self.examples,
        reference_solution=self.program.source(self.name), source=SOURCE)


def piece_name(k: int) -> str:
  """Function name of piece `k` (0-based): `g1`, `g2`, ..."""
  return f"g{k + 1}"


def composition(num_pieces: int) -> str:
  """Source of the entry point composing the pieces: `def f(x): return g3(g2(g1(x)))`."""
  expr = PARAM
  for k in range(num_pieces):
    expr = f"{piece_name(k)}({expr})"
  return f"def {ENTRY_POINT}({PARAM}): return {expr}\n"


def pieces(task: task_lib.Task) -> tuple[Piece, ...]:
  """The pieces of a long-horizon `task`, in stage order.

  Raises:
    ValueError: if `task` has no long-horizon metadata (`program` and `pieces`), or they
      disagree.
  """
  if "program" not in task.metadata or "pieces" not in task.metadata:
    raise ValueError(f"task {task.task_id!r} is not a long-horizon task (no program/pieces "
                     f"metadata)")
  program = synthetic.parse_program(task.metadata["program"])
  rows = json.loads(task.metadata["pieces"])
  if len(rows) != len(program.prims):
    raise ValueError(f"task {task.task_id!r}: {len(rows)} piece example lists for "
                     f"{len(program.prims)} pieces")
  out = []
  for k, (prim, examples) in enumerate(zip(program.prims, rows)):
    # JSON keeps the grammar's values (ints, strs, lists of ints) exactly.
    exs = tuple(task_lib.Example((a,), e) for a, e in examples)
    out.append(Piece(piece_name(k), prim, exs))
  return tuple(out)


def _differs_downstream(program: synthetic.Program, k: int, rival: synthetic.Primitive,
                        hidden_inputs: Sequence[Any]) -> bool:
  prims = list(program.prims)
  prims[k] = rival
  other = synthetic.Program(program.in_type, tuple(prims))
  return any(other(x) != program(x) for x in hidden_inputs)


def piece_ambiguity(task: task_lib.Task, k: int) -> Optional[synthetic.Primitive]:
  """A wrong primitive for piece `k` that passes the piece's public examples, or None.

  Wrong: substituting it for piece `k` (the other pieces being right) changes the composed
  program's output on some hidden test of `task`. The stage check of piece `k` cannot tell it
  from the reference.

  Raises:
    ValueError: for a task without long-horizon metadata or `k` out of range.
  """
  ps = pieces(task)
  if not 0 <= k < len(ps):
    raise ValueError(f"k must be in [0, {len(ps)}), got {k}")
  program = synthetic.parse_program(task.metadata["program"])
  hidden = [e.args[0] for e in task.hidden_tests]
  p = ps[k]
  for q in synthetic.PRIMITIVES:
    if q is p.primitive or q.in_type != p.primitive.in_type or q.out_type != p.primitive.out_type:
      continue
    if all(q.fn(e.args[0]) == e.expected for e in p.examples) and _differs_downstream(
        program, k, q, hidden):
      return q
  return None


def measure_ambiguity(tasks: Sequence[task_lib.Task]) -> dict[str, float]:
  """Shares of ambiguous pieces and of tasks with at least one, over `tasks`.

  Returns:
    `{"pieces": share of pieces, "tasks": share of tasks, "per_stage": [share per stage]}`.

  Raises:
    ValueError: for an empty list or a task without long-horizon metadata.
  """
  if not tasks:
    raise ValueError("tasks must be non-empty")
  flags = [[piece_ambiguity(t, k) is not None for k in range(len(pieces(t)))] for t in tasks]
  k = max(len(f) for f in flags)
  per_stage = [sum(f[j] for f in flags if j < len(f)) / sum(j < len(f) for f in flags)
               for j in range(k)]
  return {"pieces": sum(map(sum, flags)) / sum(map(len, flags)),
          "tasks": sum(any(f) for f in flags) / len(flags),
          "per_stage": per_stage}


class LongHorizonTasks:
  """Random-access, unlimited source of long-horizon tasks (the interface of
  `synthetic.SyntheticTasks`: `task(split, index)`, `tasks(split, start, count)`)."""

  def __init__(self, config: LongHorizonConfig = LongHorizonConfig()):
    if not isinstance(config, LongHorizonConfig):
      raise ValueError(f"config must be a LongHorizonConfig, got {type(config).__name__}")
    self.config = config
    self._by_type: dict[str, dict[str, list[synthetic.Primitive]]] = {}
    allowed = set(config.primitives or synthetic.BY_NAME)
    for p in (q for q in synthetic.PRIMITIVES if q.name in allowed):
      self._by_type.setdefault(p.in_type, {}).setdefault(p.family, []).append(p)

  def task(self, split: str, index: int) -> task_lib.Task:
    """Task number `index` (>= 0) of `split` (`train`, `validation` or `test`).

    Raises:
      ValueError: for an unknown split or a negative index.
    """
    if split not in synthetic.SPLITS:
      raise ValueError(f"split must be one of {synthetic.SPLITS}, got {split!r}")
    if not isinstance(index, int) or index < 0:
      raise ValueError(f"index must be an int >= 0, got {index!r}")
    c = self.config
    rng = random.Random(f"agentic_grpo.long_horizon/{c.seed}/{c.num_stages}/{split}/{index}")
    while True:  # rejection sampling: degenerate programs, then the split hash
      in_type = synthetic.STR if rng.random() < c.string_prob else synthetic.LIST
      program = self._program(rng, in_type)
      hidden = self._inputs(rng, in_type, c.hidden_len, c.num_hidden)
      if hidden is None or all(program(x) == program(hidden[0]) for x in hidden[1:]):
        continue  # constant on the hidden tests: nothing to learn
      rows = []
      for p in program.prims:
        xs = self._inputs(rng, p.in_type, c.piece_len, c.piece_examples)
        if xs is None:
          break
        rows.append([[x, p.fn(x)] for x in xs])
      if len(rows) != len(program.prims):
        continue
      key = program.key + json.dumps(rows)
      if synthetic.split_of(key, c.split_fractions) == split:
        return self._build(split, index, program, rows, hidden)

  def tasks(self, split: str, start: int = 0, count: Optional[int] = None
            ) -> Iterator[task_lib.Task]:
    """Tasks `start, start+1, ...` of `split`; unlimited when `count` is None."""
    i = start
    while count is None or i < start + count:
      yield self.task(split, i)
      i += 1

  def _program(self, rng: random.Random, in_type: str) -> synthetic.Program:
    cur, prims = in_type, []
    for k in range(self.config.num_stages):
      families = list(self._by_type[cur].values())
      if k < self.config.num_stages - 1:
        # Keep a sequence type until the last piece, so that every piece has room to act.
        families = [f for f in families if f[0].out_type == cur] or families
      p = rng.choice(rng.choice(families))
      prims.append(p)
      cur = p.out_type
    return synthetic.Program(in_type, tuple(prims))

  def _inputs(self, rng: random.Random, in_type: str, length: tuple[int, int], n: int
              ) -> Optional[list[Any]]:
    c = self.config

    def draw():
      m = rng.randint(*length)
      if in_type == synthetic.LIST:
        return [rng.randint(0, c.max_int) for _ in range(m)]
      if in_type == synthetic.STR:
        return "".join(rng.choice(c.alphabet) for _ in range(m))
      return rng.randint(0, 3 * c.max_int)

    return synthetic.distinct(draw, n)

  def _build(self, split, index, program, rows, hidden) -> task_lib.Task:
    hidden_tests = tuple(task_lib.Example((x,), program(x)) for x in hidden)
    source = "".join(f"def {piece_name(k)}({PARAM}): return "
                     f"{synthetic.Program(p.in_type, (p,)).expression(PARAM)}\n"
                     for k, p in enumerate(program.prims)) + composition(len(program.prims))
    return task_lib.Task(
        task_id=f"lh-{split}-{self.config.seed}-{index}",
        prompt=program.signature(),
        entry_point=ENTRY_POINT,
        signature=program.signature(),
        hidden_tests=hidden_tests,
        reference_solution=source,
        difficulty=len(program.prims),
        source=SOURCE,
        metadata={"program": program.key, "pieces": json.dumps(rows), "split": split},
    )
