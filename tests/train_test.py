"""Tests for the agentic_grpo.train package and the experiment configs, with a micro model.

Runs share one sandbox pool and, through the caches of the jitted steps and the sampler, one
set of compilations.
"""

import contextlib
import dataclasses
import json
import os
import re
import signal
import struct
import time
import types
from unittest import mock

from absl import logging as absl_logging
from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import numpy as np

from agentic_grpo import config as config_lib
from agentic_grpo import config_drift
from agentic_grpo import learner
from agentic_grpo import sandbox
from agentic_grpo import train
from agentic_grpo.agent import stages as stages_lib
from agentic_grpo.agent import streams
from agentic_grpo.agent import workflow as workflow_lib
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import layout as checkpoint_layout
from agentic_grpo.core import types as core_types
from agentic_grpo.models import placement
from agentic_grpo.models import sampler as sampler_lib
from agentic_grpo.models import transformer
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import task as task_lib
from agentic_grpo.train import device as device_lib
from agentic_grpo.train import metric_rows
from agentic_grpo.train import sampling as sampling_lib
from experiments import code_debug
from experiments import full_workflow
from experiments import outcome_grpo
from experiments import tiny_codegen
from tests.fixtures import micro_run
from tests.fixtures import old_checkpoints

HANG = "def f(x):\n  while True:\n    pass\n"


def _micro(module, **overrides):
  """An experiment config shrunk to a micro model and a few tiny batches."""
  c = module.get_config()
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64,
                 max_seq_len=256)
  c.task.eval_size = 2
  c.workflow.max_new_tokens = 12
  c.rl.update(tasks_per_batch=1, group_size=2, rows_per_update=4, buckets=(128,),
              batches_in_flight=2)
  c.warmstart.update(steps=1, batch_size=4, seq_len=128)
  c.rl.num_steps = 1
  c.eval.update(every=0, num_samples=2, k=(1, 2))
  micro_run.pin_rl_levers(c)  # a random model's groups tie: still take steps
  c.rl.precompile_rows = ()  # micro shapes compile in no time (tested on its own)
  c.checkpoint.every = 1
  c.log.progress_bar = False
  c.mesh.data = 1  # One of the test session's 8 simulated devices.
  for key, value in overrides.items():
    section, field = key.split(".")
    c[section][field] = value
  return config_lib.from_config_dict(c)


@contextlib.contextmanager
def _counting_compiles():
  """Yields a list that grows by one per XLA backend compilation while the block runs."""
  compiles = []

  def count(event, seconds, **kwargs):
    del seconds, kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(event)

  jax.monitoring.register_event_duration_secs_listener(count)
  try:
    yield compiles
  finally:
    jax.monitoring.unregister_event_duration_listener(count)


def _wait_for(compiles, n, timeout=120.0):
  """Waits until `compiles` holds `n` entries (a background thread's compilations)."""
  deadline = time.time() + timeout
  while len(compiles) < n and time.time() < deadline:
    time.sleep(0.1)


