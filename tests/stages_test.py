"""Tests for agentic_grpo.agent.stages: the stage registry's entries."""

from absl.testing import absltest

from agentic_grpo.agent import pieces  # pylint: disable=unused-import (registers `pieces`)
from agentic_grpo.agent import stages


class StageRegistryTest(absltest.TestCase):

  def test_registered_kinds_in_workflow_order(self):
    # `pieces` (agent.pieces, imported by the workflow) registers after the built-in kinds.
    self.assertEqual(stages.STAGES.names(), ("hypothesis", "code", "tests", "debug", "pieces"))
    for kind in stages.STAGES.names():
      self.assertEqual(stages.STAGES.get(kind).kind, kind)


if __name__ == "__main__":
  absltest.main()
