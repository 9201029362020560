"""The embedded default task: a seeded, unlimited generator of small Python programming problems.

A task's hidden function is a *program*: a composition of typed primitives over `list[int]`,
`int` and `str` (map `+k`/`*k`/`%k`, filter even/odd/`>k`, sort, reverse, take/drop, dedupe,
sum/max/min/len, upper, replace, count, ...). The difficulty level is the composition depth.
The reference solution is the program rendered as one line of Python
(`def f(x): return sorted([v+2 for v in x])`), whose semantics the in-process interpreter
(`run_program`) reproduces exactly; the tests check this through the sandbox.

Every task has 2-3 short public examples (in the prompt), `num_hidden` >= 8 hidden tests and a
probe input for the hypothesis stage. The prompt is compact, for byte-level models:

    f(x:list[int])->list[int]
    [3,1,2]->[4,3,5]
    [5]->[7]

**Ambiguity.** Public examples under-determine the program for a controlled share of tasks: a
task is *ambiguous* when another program of the grammar within one edit of the reference
(substitute, delete or insert one primitive, or the identity) returns the public outputs on the
public inputs yet fails at least one hidden test. For each task the generator draws whether it
should be ambiguous (probability `ambiguity_target`) and then draws public inputs until they
are (or are not) ambiguous, redrawing the program when they cannot be, so the measured share
equals the target up to sampling noise (with the defaults, 33% of train tasks 0..999 and 30% of
test tasks 0..199). `is_ambiguous` / `ambiguity_witness` measure it; with `radius=2` (programs
two edits away) the share is about twice as large (62% and 57%). This is where
passing the public examples is not passing the hidden tests, the situation retroactive
correction is for (docs/design.md §4).

**Determinism and splits.** Task `i` of a split is a pure function of `(seed, split, i)`
(random access, no state), so the stream is unlimited and reproducible. A task's split is fixed
by a hash of its `split_key`, so the splits are disjoint:
  - `split_by="task"` (default): the key is the prompt, so no validation or test prompt ever
    appears in train; the same program may, with other examples (held-out *instances*: the
    agent must still infer the program from new examples);
  - `split_by="program"`: the key is the program, so no test program appears in train (held-out
    *compositions*; at depth 1 this holds out whole primitives, which a small model cannot
    learn from the other splits).
"""

import dataclasses
import functools
import hashlib
import itertools
import random
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence

from agentic_grpo.tasks import task as task_lib

LIST, INT, STR = "L", "I", "S"
TYPE_NAMES = {LIST: "list[int]", INT: "int", STR: "str"}
SPLITS = ("train", "validation", "test")
SPLIT_BY = ("task", "program")
ENTRY_POINT = "f"
PARAM = "x"


@dataclasses.dataclass(frozen=True)
class Primitive:
  """One typed building block.

  Attributes:
    name: unique name, used in program keys (`add3`, `sort`).
    family: the primitive without its constant (`add`, `sort`); sampling picks a family first.
    in_type, out_type: `L`, `I` or `S`.
    template: Python expression with `{e}` for the inner expression.
    needs_atom: whether `{e}` must be atomic (parenthesised otherwise).
    atomic: whether the rendered expression is atomic (a call, subscript, display).
    fn: the same function, in process (trusted; used for generating expected outputs).
  """
  name: str
  family: str
  in_type: str
  out_type: str
  template: str
  needs_atom: bool
  atomic: bool
  fn: Callable[[Any], Any]


