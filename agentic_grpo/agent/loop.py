"""The host-side agent loop: staged episodes in flight, feeding the staged replay.

`AgentLoop` runs episode batches of `B` tasks x `G` attempts through a `workflow.Workflow`, stage
by stage. For each stage it builds every episode's context *as tokens* (the task prompt, earlier
openings and the model's own earlier outputs, environment observations), samples the stage
output with the newest published params (recording their policy version and the behaviour
log-probs), hands the decoded text to the workflow for parsing and scoring in the sandbox, and
feeds the scored segments to `replay.StagedReplay` (`add_stage`, then `finish` with the final
rewards). What the sampler generated is what the learner trains on: generated token ids are
kept, never re-tokenised from text.

Pipelining. `batches_in_flight` episode batches are in flight. The loop is a small state machine
whose every call to `step` does one action on one batch, round-robin:

* `harvest`: wait for that batch's sandbox job (scoring of the stage it sampled last time, plus
  the next stage's opening) and feed the results to the replay; a batch whose last stage this
  scored leaves its slot, which takes a new batch from the task stream at once; then feed the
  replay every final reward that is due (below);
* `sample`: sample that batch's next stage on the device and submit its sandbox job to a
  background thread.

Final rewards arrive late. A batch's final judgement (its last code on the hidden tests, and a
remote judge's `workflow.final_reward_delay_s`) is a job of its own, queued as soon as its last
stage is scored, so a slow judge holds no batch slot: the loop goes on sampling and scoring
the next batches, and the learner on updating from their stages. Its result is fed to the
replay (`StagedReplay.finish`: the corrections, or outcome-only rows) at the harvest
`final_reward_lag` harvests after its last stage's, waiting for the judge there if it has not
finished (`final/wait_s`). Counting in harvests rather than seconds keeps a run deterministic,
and processes in lock-step, whatever the judge's speed; the rows it readies then meet the
importance ratio and the staleness bound against the policy version of their update like any
other. Each landing reports `final/latency_versions` (policy versions from the last stage's
sampling to the final reward in the replay, with the harvest's metrics) and, on the host's
clock, its seconds from the last stage scored and the seconds the loop waited for it
(`pop_final_seconds`, `final_latency`). With `final_reward_lag=0` the final reward lands right after its last stage,
in the same harvest (the loop waits for the whole judgement).

Between calls the trainer runs learner updates on whatever the replay made ready, so (i) the
provisional update of a stage is applied before that batch's next stage is sampled, and (ii) the
sandbox work of one batch overlaps with sampling and learning on the others. Jobs are harvested
in a fixed order, so a run is deterministic given its seed; the loop's whole state (in-flight
episodes as generated tokens, batches awaiting their final reward, RNG counter, task-stream
position) round-trips through `state_dict`, and restoring replays the workflow on the recorded
outputs, resubmitting any job that was in flight and every pending final judgement.

Multi-process runs: every process runs its own `AgentLoop` on its own shard of the task stream
(`streams.TaskStream(shard_index=, shard_count=)`), with its own sandbox work and its own
replay. The loop takes no decision from other processes' state, but its `sample_fn` is a
collective there (one sampler program over every process's rows), so all processes must call
`step` (and `run_episodes`) in lock-step: the same number of times, in the same order. The
state machine (phase, cursor, harvest count, when each final reward lands) advances identically
everywhere, whatever the sandbox results and however long each process's judge takes, so a
trainer that agrees on when to update keeps them in step.

Robustness: parser and reward exceptions are caught by the workflow and counted; sandbox
verdicts (timeouts, memory, crashes) are counted per batch (`streams.CountingPool` around each
batch's workflow's pool) and taken at harvest (`pop_counts`); a sandbox job that
fails as a whole abandons its batch (its remaining stages are reported as skipped and its final
rewards as 0, which nets out its provisional updates) and is counted. None of these stops the run.
"""

import collections
import concurrent.futures
import json
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
import numpy as np

from agentic_grpo import replay as replay_lib
from agentic_grpo.agent import inflight
from agentic_grpo.agent import streams
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.checkpoint import records
from agentic_grpo.core import batched
from agentic_grpo.tasks import task as task_lib

# `sample_fn(params, prompts [N, P] int32 right-padded, prompt_lengths [N], rng_counter, greedy)
#   -> (tokens [N, M] int32, lengths [N] int32, logprobs [N, M] float32)`. A loop built with
# `reuse_prefixes` also passes, for training samples, the keywords `prefix_keys` ([N] keys or
# None), `save_keys` ([N]) and `params_version` (int), and takes a fourth value back: the
# call's counts (`{name: int}`, added to `AgentLoop.counters`).
SampleFn = Callable[[Any, np.ndarray, np.ndarray, int, bool], tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray]]

