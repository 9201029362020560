"""Competitive-programming problems judged on stdin/stdout, from JSONL, as `stdio` `Task`s.

A row is one problem in one of four common layouts (`LAYOUTS`), chosen by `layout`, or
detected from the row's keys with `auto` (`detect_layout`). Each becomes a `Task` of kind
`stdio` (`task.STDIO`): the agent writes a whole program that reads the input on stdin and
prints the answer; every test is an `Example((INPUT,), OUTPUT)` with strings, judged by
`sandbox.stdio` (token-wise, whitespace normalised) under the problem's limits, with the
output comparison of the layout's own harness (`LAYOUT_COMPARISON`, below).

| Task field          | codecontests               | apps                     | taco                          | livecodebench                  |
|---------------------|----------------------------|--------------------------|-------------------------------|--------------------------------|
| task_id             | `codecontests/{name}`      | `apps/{problem_id}`      | `taco/{name}` (else the row)  | `livecodebench/{question_id}`  |
| prompt (statement)  | `description`              | `question`               | `question`                    | `question_content`             |
| public_examples     | `public_tests`             | first of `input_output`  | first of `input_output`       | `public_test_cases`            |
| hidden_tests        | `private_tests` + `generated_tests` (else the public) | all of `input_output` | all of `input_output` | `private_test_cases` (else the public) |
| stdio.time_seconds  | `time_limit` {seconds, nanos}: s | -                  | `time_limit` ("2 seconds"): s | -                              |
| stdio.memory_bytes  | `memory_limit_bytes`: bytes | -                       | `memory_limit` ("256 megabytes"): MB | -                       |
| reference_solution  | first Python 3 of `solutions` {language: 3, solution} | first of `solutions` (JSON list) | first of `solutions` (JSON list) | -  |
| difficulty          | `difficulty` (int)         | `difficulty` (introductory/interview/competition: 0/1/2) | `difficulty` (EASY...: 0...) | `difficulty` (easy/medium/hard: 0/1/2) |
| output comparison   | numbers within 1e-5 absolute, case ignored | numbers within rel 1e-5 + abs 1e-8 | as APPS  | numbers by exact value       |

Tests: CodeContests' `{input: [...], output: [...]}` objects; APPS/TACO's `input_output`, a JSON
string (or object) `{"inputs": [...], "outputs": [...]}` whose items are strings or lists of
lines; LiveCodeBench's `public_test_cases`/`private_test_cases`, JSON strings (or lists) of
`{input, output, testtype}` (compressed private tests must be decoded to JSON beforehand).

Limits and their units. The data sets store: CodeContests `time_limit` as {seconds, nanos}
and `memory_limit_bytes` in bytes; TACO `time_limit` and `memory_limit` as strings ("1
second", "2.5 seconds", "256 megabytes", "None" where unknown); APPS and LiveCodeBench no
limits. Every limit may also be a number or a string `NUMBER [UNIT]`:

* time units (any case): `s`, `sec`, `second(s)`; `ms`, `msec`, `millisecond(s)`. A number
  without a unit is seconds, but an integer >= `MS_FROM` (100) is milliseconds: no problem
  asks 100 s (`task.MAX_TIME_SECONDS` is 60), and judges counting in ms write `2000`.
* memory units (binary multiples, any case): `b`, `byte(s)`; `k`, `kb`, `kib`, `kilobyte(s)`;
  `m`, `mb`, `mib`, `megabyte(s)`; `g`, `gb`, `gib`, `gigabyte(s)`. A number without a unit is
  in the layout's unit: bytes for `memory_limit_bytes`, MB for TACO's `memory_limit`.

So "2000 ms", "2000 milliseconds", "1.5 s" and 2000 are all read; {seconds: 100} stays 100 s
(over the cap). "None", "null", "n/a", "-", "" and 0 mean no limit (the run's default).

Call-based problems (APPS/TACO `fn_name`, LiveCodeBench `testtype: functional`) are not
stdin/stdout problems and are rejected. Limits a row does not give (or gives as 0/null) are
the run's `config.sandbox` limits at judging time; a memory limit under 64 MiB is raised to
64 MiB (what the interpreter needs); a limit over `task.MAX_TIME_SECONDS` /
`task.MAX_MEMORY_BYTES` is a malformed row.

Output comparison. The rows carry no tolerance field, so each layout is judged as its own
harness judges (`LAYOUT_COMPARISON`); tokens are whitespace-separated everywhere, and two
integer tokens must always be equal (a tolerance is for real-valued answers):

* codecontests: the CodeContests judge (`OutputsMatch` of its execution service): tokens
  compared in lower case, and two number tokens, not both integers, match within an absolute
  1e-5 (`abs_tol=1e-5`, `ignore_case`): `1.5000000000` is `1.5`, `YES` is `yes`.
* apps, taco: the APPS harness (`testing_util.run_test`, which TACO's reuses): numbers match
  under `numpy.allclose`'s default tolerance, about a relative 1e-5 plus an absolute 1e-8
  (`rel_tol=1e-5`, `abs_tol=1e-8`). Its looser fallbacks (comparing sets of tokens, ignoring
  their order; numbers rounded to 3 decimals) are not reproduced: they accept wrong answers.
* livecodebench: its harness compares each line's tokens as `Decimal`s: numbers by exact value
  (`numbers_by_value`: `1.50` is `1.5`), no tolerance.

`task.float_tolerance` >= 0 (`load_stdio(float_tolerance=)`) replaces the layout's tolerance
with that absolute and relative tolerance for every row (0: number tokens byte-exact unless the
layout compares them by value); a row's own tolerance fields win over both: `abs_tol`,
`rel_tol`, or `float_tolerance` (both), numbers >= 0 (a missing one of the two is 0).

The prompt is the statement, then the public tests as a statement shows them, plain text
(`format_sample`: "Example 1", "Input:", its lines, "Output:", its lines), not Python literals;
the tests stage's `'INPUT'->'OUTPUT'` format is its own instructions' to state
(`agent.chat_format`). A `stdio` task has no probe: its hypothesis stage has no reward.

Malformed rows raise `loading.RowError` naming the file, row and field: no tests, a test that
does not parse (not strings, unequal input/output counts, bad JSON, not UTF-8 encodable), an
expected output over the judge's output limit (`MAX_EXPECTED_BYTES`), tests that all expect an
empty output (a program printing nothing would pass), a limit out of range, a call-based
problem.
`load_stdio` skips and counts them (or raises with `on_error="raise"`), and optionally drops
problems whose reference solution fails its own tests (`check`).
"""

