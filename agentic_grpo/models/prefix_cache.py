"""Saved KV cache rows of conversations, for reuse by the next stage's prefill.

Stage k+1 of an episode extends stage k's conversation (prompt + completion + a new opening).
`PrefixCache` is a host-managed pool of the cache rows of finished conversations: each entry
holds the keys and values of its tokens at positions `0..L-1` (on the device), the tokens
themselves (on the host, for the equality check before reuse) and the policy version that
computed them. Entries are keyed by a caller-given hashable key (e.g. `(episode, stage)`), and
evicted least-recently-used once their bytes exceed the pool's budget. `models.continuous`
saves a request's conversation under its `save_keys` entry and starts a later request whose
prompt begins with a saved entry's tokens from those rows (`reuse_prefix`, `REUSE_PREFIX`).

Row layout: one array per entry, `[n_layers, 2, n_kv_heads, W, head_dim]` in the cache dtype
(keys at `[:, 0]`, values at `[:, 1]`, rotary embedding applied), `W` a prompt bucket at least
`L` (positions `L..W-1` are padding: never attended to).
"""

import collections
from typing import Hashable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentic_grpo.models import transformer

# `reuse_prefix` values (`models.continuous.sample`): never reuse; reuse rows computed by the
# current policy version only; reuse rows of any version (the caller records the version).
REUSE_PREFIX = ("never", "same_version", "always")


def check_reuse_prefix(value) -> str:
  """`value` if it is one of `REUSE_PREFIX`.

  Raises:
    ValueError: any other value.
  """
  if not isinstance(value, str) or value not in REUSE_PREFIX:
    raise ValueError(f"reuse_prefix must be one of {REUSE_PREFIX}, got {value!r}")
  return value


class Entry(NamedTuple):
  """One saved conversation.

  Attributes:
    tokens: `[L]` int32 host ids of the conversation the rows hold (positions `0..L-1`).
    rows: `[n_layers, 2, n_kv_heads, W, head_dim]` device keys (`[:, 0]`) and values
      (`[:, 1]`) at positions `0..W-1`, `W >= L`.
    version: the policy version whose parameters computed the rows.
  """
  tokens: np.ndarray
  rows: jax.Array
  version: int

  @property
  def nbytes(self) -> int:
    """Bytes the entry holds (rows and tokens)."""
    return int(self.rows.size * self.rows.dtype.itemsize + self.tokens.nbytes)


