"""Host-side environment: sandboxed execution, the staged workflow and the agent loop."""
