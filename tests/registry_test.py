"""Tests for agentic_grpo.registry and the registries built on it (stages, prompt formats,
task sources, model sources), and that the config validates against their names."""

from absl.testing import absltest

from agentic_grpo import config as config_lib
from agentic_grpo import registry
from agentic_grpo.agent import prompts
from agentic_grpo.agent import stages
from agentic_grpo.agent import workflow_config
from agentic_grpo.models import sources as model_sources
from agentic_grpo.tasks import sources
from agentic_grpo.tasks import synthetic


class RegistryTest(absltest.TestCase):

  def test_register_get_names(self):
    reg = registry.Registry("widget")

    @reg.register("b")
    def make_b():
      return "b"

    reg.register("a")(str)
    self.assertIs(reg.get("b"), make_b)  # the decorator returns its argument unchanged
    self.assertIs(reg.get("a"), str)
    self.assertEqual(reg.names(), ("b", "a"))  # registration order
    self.assertIn("a", reg)
    self.assertNotIn("c", reg)
    self.assertNotIn(["a"], reg)

  def test_unknown_name_error_names_kind_name_and_registered(self):
    reg = registry.Registry("widget")
    reg.register("a")(int)
    with self.assertRaisesRegex(ValueError, r"unknown widget 'z'; registered: \('a',\)"):
      reg.get("z")
    with self.assertRaisesRegex(ValueError, "unknown widget"):
      reg.get(["a"])

  def test_duplicate_and_bad_names(self):
    reg = registry.Registry("widget")
    reg.register("a")(int)
    with self.assertRaisesRegex(ValueError, "widget 'a' is already registered"):
      reg.register("a")
    with self.assertRaisesRegex(ValueError, "non-empty string"):
      reg.register("")


class PromptFormatTest(absltest.TestCase):

  def test_tags_format(self):
    self.assertEqual(prompts.PROMPT_FORMATS.names(), ("tags", "chat"))
    fmt = prompts.PROMPT_FORMATS.get("tags")()
    self.assertEqual(fmt.delimiters("code"), ("<code>", "</code>"))
    self.assertEqual(fmt.stop_tokens(["debug", "code", "code"]), ("</code>", "</debug>"))
    self.assertEqual(fmt.environment_turn("hypothesis", prompts.Turn(lead="\n[1]->"), "P"),
                     "P\n[1]-><hyp>")
    self.assertEqual(
        fmt.environment_turn("debug", prompts.Turn(observation="0/1 got '<code>'</obs>")),
        "<obs>0/1 got '?'?</obs><debug>")
    self.assertEqual(fmt.split_output("code", "x</code>tail</code>"), "x")
    self.assertIsNone(fmt.split_output("code", "x</hyp>"))
    self.assertEqual(fmt.end_output("tests", "[1]->[1]"), "[1]->[1]</tests>")
    with self.assertRaisesRegex(ValueError, "no delimiters for stage kind 'plan'"):
      fmt.delimiters("plan")

  def test_every_stage_kind_has_tags_delimiters(self):
    fmt = prompts.PROMPT_FORMATS.get("tags")()
    for kind in stages.STAGES.names():
      self.assertLen(fmt.delimiters(kind), 2)

  def test_workflow_config_validates_prompt_format(self):
    self.assertEqual(workflow_config.WorkflowConfig().prompt_format, "tags")
    with self.assertRaisesRegex(ValueError, r"config.workflow.prompt_format must be one of "
                                r"\('tags', 'chat'\), got 'xml'"):
      workflow_config.WorkflowConfig(prompt_format="xml")

  def test_workflow_config_validates_stages_against_registry(self):
    with self.assertRaisesRegex(ValueError, r"config.workflow.stages must be distinct stage "
                                r"kinds from \('hypothesis', 'code', 'tests', 'debug', 'pieces'\)"):
      workflow_config.WorkflowConfig(stages=("code", "plan"))


class TaskSourceTest(absltest.TestCase):

  def test_synthetic_source_from_the_task_section(self):
    self.assertEqual(sources.TASK_SOURCES.names(), ("synthetic", "humaneval", "mbpp", "jsonl",
                                                     "stdio", "tfds", "long_horizon"))
    section = config_lib.TaskSection(seed=3, depths=(1, 2), split_by="task")
    tasks = sources.TASK_SOURCES.get("synthetic")(section)
    want = synthetic.SyntheticTasks(synthetic.SyntheticConfig(
        seed=3, depths=(1, 2), string_prob=section.string_prob,
        ambiguity_target=section.ambiguity_target, num_hidden=section.num_hidden,
        split_by="task"))
    for split in ("train", "test"):
      self.assertEqual(tasks.task(split, 5), want.task(split, 5))
    four = sources.TASK_SOURCES.get("synthetic")(
        config_lib.TaskSection(depths=(1,), num_public=(4,), split_by="task"))
    self.assertEqual({len(four.task("train", i).public_examples) for i in range(8)}, {4})
    with self.assertRaisesRegex(ValueError, "config.task.num_public"):
      config_lib.TaskSection(num_public=(0, 2)).validate("config.task")

  def test_config_validates_task_source(self):
    with self.assertRaisesRegex(ValueError, r"config.task.source must be one of "
                                r"\('synthetic', 'humaneval', 'mbpp', 'jsonl', 'stdio', 'tfds', "
                                r"'long_horizon'\), "
                                r"got 'apps'"):
      config_lib.TaskSection(source="apps").validate("task")

  def test_model_sources_and_config(self):
    self.assertEqual(model_sources.MODEL_SOURCES.names(), ("preset", "hf"))
    source = model_sources.MODEL_SOURCES.get("preset")(
        config_lib.ModelSection(), dtype=None, min_seq_len=600, cache_dir=None)
    self.assertEqual(source.kind, "preset")
    self.assertEqual(source.model_config.max_seq_len, 600)
    with self.assertRaisesRegex(ValueError, r"config.model.source must be one of "
                                r"\('preset', 'hf'\), got 'onnx'"):
      config_lib.ModelSection(source="onnx").validate("model")


if __name__ == "__main__":
  absltest.main()
