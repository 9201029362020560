"""A sampling request's checks and the per-token rules both samplers apply.

The static sampler (`models.sampler`) and the continuous one (`models.continuous`) take the
same requests and decode by the same rules, written once here:

* `check_requests`: a call's prompts, lengths, transform and stop ids checked, and its stop
  tables built (`Requests`): per-row stop ids `[N, K]` and stop sequences `[N, M, L]`, -1
  padded, so that every row may stop on its own ids and sequences;
* `draw_tokens`: a decode step's next token of each row, drawn from (or the argmax of) the
  transformed logits, and its behaviour log-prob under the same transform;
* `stop_hits`: whether a row's new token ends it (a stop id, or the end of a stop sequence);
* `sampleable_vocab` and `encode_stop_strings`: the sampleable ids of a model run with a
  tokenizer, and stop strings as token sequences;
* `prompt_bucket`: the padded prompt width of a call (`DEFAULT_PROMPT_BUCKETS`).
"""

from typing import NamedTuple, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.core import logprobs as logprobs_lib
from agentic_grpo.core import types as core_types
from agentic_grpo.models import transformer


# Padded prompt widths: a call's prompts are padded to the smallest that holds the longest.
DEFAULT_PROMPT_BUCKETS = tuple(2 ** k for k in range(4, 18))  # 16 .. 131072


def prompt_bucket(length: int, buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS) -> int:
  """The padded prompt width, the smallest of `buckets` that holds `length` tokens.

  Raises:
    ValueError: `length` exceeds the largest bucket.
  """
  for b in sorted(buckets):
    if b >= length:
      return int(b)
  raise ValueError(f"prompt length {length} exceeds the largest prompt bucket {max(buckets)}")


def bucket_prefill_widths(bucket: int, buckets: Sequence[int],
                          widths: Sequence[int] = ()) -> list[int]:
  """The whole-prompt prefill widths a call in prompt bucket `bucket` may take
  (`rl.prefill_widths`): those of `widths` between the next smaller bucket and `bucket`, then
  `bucket` itself, increasing (the programs `train.sampling.compile_rl_prefills` compiles)."""
  below = max((int(b) for b in buckets if b < bucket), default=0)
  return sorted(int(w) for w in widths if below < w < bucket) + [int(bucket)]


def prefill_width(length: int, buckets: Sequence[int], widths: Sequence[int] = ()) -> int:
  """The whole-prompt prefill's width for a call whose longest prompt is `length` tokens: the
  smallest of its bucket's `bucket_prefill_widths` that holds it.

  Raises:
    ValueError: `length` exceeds the largest bucket.
  """
  taken = bucket_prefill_widths(prompt_bucket(length, buckets), buckets, widths)
  return next(w for w in taken if w >= length)