import json
import math
import re
from typing import Any, Callable, Optional, Sequence

from agentic_grpo.tasks import loading
from agentic_grpo.tasks import task as task_lib

AUTO = "auto"
LAYOUTS = ("codecontests", "apps", "taco", "livecodebench")
STDIO_LAYOUTS = (AUTO,) + LAYOUTS
# The judge's default output limit (`sandbox.StdioProgram.output_bytes`): a longer expected
# output can never be matched.
MAX_EXPECTED_BYTES = 2**20
MIN_MEMORY_BYTES = 64 * 2**20
_PYTHON3 = 3  # CodeContests' `solutions.language` code of Python 3
_DIFFICULTY = {"introductory": 0, "interview": 1, "competition": 2, "easy": 0, "medium": 1,
               "medium_hard": 2, "hard": 2, "very_hard": 3}
_LIMIT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*$", re.I)
# Unit words (lower case) -> base units: seconds, bytes.
TIME_UNITS = {**dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
              **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds"), 1e-3)}
MEMORY_UNITS = {**dict.fromkeys(("b", "byte", "bytes"), 1),
                **dict.fromkeys(("k", "kb", "kib", "kilobyte", "kilobytes"), 2**10),
                **dict.fromkeys(("m", "mb", "mib", "megabyte", "megabytes"), 2**20),
                **dict.fromkeys(("g", "gb", "gib", "gigabyte", "gigabytes"), 2**30)}
# A bare integer time limit at least this large is milliseconds: no problem asks 100 s or more
# (`task.MAX_TIME_SECONDS`), and judges that count in ms write 1000, 2000, ...
MS_FROM = 100
_ABSENT = ("", "none", "null", "n/a", "-")
# Each layout's output comparison, as its own harness judges (module docstring): `StdioSpec`
# fields `abs_tol`, `rel_tol`, `ignore_case`, `numbers_by_value`.
LAYOUT_COMPARISON: dict[str, dict[str, Any]] = {
    "codecontests": dict(abs_tol=1e-5, rel_tol=0.0, ignore_case=True, numbers_by_value=False),
    "apps": dict(abs_tol=1e-8, rel_tol=1e-5, ignore_case=False, numbers_by_value=False),
    "taco": dict(abs_tol=1e-8, rel_tol=1e-5, ignore_case=False, numbers_by_value=False),
    "livecodebench": dict(abs_tol=0.0, rel_tol=0.0, ignore_case=False, numbers_by_value=True),
}
_TOLERANCE_FIELDS = ("abs_tol", "rel_tol", "float_tolerance")


def detect_layout(row: dict) -> Optional[str]:
  """The layout of a row from its keys (see the module's table), or None."""
  if "public_tests" in row or "private_tests" in row:
    return "codecontests"
  if "public_test_cases" in row or "question_content" in row:
    return "livecodebench"
  if "input_output" in row:
    taco_keys = ("time_limit", "memory_limit", "skill_types", "raw_tags", "tags")
    return "taco" if any(k in row for k in taco_keys) else "apps"
  return None


class _Row:
  """One row being converted: raises `RowError`s naming its file, row and a field."""

  def __init__(self, d: dict, row: int, path: str):
    self.d, self.row, self.path = d, row, path

  def error(self, field: Optional[str], message: str) -> loading.RowError:
    return loading.RowError(self.path, self.row, field, message)

  def json_field(self, field: str) -> Any:
    """`d[field]`, decoded when it is a JSON string (None if absent, null or empty)."""
    value = self.d.get(field)
    if isinstance(value, str):
      if not value.strip():
        return None
      try:
        return json.loads(value)
      except (ValueError, RecursionError) as e:
        raise self.error(field, f"not JSON ({type(e).__name__}: "
                                f"{loading.short_repr(str(e), 60)})") from e
    return value

  def text(self, value: Any, field: str, i: int, what: str, lines_end: bool) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
      value = "\n".join(value) + ("\n" if lines_end and value else "")
    if not isinstance(value, str):
      raise self.error(field, f"test {i}: {what} is not a str, got {loading.short_repr(value)}")
    try:
      size = len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
      raise self.error(field, f"test {i}: {what} is not UTF-8 (a lone surrogate)") from e
    if what == "output" and size > MAX_EXPECTED_BYTES:
      raise self.error(field, f"test {i}: expected output of {size} bytes is over the judge's "
                              f"output limit of {MAX_EXPECTED_BYTES}")
    return value

  def pairs(self, field: str, inputs: Any, outputs: Any) -> list[task_lib.Example]:
    if not isinstance(inputs, list) or not isinstance(outputs, list):
      raise self.error(field, "expected lists of inputs and outputs")
    if len(inputs) != len(outputs):
      raise self.error(field, f"{len(inputs)} inputs but {len(outputs)} outputs")
    return [task_lib.Example((self.text(a, field, i, "input", True),),
                             self.text(b, field, i, "output", False))
            for i, (a, b) in enumerate(zip(inputs, outputs))]

  def io_object(self, field: str, value: Any) -> list[task_lib.Example]:
    """CodeContests' `{input: [...], output: [...]}` (None or absent: no tests)."""
    if value is None:
      return []
    if not isinstance(value, dict):
      raise self.error(field, f"expected an object, got {loading.short_repr(value)}")
    return self.pairs(field, value.get("input", []), value.get("output", []))

  def case_list(self, field: str) -> list[task_lib.Example]:
    """LiveCodeBench's list of `{input, output, testtype}` (a JSON string or a list)."""
    cases = self.json_field(field)
    if cases is None:
      return []
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
      raise self.error(field, "expected a list of {input, output} objects (compressed private "
                              "tests must be decoded to JSON first)")
    if any(c.get("testtype", "stdin") != "stdin" for c in cases):
      raise self.error(field, "a functional (call-based) test: not a stdin/stdout problem")
    return self.pairs(field, [c.get("input") for c in cases], [c.get("output") for c in cases])

  def input_output(self) -> list[task_lib.Example]:
    """APPS/TACO's `input_output` `{"inputs": [...], "outputs": [...]}`."""
    value = self.json_field("input_output")
    if not isinstance(value, dict):
      raise self.error("input_output", f"expected an object, got {loading.short_repr(value)}")
    if value.get("fn_name"):
      raise self.error("input_output", "a call-based problem (fn_name): not stdin/stdout")
    return self.pairs("input_output", value.get("inputs", []), value.get("outputs", []))

  def first_solution(self, field: str) -> Optional[str]:
    """The first of a JSON list (string or list) of solutions, or None."""
    sols = self.json_field(field)
    if sols is None or sols == []:
      return None
    if not isinstance(sols, list) or not all(isinstance(s, str) for s in sols):
      raise self.error(field, "expected a list of source strings")
    return sols[0]

  def number(self, field: str, value: Any, units: dict[str, float], bare: float, most: float,
             ms_from: Optional[float] = None) -> Optional[float]:
    """A limit in base units (seconds, bytes), None when absent or 0; at most `most`.

    `value` is a number or a string `NUMBER [UNIT]` (a word of `units`, any case). A number
    without a unit is in `bare` base units, except, with `ms_from`, an integer >= `ms_from`,
    which is in milliseconds (time limits). The strings of `_ABSENT` ("None", ...) are absent.
    """
    if value is None or value == 0 or (isinstance(value, str)
                                       and value.strip().lower() in _ABSENT):
      return None
    scale = bare
    if isinstance(value, str):
      m = _LIMIT_RE.match(value)
      unit = m.group(2).lower() if m is not None else None
      if m is None or (unit and unit not in units):
        raise self.error(field, f"cannot read a limit from {loading.short_repr(value)} (units: "
                                f"{', '.join(sorted(units))})")
      value = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
      scale = units[unit] if unit else bare
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
        math.isfinite(value) and value > 0):
      raise self.error(field, f"expected a positive number, got {loading.short_repr(value)}")
    if scale == bare and ms_from is not None and float(value).is_integer() and value >= ms_from:
      scale = 1e-3  # a bare integer this large is milliseconds
    if float(value) * scale > most:
      raise self.error(field, f"limit {loading.short_repr(value)} is over the largest a problem "
                              f"may ask, {most / scale:.10g} (task.MAX_*, in the row's unit)")
    return float(value) * scale


