"""The door that opens a task source with its load-time reference check.

`tasks/` is a leaf: a task source (`tasks.sources.TASK_SOURCES`) reads rows and never runs a
program. Checking that every reference solution passes its own tests runs code, so the check is
made here, in the sandbox package, and handed to the source:

    tasks = checked_sources.open_source(cfg.task, cfg.sandbox)

With `task.check_references` (the default) the finite sources treat a problem whose reference
fails as a malformed row (skipped and counted, or `loading.RowError` with
`task.on_error="raise"`), so a reference too slow for the run's limits is refused at load time
rather than failing every episode.
"""

import os
from typing import Any, Optional

from agentic_grpo import sandbox
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import loading
from agentic_grpo.tasks import sources


def reference_check(task_section: Any, sandbox_section: Any = None) -> Optional[loading.Check]:
  """With `task_section.check_references`: a check running every reference solution on its
  own tests in a fresh sandbox pool (one pool call per load), else None.

  The pool is `sandbox_section.pool()` (the run's limits, workers and isolation: a reference
  that passes here passes under the run's judge), or, without a section, the default limits on
  up to 4 workers.

  Args:
    task_section: the config's `task` section (`config.TaskSection`, or anything with a
      `check_references` field).
    sandbox_section: the config's `sandbox` section (`sandbox.sections.SandboxSection`), or None.

  Returns:
    A `loading.Check` (tasks in, one failure message or None per task out), or None.
  """
  if not task_section.check_references:
    return None

  def check(tasks):
    pool = (sandbox_section.pool() if sandbox_section is not None else
            sandbox.SandboxPool(max_workers=max(1, min(4, os.cpu_count() or 1))))
    with pool:
      return execution.reference_failures(tasks, pool)
  return check


def open_source(task_section: Any, sandbox_section: Any = None) -> sources.TaskSource:
  """The task source `task_section.source` (`tasks.sources.TASK_SOURCES`), opened with
  `reference_check(task_section, sandbox_section)`.

  Raises:
    ValueError: from the registry, for an unregistered source name; from the source, for a bad field, a missing file or no usable task;
      `loading.RowError` with `task.on_error="raise"` for a malformed row or a failing
      reference.
  """
  factory = sources.TASK_SOURCES.get(task_section.source)
  return factory(task_section, reference_check(task_section, sandbox_section))
