"""The Agentic GRPO phase (docs/design.md §3): update when the replay has rows, else step the
agent loop.

`agent.loop.AgentLoop` keeps `rl.batches_in_flight` episode batches in flight and feeds
`replay.StagedReplay`. Each iteration of `RLPhase.run` the processes agree (`Coordinator.agree`)
on one action:

* **update** when every process has its share of `rl.rows_per_update` rows ready, or when the
  agent loop is about to sample and some process has rows (the replay is flushed before each
  sample phase, so a stage's provisional update lands before that batch's next stage is
  sampled). A flush carries few rows: its batch has the next row bucket above them
  (`replay.batching.row_buckets`: powers of two up to `rows_per_update`), not a full update's
  rows, so that the learner does not spend most of it on padding rows;
* else **step the agent loop** (harvest a sandbox job, or sample a stage).

With `rl.dynamic_sampling` (DAPO's dynamic sampling, `config.RLSection`) the replay readies
no row from groups without signal, and the update waits for every process's full share of
rows in one length bucket (`Coordinator.agree(full_only=)`): no flush before a sample phase,
so the loop samples further batches meanwhile. Once `rl.dynamic_sampling_max_batches` episode
batches have finished while rows waited (`waited_batches`, checkpointed), the next update may
be partial, as without the option. The idle count of `rl.max_idle_batches` is then of the
batches finished since the last harvest that readied a row (without the option an update
follows every readied row, and resets it).

With stage rewards and corrections off (`experiments/outcome_grpo.py`) the same loop is
outcome-only GRPO. The phase also ends early on `rl.max_idle_batches` episode batches in a row
without learning signal, once `rl.episode_budget` training episodes have finished (equal-rollout
comparisons, `experiments/ablation.py`), or on a signal (`train.preemption`). `RLPhase.verdict` says when the
phase did not do what it was asked, and why.
"""

import collections
import time
from typing import Any, Optional

from absl import logging

from agentic_grpo.checkpoint import records
from agentic_grpo.replay import batching
from agentic_grpo.train import coordination
from agentic_grpo.train import device as device_lib
from agentic_grpo.train import evaluation
from agentic_grpo.train import metric_rows
from agentic_grpo.train import session as session_lib

# The share of training stages skipped for length above which a run without learning signal
# is blamed on `rl.buckets`.
_MOSTLY_SKIPPED = 0.5
# Replay counters of its group filters (`rl.dynamic_sampling`, `rl.pass_rate_filter`), logged as
# `loop/<name>` (present once the filter is on).
_GROUP_FILTER_COUNTS = ("dynamic_sampling_dropped_groups", "pass_rate_filtered_groups")