# The keys of `AgentLoop.state_dict`'s meta, all required to restore.
_STATE_KEYS = ("slots", "cursor", "phase", "rng_counter", "next_batch_id", "next_episode_id",
               "next_group_id", "stream_position", "counters")
# Keys an earlier version did not write (it had no batch awaiting a final reward).
_STATE_DEFAULTS = {"finals": [], "harvests": 0, "final_latency_versions": []}
# The most recent final-reward latencies kept for the run's mean and p95 (`final_latency`).
_LATENCY_HISTORY = 4096


class AgentLoop:
  """Runs staged episodes for the trainer and feeds a `StagedReplay`. See module docstring.

  Args:
    workflow_factory: `() -> Workflow` (one per batch in flight; they share the sandbox pool).
    tokenizer: `encode(str) -> list[int]`, `decode(ids) -> str`.
    replay: the `StagedReplay` to feed.
    stream: the training `streams.TaskStream`.
    sample_fn: see `SampleFn`.
    tasks_per_batch: B.
    group_size: G.
    batches_in_flight: K >= 1.
    max_context: longest row (context + generated tokens) an episode may reach; a stage whose
      context is longer than `max_context - max_new_tokens` is not sampled (empty output,
      reward 0, not trained on).
    max_new_tokens: tokens generated per stage at most (the sampler's setting).
    stage_rewards: False marks every stage valid for the replay regardless of the workflow's
      `valid` (outcome-only GRPO: stage rewards unused, every segment gets the outcome).
    final_reward_lag: harvests from a batch's last stage being scored to its final reward
      landing in the replay (>= 0; module docstring).
    reuse_prefixes: the sampler reuses saved conversation prefixes (`SampleFn`): each training
      stage's rows but the last's are saved under `(episode id, stage)` and stage k > 0 names
      `(episode id, k - 1)` as the prefix its context continues (rows not sampled name and
      save none), with the stage's policy version. False: `sample_fn` is called with the
      five positional arguments only.
    executor: runs sandbox jobs (default: a thread pool of K threads).

  Raises:
    ValueError: a count below its minimum, `max_context <= max_new_tokens`, or a replay of
      another group size or number of stages.
  """

  def __init__(self, *, workflow_factory: Callable[[], workflow_lib.Workflow], tokenizer,
               replay: replay_lib.StagedReplay, stream: streams.TaskStream, sample_fn: SampleFn,
               tasks_per_batch: int, group_size: int, batches_in_flight: int,
               max_context: int, max_new_tokens: int, stage_rewards: bool = True,
               final_reward_lag: int = 0, reuse_prefixes: bool = False,
               executor: Optional[concurrent.futures.Executor] = None):
    for name, v, lo in (("tasks_per_batch", tasks_per_batch, 1), ("group_size", group_size, 1),
                        ("batches_in_flight", batches_in_flight, 1),
                        ("max_new_tokens", max_new_tokens, 1),
                        ("final_reward_lag", final_reward_lag, 0)):
      if v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if max_context <= max_new_tokens:
      raise ValueError(f"max_context ({max_context}) must exceed max_new_tokens "
                       f"({max_new_tokens})")
    if replay.group_size != group_size:
      raise ValueError(f"replay.group_size ({replay.group_size}) must equal group_size "
                       f"({group_size})")
    self._workflow_factory = workflow_factory
    self.tokenizer = tokenizer
    self.replay = replay
    self.stream = stream
    self.sample_fn = sample_fn
    self.B, self.G, self.K = int(tasks_per_batch), int(group_size), int(batches_in_flight)
    self.max_context = int(max_context)
    self.max_new_tokens = int(max_new_tokens)
    self.stage_rewards = bool(stage_rewards)
    self.final_lag = int(final_reward_lag)
    self.reuse_prefixes = bool(reuse_prefixes)
    self.num_stages = workflow_factory().num_stages
    if replay.num_stages != self.num_stages:
      raise ValueError(f"replay.num_stages ({replay.num_stages}) must equal the workflow's "
                       f"{self.num_stages} stages")
    self._own_executor = executor is None
    self._executor = executor or concurrent.futures.ThreadPoolExecutor(
        max_workers=self.K, thread_name_prefix="agent-loop")
    # Final judgements: one thread per job that can be queued at once (one per slot whose last
    # stage is being scored, and those scored but not yet due), so none waits for a thread.
    self._final_executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=self.K + self.final_lag + 1, thread_name_prefix="agent-loop-final")
    self.slots: list[Optional[inflight.InFlightBatch]] = [None] * self.K
    # Batches whose last stage is scored, awaiting their final reward, in the order they are due.
    self.finals: list[inflight.InFlightBatch] = []
    self.harvests = 0  # harvest phases done (the clock of `final_reward_lag`)
    # The latest final rewards' latencies (`final_latency`): seconds (since this process
    # started: wall-clock, not checkpointed) and policy versions (checkpointed).
    self.latency: dict[str, list[float]] = {"seconds": [], "versions": []}
    # Since the last `pop_final_seconds`: per final reward landed, its latency and wait (s).
    self._final_seconds: dict[str, list[float]] = {"latency": [], "wait": []}
    self.cursor = 0
    self.phase = "harvest"
    self.rng_counter = 0
    self.next_batch_id = 0
    self.next_episode_id = 0
    self.next_group_id = 0
    self.counters: collections.Counter = collections.Counter()
    self._errors: collections.Counter = collections.Counter()
    self._verdicts: collections.Counter = collections.Counter()
    # The newest finished training batch: `(episodes, FinalResult, policy version of its last
    # stage)`, for `transcripts` (not checkpointed: None until a batch finishes).
    self.last_finished: Optional[tuple] = None

  @property
  def num_rows(self) -> int:
    """N = B * G episodes per batch (the sampler's batch)."""
    return self.B * self.G

  # ------------------------------------------------------------------------------- stepping

  def step(self, params, version: int) -> dict[str, float]:
    """Does the next action (`self.phase`) on the batch at `self.cursor`; returns metrics.

    `harvest` may block on a sandbox job, and on a final judgement that is due; `sample` runs
    the sampler with `params`, recording `version` as the behaviour policy version of the
    stage (a final reward landing in a harvest counts its latency up to `version`).
    """
    if self.phase == "harvest":
      metrics = {}
      slot = self.slots[self.cursor]
      if slot is not None and slot.job is not None:
        metrics = self._harvest(slot)
      while self.finals and self.finals[0].final_due <= self.harvests:
        metrics.update(self._land_final(self.finals.pop(0), version))
      self.harvests += 1
      if slot is None or slot.done:
        self.slots[self.cursor] = self._new_batch()
      self.phase = "sample"
      return metrics
    slot = self.slots[self.cursor]
    self._sample_and_submit(slot, params, version)
    self.cursor = (self.cursor + 1) % self.K
    self.phase = "harvest"
    return {}

  def _new_batch(self) -> inflight.InFlightBatch:
    positions, tasks = self.stream.take(self.B)
    logging.vlog(1, "agent loop: shard %d batch %d takes stream positions %s task ids %s",
                 self.stream.shard_index, self.next_batch_id, json.dumps(positions),
                 json.dumps([t.task_id for t in tasks]))
    return self._start_batch(self.next_batch_id, positions, tasks, None)

  def _start_batch(self, batch_id, positions, tasks, ids) -> inflight.InFlightBatch:
    """Registers a batch's groups (fresh ids unless restoring) and opens its first stage."""
    if ids is None:
      group_ids = list(range(self.next_group_id, self.next_group_id + self.B))
      episode_ids = list(range(self.next_episode_id, self.next_episode_id + self.num_rows))
      self.next_group_id += self.B
      self.next_episode_id += self.num_rows
      self.next_batch_id += 1
      for b, g in enumerate(group_ids):
        self.replay.add_group(g, episode_ids[b * self.G:(b + 1) * self.G])
    else:
      group_ids, episode_ids = ids
    wf = self._workflow_factory()
    # This batch's sandbox verdicts, counted apart and taken when its jobs are harvested (in
    # the loop's fixed order): a logged row's counts do not depend on the threads' timing.
    wf.pool = streams.CountingPool(wf.pool)
    episodes = wf.start([t for t in tasks for _ in range(self.G)])
    openings = wf.open_stage(episodes)
    context = [list(self.tokenizer.encode(o)) for o in openings]
    return inflight.InFlightBatch(batch_id, list(positions), list(group_ids), list(episode_ids),
                                  wf, episodes, context)

  def _sample_and_submit(self, slot: inflight.InFlightBatch, params, version: int) -> None:
    stage = slot.next_stage
    prefix = (slot.episode_ids, stage, int(version)) if self.reuse_prefixes else None
    sampled = self.sample_contexts(params, slot.context, greedy=False, prefix=prefix)
    slot.pending = inflight.Sampled(stage, int(version), *sampled)
    slot.job = self._submit(slot, slot.pending)

  def sample_contexts(self, params, contexts: Sequence[Sequence[int]], *, greedy: bool,
                      rng_counter: Optional[int] = None, sample_fn: Optional[SampleFn] = None,
                      prefix: Optional[tuple[Sequence[int], int, int]] = None
                      ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Samples one stage for N contexts (N = `num_rows`); too-long contexts get no tokens.

    `rng_counter` selects the sampling key; by default the loop's own counter is advanced
    (evaluation passes its own, so that it does not shift the training stream). `sample_fn`
    replaces the loop's own for this call (e.g. evaluation at its own temperature). The rows
    not sampled are counted in `counters["skipped_long_contexts"]` (the loop's own calls: the
    training stream) or `counters["eval_skipped_long_contexts"]` (calls with `rng_counter`).
    `prefix`: `(episode ids [N], stage, policy version)` of a training stage of a loop built
    with `reuse_prefixes` (`SampleFn`'s keywords; the counts it returns are added to
    `counters`); None: the five positional arguments only.

    Returns:
      `(gen, logprobs, sampled)`: per row generated ids and behaviour log-probs (ragged), and
      `[N]` bool, False for rows that were not sampled.
    """
    n = len(contexts)
    if n != self.num_rows:
      raise ValueError(f"contexts must have {self.num_rows} rows, got {n}")
    limit = self.max_context - self.max_new_tokens
    ok = np.array([0 < len(c) <= limit for c in contexts], bool)
    width = max([len(c) for c, o in zip(contexts, ok) if o] or [1])
    prompts = np.zeros((n, width), np.int32)
    lengths = np.ones((n,), np.int32)
    for i, (c, o) in enumerate(zip(contexts, ok)):
      if o:
        prompts[i, :len(c)] = c
        lengths[i] = len(c)
    own = rng_counter is None
    if own:
      self.rng_counter += 1
      rng_counter = self.rng_counter
    fn = sample_fn or self.sample_fn
    if prefix is None:
      tokens, out_len, logprobs = fn(params, prompts, lengths, rng_counter, greedy)
    else:
      episode_ids, stage, version = prefix
      if len(episode_ids) != n:
        raise ValueError(f"prefix must name {n} episode ids, got {len(episode_ids)}")
      # The last stage's conversations continue nowhere: not saved.
      last = stage == self.num_stages - 1
      save = [(int(e), int(stage)) if o and not last else None
              for e, o in zip(episode_ids, ok)]
      named = [(int(e), int(stage) - 1) if o and stage > 0 else None
               for e, o in zip(episode_ids, ok)]
      tokens, out_len, logprobs, counts = fn(params, prompts, lengths, rng_counter, greedy,
                                             prefix_keys=named if stage > 0 else None,
                                             save_keys=save, params_version=int(version))
      self.counters.update({k: int(v) for k, v in counts.items()})
    tokens, out_len, logprobs = np.asarray(tokens), np.asarray(out_len), np.asarray(logprobs)
    gen, lps = [], []
    for i in range(n):
      m = int(out_len[i]) if ok[i] else 0
      gen.append(tokens[i, :m].astype(np.int32))
      lps.append(logprobs[i, :m].astype(np.float32))
    # The training stream's skips apart from evaluation's (`rng_counter` given): the RL phase
    # reads `skipped_long_contexts` against the training rows sampled (`rng_counter * N`).
    key = "skipped_long_contexts" if own else "eval_skipped_long_contexts"
    self.counters[key] += int((~ok).sum())
    return gen, lps, ok

  def _submit(self, slot: inflight.InFlightBatch,
              sampled: inflight.Sampled) -> concurrent.futures.Future:
    """Submits the sandbox job of a sampled stage; after the last stage's, queues the final
    judgement to run as soon as it is done."""
    outputs = [self.tokenizer.decode(g.tolist()) for g in sampled.gen]
    last = sampled.stage == self.num_stages - 1
    job = self._executor.submit(_env_job, slot.workflow, slot.episodes, outputs, last)
    if last:
      slot.final_job = self._final_executor.submit(_final_job, slot.workflow, slot.episodes,
                                                   job)
    return job

  def _harvest(self, slot: inflight.InFlightBatch) -> dict[str, float]:
    """Feeds the finished sandbox job of `slot` to the replay; returns metrics."""
    sampled = slot.pending
    k = sampled.stage
    try:
      result, follow, errors, verdicts, _ = slot.job.result()
    except Exception:  # pylint: disable=broad-except
      logging.exception("agent loop: sandbox job of batch %d stage %d failed", slot.batch_id, k)
      self.counters["job_failures"] += 1
      self._verdicts.update(slot.workflow.pool.pop_counts())
      return self._abandon(slot)
    slot.job = None
    slot.pending = None
    self._errors.update(errors)
    self._verdicts.update(verdicts)
    name = slot.workflow.stage_names[k]
    rows, masks, blps = [], [], []
    for i in range(self.num_rows):
      ctx, gen = slot.context[i], sampled.gen[i]
      rows.append(np.concatenate([np.asarray(ctx, np.int32), gen]))
      masks.append(np.concatenate([np.zeros(len(ctx), bool), np.ones(len(gen), bool)]))
      blps.append(np.concatenate([np.zeros(len(ctx), np.float32), sampled.logprobs[i]]))
    valid = sampled.sampled & (result.valid if self.stage_rewards else True)
    self.replay.add_stage(slot.episode_ids, k, rows, masks, blps, sampled.version,
                          result.rewards, valid)
    slot.history.append(sampled)
    scored = sampled.sampled & result.valid
    metrics = {f"reward/{name}": float(np.mean(result.rewards[result.valid]))
               if result.valid.any() else 0.0,
               f"parsed/{name}": float(np.mean(result.parsed)),
               f"signal/tied_groups_{name}": float(np.mean(self._tied(result.rewards, scored))),
               "generated_tokens": float(sum(len(g) for g in sampled.gen))}
    if k == self.num_stages - 1:  # The slot is free; the final reward lands when due.
      slot.done = True
      slot.final_due = self.harvests + self.final_lag
      self.finals.append(slot)
    else:
      slot.context = [list(r) + list(self.tokenizer.encode(o)) for r, o in zip(rows, follow)]
    return metrics

  def _land_final(self, batch: inflight.InFlightBatch, version: int) -> dict[str, float]:
    """Feeds a due final judgement to the replay (waiting for it); returns metrics. A judgement
    that fails as a whole gives final rewards 0 (netting out the batch's provisional updates),
    as an abandoned batch does."""
    t0 = time.monotonic()
    try:
      final, errors, verdicts, stage_end = batch.final_job.result()
    except Exception:  # pylint: disable=broad-except
      logging.exception("agent loop: final judgement of batch %d failed", batch.batch_id)
      self.counters["job_failures"] += 1
      self._verdicts.update(batch.workflow.pool.pop_counts())
      self.replay.finish(batch.episode_ids, np.zeros(self.num_rows))
      batch.final_job = None
      return {"loop/abandoned_batches": 1.0}
    now = time.monotonic()
    batch.final_job = None
    self._errors.update(errors)
    self._verdicts.update(verdicts)
    self.replay.finish(batch.episode_ids, final.rewards)
    behaviour = batch.history[-1].version
    self.last_finished = (batch.episodes, final, behaviour)
    tied = self._tied(final.rewards, np.ones(self.num_rows, bool))
    self.counters["episodes"] += self.num_rows
    self.counters["tied_groups_final"] += int(tied.sum())
    latency = {"seconds": now - stage_end, "versions": float(int(version) - behaviour)}
    for key, value in latency.items():
      self.latency[key] = (self.latency[key] + [value])[-_LATENCY_HISTORY:]
    self._final_seconds["latency"].append(latency["seconds"])
    self._final_seconds["wait"].append(now - t0)
    return {"reward/final": float(np.mean(final.rewards)),
            "train/pass_rate": float(np.mean(final.rewards >= 1.0)),
            "signal/tied_groups_final": float(np.mean(tied)),
            "final/latency_versions": latency["versions"]}

  def pop_final_seconds(self) -> dict[str, float]:
    """Of the final rewards landed since the last call, on the host's clock: the mean seconds
    from the last stage scored to the final reward in the replay (`final/latency_s`) and the
    mean seconds the loop waited for a due judgement (`final/wait_s`); {} if none landed."""
    out = {f"final/{k}_s": float(np.mean(v)) for k, v in self._final_seconds.items() if v}
    self._final_seconds = {"latency": [], "wait": []}
    return out

  def final_latency(self) -> dict[str, float]:
    """Mean and 95th percentile of the latest final rewards' latencies (up to 4,096 batches):
    `final/latency_s_mean`, `final/latency_s_p95` (seconds from the last stage scored to the
    final reward in the replay; wall-clock, since this process started or resumed),
    `final/latency_versions_mean` and `final/latency_versions_p95` (policy versions from the
    last stage's sampling; over resumes); {} before a final reward has landed."""
    out = {}
    for key, name in (("seconds", "s"), ("versions", "versions")):
      values = self.latency[key]
      if values:
        out[f"final/latency_{name}_mean"] = float(np.mean(values))
        out[f"final/latency_{name}_p95"] = float(np.percentile(values, 95))
    return out

  def transcripts(self, n: int) -> list[dict[str, Any]]:
    """The first `n` episodes of the newest finished training batch as JSON objects ([] before
    one finishes): `task_id`, `prompt` (the first stage's opening), `stages` (per stage:
    `stage`, `opening` (after the first), `output`, `reward`, `parsed`, `valid`: whether it
    counts for the stage's reward), `final_reward`, `tests_passed` / `num_tests` (the final
    code on the hidden tests) and `policy_version` (of the last stage's sampling)."""
    if self.last_finished is None:
      return []
    episodes, final, version = self.last_finished
    out = []
    for i, ep in enumerate(episodes[:n]):
      stages = []
      for k, seg in enumerate(ep.segments):
        stages.append({"stage": seg.stage, **({"opening": seg.opening} if k else {}),
                       "output": seg.output,
                       "reward": float(ep.stage_rewards[k]) if k < len(ep.stage_rewards)
                       else None,
                       "parsed": bool(ep.stage_parsed[k]) if k < len(ep.stage_parsed)
                       else None,
                       "valid": bool(ep.stage_valid[k]) if k < len(ep.stage_valid) else None})
      out.append({"task_id": ep.task.task_id,
                  "prompt": ep.segments[0].opening if ep.segments else "",
                  "stages": stages, "final_reward": float(final.rewards[i]),
                  "tests_passed": int(final.num_passed[i]), "num_tests": int(final.num_tests[i]),
                  "policy_version": int(version)})
    return out

  def _tied(self, rewards: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """`[B]` bool: which of a batch's groups (rows `b·G .. b·G + G - 1`) have tied rewards
    among their `valid` members (`core.advantages.tied_groups`: no learning signal)."""
    shape = (self.B, self.G)
    return batched.tied_groups(np.asarray(rewards, np.float32).reshape(shape),
                               np.asarray(valid, bool).reshape(shape))

  def _abandon(self, slot: inflight.InFlightBatch) -> dict[str, float]:
    """Reports a failed batch's remaining stages as skipped and its final rewards as 0."""
    first = len(slot.history)
    empty = [np.zeros((0,), np.int32)] * self.num_rows
    for k in range(first, self.num_stages):
      self.replay.add_stage(slot.episode_ids, k, empty, [np.zeros((0,), bool)] * self.num_rows,
                            [np.zeros((0,), np.float32)] * self.num_rows, 0,
                            np.zeros(self.num_rows), np.zeros(self.num_rows, bool))
    self.replay.finish(slot.episode_ids, np.zeros(self.num_rows))
    if slot.final_job is not None:  # it fails with the stage job it waits for
      slot.final_job.cancel()
    slot.job, slot.pending, slot.done, slot.final_job = None, None, True, None
    return {"loop/abandoned_batches": 1.0}

  def pop_counts(self) -> dict[str, float]:
    """Since the last call, of the harvested sandbox jobs: parser/reward/sandbox exceptions
    (`errors/<stage>`) and run verdicts (`passed`, `timeout`, `memory_limit`, ...: one per
    program run). Counted per batch and taken at harvest, so the same for the same seed."""
    out = {f"errors/{k}": float(v) for k, v in self._errors.items()}
    out.update({k: float(v) for k, v in self._verdicts.items()})
    self._errors.clear()
    self._verdicts.clear()
    return out

  # ------------------------------------------------------------------------------- evaluation

  def run_episodes(self, params, tasks: Sequence[task_lib.Task], *, greedy: bool,
                   repeats: int = 1, rng_counter: int = -1,
                   workflow_factory: Optional[Callable[[], workflow_lib.Workflow]] = None,
                   sample_fn: Optional[SampleFn] = None
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Runs whole episodes (evaluation; nothing goes to the replay).

    Tasks are repeated `repeats` times and cut into chunks of N rows (the sampler's fixed batch;
    the last chunk padded with its last task), so no new shapes are compiled. Chunk `c`'s stage
    `k` is sampled with key `rng_counter - (c * S + k)` (S stages; negative by default:
    disjoint from the training stream). Two chunks are in flight: while one chunk's stage is
    scored in the sandbox (a background job, with the next stage's opening or, after the last
    stage, the final judgement: a slow judge's wait too), the other's next stage is sampled.
    A chunk that finishes hands its place to the next one, first in line, so that its first
    stage is sampled while the other chunk is judged. The sampler calls come in a fixed order
    whatever the sandbox's timing (processes stay in lock-step), and every result is that of
    running the chunks one after the other (each chunk has its own workflow and its own keys),
    as long as the sandbox's verdicts do not depend on timing: its programs now share the
    cores with the sampler, so one near its wall-clock limit could time out under the load.
    `workflow_factory` and `sample_fn` default to the loop's own.

    Returns:
      `final [len(tasks), repeats]` final rewards and per-stage rewards
      `{stage_name: [len(tasks), repeats]}`.

    Raises:
      Whatever a chunk's workflow or sandbox job raised (the other chunk's job is waited for
      first).
    """
    items = [t for t in tasks for _ in range(repeats)]
    n = self.num_rows
    factory = workflow_factory or self._workflow_factory
    finals = np.zeros(len(items), np.float32)
    stage_r: dict[str, np.ndarray] = {}

    def begin(start: int) -> dict[str, Any]:
      chunk = items[start:start + n]
      real = len(chunk)
      chunk = chunk + [chunk[-1]] * (n - real)
      wf = factory()
      return {"start": start, "real": real, "wf": wf, "stage": 0,
              "job": jobs.submit(_open_job, wf, chunk), "contexts": [[] for _ in range(n)]}

    # Two chunks in flight, each with a thread for its sandbox work; leaving the block waits
    # for both (also when a job or the sampler raised).
    with concurrent.futures.ThreadPoolExecutor(max_workers=2,
                                               thread_name_prefix="agent-eval") as jobs:
      active: collections.deque = collections.deque()
      pending = collections.deque(range(0, len(items), n))
      while pending and len(active) < 2:
        active.append(begin(pending.popleft()))
      while active:
        st = active.popleft()
        start, real, wf, k = st["start"], st["real"], st["wf"], st["stage"]
        result, episodes, follow = st["job"].result()
        if k > 0:  # `result` scored stage k - 1
          name = wf.stage_names[k - 1]
          stage_r.setdefault(name, np.zeros(len(items), np.float32))[start:start + real] = (
              result.rewards[:real])
        if k == wf.num_stages:  # `follow` is the final judgement
          finals[start:start + real] = follow.rewards[:real]
          if pending:  # first in line: sampled while the other chunk is judged
            active.appendleft(begin(pending.popleft()))
          continue
        contexts = [c + list(self.tokenizer.encode(o)) for c, o in zip(st["contexts"], follow)]
        gen, _, _ = self.sample_contexts(
            params, contexts, greedy=greedy,
            rng_counter=rng_counter - ((start // n) * wf.num_stages + k), sample_fn=sample_fn)
        st["contexts"] = [c + g.tolist() for c, g in zip(contexts, gen)]
        st["job"] = jobs.submit(_eval_stage_job, wf, episodes,
                                [self.tokenizer.decode(g.tolist()) for g in gen],
                                k == wf.num_stages - 1)
        st["stage"] = k + 1
        active.append(st)
    shape = (len(tasks), repeats)
    return finals.reshape(shape), {k: v.reshape(shape) for k, v in stage_r.items()}

  # ------------------------------------------------------------------------------- state

  def state_dict(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """`(arrays, meta)`: in-flight batches and those awaiting their final reward as generated
    tokens (`inflight.encode`: the slots' entries, then `finals`), the harvest count, counters,
    stream position, the latest final rewards' latencies in policy versions."""
    arrays, entries = inflight.encode(self.slots + self.finals)
    meta = {"slots": entries[:self.K], "finals": entries[self.K:], "cursor": self.cursor,
            "phase": self.phase, "harvests": self.harvests,
            "rng_counter": self.rng_counter, "next_batch_id": self.next_batch_id,
            "next_episode_id": self.next_episode_id, "next_group_id": self.next_group_id,
            "stream_position": self.stream.position, "counters": dict(self.counters),
            "final_latency_versions": list(self.latency["versions"])}
    return arrays, meta

  def load_state_dict(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Restores in-flight batches by replaying the workflow on their recorded outputs.

    The replay's own state must be restored separately (it already holds the harvested
    stages); a job that was in flight is resubmitted, and so is the final judgement of every
    batch that awaited one (due at the same harvest as before).

    Raises:
      ValueError: if the state has another number of batches in flight than the loop.
      checkpoint_records.RecordError: `meta` lacks a key (none has a safe default: the ids
        and counters decide the next episodes and `rl.episode_budget`).
    """
    meta = records.read(meta, "meta.loop", required=_STATE_KEYS, defaults=_STATE_DEFAULTS)
    rows = inflight.decode_rows(arrays)  # per recorded row, in `state_dict`'s order
    self.cursor, self.phase = int(meta["cursor"]), meta["phase"]
    self.harvests = int(meta["harvests"])
    self.latency = {"seconds": [],
                    "versions": [float(x) for x in meta["final_latency_versions"]]}
    self.rng_counter = int(meta["rng_counter"])
    self.next_batch_id = int(meta["next_batch_id"])
    self.next_episode_id = int(meta["next_episode_id"])
    self.next_group_id = int(meta["next_group_id"])
    self.stream.position = int(meta["stream_position"])
    self.counters = collections.Counter(meta["counters"])
    if len(meta["slots"]) != self.K:
      raise ValueError(f"state has {len(meta['slots'])} slots, the loop has {self.K}")
    self.slots = [None if sm is None else self._restore_batch(sm, rows) for sm in meta["slots"]]
    self.finals = [self._restore_batch(sm, rows) for sm in meta["finals"]]

  def _restore_batch(self, sm: dict[str, Any], rows) -> inflight.InFlightBatch:
    """One in-flight batch from its `state_dict` entry; consumes its rows from `rows`."""
    sm = records.read(sm, "meta.loop.slots[]", required=inflight.ENTRY_KEYS)
    tasks = self.stream.at(sm["positions"])
    slot = self._start_batch(sm["batch_id"], sm["positions"], tasks,
                             (sm["group_ids"], sm["episode_ids"]))
    stages = inflight.decode_stages(sm, rows, self.num_rows)
    due = sm.get(inflight.FINAL_DUE)
    if sm["done"] and due is None:  # Fully harvested: replaced at its next visit.
      slot.done = True
      return slot
    harvested = stages[:-1] if sm["pending"] else stages
    for s in harvested:
      # The errors and verdicts were counted when the stages were first harvested.
      outputs = [self.tokenizer.decode(g.tolist()) for g in s.gen]
      follow = _env_job(slot.workflow, slot.episodes, outputs,
                        s.stage == self.num_stages - 1)[1]
      slot.history.append(s)
      if s.stage < self.num_stages - 1:
        slot.context = [list(c) + g.tolist() + list(self.tokenizer.encode(o))
                        for c, g, o in zip(slot.context, s.gen, follow)]
    if sm["pending"]:
      slot.pending = stages[-1]
      slot.job = self._submit(slot, slot.pending)
    if due is not None:  # Scored to its last stage: its final judgement runs again.
      slot.done, slot.final_due = True, int(due)
      slot.final_job = self._final_executor.submit(_final_job, slot.workflow, slot.episodes)
    return slot

  def close(self) -> None:
    """Waits for in-flight sandbox jobs and final judgements (those not started are dropped)
    and stops the loop's executors (the given `executor` is left running)."""
    if self._own_executor:
      self._executor.shutdown(wait=True)
    self._final_executor.shutdown(wait=True, cancel_futures=True)


def _env_job(wf: workflow_lib.Workflow, episodes, outputs: list[str], last: bool):
  """Background sandbox work: close the stage, then open the next one (None after the last).

  Returns `(StageResult, openings or None, error counts, sandbox verdicts, monotonic seconds at
  the end)`: the counts are this job's own (the batch's jobs run one after the other).
  """
  result = wf.close_stage(episodes, outputs)
  follow = None if last else wf.open_stage(episodes)
  return result, follow, wf.pop_error_counts(), wf.pool.pop_counts(), time.monotonic()


def _open_job(wf: workflow_lib.Workflow, chunk: Sequence[task_lib.Task]):
  """Background evaluation work: start a chunk's episodes and open their first stage (or, for
  a workflow of no stages, judge them).

  Returns `(None, episodes, openings or FinalResult)` (`run_episodes`' jobs' shape).
  """
  episodes = wf.start(chunk)
  return None, episodes, wf.open_stage(episodes) if wf.num_stages else wf.finish(episodes)


def _eval_stage_job(wf: workflow_lib.Workflow, episodes, outputs: list[str], last: bool):
  """Background evaluation work: close a stage, then open the next one, or after the last
  stage judge the episodes.

  Returns `(StageResult, episodes, openings or FinalResult)`.
  """
  result = wf.close_stage(episodes, outputs)
  return result, episodes, wf.finish(episodes) if last else wf.open_stage(episodes)


def _final_job(wf: workflow_lib.Workflow, episodes,
               last_stage: Optional[concurrent.futures.Future] = None):
  """Background final judgement, after the last stage's job `last_stage` (if given; its
  failure fails this job).

  Returns `(FinalResult, error counts, sandbox verdicts, monotonic seconds when the last stage
  was scored)` (now, without `last_stage`: a judgement resubmitted on restore).
  """
  stage_end = last_stage.result()[-1] if last_stage is not None else time.monotonic()
  final = wf.finish(episodes)
  return final, wf.pop_error_counts(), wf.pool.pop_counts(), stage_end
