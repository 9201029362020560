"""Agentic GRPO: staged, group-relative reinforcement learning for LLM coding agents in JAX."""

__version__ = "0.1.0"
