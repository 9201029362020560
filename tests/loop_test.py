"""Tests for agentic_grpo.agent.loop, with a scripted sampler (no model, real sandbox)."""

import collections
import threading
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentic_grpo import replay as replay_lib
from agentic_grpo import sandbox
from agentic_grpo.agent import loop as loop_lib
from agentic_grpo.agent import references
from agentic_grpo.agent import stages
from agentic_grpo.agent import streams
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.agent import workflow_config
from agentic_grpo.checkpoint import records as checkpoint_records
from agentic_grpo.models import tokenizers
from agentic_grpo.tasks import synthetic

B, G = 2, 4
TOK = tokenizers.ByteTokenizer()
TASKS = synthetic.SyntheticTasks(synthetic.SyntheticConfig(seed=3, depths=(1,)))
# Code that never returns: the sandbox must time it out.
HANG = "next(v for v in iter(int,1) if v)"


class ScriptedSampler:
  """Emits the reference output of the current stage for even rows and junk for odd rows.

  The task is found from the prompt text, the stage from the number of closing delimiters
  already in the context. `hang_code=True` makes odd rows write code that never returns.
  """

  def __init__(self, hang_code=False):
    self.hang_code = hang_code
    self.right = lambda i: i % 2 == 0  # which rows write the reference output
    self.calls = 0
    self.emitted = []  # per call: list of generated id arrays
    self.wf = workflow_lib.Workflow(workflow_config.WorkflowConfig())
    self.closes = {TOK.token_id(s.close_token) for s in self.wf.stages}

  def _task(self, text):
    return self.tasks_by_prompt[next(p for p in self.tasks_by_prompt if text.startswith(p))]

  def __call__(self, params, prompts, lengths, rng_counter, greedy):
    del params, greedy
    self.calls += 1
    n = prompts.shape[0]
    width = 12
    out = np.full((n, 64), TOK.pad_id, np.int32)
    out_len = np.zeros((n,), np.int32)
    lps = np.zeros((n, 64), np.float32)
    emitted = []
    for i in range(n):
      ctx = prompts[i, :lengths[i]].tolist()
      text = TOK.decode(ctx)
      task = self._task(text)
      k = sum(t in self.closes for t in ctx)
      stage = self.wf.stages[k]
      if self.right(i):
        body = references.reference_outputs(self.wf, task)[k]
      elif self.hang_code and stage.kind == "code":
        body = HANG + stage.close_token
      else:
        body = "?" * (1 + (rng_counter + i) % width) + stage.close_token
      ids = TOK.encode(body)
      out[i, :len(ids)] = ids
      out_len[i] = len(ids)
      lps[i, :len(ids)] = -0.25 - 0.01 * np.arange(len(ids))
      emitted.append(np.array(ids, np.int32))
    self.emitted.append(emitted)
    return out, out_len, lps


class LoopTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits(
        cpu_seconds=1.0, wall_seconds=0.5))

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def _loop(self, sampler, *, workflow_cls=workflow_lib.Workflow, stage_rewards=True,
            in_flight=2, final_reward_lag=0, judge=None, reuse_prefixes=False,
            **replay_options):
    """A loop over the scripted sampler; `judge`: WorkflowConfig options of the final judge
    (`final_reward_delay_s`, `final_reward_jitter_s`)."""
    counting = streams.CountingPool(self.pool)
    factory = lambda: workflow_cls(workflow_config.WorkflowConfig(stage_rewards=stage_rewards,
                                                                  **(judge or {})), counting)
    num_stages = factory().num_stages
    replay = replay_lib.StagedReplay(group_size=G, num_stages=num_stages,
                                     stage_rewards=stage_rewards, skip_zero_advantage=False,
                                     **replay_options)
    stream = streams.TaskStream(lambda i: TASKS.task("train", i), pool_size=5, seed=1)
    sampler.tasks_by_prompt = {TASKS.task("train", i).prompt: TASKS.task("train", i)
                               for i in range(5)}
    agent = loop_lib.AgentLoop(
        workflow_factory=factory, tokenizer=TOK, replay=replay, stream=stream,
        sample_fn=sampler, tasks_per_batch=B, group_size=G, batches_in_flight=in_flight,
        max_context=384, max_new_tokens=64, stage_rewards=stage_rewards,
        final_reward_lag=final_reward_lag, reuse_prefixes=reuse_prefixes)
    self.addCleanup(agent.close)
    return agent, replay, counting

  def test_only_the_training_streams_long_contexts_count_as_its_skips(self):
    agent, _, _ = self._loop(ScriptedSampler(), in_flight=1)
    n = agent.num_rows
    blank = lambda params, prompts, lengths, rng_counter, greedy: (
        np.ones((n, 2), np.int32), np.full((n,), 2, np.int32), np.zeros((n, 2), np.float32))
    too_long = [[1] * 321] * 3 + [[1] * 8] * (n - 3)  # 384 - 64 tokens fit
    agent.sample_contexts(None, too_long, greedy=True, rng_counter=-1, sample_fn=blank)
    self.assertEqual(agent.counters["eval_skipped_long_contexts"], 3)
    self.assertEqual(agent.counters["skipped_long_contexts"], 0)
    self.assertEqual(agent.rng_counter, 0)  # evaluation's samples are not the stream's
    _, _, ok = agent.sample_contexts(None, too_long, greedy=False, sample_fn=blank)
    self.assertEqual(int((~ok).sum()), 3)
    self.assertEqual(agent.counters["skipped_long_contexts"], 3)
    # The RL phase's "S of N training stage samples were skipped" reads N = rng_counter * N.
    self.assertLessEqual(agent.counters["skipped_long_contexts"], agent.rng_counter * n)

  def test_reuse_prefixes_names_each_stages_previous_conversation(self):
    # Training stages pass (episode, stage) save keys, (episode, stage - 1) prefix keys after
    # the first stage and the policy version; the counts they return add to the counters;
    # evaluation's calls stay positional.
    scripted = ScriptedSampler()
    calls = []

    def keyed(params, prompts, lengths, rng_counter, greedy, **kwargs):
      out = scripted(params, prompts, lengths, rng_counter, greedy)
      if not kwargs:
        return out
      calls.append(kwargs)
      return (*out,
              {"prefix_hits": 0 if kwargs["prefix_keys"] is None else len(lengths)})

    agent, _, _ = self._loop(scripted, in_flight=1, reuse_prefixes=True)
    agent.sample_fn = keyed
    for version in range(2 * agent.num_stages):
      agent.step(None, version)
    episodes = agent.slots[0].episode_ids
    self.assertLen(calls, agent.num_stages)
    for k, kwargs in enumerate(calls):
      self.assertEqual(kwargs["params_version"], 2 * k + 1)
      self.assertEqual(kwargs["prefix_keys"],
                       None if k == 0 else [(e, k - 1) for e in episodes])
      self.assertEqual(kwargs["save_keys"], [None] * len(episodes)
                       if k == agent.num_stages - 1 else [(e, k) for e in episodes])
    self.assertEqual(agent.counters["prefix_hits"], (agent.num_stages - 1) * agent.num_rows)
    calls.clear()
    agent.run_episodes(None, [TASKS.task("train", 0)], greedy=True)
    self.assertEqual(calls, [])  # evaluation: the positional call

  def test_sharded_loops_draw_disjoint_tasks(self):
    seen = []
    for p in range(2):
      agent, _, _ = self._loop(ScriptedSampler(), in_flight=2)
      agent.stream = streams.TaskStream(lambda i: TASKS.task("train", i), pool_size=5, seed=1,
                                        shard_index=p, shard_count=2)
      for _ in range(4):  # starts both batches in flight (B tasks each)
        agent.step(None, 0)
      seen.append([q for slot in agent.slots for q in slot.positions])
      self.assertEqual(agent.state_dict()[1]["stream_position"], 2 * B)
    self.assertEqual(seen, [[0, 2, 4, 6], [1, 3, 5, 7]])

  def test_stages_feed_replay_tokens_in_tokens_out(self):
    sampler = ScriptedSampler()
    agent, replay, _ = self._loop(sampler, in_flight=1)
    self.assertEqual(agent.phase, "harvest")
    agent.step(None, 0)  # Starts a batch.
    agent.step(None, 0)  # Samples stage 0.
    self.assertEqual(replay.num_ready, 0)  # Not scored yet: nothing is ready.
    metrics = agent.step(None, 0)  # Harvests stage 0.
    self.assertEqual(metrics["reward/hypothesis"], 0.5)  # Even rows are right.
    self.assertEqual(replay.num_ready, B * G)  # One provisional row per member.
    batch = replay.take(B * G, 0, (384,))
    self.assertEqual(batch.kinds, ["provisional"] * (B * G))
    for r in range(B * G):
      gen = sampler.emitted[0][r]
      row = batch.update.tokens[r][:batch.update.loss_mask[r].nonzero()[0][-1] + 1]
      # The row ends with exactly the generated ids, which are the loss tokens.
      np.testing.assert_array_equal(row[-len(gen):], gen)
      self.assertEqual(int(batch.update.loss_mask[r].sum()), len(gen))
      np.testing.assert_allclose(batch.update.behaviour_logprobs[r][batch.update.loss_mask[r]],
                                 -0.25 - 0.01 * np.arange(len(gen)), rtol=1e-6)
    # Run the batch to its end: the final rewards produce correction rows.
    for _ in range(2 * (agent.num_stages - 1)):
      metrics = agent.step(None, 1)
    self.assertIn("reward/final", metrics)
    self.assertEqual(metrics["reward/final"], 0.5)  # Even rows wrote the reference code.
    kinds = collections.Counter()
    while (b := replay.take(64, 1, (384,))) is not None:
      kinds.update(b.kinds)
    self.assertEqual(kinds["correction"], B * G)  # One packed row per episode.
    self.assertEqual(agent.counters["episodes"], B * G)
    self.assertEqual(replay.num_pending_episodes, B * G)  # Only the next batch's.

  def test_tied_groups_are_counted_per_stage_and_final(self):
    # Group 0 writes the reference everywhere (every reward 1: tied), group 1 alternates.
    sampler = ScriptedSampler()
    sampler.right = lambda i: i < G or i % 2 == 0
    agent, _, _ = self._loop(sampler, in_flight=1)
    seen = {}
    for _ in range(2 * agent.num_stages + 1):
      seen.update(agent.step(None, 0))
    self.assertEqual(seen["reward/hypothesis"], 0.75)
    for name in ("hypothesis", "code", "final"):
      self.assertEqual(seen[f"signal/tied_groups_{name}"], 0.5, name)
    self.assertEqual(agent.counters["tied_groups_final"], 1)
    self.assertEqual(agent.counters["episodes"], B * G)

  def test_slot_takes_a_new_batch_before_the_final_reward_arrives(self):
    # The judge of the first batch is held until the next batch has sampled and been scored.
    judge_may_finish = threading.Event()
    real_finish = workflow_lib.Workflow.finish

    def held_finish(wf, episodes):
      judge_may_finish.wait(timeout=60)
      return real_finish(wf, episodes)

    self.enter_context(mock.patch.object(workflow_lib.Workflow, "finish", held_finish))
    lag = 3
    agent, replay, _ = self._loop(ScriptedSampler(), in_flight=1, final_reward_lag=lag)
    n, s = agent.num_rows, agent.num_stages
    seen = {}
    for _ in range(2 * s):  # the first batch: every stage sampled, all but the last harvested
      seen.update(agent.step(None, 0))
    metrics = agent.step(None, 0)  # harvests its last stage; the slot takes a new batch
    self.assertEqual(agent.slots[0].batch_id, 1)
    self.assertEqual([b.batch_id for b in agent.finals], [0])
    self.assertNotIn("reward/final", metrics)
    for _ in range(2):  # the new batch's first stage: sampled and scored, the judge still held
      metrics = agent.step(None, 1)
      self.assertNotIn("reward/final", metrics)
    self.assertIn("reward/hypothesis", metrics)
    self.assertEqual(replay.num_pending_episodes, 2 * n)  # both batches await their outcome
    self.assertEqual(agent.counters["episodes"], 0)
    self.assertFalse(agent.finals[0].final_job.done())
    judge_may_finish.set()
    landed = []
    for _ in range(2 * lag):
      metrics = agent.step(None, 2)
      landed.append("reward/final" in metrics)
    # Due `lag` harvests after the last stage's: the new batch's first harvest was the first
    # since, these steps sample, harvest (the second), sample, harvest (the third: it lands).
    self.assertEqual(landed, [False, False, False, True, False, False])
    self.assertEqual(agent.counters["episodes"], n)
    self.assertEqual(metrics_final := agent.final_latency()["final/latency_versions_mean"], 2.0,
                     metrics_final)
    # Meanwhile the second batch ran through its stages: now it awaits its final reward.
    self.assertEqual([b.batch_id for b in agent.finals], [1])

  @parameterized.parameters((1, 2), (2, 2), (3, 2), (5, 2))
  def test_late_final_reward_meets_the_staleness_bound(self, versions_late, max_staleness):
    # Every stage of the first batch is sampled at version 0; its final reward lands
    # `versions_late` versions later. Its corrections are taken at that version: within
    # `max_staleness` they train, past it every one of its segments is dropped ('drop').
    agent, replay, _ = self._loop(ScriptedSampler(), in_flight=1, final_reward_lag=2,
                                  max_staleness=max_staleness, staleness_mode="drop")
    kinds, dropped, landed = collections.Counter(), None, None
    for i in range(2 * agent.num_stages + 8):
      version = 0 if i < 2 * agent.num_stages else versions_late
      before = replay.counters.get("stale_dropped_segments", 0)
      metrics = agent.step(None, version)
      while (b := replay.take(64, version, (384,))) is not None:
        kinds.update(b.kinds)
      if "reward/final" in metrics:
        landed = metrics["final/latency_versions"]
        dropped = replay.counters.get("stale_dropped_segments", 0) - before
        corrections = kinds["correction"]
    self.assertEqual(landed, versions_late)
    if versions_late <= max_staleness:
      self.assertEqual(dropped, 0)
      self.assertEqual(corrections, B * G)  # one packed row per episode
    else:
      self.assertEqual(dropped, B * G * agent.num_stages)  # every segment of the batch
      self.assertEqual(corrections, 0)

  def test_processes_stay_in_lock_step_whatever_their_judges_take(self):
    # Two loops as two processes: one judge answers at once, the other after a random wait.
    # The final rewards land at the same harvests, so both take the same steps and feed their
    # replays the same rows.
    fast = self._loop(ScriptedSampler(), final_reward_lag=1)
    slow = self._loop(ScriptedSampler(), final_reward_lag=1,
                      judge={"final_reward_jitter_s": 0.3})
    timing = ("final/latency_s", "final/wait_s")
    landings = 0
    for i in range(12 * fast[0].num_stages):
      rows = []
      for agent, replay, _ in (fast, slow):
        metrics = agent.step(None, i // 2)
        taken = replay.take(64, i // 2, (384,))
        rows.append(({k: v for k, v in metrics.items() if k not in timing},
                     (agent.phase, agent.cursor, agent.harvests, len(agent.finals)),
                     None if taken is None else taken.update.tokens.tolist()))
      self.assertEqual(rows[0], rows[1], f"step {i}")
      landings += "reward/final" in rows[0][0]
    self.assertGreaterEqual(landings, 3)
    waited = slow[0].final_latency()["final/latency_s_mean"]
    self.assertGreater(waited, fast[0].final_latency()["final/latency_s_mean"])

  # 7 steps: a job in flight, nothing harvested yet in its batch; 11: harvested stages that the
  # restore replays in the sandbox; 17 and 19 (final rewards 2 harvests late): one and two
  # batches scored to their last stage, awaiting their final reward.
  @parameterized.parameters((7, 0), (11, 0), (17, 2), (19, 2))
  def test_resume_matches_uninterrupted(self, stop, lag):
    def run(agent, replay, steps, version0=0):
      taken = []
      for i in range(steps):
        agent.step(None, version0 + i // 2)
        b = replay.take(64, version0 + i // 2, (384,))
        if b is not None:
          taken.append((b.update.tokens.copy(), b.update.advantages.copy()))
      return taken

    a_loop, a_replay, _ = self._loop(ScriptedSampler(), final_reward_lag=lag)
    run(a_loop, a_replay, stop)  # Stops mid-episode, with a sandbox job in flight.
    a_loop.pop_counts()  # what a metrics row before the checkpoint logged
    arrays, meta = a_loop.state_dict()
    self.assertLen(meta["finals"], {7: 0, 11: 0, 17: 1, 19: 2}[stop])
    r_arrays, r_meta = a_replay.state_dict()
    b_loop, b_replay, _ = self._loop(ScriptedSampler(), final_reward_lag=lag)
    b_replay.load_state_dict(r_arrays, r_meta)
    b_loop.load_state_dict(arrays, meta)
    # The scripted sampler is a pure function of its inputs and the RNG counter.
    rest_a = run(a_loop, a_replay, 12, 10)
    rest_b = run(b_loop, b_replay, 12, 10)
    self.assertLen(rest_b, len(rest_a))
    self.assertNotEmpty(rest_a)
    # Verdicts after the restore: the replayed stages are not counted again.
    counts = a_loop.pop_counts()
    self.assertGreater(counts.get("passed", 0), 0)
    self.assertEqual(b_loop.pop_counts(), counts)
    for (ta, aa), (tb, ab) in zip(rest_a, rest_b, strict=True):
      np.testing.assert_array_equal(ta, tb)
      np.testing.assert_array_equal(aa, ab)
    sa, sb = a_replay.state_dict(), b_replay.state_dict()
    self.assertEqual(sa[1], sb[1])
    for k in sa[0]:
      np.testing.assert_array_equal(sa[0][k], sb[0][k])
    self.assertEqual(a_loop.state_dict()[1]["stream_position"],
                     b_loop.state_dict()[1]["stream_position"])

  def test_state_without_a_required_key_is_named(self):
    # None of the loop's keys has a safe default (ids, counters, in-flight batches).
    a_loop, _, _ = self._loop(ScriptedSampler())
    a_loop.step(None, 0)
    arrays, meta = a_loop.state_dict()
    b_loop, _, _ = self._loop(ScriptedSampler())
    for key in ("next_group_id", "counters"):
      with self.assertRaisesRegex(checkpoint_records.RecordError,
                                  rf"meta\.loop lacks {key}, which have no safe default"):
        b_loop.load_state_dict(arrays, {k: v for k, v in meta.items() if k != key})
    slots = [None if s is None else {k: v for k, v in s.items() if k != "pending"}
             for s in meta["slots"]]
    with self.assertRaisesRegex(checkpoint_records.RecordError,
                                r"meta\.loop\.slots\[\] lacks pending"):
      b_loop.load_state_dict(arrays, dict(meta, slots=slots))

  def test_raising_parser_and_timeouts_are_counted_not_fatal(self):
    real_parse = stages.TestsStage.parse

    def flaky_parse(self, body, episode):
      if body.startswith("?"):
        raise RuntimeError("parser bug")
      return real_parse(self, body, episode)

    self.enter_context(mock.patch.object(stages.TestsStage, "parse", flaky_parse))
    agent, replay, counting = self._loop(ScriptedSampler(hang_code=True), in_flight=1)
    metrics = {}
    for _ in range(2 * agent.num_stages + 1):
      metrics.update(agent.step(None, 0))
    self.assertIn("reward/final", metrics)
    counts = agent.pop_counts()
    self.assertEqual(counts["errors/tests"], B * G // 2)  # Odd rows raised in the parser.
    verdicts = counting.pop_counts()
    self.assertGreaterEqual(verdicts["timeout"], B * G // 2)  # Odd rows' code hangs.
    self.assertGreaterEqual(counts["timeout"], B * G // 2)  # the loop's, taken at harvest
    self.assertEqual(metrics["reward/final"], 0.5)
    self.assertEqual(agent.counters["episodes"], B * G)

  def test_verdict_counts_per_step_do_not_depend_on_timing(self):
    # Two loops on the same seed; in the second, every sandbox call is delayed at random, so
    # jobs finish in other orders relative to the loop's steps. The counts of each step (what
    # a metrics row logs) are the same: they are taken when a job is harvested.
    real_map = type(self.pool).map
    rng = np.random.default_rng(0)

    def slow_map(pool, programs, limits=None):
      import time  # pylint: disable=g-import-not-at-top
      time.sleep(float(rng.uniform(0.0, 0.3)))
      return real_map(pool, programs, limits)

    def per_step(slow):
      agent, _, _ = self._loop(ScriptedSampler(), in_flight=2)
      with mock.patch.object(type(self.pool), "map", slow_map) if slow else mock.patch.object(
          type(self.pool), "map", real_map):
        rows = []
        for _ in range(3 * agent.num_stages):
          agent.step(None, 0)
          rows.append(agent.pop_counts())
      return rows

    fast, slow = per_step(False), per_step(True)
    self.assertEqual(fast, slow)
    self.assertGreater(sum(r.get("passed", 0) for r in fast), 0)

  def test_failed_sandbox_job_abandons_batch_and_continues(self):
    calls = collections.Counter()
    real_open = workflow_lib.Workflow.open_stage

    def failing_open(self, episodes):
      calls["open"] += 1
      if calls["open"] == 2:  # In the first batch's first sandbox job.
        raise RuntimeError("sandbox machinery broke")
      return real_open(self, episodes)

    self.enter_context(mock.patch.object(workflow_lib.Workflow, "open_stage", failing_open))
    agent, replay, _ = self._loop(ScriptedSampler(), in_flight=1)
    metrics = {}
    for _ in range(4):
      metrics.update(agent.step(None, 0))
    self.assertEqual(metrics.get("loop/abandoned_batches"), 1.0)
    self.assertEqual(agent.counters["job_failures"], 1)
    self.assertEqual(replay.num_pending_episodes, B * G)  # Only the new batch is pending.
    # The loop goes on with a new batch.
    for _ in range(2 * agent.num_stages):
      metrics.update(agent.step(None, 0))
    self.assertIn("reward/final", metrics)


  def test_run_episodes_equals_chunk_by_chunk(self):
    # Three chunks (the last padded), two in flight: the same prompts per sampling key and the
    # same results as running each chunk's stages one after the other with key
    # `-1 - (c * S + k)`, the calls in a fixed order (the first two chunks' stages in turn,
    # then the third's).
    sampler = ScriptedSampler()
    sampler.right = lambda i: i % 3 == 0
    agent, _, _ = self._loop(sampler, in_flight=1)
    n, s = agent.num_rows, agent.num_stages
    tasks = [TASKS.task("train", i % 5) for i in range(2 * n + 3)]
    calls = []

    def keyed(params, prompts, lengths, rng_counter, greedy):
      calls.append((rng_counter, prompts.copy(), lengths.copy()))
      return sampler(params, prompts, lengths, rng_counter, greedy)

    finals, stage_r = agent.run_episodes(None, tasks, greedy=False, sample_fn=keyed)
    key = lambda c, k: -1 - (c * s + k)
    order = [key(c, k) for k in range(s) for c in (0, 1)] + [key(2, k) for k in range(s)]
    self.assertEqual([c[0] for c in calls], order)
    seen = {c[0]: c[1:] for c in calls}
    want_final = np.zeros(len(tasks), np.float32)
    want_stage = {}
    for c, start in enumerate(range(0, len(tasks), n)):
      chunk = tasks[start:start + n]
      real = len(chunk)
      chunk += [chunk[-1]] * (n - real)
      wf = agent._workflow_factory()
      episodes = wf.start(chunk)
      contexts = [[] for _ in range(n)]
      for k, name in enumerate(wf.stage_names):
        openings = wf.open_stage(episodes)
        contexts = [c + TOK.encode(o) for c, o in zip(contexts, openings, strict=True)]
        prompts = np.zeros((n, max(map(len, contexts))), np.int32)
        for i, ctx in enumerate(contexts):
          prompts[i, :len(ctx)] = ctx
        lengths = np.array(list(map(len, contexts)), np.int32)
        np.testing.assert_array_equal(seen[key(c, k)][0], prompts)
        np.testing.assert_array_equal(seen[key(c, k)][1], lengths)
        out, out_len, _ = sampler(None, prompts, lengths, key(c, k), False)
        gen = [out[i, :out_len[i]].tolist() for i in range(n)]
        result = wf.close_stage(episodes, [TOK.decode(g) for g in gen])
        contexts = [ctx + g for ctx, g in zip(contexts, gen, strict=True)]
        want_stage.setdefault(name, np.zeros(len(tasks), np.float32))[start:start + real] = (
            result.rewards[:real])
      want_final[start:start + real] = wf.finish(episodes).rewards[:real]
    np.testing.assert_array_equal(finals[:, 0], want_final)
    self.assertEqual(list(stage_r), list(want_stage))
    for name, r in want_stage.items():
      np.testing.assert_array_equal(stage_r[name][:, 0], r)
    self.assertGreater(want_final.sum(), 0)  # some episodes pass, some do not
    self.assertLess(want_final.sum(), len(tasks))

  def test_run_episodes_scores_one_chunk_while_sampling_the_other(self):
    # The first chunk's first scoring waits until the second chunk's first stage is sampled:
    # one chunk after the other would wait out the gate's timeout.
    sampled_second = threading.Event()
    gate = threading.Lock()
    waited = []

    class Gated(workflow_lib.Workflow):

      def close_stage(self, episodes, outputs):
        with gate:  # only the first call of all waits
          first = not waited
          if first:
            waited.append(None)
        if first:
          waited[0] = sampled_second.wait(20.0)
        return super().close_stage(episodes, outputs)

    sampler = ScriptedSampler()
    agent, _, _ = self._loop(sampler, workflow_cls=Gated, in_flight=1)
    n, s = agent.num_rows, agent.num_stages

    def watched(params, prompts, lengths, rng_counter, greedy):
      if rng_counter == -1 - s:  # the second chunk's first stage
        sampled_second.set()
      return sampler(params, prompts, lengths, rng_counter, greedy)

    tasks = [TASKS.task("train", i % 5) for i in range(2 * n)]
    finals, _ = agent.run_episodes(None, tasks, greedy=True, sample_fn=watched)
    self.assertEqual(waited, [True])
    self.assertEqual(finals.shape, (2 * n, 1))

  def test_run_episodes_raises_a_chunks_failure(self):
    class Broken(workflow_lib.Workflow):

      def finish(self, episodes):
        raise RuntimeError("judge unreachable")

    agent, _, _ = self._loop(ScriptedSampler(), workflow_cls=Broken, in_flight=1)
    tasks = [TASKS.task("train", i % 5) for i in range(3 * agent.num_rows)]
    with self.assertRaisesRegex(RuntimeError, "judge unreachable"):
      agent.run_episodes(None, tasks, greedy=True)

if __name__ == "__main__":
  absltest.main()