class PrefixCache:
  """Saved conversation rows by key, evicted least-recently-used under a byte budget.

  Not thread-safe; one sampler at a time.

  Attributes:
    budget_bytes: the most bytes the entries hold together.
    evictions: entries dropped to stay within the budget so far.
  """

  def __init__(self, budget_bytes: int):
    """An empty pool.

    Raises:
      ValueError: `budget_bytes` is not a positive int.
    """
    if (not isinstance(budget_bytes, (int, np.integer)) or isinstance(budget_bytes, bool)
        or budget_bytes < 1):
      raise ValueError(f"budget_bytes must be a positive int, got {budget_bytes!r}")
    self.budget_bytes = int(budget_bytes)
    self.evictions = 0
    self._entries: collections.OrderedDict = collections.OrderedDict()
    self._bytes = 0

  def __len__(self) -> int:
    return len(self._entries)

  def __contains__(self, key: Hashable) -> bool:
    return key in self._entries

  @property
  def nbytes(self) -> int:
    """Bytes held by the entries now (at most `budget_bytes`)."""
    return self._bytes

  def put(self, key: Hashable, tokens, rows: jax.Array, version: int) -> bool:
    """Saves (or replaces) the entry of `key` as the most recently used, then evicts the
    least recently used entries until the pool fits its budget.

    Args:
      key: hashable.
      tokens: `[L]` int ids, `L >= 1`.
      rows: `[n_layers, 2, n_kv_heads, W, head_dim]` (`save_rows`), `W >= L`.
      version: int >= 0, the policy version of the rows.

    Returns:
      whether the entry was kept (False: it alone is larger than the budget).

    Raises:
      ValueError: bad shapes or version.
    """
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 1 or tokens.size < 1:
      raise ValueError(f"tokens must be [L] with L >= 1, got shape {tokens.shape}")
    if rows.ndim != 5 or rows.shape[1] != 2 or rows.shape[3] < tokens.size:
      raise ValueError(f"rows must be [n_layers, 2, n_kv_heads, W >= {tokens.size}, "
                       f"head_dim], got shape {tuple(rows.shape)}")
    if not isinstance(version, (int, np.integer)) or isinstance(version, bool) or version < 0:
      raise ValueError(f"version must be an int >= 0, got {version!r}")
    self.discard(key)
    entry = Entry(tokens=tokens, rows=rows, version=int(version))
    if entry.nbytes > self.budget_bytes:
      return False
    self._entries[key] = entry
    self._bytes += entry.nbytes
    while self._bytes > self.budget_bytes:
      _, old = self._entries.popitem(last=False)
      self._bytes -= old.nbytes
      self.evictions += 1
    return True

  def get(self, key: Hashable) -> Optional[Entry]:
    """The entry of `key` (now the most recently used), or None."""
    entry = self._entries.get(key)
    if entry is not None:
      self._entries.move_to_end(key)
    return entry

  def discard(self, key: Hashable) -> None:
    """Drops the entry of `key` if there is one."""
    entry = self._entries.pop(key, None)
    if entry is not None:
      self._bytes -= entry.nbytes

  def clear(self) -> None:
    """Drops every entry."""
    self._entries.clear()
    self._bytes = 0


def _fit_impl(rows, width):
  """`rows [..., C, head_dim]` cut or zero padded to `width` positions."""
  have = rows.shape[-2]
  if width <= have:
    return rows[..., :width, :]
  pad = [(0, 0)] * rows.ndim
  pad[-2] = (0, width - have)
  return jnp.pad(rows, pad)


def _save_rows_impl(cache: transformer.KVCache, slot, *, width):
  rows = jnp.stack([jnp.stack([k[slot], v[slot]]) for k, v in zip(cache.k, cache.v,
                                                                   strict=True)])
  return _fit_impl(rows, width)


_SAVE_ROWS_JIT = jax.jit(_save_rows_impl, static_argnames=("width",))


def save_rows(cache: transformer.KVCache, slot: int, width: int) -> jax.Array:
  """Row `slot` of `cache` in the entry layout (jitted per cache shape and `width`).

  Args:
    cache: a `KVCache` of `[S, n_kv_heads, C, head_dim]` keys and values.
    slot: the row in `[0, S)`.
    width: `W`, positions kept: the first `W` (zero padded past `C`).

  Returns:
    `[n_layers, 2, n_kv_heads, W, head_dim]` in the cache dtype.
  """
  return _SAVE_ROWS_JIT(cache, jnp.int32(slot), width=int(width))


_FIT_JIT = jax.jit(_fit_impl, static_argnames=("width",))


def stack_rows(entries: Sequence[Entry], width: int) -> jax.Array:
  """The rows of `B` entries, each cut or zero padded to `width` positions.

  Returns:
    `[B, n_layers, 2, n_kv_heads, width, head_dim]`.
  """
  return jnp.stack([_FIT_JIT(e.rows, width=int(width)) for e in entries])


def check_entry(entry: Entry, config: transformer.ModelConfig) -> None:
  """Raises ValueError if `entry`'s rows do not fit a cache of `config` (another model)."""
  want = (config.n_layers, 2, config.n_kv_heads, config.head_dim)
  got = tuple(entry.rows.shape)
  if (got[:3] + got[4:]) != want or entry.rows.dtype != config.dtype:
    raise ValueError(f"a saved prefix of shape {got} and dtype {entry.rows.dtype} does not fit "
                     f"this model's cache ([{want[0]}, 2, {want[2]}, W, {want[3]}] "
                     f"{jnp.dtype(config.dtype)})")
