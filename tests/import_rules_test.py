"""The package's import rules (docs/architecture.md), read from the source with `ast`.

Rules on what a module reaches hold *transitively*: a module breaks a rule if anything it
imports, at any depth, is forbidden to it (importing `a.b.c` also runs `a/__init__` and
`a/b/__init__`).

* `core/` and `parallel/` reach nothing in the package but themselves;
* `tasks/` is a leaf: it reaches none of `agent/`, `sandbox/`, `replay/`, `config/`, the device
  side or `train/` (a task source reads rows; a reference check comes from its caller);
* `sandbox/` (untrusted code in, verdicts out) reaches none of `agent/`, `replay/`, `config/`,
  the device side or `train/`;
* `models/` and `learner` reach nothing of the host wing (`agent/`, `replay/`, `sandbox/`,
  `tasks/`) nor `config/` nor `train/` (the learner's sections live with it:
  `learner/sections.py`);
* the host wing reaches nothing of the device side (`models/`, `learner`, `parallel/`) nor
  `train/`: of the device side, only `core/` (pure math on arrays);
* nothing in the package outside `train/` reaches `train/`;
* the package graph (areas: the sub-packages and the root modules) has no cycle;
* within `train/`, only the door to the device (`device.py`, and `sampling.py`, the sampler it
  hands out) imports `models/` and `learner` or places batches (`parallel.batch`: `put_batch`,
  `shard_batch`, `local_rows`, ...): a rule on direct imports;
* only `parallel/` asks `jax` the process questions (`jax.process_count`, `jax.process_index`)
  or uses `multihost_utils`: the rest of the package asks `parallel` (`process_count`,
  `is_primary`, `sync_processes`, `broadcast_from_primary`, ...) or the run's coordinator, so
  that a multi-process question has one answer.
"""

import ast
import pathlib

from absl.testing import absltest

from agentic_grpo.parallel import batch as batch_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentic_grpo"
HOST_WING = ("agent", "replay", "sandbox", "tasks")
DEVICE_SIDE = ("models", "learner", "parallel")
# Names of batch placement (parallel/batch.py) that `parallel` re-exports.
PLACEMENT = frozenset(n for n in vars(batch_lib) if not n.startswith("_")
                      and callable(getattr(batch_lib, n))
                      and getattr(getattr(batch_lib, n), "__module__", "") == batch_lib.__name__)


def _area(module: str) -> str:
  """`agentic_grpo.models.sampler` -> `models`; `agentic_grpo.errors` -> `errors`."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
  """The package names `path` imports (`from pkg import x` gives `pkg` and `pkg.x`: x may be
  a module), and the attributes it reads off `parallel`."""
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


def module_graph(package: pathlib.Path) -> dict[str, set[str]]:
  """Module -> the package modules it imports directly (dotted names), for the package rooted
  at `package` (a directory named like the package). A name imported is resolved to its
  longest module prefix, plus the packages above it (whose `__init__` runs first)."""
  root = package.parent
  paths = {}
  for path in sorted(package.rglob("*.py")):
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    paths[name.removesuffix(".__init__")] = path

  def resolve(name):
    while name and name not in paths:
      name = name.rpartition(".")[0]
    return name

  graph = {}
  for module, path in paths.items():
    deps = set()
    for name in _imports(path)[0]:
      target = resolve(name)
      parts = target.split(".")
      deps.update(".".join(parts[:k]) for k in range(2, len(parts) + 1))
    deps.discard(module)
    graph[module] = {d for d in deps if d in paths}
  return graph


def reach(graph: dict[str, set[str]], module: str, through=lambda m: True) -> set[str]:
  """The modules `module` imports at any depth; the walk continues only past modules for
  which `through(m)` holds (a module failing it is reached, not expanded)."""
  seen, stack = set(), [module]
  while stack:
    for dep in graph[stack.pop()]:
      if dep not in seen:
        seen.add(dep)
        if through(dep):
          stack.append(dep)
  return seen


def reach_violations(graph: dict[str, set[str]]) -> list[str]:
  """`module: reaches x (forbidden area)` for every transitive rule broken in `graph`."""
  out = []
  for module in sorted(graph):
    area = _area(module)
    reached = reach(graph, module)
    forbidden = set()
    if area in ("core", "parallel"):
      forbidden |= {m for m in reached if _area(m) != area}
    if area == "tasks":
      forbidden |= {m for m in reached if _area(m) in (
          "agent", "sandbox", "replay", "config", "train") + DEVICE_SIDE}
    if area == "sandbox":
      forbidden |= {m for m in reached if _area(m) in (
          "agent", "replay", "config", "train") + DEVICE_SIDE}
    if area in ("models", "learner"):
      forbidden |= {m for m in reached if _area(m) in HOST_WING + ("config", "train")}
    if area in HOST_WING:
      forbidden |= {m for m in reached if _area(m) in DEVICE_SIDE + ("train",)}
    if area != "train":
      forbidden |= {m for m in reached if _area(m) == "train"}
    out.extend(f"{module}: reaches {m}" for m in sorted(forbidden))
  return out


def area_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The cycles of the area graph (an area imports another if any of its modules does), each
  as the list of areas in it; empty when the graph is a DAG."""
  areas: dict[str, set[str]] = {}
  for module, deps in graph.items():
    areas.setdefault(_area(module), set()).update(
        _area(d) for d in deps if _area(d) != _area(module))
  # Tarjan's strongly connected components; a component of two or more areas is a cycle.
  index, low, on_stack, stack, out = {}, {}, set(), [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(areas.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(areas):
    if v not in index:
      visit(v)
  return out


_PROCESS_QUESTIONS = frozenset({"process_count", "process_index"})


def process_questions(source: str) -> list[str]:
  """`line: what` for each place in `source` that asks `jax` a process question directly
  (`jax.process_count()`, `jax.process_index()`, also under an alias or imported by name) or
  imports `multihost_utils`."""
  tree = ast.parse(source)
  jax_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names if a.name == "jax"}
  out = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and node.attr in _PROCESS_QUESTIONS
        and isinstance(node.value, ast.Name) and node.value.id in jax_names):
      out.append(f"{node.lineno}: jax.{node.attr}")
    elif isinstance(node, ast.ImportFrom) and node.module in ("jax", "jax.experimental"):
      out.extend(f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                 if a.name in _PROCESS_QUESTIONS | {"multihost_utils"})
    elif isinstance(node, ast.Import):
      out.extend(f"{node.lineno}: import {a.name}" for a in node.names
                 if a.name == "jax.experimental.multihost_utils")
  return sorted(out, key=lambda w: int(w.split(":")[0]))


