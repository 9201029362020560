"""The `Task` record shared by every task source, and its compact text format.

A task is a Python function to write: a prompt (what the agent sees), an entry point and its
signature, a few public input/output examples, hidden tests (I/O examples and/or assert-style
script code) that decide the final reward, and optionally a trusted reference solution and a
*probe* input whose output the agent predicts in the hypothesis stage.

Values are plain Python literals (int, float, bool, str, None, and lists, tuples, dicts and sets
of them). `format_value` writes them compactly (`[3,1,2]`, `'ab'`) so that byte-level models see
short prompts, and `parse_value` reads them back with `ast.literal_eval` (never `eval`).
An example line is `ARGS->EXPECTED`, where ARGS are the call's arguments separated by commas:
`[3,1,2]->[1,2,3]`, `'ab',2->'abab'`.

Two task kinds (`Task.kind`): `function` (the default: write `entry_point`, called on each
example's arguments) and `stdio` (competitive programming: write a whole program that reads
stdin and prints its answer; each example is `Example((INPUT,), OUTPUT)` with both strings,
written `'1 2\\n'->'3\\n'`, and `Task.stdio` holds the problem's limits and float tolerance).
"""

import ast
import dataclasses
import json
import math
from typing import Any, Mapping, Optional, Sequence

from agentic_grpo.tasks import python_ast

ARROW = "->"
FUNCTION = "function"
STDIO = "stdio"
TASK_KINDS = (FUNCTION, STDIO)
# The largest limits a `stdio` task may ask: a problem's limits come from data, and a looping
# program holds a sandbox worker for `tests * time`; every real judge's limits are far below.
MAX_TIME_SECONDS = 60.0
MAX_MEMORY_BYTES = 4 * 2**30


@dataclasses.dataclass(frozen=True)
class Example:
  """One I/O test: `entry_point(*args)` must return `expected`."""
  args: tuple
  expected: Any

  def __post_init__(self):
    if not isinstance(self.args, tuple):
      raise ValueError(f"args must be a tuple, got {type(self.args).__name__}: {self.args!r}")