def round_up(x: int, m: int) -> int:
  """`x` rounded up to a multiple of `m`, at least `m` (table and segment widths)."""
  return max(m, -(-x // m) * m)


def sampleable_vocab(tokenizer, model_vocab_size: int) -> int:
  """The `SamplingTransform.vocab_limit` of a model run with `tokenizer`.

  A model's embedding may have more rows than its tokenizer has ids (Qwen2.5 / Qwen3 pad
  151,665 ids to 151,936 rows, for sharding); ids past the tokenizer's vocabulary cannot be
  decoded and must never be sampled.

  Args:
    tokenizer: a `ByteTokenizer` or `HFTokenizer` (anything with an int `vocab_size`).
    model_vocab_size: the model's embedding rows (`ModelConfig.vocab_size`).

  Returns:
    `tokenizer.vocab_size` when it is smaller than `model_vocab_size` (the padded rows are
    masked), else 0 (no limit: every model id is a tokenizer id).

  Raises:
    ValueError: the tokenizer has more ids than the model has rows, or a size is not a
      positive int.
  """
  vocab = getattr(tokenizer, "vocab_size", None)
  for name, value in (("tokenizer.vocab_size", vocab), ("model_vocab_size", model_vocab_size)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{name} must be a positive int, got {value!r}")
  if vocab > model_vocab_size:
    raise ValueError(f"the tokenizer has {vocab} ids, more than the model's embedding "
                     f"({model_vocab_size} rows)")
  return int(vocab) if vocab < model_vocab_size else 0


def encode_stop_strings(tokenizer, stop_strings: Sequence[str]) -> list[list[int]]:
  """Token sequences of stop strings, for `models.sampler.sample(stop_sequences=...)`.

  A row stops when its generated ids end with one of these sequences. With the
  byte tokenizer a string has one encoding; with a BPE tokenizer only the
  canonical encoding of the string is matched.

  Raises:
    ValueError: an empty stop string.
  """
  out = []
  for s in stop_strings:
    if not s:
      raise ValueError(f"stop strings must be non-empty, got {s!r}")
    out.append(list(tokenizer.encode(s)))
  return out


def _stop_id_table(stop_token_ids, n: int) -> np.ndarray:
  """`[N, K]` int32 table, -1 padded; K rounded up to a multiple of 4."""
  if stop_token_ids is None:
    rows = [[] for _ in range(n)]
  else:
    arr = stop_token_ids
    if isinstance(arr, (np.ndarray, jax.Array)):
      arr = np.asarray(arr)
      if arr.ndim == 1:
        rows = [arr.tolist()] * n
      elif arr.ndim == 2 and arr.shape[0] == n:
        rows = [r[r >= 0].tolist() for r in arr]
      else:
        raise ValueError(f"stop_token_ids must be [K] or [N={n}, K], got shape {arr.shape}")
    elif len(arr) and isinstance(arr[0], (list, tuple, np.ndarray)):
      if len(arr) != n:
        raise ValueError(f"per-row stop_token_ids must have {n} rows, got {len(arr)}")
      rows = [list(r) for r in arr]
    else:
      rows = [list(arr)] * n
  k = round_up(max(len(r) for r in rows), 4)
  table = np.full((n, k), -1, np.int32)
  for i, r in enumerate(rows):
    table[i, :len(r)] = r
  return table


def _stop_seq_table(stop_sequences, n: int) -> np.ndarray:
  """`[N, M, L]` int32 table, right-aligned, -1 padded; M, L rounded up (2, 8)."""
  if stop_sequences is None:
    rows = [[] for _ in range(n)]
  elif len(stop_sequences) and len(stop_sequences[0]) and isinstance(
      stop_sequences[0][0], (list, tuple, np.ndarray)):
    if len(stop_sequences) != n:
      raise ValueError(f"per-row stop_sequences must have {n} rows, got {len(stop_sequences)}")
    rows = [[list(s) for s in r] for r in stop_sequences]
  else:
    rows = [[list(s) for s in stop_sequences]] * n
  for r in rows:
    for s in r:
      if not s:
        raise ValueError("stop_sequences must not contain an empty sequence")
  m = round_up(max(len(r) for r in rows), 2)
  length = round_up(max([len(s) for r in rows for s in r] or [1]), 8)
  table = np.full((n, m, length), -1, np.int32)
  for i, r in enumerate(rows):
    for j, s in enumerate(r):
      table[i, j, length - len(s):] = s
  return table


def draw_tokens(logits: jax.Array, transform: core_types.SamplingTransform, keys: jax.Array,
                step: jax.Array, greedy: bool) -> tuple[jax.Array, jax.Array]:
  """The next token of each row and its behaviour log-prob (traced; used by the decode loops).

  Args:
    logits: `[N, V]` float32 logits of each row's next token.
    transform: the `SamplingTransform` (`core.logprobs.transform_logits`).
    keys: `[N]` row keys (`jax.random.split(rng, n)[row]`); unused when `greedy`.
    step: int32, the index of the token drawn in its row's completion: a scalar (every row
      at the same step) or `[N]`; the row key is folded with it.
    greedy: the argmax of the transformed logits instead of a draw: a Python bool (static), or
      a traced bool scalar (both are computed and one is selected, so that one program serves
      greedy and sampled calls).

  Returns:
    `(tokens [N] int32, logprobs [N] float32)`, the log-probs under the same transform
    (identical to `core.logprobs.token_logprobs`).
  """
  x = logprobs_lib.transform_logits(logits, transform)
  if isinstance(greedy, bool) and greedy:
    tok = jnp.argmax(x, axis=-1).astype(jnp.int32)
  else:
    steps = jnp.asarray(step, jnp.int32)
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None if steps.ndim == 0 else 0))(
        keys, steps)
    tok = jax.vmap(jax.random.categorical)(keys, x).astype(jnp.int32)
    if not isinstance(greedy, bool):  # traced: one program for both
      tok = jnp.where(greedy, jnp.argmax(x, axis=-1).astype(jnp.int32), tok)
  lp = jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), tok[:, None], axis=-1)[:, 0]
  return tok, lp