class RLPhase:
  """The RL loop over a `Session` (see module docstring).

  Host numbers since the last logged row (episode metrics, update metrics and batch stats,
  token count) and the idle-batch count are checkpointed (`state_dict`), so that a resumed run
  logs the same rows as one that was never stopped.
  """

  def __init__(self, s: session_lib.Session):
    self.s = s
    self.harvest_rows: list[dict[str, float]] = []
    self.updates: list[tuple[device_lib.Pending, dict[str, float]]] = []
    self.tokens = 0
    self.idle_batches = 0
    # Dynamic sampling: episode batches finished while rows waited for a full update.
    self.waited_batches = 0
    self.t_logged = time.time()
    # Seconds in the agent loop (sampling, waiting for the sandbox) since the last row: the
    # learner's idle share of the interval (`loop/learner_idle_fraction`; not checkpointed).
    self.agent_seconds = 0.0
    # Host seconds busy per part (learner, sampler, sandbox) since the last row: the
    # `pipeline/..._busy_fraction` metrics (`metrics.pipeline_times`; not checkpointed).
    self.busy: collections.Counter = collections.Counter()
    self.ended_without_signal = False
    self.updates_run = 0
    # Finished training episodes of this process at the last row (`rl/episodes_per_s`; from
    # the restored loop counters after a resume), and the RL phase's wall seconds so far: the
    # rows' intervals, evaluation excluded (`rl/seconds`; checkpointed).
    self.episodes_logged = s.agent.counters["episodes"]
    self.rl_seconds = 0.0
    self.last_update: Optional[dict[str, Any]] = None
    if s.rl_saved:
      self._load(s.rl_saved)

  # ------------------------------------------------------------------------------- the loop

  def run(self) -> None:
    """Runs RL updates until `rl.num_steps` (or a stop), then logs and evaluates the end."""
    s = self.s
    if s.phase != "rl":
      return
    budget = s.cfg.rl.episode_budget
    while s.step < s.total and not s.stopping():
      if budget and s.coord.total(s.agent.counters["episodes"]) >= budget:
        break
      agreed = self._agree()
      if agreed.stop:
        s.stop_agreed()
        break
      if s.cfg.rl.max_idle_batches and agreed.idle_batches >= s.cfg.rl.max_idle_batches:
        self._end_without_signal(agreed.idle_batches)
        break
      if agreed.update:
        self._update(agreed.buckets,
                     batching.row_bucket(agreed.rows, s.rl_rows, s.row_granule),
                     partial=agreed.rows < s.rl_rows)
      else:
        self._agent_step()
    if not s.stopping():
      self._log(final=True)
      s.metrics.progress(s.step, "rl")  # the bar shows the final evaluation's pass@1

  def _agree(self) -> coordination.Agreement:
    s = self.s
    ready = s.replay.num_ready
    want = batching.bucket_for(s.replay.ready_lengths()[0], s.cfg.rl.buckets) if ready else 0
    return s.coord.agree(ready=ready, rows=s.rl_rows, want_bucket=want,
                         fits=s.replay.ready_fitting(s.cfg.rl.buckets), buckets=s.cfg.rl.buckets,
                         sampling=s.agent.phase == "sample", idle_batches=self.idle_batches,
                         stop=s.stop_requested, full_only=self._waits_for_full())

  def _waits_for_full(self) -> bool:
    """Dynamic sampling, its cap not reached: this process waits for a full update."""
    rl = self.s.cfg.rl
    return rl.dynamic_sampling and (not rl.dynamic_sampling_max_batches
                                    or self.waited_batches < rl.dynamic_sampling_max_batches)

  def _update(self, buckets: tuple[int, ...], rows: int, partial: bool = False) -> None:
    """One policy update on the oldest ready rows (or padding where a process has none), in a
    batch of `rows` rows (the agreed row bucket: a flush before a sample phase carries few;
    `partial`: fewer than a full update's)."""
    s = self.s
    t0 = time.time()
    batch = s.replay.take(rows, s.step - s.ws_steps, buckets) if s.replay.num_ready else None
    if not s.coord.any(batch is not None):
      self.busy["learner"] += time.time() - t0
      return  # no process has a row with a loss token
    stats = batch.stats if batch is not None else {
        "rows": 0, "loss_tokens": 0, "padding_fraction": 1.0, "row_slots": rows,
        "token_slots": rows * buckets[0]}
    pending = s.device.update(batch.update if batch is not None else None, rows, buckets)
    if pending.row_slots is not None and stats["row_slots"]:  # the rows it computed
      length = stats["token_slots"] // stats["row_slots"]
      stats = dict(stats, row_slots=pending.row_slots,
                   token_slots=pending.row_slots * length,
                   padding_fraction=1.0 - stats["loss_tokens"] / (pending.row_slots * length))
    self.busy["learner"] += time.time() - t0
    s.advance()
    self.updates_run += 1
    self.idle_batches = 0
    if s.cfg.rl.dynamic_sampling:
      self.waited_batches = 0
      s.count("dynamic_sampling_partial_updates", int(partial and s.coord.is_primary))
    self.updates.append((pending, {k: float(v) for k, v in sorted(stats.items())}))
    self.tokens += pending.tokens
    eval_due = session_lib.periodic(s.step, s.cfg.eval.every, start=s.ws_steps)
    if (session_lib.periodic(s.step, s.cfg.log.every) or eval_due) and s.step < s.total:
      self._log(final=False)
    if session_lib.periodic(s.step, s.cfg.log.transcripts_every, start=s.ws_steps):
      s.metrics.write_transcripts(s.step, s.agent.transcripts(s.cfg.log.transcripts))
    s.metrics.progress(s.step, "rl")
    if s.step < s.total:
      s.checkpoint(rl_phase=self.state_dict)

  def _agent_step(self) -> None:
    s = self.s
    t0 = time.time()
    part = "sampler" if s.agent.phase == "sample" else "sandbox"
    if part == "sampler":
      s.device.wait()  # the sampler needs the updated parameters: the learner's time
      self.busy["learner"] += time.time() - t0
    t1 = time.time()
    readied = self._readied()
    harvested = s.agent.step(s.device.policy, s.step - s.ws_steps)
    self.busy[part] += time.time() - t1
    self.agent_seconds += time.time() - t0
    if harvested:
      self.harvest_rows.append(harvested)
      if s.cfg.rl.dynamic_sampling:
        self._count_waiting("reward/final" in harvested, self._readied() > readied)
      elif "reward/final" in harvested:
        self.idle_batches += 1

  def _readied(self) -> int:
    """Items the replay has readied so far, less those it withdrew unused
    (`correction.supersede_queued`): a harvest that readied and withdrew the same rows readied
    nothing."""
    counters = self.s.replay.counters
    return (counters.get("provisional_items", 0) + counters.get("correction_items", 0)
            - counters.get("superseded_provisional_items", 0))

  def _count_waiting(self, finished: bool, readied: bool) -> None:
    """Dynamic sampling's counts after a harvest (module docstring): idle batches, and
    finished batches while rows wait for a full update."""
    if readied:
      self.idle_batches = 0
    if finished:
      self.idle_batches += int(not readied)
      self.waited_batches += int(self.s.replay.num_ready > 0)

  def _end_without_signal(self, idle: int) -> None:
    s = self.s
    logging.warning("%d episode batches in a row gave no learning signal on any process "
                    "(%s); ending the RL phase at step %d", idle, self._idle_cause(), s.step)
    s.count("rl_ended_without_signal", int(s.coord.is_primary))
    self.ended_without_signal = True

  # ------------------------------------------------------------------------------- logging

  def _log(self, final: bool) -> None:
    """Writes one RL row from every process's numbers; evaluates when due (or `final`)."""
    s = self.s
    # Update metrics stay on device until here, so that host work overlaps the updates.
    t0 = time.time()
    updates = s.device.fetch([p for p, _ in self.updates], step=s.step)
    self.busy["learner"] += time.time() - t0
    if updates:
      self.last_update = updates[-1]
    s.counters.update(s.agent.pop_counts())  # errors and sandbox verdicts of harvested jobs
    local = {"harvest": metric_rows.values_by_key(self.harvest_rows),
             "counts": dict(s.counters),
             "loop": {**s.agent.counters, **{k: v for k, v in s.replay.counters.items()
                                            if k in _GROUP_FILTER_COUNTS}},
             "position": s.rl_stream.position, "epoch": s.rl_stream.epoch(),
             "stats": [stats for _, stats in self.updates],
             "final_latency": s.agent.final_latency(),
             "replay": {k: s.replay.counters.get(k, 0) for k in metric_rows.REPLAY_TOTALS}}
    episodes = s.coord.total(s.agent.counters["episodes"] - self.episodes_logged)
    now = time.time()
    self.rl_seconds += now - self.t_logged
    row = {"step": s.step, "phase": "rl", "seconds": now - s.t_start,
           "tokens_per_s": self.tokens / max(now - self.t_logged, 1e-9),
           "rl/episodes_per_s": episodes / max(now - self.t_logged, 1e-9),
           "loop/learner_idle_fraction": min(
               1.0, self.agent_seconds / max(now - self.t_logged, 1e-9))}
    row.update(metric_rows.pipeline_times(self.busy, now - self.t_logged))
    row.update(s.agent.pop_final_seconds())  # this process's clock
    row.update(metric_rows.rl_row(s.coord.gather(local), updates))
    if final:
      row.update(metric_rows.rl_phase_totals(row, self.rl_seconds, s.cfg.rl.group_size))
    if final or session_lib.periodic(s.step, s.cfg.eval.every, start=s.ws_steps):
      s.record_eval(evaluation.evaluate(s.comp, s.agent, s.device.policy, sampled=final,
                                        baseline=s.warm_passed)[0])
      row.update(s.last_eval)
    s.metrics.write(row)
    self.updates.clear()
    self.harvest_rows.clear()
    self.tokens, self.t_logged, self.agent_seconds = 0, time.time(), 0.0
    self.episodes_logged = s.agent.counters["episodes"]
    self.busy.clear()

  # ------------------------------------------------------------------------------- state

  def state_dict(self) -> dict[str, Any]:
    """The unlogged host numbers, the idle count and the RL phase's wall seconds so far
    (those of the interval since the last row included), JSON-serialisable (checkpoint
    meta)."""
    updates = self.s.device.fetch([p for p, _ in self.updates])
    return {"harvest_rows": self.harvest_rows, "idle_batches": self.idle_batches,
            "waited_batches": self.waited_batches, "tokens": self.tokens,
            "updates": [{"metrics": {k: float(v) for k, v in m.items()}, "stats": stats}
                        for m, (_, stats) in zip(updates, self.updates)],
            "rl_seconds": self.rl_seconds + (time.time() - self.t_logged)}

  def _load(self, saved: dict[str, Any]) -> None:
    # Unlogged rows and the idle count: a checkpoint of an earlier version without one starts
    # it afresh (logged metrics only; at most `rl.max_idle_batches` more idle batches).
    saved = records.read(saved, "meta.rl_phase", defaults={
        "harvest_rows": [], "idle_batches": 0, "waited_batches": 0, "tokens": 0,
        "updates": []})
    self.harvest_rows = [dict(r) for r in saved["harvest_rows"]]
    self.rl_seconds = float(saved.get("rl_seconds", 0.0))  # wall clock: no record to fill in
    self.idle_batches = int(saved["idle_batches"])
    self.waited_batches = int(saved["waited_batches"])
    self.tokens = int(saved["tokens"])
    self.updates = [(device_lib.Pending(u["metrics"], 0), dict(u["stats"]))
                    for u in saved["updates"]]

  # ------------------------------------------------------------------------------- verdict

  def _idle_cause(self) -> str:
    """Why batches gave no learning signal: stages skipped for length, or tied rewards (with
    the counts of this process's training stream: evaluation's samples are not among them)."""
    agent, cfg = self.s.agent, self.s.cfg
    sampled = agent.rng_counter * agent.num_rows  # training stage rows sampled (or skipped)
    skipped = agent.counters.get("skipped_long_contexts", 0)
    if sampled and skipped >= _MOSTLY_SKIPPED * sampled:
      return (f"{skipped} of {sampled} training stage samples were skipped: contexts longer "
              f"than the largest bucket (rl.buckets[-1] - workflow.max_new_tokens = "
              f"{cfg.rl.buckets[-1] - cfg.workflow.max_new_tokens} tokens): raise "
              f"--config.rl.buckets")
    groups = agent.counters.get("episodes", 0) // max(agent.G, 1)
    tied = agent.counters.get("tied_groups_final", 0)
    counts = (f"{tied} of the {groups} groups finished had equal final rewards across their "
              f"{agent.G} attempts" if groups else "no group has finished yet")
    if cfg.rl.pass_rate_filter:
      return (f"every group's rewards tied (all advantages 0) or its pass rate lay outside "
              f"rl.pass_rate_filter={tuple(cfg.rl.pass_rate_filter)}; {counts}")
    return (f"every group's rewards tied: all advantages 0 ({counts}); a task set the policy "
            f"always or never solves gives no signal: choose tasks of middling difficulty, "
            f"warm-start longer (--config.warmstart.steps; a policy that never solves a task "
            f"has nothing to reinforce) or raise --config.rl.group_size; "
            f"--config.rl.max_idle_batches sets how many such batches end the phase")

  def verdict(self) -> Optional[str]:
    """Why the RL phase did not do what it was asked, or None (also None when stopped)."""
    s = self.s
    rl_steps = s.step - s.ws_steps
    if s.stopping() or not s.cfg.rl.num_steps:
      return None
    if self.ended_without_signal:
      return (f"the RL phase ended early at global step {s.step} of {s.total} ({rl_steps} of "
              f"{s.cfg.rl.num_steps} updates): no learning signal for "
              f"rl.max_idle_batches={s.cfg.rl.max_idle_batches} episode batches in a row; "
              f"{self._idle_cause()}")
    skipped = int(self.last_update["nonfinite_total"]) if self.last_update else 0
    if rl_steps > 0 and skipped >= rl_steps:
      return (f"every RL update ({rl_steps}) was skipped as non-finite: the run trained on "
              f"nothing; look for non-finite advantages, log-probs or parameters, or lower "
              f"the learning rate")
    return None


def run_phase(s: session_lib.Session) -> RLPhase:
  """Runs (or resumes) the RL phase of `s`; returns it for its `verdict`."""
  phase = RLPhase(s)
  phase.run()
  return phase
