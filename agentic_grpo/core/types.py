"""The typed values that cross the host/device door.

* `UpdateBatch`: one Agentic GRPO learner batch, built on the host by `replay.StagedReplay.take`
  (or `UpdateBatch.padding`) and consumed by the jitted update step.
* `SFTBatch`: one supervised warm-start batch (reference episodes).
* `SamplingTransform`: the sampleable ids, temperature, top-k, top-p; the sampler draws tokens
  and records their behaviour log-probs under it, the learner recomputes log-probs under the
  same value, so the importance ratio is 1 on policy (`core.logprobs`).

The batches are `NamedTuple`s, hence pytrees: `jax.device_put`, `jax.tree.map` and the mesh
placement helpers keep their type. `check()` validates ranks, shapes and dtypes on host arrays,
device arrays and tracers alike (it reads only `.shape` and `.dtype`), raising a `ValueError`
that names the bad field. `check_choice` is the one check of an option string against its
vocabulary (each vocabulary is a module-level tuple in the module that implements it).
"""

import dataclasses
from typing import Any, NamedTuple, Union

import jax
import numpy as np

Scalar = Union[float, jax.Array]


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
  """Raises `ValueError` naming `name` unless `value` is one of `allowed`."""
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _check_field(kind: str, name: str, x: Any, rank: int, dtype: Any, shape=None) -> None:
  if len(x.shape) != rank:
    want = "[N, T]" if rank == 2 else "[N]"
    raise ValueError(f"{kind}.{name} must be {want}, got shape {tuple(x.shape)}")
  if shape is not None and tuple(x.shape) != tuple(shape):
    raise ValueError(f"{kind}.{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
  if np.dtype(x.dtype) != np.dtype(dtype):
    raise ValueError(f"{kind}.{name} must be {np.dtype(dtype).name}, got dtype {x.dtype}")


class UpdateBatch(NamedTuple):
  """A fixed-shape Agentic GRPO update batch of `N` rows of `T` tokens.

  Padding rows have an all-False `loss_mask` and weight 0.

  A *packed* batch (shared-prefix packing, `core.packing`) also has `positions` and
  `branches`: several token rows that share a prefix hold it once, `[prefix | suffix_1 |
  suffix_2 | ...]` (a tree), and a row may hold several trees side by side; every per-token
  field is in that packed layout. Both are None in an unpacked batch (positions `0 .. T - 1`,
  the plain causal mask).

  Attributes:
    tokens: `[N, T]` int32 token ids.
    loss_mask: `[N, T]` bool, True on the tokens the policy generated and is trained on.
    behaviour_logprobs: `[N, T]` float32 log π_β of each token at sampling time (0 off the mask).
    advantages: `[N, T]` float32 per-token advantage (staleness weight folded in).
    sample_weights: `[N]` float32 row weights (1 for real rows, 0 for padding rows).
    positions: None, or `[N, T]` int32 rotary positions of each token in its own row.
    branches: None, or `[N, T]` int32: 0 on a tree's shared prefix, i > 0 on its suffix i (a
      tree starts at each slot of branch 0 and position 0).
    loss_slots: None, or `[N, L]` int32, L <= T: each row's loss-token slots in increasing
      order, then 0 (a row's first slot, never a loss token) to L
      (`learner.with_loss_slots`). The update then computes the logits, and the model's last
      block, at the slots that score those tokens only (`models.transformer.apply`'s
      `query_slots`): the same loss up to float rounding, for less work where loss tokens
      are a small share of the rows. None: every slot.
  """
  tokens: Any
  loss_mask: Any
  behaviour_logprobs: Any
  advantages: Any
  sample_weights: Any
  positions: Any = None
  branches: Any = None
  loss_slots: Any = None

  @property
  def packed(self) -> bool:
    """Whether the batch carries a packed layout (`positions` and `branches`)."""
    return self.branches is not None

  def check(self) -> "UpdateBatch":
    """Returns `self` after checking every field's rank, shape and dtype.

    Raises:
      ValueError: naming the first field of the wrong rank, shape or dtype.
    """
    _check_field("UpdateBatch", "tokens", self.tokens, 2, np.int32)
    shape = tuple(self.tokens.shape)
    _check_field("UpdateBatch", "loss_mask", self.loss_mask, 2, np.bool_, shape)
    _check_field("UpdateBatch", "behaviour_logprobs", self.behaviour_logprobs, 2, np.float32,
                 shape)
    _check_field("UpdateBatch", "advantages", self.advantages, 2, np.float32, shape)
    _check_field("UpdateBatch", "sample_weights", self.sample_weights, 1, np.float32,
                 shape[:1])
    if (self.positions is None) != (self.branches is None):
      raise ValueError("UpdateBatch.positions and UpdateBatch.branches must be given together "
                       "(a packed batch) or both be None")
    if self.branches is not None:
      _check_field("UpdateBatch", "positions", self.positions, 2, np.int32, shape)
      _check_field("UpdateBatch", "branches", self.branches, 2, np.int32, shape)
    if self.loss_slots is not None:
      got = tuple(self.loss_slots.shape)
      if len(got) != 2 or got[0] != shape[0] or not 1 <= got[1] <= shape[1]:
        raise ValueError(f"UpdateBatch.loss_slots must be [N={shape[0]}, L] with 1 <= L <= "
                         f"T={shape[1]}, got shape {got}")
      _check_field("UpdateBatch", "loss_slots", self.loss_slots, 2, np.int32)
    return self

  @classmethod
  def padding(cls, rows: int, length: int, *, packed: bool = False) -> "UpdateBatch":
    """`rows` padding rows of `length` tokens (no loss token, weight 0), as NumPy arrays.

    A process's share of a global batch when it has no ready row. `packed`: with the packed
    layout's fields (positions `0 .. length - 1`, branch 0: unpacked rows).

    Raises:
      ValueError: unless `rows >= 1` and `length >= 1`.
    """
    if rows < 1 or length < 1:
      raise ValueError(f"rows and length must be >= 1, got rows={rows}, length={length}")
    layout = {}
    if packed:
      layout = {"positions": np.broadcast_to(np.arange(length, dtype=np.int32),
                                             (rows, length)).copy(),
                "branches": np.zeros((rows, length), np.int32)}
    return cls(tokens=np.zeros((rows, length), np.int32),
               loss_mask=np.zeros((rows, length), bool),
               behaviour_logprobs=np.zeros((rows, length), np.float32),
               advantages=np.zeros((rows, length), np.float32),
               sample_weights=np.zeros((rows,), np.float32), **layout)


class SFTBatch(NamedTuple):
  """A supervised warm-start batch of `N` rows of `T` tokens.

  Attributes:
    tokens: `[N, T]` int32 token ids.
    loss_mask: `[N, T]` bool, True on the tokens to imitate.
  """
  tokens: Any
  loss_mask: Any

  def check(self) -> "SFTBatch":
    """Returns `self` after checking both fields' rank, shape and dtype.

    Raises:
      ValueError: naming the first field of the wrong rank, shape or dtype.
    """
    _check_field("SFTBatch", "tokens", self.tokens, 2, np.int32)
    _check_field("SFTBatch", "loss_mask", self.loss_mask, 2, np.bool_, self.tokens.shape)
    return self


def _is_number(x: Any) -> bool:
  return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class SamplingTransform:
  """The sampling transform: temperature scaling, then top-k, then top-p (`core.logprobs`).

  Frozen and hashable (a cache key of the jitted learner step), passed by value. `temperature`
  and `top_p` may be traced float32 scalars inside a jitted function (the sampler traces them so
  that a new value does not recompile); `top_k` is always a static Python int.

  Attributes:
    temperature: > 0; logits are divided by it.
    top_k: int >= 0; keep the `top_k` largest logits per row, 0 disables.
    top_p: in (0, 1]; nucleus mass kept, a Python 1.0 disables the filter at trace time.
    vocab_limit: int >= 0, static; ids `>= vocab_limit` are never sampled (their logits are
      masked before everything else), 0 disables. A model whose embedding has more rows than
      its tokenizer has ids (real Qwen2.5 / Qwen3 checkpoints pad 151,665 ids to 151,936
      rows) is sampled, trained and evaluated with `vocab_limit` = the tokenizer's vocabulary
      (`models.sampling_rules.sampleable_vocab`), so that no id the tokenizer cannot decode is
      drawn and the learner's log-probs are normalised over the same ids as the sampler's.

  Raises:
    ValueError: at construction, for `temperature <= 0`, a `top_k` or `vocab_limit` that is
      not a non-negative int, or a `top_p` outside (0, 1] (checked when they are Python
      numbers).
  """
  temperature: Scalar = 1.0
  top_k: int = 0
  top_p: Scalar = 1.0
  vocab_limit: int = 0

  def __post_init__(self):
    if _is_number(self.temperature) and not self.temperature > 0:
      raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
    if (not isinstance(self.top_k, (int, np.integer)) or isinstance(self.top_k, bool)
        or self.top_k < 0):
      raise ValueError(f"top_k must be a non-negative int (0 disables), got {self.top_k!r}")
    if _is_number(self.top_p) and not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
    if (not isinstance(self.vocab_limit, (int, np.integer)) or isinstance(self.vocab_limit, bool)
        or self.vocab_limit < 0):
      raise ValueError(f"vocab_limit must be a non-negative int (0 disables), got "
                       f"{self.vocab_limit!r}")

  @property
  def uses_top_p(self) -> bool:
    """False when `top_p` is the Python number 1 (the filter is skipped at trace time)."""
    return not (_is_number(self.top_p) and self.top_p >= 1.0)


# Temperature 1, no filtering: the model's own distribution (the warm-start's log-probs).
IDENTITY_TRANSFORM = SamplingTransform()
