"""`Session`: one run's live objects and facts, and its checkpoints.

The phases (`warmstart`, `rl_phase`) read a `Session` and advance it through its methods: the
global step and phase (`advance`, `enter_rl`), counters (`count`), the latest evaluation and
the warm-start's per-task results (`record_eval`), an agreed stop (`agree_on_stop`,
`stop_agreed`). The session owns those fields: nothing outside this module writes them
(`tests/session_ownership_test.py`). It also holds the device side (`train.device.DeviceSide`),
the replay, the agent loop and its task streams, and the metrics writer. `checkpoint` writes
everything needed to resume exactly (learner state, replay, in-flight episodes, data position,
and the RL phase's unlogged metrics, which the RL phase hands to it as `rl_phase`); `restore`
reads it back. `periodic` is the one predicate of every periodic action (logging, evaluation,
checkpoints).
"""

import collections
import os
import time
from typing import Any, Callable, Optional

from absl import logging
import numpy as np

from agentic_grpo import replay as replay_lib
from agentic_grpo.agent import loop as loop_lib
from agentic_grpo.agent import streams
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import records
from agentic_grpo.core import losses as losses_lib
from agentic_grpo.train import components as components_lib
from agentic_grpo.train import device as device_lib
from agentic_grpo.train import metrics as metrics_lib
from agentic_grpo.train import preemption

# Unlimited training streams: warm-start tasks start at this index, RL tasks at 0.
_WARMSTART_OFFSET = 1 << 24
# Meta keys a checkpoint of an earlier version may lack, and their safe defaults: metric
# counters start afresh, no warm-start results (no paired gain), no unlogged RL rows.
_META_DEFAULTS = {"counters": {}, "warmstart_passed": None, "rl_phase": None}


def periodic(step: int, every: int, *, start: int = 0) -> bool:
  """True at every `every`-th step counted from `start` (never when `every` is 0)."""
  return bool(every) and (step - start) % every == 0


def make_replay(comp: components_lib.Components, row_granule: int = 1
                ) -> replay_lib.StagedReplay:
  """The staged replay of this process, from the `rl`, `correction` and `replay` sections
  (`rl.dynamic_sampling`: drop groups without signal; `rl.pass_rate_filter`: the band;
  `rl.pack_prefix`: shared-prefix packing of update rows, multiples of `row_granule`)."""
  cfg = comp.cfg
  return replay_lib.StagedReplay.from_sections(
      group_size=cfg.rl.group_size, num_stages=comp.num_stages, correction=cfg.correction,
      storage=cfg.replay,
      loss_additive=losses_lib.segments_additive(cfg.loss.ratio_level, cfg.loss.aggregation),
      stage_rewards=cfg.workflow.stage_rewards, drop_tied_groups=cfg.rl.dynamic_sampling,
      pass_rate_band=tuple(cfg.rl.pass_rate_filter) or None,
      prefix_packing=device_lib.prefix_packing(comp, row_granule))


