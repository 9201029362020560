"""Model placement on a device mesh: parameter, optimizer-state and KV-cache shardings.

The transformer's parameters carry their logical axes (`out_sharding`
metadata, see `transformer.py`); `parallel.tree_shardings` maps them to mesh
axes through the logical axis rules. Everything here is derived from
`jax.eval_shape` of the initialisers, so nothing is materialised before it is
sharded: `shard_model` gives the abstract parameters and their shardings,
`init_params` / `init_sharded` run an initialiser under `jit` with
`out_shardings` (each device only ever holds its own shard), and
`tree_shardings_like` / `optimizer_state_shardings` shard any state built
from the parameters like the parameters. `kv_cache_shardings` places the
sampler's cache, and `jit_sequence_logprobs` is the model's log-prob function
jitted over the mesh.
"""

import dataclasses
import functools
from typing import Any, Callable, Optional

from flax import nnx
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from agentic_grpo import parallel
from agentic_grpo.core import types as core_types
from agentic_grpo.models import transformer


@dataclasses.dataclass(frozen=True)
class ShardedModel:
  """The abstract model and its shardings on one mesh.

  Attributes:
    graphdef: the static model structure.
    abstract_params: `nnx.State` of `jax.ShapeDtypeStruct`s carrying their
      `NamedSharding` (usable as an Orbax restore target).
    param_shardings: `nnx.State` of `NamedSharding`s (jit in/out shardings).
    mesh: the mesh.
    rules: the logical axis rules used.
  """
  graphdef: nnx.GraphDef
  abstract_params: nnx.State
  param_shardings: nnx.State
  mesh: jax.sharding.Mesh
  rules: tuple


def shard_model(model_config: transformer.ModelConfig, mesh: parallel.MeshLike,
                rules: Optional[parallel.Rules] = None) -> ShardedModel:
  """Parameter shardings of a model from `jax.eval_shape` (allocates nothing).

  Args:
    model_config: the model shape.
    mesh: a `Mesh`, or an `AbstractMesh` to plan without devices.
    rules: logical axis rules; default `parallel.DEFAULT_RULES`.

  Raises:
    ValueError: `model_config` is not a `ModelConfig`, or bad `rules`.
  """
  if not isinstance(model_config, transformer.ModelConfig):
    raise ValueError(f"model_config must be a ModelConfig, got {type(model_config).__name__}")
  rules = parallel.canonical_rules(rules)
  graphdef, abstract = transformer.abstract_model(model_config)
  shardings = parallel.tree_shardings(abstract, mesh, rules)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  return ShardedModel(graphdef, abstract, shardings, mesh, rules)


class _ByValue:
  """Wraps a pytree of shardings so that it hashes and compares by value."""

  def __init__(self, tree):
    self.tree = tree
    leaves, treedef = jax.tree.flatten(tree)
    self._key = (str(treedef), tuple(leaves))

  def __hash__(self):
    return hash(self._key)

  def __eq__(self, other):
    return isinstance(other, _ByValue) and self._key == other._key


@functools.lru_cache(maxsize=8)
def _jitted_init(model_config: transformer.ModelConfig, shardings: _ByValue):
  return jax.jit(lambda key: transformer.init_params(model_config, key),
                 out_shardings=shardings.tree)


def init_params(sharded: ShardedModel, model_config: transformer.ModelConfig,
                rng: jax.Array) -> nnx.State:
  """Random parameters created directly in their shards.

  The initialiser is jitted with `out_shardings`, so no device ever holds
  more than its shard (plus XLA temporaries). The compiled initialiser is
  cached per model shape and shardings.

  Args:
    sharded: from `shard_model(model_config, ...)`.
    model_config: the model shape.
    rng: a `jax.random` key or an int seed.

  Returns:
    `nnx.State` of sharded parameters, bit-identical to a one-device
    `jax.jit(transformer.init_params)` with the same key (the traced
    initialiser; an eager `transformer.init_params` draws from NumPy instead).
  """
  if isinstance(rng, int):
    rng = jax.random.key(rng)
  return _jitted_init(model_config, _ByValue(sharded.param_shardings))(rng)


def device_put_params(params: nnx.State, sharded: ShardedModel) -> nnx.State:
  """Moves existing (e.g. host-loaded) parameters onto their shardings."""
  return jax.device_put(params, sharded.param_shardings)


def tree_shardings_like(abstract_tree: Any, sharded: ShardedModel) -> Any:
  """`parallel.tree_shardings` with the model's parameters as path reference.

  Use for any state built from the parameters (optimizer state, a frozen
  reference policy, an EMA copy): parameter-shaped leaves are sharded like
  the parameter, the rest replicated.
  """
  return parallel.tree_shardings(
      abstract_tree, sharded.mesh, sharded.rules,
      reference=(sharded.param_shardings, sharded.abstract_params))


