"""Tests for launch/train.py: console logging, one-line config errors, help, exit codes.

The command-line tests run launch/train.py as a subprocess; none of them trains.
"""

import logging
import os
import pathlib
import subprocess
import sys

from absl.testing import absltest

from agentic_grpo import config_help
from agentic_grpo import exit_codes
from agentic_grpo.checkpoint import run_lock
from launch import common_flags
from tests.fixtures import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _launch(*args: str) -> subprocess.CompletedProcess:
  env = xla_flags.child_env(PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


def _record(path: str, level: int) -> logging.LogRecord:
  return logging.LogRecord("absl", level, path, 1, "message", (), None)


class ConsoleLoggingTest(absltest.TestCase):

  def test_orbax_info_is_dropped_and_everything_else_passes(self):
    keep = common_flags.DropCheckpointInfo().filter
    orbax = os.path.join("site-packages", "orbax", "checkpoint", "checkpoint_manager.py")
    ours = os.path.join("agentic_grpo", "train", "run.py")
    self.assertFalse(keep(_record(orbax, logging.INFO)))
    self.assertTrue(keep(_record(orbax, logging.WARNING)))
    self.assertTrue(keep(_record(orbax, logging.ERROR)))
    self.assertTrue(keep(_record(ours, logging.INFO)))
    self.assertTrue(keep(_record(os.path.join("site-packages", "jax", "orbax_like.py"),
                                 logging.INFO)))


class ExitCodesTest(absltest.TestCase):

  def test_codes_are_distinct_and_the_peer_failure_code_is_parallels(self):
    from agentic_grpo import parallel  # pylint: disable=g-import-not-at-top
    codes = {k: v for k, v in vars(exit_codes).items() if k.isupper()}
    self.assertLen(set(codes.values()), len(codes), codes)
    self.assertEqual(exit_codes.PEER_FAILURE, parallel.EXIT_PEER_FAILURE)


class CommandLineTest(absltest.TestCase):

  def _assert_one_line_error(self, proc, code, pattern):
    self.assertEqual(proc.returncode, code, proc.stderr)
    lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
    self.assertLen(lines, 1, proc.stdout + proc.stderr)
    self.assertRegex(lines[0], pattern)
    self.assertNotIn("Traceback", proc.stderr)

  def test_misspelt_field_names_the_nearest(self):
    proc = _launch("--config.rl.grop_size=8")
    self._assert_one_line_error(proc, exit_codes.CONFIG_ERROR,
                                r"^error: unknown config field config\.rl\.grop_size; did you "
                                r"mean config\.rl\.group_size\?$")

  def test_out_of_range_value_is_one_line_before_any_config_dump(self):
    proc = _launch("--config.rl.group_size=1", "--workdir", self.create_tempdir().full_path)
    self._assert_one_line_error(proc, exit_codes.CONFIG_ERROR,
                                r"^error: config\.rl\.group_size must be >= 2, got 1$")
    proc = _launch("--config.rl.group_size=abc")
    self._assert_one_line_error(proc, exit_codes.CONFIG_ERROR,
                                r"^error: flag --config\.rl\.group_size=abc: .*abc")

  def test_help_points_to_show_config_which_lists_every_field(self):
    proc = _launch("--help")  # (absl's --help exits with 1)
    self.assertIn("--[no]show_config", proc.stdout)
    proc = _launch("--show_config", "--config.rl.group_size=4")
    self.assertEqual(proc.returncode, 0, proc.stderr)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("config.")]
    self.assertLen(lines, len(config_help.fields()))
    self.assertIn("config.rl.group_size = 4  (int, default 8) attempts per task (G), the GRPO "
                  "group.", lines)

  def test_workdir_held_by_another_run(self):
    workdir = self.create_tempdir().full_path
    with run_lock.WorkdirLock(workdir):
      proc = _launch("--workdir", workdir)
    self.assertEqual(proc.returncode, exit_codes.WORKDIR_LOCKED, proc.stderr)
    self.assertIn(f"pid {os.getpid()}", proc.stderr)
    self.assertIn("is in use by another run", proc.stderr)
    self.assertFalse(os.path.exists(os.path.join(workdir, "config.json")))


if __name__ == "__main__":
  absltest.main()