# Long by design: the table of primitives, one entry per line.
def _prims() -> tuple[Primitive, ...]:
  """The grammar. Each template and `fn` must agree exactly (checked by the tests)."""
  p = []

  def add(name, family, t_in, t_out, template, needs_atom, atomic, fn):
    p.append(Primitive(name, family, t_in, t_out, template, needs_atom, atomic, fn))

  # list[int] -> list[int]
  for k in (1, 2, 3):
    add(f"add{k}", "add", LIST, LIST, f"[v+{k} for v in {{e}}]", False, True,
        lambda xs, k=k: [v + k for v in xs])
  for k in (2, 3):
    add(f"mul{k}", "mul", LIST, LIST, f"[v*{k} for v in {{e}}]", False, True,
        lambda xs, k=k: [v * k for v in xs])
  for k in (2, 3):
    add(f"mod{k}", "mod", LIST, LIST, f"[v%{k} for v in {{e}}]", False, True,
        lambda xs, k=k: [v % k for v in xs])
  add("even", "even", LIST, LIST, "[v for v in {e} if v%2==0]", False, True,
      lambda xs: [v for v in xs if v % 2 == 0])
  add("odd", "odd", LIST, LIST, "[v for v in {e} if v%2]", False, True,
      lambda xs: [v for v in xs if v % 2])
  for k in (2, 4, 6):
    add(f"gt{k}", "gt", LIST, LIST, f"[v for v in {{e}} if v>{k}]", False, True,
        lambda xs, k=k: [v for v in xs if v > k])
  add("sort", "sort", LIST, LIST, "sorted({e})", False, True, sorted)
  add("rev", "rev", LIST, LIST, "{e}[::-1]", True, True, lambda xs: xs[::-1])
  for k in (1, 2, 3):
    add(f"take{k}", "take", LIST, LIST, f"{{e}}[:{k}]", True, True, lambda xs, k=k: xs[:k])
  for k in (1, 2):
    add(f"drop{k}", "drop", LIST, LIST, f"{{e}}[{k}:]", True, True, lambda xs, k=k: xs[k:])
  add("uniq", "uniq", LIST, LIST, "list(dict.fromkeys({e}))", False, True,
      lambda xs: list(dict.fromkeys(xs)))
  # list[int] -> int
  add("sum", "sum", LIST, INT, "sum({e})", False, True, sum)
  add("max", "max", LIST, INT, "max({e},default=0)", False, True, lambda xs: max(xs, default=0))
  add("min", "min", LIST, INT, "min({e},default=0)", False, True, lambda xs: min(xs, default=0))
  add("len", "len", LIST, INT, "len({e})", False, True, len)
  # int -> int
  for k in (1, 2, 5):
    add(f"iadd{k}", "iadd", INT, INT, f"{{e}}+{k}", True, False, lambda v, k=k: v + k)
  for k in (2, 3):
    add(f"imul{k}", "imul", INT, INT, f"{{e}}*{k}", True, False, lambda v, k=k: v * k)
  for k in (2, 3, 5):
    add(f"imod{k}", "imod", INT, INT, f"{{e}}%{k}", True, False, lambda v, k=k: v % k)
  # str -> str
  add("upper", "upper", STR, STR, "{e}.upper()", True, True, str.upper)
  add("srev", "srev", STR, STR, "{e}[::-1]", True, True, lambda s: s[::-1])
  add("ssort", "ssort", STR, STR, "''.join(sorted({e}))", False, True,
      lambda s: "".join(sorted(s)))
  for k in (1, 2, 3):
    add(f"stake{k}", "stake", STR, STR, f"{{e}}[:{k}]", True, True, lambda s, k=k: s[:k])
  for k in (1, 2):
    add(f"sdrop{k}", "sdrop", STR, STR, f"{{e}}[{k}:]", True, True, lambda s, k=k: s[k:])
  add("suniq", "suniq", STR, STR, "''.join(dict.fromkeys({e}))", False, True,
      lambda s: "".join(dict.fromkeys(s)))
  for c in "ab":
    add(f"del{c}", "del", STR, STR, f"{{e}}.replace('{c}','')", True, True,
        lambda s, c=c: s.replace(c, ""))
  for c, d in (("a", "b"), ("c", "a")):
    add(f"rep{c}{d}", "rep", STR, STR, f"{{e}}.replace('{c}','{d}')", True, True,
        lambda s, c=c, d=d: s.replace(c, d))
  add("dup", "dup", STR, STR, "{e}*2", True, False, lambda s: s * 2)
  # str -> int
  add("slen", "slen", STR, INT, "len({e})", False, True, len)
  for c in "ab":
    add(f"count{c}", "count", STR, INT, f"{{e}}.count('{c}')", True, True,
        lambda s, c=c: s.count(c))
  return tuple(p)


