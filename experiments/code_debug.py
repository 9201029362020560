"""Agentic GRPO on code -> debug: write the function, see its results on the public examples, fix it.

`tiny_codegen` with the hypothesis stage replaced by a debug round after the code. Half of the
warm-start's reference episodes start from a near miss (`workflow.reference_fix_fraction`: a
wrong program one edit from the reference), show the debug stage its failures on the public
examples, and end with the fix; the others pass and `keep`. The observation is information the
model cannot get otherwise, so the debug stage is worth learning. Episodes are longer than
`tiny_codegen`'s (prompt, code, observation, fix), so the warm-start sequences and the largest
bucket grow. Measured in docs/learning.md.
"""

import ml_collections

from experiments import tiny_codegen


def get_config() -> ml_collections.ConfigDict:
  """`tiny_codegen` with stages code -> debug and reference episodes that show fixes."""
  c = tiny_codegen.get_config()
  c.workflow.stages = ("code", "debug")
  c.workflow.max_debug_rounds = 1
  c.workflow.reference_fix_fraction = 0.5
  c.warmstart.seq_len = 192
  c.rl.buckets = (128, 256)
  return c