def _memory(value: Optional[float]) -> Optional[int]:
  return None if value is None else max(MIN_MEMORY_BYTES, int(value))


def _codecontests(r: _Row) -> dict:
  d = r.d
  public = r.io_object("public_tests", d.get("public_tests"))
  hidden = (r.io_object("private_tests", d.get("private_tests"))
            + r.io_object("generated_tests", d.get("generated_tests")))
  limit, ms_from = d.get("time_limit"), MS_FROM
  if isinstance(limit, dict):  # explicitly seconds: never milliseconds
    ms_from = None
    seconds = limit.get("seconds") or 0
    nanos = limit.get("nanos") or 0
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (seconds, nanos)):
      raise r.error("time_limit", f"expected numeric seconds and nanos, got {limit!r:.80}")
    limit = seconds + nanos * 1e-9
  sols, reference = d.get("solutions"), None
  if isinstance(sols, dict) and isinstance(sols.get("solution"), list):
    langs = sols.get("language") or []
    reference = next((s for l, s in zip(langs, sols["solution"])
                      if l == _PYTHON3 and isinstance(s, str)), None)
  return dict(name=loading.require(d, "name", str, r.path, r.row),
              statement=loading.require(d, "description", str, r.path, r.row),
              public=public, hidden=hidden, reference=reference,
              time=r.number("time_limit", limit, TIME_UNITS, 1.0, task_lib.MAX_TIME_SECONDS,
                            ms_from=ms_from),
              memory=_memory(r.number("memory_limit_bytes", d.get("memory_limit_bytes"),
                                      MEMORY_UNITS, 1, task_lib.MAX_MEMORY_BYTES)),
              test_field="public_tests")


