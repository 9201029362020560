"""Workflow stages: hypothesis -> code -> tests -> debug, each a parser and a batched reward.

A `Stage` says what the environment shows before the model's output (`turns`, rendered by the
workflow's prompt format), parses the output (`parse`, raising `episodes.ParseError`), records
it on the episode (`apply`), scores a batch (`score`, one sandbox pool call) and knows its
ideal output (`reference_output`). Stage classes are registered by kind in `STAGES` (the config's
`workflow.stages` vocabulary); `Stage.expand` builds a kind's stages (`debug` -> `debug_1..R`).
Code outputs are read by `code_parsing` (`parse_code`, `compact_reference`).

Stage rewards (the design doc's stage rewards), each in [0, 1]:
  - hypothesis: 1 if the predicted value equals the reference output on the probe;
  - code: fraction of the public examples the code passes (run in the sandbox);
  - tests: fraction of the k requested tests that parse, are not copies of a public example's
    input (nor of an earlier own test), and agree with the reference solution (the reference
    runs on the agent's inputs in the sandbox; the agent's expected values are compared in the
    trusted parent);
  - debug: fraction of public examples and verified own tests passed by the revised code.
With `reward_mode='all_pass'` the code-running rewards are 1 if every test passes, else 0.

A `stdio` task (`Task.kind`, competitive programming) runs through the same stages: its code is
a whole program reading stdin (`parse_code`), its examples and the agent's tests are
`'INPUT'->'OUTPUT'` lines (one string argument, a string output), and every sandbox job is
built by `execution.program` (the stdin/stdout judge, under the problem's limits). Its
hypothesis stage has no reward (the task has no probe: `valid=False`).
"""

from typing import Any, Optional, Sequence

from agentic_grpo import registry
from agentic_grpo import sandbox
from agentic_grpo.agent import code_parsing
from agentic_grpo.agent import episodes as episodes_lib
from agentic_grpo.agent import prompts
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import literals
from agentic_grpo.tasks import task as task_lib

STAGES: registry.Registry[type["Stage"]] = registry.Registry("workflow stage")

KEEP = "keep"
FRACTION = "fraction"
ALL_PASS = "all_pass"
REWARD_MODES = (FRACTION, ALL_PASS)
REFERENCE_DEBUG = (KEEP, "restate")
UNPARSED = object()  # the parsed value of an unparseable output
def _short(value_text: str, limit: int) -> str:
  return value_text if len(value_text) <= limit else value_text[:limit - 3] + "..."


def _is_copy(example: task_lib.Example, others: Sequence[task_lib.Example]) -> bool:
  return any(literals.values_equal(example.args, o.args) for o in others)


def is_trivial(example: task_lib.Example, min_len: int) -> bool:
  """True if a sequence argument is shorter than `min_len` (e.g. `[]` or `\"a\"`)."""
  return any(isinstance(a, (list, tuple, str)) and len(a) < min_len for a in example.args)


class Stage:
  """A stage: name, delimiters, environment turn, parser and batched reward.

  Subclasses override `parse` (text -> value, raising `episodes.ParseError`), `apply` (record
  the parsed value on the episode), `score` (batched rewards; None where the stage does not
  apply) and `reference_output`.

  Attributes:
    kind: the registered stage kind (`STAGES`).
    name: the stage's name in the episode (the kind, or `debug_<r>` for debug round r).
    config: the `workflow_config.WorkflowConfig` (not imported: it imports the stages).
    prompt_format: the workflow's `prompts.PromptFormat`.
    open_token, close_token: the format's delimiters of this stage's output.
  """

  kind: str = ""

  def __init__(self, name: str, config: Any, prompt_format: prompts.PromptFormat):
    self.name = name
    self.config = config
    self.prompt_format = prompt_format
    self.open_token, self.close_token = prompt_format.delimiters(self.kind)

  @classmethod
  def expand(cls, config: Any, prompt_format: prompts.PromptFormat) -> list["Stage"]:
    """The stages this kind contributes to a workflow (one, named by the kind)."""
    return [cls(cls.kind, config, prompt_format)]

  def turns(self, episodes: Sequence[episodes_lib.Episode], pool, guard: execution.Guard
            ) -> list[prompts.Turn]:
    """What the environment says before this stage's output, per episode (no markup)."""
    del pool, guard
    return [prompts.Turn() for _ in episodes]

  def parse(self, body: str, episode: episodes_lib.Episode) -> Any:
    raise NotImplementedError

  def apply(self, episode: episodes_lib.Episode, parsed: Any) -> None:
    del episode, parsed

  def score(self, episodes: Sequence[episodes_lib.Episode], parsed: Sequence[Any], pool,
            guard: execution.Guard) -> list[Optional[float]]:
    raise NotImplementedError

  def reference_output(self, episode: episodes_lib.Episode) -> str:
    raise NotImplementedError


