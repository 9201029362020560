"""Tests for launch/train.py's console logging."""

import logging
import os

from absl.testing import absltest

from launch import train as launch_train


def _record(path: str, level: int) -> logging.LogRecord:
  return logging.LogRecord("absl", level, path, 1, "message", (), None)


class ConsoleLoggingTest(absltest.TestCase):

  def test_orbax_info_is_dropped_and_everything_else_passes(self):
    keep = launch_train._DropCheckpointInfo().filter
    orbax = os.path.join("site-packages", "orbax", "checkpoint", "checkpoint_manager.py")
    ours = os.path.join("agentic_grpo", "train.py")
    self.assertFalse(keep(_record(orbax, logging.INFO)))
    self.assertTrue(keep(_record(orbax, logging.WARNING)))
    self.assertTrue(keep(_record(orbax, logging.ERROR)))
    self.assertTrue(keep(_record(ours, logging.INFO)))
    self.assertTrue(keep(_record(os.path.join("site-packages", "jax", "orbax_like.py"),
                                 logging.INFO)))


if __name__ == "__main__":
  absltest.main()