def _apps_like(r: _Row, layout: str) -> dict:
  d = r.d
  tests = r.input_output()
  ident = d.get("problem_id") if layout == "apps" else (d.get("name") or r.row)
  if ident is None or isinstance(ident, bool) or not isinstance(ident, (int, str)) or ident == "":
    raise r.error("problem_id", f"expected an int or str id, got {loading.short_repr(ident)}")
  out = dict(name=str(ident), statement=loading.require(d, "question", str, r.path, r.row),
             public=tests[:1], hidden=tests, reference=r.first_solution("solutions"),
             time=None, memory=None, test_field="input_output")
  if layout == "taco":
    out["time"] = r.number("time_limit", d.get("time_limit"), TIME_UNITS, 1.0,
                           task_lib.MAX_TIME_SECONDS, ms_from=MS_FROM)
    out["memory"] = _memory(r.number("memory_limit", d.get("memory_limit"), MEMORY_UNITS, 2**20,
                                     task_lib.MAX_MEMORY_BYTES))
  return out


def _livecodebench(r: _Row) -> dict:
  d = r.d
  ident = d.get("question_id")
  if not isinstance(ident, (int, str)) or isinstance(ident, bool) or ident == "":
    raise r.error("question_id", f"expected an int or str id, got {loading.short_repr(ident)}")
  return dict(name=str(ident),
              statement=loading.require(d, "question_content", str, r.path, r.row),
              public=r.case_list("public_test_cases"), hidden=r.case_list("private_test_cases"),
              reference=None, time=None, memory=None, test_field="public_test_cases")


