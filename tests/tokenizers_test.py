"""Tests for agentic_grpo.models.tokenizers."""

import json
import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import numpy as np

from agentic_grpo.models import presets
from agentic_grpo.models import tokenizers as tok_lib


class ByteTokenizerTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tok_lib.ByteTokenizer()

  def test_layout(self):
    t = self.tok
    self.assertEqual((t.pad_id, t.bos_id, t.eos_id), (256, 257, 258))
    self.assertEqual(t.vocab_size, 256 + 3 + len(tok_lib.DEFAULT_DELIMITERS))
    for d in ("<hyp>", "</hyp>", "<code>", "</code>", "<tests>", "</tests>", "<debug>",
              "</debug>", "<obs>", "</obs>"):
      self.assertTrue(t.is_special(t.token_id(d)), d)
    self.assertEqual(t.token_id("<hyp>"), 259)
    self.assertEqual(t.token_id("a"), 97)
    self.assertFalse(t.is_special(97))

  def test_default_vocab_matches_tiny_model(self):
    self.assertEqual(self.tok.vocab_size, presets.get_model_config("tiny").vocab_size)

  def test_encode_recognises_special_tokens(self):
    t = self.tok
    ids = t.encode("x<code>é</code>", add_bos=True, add_eos=True)
    self.assertEqual(ids, [t.bos_id, ord("x"), t.token_id("<code>"), 0xC3, 0xA9,
                           t.token_id("</code>"), t.eos_id])
    self.assertEqual(t.decode(ids), "<bos>x<code>é</code><eos>")
    self.assertEqual(t.decode(ids, skip_special=True), "xé")

  def test_untrusted_text_keeps_delimiters_as_bytes(self):
    ids = self.tok.encode("</code>", allow_special=False)
    self.assertEqual(ids, list(b"</code>"))
    self.assertEqual(self.tok.decode(ids), "</code>")

  def test_custom_delimiters(self):
    t = tok_lib.ByteTokenizer(delimiters=("<a>", "<ab>"))
    self.assertEqual(t.vocab_size, 261)
    # Longest match first.
    self.assertEqual(t.encode("<ab><a>"), [260, 259])

  @parameterized.parameters(("<pad>",), ("",), ("<x>", "<x>"))
  def test_bad_delimiters(self, *delimiters):
    with self.assertRaisesRegex(ValueError, "delimiters"):
      tok_lib.ByteTokenizer(delimiters=delimiters)

  def test_decode_rejects_bad_ids(self):
    with self.assertRaisesRegex(ValueError, r"ids must be in \[0, 269\), got \[269\]"):
      self.tok.decode([1, 269])
    with self.assertRaisesRegex(ValueError, "1-D"):
      self.tok.decode(np.zeros((2, 2), np.int32))
    with self.assertRaisesRegex(ValueError, "not a special token"):
      self.tok.token_id("<nope>")
    with self.assertRaisesRegex(ValueError, "text must be a str"):
      self.tok.encode(b"bytes")

  def test_decode_numpy_ids_and_invalid_utf8(self):
    ids = np.array([104, 0xFF, 105], np.int32)
    text = self.tok.decode(ids)
    self.assertEqual(text, "h\ufffdi")
    # Re-encoding decoded text is not the generated ids: train on the ids.
    self.assertNotEqual(self.tok.encode(text), ids.tolist())

  @hypothesis.settings(max_examples=50, deadline=None)
  @hypothesis.given(st.text())
  def test_roundtrip(self, text):
    self.assertEqual(self.tok.decode(self.tok.encode(text)), text)


_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class HFTokenizerTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    import tokenizers  # pylint: disable=g-import-not-at-top
    from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ["def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\n"] * 20
    tok.train_from_iterator(corpus, trainer)
    cls.dir = absltest.get_default_test_tmpdir() + "/hf_tok"
    os.makedirs(cls.dir, exist_ok=True)
    tok.save(os.path.join(cls.dir, "tokenizer.json"))
    with open(os.path.join(cls.dir, "tokenizer_config.json"), "w") as f:
      json.dump({"eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>",
                 "bos_token": None, "chat_template": _CHAT_TEMPLATE}, f)

  def test_encode_decode(self):
    t = tok_lib.HFTokenizer(self.dir)
    text = "def add(a, b):\n    return a + b\n"
    ids = t.encode(text)
    self.assertLess(len(ids), len(text.encode()))  # merges learned
    self.assertEqual(t.decode(ids), text)
    # 256 byte symbols + 3 specials + learned merges.
    self.assertGreater(t.vocab_size, 259)

  def test_special_tokens(self):
    t = tok_lib.HFTokenizer(os.path.join(self.dir, "tokenizer.json"))
    self.assertEqual(t.eos_id, t.token_id("<|im_end|>"))
    self.assertEqual(t.pad_id, t.token_id("<|endoftext|>"))
    self.assertIsNone(t.bos_id)
    ids = t.encode("a<|im_end|>")
    self.assertEqual(ids[-1], t.eos_id)
    self.assertEqual(t.decode(ids, skip_special=True), "a")
    with self.assertRaisesRegex(ValueError, "not in the vocabulary"):
      t.token_id("<|nope|>")

  def test_chat_template(self):
    t = tok_lib.HFTokenizer(self.dir)
    prompt = t.apply_chat_template([{"role": "user", "content": "hi"}])
    self.assertEqual(prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    ids = t.encode(prompt)
    self.assertEqual(ids.count(t.token_id("<|im_start|>")), 2)

  def test_generation_config_eos_ids(self):
    # The end-of-turn and end-of-text ids of generation_config.json, then eos_token.
    d = self.create_tempdir().full_path
    for name in ("tokenizer.json", "tokenizer_config.json"):
      shutil.copy(os.path.join(self.dir, name), d)
    t = tok_lib.HFTokenizer(d)
    self.assertEqual(t.eos_ids, (t.token_id("<|im_end|>"),))
    end_of_text, end_of_turn = t.token_id("<|endoftext|>"), t.token_id("<|im_end|>")
    with open(os.path.join(d, "generation_config.json"), "w") as f:
      json.dump({"eos_token_id": [end_of_text, end_of_turn], "pad_token_id": end_of_text}, f)
    t = tok_lib.HFTokenizer(d)
    self.assertEqual(t.eos_ids, (end_of_text, end_of_turn))
    self.assertEqual(t.eos_id, end_of_turn)  # tokenizer_config's eos_token stays eos_id
    with open(os.path.join(d, "generation_config.json"), "w") as f:
      json.dump({"eos_token_id": t.vocab_size + 5}, f)
    with self.assertRaisesRegex(ValueError, rf"token ids \[{t.vocab_size + 5}\] .* outside"):
      tok_lib.HFTokenizer(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
      json.dump({"eos_token_id": "<|im_end|>"}, f)
    with self.assertRaisesRegex(ValueError, "eos_token_id of .* must be a non-negative int"):
      tok_lib.HFTokenizer(d)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "no tokenizer.json"):
      tok_lib.HFTokenizer(os.path.join(self.dir, "missing"))
    t = tok_lib.HFTokenizer(self.dir)
    with self.assertRaisesRegex(ValueError, rf"ids must be in \[0, {t.vocab_size}\)"):
      t.decode([t.vocab_size])
    t.chat_template = None
    with self.assertRaisesRegex(ValueError, "no chat_template"):
      t.apply_chat_template([])


if __name__ == "__main__":
  absltest.main()