@dataclasses.dataclass(frozen=True)
class StdioSpec:
  """How a `stdio` task's programs are judged (`sandbox.stdio`).

  Attributes:
    time_seconds: CPU seconds per test, or None for the run's default (`config.sandbox.cpu_s`);
      at most `MAX_TIME_SECONDS`.
    memory_bytes: address-space cap per test, or None for the run's default
      (`config.sandbox.memory_mb`); at least 64 MiB (the interpreter's need), at most
      `MAX_MEMORY_BYTES`.
    abs_tol, rel_tol: tolerance for output tokens that are both numbers, not both integers
      (0: exact tokens).
    ignore_case: output tokens equal but for ASCII case match (CodeContests' judge).
    numbers_by_value: output tokens that are both numbers match when their values are equal,
      even with no tolerance (`1.50` is `1.5`: LiveCodeBench's judge).
  """
  time_seconds: Optional[float] = None
  memory_bytes: Optional[int] = None
  abs_tol: float = 0.0
  rel_tol: float = 0.0
  ignore_case: bool = False
  numbers_by_value: bool = False

  def __post_init__(self):
    t, m = self.time_seconds, self.memory_bytes
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool)
                          or not math.isfinite(t) or not 0 < t <= MAX_TIME_SECONDS):
      raise ValueError(f"StdioSpec.time_seconds must be a number in (0, {MAX_TIME_SECONDS:g}] "
                       f"or None, got {t!r}")
    if m is not None and (not isinstance(m, int) or isinstance(m, bool)
                          or not 64 * 2**20 <= m <= MAX_MEMORY_BYTES):
      raise ValueError(f"StdioSpec.memory_bytes must be an int in [64 MiB, "
                       f"{MAX_MEMORY_BYTES // 2**30} GiB] or None, got {m!r}")
    for name in ("abs_tol", "rel_tol"):
      v = getattr(self, name)
      if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise ValueError(f"StdioSpec.{name} must be a finite number >= 0, got {v!r}")
    for name in ("ignore_case", "numbers_by_value"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"StdioSpec.{name} must be a bool, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class Task:
  """A coding task, the unit every task source yields.

  Attributes:
    task_id: unique id, e.g. `syn-train-0-17`, `HumanEval/0`, `mbpp/11`.
    prompt: the text shown to the agent before its first stage.
    entry_point: name of the function to write.
    signature: the function's signature without `def`, e.g. `f(x:list[int])->int`.
    public_examples: examples the agent sees (also in `prompt`).
    hidden_tests: I/O tests the agent never sees; the final reward is the fraction passed.
    reference_solution: trusted Python source defining `entry_point`, or None.
    probe: arguments of the hypothesis stage's probe input, or None (no hypothesis reward).
    probe_expected: the reference output on `probe`.
    hidden_script: assert-style test source (e.g. HumanEval's `check(candidate)`) run as a
      script test instead of / besides `hidden_tests`, or None.
    code_context: source prepended to the agent's code before it runs (imports, helpers).
    difficulty: source-specific difficulty level (composition depth for synthetic tasks).
    source: `synthetic`, `humaneval`, `mbpp`, ...
    metadata: extra string fields (e.g. the synthetic program).
    stdio: for a `stdio` task (a whole program judged on stdin/stdout; every example is
      `((INPUT,), OUTPUT)` with strings), its limits and tolerance; None for a function task.
      `entry_point` and `signature` are then unused (`main`, `main()` by convention).
  """
  task_id: str
  prompt: str
  entry_point: str
  signature: str
  public_examples: tuple[Example, ...] = ()
  hidden_tests: tuple[Example, ...] = ()
  reference_solution: Optional[str] = None
  probe: Optional[tuple] = None
  probe_expected: Any = None
  hidden_script: Optional[str] = None
  code_context: str = ""
  difficulty: int = 0
  source: str = ""
  metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
  stdio: Optional[StdioSpec] = None

  def __post_init__(self):
    if not isinstance(self.task_id, str) or not self.task_id:
      raise ValueError(f"task_id must be a non-empty str, got {self.task_id!r}")
    if not isinstance(self.entry_point, str) or not self.entry_point.isidentifier():
      raise ValueError(f"entry_point must be a Python identifier, got {self.entry_point!r}")
    for name in ("public_examples", "hidden_tests"):
      value = getattr(self, name)
      if not isinstance(value, tuple) or not all(isinstance(e, Example) for e in value):
        raise ValueError(f"{name} must be a tuple of Example, got {value!r:.200}")
    if not self.hidden_tests and not self.hidden_script:
      raise ValueError(f"task {self.task_id!r} needs hidden_tests or hidden_script")
    if self.probe is not None and not isinstance(self.probe, tuple):
      raise ValueError(f"probe must be a tuple of arguments or None, got {self.probe!r}")
    if self.stdio is not None:
      if not isinstance(self.stdio, StdioSpec):
        raise ValueError(f"stdio must be a StdioSpec or None, got {type(self.stdio).__name__}")
      for e in self.public_examples + self.hidden_tests:
        if not is_stdio_example(e):
          raise ValueError(f"task {self.task_id!r}: a stdio example must be ((INPUT,), OUTPUT) "
                           f"with strings, got {e!r:.120}")

  @property
  def kind(self) -> str:
    """`stdio` for a task with a `stdio` spec, else `function`."""
    return FUNCTION if self.stdio is None else STDIO

  @property
  def param_names(self) -> tuple[str, ...]:
    """Parameter names from `signature` (raises ValueError if it does not parse)."""
    return signature_params(self.signature)


def is_stdio_example(example: Example) -> bool:
  """Whether `example` is a stdin/stdout test: one str argument (the input), a str output."""
  return (len(example.args) == 1 and isinstance(example.args[0], str)
          and isinstance(example.expected, str))


def signature_params(signature: str) -> tuple[str, ...]:
  """Parameter names of a signature like `f(x:list[int],k:int)->int`.

  Raises:
    ValueError: if `signature` is not a Python function signature.
  """
  try:
    tree = python_ast.parse(f"def {signature.strip()}:\n  pass\n")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
  except (SyntaxError, AssertionError, IndexError, ValueError) as e:
    raise ValueError(f"signature does not parse: {signature!r}") from e
  args = fn.args
  return tuple(a.arg for a in args.posonlyargs + args.args)


# ------------------------------------------------------------------------------------ literals


def format_value(value: Any) -> str:
  """Compact literal text of `value` (no spaces after commas); `parse_value` reads it back."""
  if isinstance(value, (bool, int, float, str, bytes)) or value is None:
    return repr(value)
  if isinstance(value, list):
    return "[" + ",".join(format_value(v) for v in value) + "]"
  if isinstance(value, tuple):
    inner = ",".join(format_value(v) for v in value)
    return f"({inner},)" if len(value) == 1 else f"({inner})"
  if isinstance(value, dict):
    return "{" + ",".join(f"{format_value(k)}:{format_value(v)}" for k, v in value.items()) + "}"
  if isinstance(value, (set, frozenset)):
    if not value:
      return "set()"
    return "{" + ",".join(sorted(format_value(v) for v in value)) + "}"
  return repr(value)


def format_args(args: tuple) -> str:
  """Arguments of a call, comma-separated: `([1,2], 3)` -> `[1,2],3`."""
  return ",".join(format_value(a) for a in args)


def format_example(example: Example) -> str:
  """`ARGS->EXPECTED` line of an example."""
  return f"{format_args(example.args)}{ARROW}{format_value(example.expected)}"


def parse_value(text: str) -> Any:
  """Reads a literal with `ast.literal_eval` (`python_ast`: safe from several threads at once).

  Raises:
    ValueError: if `text` is not a Python literal (any parser failure, including recursion or
      integer-size limits, is reported as ValueError).
  """
  try:
    return python_ast.literal_eval(text.strip())
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"not a literal: {text!r:.80}") from e


