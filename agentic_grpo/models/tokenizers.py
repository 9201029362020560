"""Tokenizers: a file-free byte tokenizer and a wrapper of Hugging Face JSON tokenizers.

Token in, token out: the ids the sampler generated are what the learner trains
on. `decode` is for reading a completion (parsing code, logging), never for
producing training tokens again: re-encoding decoded text need not give the
same ids (an invalid UTF-8 byte decodes to U+FFFD; a BPE tokenizer may merge
differently).
"""

import json
import os
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

NUM_BYTES = 256
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
DEFAULT_DELIMITERS = (
    "<hyp>", "</hyp>", "<code>", "</code>", "<tests>", "</tests>",
    "<debug>", "</debug>", "<obs>", "</obs>",
)


def _as_id_list(ids) -> list[int]:
  arr = np.asarray(ids)
  if arr.ndim != 1:
    raise ValueError(f"ids must be a 1-D sequence of ints, got shape {arr.shape}")
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"ids must be ints, got dtype {arr.dtype}")
  return [int(i) for i in arr]


class ByteTokenizer:
  """UTF-8 bytes as ids 0..255, then `<pad>`, `<bos>`, `<eos>` and delimiters.

  The default needs no files and gives the `tiny` model its vocabulary
  (`vocab_size == 269` with the default delimiters). Special tokens are single
  ids, so a stage ends on exactly one sampled id (its closing delimiter).

  Attributes:
    vocab_size: 256 + number of special tokens.
    pad_id, bos_id, eos_id: ids of `<pad>`, `<bos>`, `<eos>` (256, 257, 258).
    special_tokens: the special-token strings, in id order from 256.
  """

  def __init__(self, delimiters: Sequence[str] = DEFAULT_DELIMITERS):
    """Builds the tokenizer.

    Args:
      delimiters: extra special-token strings (stage delimiters), each given
        ids after `<eos>` in order.

    Raises:
      ValueError: a delimiter is empty, duplicated, or one of `<pad>`, `<bos>`,
        `<eos>`.
    """
    specials = [PAD, BOS, EOS]
    for d in delimiters:
      if not isinstance(d, str) or not d:
        raise ValueError(f"delimiters must be non-empty strings, got {d!r}")
      if d in specials:
        raise ValueError(f"delimiters must be distinct and not <pad>/<bos>/<eos>, got {d!r}")
      specials.append(d)
    self.special_tokens = tuple(specials)
    self._special_ids = {s: NUM_BYTES + i for i, s in enumerate(specials)}
    self.vocab_size = NUM_BYTES + len(specials)
    self.pad_id = self._special_ids[PAD]
    self.bos_id = self._special_ids[BOS]
    self.eos_id = self._special_ids[EOS]
    # Longest first so that a delimiter containing another one wins.
    alternatives = sorted(specials, key=len, reverse=True)
    self._split = re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")")

  def __repr__(self):
    return f"ByteTokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"

  def token_id(self, token: str) -> int:
    """Id of a special-token string (e.g. `"</code>"`) or of a one-byte character.

    Raises:
      ValueError: `token` is neither a special token nor a single-byte string.
    """
    if token in self._special_ids:
      return self._special_ids[token]
    if isinstance(token, str):
      data = token.encode("utf-8")
      if len(data) == 1:
        return data[0]
    raise ValueError(f"token {token!r} is not a special token or a single byte; "
                     f"special tokens: {list(self.special_tokens)}")

  def is_special(self, token_id: int) -> bool:
    """Whether `token_id` is a special token (pad, bos, eos or a delimiter)."""
    return NUM_BYTES <= int(token_id) < self.vocab_size

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False,
             allow_special: bool = True) -> list[int]:
    """UTF-8 bytes of `text`; special-token strings become their single ids.

    Args:
      text: the string to encode.
      add_bos, add_eos: prepend `<bos>` / append `<eos>`.
      allow_special: if False, special-token strings are encoded as plain bytes
        (for untrusted text that must not open or close a stage).

    Raises:
      ValueError: `text` is not a str.
    """
    if not isinstance(text, str):
      raise ValueError(f"text must be a str, got {type(text).__name__}")
    ids = [self.bos_id] if add_bos else []
    parts = self._split.split(text) if allow_special else [text]
    for part in parts:
      if allow_special and part in self._special_ids:
        ids.append(self._special_ids[part])
      elif part:
        ids.extend(part.encode("utf-8"))
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """Text of `ids`; special ids render as their strings (or are skipped).

    Byte runs are decoded as UTF-8 with invalid bytes replaced by U+FFFD.

    Raises:
      ValueError: `ids` is not 1-D ints, or an id is outside `[0, vocab_size)`.
    """
    ids = _as_id_list(ids)
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f"ids must be in [0, {self.vocab_size}), got {bad[:5]}")
    out, run = [], bytearray()
    for i in ids:
      if i < NUM_BYTES:
        run.append(i)
        continue
      if run:
        out.append(run.decode("utf-8", errors="replace"))
        run = bytearray()
      if not skip_special:
        out.append(self.special_tokens[i - NUM_BYTES])
    if run:
      out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


def _token_content(value) -> Optional[str]:
  """A special token in tokenizer_config.json: a string or {"content": ...}."""
  if isinstance(value, Mapping):
    return value.get("content")
  return value


def _id_list(value, what: str) -> list[int]:
  """`eos_token_id` of generation_config.json: an int, a list of ints, or null."""
  if value is None:
    return []
  values = value if isinstance(value, list) else [value]
  if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
    raise ValueError(f"{what} must be a non-negative int or a list of them, got {value!r}")
  return list(values)


