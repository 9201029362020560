"""Keeps the Bazel BUILD file in step with the source tree.

The BUILD file is Starlark, a Python dialect: evaluating it with stub rule
functions gives the targets without needing Bazel. Checks: every module and
test file is named by exactly one target, every named file exists, and each
target's first-party deps are what its sources import.
"""

import ast
import pathlib

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_PACKAGES = ("agentic_grpo", "launch", "experiments", "benchmarks")
# Import roots of first-party code: the packages, and test helpers (`tests.fixtures`).
_IMPORT_ROOTS = _PACKAGES + ("tests",)


def load_build(path: pathlib.Path) -> dict[str, dict]:
  """Evaluates a BUILD file with stub rules; returns targets by name."""
  targets: dict[str, dict] = {}

  def rule(kind):
    def fn(**kwargs):
      name = kwargs["name"]
      if name in targets:
        raise ValueError(f"duplicate target {name!r} in {path}")
      targets[name] = dict(kwargs, kind=kind)
    return fn

  env = {
      "load": lambda *args, **kwargs: None,
      "package": lambda **kwargs: None,
      "requirement": lambda name: f"@pypi//{name}",
      "py_library": rule("py_library"),
      "py_test": rule("py_test"),
      "py_binary": rule("py_binary"),
      "filegroup": rule("filegroup"),
      "glob": lambda *args, **kwargs: [],
  }
  exec(compile(path.read_text(), str(path), "exec"), env)  # pylint: disable=exec-used
  return targets


def _module_of(rel: str) -> str:
  mod = rel[:-3].replace("/", ".")
  return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _first_party_imports(path: pathlib.Path) -> set[str]:
  """Dotted names of this repository that `path` imports.

  `from pkg import x` yields `pkg.x`: x is a module or an attribute of pkg, which the caller
  resolves to the longest module prefix.
  """
  tree = ast.parse(path.read_text())
  found = set()
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
      if name.split(".")[0] in _IMPORT_ROOTS:
        found.add(name)
  return found


class BuildTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.targets = load_build(ROOT / "BUILD")
    cls.src_owner = {}
    for name, target in cls.targets.items():
      for src in target.get("srcs", []):
        if src in cls.src_owner:
          raise AssertionError(f"{src} is in both {cls.src_owner[src]} and {name}")
        cls.src_owner[src] = name

  def _tree_files(self):
    files = []
    for pkg in _PACKAGES:
      for p in sorted((ROOT / pkg).rglob("*.py")):
        files.append(p.relative_to(ROOT).as_posix())
    files += [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").rglob("*_test.py"))]
    return files

  def test_every_file_has_a_target(self):
    missing = [f for f in self._tree_files() if f not in self.src_owner]
    self.assertEmpty(missing, f"files not named in BUILD: {missing}")

  def test_every_named_file_exists(self):
    absent = [s for s in self.src_owner if not (ROOT / s).is_file()]
    self.assertEmpty(absent, f"BUILD names files that do not exist: {absent}")

  def test_tests_are_py_test(self):
    for src, name in self.src_owner.items():
      if src.endswith("_test.py"):
        self.assertEqual(self.targets[name]["kind"], "py_test", src)

  def test_first_party_deps_match_imports(self):
    module_to_target = {}
    for src, name in self.src_owner.items():
      module_to_target[_module_of(src)] = name
    problems = []
    for name, target in self.targets.items():
      needed = set()
      for src in target.get("srcs", []):
        for mod in _first_party_imports(ROOT / src):
          # `from pkg import mod` names a module or an attribute: take the
          # longest prefix that is a module of this repository.
          parts = mod.split(".")
          for k in range(len(parts), 0, -1):
            cand = ".".join(parts[:k])
            if cand in module_to_target:
              needed.add(module_to_target[cand])
              break
      needed.discard(name)
      declared = {d.lstrip(":") for d in target.get("deps", []) if not d.startswith("@")}
      if needed - declared:
        problems.append(f"{name}: missing deps {sorted(needed - declared)}")
      unused = declared - needed
      if unused:
        problems.append(f"{name}: deps not imported {sorted(unused)}")
    self.assertEmpty(problems, "\n".join(problems))

  def test_load_build_rejects_duplicates(self):
    tmp = pathlib.Path(self.create_tempfile(content=(
        'py_library(name="a", srcs=["x.py"])\npy_library(name="a", srcs=["y.py"])\n')).full_path)
    with self.assertRaisesRegex(ValueError, "duplicate target 'a'"):
      load_build(tmp)


if __name__ == "__main__":
  absltest.main()
