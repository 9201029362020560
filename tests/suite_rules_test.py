"""Rules of the test suite itself, read from the source with `ast`.

* A loop (or comprehension) over `zip` of two or more iterables in a test passes `strict=True`:
  without it, a short list of results (a pool that dropped programs, a tree with fewer leaves)
  ends the loop early, and the assertions inside it pass on what little was compared.
"""

import ast
import pathlib

from absl.testing import absltest

TESTS = pathlib.Path(__file__).resolve().parent


def loose_zips(source: str, filename: str = "<source>") -> list[int]:
  """The line numbers of `for` loops and comprehensions in `source` that iterate over a
  `zip(a, b, ...)` call without a `strict` keyword."""
  lines = []
  for node in ast.walk(ast.parse(source, filename)):
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
      it = node.iter
      if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "zip"
          and len(it.args) >= 2 and not any(k.arg == "strict" for k in it.keywords)):
        lines.append(it.lineno)
  return sorted(lines)


class SuiteRulesTest(absltest.TestCase):

  def test_loops_over_zip_are_strict(self):
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
      lines = loose_zips(path.read_text(), str(path))
      if lines:
        found[str(path.relative_to(TESTS))] = lines
    self.assertEmpty(found, "loops over zip(...) without strict=True (file: lines)")

  def test_a_planted_loose_zip_is_caught(self):
    source = ("for a, b in zip(xs, ys):\n  assert a == b\n"
              "ok = [a for a, b in zip(xs, ys, strict=True)]\n"
              "bad = {a: b for a, b in zip(xs,\n ys)}\n"
              "single = [a for (a,) in zip(xs)]\n")
    self.assertEqual(loose_zips(source), [1, 4])


if __name__ == "__main__":
  absltest.main()
