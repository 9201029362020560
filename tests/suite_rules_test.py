"""Rules of the test suite itself, read from the source with `ast`.

* Every `zip` of two or more iterables in a test passes `strict=True`: without it, a short list
  of results (a pool that dropped programs, a tree with fewer leaves) ends the loop early, or
  leaves a dict short, and the assertions pass on what little was compared. Pairs of neighbours
  are written `zip(xs[:-1], xs[1:], strict=True)`. The rule holds for every call, not only for
  loops: `enumerate(zip(...))`, `dict(zip(...))` and `sorted(zip(...))` lose elements the same
  way.
* The suite's processes compile no XLA:CPU YNNPACK fusions (`tests/fixtures/xla_flags.py`:
  jaxlib 0.10.2's can crash a process after the fact).
* A test process that dies ends `make test` at once, failed, instead of hanging it: xdist's
  replacement of a dead worker can hang `--dist loadfile` (pytest-dev/pytest-xdist#784).
"""

import ast
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

from absl.testing import absltest
import jax
import jax.numpy as jnp

from tests.fixtures import xla_flags

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
_YNN = "__ynn_fusion"
# A matmul and its compiled HLO's text (XLA:CPU runs it as a YNNPACK fusion by default).
_MATMUL_HLO = ("import jax, jax.numpy as jnp\n"
               "x = jnp.ones((64, 64), jnp.float32)\n"
               "print(jax.jit(lambda a: a @ a).lower(x).compile().as_text())\n")


def loose_zips(source: str, filename: str = "<source>") -> list[int]:
  """The line numbers of the `zip(a, b, ...)` calls in `source` (two or more positional
  arguments) that pass no `strict` keyword, wherever the call stands."""
  lines = []
  for node in ast.walk(ast.parse(source, filename)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "zip"
        and len(node.args) >= 2 and not any(k.arg == "strict" for k in node.keywords)):
      lines.append(node.lineno)
  return sorted(lines)


class SuiteRulesTest(absltest.TestCase):

  def test_zips_are_strict(self):
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
      lines = loose_zips(path.read_text(), str(path))
      if lines:
        found[str(path.relative_to(TESTS))] = lines
    self.assertEmpty(found, "zip(...) calls without strict=True (file: lines)")

  def test_a_planted_loose_zip_is_caught(self):
    source = ("for a, b in zip(xs, ys):\n  assert a == b\n"
              "ok = [a for a, b in zip(xs, ys, strict=True)]\n"
              "bad = {a: b for a, b in zip(xs,\n ys)}\n"
              "single = [a for (a,) in zip(xs)]\n"
              "for i, (a, b) in enumerate(zip(xs, ys)):\n  pass\n"
              "table = dict(zip(xs, ys))\n"
              "pairs = sorted(zip(xs[:-1], xs[1:], strict=True))\n")
    self.assertEqual(loose_zips(source), [1, 4, 7, 9])

  def test_the_suite_compiles_no_ynn_fusions(self):
    x = jnp.ones((64, 64), jnp.float32)
    self.assertNotIn(_YNN, jax.jit(lambda a: a @ a).lower(x).compile().as_text())
    # The programs a test starts compile none either; XLA's defaults do (the check can fail).
    for flags, expected in ((" ".join(xla_flags.COMPILE_FAST), False), ("", True)):
      env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
      out = subprocess.run([sys.executable, "-c", _MATMUL_HLO], env=env, capture_output=True,
                           text=True, timeout=120, check=True).stdout
      self.assertEqual(_YNN in out, expected, flags)

  def test_a_dead_test_process_ends_make_test_failed(self):
    # `make test`'s pytest options, on two test files: one kills its process.
    recipe = re.search(r"^test:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    options = shlex.split(recipe.split(" tests ", 1)[1].replace("$(TEST_WORKERS)", "1")
                          .replace("$(ARGS)", ""))
    tmp = pathlib.Path(self.create_tempdir().full_path)
    (tmp / "pytest.ini").write_text("[pytest]\n")
    (tmp / "a_test.py").write_text(textwrap.dedent("""\
        import os, signal
        def test_dies():
          os.kill(os.getpid(), signal.SIGSEGV)
        """))
    (tmp / "b_test.py").write_text("def test_runs():\n  pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options,
         "a_test.py", "b_test.py"], cwd=tmp, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONFAULTHANDLER=""))
    self.assertNotEqual(proc.returncode, 0, proc.stdout)
    self.assertIn("crashed while running 'a_test.py::test_dies'", proc.stdout)


if __name__ == "__main__":
  absltest.main()
