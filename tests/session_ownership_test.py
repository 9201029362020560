"""The run's `Session` owns its fields: only `train/session.py` writes them.

The phases (`train/warmstart.py`, `train/rl_phase.py`) and the run (`train/run.py`) change a
session through its methods (`advance`, `enter_rl`, `record_eval`, `count`, `agree_on_stop`,
`stop_agreed`), and the session refers to no phase: the RL phase hands its checkpointed state
to `Session.checkpoint(rl_phase=...)`. Read from the source with `ast`: a write is an
assignment, augmented assignment or deletion of an attribute of a session, or of an item of
one of its attributes (`s.counters["x"] += 1`).
"""

import ast
import pathlib

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parent.parent
OWNER = ROOT / "agentic_grpo" / "train" / "session.py"


def _session_names(tree: ast.AST) -> set[str]:
  """Names that hold a session: parameters annotated `...Session`, and names assigned from a
  `...Session(...)` call."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
        if a.annotation is not None and ast.unparse(a.annotation).endswith("Session"):
          names.add(a.arg)
    elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and ast.unparse(
        node.value.func).endswith("Session"):
      names.update(t.id for t in node.targets if isinstance(t, ast.Name))
  return names


def _holds_session(node: ast.AST, names: set[str]) -> bool:
  """`node` is a session: a session name, or `self.s` (a phase's session)."""
  if isinstance(node, ast.Name):
    return node.id in names
  return (isinstance(node, ast.Attribute) and node.attr == "s"
          and isinstance(node.value, ast.Name) and node.value.id == "self")


def session_writes(source: str) -> list[str]:
  """`line: target` for each write into a session's fields in `source`."""
  tree = ast.parse(source)
  names = _session_names(tree)
  targets = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign):
      targets.extend(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
      targets.append(node.target)
    elif isinstance(node, ast.Delete):
      targets.extend(node.targets)
  out = []
  for target in targets:
    for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
      field = t.value if isinstance(t, ast.Subscript) else t
      if isinstance(field, ast.Attribute) and _holds_session(field.value, names):
        out.append(f"{t.lineno}: {ast.unparse(t)}")
  return out


class SessionOwnershipTest(absltest.TestCase):

  def test_only_the_session_writes_its_fields(self):
    found = {}
    for path in sorted((ROOT / "agentic_grpo").rglob("*.py")) + sorted(
        (ROOT / "experiments").rglob("*.py")):
      if path == OWNER:
        continue
      writes = session_writes(path.read_text())
      if writes:
        found[str(path.relative_to(ROOT))] = writes
    self.assertEmpty(found, "change a Session through its methods")

  def test_the_phases_are_seen(self):
    # The scan knows the phases' session names (else it would pass by seeing nothing).
    for name in ("warmstart.py", "rl_phase.py", "run.py"):
      tree = ast.parse((ROOT / "agentic_grpo" / "train" / name).read_text())
      self.assertTrue(_session_names(tree) or "self.s" in ast.unparse(tree), name)

  def test_the_session_refers_to_no_phase(self):
    tree = ast.parse(OWNER.read_text())
    imported = {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}
    for phase in ("agentic_grpo.train.rl_phase", "agentic_grpo.train.warmstart"):
      self.assertNotIn(phase, imported)
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    self.assertNotIn("rl_state", attributes)  # no live reference to the RL phase

  def test_planted_writes_are_caught(self):
    source = ("def phase(s: session_lib.Session, other):\n"
              "  s.step += 1\n"
              "  s.last_eval, s.warm_passed = {}, None\n"
              "  s.counters['x'] += 1\n"
              "  other.step = 3\n"
              "  s.advance()\n"
              "class P:\n"
              "  def run(self):\n"
              "    self.s.phase = 'rl'\n"
              "    self.t = 0\n"
              "def main():\n"
              "  sess = session_lib.Session(comp)\n"
              "  sess.preempted = True\n")
    self.assertEqual([w.split(":")[0] for w in sorted(session_writes(source),
                                                      key=lambda w: int(w.split(":")[0]))],
                     ["2", "3", "3", "4", "9", "13"])


if __name__ == "__main__":
  absltest.main()
