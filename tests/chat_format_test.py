"""Tests for agentic_grpo.agent.chat_format: rendering turns with a chat template, reading
stage outputs from free text, and templates that drop earlier turns' `<think>` blocks."""

from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo.agent import chat_format
from agentic_grpo.agent import prompts
from agentic_grpo.agent import stages
from agentic_grpo.agent import workflow
from agentic_grpo.agent import workflow_config
from agentic_grpo.models import tokenizers

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# As Qwen3's template: the last assistant turn after the last user turn gets an (empty)
# think block, earlier assistant turns are written without one.
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_SPECIALS = {"<|endoftext|>": 1, "<|im_end|>": 2}


class FakeTokenizer:
  """What `ChatFormat` uses of an `HFTokenizer`: template, eos ids, decode of special ids."""

  def __init__(self, template, eos_ids=(2, 1)):
    self.chat_template = template
    self.eos_ids = eos_ids
    self._tok = object.__new__(tokenizers.HFTokenizer)
    self._tok.chat_template = template
    self._tok._special_strings = {}  # pylint: disable=protected-access

  def decode(self, ids):
    names = {v: k for k, v in _SPECIALS.items()}
    return "".join(names[i] for i in ids)

  def apply_chat_template(self, messages, add_generation_prompt=True):
    return self._tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


class ChatFormatTest(parameterized.TestCase):

  @parameterized.parameters((CHATML, True), (THINKING, False))
  def test_new_turn_is_the_suffix_after_the_end_of_turn(self, template, stable):
    fmt = prompts.PROMPT_FORMATS.get("chat")(FakeTokenizer(template))
    self.assertEqual(fmt.prefix_stable, stable)
    self.assertIn("does NOT" if not stable else "keeps", fmt.prefix_message())
    self.assertEqual(fmt.end_of_turn, "<|im_end|>")
    self.assertEqual(fmt.stop_tokens(["code", "debug"]), ("<|endoftext|>", "<|im_end|>"))
    first = fmt.environment_turn("code", prompts.Turn(), prompt="def f(x):\n")
    self.assertTrue(first.startswith("<|im_start|>user\ndef f(x):\n\nWrite the complete"))
    self.assertTrue(first.endswith("<|im_end|>\n<|im_start|>assistant\n"))
    debug = fmt.environment_turn("debug", prompts.Turn(observation="0/1 got '<|im_end|>'"))
    self.assertEqual(debug, "\n<|im_start|>user\nResults:\n0/1 got '?'\n\n"
                     + chat_format.INSTRUCTIONS["debug"] + "<|im_end|>\n<|im_start|>assistant\n")

  def test_outputs_are_read_from_free_text(self):
    fmt = prompts.PROMPT_FORMATS.get("chat")(FakeTokenizer(CHATML))
    code = "Sure.\n```python\ndef f(x):\n  return x\n```\nDone.<|im_end|>junk"
    self.assertEqual(fmt.split_output("code", code), "def f(x):\n  return x\n")
    self.assertIsNone(fmt.split_output("code", "```python\ndef f(x):<|im_end|>"))
    self.assertIsNone(fmt.split_output("code", "```python\ndef f(x):\n```"))  # no end of turn
    self.assertEqual(fmt.split_output("debug", "Keep.<|endoftext|>"), "keep")
    tests = ("```python\nassert f([1, 2], 3) == [3]\nassert g(1) > 0\n```\n"
             "[4] -> [4]<|im_end|>")
    self.assertEqual(fmt.split_output("tests", tests), "[1, 2],3->[3]\n[4]->[4]")
    self.assertIsNone(fmt.split_output("tests", "no tests<|im_end|>"))
    self.assertEqual(fmt.split_output("hypothesis", "I think\nAnswer: `[4, 5]`<|im_end|>"),
                     "[4, 5]")
    self.assertEqual(fmt.end_output("code", "sorted(x)"), "```python\nsorted(x)\n```<|im_end|>")
    self.assertEqual(fmt.end_output("debug", "keep"), "keep<|im_end|>")

  def test_needs_a_chat_template(self):
    with self.assertRaisesRegex(ValueError, "needs a tokenizer with a chat template"):
      workflow.Workflow(workflow_config.WorkflowConfig(prompt_format="chat"),
                        tokenizer=tokenizers.ByteTokenizer())
    with self.assertRaisesRegex(ValueError, "not one of the end-of-generation tokens"):
      prompts.PROMPT_FORMATS.get("chat")(FakeTokenizer(CHATML, eos_ids=(1,)))

  def test_every_stage_kind_has_an_instruction(self):
    fmt = prompts.PROMPT_FORMATS.get("chat")(FakeTokenizer(CHATML))
    for kind in stages.STAGES.names():
      self.assertEqual(fmt.delimiters(kind), ("", "<|im_end|>"))


if __name__ == "__main__":
  absltest.main()
