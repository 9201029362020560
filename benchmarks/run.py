r"""The benchmark suite's one entry point.

  python -m benchmarks.run                      # every benchmark
  python -m benchmarks.run --only grpo_step     # one (comma-separated for several)
  python -m benchmarks.run --quick              # small shapes and few repeats: a smoke run

Each benchmark prints a Markdown table and appends one JSON line (machine, load average,
versions, date, settings, rows, summary) to `--results` (default `benchmarks/results.jsonl`,
ignored by git: docs/benchmarks.md holds the tables worth keeping). The peers (Tunix,
transformers) run in virtual environments of their own, created on first use (`benchmarks.venvs`).
Needs `benchmarks/requirements.txt` in the environment it is started from.
"""

import pathlib
import sys
import time
from typing import Callable

from absl import app
from absl import flags

from benchmarks import report


def _update_flops(quick):
  from benchmarks import update_flops  # pylint: disable=g-import-not-at-top
  return update_flops.run(quick)


def _sampler(quick):
  from benchmarks import sampler  # pylint: disable=g-import-not-at-top
  return sampler.run(quick)


def _continuous(quick):
  from benchmarks import continuous_bench  # pylint: disable=g-import-not-at-top
  return continuous_bench.run(quick)


def _continuous_prefix(quick):
  from benchmarks import continuous_bench  # pylint: disable=g-import-not-at-top
  return continuous_bench.run_conversations(quick)


def _sandbox(quick):
  from benchmarks import sandbox  # pylint: disable=g-import-not-at-top
  return sandbox.run(quick)


def _stdio(quick):
  from benchmarks import stdio  # pylint: disable=g-import-not-at-top
  return stdio.run(quick)


def _grpo_step(quick):
  from benchmarks import grpo_step  # pylint: disable=g-import-not-at-top
  return grpo_step.run(quick)


def _pipeline(quick):
  from benchmarks import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.run(quick)


def _packing(quick):
  from benchmarks import packing  # pylint: disable=g-import-not-at-top
  return packing.run(quick)


BENCHMARKS: dict[str, Callable[[bool], dict]] = {
    "update_flops": _update_flops,
    "sampler": _sampler,
    "continuous": _continuous,
    "continuous_prefix": _continuous_prefix,
    "sandbox": _sandbox,
    "stdio": _stdio,
    "grpo_step": _grpo_step,
    "pipeline": _pipeline,
    "packing": _packing,
}


def main(argv):
  del argv
  names = _ONLY.value or list(BENCHMARKS)
  unknown = [n for n in names if n not in BENCHMARKS]
  if unknown:
    raise app.UsageError(f"unknown benchmark(s) {unknown}; known: {sorted(BENCHMARKS)}")
  report.RESULTS = pathlib.Path(_RESULTS.value)
  failed = []
  for name in names:
    start = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
      BENCHMARKS[name](_QUICK.value)
    except Exception as e:  # pylint: disable=broad-except
      # One failing peer must not lose the other benchmarks' results.
      failed.append(name)
      print(f"!! {name} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    print(f"== {name} took {time.perf_counter() - start:.0f} s", flush=True)
  if failed:
    sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
  # Flags only when run as a program: tests and other modules import this one next to
  # programs that define the same flag names (tests/launch_imports_test.py).
  _ONLY = flags.DEFINE_list("only", [], "Benchmarks to run (default: all).")
  _QUICK = flags.DEFINE_bool("quick", False, "Small shapes, few repeats: checks the suite runs.")
  _RESULTS = flags.DEFINE_string("results", str(report.RESULTS), "JSON-lines file appended to.")
  app.run(main)