def _sources():
  for path in sorted(PACKAGE.rglob("*.py")):
    rel = path.relative_to(PACKAGE)
    area = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    yield path, rel, area


class ImportRulesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graph = module_graph(PACKAGE)

  def test_sources_are_found(self):
    areas = {_area(m) for m in self.graph}
    for area in ("core", "parallel", "models", "learner", "agent", "replay", "sandbox", "tasks",
                 "train", "config"):
      self.assertIn(area, areas)
    self.assertIn("agentic_grpo.sandbox.pool", self.graph["agentic_grpo.sandbox"])
    self.assertIn("put_batch", PLACEMENT)
    self.assertIn("local_rows", PLACEMENT)

  def test_transitive_rules_hold(self):
    self.assertEmpty(reach_violations(self.graph))

  def test_no_package_cycle(self):
    self.assertEmpty(area_cycles(self.graph))

  def test_tasks_is_a_leaf(self):
    reached = set().union(*(reach(self.graph, m) for m in self.graph if _area(m) == "tasks"))
    self.assertLessEqual({_area(m) for m in reached}, {"tasks", "errors", "exit_codes",
                                                       "registry"})

  def test_only_train_device_touches_models_learner_and_placement(self):
    out = []
    for path, rel, area in _sources():
      if area != "train" or rel.name in ("device.py", "sampling.py"):
        continue
      modules, names = _imports(path)
      out.extend(f"{rel}: imports {m}" for m in modules if _area(m) in ("models", "learner")
                 or m == "agentic_grpo.parallel.batch")
      out.extend(f"{rel}: places batches with parallel.{n}" for n in sorted(names & PLACEMENT))
    self.assertEmpty(out)

  def test_only_parallel_asks_the_process_questions(self):
    found = {}
    for path, rel, area in _sources():
      if area != "parallel":
        where = process_questions(path.read_text())
        if where:
          found[str(rel)] = where
    self.assertEmpty(found, "ask parallel (process_count, is_primary, sync_processes, ...)")

  def test_a_planted_process_question_is_caught(self):
    source = ("import jax\nimport jax as j\nfrom jax.experimental import multihost_utils\n"
              "n = jax.process_count()\nk = j.process_index()\nd = jax.devices()\n"
              "from jax import process_index\nimport jax.experimental.multihost_utils\n")
    self.assertEqual([w.split(":")[0] for w in process_questions(source)],
                     ["3", "4", "5", "7", "8"])

  def test_the_parser_sees_the_import_forms(self):
    probe = PACKAGE / "train" / "evaluation.py"
    modules, _ = _imports(probe)
    self.assertIn("agentic_grpo.train.sampling", modules)
    self.assertIn("agentic_grpo.agent.loop", modules)
    _, names = _imports(PACKAGE / "train" / "device.py")
    self.assertIn("shard_batch", names)

  def test_planted_violations_are_caught(self):
    # A package on disk where `tasks/` reaches the sandbox only through a root module, a
    # `sandbox/` module imports `agent/`, and `agent/` and `tasks/` import each other.
    tmp = pathlib.Path(self.create_tempdir().full_path) / "agentic_grpo"
    files = {
        "__init__.py": "",
        "helper.py": "from agentic_grpo.sandbox import pool\n",
        "tasks/__init__.py": "",
        "tasks/leaf.py": "from agentic_grpo import helper\n",
        "sandbox/__init__.py": "",
        "sandbox/pool.py": "import agentic_grpo.agent.stages\n",
        "agent/__init__.py": "",
        "agent/stages.py": "from agentic_grpo.tasks import back\n",
        "tasks/back.py": "",
        "core/__init__.py": "",
        "core/math.py": "from agentic_grpo.tasks import back  # core reaches tasks\n",
    }
    for rel, text in files.items():
      (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
      (tmp / rel).write_text(text)
    graph = module_graph(tmp)
    self.assertEqual(graph["agentic_grpo.tasks.leaf"], {"agentic_grpo.helper"})
    found = reach_violations(graph)
    for want in ("agentic_grpo.tasks.leaf: reaches agentic_grpo.sandbox.pool",
                 "agentic_grpo.tasks.leaf: reaches agentic_grpo.agent.stages",
                 "agentic_grpo.sandbox.pool: reaches agentic_grpo.agent.stages",
                 "agentic_grpo.core.math: reaches agentic_grpo.tasks.back"):
      self.assertIn(want, found)
    self.assertNotIn("agentic_grpo.tasks.back: reaches agentic_grpo.agent", " ".join(found))
    self.assertEqual(area_cycles(graph), [["agent", "helper", "sandbox", "tasks"]])


if __name__ == "__main__":
  absltest.main()