PRIMITIVES: tuple[Primitive, ...] = _prims()
BY_NAME: dict[str, Primitive] = {p.name: p for p in PRIMITIVES}
assert len(BY_NAME) == len(PRIMITIVES)


# -------------------------------------------------------------------------------- programs


@dataclasses.dataclass(frozen=True)
class Program:
  """A composition `prims[-1](...prims[1](prims[0](x)))` with input type `in_type`."""
  in_type: str
  prims: tuple[Primitive, ...]

  @property
  def out_type(self) -> str:
    return self.prims[-1].out_type if self.prims else self.in_type

  @property
  def key(self) -> str:
    """Canonical text, e.g. `L:sort|add2`; `parse_program` reads it back."""
    return f"{self.in_type}:" + "|".join(p.name for p in self.prims)

  def __call__(self, x: Any) -> Any:
    for p in self.prims:
      x = p.fn(x)
    return x

  def expression(self, param: str = PARAM) -> str:
    """The program as one Python expression of `param`."""
    expr, atomic = param, True
    for p in self.prims:
      inner = expr if (atomic or not p.needs_atom) else f"({expr})"
      expr, atomic = p.template.format(e=inner), p.atomic
    return expr

  def signature(self, name: str = ENTRY_POINT, param: str = PARAM) -> str:
    return f"{name}({param}:{TYPE_NAMES[self.in_type]})->{TYPE_NAMES[self.out_type]}"

  def source(self, name: str = ENTRY_POINT, param: str = PARAM) -> str:
    """One-line reference solution: `def f(x): return EXPR`."""
    return f"def {name}({param}): return {self.expression(param)}"


def parse_program(key: str) -> Program:
  """Inverse of `Program.key`.

  Raises:
    ValueError: for an unknown type or primitive, or a composition that does not type-check.
  """
  in_type, sep, rest = key.partition(":")
  if not sep or in_type not in TYPE_NAMES:
    raise ValueError(f"program key must start with L:, I: or S:, got {key!r}")
  prims = []
  cur = in_type
  for name in filter(None, rest.split("|")):
    if name not in BY_NAME:
      raise ValueError(f"unknown primitive {name!r} in program key {key!r}")
    p = BY_NAME[name]
    if p.in_type != cur:
      raise ValueError(f"primitive {name!r} takes {p.in_type}, gets {cur} in {key!r}")
    prims.append(p)
    cur = p.out_type
  return Program(in_type, tuple(prims))


def _typed(in_type: str, prims: Sequence[Primitive]) -> bool:
  cur = in_type
  for p in prims:
    if p.in_type != cur:
      return False
    cur = p.out_type
  return True


def neighbors(program: Program, radius: int = 1) -> list[Program]:
  """Programs within `radius` edits of `program` with the same signature.

  An edit substitutes one primitive by another of the same input and output type, deletes a
  type-preserving primitive (the empty program is the identity), or inserts a type-preserving
  primitive anywhere. The program itself is excluded; the result is deduplicated and ordered.
  """
  if radius < 1:
    raise ValueError(f"radius must be >= 1, got {radius}")
  frontier = {program.prims}
  seen = {program.prims}
  for _ in range(radius):
    nxt = set()
    for prims in frontier:
      for cand in _edits(program.in_type, prims):
        if cand not in seen:
          seen.add(cand)
          nxt.add(cand)
    frontier = nxt
  out = [Program(program.in_type, c) for c in seen if c != program.prims]
  out = [q for q in out if q.out_type == program.out_type]
  return sorted(out, key=lambda q: q.key)


def _edits(in_type: str, prims: tuple[Primitive, ...]) -> Iterator[tuple[Primitive, ...]]:
  types = [in_type]
  for p in prims:
    types.append(p.out_type)
  for i, p in enumerate(prims):
    for q in PRIMITIVES:
      if q is not p and q.in_type == p.in_type and q.out_type == p.out_type:
        yield prims[:i] + (q,) + prims[i + 1:]
    if p.in_type == p.out_type:
      yield prims[:i] + prims[i + 1:]
  for i, t in enumerate(types):
    for q in PRIMITIVES:
      if q.in_type == t and q.out_type == t:
        yield prims[:i] + (q,) + prims[i:]


