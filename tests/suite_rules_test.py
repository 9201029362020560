"""Rules of the test suite itself, read from the source with `ast`.

* Every `zip` of two or more iterables in a test passes `strict=True`: without it, a short list
  of results (a pool that dropped programs, a tree with fewer leaves) ends the loop early, or
  leaves a dict short, and the assertions pass on what little was compared. Pairs of neighbours
  are written `zip(xs[:-1], xs[1:], strict=True)`. The rule holds for every call, not only for
  loops: `enumerate(zip(...))`, `dict(zip(...))` and `sorted(zip(...))` lose elements the same
  way.
"""

import ast
import pathlib

from absl.testing import absltest

TESTS = pathlib.Path(__file__).resolve().parent


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


if __name__ == "__main__":
  absltest.main()
