"""Every `launch/` entry point imports in one process, next to the others.

absl flags live in one global registry: two entry points that define the same flag name at import
time cannot both be imported by one test process (or one notebook). Library code belongs in the
package; a `launch/` module holds only its flags and `main`.
"""

import importlib
import pathlib
import subprocess
import sys

from absl.testing import absltest

_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _entry_points() -> list[pathlib.Path]:
  """`launch/*.py` files run as programs (`python -m launch.NAME`)."""
  return sorted(p for p in (_ROOT / "launch").glob("*.py")
                if 'if __name__ == "__main__":' in p.read_text())


def _program_modules() -> list[str]:
  """Every module under `launch/`, `experiments/` and `benchmarks/`, as an import name."""
  return [f"{d}.{p.stem}" for d in ("launch", "experiments", "benchmarks")
          for p in sorted((_ROOT / d).glob("*.py")) if p.stem != "__init__"]


class LaunchImportsTest(absltest.TestCase):

  def test_all_entry_points_import_together(self):
    modules = [f"launch.{p.stem}" for p in _entry_points()]
    self.assertGreaterEqual(len(modules), 3, modules)
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n  importlib.import_module(m)\n"
    proc = subprocess.run([sys.executable, "-c", code, *modules], cwd=_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])

  def test_every_program_module_imports_next_to_the_others(self):
    # Tests, notebooks and other modules import experiment and benchmark modules for their
    # functions, next to the entry points: a module that defines a flag at import time which
    # another one defines too breaks whichever process imports both. Programs whose flag names
    # repeat another's define them under their `__main__` guard.
    # A benchmark worker whose optional third-party library (torch, tunix) is not installed is
    # left out; any other import error fails.
    modules = _program_modules()
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "  try:\n"
            "    importlib.import_module(m)\n"
            "  except ModuleNotFoundError as e:\n"
            "    if (e.name or '').split('.')[0] in ('agentic_grpo', 'launch', 'experiments',\n"
            "                                        'benchmarks'):\n"
            "      raise\n"
            "    continue\n"
            "  print('imported', m)\n")
    proc = subprocess.run([sys.executable, "-c", code, *modules], cwd=_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    imported = proc.stdout.split()[1::2]
    for must in ("launch.export", "experiments.warmstart_control", "experiments.ablation",
                 "benchmarks.run", "benchmarks.accelerator"):
      self.assertIn(must, imported)
    self.assertGreaterEqual(len(imported), 15, imported)

  def test_entry_points_define_main(self):
    for p in _entry_points():
      module = importlib.import_module(f"launch.{p.stem}")
      self.assertTrue(callable(getattr(module, "main", None)), p.name)

  def test_help_lists_the_shared_flags_an_entry_point_reads(self):
    # Shared flags live in launch/common_flags.py; absl's --help lists only the main module's
    # key flags, so each entry point declares the shared ones it reads.
    for p in _entry_points():
      text = p.read_text()
      used = [name for attr, name in (("WORKDIR", "workdir"), ("STEP", "step"),
                                      ("config_flag()", "config"))
              if f"common_flags.{attr}" in text]
      if not used:
        continue
      proc = subprocess.run([sys.executable, "-m", f"launch.{p.stem}", "--help"], cwd=_ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
      for name in used:
        self.assertRegex(proc.stdout + proc.stderr, rf"(?m)^\s+--{name}:", f"{p.name} --help")


if __name__ == "__main__":
  absltest.main()
