"""The staged coding workflow: hypothesis -> code -> tests -> debug x R, with verifiable rewards.

An *episode* is one attempt at one `Task`. It is a sequence of *segments*, one per stage: an
**opening** written by the environment (the task prompt before the first stage, the stage's
opening delimiter, and for debug stages an observation; never trained on) followed by the
model's **output**, which ends with the stage's closing delimiter (a special token of the byte
tokenizer; trained on). With the defaults an episode of a synthetic task reads

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

Stage rewards (DESIGN.md §4), each in [0, 1]:
  - hypothesis: 1 if the predicted value equals the reference output on the probe;
  - code: fraction of the public examples the code passes (run in the sandbox);
  - tests: fraction of the k requested tests that parse, are not copies of a public example's
    input (nor of an earlier own test), and agree with the reference solution (the reference
    runs on the agent's inputs in the sandbox; the agent's expected values are compared in the
    trusted parent);
  - debug: fraction of public examples and verified own tests passed by the revised code.
The final reward is the fraction of hidden tests passed by the last version of the code.

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
`stage_rewards=False` to skip their sandbox runs). `reference_segments(task)` gives the ideal
episode (for the supervised warm start) without running anything.
"""

import ast
import collections
import dataclasses
import hashlib
import re
from typing import Any, Callable, Mapping, Optional, Sequence
import warnings

from absl import logging
import numpy as np

from agentic_grpo.agent import sandbox
from agentic_grpo.tasks import literals
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib

STAGE_KINDS = ("hypothesis", "code", "tests", "debug")
DELIMITERS = {
    "hypothesis": ("<hyp>", "</hyp>"),
    "code": ("<code>", "</code>"),
    "tests": ("<tests>", "</tests>"),
    "debug": ("<debug>", "</debug>"),
}
OBS_OPEN, OBS_CLOSE = "<obs>", "</obs>"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<hyp>", "</hyp>", "<code>", "</code>", "<tests>",
                  "</tests>", "<debug>", "</debug>", "<obs>", "</obs>")
KEEP = "keep"
FINAL = "final"
FRACTION = "fraction"
ALL_PASS = "all_pass"
REWARD_MODES = (FRACTION, ALL_PASS)
REFERENCE_DEBUG = (KEEP, "restate")
_MAX_OUTPUT_CHARS = 20_000  # longer stage outputs are not parsed (reward 0)
# The file name model outputs are parsed under: the compiler's SyntaxWarnings about them
# (`1if x else y`: "invalid decimal literal") say nothing about the run and are not shown.
_MODEL_SOURCE = "<model output>"
warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(_MODEL_SOURCE) + r"\Z")
_SPECIAL_RE = re.compile(r"</?(?:pad|bos|eos|hyp|code|tests|debug|obs)>")


class ParseError(ValueError):
  """A stage output the stage's parser rejects (reward 0; not counted as an error)."""


@dataclasses.dataclass(frozen=True)
class WorkflowConfig:
  """Which stages run, how they are rendered and rewarded: the run config's `workflow` section.

  Attributes:
    stages: stage kinds in order, from `STAGE_KINDS`; `debug` expands into
      `max_debug_rounds` stages named `debug_1`, `debug_2`, ...
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

  Raises:
    ValueError: at construction, naming the first bad field (`config.workflow.<field>`).
  """
  stages: tuple[str, ...] = ("hypothesis", "code", "tests", "debug")
  max_debug_rounds: int = 1
  num_agent_tests: int = 2
  max_obs_chars: int = 120
  max_value_chars: int = 32
  stage_rewards: bool = True
  max_new_tokens: int = 64
  reference_debug: str = KEEP
  min_test_input_len: int = 2
  reward_mode: str = FRACTION
  reference_fix_fraction: float = 0.0

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

    stages = self.stages
    check(stages and not [s for s in stages if s not in STAGE_KINDS]
          and len(set(stages)) == len(stages), "stages",
          f"must be distinct stage kinds from {STAGE_KINDS}", stages)
    check("code" in stages, "stages", "must include 'code' (the final reward needs code)",
          stages)
    for later in ("tests", "debug"):
      check(later not in stages or stages.index(later) > stages.index("code"), "stages",
            f"must have {later!r} after 'code'", stages)
    for name, low in (("max_debug_rounds", 0), ("num_agent_tests", 1), ("max_obs_chars", 8),
                      ("max_value_chars", 4), ("max_new_tokens", 1), ("min_test_input_len", 0)):
      value = getattr(self, name)
      check(isinstance(value, int) and not isinstance(value, bool) and value >= low, name,
            f"must be an int >= {low}", value)
    check(self.reward_mode in REWARD_MODES, "reward_mode", f"must be one of {REWARD_MODES}",
          self.reward_mode)
    check(self.reference_debug in REFERENCE_DEBUG, "reference_debug",
          f"must be one of {REFERENCE_DEBUG}", self.reference_debug)
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