class Session:
  """A run in progress (see module docstring).

  Args:
    comp: from `components.build`.
    workdir: the run's directory (checkpoints in `workdir/checkpoints`).
    stop_after: stop (after a checkpoint) once this global step is reached (tests of resume).
    stop: the signal watcher (`preemption.StopRequest`).
    transfer_guard: `jax.transfer_guard` level of the hot loop's device calls.

  Raises:
    ValueError: `rl.rows_per_update` or `warmstart.batch_size` not a multiple of the number of
      processes.
  """

  def __init__(self, comp: components_lib.Components, workdir: str, *,
               stop_after: Optional[int], stop: preemption.StopRequest,
               transfer_guard: str = "allow"):
    cfg = self.cfg = comp.cfg
    self.comp, self.coord, self.workdir = comp, comp.coord, workdir
    self.ws_steps = cfg.warmstart.steps
    self.total = cfg.warmstart.steps + cfg.rl.num_steps
    self.rl_rows = self.coord.share("rl.rows_per_update", cfg.rl.rows_per_update)
    self.ws_rows = self.coord.share("warmstart.batch_size", cfg.warmstart.batch_size)
    self._stop_after, self._stop = stop_after, stop
    # The end of the warm-start is kept through rotation (`checkpoint.keep_warmstart`): later
    # runs start from it (`experiments/warmstart_control.py`).
    self.keep_warmstart = cfg.checkpoint.keep_warmstart and self.ws_steps > 0
    self.ckpt = checkpointer.Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep,
        keep_steps=(self.ws_steps,) if self.keep_warmstart else ())
    self.device = device_lib.DeviceSide(comp, transfer_guard=transfer_guard)
    # Update batches have a multiple of this many rows (`replay.batching.row_buckets`).
    self.row_granule = self.device.row_granule(self.coord.process_count)
    self.replay = make_replay(comp, self.row_granule)
    get_train = lambda i: comp.tasks.task("train", i)
    shard = {"shard_index": self.coord.process_index, "shard_count": self.coord.process_count}
    self.rl_stream = streams.TaskStream(get_train, pool_size=cfg.task.train_size,
                                         seed=cfg.seed, **shard)
    self.ws_stream = streams.TaskStream(
        (lambda i: get_train(i + _WARMSTART_OFFSET)) if not cfg.task.train_size else get_train,
        pool_size=cfg.task.train_size, seed=cfg.seed + 1, **shard)
    self.agent = loop_lib.AgentLoop(
        workflow_factory=comp.workflow_factory, tokenizer=comp.tokenizer, replay=self.replay,
        stream=self.rl_stream, sample_fn=self.device.sampler(cfg.seed),
        tasks_per_batch=cfg.rl.tasks_per_batch, group_size=cfg.rl.group_size,
        batches_in_flight=cfg.rl.batches_in_flight, max_context=cfg.rl.buckets[-1],
        max_new_tokens=cfg.workflow.max_new_tokens, stage_rewards=cfg.workflow.stage_rewards,
        final_reward_lag=cfg.rl.final_reward_lag,
        reuse_prefixes=cfg.rl.reuse_prefix != "never")
    self.phase, self.step = "warmstart", 0  # step: global (warm-start steps, then RL updates)
    self.counters: collections.Counter = collections.Counter()
    # Greedy pass per held-out task at the end of the warm-start: the baseline of the paired gain.
    self.warm_passed: Optional[np.ndarray] = None
    self.last_eval: dict[str, Any] = {}
    self.rl_saved: Optional[dict[str, Any]] = None  # the RL phase's checkpointed host state
    self.preempted = False
    self.metrics: Optional[metrics_lib.MetricsWriter] = None
    self.t_start = time.time()

  def restore(self) -> None:
    """Resumes from the latest intact checkpoint, if any; opens the metrics writer.

    Raises:
      checkpoint_records.RecordError: the checkpoint lacks a record without a safe default.
    """
    if self.ckpt.latest_step() is not None:
      host, meta = self.device.restore(self.ckpt)
      meta = records.read(meta, "meta", required=("phase", "step"), defaults=_META_DEFAULTS)
      self.phase, self.step = meta["phase"], int(meta["step"])
      self.counters = collections.Counter(meta["counters"])
      if meta.get("warmstart_passed") is not None:
        self.warm_passed = np.asarray(meta["warmstart_passed"], bool)
      if self.phase == "rl":
        records.read(meta, "meta", required=("replay", "loop"))
        records.read(host, "host arrays", required=("replay", "loop"))
        self.replay.load_state_dict(host["replay"], meta["replay"])
        self.agent.load_state_dict(host["loop"], meta["loop"])
        self.rl_saved = meta.get("rl_phase")
      logging.info("resumed %s at global step %d", self.phase, self.step)
    self.metrics = metrics_lib.MetricsWriter(self.workdir, self.cfg, self.total, self.step)

  # ------------------------------------------------------- what the phases change, through here

  def advance(self) -> int:
    """Counts one global step (a warm-start step or an RL update); returns the new step."""
    self.step += 1
    return self.step

  def enter_rl(self) -> None:
    """Ends the warm-start: the phase becomes `rl` and the device side starts the RL phase's
    state (`DeviceSide.start_rl`: the KL reference, the RL optimizer)."""
    self.phase = "rl"
    self.device.start_rl()

  def record_eval(self, metrics: dict[str, Any], passed: Optional[np.ndarray] = None) -> None:
    """Keeps the latest evaluation's `metrics`; `passed` (`[num_heldout]` bool, greedy pass
    per held-out task), given at the end of the warm-start, is the paired gain's baseline."""
    self.last_eval = metrics
    if passed is not None:
      self.warm_passed = passed

  def count(self, name: str, n: int = 1) -> None:
    """Adds `n` to the checkpointed counter `name`."""
    self.counters[name] += n

  def agree_on_stop(self) -> None:
    """Every process learns whether any received SIGTERM / SIGINT (a collective)."""
    self.preempted = self.coord.any(self.stop_requested)

  def stop_agreed(self) -> None:
    """The processes agreed to stop (in the RL phase's own agreement)."""
    self.preempted = True

  def stopping(self) -> bool:
    """The run stops here: `stop_after` reached or a signal agreed on (`preempted`)."""
    return self.preempted or (self._stop_after is not None and self.step >= self._stop_after)

  @property
  def stop_requested(self) -> bool:
    """This process received SIGTERM / SIGINT (to be agreed on with the others)."""
    return self._stop.requested

  @property
  def signal_name(self) -> Optional[str]:
    return self._stop.signal_name

  def save(self, rl_phase: Optional[Callable[[], dict[str, Any]]] = None) -> None:
    """Writes a checkpoint at the current global step; `rl_phase` gives the RL phase's host
    state (`RLPhase.state_dict`, JSON-serialisable), called only in the RL phase."""
    meta = {"phase": self.phase, "step": self.step, "counters": dict(self.counters),
            "warmstart_passed": (None if self.warm_passed is None
                                 else [int(v) for v in self.warm_passed]),
            "rl_phase": None}  # every record of _META_DEFAULTS, in either phase
    host = {}
    if self.phase == "rl":
      host["replay"], meta["replay"] = self.replay.state_dict()
      host["loop"], meta["loop"] = self.agent.state_dict()
      meta["data_position"] = self.rl_stream.position
      if rl_phase is not None:
        meta["rl_phase"] = rl_phase()
    self.ckpt.save(self.step, self.device.checkpoint_tree(), host, meta)

  def checkpoint(self, force: bool = False,
                 rl_phase: Optional[Callable[[], dict[str, Any]]] = None) -> None:
    """Saves when `checkpoint.every` divides the step (or `force`), unless already saved;
    `rl_phase` as in `save`."""
    if (force or periodic(self.step, self.cfg.checkpoint.every)) and (
        self.ckpt.latest_step() != self.step):
      self.save(rl_phase)

  def close(self) -> None:
    if self.metrics is not None:
      self.metrics.close()
    self.agent.close()
