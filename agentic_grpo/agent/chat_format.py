"""The `chat` prompt format: the staged workflow as turns of a pretrained chat model.

Every stage is one exchange. The environment's turn (a user message: the problem on the first
stage, the stage's instruction, an execution observation on debug stages) is rendered with the
model's own chat template; the policy answers in an assistant turn that ends at the model's
end-of-turn token (the sampler stops on any of `tokenizer.eos_ids`). With Qwen's ChatML
template a two-stage episode reads

    <|im_start|>user\\n{problem}\\n\\nWrite the function in one ```python code block.<|im_end|>\\n
    <|im_start|>assistant\\n                                 <- opening of stage 0 (not trained)
    Here it is:\\n```python\\ndef f(x): ...\\n```<|im_end|>  <- output (trained on)
    \\n<|im_start|>user\\nResults: 1/2 ...<|im_end|>\\n<|im_start|>assistant\\n  <- opening 1
    keep<|im_end|>                                       <- output

Token in, token out. The agent loop keeps every context as the token ids the model saw and
produced; the opening of stage k+1 is rendered as text *after* the model's end-of-turn token
and encoded alone, so earlier turns are never re-rendered nor re-tokenised. The opening is the
template's rendering of `[user, assistant(SENTINEL), user(new)]` cut after the sentinel and
its end-of-turn token: only the new turn's suffix. Templates that do not keep earlier turns as
a prefix of the re-rendered conversation (Qwen3 drops the `<think>` block of earlier assistant
turns) are handled the same way; `ChatFormat.prefix_stable` says which kind a template is, and
`train.components.build` logs it when the run starts.

Stage outputs are cut at the first end-of-turn token and read from free text the way chat
models write it (`split_output` returns the body the stage parsers in `agent.stages` accept):

* code and debug: the last *closed* fenced code block (```` ```python ... ``` ````); debug
  also accepts a `keep` line (the code stays). An unclosed block is unparseable (reward 0).
* tests: `assert f(ARGS) == EXPECTED` lines (read with `ast`) or `ARGS -> EXPECTED` lines,
  anywhere in the answer, rewritten as `ARGS->EXPECTED` (a `stdio` task's tests are
  `'INPUT' -> 'OUTPUT'` lines of string literals).

The instructions depend on the task's kind (`Task.kind`): a `stdio` task asks for a whole
program reading standard input (`STDIO_INSTRUCTIONS`); its hypothesis stage has no reward.
* hypothesis: the last non-empty line, without an `Answer:` prefix or backticks.
"""

import ast
import re
from typing import Any, Optional, Sequence

from agentic_grpo.agent import prompts
from agentic_grpo.tasks import python_ast
from agentic_grpo.tasks import task as task_lib

SENTINEL = "\u2063SENTINEL\u2063"  # an assistant message no template changes
_PROBE_USER = "PROBE"
KEEP = "keep"
INSTRUCTIONS = {
    "hypothesis": "What does the function return for the input above? Answer with the value "
                  "alone on the last line.",
    "code": "Write the complete function in one ```python code block.",
    "tests": "Write new tests for the function, one `assert f(ARGS) == EXPECTED` line each, "
             "with the function's name for `f`.",
    "debug": "These are the results of your code. Reply with the corrected function in one "
             "```python code block, or reply `keep` if it is correct.",
    "pieces": "Write this piece of the program, a function of x, in one ```python code block.",
}
# A `stdio` task (a whole program on stdin/stdout) asks for a program and string tests.
STDIO_INSTRUCTIONS = {
    "hypothesis": "State the key idea of a solution in one line.",
    "code": "Write a complete Python program that reads the input from standard input and "
            "prints the answer, in one ```python code block.",
    "tests": "Write new tests for the program, one per line, as `'INPUT' -> 'OUTPUT'` with "
             "Python string literals (\\n for a line break).",
    "debug": "These are the results of your program. Reply with the corrected program in one "
             "```python code block, or reply `keep` if it is correct.",
}
_FENCE_RE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_SPECIAL_RE = re.compile(r"<\|[^<>|\s]{1,40}\|>")
_ANSWER_RE = re.compile(r"^(?:the\s+)?(?:final\s+)?(?:answer|output|result)\s*(?:is)?\s*[:=]?\s*",
                        re.IGNORECASE)


def extract_code(text: str) -> Optional[str]:
  """The last closed fenced code block of `text` (any language tag), or None."""
  blocks = _FENCE_RE.findall(text)
  return blocks[-1][1] if blocks else None


def extract_tests(text: str) -> Optional[str]:
  """`ARGS->EXPECTED` lines from `assert f(ARGS) == EXPECTED` or `ARGS -> EXPECTED` lines of
  `text`, in order, joined by newlines; None if there is none."""
  out = []
  for line in text.split("\n"):
    line = line.strip()
    if line.startswith("assert "):
      example = _assert_to_example(line)
      if example is not None:
        out.append(example)
    elif task_lib.ARROW in line and not line.startswith(("#", "def ", "```")):
      out.append(line.replace(" " + task_lib.ARROW + " ", task_lib.ARROW))
  return "\n".join(out) if out else None


def _assert_to_example(line: str) -> Optional[str]:
  try:
    node = python_ast.parse(line, mode="exec").body[0]
  except (SyntaxError, ValueError, MemoryError, RecursionError, IndexError):
    return None
  test = getattr(node, "test", None)
  if (not isinstance(test, ast.Compare) or len(test.ops) != 1
      or not isinstance(test.ops[0], ast.Eq) or not isinstance(test.left, ast.Call)
      or test.left.keywords):
    return None
  args = ",".join(ast.get_source_segment(line, a) or "" for a in test.left.args)
  expected = ast.get_source_segment(line, test.comparators[0]) or ""
  return f"{args}{task_lib.ARROW}{expected}"