@functools.lru_cache(maxsize=4096)
def _neighbors_of_key(key: str) -> tuple[Program, ...]:
  return tuple(neighbors(parse_program(key)))


def _cached_neighbors(program: Program) -> tuple[Program, ...]:
  return _neighbors_of_key(program.key)


class _Plan(NamedTuple):
  """A program and its neighbours (`neighbors`) evaluated together on one input, each distinct
  prefix of their primitives once (`_evaluate`): node 0 is the input; `ops[i - 1] = (parent,
  fn)` makes node `i` as `fn` of node `parent`. `program` and `neighbors[j]` are the nodes of
  the program's and of its j-th neighbour's output."""
  ops: tuple[tuple[int, Callable[[Any], Any]], ...]
  program: int
  neighbors: tuple[int, ...]


@functools.lru_cache(maxsize=4096)
def _plan_of_key(key: str) -> _Plan:
  nodes: dict[tuple[Primitive, ...], int] = {(): 0}
  ops = []

  def node(prims):
    if prims not in nodes:
      parent = node(prims[:-1])
      ops.append((parent, prims[-1].fn))
      nodes[prims] = len(ops)
    return nodes[prims]

  own = node(parse_program(key).prims)
  neighbors_nodes = tuple(node(q.prims) for q in _neighbors_of_key(key))
  return _Plan(tuple(ops), own, neighbors_nodes)


def _evaluate(plan: _Plan, x: Any) -> list[Any]:
  """Every node of `plan` on input `x` (the primitives are pure: nodes share values)."""
  values = [x]
  for parent, fn in plan.ops:
    values.append(fn(values[parent]))
  return values


def _outputs(program: Program, inputs: Sequence[Any]) -> list[Any]:
  return [program(x) for x in inputs]


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
  # Grammar values are ints, strs and lists of ints, for which `==` is exact (no bools or
  # floats arise), and much faster than `literals.values_equal`.
  return a == b


def ambiguity_witness(program: Program, public_inputs: Sequence[Any],
                      hidden_inputs: Sequence[Any], radius: int = 1) -> Optional[Program]:
  """A program near `program` that passes the public examples but fails a hidden test.

  Args:
    program: the reference program.
    public_inputs: inputs of the public examples (outputs are `program`'s).
    hidden_inputs: inputs of the hidden tests.
    radius: edit radius of the candidate set (`neighbors`).

  Returns:
    The first such program in key order, or None when the public examples single out
    `program` among its neighbours (as far as the hidden tests can tell).
  """
  pub = _outputs(program, public_inputs)
  hid = _outputs(program, hidden_inputs)
  for q in neighbors(program, radius):
    if _same(_outputs(q, public_inputs), pub) and not _same(_outputs(q, hidden_inputs), hid):
      return q
  return None


def is_ambiguous(task: task_lib.Task, radius: int = 1) -> bool:
  """Whether a nearby program passes `task`'s public examples but fails a hidden test.

  Raises:
    ValueError: if `task` is not a synthetic task (no `program` in its metadata).
  """
  if "program" not in task.metadata:
    raise ValueError(f"task {task.task_id!r} has no synthetic program in its metadata")
  program = parse_program(task.metadata["program"])
  return ambiguity_witness(program, [e.args[0] for e in task.public_examples],
                           [e.args[0] for e in task.hidden_tests], radius) is not None