@STAGES.register("hypothesis")
class HypothesisStage(Stage):
  """Predict the output on the probe input; reward 1 if it equals the reference output."""

  kind = "hypothesis"

  def turns(self, episodes, pool, guard):
    del pool, guard
    out = []
    for ep in episodes:
      probe = ep.task.probe
      lead = "" if probe is None else "\n" + task_lib.format_args(probe) + task_lib.ARROW
      out.append(prompts.Turn(lead=lead))
    return out

  def parse(self, body, episode):
    if len(body) > code_parsing.MAX_OUTPUT_CHARS:
      raise episodes_lib.ParseError("hypothesis too long")
    try:
      return task_lib.parse_value(body)
    except ValueError as e:
      raise episodes_lib.ParseError(str(e)) from e

  def score(self, episodes, parsed, pool, guard):
    del pool
    out = []
    for ep, value in zip(episodes, parsed):
      if ep.task.probe is None:
        out.append(None)
      elif value is UNPARSED:
        out.append(0.0)
      else:
        out.append(guard(lambda: float(literals.values_equal(value, ep.task.probe_expected)),
                         0.0))
    return out

  def reference_output(self, episode):
    task = episode.task
    return "" if task.probe is None else task_lib.format_value(task.probe_expected)


@STAGES.register("code")
class CodeStage(Stage):
  """Write the function; reward = fraction of public examples passed."""

  kind = "code"

  def parse(self, body, episode):
    return code_parsing.parse_code(body, episode.task)

  def apply(self, episode, parsed):
    episode.code = parsed

  def score(self, episodes, parsed, pool, guard):
    return _public_scores(episodes, parsed, pool, guard, with_verified=False,
                          all_pass=self.config.reward_mode == ALL_PASS)

  def reference_output(self, episode):
    return code_parsing.compact_reference(episode.task) or ""


def _public_scores(episodes, parsed, pool, guard, with_verified, all_pass=False):
  """Fraction of public examples (and verified own tests) that each episode's code passes
  (1/0 for all of them with `all_pass`)."""
  programs = []
  for ep, p in zip(episodes, parsed):
    tests = ep.task.public_examples + (ep.verified_tests if with_verified else ())
    if p is UNPARSED or not tests or ep.code is None:
      programs.append(None)
    else:
      programs.append(guard(lambda ep=ep, tests=tests: execution.program(
          ep.task, ep.code, tests, pool, all_or_nothing=all_pass), None))
  results = execution.run_programs(pool, programs, guard)
  out = []
  for ep, p, r in zip(episodes, parsed, results):
    n = len(ep.task.public_examples) + (len(ep.verified_tests) if with_verified else 0)
    if n == 0:
      out.append(None)
    elif p is UNPARSED or r is None:
      out.append(0.0)
    else:
      out.append(guard(lambda r=r, n=n: (float(r.num_passed >= n) if all_pass else
                                         min(1.0, float(r.num_passed) / n)), 0.0))
  return out