def extract_answer(text: str) -> Optional[str]:
  """The last non-empty line of `text` without an `Answer:` prefix and backticks, or None."""
  lines = [l.strip() for l in text.strip().split("\n") if l.strip() and not l.startswith("```")]
  if not lines:
    return None
  return _ANSWER_RE.sub("", lines[-1]).strip("` ")


@prompts.PROMPT_FORMATS.register("chat")
class ChatFormat(prompts.PromptFormat):
  """Stages as chat turns rendered with the tokenizer's chat template (module docstring).

  Attributes:
    end_of_turn: the text the template writes right after an assistant message (an
      end-of-generation token of the tokenizer, e.g. `<|im_end|>`).
    stop_strings: the texts of all `tokenizer.eos_ids` (the sampler's stop tokens).
    prefix_stable: whether re-rendering the conversation keeps earlier turns as a prefix.
  """

  def __init__(self, tokenizer: Any = None):
    """Checks the tokenizer's chat template.

    Raises:
      ValueError: no tokenizer, no chat template or no end-of-generation ids (a byte model
        needs `workflow.prompt_format='tags'`), or a template that does not end an assistant
        message with one of the end-of-generation tokens.
    """
    super().__init__(tokenizer)
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
      raise ValueError("config.workflow.prompt_format='chat' needs a tokenizer with a chat "
                       "template (config.model.source='hf'); the byte model uses 'tags'")
    eos_ids = tuple(getattr(tokenizer, "eos_ids", ()))
    if not eos_ids:
      raise ValueError("config.workflow.prompt_format='chat' needs the tokenizer's "
                       "end-of-generation ids (generation_config.json eos_token_id)")
    self.tokenizer = tokenizer
    self.stop_strings = tuple(tokenizer.decode([i]) for i in eos_ids)
    first = self._render([_PROBE_USER], generation=True)
    closed = self._render([_PROBE_USER, SENTINEL], generation=False)
    following = self._render([_PROBE_USER, SENTINEL, _PROBE_USER], generation=True)
    after = following[following.rindex(SENTINEL) + len(SENTINEL):]
    ends = [s for s in self.stop_strings if after.startswith(s)]
    if not ends:
      raise ValueError(f"the chat template writes {after[:40]!r} after an assistant message, "
                       f"not one of the end-of-generation tokens {self.stop_strings}; the "
                       f"'chat' format needs the model to end its turn with one of them")
    self.end_of_turn = max(ends, key=len)
    self.prefix_stable = closed.startswith(first) and following.startswith(closed)

  def _render(self, contents: Sequence[str], *, generation: bool) -> str:
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation)

  def prefix_message(self) -> str:
    """What the run logs at start about how turns are rendered."""
    if self.prefix_stable:
      return ("chat template keeps earlier turns as a prefix; each new environment turn is "
              "rendered as the suffix after the model's end-of-turn token")
    return ("chat template does NOT keep earlier turns as a prefix when the conversation is "
            "re-rendered (e.g. Qwen3 drops earlier <think> blocks): each new environment turn "
            "is rendered alone as the suffix after the model's end-of-turn token; contexts "
            "are the sampled token ids, never a re-rendered conversation")

  def delimiters(self, kind: str) -> tuple[str, str]:
    if kind not in INSTRUCTIONS:
      raise ValueError(f"prompt format 'chat' has no instruction for stage kind {kind!r}; "
                       f"known: {tuple(INSTRUCTIONS)}")
    return "", self.end_of_turn

  def stop_tokens(self, kinds: Sequence[str]) -> tuple[str, ...]:
    """Every end-of-generation token's text (the sampler's stop tokens)."""
    for k in kinds:
      self.delimiters(k)
    return tuple(sorted(set(self.stop_strings)))

  def environment_turn(self, kind: str, turn: prompts.Turn, prompt: str = "",
                       task_kind: str = "function") -> str:
    parts = [prompt.rstrip("\n")] if prompt else []
    if turn.lead.strip():
      parts.append(turn.lead.strip())
    if turn.observation is not None:
      parts.append("Results:\n" + _SPECIAL_RE.sub("?", turn.observation))
    self.delimiters(kind)
    parts.append(STDIO_INSTRUCTIONS.get(kind, INSTRUCTIONS[kind]) if task_kind == "stdio"
                 else INSTRUCTIONS[kind])
    content = "\n\n".join(parts)
    if prompt:
      return self._render([content], generation=True)
    following = self._render([_PROBE_USER, SENTINEL, content], generation=True)
    after = following[following.rindex(SENTINEL) + len(SENTINEL):]
    return after[len(self.end_of_turn):]

  def split_output(self, kind: str, output: str) -> Optional[str]:
    """The stage body read from the assistant turn (module docstring), or None when the turn
    did not end (no end-of-generation token) or holds no answer of the stage's form."""
    cuts = [p for p in (output.find(s) for s in self.stop_strings) if p >= 0]
    if not cuts:
      return None
    text = output[:min(cuts)]
    if kind in ("code", "debug", "pieces"):
      code = extract_code(text)
      if code is None and kind == "debug" and text.strip().strip("`.").lower() == KEEP:
        return KEEP
      return code
    if kind == "tests":
      return extract_tests(text)
    return extract_answer(text)

  def end_output(self, kind: str, body: str) -> str:
    """The assistant turn a reference episode writes for `body`."""
    if kind in ("code", "debug", "pieces") and body != KEEP:
      body = f"```python\n{body.rstrip()}\n```"
    return body + self.end_of_turn