def optimizer_state_shardings(tx: Any, sharded: ShardedModel) -> Any:
  """Shardings of `tx.init(params)` from `jax.eval_shape` (allocates nothing).

  Moments shaped like a parameter get that parameter's sharding (via its
  logical axes, or by tree-path suffix for plain-array states); counters are
  replicated.

  Args:
    tx: an `optax.GradientTransformation` (anything with `.init`).
    sharded: from `shard_model`.

  Returns:
    `(abstract_opt_state, opt_state_shardings)`.
  """
  abstract_params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                 sharded.abstract_params)
  abstract_state = jax.eval_shape(tx.init, abstract_params)
  return abstract_state, tree_shardings_like(abstract_state, sharded)


def init_sharded(init_fn: Callable[..., Any], sharded: ShardedModel, *args) -> tuple[Any, Any]:
  """Runs `init_fn(*args)` under `jit`, its outputs created in their shards.

  The output shardings come from `jax.eval_shape(init_fn, *args)` through
  `tree_shardings_like` (parameter-shaped leaves like their parameter, the
  rest replicated), so a whole train state (parameters, optimizer moments,
  counters) is built without ever existing unsharded.

  Args:
    init_fn: pure function of `args` returning a pytree (e.g.
      `lambda key: learner.init_state(transformer.init_params(cfg, key), tx, 0)`).
    sharded: from `shard_model`.
    *args: arrays passed to `init_fn` (e.g. a PRNG key).

  Returns:
    `(value, shardings)`.
  """
  shardings = tree_shardings_like(jax.eval_shape(init_fn, *args), sharded)
  return jax.jit(init_fn, out_shardings=shardings)(*args), shardings


def _kv_cache_axes(model_config: transformer.ModelConfig) -> tuple[str, ...]:
  """Logical axes of one layer's keys/values, read off `transformer.init_cache`.

  The layout is the model's business; it is found with `jax.eval_shape` on a
  probe config whose sizes are all distinct, so it follows any reordering.
  """
  declared = getattr(transformer, "KV_CACHE_AXES", None)
  if declared is not None:
    return tuple(declared)
  probe = dataclasses.replace(model_config, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=6)
  sizes = {3: "batch", 5: "cache_length", 2: "kv_heads", 6: "head_dim"}
  shape = jax.eval_shape(lambda: transformer.init_cache(probe, 3, 5)).k[0].shape
  if len(shape) != 4 or sorted(shape) != sorted(sizes):
    raise ValueError(f"unexpected KV cache layout {shape} from transformer.init_cache")
  return tuple(sizes[d] for d in shape)


def kv_cache_shardings(model_config: transformer.ModelConfig, mesh: parallel.MeshLike,
                       batch_size: int, max_len: int,
                       rules: Optional[parallel.Rules] = None) -> transformer.KVCache:
  """Shardings of `transformer.init_cache(model_config, batch_size, max_len)`.

  Keys and values are split by rows (`batch`) and key/value heads
  (`kv_heads`), slots and head width whole; `valid` `[N, S]` by rows;
  `index` is replicated.

  Returns:
    A `KVCache` whose leaves are `NamedSharding`s.
  """
  abstract = jax.eval_shape(lambda: transformer.init_cache(model_config, batch_size, max_len))
  axes = _kv_cache_axes(model_config)
  kv = NamedSharding(mesh, parallel.logical_to_spec(axes, abstract.k[0].shape, mesh, rules))
  valid = NamedSharding(mesh, parallel.logical_to_spec(("batch", "cache_length"),
                                                       abstract.valid.shape, mesh, rules))
  layers = len(abstract.k)
  return transformer.KVCache(k=(kv,) * layers, v=(kv,) * layers, valid=valid,
                             index=NamedSharding(mesh, P()))


def jit_sequence_logprobs(
    sharded: ShardedModel,
    transform: core_types.SamplingTransform = core_types.IDENTITY_TRANSFORM,
) -> Callable[..., jax.Array]:
  """`transformer.sequence_logprobs` jitted over the mesh.

  Returns:
    `fn(params, tokens [N, T], positions [N, T], segment_mask [N, T]) ->
    [N, T] f32`, parameters in `sharded.param_shardings`, rows split over the
    batch axes; the output is row-sharded like the inputs. `fn` raises
    `ValueError` when `N` is not a multiple of `parallel.batch_devices`.
  """
  mesh, rules = sharded.mesh, sharded.rules
  rows = parallel.row_sharding(mesh, rules)
  ways = parallel.batch_devices(mesh, rules)

  def fn(params, tokens, positions, segment_mask):
    return transformer.sequence_logprobs(
        sharded.graphdef, params, tokens, positions, segment_mask, transform)

  jitted = jax.jit(fn, in_shardings=(sharded.param_shardings, rows, rows, rows),
                   out_shardings=rows)

  def call(params, tokens, positions, segment_mask):
    n = tokens.shape[0]
    if n % ways:
      raise ValueError(f"tokens rows ({n}) must be a multiple of the batch mesh axes' size "
                       f"{ways}")
    return jitted(params, tokens, positions, segment_mask)

  call.jitted = jitted
  return call