@STAGES.register("tests")
class TestsStage(Stage):
  """Write k new tests; reward = fraction that are new and agree with the reference."""

  kind = "tests"

  def parse(self, body, episode):
    if len(body) > code_parsing.MAX_OUTPUT_CHARS:
      raise episodes_lib.ParseError("tests too long")
    lines = [l for l in body.split("\n") if l.strip()][:self.config.num_agent_tests]
    tests = []
    for line in lines:
      try:
        tests.append(task_lib.parse_example(line))
      except ValueError:
        tests.append(None)  # counts as a failed test
    if not any(t is not None for t in tests):
      raise episodes_lib.ParseError("no ARGS->EXPECTED line")
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
      if tests is not UNPARSED:
        for t in tests:
          if (t is not None and not _is_copy(t, ep.task.public_examples)
              and not _is_copy(t, fresh)
              and not is_trivial(t, self.config.min_test_input_len)):
            fresh.append(t)
      candidates.append(fresh)
      ref = ep.task.reference_solution
      programs.append(guard(lambda ep=ep, ref=ref, fresh=fresh: execution.program(
          ep.task, ref, fresh, pool), None)
                      if ref is not None and fresh else None)
    results = execution.run_programs(pool, programs, guard)
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
      if is_trivial(ex, self.config.min_test_input_len):
        continue
      if not _is_copy(ex, task.public_examples) and not _is_copy(ex, chosen):
        chosen.append(ex)
      if len(chosen) == self.config.num_agent_tests:
        break
    return "\n".join(task_lib.format_example(e) for e in chosen)


@STAGES.register("debug")
class DebugStage(Stage):
  """See the code's results on public and own tests, then revise it or `keep` it."""

  kind = "debug"

  @classmethod
  def expand(cls, config, prompt_format):
    """`max_debug_rounds` stages named `debug_1`, `debug_2`, ... (none for 0 rounds)."""
    return [cls(f"debug_{r + 1}", config, prompt_format)
            for r in range(config.max_debug_rounds)]

  def turns(self, episodes, pool, guard):
    programs = []
    for ep in episodes:
      tests = ep.task.public_examples + ep.own_tests
      programs.append(guard(lambda ep=ep, tests=tests: execution.program(
          ep.task, ep.code, tests, pool), None)
                      if ep.code is not None and tests else None)
    results = execution.run_programs(pool, programs, guard)
    out = []
    for ep, prog, r in zip(episodes, programs, results):
      obs = guard(lambda ep=ep, prog=prog, r=r: self._observation(ep, prog, r), "error")
      out.append(prompts.Turn(observation=obs))
    return out

  def _observation(self, ep: episodes_lib.Episode, program, result) -> str:
    if ep.code is None:
      return "no code"
    tests = ep.task.public_examples + ep.own_tests
    if not tests:
      return "no tests"
    if result is None:
      return "error"
    header = f"{result.num_passed}/{len(tests)}"
    verdict = getattr(result.verdict, "value", str(result.verdict))
    if result.verdict not in (sandbox.Verdict.PASSED, sandbox.Verdict.FAILED,
                              sandbox.StdioVerdict.PASSED, sandbox.StdioVerdict.WRONG_ANSWER):
      header += f" {verdict}"
    outputs, errors = execution.failure_details(result)
    return self._format(header, tests, result.passed, outputs, errors)

  def _format(self, header: str, tests, passed, outputs, errors) -> str:
    """`header`, then `args->expected got actual` for each failed test, cut to
    `max_obs_chars` (whole lines). Tag-like text is escaped by the prompt format."""
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
    return text[:self.config.max_obs_chars]

  def parse(self, body, episode):
    if body.strip() == KEEP:
      return KEEP
    return code_parsing.parse_code(body, episode.task)

  def apply(self, episode, parsed):
    if parsed != KEEP:
      episode.code = parsed

  def score(self, episodes, parsed, pool, guard):
    return _public_scores(episodes, parsed, pool, guard, with_verified=True,
                          all_pass=self.config.reward_mode == ALL_PASS)

  def reference_output(self, episode):
    if self.config.reference_debug == KEEP:
      return KEEP
    return code_parsing.compact_reference(episode.task) or KEEP

  def reference_observation(self, episode: episodes_lib.Episode, attempt=None) -> str:
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


