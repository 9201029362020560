"""Coding tasks: the `Task` record and its sources (synthetic, TFDS, HumanEval, MBPP JSONL)."""
