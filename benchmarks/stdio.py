r"""Tests per second: the stdin/stdout judge on `SandboxPool` against plain `subprocess.run`.

The measurement of `stdio_bench.py` (solved competitive-programming problems, a fresh process
per test on both sides, the same worker count), run in alternating order for `rounds` rounds;
the headline is the median of the per-round ratios.

Usage:
  python -m benchmarks.run --only stdio [--quick]
"""

import statistics

from benchmarks import report
from benchmarks import stdio_bench


def run(quick: bool = False, *, workers: int = 2, tests: int = 10, copies: int = 4,
        rounds: int = 3) -> dict:
  """Measures, prints the table, appends the results line; returns it.

  Args:
    quick: one copy of each problem with 3 tests, one round.
    workers: programs judged at once, for both.
    tests, copies: tests per problem and copies of each problem.
    rounds: interleaved rounds.
  """
  load_before = report.load_average()
  if quick:
    tests, copies, rounds = 3, 1, 1
  solved = stdio_bench.problems(tests, copies)
  n = sum(len(p.tests) for p in solved)
  ours_s, ref_s, passed = [], [], {"ours": 0, "ref": 0}
  for r in range(rounds):
    for side in (("ours", "ref") if r % 2 == 0 else ("ref", "ours")):
      if side == "ours":
        verdicts, _, seconds = stdio_bench.ours(solved, workers)
        ours_s.append(seconds)
      else:
        verdicts, seconds = stdio_bench.reference(solved, workers)
        ref_s.append(seconds)
      passed[side] = sum(v == "passed" for vs in verdicts for v in vs)
  ratios = [r / o for o, r in zip(ours_s, ref_s)]
  rows = [["SandboxPool judge", f"{n / statistics.median(ours_s):.1f}", f"{passed['ours']}/{n}"],
          ["subprocess.run", f"{n / statistics.median(ref_s):.1f}", f"{passed['ref']}/{n}"]]
  return report.record(
      "stdio", settings={"tests": n, "workers": workers, "rounds": rounds, "quick": quick},
      header=["judge", "tests/s (median)", "passed"], rows=rows,
      summary={"ratio": round(statistics.median(ratios), 3),
               "ratios": [round(x, 3) for x in ratios]},
      load_before=load_before)