def near_miss(task: task_lib.Task) -> Optional[Program]:
  """A wrong program one edit from `task`'s reference that fails at least one public example.

  The first such neighbour (`neighbors`, radius 1; substitutions before deletions and
  insertions, each in an order drawn from the task id), so the choice is a pure function of the
  task. Used for reference episodes that show a failing first
  attempt and its fix (`WorkflowConfig.reference_fix_fraction`).

  Returns:
    The program, or None when `task` is not a synthetic task (no `program` in its metadata) or
    every neighbour passes the public examples.
  """
  key = task.metadata.get("program")
  if key is None:
    return None
  program = parse_program(key)
  inputs = [e.args[0] for e in task.public_examples]
  expected = [e.expected for e in task.public_examples]
  candidates = list(_cached_neighbors(program))
  random.Random(task.task_id).shuffle(candidates)
  # Substitutions first (the confusions a model makes), then deletions and insertions.
  candidates.sort(key=lambda q: abs(len(q.prims) - len(program.prims)))
  for q in candidates:
    if not _same(_outputs(q, inputs), expected):
      return q
  return None


# The imperfect teacher's confusion of a primitive that has no sibling in its family (a
# family's members are confused with the next member, cyclically): plausible mix-ups of the
# same signature.
_SINGLETON_CONFUSIONS = {
    "even": "odd", "odd": "even", "sort": "rev", "rev": "sort", "uniq": "sort",
    "sum": "max", "max": "min", "min": "max", "len": "sum",
    "upper": "srev", "srev": "ssort", "ssort": "srev", "suniq": "ssort", "dup": "srev",
    "slen": "counta",
}


def _confusions() -> dict[str, Primitive]:
  by_family: dict[str, list[Primitive]] = {}
  for p in PRIMITIVES:
    by_family.setdefault(p.family, []).append(p)
  out = {}
  for p in PRIMITIVES:
    members = by_family[p.family]
    if len(members) > 1:
      out[p.name] = members[(members.index(p) + 1) % len(members)]
    else:
      out[p.name] = BY_NAME[_SINGLETON_CONFUSIONS[p.name]]
  return out


# Every primitive's systematic confusion (same input and output type, another primitive).
CONFUSIONS: dict[str, Primitive] = _confusions()


def teacher_confusion(task: task_lib.Task) -> Optional[Program]:
  """The program an imperfect teacher writes for `task` when it errs: the reference with its
  last primitive replaced by that primitive's fixed confusion (`CONFUSIONS`: the next member
  of its family, `add1 -> add2`, `take3 -> take1`, or a plausible mix-up, `max -> min`).

  The mistake is *systematic*, as a weaker model's or a sloppy annotator's are: the same
  primitive is always confused with the same other one, whatever the task's examples say, so a
  policy trained on such episodes learns the confusion as a habit that its own samples (judged
  by the tests) can show it to drop (`WorkflowConfig.reference_error_rate`).

  Returns:
    The confused program (which may still pass some tests), or None when `task` is not a
    synthetic task (no `program` in its metadata) or its program is the identity.
  """
  key = task.metadata.get("program")
  if key is None:
    return None
  program = parse_program(key)
  if not program.prims:
    return None
  return Program(program.in_type,
                 program.prims[:-1] + (CONFUSIONS[program.prims[-1].name],))


