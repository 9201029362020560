"""Sandboxed execution of untrusted Python programs, with typed verdicts: code in, verdicts out.

Modules: `types` (Program, IOTest, Limits, Isolation, RunResult, Verdict),
`stdio` (the stdin/stdout judge: StdioProgram, StdioTest, StdioResult,
StdioVerdict, outputs_match), `program_judge` (a Program's job and the verdict
from its report), `pool` (SandboxPool, run_program), `isolation` (what
confinement a worker gets), `worker` (one server process), `values` (plain
literals across the boundary) and `runner` (the server and children inside the
sandbox, standard library only). Values are compared by
`agentic_grpo.tasks.literals.values_equal`.

Judging tasks: `execution` (a task's program on its public or hidden tests, reference checks),
`check_split` (HumanEval `check` assertions as I/O tests compared in the trusted parent) and
`checked_sources` (a task source opened with its load-time reference check: `tasks/` itself
runs no program). The package sits above `tasks/` (it reads `Task`s) and below `agent/`.

Typical use::

  from agentic_grpo import sandbox
  programs = [sandbox.Program(source, "add", io_tests=(sandbox.IOTest((1, 2), 3),))]
  with sandbox.SandboxPool(max_workers=4) as pool:
    results = pool.map(programs)      # list[RunResult], in order
    judged = pool.map([sandbox.StdioProgram("print(sum(map(int, input().split())))",
                                            (sandbox.StdioTest("1 2", "3"),))])
"""

from agentic_grpo.sandbox.pool import run_program
from agentic_grpo.sandbox.pool import SandboxPool
from agentic_grpo.sandbox.stdio import outputs_match
from agentic_grpo.sandbox.stdio import StdioProgram
from agentic_grpo.sandbox.stdio import StdioResult
from agentic_grpo.sandbox.stdio import StdioTest
from agentic_grpo.sandbox.stdio import StdioVerdict
from agentic_grpo.sandbox.types import IOTest
from agentic_grpo.sandbox.types import Isolation
from agentic_grpo.sandbox.types import ISOLATION_LEVELS
from agentic_grpo.sandbox.types import Limits
from agentic_grpo.sandbox.types import Program
from agentic_grpo.sandbox.types import RunResult
from agentic_grpo.sandbox.types import Verdict

__all__ = ["IOTest", "ISOLATION_LEVELS", "Isolation", "Limits", "Program", "RunResult",
           "SandboxPool", "StdioProgram", "StdioResult", "StdioTest", "StdioVerdict", "Verdict",
           "outputs_match", "run_program"]
