"""Judging programs against a data set's tasks, as a run judges its final code.

The public calls a researcher scripts (`launch/judge.py` is their command line):

    cfg = config.from_config_dict({"task": {"source": "stdio", "path": "problems.jsonl"}})
    tasks = judging.load_tasks(cfg)                      # {task_id: Task}, both splits
    with cfg.sandbox.pool() as pool:
      verdicts = judging.judge(list(tasks.values()), ["print(3)\\n"] * len(tasks), pool)

A program is judged on its task's hidden tests (`sandbox.execution.hidden_program`: a `stdio`
task's stdin/stdout tests under its limits and its layout's output comparison, a function
task's I/O tests and check script), in the sandbox the run would use (`config.sandbox`). With
`public=True` a `stdio` task's public tests are run too, as the load-time reference check does.
"""

import collections
import dataclasses
import json
import os
from typing import Any, Optional, Sequence

from agentic_grpo import config as config_lib
from agentic_grpo import errors
from agentic_grpo.sandbox import checked_sources
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import task as task_lib

SPLITS = ("all", "train", "heldout")


@dataclasses.dataclass(frozen=True)
class Verdict:
  """How one program did on its task's tests.

  Attributes:
    task_id: the task.
    passed: every test passed.
    num_passed: tests passed.
    num_tests: tests run (0: nothing could be run, e.g. no program).
    verdict: the judge's verdict of the run (`passed`, `wrong_answer`, `timeout`, ...), or
      `no_program` / `sandbox_failure`.
    error: the first failure's message (stderr, exception), cut to 300 characters; "" if none.
  """
  task_id: str
  passed: bool
  num_passed: int
  num_tests: int
  verdict: str
  error: str = ""

  def to_json(self) -> dict[str, Any]:
    """The verdict as a JSON object (`launch.judge --verdicts` rows)."""
    return dataclasses.asdict(self)


def load_tasks(cfg: config_lib.TrainConfig, split: str = "all") -> dict[str, task_lib.Task]:
  """The tasks of `cfg.task`'s data set, by task id, loaded and checked as a run loads them.

  Args:
    cfg: a run config; its `task` section names the data set (a finite source: `stdio`,
      `jsonl`, `humaneval`, `mbpp`, ...) and `sandbox` the load-time reference check's limits.
    split: `all` (training then held-out tasks), `train` or `heldout`.

  Returns:
    `{task_id: Task}` in the split's order.

  Raises:
    errors.InputError (a ValueError): an unknown split, a source that is not a finite data
      set (e.g. `synthetic`), and every input mistake of the data (a missing file, no usable
      task, an empty split: `tasks.sources`).
  """
  if split not in SPLITS:
    raise errors.InputError(f"--split must be one of {SPLITS}, got {split!r}")
  source = checked_sources.open_source(cfg.task, cfg.sandbox)
  if not (hasattr(source, "train") and hasattr(source, "heldout")):
    raise errors.InputError(f"config.task.source={cfg.task.source!r} is not a data set of "
                            f"fixed tasks: judge the tasks of a file (e.g. "
                            f"--config.task.source=stdio --config.task.path=FILE)")
  parts = {"all": source.train + source.heldout, "train": source.train,
           "heldout": source.heldout}[split]
  return {t.task_id: t for t in parts}


def judge(tasks: Sequence[task_lib.Task], programs: Sequence[Optional[str]], pool, *,
          public: bool = False) -> list[Verdict]:
  """Runs `programs[i]` on the tests of `tasks[i]` (one pool call); one `Verdict` each.

  Args:
    tasks: N tasks.
    programs: N program sources (a whole program for a `stdio` task, the function for a
      function task), None where there is none (verdict `no_program`).
    pool: a `sandbox.SandboxPool` (e.g. `cfg.sandbox.pool()`); its limits apply where a task
      sets none.
    public: also run a `stdio` task's public tests.

  Raises:
    ValueError: `tasks` and `programs` of different lengths.
  """
  if len(tasks) != len(programs):
    raise ValueError(f"{len(tasks)} tasks but {len(programs)} programs")

  def job(task, source):
    if task.stdio is not None and public:
      return execution.program(task, source, task.public_examples + task.hidden_tests, pool)
    return execution.hidden_program(task, source, pool)

  guard = execution.Guard("judge", collections.Counter())
  jobs = [guard(lambda t=t, p=p: job(t, p), None) if p is not None else None
          for t, p in zip(tasks, programs)]
  results = execution.run_programs(pool, jobs, guard)
  out = []
  for task, source, result in zip(tasks, programs, results):
    if result is None:
      out.append(Verdict(task.task_id, False, 0, 0,
                         "no_program" if source is None else "sandbox_failure"))
      continue
    verdict = getattr(result.verdict, "value", str(result.verdict))
    error = "" if result.error is None else str(result.error)[:300]
    out.append(Verdict(task.task_id, result.num_tests > 0
                       and result.num_passed == result.num_tests, int(result.num_passed),
                       int(result.num_tests), str(verdict), error))
  return out


def read_programs(path: str, tasks: dict[str, task_lib.Task]) -> list[tuple[str, str]]:
  """`(task_id, program)` pairs of a JSONL file of `{"task_id": ..., "program": ...}` rows.

  Raises:
    errors.InputError (a ValueError): a missing file, a row that is not such an object, or a
      task id that is not among `tasks` (naming the row).
  """
  if not os.path.isfile(path):
    raise errors.InputError(f"--programs {path!r} is missing: name a JSONL file of "
                            f'{{"task_id": ..., "program": ...}} rows')
  out = []
  with open(path, encoding="utf-8") as f:
    for row, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        d = json.loads(line)
      except ValueError as e:
        raise errors.InputError(f"--programs {path}: row {row} is not JSON: {e}") from None
      if not (isinstance(d, dict) and isinstance(d.get("task_id"), str)
              and isinstance(d.get("program"), str)):
        raise errors.InputError(f"--programs {path}: row {row} must be an object with string "
                                f"fields task_id and program")
      if d["task_id"] not in tasks:
        near = sorted(tasks)[:3]
        raise errors.InputError(f"--programs {path}: row {row} names task_id "
                                f"{d['task_id']!r}, not a task of the data set (of "
                                f"{len(tasks)}; e.g. {near}); check --config.task.* and "
                                f"--split")
      out.append((d["task_id"], d["program"]))
  return out
