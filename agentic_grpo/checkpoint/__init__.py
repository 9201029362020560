"""Checkpoints and the workdir: what a run writes to resume exactly, and the lock that keeps one
run per workdir.

Modules: `checkpointer` (`Checkpointer`: atomic Orbax saves of the learner state, each process's
host rows and the run's meta; restores that verify integrity and fit earlier layouts),
`host_rows` (per-process host state as rows of one global array), `integrity` (SHA-256
manifests), `layout` (saved trees fitted to today's), `records` (JSON records with safe
defaults) and `run_lock` (`WorkdirLock`). Host side: nothing here imports the model, the
learner or `train/`.
"""
