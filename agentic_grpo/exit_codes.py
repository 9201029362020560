"""Exit codes of the entry points (`launch/*.py`), in one place.

Schedulers and wrapper scripts act on them: retry a preempted run, page a person for a config
error, never retry a run refused for its workdir. Values follow BSD `sysexits.h` where one fits.
Which exception ends with which code is `agentic_grpo.errors`' classification (each reported
error's class carries its code; anything else is a bug: a traceback and CRASH).

| code | name            | meaning                                                           |
|------|-----------------|-------------------------------------------------------------------|
| 0    | OK              | the run finished (or stopped at `--stop_after`)                   |
| 1    | CRASH           | an uncaught exception (Python's own code): a bug or a lost device |
| 65   | CONFIG_DRIFT    | resume refused: the config changes fields the saved state needs   |
| 73   | WORKDIR_LOCKED  | another live run holds the workdir                                |
| 74   | CHECKPOINT_DAMAGED | no intact checkpoint: none at all, none at the step asked for, |
|      |                 | or every one damaged                                              |
| 75   | PREEMPTED       | stopped by a signal after a checkpoint; rerun to resume (EX_TEMPFAIL) |
| 76   | PEER_FAILURE    | a peer process died or hung (multi-process runs); rerun to resume |
| 78   | CONFIG_ERROR    | an input mistake (`errors.InputError`): an invalid or unknown     |
|      |                 | config field, a bad flag, a missing or unusable data file, model  |
|      |                 | directory or checkpoint (EX_CONFIG); one line naming the fix      |
| 79   | NO_PROGRESS     | the run ended without doing its job (e.g. the RL phase stopped    |
|      |                 | early: no learning signal for `rl.max_idle_batches` batches)      |
| 80   | DOES_NOT_FIT    | `launch.plan`: the layout does not fit `--hbm_gib` per device     |
"""

OK = 0
CRASH = 1
CONFIG_DRIFT = 65  # EX_DATAERR
WORKDIR_LOCKED = 73  # EX_CANTCREAT
CHECKPOINT_DAMAGED = 74  # EX_IOERR
PREEMPTED = 75  # EX_TEMPFAIL: try again later
PEER_FAILURE = 76  # EX_PROTOCOL; = parallel.EXIT_PEER_FAILURE (parallel imports nothing)
CONFIG_ERROR = 78  # EX_CONFIG
NO_PROGRESS = 79
DOES_NOT_FIT = 80
