"""Agentic GRPO with the whole workflow: hypothesis -> code -> tests -> debug.

`tiny_codegen` with the tests stage (write new input->output tests; rewarded for tests that are
new and agree with the reference) and one debug round (see the code's results on public and own
tests, then revise it or `keep` it). Episodes are longer (up to about 250 byte tokens), so the
warm-start sequences and the largest bucket grow. A model that cannot yet write tests or read
feedback writes noise in those stages: on the tiny model this run lost held-out pass@1 in RL
(docs/learning.md); it is meant for models that start from a capable checkpoint.
"""

import ml_collections

from experiments import tiny_codegen


def get_config() -> ml_collections.ConfigDict:
  """`tiny_codegen` with all four stages."""
  c = tiny_codegen.get_config()
  c.workflow.stages = ("hypothesis", "code", "tests", "debug")
  c.workflow.max_debug_rounds = 1
  c.warmstart.seq_len = 192
  c.rl.buckets = (128, 256)
  return c