# ---------------------------------------------------------------------------------- episodes


@dataclasses.dataclass(frozen=True)
class Segment:
  """One stage of an episode: environment text, then model text (with the close token)."""
  stage: str
  opening: str
  output: str


@dataclasses.dataclass
class Episode:
  """State of one attempt at a task. Mutated only by the `Workflow`.

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


# ------------------------------------------------------------------------------------ helpers


def _sanitize(text: str) -> str:
  """Removes special-token strings from environment text derived from program output."""
  return _SPECIAL_RE.sub("?", text)


def _short(value_text: str, limit: int) -> str:
  return value_text if len(value_text) <= limit else value_text[:limit - 3] + "..."


def parse_code(body: str, task: task_lib.Task) -> str:
  """Runnable source for a code-stage output.

  Accepted forms: a one-line expression of the task's parameters (`sorted(x)`, wrapped into
  `def f(x): return sorted(x)`); a module defining `entry_point`; both prefixed with the task's
  `code_context`; or a continuation of a prompt that ends inside the entry point
  (HumanEval-style completion, prefixed with the prompt).

  Raises:
    ParseError: if the text is none of these.
  """
  stripped = body.strip()
  if not stripped:
    raise ParseError("empty code")
  if len(body) > _MAX_OUTPUT_CHARS:
    raise ParseError(f"code longer than {_MAX_OUTPUT_CHARS} characters")
  if "\n" not in stripped:
    try:
      ast.parse(stripped, filename=_MODEL_SOURCE, mode="eval")
      params = ",".join(task.param_names)
      return f"{task.code_context}def {task.entry_point}({params}): return {stripped}\n"
    except (SyntaxError, ValueError, MemoryError, RecursionError):
      pass
  for prefix, text in ((task.code_context, stripped + "\n"), (task.prompt, body + "\n")):
    if prefix is task.prompt and f"def {task.entry_point}(" not in task.prompt:
      continue
    source = prefix + text
    try:
      tree = ast.parse(source, filename=_MODEL_SOURCE)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
      continue
    if any(isinstance(n, ast.FunctionDef) and n.name == task.entry_point for n in tree.body):
      return source
  raise ParseError(f"neither an expression nor a definition of {task.entry_point!r}")


def _io_tests(examples: Sequence[task_lib.Example]) -> tuple[sandbox.IOTest, ...]:
  return tuple(sandbox.IOTest(e.args, e.expected) for e in examples)


def _check_function(script: str) -> Optional[str]:
  """`check` if the script defines a top-level `check` (HumanEval), else None (asserts)."""
  try:
    tree = ast.parse(script)
  except SyntaxError:
    return None
  defines = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
  return "check" if defines else None


def _hidden_program(task: task_lib.Task, source: str) -> sandbox.Program:
  script = task.hidden_script or None
  return sandbox.Program(source, task.entry_point, io_tests=_io_tests(task.hidden_tests),
                         script_test=script,
                         check_function=_check_function(script) if script else None,
                         script_context=(task.code_context or None) if script else None)


def _compact_reference(task: task_lib.Task) -> Optional[str]:
  """`EXPR` of a one-line reference `def f(params): return EXPR`, else the full source."""
  ref = task.reference_solution
  if ref is None:
    return None
  m = re.fullmatch(r"def\s+(\w+)\(([^)]*)\):\s*return\s+(.+?)\s*", ref)
  if m and m.group(1) == task.entry_point:
    params = tuple(p.strip() for p in m.group(2).split(",") if p.strip())
    if params == task.param_names and "\n" not in m.group(3):
      return m.group(3)
  return ref


def _is_copy(example: task_lib.Example, others: Sequence[task_lib.Example]) -> bool:
  return any(literals.values_equal(example.args, o.args) for o in others)


def _is_trivial(example: task_lib.Example, min_len: int) -> bool:
  """True if a sequence argument is shorter than `min_len` (e.g. `[]` or `\"a\"`)."""
  return any(isinstance(a, (list, tuple, str)) and len(a) < min_len for a in example.args)


class _Guard:
  """Runs per-episode callables, turning exceptions into a default and an error count."""

  def __init__(self, name: str, counts: collections.Counter):
    self.name, self.counts, self.errors = name, counts, 0

  def __call__(self, fn: Callable[[], Any], default: Any) -> Any:
    try:
      return fn()
    except Exception:  # pylint: disable=broad-except
      logging.exception("workflow stage %s: exception in parser/reward", self.name)
      self.counts[self.name] += 1
      self.errors += 1
      return default


def _map(pool, programs: Sequence[Optional[sandbox.Program]], guard: _Guard
         ) -> list[Optional[sandbox.RunResult]]:
  """One pool call for the non-None programs; None results where there was no program or the
  pool failed (counted once per program)."""
  idx = [i for i, p in enumerate(programs) if p is not None]
  out: list[Optional[sandbox.RunResult]] = [None] * len(programs)
  if not idx:
    return out
  try:
    results = pool.map([programs[i] for i in idx])
    if len(results) != len(idx):
      raise RuntimeError(f"pool returned {len(results)} results for {len(idx)} programs")
  except Exception:  # pylint: disable=broad-except
    logging.exception("workflow stage %s: sandbox pool failed", guard.name)
    guard.counts[guard.name] += len(idx)
    guard.errors += len(idx)
    return out
  for i, r in zip(idx, results):
    out[i] = r
  return out


def drop_failing_public_examples(tasks: Sequence[task_lib.Task], pool
                                 ) -> list[task_lib.Task]:
  """Tasks without the public examples their own reference solution fails (one pool call).

  Docstring examples of real data sets are sometimes wrong (HumanEval/47's `median` example),
  which would make the code stage's reward punish correct code. Tasks without a reference
  solution or public examples are returned unchanged; so are all tasks if the pool fails.
  """
  programs = [sandbox.Program(t.reference_solution, t.entry_point,
                              io_tests=_io_tests(t.public_examples))
              if t.reference_solution is not None and t.public_examples else None
              for t in tasks]
  results = _map(pool, programs, _Guard("public_examples", collections.Counter()))
  out = []
  for t, r in zip(tasks, results):
    if r is None or len(r.passed) != len(t.public_examples):
      out.append(t)
    else:
      kept = tuple(e for e, ok in zip(t.public_examples, r.passed) if ok)
      out.append(t if len(kept) == len(t.public_examples)
                 else dataclasses.replace(t, public_examples=kept))
  return out


# -------------------------------------------------------------------------------------- stages


class Stage:
  """A stage: name, delimiters, opening renderer, parser and batched reward.

  Subclasses override `parse` (text -> value, raising `ParseError`), `apply` (record the
  parsed value on the episode), `score` (batched rewards; None where the stage does not
  apply) and `reference_output`.
  """

  kind: str = ""

  def __init__(self, name: str, config: WorkflowConfig):
    self.name = name
    self.config = config
    self.open_token, self.close_token = DELIMITERS[self.kind]

  def openings(self, episodes: Sequence[Episode], pool, guard: _Guard) -> list[str]:
    del pool, guard
    return [self.open_token for _ in episodes]

  def parse(self, body: str, episode: Episode) -> Any:
    raise NotImplementedError

  def apply(self, episode: Episode, parsed: Any) -> None:
    del episode, parsed

  def score(self, episodes: Sequence[Episode], parsed: Sequence[Any], pool,
            guard: _Guard) -> list[Optional[float]]:
    raise NotImplementedError

  def reference_output(self, episode: Episode) -> str:
    raise NotImplementedError


class HypothesisStage(Stage):
  """Predict the output on the probe input; reward 1 if it equals the reference output."""

  kind = "hypothesis"

  def openings(self, episodes, pool, guard):
    del pool, guard
    out = []
    for ep in episodes:
      probe = ep.task.probe
      out.append(("" if probe is None else "\n" + task_lib.format_args(probe) + task_lib.ARROW)
                 + self.open_token)
    return out

  def parse(self, body, episode):
    if len(body) > _MAX_OUTPUT_CHARS:
      raise ParseError("hypothesis too long")
    try:
      return task_lib.parse_value(body)
    except ValueError as e:
      raise ParseError(str(e)) from e

  def score(self, episodes, parsed, pool, guard):
    del pool
    out = []
    for ep, value in zip(episodes, parsed):
      if ep.task.probe is None:
        out.append(None)
      elif value is _UNPARSED:
        out.append(0.0)
      else:
        out.append(guard(lambda: float(literals.values_equal(value, ep.task.probe_expected)),
                         0.0))
    return out

  def reference_output(self, episode):
    task = episode.task
    return "" if task.probe is None else task_lib.format_value(task.probe_expected)


class CodeStage(Stage):
  """Write the function; reward = fraction of public examples passed."""

  kind = "code"

  def parse(self, body, episode):
    return parse_code(body, episode.task)

  def apply(self, episode, parsed):
    episode.code = parsed

  def score(self, episodes, parsed, pool, guard):
    return _public_scores(episodes, parsed, pool, guard, with_verified=False,
                          all_pass=self.config.reward_mode == ALL_PASS)

  def reference_output(self, episode):
    return _compact_reference(episode.task) or ""


def _public_scores(episodes, parsed, pool, guard, with_verified, all_pass=False):
  """Fraction of public examples (and verified own tests) that each episode's code passes
  (1/0 for all of them with `all_pass`)."""
  programs = []
  for ep, p in zip(episodes, parsed):
    tests = ep.task.public_examples + (ep.verified_tests if with_verified else ())
    if p is _UNPARSED or not tests or ep.code is None:
      programs.append(None)
    else:
      programs.append(guard(lambda ep=ep, tests=tests: sandbox.Program(
          ep.code, ep.task.entry_point, io_tests=_io_tests(tests)), None))
  results = _map(pool, programs, guard)
  out = []
  for ep, p, r in zip(episodes, parsed, results):
    n = len(ep.task.public_examples) + (len(ep.verified_tests) if with_verified else 0)
    if n == 0:
      out.append(None)
    elif p is _UNPARSED or r is None:
      out.append(0.0)
    else:
      out.append(guard(lambda r=r, n=n: (float(r.num_passed >= n) if all_pass else
                                         min(1.0, float(r.num_passed) / n)), 0.0))
  return out


class TestsStage(Stage):
  """Write k new tests; reward = fraction that are new and agree with the reference."""

  kind = "tests"

  def parse(self, body, episode):
    if len(body) > _MAX_OUTPUT_CHARS:
      raise ParseError("tests too long")
    lines = [l for l in body.split("\n") if l.strip()][:self.config.num_agent_tests]
    tests = []
    for line in lines:
      try:
        tests.append(task_lib.parse_example(line))
      except ValueError:
        tests.append(None)  # counts as a failed test
    if not any(t is not None for t in tests):
      raise ParseError("no ARGS->EXPECTED line")
    return tuple(tests)

  def apply(self, episode, parsed):
    episode.own_tests = tuple(t for t in parsed if t is not None)
    episode.verified_tests = ()

  def score(self, episodes, parsed, pool, guard):
    k = self.config.num_agent_tests
    candidates = []  # per episode: the tests worth checking against the reference
    programs = []
    for ep, tests in zip(episodes, parsed):
      fresh = []
      if tests is not _UNPARSED:
        for t in tests:
          if (t is not None and not _is_copy(t, ep.task.public_examples)
              and not _is_copy(t, fresh)
              and not _is_trivial(t, self.config.min_test_input_len)):
            fresh.append(t)
      candidates.append(fresh)
      ref = ep.task.reference_solution
      programs.append(guard(lambda ep=ep, ref=ref, fresh=fresh: sandbox.Program(
          ref, ep.task.entry_point, io_tests=_io_tests(fresh)), None)
                      if ref is not None and fresh else None)
    results = _map(pool, programs, guard)
    out = []
    for ep, fresh, r in zip(episodes, candidates, results):
      if ep.task.reference_solution is None:
        out.append(None)
        continue
      if r is None or not fresh:
        out.append(0.0)
        continue

      def agree(ep=ep, fresh=fresh, r=r):
        if len(r.passed) != len(fresh):
          raise RuntimeError(f"{len(r.passed)} results for {len(fresh)} tests")
        ep.verified_tests = tuple(t for t, ok in zip(fresh, r.passed) if ok)
        return len(ep.verified_tests) / k
      out.append(guard(agree, 0.0))
    return out

  def reference_output(self, episode):
    task = episode.task

    def key(e):
      # Prefer short tests whose input has at least two elements (an empty or one-element input
      # says little about most functions), then the shortest.
      first = e.args[0] if len(e.args) == 1 else None
      small = isinstance(first, (list, tuple, str)) and len(first) < 2
      return small, len(task_lib.format_example(e))

    chosen = []
    for ex in sorted(task.hidden_tests, key=key):
      if _is_trivial(ex, self.config.min_test_input_len):
        continue
      if not _is_copy(ex, task.public_examples) and not _is_copy(ex, chosen):
        chosen.append(ex)
      if len(chosen) == self.config.num_agent_tests:
        break
    return "\n".join(task_lib.format_example(e) for e in chosen)


class DebugStage(Stage):
  """See the code's results on public and own tests, then revise it or `keep` it."""

  kind = "debug"

  def openings(self, episodes, pool, guard):
    programs = []
    for ep in episodes:
      tests = ep.task.public_examples + ep.own_tests
      programs.append(guard(lambda ep=ep, tests=tests: sandbox.Program(
          ep.code, ep.task.entry_point, io_tests=_io_tests(tests)), None)
                      if ep.code is not None and tests else None)
    results = _map(pool, programs, guard)
    out = []
    for ep, prog, r in zip(episodes, programs, results):
      obs = guard(lambda ep=ep, prog=prog, r=r: self._observation(ep, prog, r), "error")
      out.append(OBS_OPEN + obs + OBS_CLOSE + self.open_token)
    return out

  def _observation(self, ep: Episode, program, result) -> str:
    if ep.code is None:
      return "no code"
    tests = ep.task.public_examples + ep.own_tests
    if not tests:
      return "no tests"
    if result is None:
      return "error"
    header = f"{result.num_passed}/{len(tests)}"
    verdict = getattr(result.verdict, "value", str(result.verdict))
    if result.verdict not in (sandbox.Verdict.PASSED, sandbox.Verdict.FAILED):
      header += f" {verdict}"
    return self._format(header, tests, result.passed, result.outputs, result.test_errors)

  def _format(self, header: str, tests, passed, outputs, errors) -> str:
    """`header`, then `args->expected got actual` for each failed test, cut to
    `max_obs_chars` (whole lines)."""
    lines = [header]
    pad = len(tests)
    outputs = tuple(outputs) + (None,) * (pad - len(outputs))
    errors = tuple(errors) + (None,) * (pad - len(errors))
    for t, ok, got, err in zip(tests, passed, outputs, errors):
      if ok:
        continue
      if err is not None:  # the call raised: show the exception's type
        shown = str(err).split(":", 1)[0].strip() or "error"
      else:
        shown = "error" if got is None else task_lib.format_value(got)
      lim = self.config.max_value_chars
      lines.append(f"{_short(task_lib.format_args(t.args), lim)}{task_lib.ARROW}"
                   f"{_short(task_lib.format_value(t.expected), lim)} got {_short(shown, lim)}")
    text = lines[0]
    for line in lines[1:]:
      if len(text) + 1 + len(line) > self.config.max_obs_chars:
        break
      text += "\n" + line
    return _sanitize(text[:self.config.max_obs_chars])

  def parse(self, body, episode):
    if body.strip() == KEEP:
      return KEEP
    return parse_code(body, episode.task)

  def apply(self, episode, parsed):
    if parsed != KEEP:
      episode.code = parsed

  def score(self, episodes, parsed, pool, guard):
    return _public_scores(episodes, parsed, pool, guard, with_verified=True,
                          all_pass=self.config.reward_mode == ALL_PASS)

  def reference_output(self, episode):
    if self.config.reference_debug == KEEP:
      return KEEP
    return _compact_reference(episode.task) or KEEP

  def reference_observation(self, episode: Episode, attempt=None) -> str:
    """The observation of a reference episode.

    Args:
      episode: the reference episode so far.
      attempt: None when the episode's code is the reference (it passes everything: all
        public and own tests); else the trusted callable of a wrong first attempt (a
        `synthetic.near_miss` program), run in process on the tests to show its failures.
    """
    tests = episode.task.public_examples + episode.own_tests
    n = len(tests)
    if attempt is None:
      return f"{n}/{n}" if n else "no tests"
    outputs = [attempt(*t.args) for t in tests]
    passed = [literals.values_equal(o, t.expected) for o, t in zip(outputs, tests)]
    return self._format(f"{sum(passed)}/{n}", tests, passed, outputs, ())


_STAGE_CLASSES = {c.kind: c for c in (HypothesisStage, CodeStage, TestsStage, DebugStage)}
_UNPARSED = object()


# ------------------------------------------------------------------------------------ workflow


class Workflow:
  """Runs batches of episodes through the configured stages; see the module docstring.

  Attributes:
    config: the `WorkflowConfig`.
    stages: the expanded stage list (`debug` -> `debug_1..R`).
    error_counts: `Counter` of parser/reward/sandbox exceptions by stage name (and `final`).
  """

  def __init__(self, config: WorkflowConfig = WorkflowConfig(), pool=None):
    """Builds the stage list.

    Args:
      config: workflow options.
      pool: a `sandbox.SandboxPool` (anything with `map(programs) -> list[RunResult]`); may
        be None only for `reference_segments`.
    """
    if not isinstance(config, WorkflowConfig):
      raise ValueError(f"config must be a WorkflowConfig, got {type(config).__name__}")
    self.config = config
    self.pool = pool
    self.stages: tuple[Stage, ...] = tuple(self._expand(config))
    self.error_counts: collections.Counter = collections.Counter()

  @staticmethod
  def _expand(config):
    for kind in config.stages:
      if kind == "debug":
        for r in range(config.max_debug_rounds):
          yield DebugStage(f"debug_{r + 1}", config)
      else:
        yield _STAGE_CLASSES[kind](kind, config)

  @property
  def stage_names(self) -> tuple[str, ...]:
    return tuple(s.name for s in self.stages)

  @property
  def num_stages(self) -> int:
    return len(self.stages)

  def stop_tokens(self) -> tuple[str, ...]:
    """Closing delimiters of all stages (the sampler's stop tokens)."""
    return tuple(sorted({s.close_token for s in self.stages}))

  def pop_error_counts(self) -> dict[str, int]:
    """Returns the error counts since the last call and resets them."""
    counts = dict(self.error_counts)
    self.error_counts.clear()
    return counts

  # ----------------------------------------------------------------------------- batched API

  def start(self, tasks: Sequence[task_lib.Task]) -> list[Episode]:
    """Fresh episodes, one per task (repeat a task G times for a group)."""
    for i, t in enumerate(tasks):
      if not isinstance(t, task_lib.Task):
        raise ValueError(f"tasks[{i}] must be a Task, got {type(t).__name__}")
    return [Episode(task=t) for t in tasks]

  def _check_batch(self, episodes: Sequence[Episode], pending: bool) -> int:
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

  def open_stage(self, episodes: Sequence[Episode]) -> list[str]:
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
    guard = _Guard(stage.name, self.error_counts)
    openings = stage.openings(episodes, self.pool, guard)
    if k == 0:
      openings = [ep.task.prompt + o for ep, o in zip(episodes, openings)]
    for ep, o in zip(episodes, openings):
      ep.pending_opening = o
    return openings

  def close_stage(self, episodes: Sequence[Episode], outputs: Sequence[str]) -> StageResult:
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
    guard = _Guard(stage.name, self.error_counts)
    parsed = []
    for ep, out in zip(episodes, outputs):
      parsed.append(guard(lambda ep=ep, out=out: self._parse(stage, ep, out), _UNPARSED))
    for ep, p in zip(episodes, parsed):
      if p is not _UNPARSED:
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
    was_parsed = np.array([p is not _UNPARSED for p in parsed], bool)
    for i, ep in enumerate(episodes):
      ep.segments.append(Segment(stage.name, ep.pending_opening, str(outputs[i])))
      ep.pending_opening = None
      ep.stage_rewards.append(float(rewards[i]))
      ep.stage_valid.append(bool(valid[i]))
      ep.stage_parsed.append(bool(was_parsed[i]))
    return StageResult(stage.name, rewards, valid, was_parsed, guard.errors)

  @staticmethod
  def _parse(stage: Stage, ep: Episode, output: Any) -> Any:
    if not isinstance(output, str):
      return _UNPARSED
    pos = output.find(stage.close_token)
    if pos < 0:
      return _UNPARSED  # unterminated: the sampler ran out of tokens
    try:
      return stage.parse(output[:pos], ep)
    except ParseError:
      return _UNPARSED

  def finish(self, episodes: Sequence[Episode]) -> FinalResult:
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
    guard = _Guard(FINAL, self.error_counts)
    programs = [None if ep.code is None else guard(lambda ep=ep: _hidden_program(ep.task, ep.code),
                                                   None) for ep in episodes]
    results = _map(self.pool, programs, guard)
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
          return f if self.config.reward_mode == FRACTION else float(f >= 1.0)
        rewards.append(guard(frac, 0.0))
        passed.append(int(r.num_passed))
        total.append(int(r.num_tests))
      ep.final_reward = rewards[-1]
    return FinalResult(np.array(rewards, np.float32), np.array(passed, np.int32),
                       np.array(total, np.int32), guard.errors)

  def rollout(self, tasks: Sequence[task_lib.Task],
              generate: Callable[[str, list[str]], Sequence[str]]
              ) -> tuple[list[Episode], list[StageResult], FinalResult]:
    """All stages for a batch: `generate(stage_name, contexts) -> outputs` per stage."""
    episodes = self.start(tasks)
    results = []
    for stage in self.stages:
      self.open_stage(episodes)
      outputs = generate(stage.name, [ep.context for ep in episodes])
      results.append(self.close_stage(episodes, outputs))
    return episodes, results, self.finish(episodes)

  # ------------------------------------------------------------------------------ references

  def _reference_near_miss(self, task: task_lib.Task):
    """The near miss a reference episode of `task` starts from, or None (see
    `WorkflowConfig.reference_fix_fraction`)."""
    fraction = self.config.reference_fix_fraction
    if fraction <= 0 or not any(isinstance(s, DebugStage) for s in self.stages):
      return None
    draw = int.from_bytes(hashlib.sha256(f"fix:{task.task_id}".encode()).digest()[:8], "big")
    if draw / 2.0**64 >= fraction:
      return None
    return synthetic.near_miss(task)

  def reference_outputs(self, task: task_lib.Task) -> list[str]:
    """The ideal output of every stage (closing delimiter included)."""
    return [s.output for s in self.reference_segments(task)]

  def reference_segments(self, task: task_lib.Task) -> list[Segment]:
    """The ideal episode for `task`, without running anything (for the supervised warm start).

    Hypothesis: the reference output on the probe; code: the reference solution (as an
    expression when it is a one-line `return`); tests: the k shortest hidden tests that are
    not public inputs; debug: `keep` (or the code again). Observations assume that the
    reference passes its public examples (true of synthetic tasks by construction; checked
    against a real run by the tests). With `reference_fix_fraction`, a drawn share of episodes
    writes a near miss as its code, shows its failures (run in process: it is the task
    generator's own program) in the first debug stage, and writes the reference there.

    Raises:
      ValueError: if the task has no reference solution.
    """
    if task.reference_solution is None:
      raise ValueError(f"task {task.task_id!r} has no reference_solution")
    ep = Episode(task=task)
    miss = self._reference_near_miss(task)
    fixed = False
    for k, stage in enumerate(self.stages):
      if isinstance(stage, DebugStage):
        attempt = miss if (miss is not None and not fixed) else None
        opening = (OBS_OPEN + stage.reference_observation(ep, attempt) + OBS_CLOSE
                   + stage.open_token)
      else:
        opening = stage.openings([ep], None, _Guard(stage.name, collections.Counter()))[0]
      if k == 0:
        opening = task.prompt + opening
      if miss is not None and isinstance(stage, CodeStage):
        body = miss.expression(task.param_names[0])  # the failing first attempt
      elif miss is not None and isinstance(stage, DebugStage) and not fixed:
        body, fixed = _compact_reference(task), True  # the fix
      else:
        body = stage.reference_output(ep)
      try:
        parsed = stage.parse(body, ep)
        stage.apply(ep, parsed)
        if isinstance(stage, TestsStage):
          ep.verified_tests = ep.own_tests
      except ParseError:
        pass
      ep.segments.append(Segment(stage.name, opening, body + stage.close_token))
    return ep.segments
