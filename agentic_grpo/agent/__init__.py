"""Host-side environment: the staged workflow, its rewards and the agent loop (programs run in
`agentic_grpo.sandbox`)."""
