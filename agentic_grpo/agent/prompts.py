"""Prompt formats: how an episode's environment turns and stage outputs are written as text.

The stages decide *what* the environment says (a stage's lead text such as the probe input, a
debug stage's observation); a `PromptFormat` decides *how* it is written: the turn markup, the
text that ends the model's output (the sampler's stop tokens) and how a stage output is cut
from the sampled text. Formats are registered by name in `PROMPT_FORMATS` (the config's
`workflow.prompt_format`).

`tags` (the default, for the byte tokenizer's special tokens) writes an episode as

    f(x:list[int])->list[int]            <- task prompt   (first environment turn)
    [3,1,2]->[4,3,5]
    [2,9,4]-><hyp>                       <- lead text, then the stage's opening delimiter
    [4,11,6]</hyp>                       <- output, ended by the closing delimiter
    <code>sorted(x)</code>
    <obs>1/2 ...</obs><debug>keep</debug>   <- observation, then the debug stage's opening

`chat` (`agent.chat_format`, for pretrained chat models) writes each stage as a user turn and
an assistant turn rendered with the tokenizer's chat template.
"""

import abc
import dataclasses
import re
from typing import Any, Optional, Sequence

from agentic_grpo import registry

PROMPT_FORMATS: registry.Registry[type["PromptFormat"]] = registry.Registry("prompt format")


@dataclasses.dataclass(frozen=True)
class Turn:
  """What the environment says before one stage's output, before formatting.

  Attributes:
    lead: text before the stage opens (the hypothesis stage's probe `[2,9,4]->`), or "".
    observation: program feedback shown to the model (a debug stage's test results), or None.
  """
  lead: str = ""
  observation: Optional[str] = None


class PromptFormat(abc.ABC):
  """Writes environment turns and delimits stage outputs. Stateless; one per workflow.

  Attributes:
    special_tokens: strings the tokenizer must encode as single tokens for this format.
  """

  special_tokens: tuple[str, ...] = ()

  def __init__(self, tokenizer: Any = None):
    """`tokenizer`: the run's tokenizer (formats that render with it, such as `chat`, need
    it; `tags` ignores it)."""
    del tokenizer

  @abc.abstractmethod
  def delimiters(self, kind: str) -> tuple[str, str]:
    """`(open, close)` of stage `kind`: the text that ends the environment's turn just before
    the model writes, and the text that ends the model's output (a stop token).

    Raises:
      ValueError: for a stage kind the format does not know.
    """

  @abc.abstractmethod
  def environment_turn(self, kind: str, turn: Turn, prompt: str = "",
                       task_kind: str = "function") -> str:
    """The text before stage `kind`'s output: `prompt` (the task prompt, first stage only),
    the turn's lead and observation, and the stage's opening. `task_kind` is the task's
    `Task.kind` (`function` or `stdio`), for formats whose instructions depend on it."""

  def stop_tokens(self, kinds: Sequence[str]) -> tuple[str, ...]:
    """The closing delimiters of stages `kinds`, sorted (the sampler's stop tokens)."""
    return tuple(sorted({self.delimiters(k)[1] for k in kinds}))

  def split_output(self, kind: str, output: str) -> Optional[str]:
    """The stage output's body: the text before the first closing delimiter of stage `kind`
    (text after it is ignored), or None if there is none (the sampler ran out of tokens)."""
    pos = output.find(self.delimiters(kind)[1])
    return None if pos < 0 else output[:pos]

  def end_output(self, kind: str, body: str) -> str:
    """A complete stage output for `body` (the reference episodes' outputs)."""
    return body + self.delimiters(kind)[1]


DELIMITERS = {
    "hypothesis": ("<hyp>", "</hyp>"),
    "code": ("<code>", "</code>"),
    "tests": ("<tests>", "</tests>"),
    "debug": ("<debug>", "</debug>"),
    "pieces": ("<code>", "</code>"),  # a long-horizon task's pieces are code (`agent.pieces`)
}
OBS_OPEN, OBS_CLOSE = "<obs>", "</obs>"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<hyp>", "</hyp>", "<code>", "</code>", "<tests>",
                  "</tests>", "<debug>", "</debug>", "<obs>", "</obs>")
_SPECIAL_RE = re.compile(r"</?(?:pad|bos|eos|hyp|code|tests|debug|obs)>")


def sanitize(text: str) -> str:
  """Replaces tag-like strings (`<code>`, `</obs>`, ...) in environment text derived from
  program output with `?`, so that a program cannot write the format's markup."""
  return _SPECIAL_RE.sub("?", text)


@PROMPT_FORMATS.register("tags")
class TagsFormat(PromptFormat):
  """Stage outputs between `<hyp>`/`</hyp>`-style special tokens; observations in `<obs>`."""

  special_tokens = SPECIAL_TOKENS

  def delimiters(self, kind: str) -> tuple[str, str]:
    if kind not in DELIMITERS:
      raise ValueError(f"prompt format 'tags' has no delimiters for stage kind {kind!r}; "
                       f"known: {tuple(DELIMITERS)}")
    return DELIMITERS[kind]

  def environment_turn(self, kind: str, turn: Turn, prompt: str = "",
                       task_kind: str = "function") -> str:
    del task_kind  # the same markup for every task kind
    obs = "" if turn.observation is None else OBS_OPEN + sanitize(turn.observation) + OBS_CLOSE
    return prompt + turn.lead + obs + self.delimiters(kind)[0]