def parse_args(text: str) -> tuple:
  """Reads comma-separated call arguments: `[1,2],3` -> `([1, 2], 3)`.

  Raises:
    ValueError: if `text` is empty or not a comma-separated list of literals.
  """
  if not text.strip():
    raise ValueError("empty argument list")
  value = parse_value(f"({text},)")
  if not isinstance(value, tuple):
    raise ValueError(f"not an argument list: {text!r:.80}")
  return value


def parse_example(line: str) -> Example:
  """Reads an `ARGS->EXPECTED` line. Tries every `->` so that string values may contain one.

  Raises:
    ValueError: if no split gives literal arguments and a literal expected value.
  """
  start = 0
  while True:
    pos = line.find(ARROW, start)
    if pos < 0:
      raise ValueError(f"not an ARGS->EXPECTED line: {line!r:.80}")
    try:
      return Example(parse_args(line[:pos]), parse_value(line[pos + len(ARROW):]))
    except ValueError:
      start = pos + 1


# ------------------------------------------------------------------------------- serialisation

_SCALAR_FIELDS = ("task_id", "prompt", "entry_point", "signature", "reference_solution",
                  "hidden_script", "code_context", "difficulty", "source")


def _examples_to_text(examples: Sequence[Example]) -> str:
  return format_value([(e.args, e.expected) for e in examples])


def _examples_from_text(text: str) -> tuple[Example, ...]:
  return tuple(Example(tuple(a), e) for a, e in parse_value(text))


