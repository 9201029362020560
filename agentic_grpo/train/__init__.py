"""Training runs: `run(config, workdir)` and the pieces it is made of.

* `run`: the run, top to bottom (build, restore, warm-start, RL, final eval, plot).
* `components`: `Components` and `build(cfg)` (model, tokenizer, tasks, sandbox pool,
  workflow factory, mesh, shardings, coordinator); startup checks.
* `device`: THE door between host and device (`DeviceSide`: sample / update / sft, state);
  numpy in, numpy out.
* `sampling`: `make_sample_fn` (the agent loop's sampler, static or continuous, that
  `DeviceSide.sampler` hands out) and `vocab_limit`.
* `coordination`: the only home of single- vs multi-process code (`Coordinator`).
* `session`: a run's live objects, checkpoints and the periodic-action predicate.
* `warmstart`, `rl_phase`: the two phases.
* `evaluation`: held-out pass@1 / pass@k, the paired gain and the headroom of RL.
* `metric_rows`: every key of a metrics row, the RL row from every process's numbers, the
  wall-clock keys (`WALL_CLOCK`), the end-of-run summary (`run_summary`, `summary_line`).
* `metrics`: writes the rows (`MetricsWriter`, W&B, transcripts, the learning-curve plot).
* `preemption`: SIGTERM / SIGINT to a checkpoint and `Preempted`.
"""

from agentic_grpo.train.components import build
from agentic_grpo.train.components import Components
from agentic_grpo.train.components import StartupCheckError
from agentic_grpo.train.device import NonFiniteUpdatesError
from agentic_grpo.train.device import rl_optimizer
from agentic_grpo.train.evaluation import evaluate
from agentic_grpo.train.evaluation import paired_gain
from agentic_grpo.train.evaluation import pass_at_k
from agentic_grpo.train.metric_rows import summary_line
from agentic_grpo.train.metrics import MetricsWriter
from agentic_grpo.train.metrics import plot_learning_curve
from agentic_grpo.train.preemption import Preempted
from agentic_grpo.train.run import run
from agentic_grpo.train.sampling import make_sample_fn
from agentic_grpo.train.warmstart import sft_batch

__all__ = ["build", "Components", "evaluate", "make_sample_fn", "MetricsWriter",
           "NonFiniteUpdatesError", "paired_gain", "pass_at_k", "plot_learning_curve",
           "Preempted", "rl_optimizer", "run", "sft_batch", "StartupCheckError", "summary_line"]