_CONVERTERS: dict[str, Callable[[_Row], dict]] = {
    "codecontests": _codecontests,
    "apps": lambda r: _apps_like(r, "apps"),
    "taco": lambda r: _apps_like(r, "taco"),
    "livecodebench": _livecodebench,
}


def check_float_tolerance(float_tolerance: Optional[float]) -> None:
  """Raises `ValueError` unless `float_tolerance` is None or a finite number >= 0."""
  ft = float_tolerance
  if ft is not None and (not isinstance(ft, (int, float)) or isinstance(ft, bool)
                         or not math.isfinite(ft) or ft < 0):
    raise ValueError(f"float_tolerance must be None or a finite number >= 0, got {ft!r}")


def comparison(layout: str, float_tolerance: Optional[float] = None) -> dict[str, Any]:
  """The output comparison of a row of `layout` with no tolerance field of its own: the
  layout's (`LAYOUT_COMPARISON`), its tolerance replaced by `float_tolerance` (absolute and
  relative) when that is not None. `StdioSpec` keyword arguments.

  Raises:
    ValueError: an unknown layout (not `auto`: a row's layout), or a bad `float_tolerance`.
  """
  if layout not in LAYOUT_COMPARISON:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
  check_float_tolerance(float_tolerance)
  out = dict(LAYOUT_COMPARISON[layout])
  if float_tolerance is not None:
    out.update(abs_tol=float(float_tolerance), rel_tol=float(float_tolerance))
  return out


def _tolerance(r: _Row) -> tuple[float, float]:
  both = r.d.get("float_tolerance")
  out = []
  for field in ("abs_tol", "rel_tol"):
    value = r.d.get(field, both)
    name = field if field in r.d else "float_tolerance"
    if value is None:
      out.append(0.0)
    elif (not isinstance(value, (int, float)) or isinstance(value, bool)
          or not math.isfinite(value) or value < 0):
      raise r.error(name, f"expected a number >= 0, got {loading.short_repr(value)}")
    else:
      out.append(float(value))
  return out[0], out[1]


