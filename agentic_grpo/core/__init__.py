"""Pure, jit-able math of Agentic GRPO: advantages, losses, corrections, log-probs."""
