"""The sandbox's config section (`SandboxSection`, the config's `sandbox`): pool size, limits
per program and the weakest isolation a run accepts.

It lives with the sandbox that reads it: `SandboxSection.limits()` and `.pool()` build the
sandbox's own `Limits` and `SandboxPool`. `config/` assembles it into `TrainConfig` (and
re-exports it as `config.SandboxSection`).
"""

import dataclasses
import math

from agentic_grpo import field_checks as checks
from agentic_grpo.sandbox import pool as pool_lib
from agentic_grpo.sandbox import types


@dataclasses.dataclass(frozen=True)
class SandboxSection:
  """Subprocess sandbox pool limits.

  `min_isolation`: the weakest sandbox isolation level the run accepts, one of
  `sandbox.ISOLATION_LEVELS` ("hook" < "landlock" < "namespaces"); the pool raises
  RuntimeError at start-up on a machine that cannot provide it.

  Attributes:
    workers: sandbox worker processes.
    timeout_s: wall-clock limit per program, seconds.
    cpu_s: CPU-time limit per program, seconds.
    memory_mb: memory limit per program, MiB (>= 64).
    job_budget_s: wall-clock seconds for all tests of one stdin/stdout job scored by a
      fraction of tests (`workflow.reward_mode='fraction'`, evaluation): a program that loops
      would otherwise cost a time limit per test (CodeContests has ~200 tests a problem). A
      test still running at the end is killed and the tests after it count as failed; each
      job gets at least one test's deadline. 0: no budget. With `reward_mode='all_pass'` a
      job stops at its first test in error instead (`sandbox.execution.program`).
    min_isolation: weakest isolation accepted: `hook`, `landlock` or `namespaces`.
  """
  workers: int = 2
  timeout_s: float = 2.0
  cpu_s: float = 2.0
  memory_mb: int = 512
  job_budget_s: float = 60.0
  min_isolation: str = "hook"

  def validate(self, path: str) -> None:
    checks.choice(f"{path}.min_isolation", self.min_isolation, types.ISOLATION_LEVELS)
    checks.check(self.workers >= 1, f"{path}.workers", "must be >= 1", self.workers)
    checks.check(self.timeout_s > 0, f"{path}.timeout_s", "must be > 0", self.timeout_s)
    checks.check(self.cpu_s > 0, f"{path}.cpu_s", "must be > 0", self.cpu_s)
    checks.check(self.memory_mb >= 64, f"{path}.memory_mb", "must be >= 64", self.memory_mb)
    checks.check(math.isfinite(self.job_budget_s) and self.job_budget_s >= 0,
                 f"{path}.job_budget_s", "must be a finite number >= 0 (0 = none)",
                 self.job_budget_s)

  def limits(self) -> types.Limits:
    """The per-program limits of this section (`sandbox.Limits`)."""
    return types.Limits(cpu_seconds=self.cpu_s, wall_seconds=self.timeout_s,
                        memory_bytes=self.memory_mb * 2**20,
                        stdio_budget_seconds=self.job_budget_s or None)

  def pool(self) -> pool_lib.SandboxPool:
    """A sandbox pool of `workers` processes with `limits()`, at least `min_isolation`.

    Raises:
      RuntimeError: this machine cannot provide `min_isolation`.
    """
    return pool_lib.SandboxPool(max_workers=self.workers, limits=self.limits(),
                                isolation=types.Isolation(min_level=self.min_isolation))