def _tensorboard_tags(workdir):
  """The scalar tags of the run's TensorBoard event files, read back (TFRecord framing: length,
  its CRC, an `Event` proto, its CRC)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  tags = set()
  tb = os.path.join(workdir, "tb")
  for name in os.listdir(tb):
    with open(os.path.join(tb, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      tags.update(v.tag for v in event.summary.value)
      pos += 16 + length
  return tags


class FaultyWorkflow(workflow_lib.Workflow):
  """A workflow whose hypothesis reward raises and whose code never returns (sandbox timeouts).

  Whatever the model writes in the code stage is taken as an endless loop.
  """

  def __init__(self, config, pool, **kwargs):
    super().__init__(config, pool, **kwargs)
    for stage in self.stages:
      if stage.kind == "hypothesis":
        def score(episodes, parsed, pool, guard):
          raise RuntimeError("reward bug")
        stage.score = score

  @staticmethod
  def _parse(stage, ep, output):
    if stage.kind == "code":
      return HANG
    return workflow_lib.Workflow._parse(stage, ep, output)


class SignalingWorkflow(workflow_lib.Workflow):
  """A workflow that sends SIGTERM to this process when it closes its `at`-th training stage
  (counted over all instances; evaluation's workflows, which score with `reward_mode=fraction`,
  are not counted; the sandbox job runs in the agent loop's thread, so the signal lands at any
  point of the main loop)."""
  calls = 0
  at = 0

  def close_stage(self, episodes, outputs):
    if self.config.reward_mode == stages_lib.FRACTION:  # an evaluation episode
      return super().close_stage(episodes, outputs)
    SignalingWorkflow.calls += 1
    if SignalingWorkflow.calls == SignalingWorkflow.at:
      os.kill(os.getpid(), signal.SIGTERM)
    return super().close_stage(episodes, outputs)


_WALL_CLOCK = metric_rows.WALL_CLOCK


def _history(workdir):
  return [{k: v for k, v in r.items() if k not in _WALL_CLOCK} for r in _rows(workdir)]


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


class TrainTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits(
        cpu_seconds=1.0, wall_seconds=0.5))

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def test_pass_at_k(self):
    self.assertEqual(train.pass_at_k(4, 0, 1), 0.0)
    self.assertEqual(train.pass_at_k(4, 4, 2), 1.0)
    self.assertAlmostEqual(train.pass_at_k(4, 1, 1), 0.25)
    self.assertAlmostEqual(train.pass_at_k(4, 1, 2), 0.5)  # 1 - C(3,2)/C(4,2)
    self.assertAlmostEqual(train.pass_at_k(5, 2, 3), 1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    with self.assertRaisesRegex(ValueError, "k <= n"):
      train.pass_at_k(2, 1, 3)

  def test_paired_gain(self):
    before = np.array([1, 0, 0, 1, 0, 1, 0, 0], bool)
    after = np.array([1, 1, 0, 1, 1, 0, 0, 1], bool)
    gain, stderr = train.paired_gain(before, after)
    d = after.astype(float) - before
    self.assertAlmostEqual(gain, after.mean() - before.mean())
    self.assertAlmostEqual(stderr, np.std(d, ddof=1) / np.sqrt(8))
    # Agreeing tasks add no variance: identical results give gain 0 with standard error 0.
    self.assertEqual(train.paired_gain(before, before), (0.0, 0.0))
    with self.assertRaisesRegex(ValueError, "same shape"):
      train.paired_gain(before, after[:4])
    with self.assertRaisesRegex(ValueError, "at least 2"):
      train.paired_gain(before[:1], after[:1])

  @parameterized.named_parameters(("agentic", tiny_codegen), ("outcome", outcome_grpo),
                                  ("full_workflow", full_workflow),
                                  ("code_debug", code_debug))
  def test_experiment_runs_two_steps(self, module):
    cfg = _micro(module)
    workdir = self.create_tempdir().full_path
    result = train.run(cfg, workdir, pool=self.pool)
    self.assertEqual(result["step"], 2)
    self.assertIsNone(result["incomplete"])
    rows = _rows(workdir)
    self.assertEqual([r["phase"] for r in rows], ["warmstart", "rl"])
    self.assertEqual([r["step"] for r in rows], [1, 2])
    for r in rows:
      for key in ("eval/pass_at_1", "eval/pass_at_1_sampled", "eval/pass_at_2_sampled", "seconds"):
        self.assertIn(key, r)
        self.assertBetween(r[key], 0.0, 1e9)
    ws, rl = rows
    self.assertAlmostEqual(rl["eval/pass_at_1_gain"], rl["eval/pass_at_1"] - ws["eval/pass_at_1"])
    self.assertNotIn("eval/pass_at_1_gain", ws)
    for r in rows:
      p = r["eval/pass_at_1"]
      self.assertAlmostEqual(r["eval/pass_at_1_stderr"], np.sqrt(p * (1 - p) / 2))
    first_stage = module.get_config().workflow.stages[0]
    for key in ("loss/loss", "loss/clip_fraction", "loss/kl", f"reward/{first_stage}",
                "tokens_per_s", "replay/total_stale_dropped_segments",
                "replay/total_corrections", "loss/entropy", f"signal/tied_groups_{first_stage}",
                "rl/episodes_per_s", "rl/episodes_per_s_phase", "rl/seconds"):
      self.assertIn(key, rl)
    self.assertGreater(rl["loss/entropy"], 0.0)  # a random policy is far from deterministic
    self.assertBetween(rl[f"signal/tied_groups_{first_stage}"], 0.0, 1.0)
    # The headroom at the RL temperature, at the warm-start and at the end: pass@G >= pass@1.
    for r in rows:
      for where in ("heldout", "train"):
        p1, pg = r[f"headroom/{where}_pass_at_1"], r[f"headroom/{where}_pass_at_G"]
        self.assertBetween(p1, 0.0, 1.0)
        self.assertBetween(pg, p1, 1.0)
    summary = result["summary"]
    self.assertEqual(summary["warmstart/heldout_pass_at_G"], ws["headroom/heldout_pass_at_G"])
    self.assertEqual(summary["final/train_pass_at_1"], rl["headroom/train_pass_at_1"])
    self.assertEqual(summary["entropy_last"], rl["loss/entropy"])
    self.assertEqual(summary["episodes_per_s"], rl["rl/episodes_per_s_phase"])
    if module is outcome_grpo:
      self.assertEqual(rl["replay/total_provisional_items"], 0.0)
    for name in ("learning_curve.png", "config.json"):
      self.assertTrue(os.path.exists(os.path.join(workdir, name)), name)
    self.assertEqual(_tensorboard_tags(workdir),
                     {k for r in rows for k, v in r.items()
                      if k != "step" and isinstance(v, (int, float)) and np.isfinite(v)})
    self.assertEqual(checkpointer.Checkpointer(os.path.join(workdir, "checkpoints")
                                                ).latest_step(), 2)

  def test_metric_names_must_be_tensorboard_tags(self):
    writer = train.MetricsWriter(self.create_tempdir().full_path, _micro(tiny_codegen), 1, 0)
    self.addCleanup(writer.close)
    with self.assertRaisesRegex(ValueError, r"eval/pass@1"):
      writer.write({"step": 1, "eval/pass@1": 0.5})
    writer.write({"step": 1, "eval/pass_at_1": 0.5})
    self.assertEqual(writer.pass1, 0.5)

  def test_the_sandbox_section_reaches_every_judge(self):
    # What a stdio job runs under (`execution.program` reads the pool's limits) must be the
    # `sandbox` section, through whatever wraps the pool: the training loop's per-batch counter
    # and evaluation's.
    cfg = _micro(tiny_codegen, **{"sandbox.cpu_s": 3.0, "sandbox.memory_mb": 300,
                                  "sandbox.job_budget_s": 9.0, "sandbox.timeout_s": 1.5})
    comp = train.build(cfg)
    self.addCleanup(comp.pool.close)
    want = cfg.sandbox.limits()
    self.assertEqual((want.cpu_seconds, want.memory_bytes, want.stdio_budget_seconds,
                      want.wall_seconds), (3.0, 300 * 2**20, 9.0, 1.5))
    stdio_task = task_lib.Task("s/1", "Add.", "main", "main()",
                               public_examples=(task_lib.Example(("1 2\n",), "3\n"),),
                               hidden_tests=(task_lib.Example(("2 2\n",), "4\n"),),
                               stdio=task_lib.StdioSpec())
    judges = {"pool": comp.pool,
              "training": streams.CountingPool(comp.workflow_factory().pool),
              "evaluation": comp.make_workflow(streams.CountingPool(comp.pool)).pool}
    for name, pool in judges.items():
      self.assertEqual(pool.limits, want, name)
      program = execution.program(stdio_task, "print(3)", stdio_task.public_examples, pool)
      self.assertEqual((program.time_seconds, program.memory_bytes, program.budget_seconds),
                       (3.0, 300 * 2**20, 9.0), name)

  def test_sample_fn_temperature(self):
    cfg = _micro(tiny_codegen, **{"rl.temperature": 1.0})
    comp = train.build(cfg, pool=self.pool)
    params = placement.init_params(comp.sharded_model, comp.model_config, 0)
    prompts = np.tile(np.arange(1, 9, dtype=np.int32), (4, 1))
    lengths = np.full((4,), 8, np.int32)
    greedy = train.make_sample_fn(comp, 0)(params, prompts, lengths, 1, True)[0]
    hot = train.make_sample_fn(comp, 0)(params, prompts, lengths, 1, False)[0]
    cold = train.make_sample_fn(comp, 0, temperature=1e-4)(params, prompts, lengths, 1, False)[0]
    # A random model at rl.temperature 1 samples near-uniformly; near 0 it samples the argmax.
    np.testing.assert_array_equal(cold, greedy)
    self.assertFalse(np.array_equal(hot, greedy))

  def test_sampled_evaluation_uses_eval_temperature(self):
    cfg = _micro(tiny_codegen, **{"rl.temperature": 0.5, "eval.temperature": 0.8,
                                  "rl.num_steps": 0})
    with mock.patch.object(sampling_lib, "make_sample_fn",
                           wraps=sampling_lib.make_sample_fn) as made:
      train.run(cfg, self.create_tempdir().full_path, pool=self.pool)
    temperatures = [c.kwargs.get("temperature") for c in made.call_args_list]
    self.assertIn(None, temperatures)  # the agent loop's: rl.temperature
    self.assertIn(0.8, temperatures)  # sampled pass@k

  def test_continuous_sampler_run_equals_static(self):
    # Same seed, same metrics rows (rewards, losses, evaluation) up to rounding: the continuous
    # sampler draws each row with the static sampler's key, so the runs sample the same tokens.
    overrides = {"rl.num_steps": 3, "task.eval_size": 4}
    histories, first_stage = {}, {}
    make_sample_fn = sampling_lib.make_sample_fn

    def recording(name):
      def make(*args, **kwargs):
        inner = make_sample_fn(*args, **kwargs)

        def sample_fn(params, prompts, lengths, counter, greedy):
          out = inner(params, prompts, lengths, counter, greedy)
          first_stage.setdefault(name, (counter, greedy) + tuple(np.asarray(x) for x in out))
          return out
        return sample_fn
      return make

    for name in ("static", "continuous"):
      cfg = _micro(tiny_codegen, **overrides, **{"rl.sampler": name})
      workdir = self.create_tempdir().full_path
      with mock.patch.object(sampling_lib, "make_sample_fn", recording(name)):
        self.assertEqual(train.run(cfg, workdir, pool=self.pool)["step"], 4)
      histories[name] = _history(workdir)
    # The first sampled stage: the same tokens, lengths and (up to rounding) log-probs.
    static, continuous = first_stage["static"], first_stage["continuous"]
    self.assertEqual(static[:2], continuous[:2])
    np.testing.assert_array_equal(static[2], continuous[2])
    np.testing.assert_array_equal(static[3], continuous[3])
    np.testing.assert_allclose(static[4], continuous[4], atol=1e-5)
    # Every row has the same keys and values; the log-probs' rounding reaches only statistics
    # of the behaviour log-probs (here `loss/approx_kl`, at 1e-14).
    self.assertLen(histories["continuous"], 4)
    for want, got in zip(histories["static"], histories["continuous"], strict=True):
      self.assertEqual(sorted(want), sorted(got))
      for key, value in want.items():
        if isinstance(value, float):
          self.assertAlmostEqual(value, got[key], delta=1e-9, msg=key)
        else:
          self.assertEqual(value, got[key], key)

  def test_reused_prefixes_run_equals_full_prefills(self):
    # One device, rl.reuse_prefix='same_version': stages that continue a conversation saved by
    # the same policy version start from its rows, and the run's rows are those of a run that
    # prefills every context whole, up to float rounding; the reuse shows in the counters.
    # Outcome-only (no stage rows): no update lands between an episode's stages, so they
    # reuse; the final rewards' updates between batches make the next batch's versions new.
    overrides = {"rl.num_steps": 3, "task.eval_size": 4, "rl.sampler": "continuous",
                 "workflow.stage_rewards": False}
    histories = {}
    for reuse in ("never", "same_version"):
      cfg = _micro(tiny_codegen, **overrides, **{"rl.reuse_prefix": reuse})
      workdir = self.create_tempdir().full_path
      self.assertEqual(train.run(cfg, workdir, pool=self.pool)["step"], 4)
      histories[reuse] = _history(workdir)
    prefix_keys = lambda row: {k for k in row if k.startswith(("loop/prefix", "loop/prefixes"))}
    last = histories["same_version"][-1]
    self.assertGreater(last["loop/prefix_reused_tokens"], 0)
    self.assertGreater(last["loop/prefix_hits"], 0)
    self.assertEqual(last["loop/prefix_stale_hits"], 0)
    self.assertLen(histories["same_version"], 4)
    for want, got in zip(histories["never"], histories["same_version"], strict=True):
      self.assertFalse(prefix_keys(want))
      self.assertEqual(sorted(want), sorted(set(got) - prefix_keys(got)))
      for key, value in want.items():
        if isinstance(value, float):
          self.assertAlmostEqual(value, got[key], delta=1e-6, msg=key)
        else:
          self.assertEqual(value, got[key], key)

  def test_always_reused_prefixes_take_rows_of_earlier_versions(self):
    # Stage rewards: a provisional update lands between an episode's stages, so with 'always'
    # the next stage starts from rows of the version before (counted as stale hits).
    cfg = _micro(tiny_codegen, **{"rl.num_steps": 2, "rl.sampler": "continuous",
                                  "rl.reuse_prefix": "always"})
    workdir = self.create_tempdir().full_path
    self.assertEqual(train.run(cfg, workdir, pool=self.pool)["step"], 3)
    last = _rows(workdir)[-1]
    self.assertGreater(last["loop/prefix_stale_hits"], 0)
    self.assertGreater(last["loop/prefix_reused_tokens"], 0)

  @parameterized.parameters(("rl.reuse_prefix", "sometimes"), ("rl.prefix_cache_mb", 0))
  def test_bad_prefix_option_names_the_field(self, key, value):
    with self.assertRaisesRegex(ValueError, re.escape(f"config.{key}")):
      _micro(tiny_codegen, **{"rl.sampler": "continuous", key: value})

  def test_reused_prefixes_need_the_continuous_sampler_and_one_device(self):
    with self.assertRaisesRegex(ValueError, r"config\.rl\.reuse_prefix needs "
                                            r"rl\.sampler='continuous'"):
      _micro(tiny_codegen, **{"rl.reuse_prefix": "same_version"})
    cfg = _micro(tiny_codegen, **{"rl.sampler": "continuous", "rl.reuse_prefix": "always",
                                  "mesh.data": 2})
    with self.assertRaisesRegex(ValueError, r"config\.rl\.reuse_prefix .*one device.* 2"):
      train.make_sample_fn(train.build(cfg, pool=self.pool), 0)

  def test_continuous_sample_fn_logprobs_are_the_learners(self):
    # Fewer slots than rows (refilled as rows finish), prompts of several lengths, top-k: the
    # behaviour log-probs are what the learner recomputes over prompt + completion.
    cfg = _micro(tiny_codegen, **{"rl.sampler": "continuous", "rl.sampler_slots": 2,
                                  "rl.temperature": 0.7, "rl.top_k": 20})
    comp = train.build(cfg, pool=self.pool)
    params = placement.init_params(comp.sharded_model, comp.model_config, 0)
    rng = np.random.default_rng(0)
    lengths = np.array([9, 40, 3, 27, 64, 15], np.int32)
    prompts = np.zeros((6, 64), np.int32)
    for i, n in enumerate(lengths):
      prompts[i, :n] = rng.integers(1, 200, size=n)
    sample_fn = train.make_sample_fn(comp, 0, transfer_guard="disallow")
    tokens, out_len, logprobs = sample_fn(params, prompts, lengths, 3, False)
    self.assertEqual(tokens.shape, (6, cfg.workflow.max_new_tokens))
    joined, positions, segment_mask, _ = sampler_lib.join_prompt_completion(
        prompts, lengths, tokens, out_len)
    transform = cfg.rl.transform(vocab_limit=sampling_lib.vocab_limit(comp))
    lp = np.asarray(transformer.sequence_logprobs(comp.graphdef, params, joined, positions,
                                                  segment_mask, transform))
    t = cfg.workflow.max_new_tokens
    idx = np.minimum(lengths[:, None] + np.arange(t)[None], lp.shape[1] - 1)
    want = np.where(np.arange(t)[None] < out_len[:, None],
                    np.take_along_axis(lp, idx, axis=1), 0.0)
    np.testing.assert_allclose(logprobs, want, atol=2e-5)
    # The static sampler of the same run: the same tokens for the same counter.
    static = dataclasses.replace(comp, cfg=_micro(tiny_codegen, **{"rl.temperature": 0.7,
                                                                   "rl.top_k": 20}))
    got = train.make_sample_fn(static, 0)(params, prompts, lengths, 3, False)
    np.testing.assert_array_equal(got[0], tokens)
    np.testing.assert_array_equal(got[1], out_len)

  @parameterized.parameters((6, 5), (8, 4))  # rows not in groups of rl.group_size=4; in two
  def test_static_sample_fn_compacts_the_decode(self, rows, compact_to):
    cfg = _micro(tiny_codegen, **{"rl.sampler_compact_to": compact_to, "rl.group_size": 4})
    comp = train.build(cfg, pool=self.pool)
    params = placement.init_params(comp.sharded_model, comp.model_config, 0)
    prompts = np.random.default_rng(0).integers(1, 200, size=(rows, 16)).astype(np.int32)
    lengths = np.full((rows,), 16, np.int32)
    seen = []
    real = sampler_lib.sample

    def spy(*args, **kwargs):
      seen.append((kwargs.get("compact_to"), kwargs.get("prefix_group", 1)))
      return real(*args, **kwargs)

    with mock.patch.object(sampler_lib, "sample", spy):
      train.make_sample_fn(comp, 0)(params, prompts, lengths, 3, False)
    self.assertEqual(seen, [(compact_to, 1 if rows % 4 else 4)])

  @parameterized.parameters(("rl.sampler", "dynamic"), ("rl.sampler_slots", -1),
                            ("rl.precompile_rows", (2, 0)), ("rl.sampler_compact_to", -1),
                            ("rl.sampler_compact_to", True))
  def test_bad_sampler_option_names_the_field(self, key, value):
    with self.assertRaisesRegex(ValueError, re.escape(f"config.{key}")):
      _micro(tiny_codegen, **{key: value})

  def test_update_shapes_compiled_ahead_are_not_compiled_again(self):
    cfg = _micro(tiny_codegen, **{"rl.precompile_rows": (1, 2), "rl.packed_buckets": (160,),
                                  "rl.update_chunk_rows": 0, "rl.loss_slot_fractions": ()})
    comp = train.build(cfg, pool=self.pool)
    device = device_lib.DeviceSide(comp)
    self.assertEqual(device.rl_update_shapes(), [(1, 160), (2, 160)])
    sampler_lib._sharded_prefill.cache_clear()  # another test's run may have compiled it
    with _counting_compiles() as compiles:
      device.compile_rl_updates()
      device.start_rl()
      # The background threads': the two update steps, then the sampler's prefills of a
      # training stage's 2 rows at the one prompt bucket, whole and shared-prefix.
      _wait_for(compiles, 4)
      self.assertLen(compiles, 4)
      traces = device.num_traces["update"]  # the step is cached: other tests may have traced it
      for rows in (1, 2):
        batch = core_types.UpdateBatch.padding(rows, 160, packed=True)
        device.fetch([device.update(batch, rows, cfg.rl.buckets)])
      self.assertLen(compiles, 4)  # no new compilation: both ran the programs compiled ahead
      self.assertEqual(device.num_traces["update"], traces)
      device.fetch([device.update(core_types.UpdateBatch.padding(4, 160, packed=True), 4,
                                  cfg.rl.buckets)])
      self.assertLen(compiles, 5)  # a shape not named compiles on first use
    self.assertEqual(sampler_lib._sharded_prefill.cache_info().currsize, 2)
    # The sampler's first calls with a training stage's rows, prefilled whole (no shared
    # prefix) and in two parts (a long one), take the programs compiled ahead (their
    # compiled cache: placement_test).
    fn = train.make_sample_fn(comp, 0)
    prompts = np.random.RandomState(0).randint(3, 200, (2, 100)).astype(np.int32)
    for shared in (False, True):
      if shared:
        prompts[1, :90] = prompts[0, :90]
      cached = sampler_lib._sharded_prefill
      hits = cached.cache_info().hits
      with mock.patch.object(sampler_lib, "_sharded_prefill", wraps=cached) as spy:
        tokens, _, _ = fn(device.policy, prompts, np.array([100, 96], np.int32), 1, False)
      self.assertEqual(spy.call_args.args[4], 1 if shared else None)  # the groups
      self.assertEqual(cached.cache_info().hits, hits + 1)
      self.assertEqual(cached.cache_info().currsize, 2)
      self.assertLen(tokens, 2)

  def test_a_narrower_prefill_compiled_ahead_is_taken(self):
    # rl.prefill_widths=(64,) below the 128 bucket: the RL prefills compiled ahead include the
    # whole-prompt one at 64 slots, and a call whose prompts fit 64 takes it, with the
    # bucket's decode: it compiles nothing.
    cfg = _micro(tiny_codegen, **{"rl.prefill_widths": (64,), "rl.shared_prefill": False})
    comp = train.build(cfg, pool=self.pool)
    device = device_lib.DeviceSide(comp)
    sampler_lib._sharded_prefill.cache_clear()
    sampler_lib._sharded_decode.cache_clear()
    with _counting_compiles() as compiles:
      sampling_lib.compile_rl_prefills(comp, device.policy)
      self.assertLen(compiles, 2)  # the whole prefill at 128 slots and at 64
      fn = sampling_lib.make_sample_fn(comp, 0)
      prompts = np.random.RandomState(0).randint(3, 200, (2, 100)).astype(np.int32)
      # A call at the bucket's width compiles the decode (and the call's small programs).
      fn(device.policy, prompts, np.array([100, 41], np.int32), 1, False)
      before = len(compiles)
      with mock.patch.object(sampler_lib, "sample", wraps=sampler_lib.sample) as spy:
        tokens, _, _ = fn(device.policy, prompts[:, :60], np.array([60, 41], np.int32), 2,
                          False)
      self.assertEqual(spy.call_args.kwargs["prefill_width"], 64)
      self.assertLen(compiles, before)  # nothing compiled: the prefill ahead, the same decode
    self.assertLen(tokens, 2)

  def test_ppo_epochs_take_that_many_optimizer_steps_on_the_same_rows(self):
    # GRPO's μ iterations: an update of rl.ppo_epochs=2 equals two updates of 1 on its rows
    # (a constant learning rate, so that the two runs' schedules agree step for step).
    common = {"optim.schedule": "constant", "optim.warmup_steps": 0}
    rs = np.random.RandomState(0)
    batch = core_types.UpdateBatch.padding(2, 160, packed=True)
    batch.tokens[:] = rs.randint(3, 200, batch.tokens.shape)
    batch.positions[:] = np.arange(160)[None]
    batch.loss_mask[:, 100:] = True
    batch.sample_weights[:] = 1.0
    # Positive advantages and behaviour log-probs above the random policy's (ratio < 1 - eps):
    # PPO's clipped objective keeps the unclipped side, so every pass has a gradient.
    batch.advantages[:] = np.where(batch.loss_mask, np.array([[1.0], [0.5]]), 0.0)
    batch.behaviour_logprobs[:] = np.where(batch.loss_mask, -5.0, 0.0)
    params = {}
    for epochs, updates in ((2, 1), (1, 2), (1, 1)):
      cfg = _micro(tiny_codegen, **common, **{"rl.ppo_epochs": epochs,
                                              "rl.packed_buckets": (160,)})
      device = device_lib.DeviceSide(train.build(cfg, pool=self.pool))
      device.start_rl()
      for _ in range(updates):
        device.fetch([device.update(batch, 2, cfg.rl.buckets)])
      params[epochs, updates] = jax.tree.map(np.asarray, device.state.params)
    chex.assert_trees_all_close(params[2, 1], params[1, 2], atol=1e-6)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), params[2, 1],
                                         params[1, 1]))
    self.assertGreater(max(moved), 1e-6)  # the second pass is a step of its own

  @parameterized.parameters(
      ("seq_mean_token_sum_norm", 1, True, 6, ()), ("token_mean", 1, True, 6, (0.5,)),
      ("seq_mean_token_mean", 1, False, 6, (0.5,)), ("seq_mean_token_sum_norm", 2, False, 6, ()),
      ("token_mean", 2, True, 6, (0.25, 0.5)), ("seq_mean_token_sum_norm", 4, True, 8, ()))
  def test_chunked_update_equals_the_whole_step(self, aggregation, data, packed, slots,
                                                fractions):
    # rl.update_chunk_rows: 5 real rows and 3 padding rows (a row bucket of 8) in chunks of 2
    # rows (3 chunks, the last half padding) make the update of the whole batch. On a data-4
    # mesh a chunk is 4 rows (whole shards): 2 chunks. With rl.loss_slot_fractions the rows'
    # 40-50 loss tokens are scored at 80 of their 160 slots (the chunks' and the whole
    # batch's), the chunk of padding rows at the smallest width.
    rs = np.random.RandomState(1)
    batch = core_types.UpdateBatch.padding(8, 160, packed=packed)
    batch.tokens[:5] = rs.randint(3, 200, (5, 160))
    if packed:
      batch.positions[:5] = np.arange(160)[None]
    batch.loss_mask[:5, 100:] = rs.rand(5, 60) < 0.7
    batch.sample_weights[:5] = 1.0
    batch.advantages[:] = np.where(batch.loss_mask, rs.randn(8, 1), 0.0)
    batch.behaviour_logprobs[:] = np.where(batch.loss_mask, -5.5, 0.0)
    self.assertBetween(int(batch.loss_mask.sum(1).max()), 40, 80)
    got = {}
    runs = ((0, ()), (2, fractions)) + (((0, fractions),) if fractions else ())
    for chunk, fracs in runs:
      cfg = _micro(tiny_codegen, **{"rl.update_chunk_rows": chunk, "rl.rows_per_update": 8,
                                    "loss.aggregation": aggregation, "rl.pack_prefix": packed,
                                    "rl.packed_buckets": (160,), "mesh.data": data,
                                    "rl.buckets": (160,), "model.max_seq_len": 256,
                                    "rl.loss_slot_fractions": fracs})
      device = device_lib.DeviceSide(train.build(cfg, pool=self.pool))
      device.start_rl()
      pending = device.update(batch, 8, cfg.rl.buckets)
      metrics = device.fetch([pending])[0]
      got[chunk, fracs] = (jax.tree.map(np.asarray, device.state.params), metrics, pending)
    want = got[0, ()]
    for run in runs[1:]:
      chex.assert_trees_all_close(got[run][0], want[0], atol=2e-6)
      for key in ("loss", "pg_loss", "entropy", "clip_fraction", "ratio_mean", "grad_norm",
                  "loss_tokens"):
        np.testing.assert_allclose(got[run][1][key], want[1][key], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{run} {key}")
    got[0], got[2] = want, got[2, fractions]
    self.assertGreater(got[0][1]["grad_norm"], 0.0)
    self.assertIsNone(got[0][2].row_slots)
    self.assertEqual(got[2][2].row_slots, slots)  # 5 real rows in whole chunks
    self.assertEqual(got[2][2].tokens, slots * 160)

  def test_chunked_update_compiles_its_programs_ahead_once(self):
    # With rl.update_chunk_rows, compile_rl_updates compiles the chunk's gradient programs at
    # the one packed length (every slot scored, and at rl.loss_slot_fractions' one width), the
    # zero accumulator and the optimizer step; updates of any row count then compile nothing.
    cfg = _micro(tiny_codegen, **{"rl.precompile_rows": (1,), "rl.packed_buckets": (160,),
                                  "rl.update_chunk_rows": 2, "rl.rows_per_update": 8,
                                  "rl.loss_slot_fractions": (0.25,)})
    device = device_lib.DeviceSide(train.build(cfg, pool=self.pool))
    self.assertEqual(device.rl_update_shapes(), [(2, 160)])
    sampler_lib._sharded_prefill.cache_clear()  # another test's run may have compiled it
    with _counting_compiles() as compiles:
      device.compile_rl_updates()
      device.start_rl()
      _wait_for(compiles, 6)  # and the sampler's two prefills
      self.assertLen(compiles, 6)
      for rows, loss_tokens in ((1, 3), (3, 0), (8, 60)):  # 60 > a quarter: every slot
        batch = core_types.UpdateBatch.padding(rows, 160, packed=True)
        batch.sample_weights[:] = 1.0
        batch.loss_mask[:, 1:1 + loss_tokens] = True
        pending = device.update(batch, rows, cfg.rl.buckets)
        device.fetch([pending])
        self.assertEqual(pending.row_slots, -(-rows // 2) * 2)
      self.assertLen(compiles, 6)
      self.assertEqual(device.num_traces["update"], 2)

  @parameterized.parameters(({"rl.update_chunk_rows": 3},),
                            ({"rl.update_chunk_rows": -1},),
                            ({"rl.update_chunk_rows": 2, "rl.micro_batches": 2},))
  def test_bad_update_chunk_rows_names_the_field(self, overrides):
    with self.assertRaisesRegex(ValueError, re.escape("config.rl.update_chunk_rows")):
      _micro(tiny_codegen, **overrides)

  @parameterized.parameters(0, -1)
  def test_bad_ppo_epochs_names_the_field(self, value):
    with self.assertRaisesRegex(ValueError, re.escape("config.rl.ppo_epochs")):
      _micro(tiny_codegen, **{"rl.ppo_epochs": value})

  def test_continuous_sampler_refuses_several_processes(self):
    cfg = _micro(tiny_codegen, **{"rl.sampler": "continuous"})
    comp = types.SimpleNamespace(cfg=cfg, coord=types.SimpleNamespace(process_count=2))
    with self.assertRaisesRegex(ValueError, r"config\.rl\.sampler .*single process.* 2 "
                                            r"processes"):
      train.make_sample_fn(comp, 0)

  def test_faults_are_counted_and_do_not_stop_the_run(self):
    cfg = _micro(tiny_codegen, **{"rl.num_steps": 4})
    workdir = self.create_tempdir().full_path
    result = train.run(cfg, workdir, pool=self.pool, workflow_factory=FaultyWorkflow)
    self.assertEqual(result["step"], 5)
    last = _rows(workdir)[-1]
    self.assertGreater(last["counts/errors/hypothesis"], 0)  # The raising reward.
    self.assertGreater(last["counts/timeout"], 0)  # The hanging programs.
    # Updates are chunked (`rl.update_chunk_rows`): one packed row length, so the (cached)
    # gradient program compiled once, whatever the updates' row counts.
    comp = train.build(cfg, pool=self.pool)
    chunked = learner.make_chunked_update(comp.graphdef, cfg, train.rl_optimizer(cfg),
                                          shardings=comp.shardings,
                                          vocab_limit=sampling_lib.vocab_limit(comp))
    self.assertEqual(chunked.grad.num_traces, 1)

  def test_resume_equals_uninterrupted(self):
    # A pool of 2 training tasks and one task per batch: epochs end every 2 batches. Final
    # rewards land a harvest after their last stage, so some stops leave one pending.
    cfg = _micro(tiny_codegen, **{"warmstart.steps": 2, "rl.num_steps": 6,
                                  "task.train_size": 2, "eval.num_samples": 0,
                                  "checkpoint.every": 0, "rl.final_reward_lag": 1})
    total = 8
    full = self.create_tempdir().full_path
    train.run(cfg, full, pool=self.pool)
    want = self._final(full, cfg)
    positions, pending_finals = [], []
    # Mid-warm-start, then mid-RL; right after the phase change; and mid-RL from a checkpoint
    # in an earlier version's layout (no `master` node, no metric counters in the meta).
    for stops, earlier in (((1, 5), False), ((3,), False), ((5,), True)):
      parts = self.create_tempdir().full_path
      resumed_logs = []
      for stop in stops:
        with self.assertLogs(level="WARNING") as logs:
          absl_logging.warning("resuming")
          result = train.run(cfg, parts, pool=self.pool, stop_after=stop)
        resumed_logs += logs.output
        self.assertEqual(result["step"], stop)
        meta = self._final(parts, cfg)[2]
        if meta["phase"] == "rl":
          positions.append(meta["data_position"])
          pending_finals.append(len(meta["loop"]["finals"]))
      if earlier:
        directory = os.path.join(parts, "checkpoints")
        old_checkpoints.downgrade_to_pre_master(directory, stops[-1])
        old_checkpoints.drop_meta_keys(directory, stops[-1], ["counters"])
        saved = checkpoint_layout.saved_tree(os.path.join(directory, str(stops[-1]), "state"))
        self.assertNotIn("master", saved["state"])
        with self.assertLogs(level="WARNING") as logs:
          train.run(cfg, parts, pool=self.pool)
        self.assertTrue(any("meta lacks 'counters'" in line for line in logs.output))
      else:
        with self.assertLogs(level="WARNING") as logs:
          absl_logging.warning("resuming")
          train.run(cfg, parts, pool=self.pool)
        resumed_logs += logs.output
      got = self._final(parts, cfg)
      self._assert_same(want, got, stops)
      # A checkpoint of this version (mid-warm-start included, which has no RL-phase state)
      # restores without a record filled in as if written by an earlier version.
      self.assertEqual([line for line in resumed_logs if " lacks " in line], [])
      # The warm-start's per-task results survive the restart: the paired gain is reported.
      self.assertEqual(_rows(parts)[-1]["eval/pass_at_1_gain"], _rows(full)[-1]["eval/pass_at_1_gain"])
    self.assertEqual(want[2]["step"], total)
    # Some RL stop fell right on an epoch boundary of the 2-task pool.
    self.assertTrue(any(p > 0 and p % 2 == 0 for p in positions), positions)
    # Some RL stop left a batch scored to its last stage, its final reward pending.
    self.assertTrue(any(pending_finals), pending_finals)

  def test_kl_run_resumes_in_both_phases(self):
    # With a reference-KL penalty the reference policy exists from the RL phase on: a run
    # stopped in the warm-start (no reference saved) and again in the RL phase resumes both
    # times and ends with the same state and reference as an uninterrupted run.
    cfg = _micro(tiny_codegen, **{"warmstart.steps": 2, "rl.num_steps": 3,
                                  "loss.kl_beta": 0.1, "eval.num_samples": 0,
                                  "checkpoint.every": 0})
    full, parts = self.create_tempdir().full_path, self.create_tempdir().full_path
    train.run(cfg, full, pool=self.pool)
    for stop in (1, 3):
      self.assertEqual(train.run(cfg, parts, pool=self.pool, stop_after=stop)["step"], stop)
    self.assertEqual(train.run(cfg, parts, pool=self.pool)["step"], 5)
    comp = train.build(cfg, pool=self.pool)
    params = placement.init_params(comp.sharded_model, comp.model_config, 0)
    abstract = {"state": learner.init_state(params, learner.make_optimizer(cfg.optim), 0),
                "ref": params}
    want, got = [checkpointer.Checkpointer(os.path.join(d, "checkpoints")).restore(
        None, abstract)[0] for d in (full, parts)]
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def test_resume_refuses_config_drift_and_keeps_config_json(self):
    cfg = _micro(tiny_codegen)
    workdir = self.create_tempdir().full_path
    self.assertEqual(train.run(cfg, workdir, pool=self.pool, stop_after=1)["step"], 1)
    saved = os.path.join(workdir, "config.json")
    with open(saved) as f:
      before = f.read()
    with self.assertRaisesRegex(config_drift.ConfigDriftError,
                                r"config\.rl\.group_size: 2 -> 4"):
      train.run(_micro(tiny_codegen, **{"rl.group_size": 4, "eval.every": 1}), workdir,
                pool=self.pool)
    with open(saved) as f:
      self.assertEqual(f.read(), before)
    # A changed evaluation cadence resumes (and is the config saved from then on).
    result = train.run(_micro(tiny_codegen, **{"eval.every": 1}), workdir, pool=self.pool)
    self.assertEqual(result["step"], 2)
    with open(saved) as f:
      self.assertEqual(json.load(f)["eval"]["every"], 1)

  @parameterized.named_parameters(("kept", True, 1), ("kept_without_periodic_saves", True, 0),
                                  ("rotated_away", False, 1))
  def test_warmstart_checkpoint_is_kept_through_rotation(self, keep, every):
    # Three warm-start steps, two RL updates, one checkpoint kept by rotation: the end of the
    # warm-start survives the RL phase's checkpoints (and is written even when `every` skips
    # it), and restores as the warm-start's end.
    cfg = _micro(tiny_codegen, **{"warmstart.steps": 3, "rl.num_steps": 2,
                                  "eval.num_samples": 0, "checkpoint.every": every,
                                  "checkpoint.max_to_keep": 1,
                                  "checkpoint.keep_warmstart": keep})
    workdir = self.create_tempdir().full_path
    self.assertEqual(train.run(cfg, workdir, pool=self.pool)["step"], 5)
    ck = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))
    if not keep:
      self.assertEqual(ck.all_steps(), [5])
      return
    self.assertEqual(ck.all_steps(), [3, 5])
    self.assertEqual(ck.problems(3), [])
    state, _, meta = self._final(workdir, cfg, step=3)
    self.assertEqual((meta["phase"], meta["step"]), ("warmstart", 3))
    self.assertEqual(int(state["state"].step), 3)  # the warm-start's optimizer state
    self.assertLen(meta["warmstart_passed"], cfg.task.eval_size)  # its held-out results
    ws_row = [r for r in _rows(workdir) if r["step"] == 3]
    self.assertEqual(ws_row[0]["phase"], "warmstart")
    self.assertAlmostEqual(np.mean(meta["warmstart_passed"]), ws_row[0]["eval/pass_at_1"])

  def test_sigterm_checkpoints_and_resumes_exactly(self):
    # SIGTERM mid-RL: the run finishes its step, checkpoints (replay, in-flight episodes and the
    # unlogged metrics included) and raises Preempted; the restart continues the same history.
    cfg = _micro(tiny_codegen, **{"warmstart.steps": 1, "rl.num_steps": 5,
                                  "eval.num_samples": 0, "checkpoint.every": 0})
    full, parts = self.create_tempdir().full_path, self.create_tempdir().full_path
    train.run(cfg, full, pool=self.pool, transfer_guard="disallow")
    # The 3rd training stage closes after two RL updates (of five): the stop lands mid-RL.
    SignalingWorkflow.calls, SignalingWorkflow.at = 0, 3
    with self.assertRaisesRegex(train.Preempted, "SIGTERM") as stopped:
      train.run(cfg, parts, pool=self.pool, workflow_factory=SignalingWorkflow)
    self.assertBetween(stopped.exception.step, 2, 5)
    saved = checkpointer.Checkpointer(os.path.join(parts, "checkpoints"))
    self.assertEqual(saved.latest_step(), stopped.exception.step)
    self.assertEqual(saved.read_meta()["phase"], "rl")
    self.assertEqual(train.run(cfg, parts, pool=self.pool)["step"], 6)
    self.assertEqual(_history(parts), _history(full))
    self._assert_same(self._final(full, cfg), self._final(parts, cfg), "SIGTERM")

  def test_prompts_longer_than_every_bucket_stop_at_startup(self):
    cfg = _micro(tiny_codegen, **{"rl.buckets": (64,), "warmstart.seq_len": 64,
                                  "workflow.max_new_tokens": 40})
    with self.assertRaisesRegex(train.StartupCheckError,
                                r"config\.rl\.buckets.*raise --config\.rl\.buckets to at least"):
      train.build(cfg, pool=self.pool)

  @parameterized.named_parameters(
      ("tied_rewards", (128,), (3, 4), "all advantages 0"),
      # Two public examples: some first-stage contexts fit a 64-token bucket (the startup check
      # passes), the later stages' do not.
      ("stages_skipped_for_length", (64,), (2, 2), "contexts longer than the largest bucket"))
  def test_rl_without_signal_says_why(self, buckets, num_public, cause):
    cfg = _micro(tiny_codegen, **{"rl.num_steps": 50, "rl.buckets": buckets,
                                  "warmstart.seq_len": buckets[-1], "task.num_public": num_public,
                                  "rl.max_idle_batches": 2, "replay.skip_zero_advantage": True,
                                  "eval.num_samples": 0, "checkpoint.every": 0})
    result = train.run(cfg, self.create_tempdir().full_path, pool=self.pool)
    self.assertLess(result["step"], 51)
    self.assertIn("ended early", result["incomplete"])
    self.assertIn("rl.max_idle_batches=2", result["incomplete"])
    self.assertIn(cause, result["incomplete"])
    # With its counts, each at most its total (evaluation's samples are not among them).
    found = re.search(r"(\d+) of (?:the )?(\d+) (?:training stage samples were skipped|groups "
                      r"finished had equal final rewards)", result["incomplete"])
    self.assertIsNotNone(found, result["incomplete"])
    self.assertBetween(int(found[1]), 1, int(found[2]))

  def _final(self, workdir, cfg, step=None):
    comp = train.build(cfg, pool=self.pool)
    opt = learner.make_optimizer(cfg.optim)
    params = placement.init_params(comp.sharded_model, comp.model_config, 0)
    abstract = {"state": learner.init_state(params, opt, 0)}
    ck = checkpointer.Checkpointer(os.path.join(workdir, "checkpoints"))
    return ck.restore(step, abstract)

  def _assert_same(self, want, got, stops):
    (ws, wh, wm), (gs, gh, gm) = want, got
    for a, b in zip(jax.tree.leaves(ws), jax.tree.leaves(gs), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"stops {stops}")
    self.assertEqual(jax.tree.structure(ws), jax.tree.structure(gs))
    for group in ("replay", "loop"):
      self.assertEqual(sorted(wh[group]), sorted(gh[group]))
      for k in wh[group]:
        np.testing.assert_array_equal(wh[group][k], gh[group][k], err_msg=f"{group}/{k}")
    for key in ("step", "phase", "data_position", "replay"):
      self.assertEqual(wm[key], gm[key], msg=f"meta {key}, stops {stops}")
    loop_keys = ("slots", "finals", "harvests", "cursor", "phase", "rng_counter",
                 "stream_position", "next_episode_id")
    for key in loop_keys:
      self.assertEqual(wm["loop"][key], gm["loop"][key], msg=f"loop {key}, stops {stops}")


if __name__ == "__main__":
  absltest.main()