def task_to_dict(task: Task) -> dict[str, Any]:
  """JSON-compatible dict of a task; values are stored as literal text (tuples survive)."""
  d = {k: getattr(task, k) for k in _SCALAR_FIELDS}
  d["public_examples"] = _examples_to_text(task.public_examples)
  d["hidden_tests"] = _examples_to_text(task.hidden_tests)
  d["probe"] = None if task.probe is None else format_value(task.probe)
  d["probe_expected"] = format_value(task.probe_expected)
  d["metadata"] = dict(task.metadata)
  if task.stdio is not None:  # absent for function tasks (their JSON is unchanged)
    d["stdio"] = dataclasses.asdict(task.stdio)
  return d


_OPTIONAL_STR_FIELDS = ("reference_solution", "hidden_script")


def _check_scalar(k: str, v: Any) -> None:
  if k == "difficulty":
    ok = isinstance(v, int) and not isinstance(v, bool)
  elif k in _OPTIONAL_STR_FIELDS:
    ok = v is None or isinstance(v, str)
  else:
    ok = isinstance(v, str)
  if not ok:
    want = "an int" if k == "difficulty" else "a str or null" if k in _OPTIONAL_STR_FIELDS else "a str"
    raise ValueError(f"field {k!r}: expected {want}, got {type(v).__name__}")


def task_from_dict(d: Mapping[str, Any]) -> Task:
  """Inverse of `task_to_dict`.

  Raises:
    ValueError: naming the field that is missing or malformed (wrong type, not a literal,
      nested or sized beyond the parser's limits).
  """
  if not isinstance(d, Mapping):
    raise ValueError(f"task dict must be a mapping, got {type(d).__name__}")
  kwargs = {}
  for k in _SCALAR_FIELDS:
    if k not in d:
      raise ValueError(f"task dict lacks field {k!r}")
    _check_scalar(k, d[k])
    kwargs[k] = d[k]
  for k in ("public_examples", "hidden_tests"):
    try:
      kwargs[k] = _examples_from_text(d[k])
    except Exception as e:  # pylint: disable=broad-except  (any malformed content)
      raise ValueError(f"field {k!r}: {type(e).__name__}: {e}") from e
  for k in ("probe", "probe_expected"):
    try:
      if k == "probe":
        kwargs[k] = None if d.get(k) is None else tuple(parse_value(d[k]))
      else:
        kwargs[k] = parse_value(d.get(k, "None"))
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"field {k!r}: {type(e).__name__}: {e}") from e
  metadata = d.get("metadata") or {}
  if not (isinstance(metadata, Mapping)
          and all(isinstance(a, str) and isinstance(b, str) for a, b in metadata.items())):
    raise ValueError(f"field 'metadata': expected an object of strings, got "
                     f"{type(metadata).__name__}")
  kwargs["metadata"] = dict(metadata)
  if d.get("stdio") is not None:
    spec = d["stdio"]
    names = {f.name for f in dataclasses.fields(StdioSpec)}
    if not isinstance(spec, Mapping) or set(spec) - names:
      raise ValueError(f"field 'stdio': expected an object with keys from {sorted(names)}, "
                       f"got {spec!r:.120}")
    try:
      kwargs["stdio"] = StdioSpec(**spec)
    except ValueError as e:
      raise ValueError(f"field 'stdio': {e}") from e
  return Task(**kwargs)


def task_to_json(task: Task) -> str:
  """One-line JSON of a task."""
  return json.dumps(task_to_dict(task), sort_keys=True)


def task_from_json(text: str) -> Task:
  """Inverse of `task_to_json`.

  Raises:
    ValueError: for malformed input of any kind: not UTF-8 (bytes), not JSON, nested too
      deeply, not an object, or a malformed field (named).
  """
  try:
    d = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"not JSON: {e}") from e
  except (ValueError, TypeError, RecursionError, MemoryError) as e:
    raise ValueError(f"not JSON: {type(e).__name__}: {str(e)[:80]}") from e
  if not isinstance(d, dict):
    raise ValueError(f"task JSON must be an object, got {type(d).__name__}")
  return task_from_dict(d)
