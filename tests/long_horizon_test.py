"""Tests of the long-horizon task family and its piece-by-piece workflow."""

import time
import types

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentic_grpo import sandbox
from agentic_grpo.agent import references
from agentic_grpo.agent import workflow
from agentic_grpo.agent import workflow_config
from agentic_grpo.tasks import long_horizon as lh
from agentic_grpo.tasks import sources
from agentic_grpo.tasks import synthetic
from agentic_grpo.train import evaluation


class LongHorizonTasksTest(parameterized.TestCase):

  def test_deterministic_and_disjoint_splits(self):
    a, b = lh.LongHorizonTasks(), lh.LongHorizonTasks()
    self.assertEqual(a.task("train", 5), b.task("train", 5))
    train = {t.metadata["program"] + t.metadata["pieces"] for t in a.tasks("train", 0, 200)}
    test = {t.metadata["program"] + t.metadata["pieces"] for t in a.tasks("test", 0, 50)}
    self.assertEmpty(train & test)

  @parameterized.parameters(2, 4, 6)
  def test_pieces_compose_to_the_hidden_outputs(self, k):
    src = lh.LongHorizonTasks(lh.LongHorizonConfig(num_stages=k))
    for t in src.tasks("train", 0, 20):
      ps = lh.pieces(t)
      self.assertLen(ps, k)
      for e in t.hidden_tests:
        x = e.args[0]
        for p in ps:
          x = p.primitive.fn(x)
        self.assertEqual(x, e.expected)
      for p in ps:
        for e in p.examples:
          self.assertEqual(p.primitive.fn(e.args[0]), e.expected)
      outs = [e.expected for e in t.hidden_tests]
      self.assertTrue(any(o != outs[0] for o in outs))  # never constant

  def test_measured_ambiguity_of_the_default(self):
    tasks = list(lh.LongHorizonTasks().tasks("train", 0, 300))
    m = lh.measure_ambiguity(tasks)
    self.assertBetween(m["pieces"], 0.08, 0.2)  # 13% measured
    self.assertBetween(m["tasks"], 0.3, 0.5)  # 41% measured
    self.assertLen(m["per_stage"], 4)

  def test_ambiguity_witness_passes_examples_and_fails_hidden(self):
    src = lh.LongHorizonTasks(lh.LongHorizonConfig(piece_examples=1))
    found = 0
    for t in src.tasks("train", 0, 40):
      for k, p in enumerate(lh.pieces(t)):
        q = lh.piece_ambiguity(t, k)
        if q is None:
          continue
        found += 1
        self.assertTrue(all(q.fn(e.args[0]) == e.expected for e in p.examples))
        prims = list(synthetic.parse_program(t.metadata["program"]).prims)
        prims[k] = q
        rival = synthetic.Program(prims[0].in_type, tuple(prims))
        self.assertTrue(any(rival(e.args[0]) != e.expected for e in t.hidden_tests))
    self.assertGreater(found, 0)

  def test_primitives_restrict_the_pieces(self):
    names = ("sort", "rev", "uniq", "sum", "upper", "srev", "slen")
    src = lh.LongHorizonTasks(lh.LongHorizonConfig(primitives=names))
    used = {p.primitive.name for t in src.tasks("train", 0, 40) for p in lh.pieces(t)}
    self.assertLessEqual(used, set(names))
    self.assertGreater(len(used), 3)
    with self.assertRaisesRegex(ValueError, r"primitives.*'sqrt'"):
      lh.LongHorizonConfig(primitives=("sort", "sqrt"))

  def test_bad_config_and_arguments(self):
    with self.assertRaisesRegex(ValueError, "num_stages"):
      lh.LongHorizonConfig(num_stages=1)
    with self.assertRaisesRegex(ValueError, "piece_examples"):
      lh.LongHorizonConfig(piece_examples=0)
    with self.assertRaisesRegex(ValueError, "split"):
      lh.LongHorizonTasks().task("dev", 0)
    syn = synthetic.SyntheticTasks().task("train", 0)
    with self.assertRaisesRegex(ValueError, "not a long-horizon task"):
      lh.pieces(syn)

  def test_registered_task_source(self):
    section = types.SimpleNamespace(seed=0, depths=(4,), string_prob=0.3, num_hidden=8)
    src = sources.TASK_SOURCES.get("long_horizon")(section)
    self.assertEqual(src.task("test", 2), lh.LongHorizonTasks().task("test", 2))
    with self.assertRaisesRegex(ValueError, r"config\.task\.depths"):
      sources.TASK_SOURCES.get("long_horizon")(types.SimpleNamespace(
          seed=0, depths=(1, 2), string_prob=0.3, num_hidden=8))


class PiecesWorkflowTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits())

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def _wf(self, k=4, **kw):
    return workflow.Workflow(workflow_config.WorkflowConfig(
        stages=("pieces",), num_pieces=k, reward_mode="all_pass", **kw), self.pool)

  def test_held_out_stage_pass_share_is_the_all_pass_stage_reward(self):
    # Each piece written to pass exactly one of its three examples (a lookup of the first):
    # the all-pass stage reward the arms are trained on is 0 for every piece, the fraction
    # the evaluation scores is 1/3. `eval/stage_pass/<stage>` is the former; the ablation's
    # "share of pieces that pass their own examples" once read `eval/reward/<stage>`, the
    # latter (0.555 at the long-horizon warm-start, against a pass share of 0.412).
    tasks = list(lh.LongHorizonTasks().tasks("train", 0, 6))

    def write(name, ctxs):
      del ctxs
      out = []
      for t in tasks:
        first = lh.pieces(t)[int(name[1:]) - 1].examples[0]
        out.append(f"({first.expected!r} if x == {first.args[0]!r} else None)</code>")
      return out

    rewards = {}
    for mode in ("all_pass", "fraction"):
      wf = workflow.Workflow(workflow_config.WorkflowConfig(
          stages=("pieces",), num_pieces=4, reward_mode=mode), self.pool)
      _, results, _ = wf.rollout(tasks, write)
      rewards[mode] = {r.stage: np.asarray(r.rewards)[:, None] for r in results}
    metrics = evaluation.stage_metrics(rewards["fraction"])
    for k in range(1, 5):
      np.testing.assert_allclose(rewards["fraction"][f"g{k}"], 1 / 3)
      self.assertAlmostEqual(metrics[f"eval/reward/g{k}"], 1 / 3)
      self.assertEqual(metrics[f"eval/stage_pass/g{k}"], 0.0)
      self.assertEqual(metrics[f"eval/stage_pass/g{k}"],
                       float(np.mean(rewards["all_pass"][f"g{k}"])))

  def test_reference_episodes_earn_every_reward(self):
    wf = self._wf()
    tasks = list(lh.LongHorizonTasks().tasks("train", 0, 6))
    refs = {t.task_id: references.reference_segments(wf, t) for t in tasks}
    episodes, results, final = wf.rollout(
        tasks, lambda name, ctxs: [refs[t.task_id][int(name[1:]) - 1].output for t in tasks])
    self.assertEqual([r.stage for r in results], ["g1", "g2", "g3", "g4"])
    for r in results:
      np.testing.assert_array_equal(r.rewards, 1.0)
    np.testing.assert_array_equal(final.rewards, 1.0)
    # The reference episode's text is what the workflow renders.
    for ep in episodes:
      self.assertEqual(ep.text, "".join(s.opening + s.output for s in refs[ep.task.task_id]))
    self.assertTrue(episodes[0].text.startswith(tasks[0].prompt + "\ng1("))

  def test_ambiguous_piece_passes_its_stage_and_fails_the_final(self):
    src = lh.LongHorizonTasks()
    task, k, rival = next((t, k, q) for t in src.tasks("train", 0, 100)
                          for k in range(4) for q in [lh.piece_ambiguity(t, k)] if q)
    wf = self._wf()
    ref = references.reference_outputs(wf, task)
    wrong = synthetic.Program(rival.in_type, (rival,)).expression("x") + "</code>"
    outs = ref[:k] + [wrong] + ref[k + 1:]
    _, results, final = wf.rollout([task], lambda name, ctxs: [outs[int(name[1:]) - 1]])
    self.assertEqual([float(r.rewards[0]) for r in results], [1.0] * 4)
    self.assertEqual(float(final.rewards[0]), 0.0)

  def test_unparsed_piece_scores_zero_and_sinks_the_final(self):
    wf = self._wf(k=2)
    task = lh.LongHorizonTasks(lh.LongHorizonConfig(num_stages=2)).task("train", 3)
    ref = references.reference_outputs(wf, task)
    _, results, final = wf.rollout([task, task], lambda name, ctxs: (
        ["((</code>", ref[0]] if name == "g1" else [ref[1], ref[1]]))
    np.testing.assert_array_equal(results[0].parsed, [False, True])
    np.testing.assert_array_equal(results[0].rewards, [0.0, 1.0])
    np.testing.assert_array_equal(final.rewards, [0.0, 1.0])

  def test_final_reward_delay(self):
    wf = self._wf(k=2, final_reward_delay_s=0.3)
    task = lh.LongHorizonTasks(lh.LongHorizonConfig(num_stages=2)).task("train", 0)
    ref = references.reference_outputs(wf, task)
    episodes = wf.start([task])
    for k in range(2):
      wf.open_stage(episodes)
      wf.close_stage(episodes, [ref[k]])
    t0 = time.monotonic()
    final = wf.finish(episodes)
    self.assertGreaterEqual(time.monotonic() - t0, 0.3)
    self.assertEqual(float(final.rewards[0]), 1.0)

  def test_bad_config(self):
    with self.assertRaisesRegex(ValueError, r"workflow\.num_pieces"):
      workflow_config.WorkflowConfig(stages=("pieces",), num_pieces=1)
    with self.assertRaisesRegex(ValueError, r"workflow\.final_reward_delay_s"):
      workflow_config.WorkflowConfig(stages=("pieces",), final_reward_delay_s=-1.0)
    with self.assertRaisesRegex(ValueError, r"workflow\.stages must be \('pieces',\) alone"):
      workflow_config.WorkflowConfig(stages=("hypothesis", "pieces"))
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("pieces",), num_pieces=6))
    with self.assertRaisesRegex(ValueError, "has 4 pieces"):
      references.reference_segments(wf, lh.LongHorizonTasks().task("train", 0))


if __name__ == "__main__":
  absltest.main()
