"""The package's import rules (docs/architecture.md), read from the source with `ast`.

* `core/` and `parallel/` import nothing from the package but themselves;
* `models/` and `learner` import nothing from the host wing (`agent/`, `replay/`, `tasks/`)
  nor from `train/`;
* the host wing imports nothing from the device side (`models/`, `learner`, `parallel/`) nor
  from `train/`: of the device side, only `core/` (pure math on arrays);
* within `train/`, only `device.py` imports `models/` and `learner` or places batches
  (`parallel.batch`: `put_batch`, `shard_batch`, `local_rows`, ...);
* nothing in the package outside `train/` imports `train/`.
"""

import ast
import pathlib

from absl.testing import absltest

from agentic_grpo.parallel import batch as batch_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentic_grpo"
HOST_WING = ("agent", "replay", "tasks")
DEVICE_SIDE = ("models", "learner", "parallel")
# Names of batch placement (parallel/batch.py) that `parallel` re-exports.
PLACEMENT = frozenset(n for n in vars(batch_lib) if not n.startswith("_")
                      and callable(getattr(batch_lib, n))
                      and getattr(getattr(batch_lib, n), "__module__", "") == batch_lib.__name__)


def _area(module: str) -> str:
  """`agentic_grpo.models.sampler` -> `models`; `agentic_grpo.learner` -> `learner`."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
  """The package modules `path` imports, and the attributes it reads off `parallel`."""
  tree = ast.parse(path.read_text(), str(path))
  modules, parallel_names = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      modules.update(a.name for a in node.names if a.name.startswith("agentic_grpo"))
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
        "agentic_grpo"):
      if node.module != "agentic_grpo":
        modules.add(node.module)
      for a in node.names:  # `from agentic_grpo.x import y`: y may be a module
        modules.add(f"{node.module}.{a.name}")
        if node.module == "agentic_grpo.parallel":
          parallel_names.add(a.name)
    elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id == "parallel"):
      parallel_names.add(node.attr)
  return modules, parallel_names


def _sources():
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(PACKAGE)
    area = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    yield path, rel, area


class ImportRulesTest(absltest.TestCase):

  def _violations(self, rule) -> list[str]:
    out = []
    for path, rel, area in _sources():
      modules, names = _imports(path)
      out.extend(f"{rel}: {why}" for why in rule(rel, area, modules, names))
    return out

  def test_sources_are_found(self):
    areas = {area for _, _, area in _sources()}
    for area in ("core", "parallel", "models", "learner", "agent", "replay", "tasks", "train"):
      self.assertIn(area, areas)
    self.assertIn("put_batch", PLACEMENT)
    self.assertIn("local_rows", PLACEMENT)

  def test_core_and_parallel_import_only_themselves(self):
    def rule(rel, area, modules, names):
      if area in ("core", "parallel"):
        yield from (f"imports {m}" for m in modules if _area(m) != area)
    self.assertEmpty(self._violations(rule))

  def test_models_and_learner_import_no_host_code(self):
    def rule(rel, area, modules, names):
      if area in ("models", "learner"):
        yield from (f"imports {m}" for m in modules if _area(m) in HOST_WING + ("train",))
    self.assertEmpty(self._violations(rule))

  def test_host_wing_imports_only_core_of_the_device_side(self):
    def rule(rel, area, modules, names):
      if area in HOST_WING:
        yield from (f"imports {m}" for m in modules if _area(m) in DEVICE_SIDE + ("train",))
    self.assertEmpty(self._violations(rule))

  def test_only_train_device_touches_models_learner_and_placement(self):
    def rule(rel, area, modules, names):
      if area != "train" or rel.name == "device.py":
        return
      yield from (f"imports {m}" for m in modules if _area(m) in ("models", "learner")
                  or m == "agentic_grpo.parallel.batch")
      yield from (f"places batches with parallel.{n}" for n in sorted(names & PLACEMENT))
    self.assertEmpty(self._violations(rule))

  def test_nothing_outside_train_imports_train(self):
    def rule(rel, area, modules, names):
      if area != "train":
        yield from (f"imports {m}" for m in modules if _area(m) == "train")
    self.assertEmpty(self._violations(rule))

  def test_a_violation_is_caught(self):
    # The parser sees every import form the rules rely on.
    probe = PACKAGE / "train" / "evaluation.py"
    modules, _ = _imports(probe)
    self.assertIn("agentic_grpo.train.device", modules)
    self.assertIn("agentic_grpo.agent.loop", modules)
    _, names = _imports(PACKAGE / "train" / "device.py")
    self.assertIn("shard_batch", names)


if __name__ == "__main__":
  absltest.main()
