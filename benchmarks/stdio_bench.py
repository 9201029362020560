r"""Tests per second: the sandbox's stdin/stdout judge against a plain `subprocess.run` loop.

Both judge the same programs on the same tests with the same number of
parallel workers: a set of correct solutions of small competitive-programming
problems (each with `--tests` tests), then the adversarial programs of
`tests/sandbox_stdio_test.py` (wrong answer, timeout, memory, runtime error,
output flood, reading the expected output), whose verdicts are printed side by
side. The reference runs `python -c SOURCE` per test with RLIMIT_CPU and
RLIMIT_AS set in `preexec_fn`, a wall timeout, and the same token comparison,
and no isolation at all.

Usage:
  python -m benchmarks.stdio_bench --workers=2 --tests=10
"""

import concurrent.futures
import json
import math
import random
import resource
import subprocess
import sys
import time

from absl import app
from absl import flags

from agentic_grpo import sandbox
from agentic_grpo.sandbox import stdio


_SOLVED = {
    "sum": ("n = int(input())\nprint(sum(map(int, input().split())))",
            lambda xs: (f"{len(xs)}\n{' '.join(map(str, xs))}\n", str(sum(xs)))),
    "sort": ("input()\nprint(*sorted(map(int, input().split())))",
             lambda xs: (f"{len(xs)}\n{' '.join(map(str, xs))}\n", " ".join(map(str, sorted(xs))))),
    "max_prefix": ("import sys\nd = sys.stdin.read().split()\nbest = s = 0\n"
                   "for x in map(int, d[1:]):\n  s += x\n  best = max(best, s)\nprint(best)",
                   lambda xs: (f"{len(xs)}\n{' '.join(map(str, xs))}\n",
                               str(max([0] + [sum(xs[:i + 1]) for i in range(len(xs))])))),
}
_ADVERSARIAL = {
    "wrong_answer": "print(0)",
    "timeout": "while True:\n  pass",
    "memory": "x = bytearray(2 * 10**9)",
    "runtime_error": "raise ValueError('boom')",
    "output_flood": "import sys\nwhile True:\n  sys.stdout.write('x' * 65536)",
    "read_expected": "import os\nprint(sorted(os.listdir('/'))[:3])",
}


def problems(tests, copies):
  """`copies` of each solved problem with `tests` tests each (`StdioProgram`s)."""
  rng = random.Random(0)
  out = []
  for _ in range(copies):
    for source, make in _SOLVED.values():
      cases = [make([rng.randint(-100, 100) for _ in range(rng.randint(1, 200))])
               for _ in range(tests)]
      out.append(stdio.StdioProgram(source, [stdio.StdioTest(i, e) for i, e in cases],
                                    time_seconds=1.0))
  return out


def _reference_one(program):
  """One program, every test, with subprocess.run; returns the verdict names."""
  def limit():
    cpu = math.ceil(program.time_seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (program.memory_bytes, program.memory_bytes))
  verdicts = []
  for t in program.tests:
    try:
      p = subprocess.run([sys.executable, "-c", program.source], input=t.input.encode(),
                         capture_output=True, timeout=program.wall_seconds, preexec_fn=limit,
                         check=False)
    except subprocess.TimeoutExpired:
      verdicts.append("timeout")
      continue
    if p.returncode < 0:
      verdicts.append("timeout" if p.returncode in (-24, -9) else "runtime_error")
    elif p.returncode != 0:
      verdicts.append("memory_limit" if b"MemoryError" in p.stderr else "runtime_error")
    elif len(p.stdout) + len(p.stderr) > program.output_bytes:
      verdicts.append("output_limit")
    else:
      verdicts.append("passed" if stdio.outputs_match(p.stdout, t.expected) else "wrong_answer")
  return verdicts


def ours(programs, workers):
  """Judges `programs` with `SandboxPool(workers)`: (verdicts, start-up s, run s)."""
  start = time.perf_counter()
  with sandbox.SandboxPool(workers) as pool:
    pool.start()
    started = time.perf_counter()
    results = pool.map(programs)
    done = time.perf_counter()
  return [[str(v) for v in r.verdicts] for r in results], started - start, done - started


def reference(programs, workers):
  """Judges `programs` with `subprocess.run` from a thread pool: (verdicts, run s)."""
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(workers) as executor:
    verdicts = list(executor.map(_reference_one, programs))
  return verdicts, time.perf_counter() - start


def main(argv):
  del argv
  workers = _WORKERS.value
  solved = problems(_TESTS.value, _COPIES.value)
  n_tests = sum(len(p.tests) for p in solved)
  ours_v, startup, ours_s = ours(solved, workers)
  ref, ref_s = reference(solved, workers)
  ours_ok = sum(v == "passed" for vs in ours_v for v in vs)
  ref_ok = sum(v == "passed" for vs in ref for v in vs)
  print(f"solved problems: {len(solved)}, tests: {n_tests}, workers: {workers}")
  print(f"sandbox judge:   {n_tests / ours_s:7.1f} tests/s ({ours_ok}/{n_tests} passed; "
        f"server start-up {startup:.2f} s)")
  print(f"subprocess.run:  {n_tests / ref_s:7.1f} tests/s ({ref_ok}/{n_tests} passed)")
  print(f"ratio: {ref_s / ours_s:.2f}x")
  adversarial = [stdio.StdioProgram(s, [stdio.StdioTest("1 2\n", "3")], time_seconds=1.0)
                 for s in _ADVERSARIAL.values()]
  ours_adv, _, _ = ours(adversarial, workers)
  ref_adv, _ = reference(adversarial, workers)
  print(f"{'program':15s} {'sandbox judge':15s} subprocess.run")
  for name, a, b in zip(_ADVERSARIAL, ours_adv, ref_adv):
    print(f"{name:15s} {a[0]:15s} {b[0]}")
  print(json.dumps({"tests": n_tests, "workers": workers,
                    "ours_tests_per_s": round(n_tests / ours_s, 1),
                    "reference_tests_per_s": round(n_tests / ref_s, 1),
                    "ratio": round(ref_s / ours_s, 2),
                    "verdicts": {n: [a[0], b[0]] for n, a, b in
                                 zip(_ADVERSARIAL, ours_adv, ref_adv)}}))


if __name__ == "__main__":
  # Flags only when run as a program: the suite (benchmarks.run) imports this module next to
  # others that define the same flag names.
  _WORKERS = flags.DEFINE_integer("workers", 2, "Programs judged at once, for both.")
  _TESTS = flags.DEFINE_integer("tests", 10, "Tests per problem.")
  _COPIES = flags.DEFINE_integer("copies", 4, "Copies of each solved problem.")
  app.run(main)