# ------------------------------------------------------------------------------- generator


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
  """Knobs of the synthetic task distribution.

  Attributes:
    seed: base seed; task `i` of a split depends only on (seed, split, i).
    depths: composition depths (difficulty levels) to draw from.
    depth_weights: relative weights of `depths` (uniform if None).
    string_prob: probability that the input is a `str` rather than a `list[int]`.
    num_public: choices for the number of public examples.
    num_hidden: hidden tests per task (>= 8).
    public_len: (min, max) length of public inputs.
    probe_len: (min, max) length of the probe input.
    hidden_len: (min, max) length of hidden inputs.
    max_int: list elements are drawn from 0..max_int.
    alphabet: letters of string inputs.
    ambiguity_target: probability that a task's public examples are drawn to be ambiguous
      (a program for which the wanted kind of public inputs is not found is redrawn).
    public_attempts: draws of ambiguous public inputs before a program is redrawn.
    separation_pool: size of the random pool that unambiguous public inputs are picked from.
    split_fractions: shares of the program-hash space for train, validation, test.
    split_by: `task` (no prompt shared across splits) or `program` (no program shared).
  """
  seed: int = 0
  depths: tuple[int, ...] = (1, 2, 3)
  depth_weights: Optional[tuple[float, ...]] = None
  string_prob: float = 0.4
  num_public: tuple[int, ...] = (2, 3)
  num_hidden: int = 8
  public_len: tuple[int, int] = (1, 5)
  probe_len: tuple[int, int] = (2, 4)
  hidden_len: tuple[int, int] = (0, 6)
  max_int: int = 9
  alphabet: str = "abcdef"
  ambiguity_target: float = 0.3
  public_attempts: int = 40
  separation_pool: int = 24
  split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
  split_by: str = "task"

  def __post_init__(self):
    if not self.depths or min(self.depths) < 1:
      raise ValueError(f"depths must be non-empty and >= 1, got {self.depths}")
    if self.depth_weights is not None and len(self.depth_weights) != len(self.depths):
      raise ValueError(f"depth_weights must match depths {self.depths}, got {self.depth_weights}")
    if self.num_hidden < 8:
      raise ValueError(f"num_hidden must be >= 8, got {self.num_hidden}")
    if not self.num_public or min(self.num_public) < 1:
      raise ValueError(f"num_public must be non-empty and >= 1, got {self.num_public}")
    for name in ("public_len", "probe_len", "hidden_len"):
      lo, hi = getattr(self, name)
      if not 0 <= lo <= hi:
        raise ValueError(f"{name} must be (min, max) with 0 <= min <= max, got {(lo, hi)}")
    if self.public_len[0] < 1:
      raise ValueError(f"public_len min must be >= 1, got {self.public_len}")
    if not 0.0 <= self.ambiguity_target <= 1.0:
      raise ValueError(f"ambiguity_target must be in [0, 1], got {self.ambiguity_target}")
    if not 0.0 <= self.string_prob <= 1.0:
      raise ValueError(f"string_prob must be in [0, 1], got {self.string_prob}")
    if (len(self.split_fractions) != 3 or min(self.split_fractions) <= 0
        or abs(sum(self.split_fractions) - 1.0) > 1e-9):
      raise ValueError(f"split_fractions must be 3 positive shares summing to 1, "
                       f"got {self.split_fractions}")
    if self.split_by not in SPLIT_BY:
      raise ValueError(f"split_by must be one of {SPLIT_BY}, got {self.split_by!r}")
    if self.public_attempts < 1 or self.separation_pool < max(self.num_public):
      raise ValueError(f"public_attempts must be >= 1 and separation_pool >= max(num_public), "
                       f"got {self.public_attempts}, {self.separation_pool}")
    if self.max_int < 1 or len(set(self.alphabet)) < 3:
      raise ValueError(f"max_int must be >= 1 and alphabet have >= 3 letters, got "
                       f"{self.max_int}, {self.alphabet!r}")


def split_key(task: task_lib.Task, split_by: str = "task") -> str:
  """The text whose hash decides the split of a synthetic `task` (see the module docstring).

  Raises:
    ValueError: for an unknown `split_by` or a task without a synthetic program.
  """
  if split_by == "task":
    return task.prompt
  if split_by == "program":
    if "program" not in task.metadata:
      raise ValueError(f"task {task.task_id!r} has no synthetic program in its metadata")
    return task.metadata["program"]
  raise ValueError(f"split_by must be one of {SPLIT_BY}, got {split_by!r}")