class HFTokenizer:
  """A Hugging Face `tokenizers` JSON tokenizer, with its chat template if given.

  Reads `tokenizer.json` and, when present next to it, `tokenizer_config.json`
  (special tokens, `chat_template`) or a `chat_template.jinja` file, and
  `generation_config.json` (the ids that end a generation: a chat model lists
  its end-of-turn token there, e.g. Qwen's `<|im_end|>` or Llama 3's
  `<|eot_id|>`, next to the end-of-text token).

  Attributes:
    vocab_size: number of ids including added tokens.
    pad_id, bos_id, eos_id: ids of the configured special tokens, or None
      (`eos_id` and `pad_id` fall back to generation_config.json's first
      `eos_token_id` and its `pad_token_id`).
    eos_ids: every id that ends a generation, in order, without repeats:
      generation_config.json's `eos_token_id` (an int or a list), then the
      tokenizer's `eos_token`. Pass them to the sampler as `stop_token_ids`.
    chat_template: the Jinja template string, or None.
    directory: the directory the files were read from.
  """

  def __init__(self, path: str):
    """Loads a tokenizer.

    Args:
      path: a `tokenizer.json` file or a directory containing one.

    Raises:
      ValueError: no tokenizer file at `path`, or a configured special token
        that the vocabulary lacks.
    """
    import tokenizers  # pylint: disable=g-import-not-at-top

    directory = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise ValueError(f"no tokenizer.json at path {path!r}")
    self._tok = tokenizers.Tokenizer.from_file(file)
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    config: dict[str, Any] = {}
    config_file = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(config_file):
      with open(config_file, encoding="utf-8") as f:
        config = json.load(f)
    self.chat_template = config.get("chat_template")
    jinja_file = os.path.join(directory, "chat_template.jinja")
    if self.chat_template is None and os.path.isfile(jinja_file):
      with open(jinja_file, encoding="utf-8") as f:
        self.chat_template = f.read()
    if isinstance(self.chat_template, list):  # [{"name": "default", "template": ...}, ...]
      named = {t["name"]: t["template"] for t in self.chat_template}
      self.chat_template = named.get("default", next(iter(named.values())))
    self._special_strings = {}
    for key in ("pad", "bos", "eos"):
      content = _token_content(config.get(f"{key}_token"))
      self._special_strings[key] = content
      token_id = None
      if content is not None:
        token_id = self._tok.token_to_id(content)
        if token_id is None:
          raise ValueError(f"{key}_token {content!r} of {config_file} is not in the vocabulary")
      setattr(self, f"{key}_id", token_id)
    self.directory = directory
    self._read_generation_config(os.path.join(directory, "generation_config.json"))

  def _read_generation_config(self, file: str) -> None:
    generation: dict[str, Any] = {}
    if os.path.isfile(file):
      try:
        with open(file, encoding="utf-8") as f:
          generation = json.load(f)
      except ValueError as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from e
    eos = _id_list(generation.get("eos_token_id"), f"eos_token_id of {file}")
    pad = _id_list(generation.get("pad_token_id"), f"pad_token_id of {file}")
    bad = [i for i in eos + pad if i >= self.vocab_size]
    if bad:
      raise ValueError(f"token ids {bad} of {file} are outside the tokenizer's vocabulary "
                       f"of {self.vocab_size}")
    if self.eos_id is not None:
      eos.append(self.eos_id)
    self.eos_ids = tuple(dict.fromkeys(eos))
    if self.eos_id is None and self.eos_ids:
      self.eos_id = self.eos_ids[0]
    if self.pad_id is None and pad:
      self.pad_id = pad[0]

  def __repr__(self):
    return f"HFTokenizer(vocab_size={self.vocab_size}, eos_ids={self.eos_ids})"

  def token_id(self, token: str) -> int:
    """Id of a token string (e.g. a special token such as `"<|im_end|>"`).

    Raises:
      ValueError: `token` is not in the vocabulary.
    """
    token_id = self._tok.token_to_id(token)
    if token_id is None:
      raise ValueError(f"token {token!r} is not in the vocabulary")
    return token_id

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """Ids of `text`; added special-token strings in the text map to their ids.

    Raises:
      ValueError: `text` is not a str.
    """
    if not isinstance(text, str):
      raise ValueError(f"text must be a str, got {type(text).__name__}")
    return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """Text of `ids`.

    Raises:
      ValueError: `ids` is not 1-D ints, or an id is outside `[0, vocab_size)`.
    """
    ids = _as_id_list(ids)
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f"ids must be in [0, {self.vocab_size}), got {bad[:5]}")
    return self._tok.decode(ids, skip_special_tokens=skip_special)

  def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *,
                          add_generation_prompt: bool = True, **kwargs) -> str:
    """Renders `messages` with the tokenizer's chat template (Jinja2, sandboxed).

    Rendered as `transformers` does: `trim_blocks`, `lstrip_blocks`, the
    variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
    `pad_token`, any `kwargs`, and a `raise_exception(message)` function.

    Returns:
      The prompt text; encode it with `encode` to get prompt ids.

    Raises:
      ValueError: the tokenizer has no chat template, or the template raised.
    """
    if self.chat_template is None:
      raise ValueError("this tokenizer has no chat_template")
    from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

    def raise_exception(message):
      raise ValueError(f"chat template error: {message}")

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(self.chat_template)
    variables = {f"{k}_token": v for k, v in self._special_strings.items() if v is not None}
    variables.update(kwargs)
    return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                           **variables)