def format_sample(example: task_lib.Example, number: int) -> str:
  """A sample test as a statement shows it: its input and output as plain text.

    Example 1
    Input:
    1 2
    Output:
    3

  Args:
    example: a stdio test, `Example((INPUT,), OUTPUT)` with strings.
    number: its number in the statement (from 1).
  """
  def block(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"

  return (f"Example {number}\nInput:\n{block(example.args[0])}Output:\n"
          f"{block(example.expected)}").rstrip("\n")


def row_to_task(d: dict, row: int = 0, path: str = "<stdio>", layout: str = AUTO,
                float_tolerance: Optional[float] = None) -> task_lib.Task:
  """One problem row (layout `layout`, or detected with `auto`) to a `stdio` `Task`.

  `float_tolerance`: None (the layout's own output comparison) or a number >= 0 replacing its
  tolerance; a row's own tolerance fields win (module docstring, "Output comparison").

  Raises:
    ValueError: for an unknown `layout` or a bad `float_tolerance`.
    loading.RowError: naming the row and field of a malformed row (module docstring).
  """
  if layout not in STDIO_LAYOUTS:
    raise ValueError(f"layout must be one of {STDIO_LAYOUTS}, got {layout!r}")
  check_float_tolerance(float_tolerance)
  r = _Row(d, row, path)
  if layout == AUTO:
    layout = detect_layout(d)
    if layout is None:
      raise r.error(None, f"cannot detect the layout from the keys {sorted(d)[:12]}; set "
                          f"config.task.stdio_layout to one of {LAYOUTS}")
  p = _CONVERTERS[layout](r)
  if not p["public"] and not p["hidden"]:
    raise r.error(p["test_field"], "no tests")
  hidden = p["hidden"] or p["public"]
  if not any(e.expected.strip() for e in p["public"] + hidden):
    raise r.error(p["test_field"], "every test expects an empty output: a program that prints "
                                   "nothing would pass")
  compare = comparison(layout, float_tolerance)
  if any(k in d for k in _TOLERANCE_FIELDS):
    compare["abs_tol"], compare["rel_tol"] = _tolerance(r)
  reference = p["reference"]
  if reference is not None:
    loading.parse_source(reference, path, row, "solutions")
  level = d.get("difficulty")
  difficulty = level if isinstance(level, int) and not isinstance(level, bool) else (
      _DIFFICULTY.get(level.strip().lower(), 0) if isinstance(level, str) else 0)
  prompt = p["statement"].strip()
  if p["public"]:
    prompt += "\n\n" + "\n\n".join(format_sample(e, i + 1) for i, e in enumerate(p["public"]))
  return task_lib.Task(
      task_id=f"{layout}/{p['name']}", prompt=prompt + "\n", entry_point="main",
      signature="main()", public_examples=tuple(p["public"]), hidden_tests=tuple(hidden),
      reference_solution=reference, difficulty=difficulty, source="stdio",
      stdio=task_lib.StdioSpec(time_seconds=p["time"], memory_bytes=p["memory"], **compare))


def load_stdio(path: str, *, layout: str = AUTO, on_error: str = "raise",
               errors: Optional[list[loading.RowError]] = None,
               check: Optional[Callable[[Sequence[task_lib.Task]],
                                        Sequence[Optional[str]]]] = None,
               float_tolerance: Optional[float] = None) -> list[task_lib.Task]:
  """Competitive-programming problems of a JSONL file (optionally .gz) as `stdio` `Task`s.

  Args:
    path: the JSONL file.
    layout: one of `STDIO_LAYOUTS` (`auto` detects each row's layout from its keys).
    on_error: `"raise"` stops at the first malformed row; `"skip"` logs, counts and skips it.
    errors: if given, skipped rows' `RowError`s are appended to it.
    check: optional reference check (`loading.load_rows`), e.g. running each reference
      solution on its own tests in the sandbox; a failing problem is a malformed row
      (field `solutions`); it judges with each problem's output comparison.
    float_tolerance: None (each layout's own output comparison) or a number >= 0 replacing
      its tolerance (`task.float_tolerance`; module docstring, "Output comparison").

  Raises:
    ValueError: for an unknown `layout` or `on_error`, or a bad `float_tolerance`.
    loading.RowError: with `on_error="raise"`, naming the row and field of a malformed row.
  """
  if layout not in STDIO_LAYOUTS:
    raise ValueError(f"layout must be one of {STDIO_LAYOUTS}, got {layout!r}")
  check_float_tolerance(float_tolerance)
  return loading.load_rows(
      path, lambda d, row: row_to_task(d, row, str(path), layout, float_tolerance),
      on_error, errors, check=check, check_field="solutions")