def split_of(key: str, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> str:
  """The split a program or task key belongs to, from a stable hash of the key."""
  h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64
  edge = 0.0
  for name, frac in zip(SPLITS, fractions):
    edge += frac
    if h < edge:
      return name
  return SPLITS[-1]


def _prompt(program: Program, public_inputs: Sequence[Any]) -> str:
  lines = [program.signature()]
  lines += [task_lib.format_example(task_lib.Example((x,), program(x))) for x in public_inputs]
  return "\n".join(lines)


class SyntheticTasks:
  """Random-access, unlimited source of synthetic tasks.

  `tasks.task("train", 17)` is the same `Task` in every process for the same config.
  """

  def __init__(self, config: SyntheticConfig = SyntheticConfig()):
    self.config = config
    self._families: dict[str, list[list[Primitive]]] = {}
    for t in TYPE_NAMES:
      fams: dict[str, list[Primitive]] = {}
      for p in PRIMITIVES:
        if p.in_type == t:
          fams.setdefault(p.family, []).append(p)
      self._families[t] = list(fams.values())

  def task(self, split: str, index: int) -> task_lib.Task:
    """Task number `index` (>= 0) of `split` (`train`, `validation` or `test`).

    Raises:
      ValueError: for an unknown split or a negative index.
      RuntimeError: if no program of the configured depths falls into `split` (a config whose
        grammar slice is too small for the split fractions).
    """
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(index, int) or index < 0:
      raise ValueError(f"index must be an int >= 0, got {index!r}")
    rng = random.Random(f"agentic_grpo.synthetic/{self.config.seed}/{split}/{index}")
    # Drawn once per task, so that the rejections below do not skew their distributions.
    c = self.config
    want_ambiguous = rng.random() < c.ambiguity_target
    depth = rng.choices(c.depths, weights=c.depth_weights)[0]
    in_type = STR if rng.random() < c.string_prob else LIST
    fractions, by_program = c.split_fractions, c.split_by == "program"
    for _ in range(100_000):
      program = self._program(rng, depth, in_type)
      if by_program and split_of(program.key, fractions) != split:
        continue
      made = self._draw(rng, program, want_ambiguous)
      if made is None:
        continue
      # Deciding the split only after a complete draw keeps every split's task distribution
      # the same (rejection sampling on a hash independent of how the task was drawn).
      if by_program or split_of(_prompt(program, made[0]), fractions) == split:
        return self._build(split, index, program, *made)
    raise RuntimeError(f"no program of depths {self.config.depths} falls into split {split!r}")

  def tasks(self, split: str, start: int = 0, count: Optional[int] = None
            ) -> Iterator[task_lib.Task]:
    """Tasks `start, start+1, ...` of `split`; unlimited when `count` is None."""
    indices = itertools.count(start) if count is None else range(start, start + count)
    for i in indices:
      yield self.task(split, i)

  # -------------------------------------------------------------------------- internals

  def _program(self, rng: random.Random, depth: int, in_type: str) -> Program:
    cur, prims = in_type, []
    for _ in range(depth):
      family = rng.choice(self._families[cur])
      p = rng.choice(family)
      prims.append(p)
      cur = p.out_type
    return Program(in_type, tuple(prims))

  def _input(self, rng: random.Random, in_type: str, lo: int, hi: int) -> Any:
    n = rng.randint(lo, hi)
    if in_type == LIST:
      return [rng.randint(0, self.config.max_int) for _ in range(n)]
    return "".join(rng.choice(self.config.alphabet) for _ in range(n))

  def _distinct_inputs(self, rng, in_type, lo, hi, n, exclude=()) -> Optional[list[Any]]:
    return distinct(lambda: self._input(rng, in_type, lo, hi), n, exclude)

  def _draw(self, rng: random.Random, program: Program, want_ambiguous: bool):
    """(public, hidden, probe) inputs for `program`, or None (degenerate, or no public inputs of
    the wanted ambiguity)."""
    c = self.config
    hidden = self._distinct_inputs(rng, program.in_type, *c.hidden_len, c.num_hidden)
    if hidden is None:
      return None
    plan = _plan_of_key(program.key)
    hid_values = [_evaluate(plan, x) for x in hidden]
    hid_out = [v[plan.program] for v in hid_values]
    # Degenerate: constant on the hidden inputs, or equal there to a program made of a
    # subsequence of its primitives (a redundant primitive, `rev|rev`, ...).
    if all(o == hid_out[0] for o in hid_out[1:]):
      return None
    d = len(program.prims)
    for size in range(d):
      for keep in itertools.combinations(range(d), size):
        prims = tuple(program.prims[i] for i in keep)
        if not _typed(program.in_type, prims):
          continue
        shorter = Program(program.in_type, prims)
        if shorter.out_type == program.out_type and _same(_outputs(shorter, hidden), hid_out):
          return None
    # Neighbours that the hidden tests tell apart from the program.
    neighbours = _cached_neighbors(program)
    rival_nodes = [(j, k) for j, k in enumerate(plan.neighbors)
                   if not _same([v[k] for v in hid_values], hid_out)]
    rivals = [neighbours[j] for j, _ in rival_nodes]
    n_pub = rng.choice(c.num_public)
    if want_ambiguous:
      publics = self._ambiguous_inputs(rng, program, rivals, n_pub, hidden)
    else:
      publics = self._separating_inputs(rng, program, [k for _, k in rival_nodes], n_pub,
                                        hidden)
    if publics is None:
      return None  # no public inputs of the wanted kind: draw another program
    probe = self._distinct_inputs(rng, program.in_type, *c.probe_len, 1, exclude=publics)
    if probe is None:
      return None
    return publics, hidden, probe[0]

  def _ambiguous_inputs(self, rng, program, rivals, n, exclude):
    """Random public inputs on which some rival agrees with `program`, or None."""
    c = self.config
    for _ in range(c.public_attempts):
      publics = self._distinct_inputs(rng, program.in_type, *c.public_len, n, exclude=exclude)
      if publics is None:
        return None
      pub_out = _outputs(program, publics)
      if any(_same(_outputs(q, publics), pub_out) for q in rivals):
        return publics
    return None

  def _separating_inputs(self, rng, program, rival_nodes, n, exclude):
    """`n` inputs from a random pool that tell `program` from every rival, or None.

    `rival_nodes`: the rivals' output nodes in `program`'s `_Plan`. Greedy set cover:
    repeatedly the input that separates the most rivals not yet separated (ties broken at
    random).
    """
    c = self.config
    pool = self._distinct_inputs(rng, program.in_type, *c.public_len, c.separation_pool,
                                 exclude=exclude)
    if pool is None:
      return None
    plan = _plan_of_key(program.key)
    kills = []
    for x in pool:
      values = _evaluate(plan, x)
      o = values[plan.program]
      kills.append(frozenset(j for j, k in enumerate(rival_nodes) if values[k] != o))
    chosen, covered = [], set()
    while len(chosen) < n:
      rest = [i for i in range(len(pool)) if i not in chosen]
      gains = [len(kills[i] - covered) for i in rest]
      top = max(gains)
      best = rng.choice([i for i, g in zip(rest, gains) if g == top])
      chosen.append(best)
      covered |= kills[best]
    if len(covered) < len(rival_nodes):
      return None
    rng.shuffle(chosen)
    return [pool[i] for i in chosen]

  def _build(self, split, index, program, publics, hidden, probe) -> task_lib.Task:
    public_examples = tuple(task_lib.Example((x,), program(x)) for x in publics)
    hidden_tests = tuple(task_lib.Example((x,), program(x)) for x in hidden)
    signature = program.signature()
    prompt = _prompt(program, publics)
    return task_lib.Task(
        task_id=f"syn-{split}-{self.config.seed}-{index}",
        prompt=prompt,
        entry_point=ENTRY_POINT,
        signature=signature,
        public_examples=public_examples,
        hidden_tests=hidden_tests,
        reference_solution=program.source(),
        probe=(probe,),
        probe_expected=program(probe),
        difficulty=len(program.prims),
        source="synthetic",
        metadata={"program": program.key, "split": split},
    )


def distinct(draw: Callable[[], Any], n: int, exclude: Sequence[Any] = ()) -> Optional[list[Any]]:
  """`n` values of `draw()` with distinct `repr`s, none equal (by `repr`) to one in `exclude`.

  Calls `draw` at most `50 * n` times, in order (so a seeded `draw` gives the same values every
  time); returns None if that does not yield `n` distinct values.
  """
  out, seen = [], {repr(x) for x in exclude}
  for _ in range(50 * n):
    x = draw()
    if repr(x) not in seen:
      seen.add(repr(x))
      out.append(x)
      if len(out) == n:
        return out
  return None