def stop_hits(tokens: jax.Array, window: jax.Array, stop_ids: jax.Array,
              stop_seqs: jax.Array) -> jax.Array:
  """`[N]` bool: the row's new token is a stop id or ends one of its stop sequences (traced).

  Args:
    tokens: `[N]` int32, each row's new token.
    window: `[N, L]` int32, each row's last `L` generated tokens ending with `tokens`
      (-2 where fewer were generated), `L` the width of `stop_seqs`.
    stop_ids: `[N, K]` int32 (`_stop_id_table`, -1 padded).
    stop_seqs: `[N, M, L]` int32 (`_stop_seq_table`, right-aligned, -1 padded).
  """
  seq_real = stop_seqs >= 0
  seq_nonempty = jnp.any(seq_real, axis=-1)  # [N, M]
  seq_hit = jnp.all(~seq_real | (window[:, None, :] == stop_seqs), axis=-1) & seq_nonempty
  return jnp.any(tokens[:, None] == stop_ids, axis=-1) | jnp.any(seq_hit, axis=-1)


class Requests(NamedTuple):
  """Checked sampling requests (`check_requests`), as host arrays.

  Attributes:
    prompts: `[N, P]` int32, as given (not yet padded to a bucket).
    prompt_lengths: `[N]` int32, each in `[1, P]`.
    stop_ids: `[N, K]` int32 stop id table.
    stop_seqs: `[N, M, L]` int32 stop sequence table.
    vocab_limit: the static vocabulary limit to compile (0: none).
    config: the model's `ModelConfig`.
  """
  prompts: np.ndarray
  prompt_lengths: np.ndarray
  stop_ids: np.ndarray
  stop_seqs: np.ndarray
  vocab_limit: int
  config: transformer.ModelConfig


def check_requests(graphdef, params, prompts, prompt_lengths, *, max_new_tokens: int,
                   transform: core_types.SamplingTransform, stop_token_ids=None,
                   stop_sequences=None) -> Requests:
  """Checks the arguments of a sampling call and builds its stop tables.

  The checks of `models.sampler.sample` (and of `models.continuous.sample`); the arguments
  are `models.sampler.sample`'s.

  Raises:
    ValueError: as `models.sampler.sample`.
  """
  prompts = np.asarray(prompts)
  prompt_lengths = np.asarray(prompt_lengths)
  if prompts.ndim != 2:
    raise ValueError(f"prompts must be [N, P], got shape {prompts.shape}")
  n, width = prompts.shape
  if prompt_lengths.shape != (n,):
    raise ValueError(f"prompt_lengths must be [N={n}], got shape {prompt_lengths.shape}")
  if n == 0 or np.any(prompt_lengths < 1) or np.any(prompt_lengths > width):
    raise ValueError(f"prompt_lengths must be in [1, {width}], got {prompt_lengths.tolist()}")
  if (not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool)
      or max_new_tokens < 1):
    raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
  if not isinstance(transform, core_types.SamplingTransform):
    raise ValueError(f"transform must be a SamplingTransform, got {type(transform).__name__}")
  config = nnx.merge(graphdef, params).config
  longest = int(prompt_lengths.max())
  if longest + max_new_tokens > config.max_seq_len:
    raise ValueError(
        f"longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
        f"max_seq_len {config.max_seq_len}")
  stop_ids = _stop_id_table(stop_token_ids, n)
  stop_seqs = _stop_seq_table(stop_sequences, n)
  if transform.vocab_limit > config.vocab_size:
    raise ValueError(f"transform.vocab_limit ({transform.vocab_limit}) must be at most the "
                     f"model's vocab_size ({config.vocab_size})")
  sampleable = transform.vocab_limit or config.vocab_size
  # A limit of the whole vocabulary masks nothing: compile it as no limit.
  vocab_limit = int(transform.vocab_limit) if sampleable < config.vocab_size else 0
  for name, table in (("stop_token_ids", stop_ids), ("stop_sequences", stop_seqs)):
    if np.any(table >= sampleable) or np.any(table < -1):
      raise ValueError(f"{name} must be ids in [0, {sampleable}) (the sampleable ids), got "
                       f"{table.tolist()}")
  return Requests(prompts=prompts.astype(np.int32), prompt_lengths=prompt_lengths.astype(np.int32),
                  stop_ids=stop_ids, stop_seqs=stop_seqs, vocab_limit=vocab_limit,
                  config=config)
