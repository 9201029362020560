"""Device meshes, logical-axis rules and shardings; multi-process start-up.

Every device computation of this package runs under `jax.jit` with explicit
`NamedSharding`s over one `jax.sharding.Mesh` with three axes:

* `data`   — pure data parallelism: batch rows split, parameters replicated;
* `fsdp`   — fully sharded data parallelism (ZeRO-3, Rajbhandari et al., 2020):
  batch rows split *and* parameters / optimizer state split along their
  `embed` dimension, gathered by XLA where a layer needs them;
* `tensor` — tensor (model) parallelism (Shoeybi et al., 2019, "Megatron-LM"):
  attention heads, MLP hidden units and the vocabulary split.

Model parameters name their dimensions with logical axes (`vocab`, `embed`,
`mlp`, `heads`, `kv_heads`, `head_dim`, see `models/transformer.py`); batches
and the KV cache use `batch`, `length` and `cache_length`. A table of
*logical axis rules* (`DEFAULT_RULES`, overridable in the config) maps each
logical axis to zero, one or several mesh axes. `logical_to_spec` applies the
rules to one array, with two safety rules: a mesh axis is used at most once
per array, and a dimension whose size the mesh axes do not divide keeps the
longest prefix of those axes that does divide it (possibly none: replicated),
so e.g. 4 key/value heads on a tensor axis of 8 are replicated rather than
rejected.

Axis types. The mesh uses `jax.sharding.AxisType.Auto` on every axis (where
`jax.make_mesh` would default to `Explicit`). With Auto axes the shardings
given at the `jit` boundary (parameters, optimizer state, batch, KV cache)
are the contract, and the XLA partitioner (Shardy/GSPMD) propagates shardings
through the model and inserts the collectives. Explicit axes
("sharding in types") would make every contraction over a sharded dimension
in the model state its output sharding or raise `ShardingTypeError`; the
model code stays mesh-agnostic instead, and the numerical equality of every
mesh with one device is what the tests check.

Parameter and optimizer-state shardings are derived from `jax.eval_shape` of
the initialisers, so nothing is materialised before it is sharded:
`init_params` runs the model initialiser under `jit` with `out_shardings`, so
each device only ever holds its own shard.

Multi-process (multi-host) runs use JAX's own multi-controller runtime:
`initialize_distributed` calls `jax.distributed.initialize`; every process
runs the same program, feeds its process-local rows with `shard_batch`
(`jax.make_array_from_process_local_data`) and takes its slice of the task
list with `process_slice`.
"""

from collections.abc import Mapping, Sequence
import dataclasses
import functools
import json
import os
from typing import Any, Callable, Optional, Union

from absl import logging
from flax import nnx
import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from agentic_grpo import learner
from agentic_grpo.models import sampler as sampler_lib
from agentic_grpo.models import transformer

MESH_AXES = ("data", "fsdp", "tensor")
# Mesh axes that split batch rows (and the batch dimension of the KV cache).
BATCH_AXES = ("data", "fsdp")

# Logical axis -> mesh axis (a name, a tuple of names, or None = replicated).
# Parameters: `embed` over `fsdp` (FSDP/ZeRO-3), heads / kv_heads / mlp /
# vocab over `tensor` (Megatron-style column/row split). Activations and the
# KV cache: rows over `data` and `fsdp`, sequence dimensions whole.
DEFAULT_RULES = (
    ("batch", BATCH_AXES),
    ("length", None),
    ("cache_length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
)

# Environment variables read by `initialize_distributed` (set by the launch
# scripts). JAX itself reads JAX_COORDINATOR_ADDRESS; the other two are ours.
ENV_DISTRIBUTED = "AGENTIC_GRPO_DISTRIBUTED"
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"

Rules = Sequence[tuple[str, Union[None, str, Sequence[str]]]]
MeshLike = Union[jax.sharding.Mesh, jax.sharding.AbstractMesh]


# ---------------------------------------------------------------- meshes


def _mesh_sizes(config: Any) -> tuple:
  """(data, fsdp, tensor) from a sequence, a mapping/object with those fields, or one
  with a `mesh` section holding them."""
  if isinstance(config, Sequence) and not isinstance(config, str):
    if len(config) != len(MESH_AXES):
      raise ValueError(f"mesh sizes must have {len(MESH_AXES)} entries {MESH_AXES}, "
                       f"got {tuple(config)}")
    return tuple(config)
  section = _field(config, "mesh", config)
  sizes = tuple(_field(section, a, None) for a in MESH_AXES)
  if any(s is None for s in sizes):
    raise ValueError(f"mesh config must be a (data, fsdp, tensor) sequence or have fields "
                     f"{MESH_AXES} (directly or in a `mesh` section), got {config!r}")
  return sizes


def _field(obj, name, default):
  if isinstance(obj, (Mapping, ml_collections.ConfigDict)):
    return obj[name] if name in obj else default
  return getattr(obj, name, default)


def rules_from_config(config: Any) -> tuple:
  """Logical axis rules of a config: `config.mesh.logical_axis_rules`, or of a
  `sharding` section (`config.logical_axis_rules`); `DEFAULT_RULES` when absent
  or empty.

  Raises:
    ValueError: malformed rules (see `logical_to_spec`).
  """
  section = _field(config, "mesh", config)
  rules = _field(section, "logical_axis_rules", None) or _field(config, "logical_axis_rules",
                                                               None)
  return canonical_rules(rules or None)


def canonical_rules(rules: Optional[Rules]) -> tuple:
  """Validated rules as a hashable tuple of `(name, None | axis | (axes...))`.

  Raises:
    ValueError: a malformed entry, a repeated logical name or an unknown mesh axis.
  """
  table = _normalise_rules(rules)
  return tuple((k, None if not v else v[0] if len(v) == 1 else v) for k, v in table.items())


def resolve_mesh_shape(sizes: Sequence[int], num_devices: int) -> tuple[int, int, int]:
  """Replaces a `-1` in `(data, fsdp, tensor)` by the devices left over.

  Args:
    sizes: three ints, each positive or -1 (at most one -1).
    num_devices: devices the mesh must cover exactly.

  Returns:
    `(data, fsdp, tensor)` with product `num_devices`.

  Raises:
    ValueError: wrong length, a size that is neither positive nor -1, more
      than one -1, or sizes whose product does not match `num_devices`.
  """
  sizes = tuple(sizes)
  if len(sizes) != len(MESH_AXES):
    raise ValueError(f"mesh sizes must have {len(MESH_AXES)} entries {MESH_AXES}, got {sizes}")
  for name, s in zip(MESH_AXES, sizes):
    if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or (s <= 0 and s != -1):
      raise ValueError(f"mesh size {name} must be a positive int or -1, got {s!r}")
  if num_devices <= 0:
    raise ValueError(f"num_devices must be positive, got {num_devices}")
  n_free = sum(s == -1 for s in sizes)
  if n_free > 1:
    raise ValueError(f"at most one mesh size may be -1, got {sizes}")
  fixed = int(np.prod([s for s in sizes if s != -1]))
  if n_free:
    if num_devices % fixed:
      raise ValueError(
          f"mesh sizes {sizes}: fixed axes ({fixed} devices) do not divide the "
          f"{num_devices} devices")
    sizes = tuple(num_devices // fixed if s == -1 else s for s in sizes)
  elif fixed != num_devices:
    raise ValueError(f"mesh sizes {sizes} cover {fixed} devices, but there are {num_devices}")
  return tuple(int(s) for s in sizes)


def make_mesh(config: Any, devices: Optional[Sequence[jax.Device]] = None) -> jax.sharding.Mesh:
  """A `(data, fsdp, tensor)` mesh with `AxisType.Auto` axes.

  Devices are laid out by `jax.make_mesh` (topology-aware on TPU): the last
  axis (`tensor`) varies fastest, so tensor-parallel groups are neighbours on
  the interconnect and, with several processes, `data` is the axis that
  spans hosts first.

  Args:
    config: `(data, fsdp, tensor)` sizes, or a config/mapping with fields
      `data`, `fsdp`, `tensor`, or one with a `mesh` section holding them
      (e.g. a `TrainConfig`). One size may be -1.
    devices: devices to use; default all (`jax.devices()`, every process).
      In a single-process run, fixed sizes covering fewer devices than
      there are use the first ones (e.g. `(1, 1, 1)` in a test that has 8).

  Returns:
    A `jax.sharding.Mesh` with axis names `MESH_AXES`.

  Raises:
    ValueError: see `resolve_mesh_shape`.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = _mesh_sizes(config)
  fixed = all(isinstance(x, (int, np.integer)) and x > 0 for x in sizes)
  if fixed and jax.process_count() == 1 and 0 < int(np.prod(sizes)) < len(devices):
    logging.info("mesh %s uses %d of %d devices", sizes, int(np.prod(sizes)), len(devices))
    devices = devices[:int(np.prod(sizes))]
  shape = resolve_mesh_shape(sizes, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3,
                       devices=devices)


# ---------------------------------------------------------------- rules


def _normalise_rules(rules: Optional[Rules]) -> dict[str, tuple[str, ...]]:
  """{logical: (mesh axes...)}; validates the rule table."""
  rules = DEFAULT_RULES if rules is None else rules
  out = {}
  for entry in rules:
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
      raise ValueError(f"logical_axis_rules entries must be (logical, mesh_axes) pairs, "
                       f"got {entry!r}")
    name, target = entry
    if not isinstance(name, str):
      raise ValueError(f"logical axis name must be a str, got {name!r}")
    if name in out:
      raise ValueError(f"logical axis {name!r} appears twice in logical_axis_rules")
    if target is None:
      axes = ()
    elif isinstance(target, str):
      axes = (target,)
    elif isinstance(target, (tuple, list)):
      axes = tuple(target)
    else:
      raise ValueError(f"logical axis {name!r} must map to None, a mesh axis name or a tuple "
                       f"of them, got {target!r}")
    for a in axes:
      if a not in MESH_AXES:
        raise ValueError(f"logical axis {name!r} maps to unknown mesh axis {a!r}; "
                         f"mesh axes are {MESH_AXES}")
    out[name] = axes
  return out


def logical_to_spec(
    logical_axes: Sequence[Optional[str]],
    shape: Sequence[int],
    mesh: MeshLike,
    rules: Optional[Rules] = None,
) -> P:
  """The `PartitionSpec` of one array from its logical axis names.

  Each dimension takes the mesh axes its logical name maps to, except mesh
  axes already used by an earlier dimension, and only the longest prefix of
  them whose total size divides the dimension (so indivisible dimensions are
  replicated instead of raising in `device_put`).

  Args:
    logical_axes: one name (or None = replicated) per dimension.
    shape: the array shape.
    mesh: a `Mesh` or `AbstractMesh` (only axis sizes are used).
    rules: logical axis rules; default `DEFAULT_RULES`.

  Returns:
    A `PartitionSpec` with one entry per dimension.

  Raises:
    ValueError: rank mismatch, or a logical name the rules do not know.
  """
  table = _normalise_rules(rules)
  logical_axes = tuple(logical_axes)
  if len(logical_axes) != len(shape):
    raise ValueError(f"logical_axes {logical_axes} do not match shape {tuple(shape)}")
  sizes = dict(mesh.shape)
  used = set()
  entries = []
  for name, dim in zip(logical_axes, shape):
    if name is None:
      entries.append(None)
      continue
    if name not in table:
      raise ValueError(f"logical axis {name!r} has no entry in logical_axis_rules "
                       f"(known: {sorted(table)})")
    chosen = []
    prod = 1
    for a in table[name]:
      if a in used or a not in sizes or dim % (prod * sizes[a]):
        break
      chosen.append(a)
      prod *= sizes[a]
    used.update(chosen)
    entries.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return P(*entries)


def _logical_axes_of(variable: nnx.Variable) -> Optional[tuple]:
  meta = variable.get_metadata()
  axes = meta.get("out_sharding")
  return tuple(axes) if axes else None


def _strip_value_key(path):
  return tuple(k for k in path if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))


def tree_shardings(
    abstract_tree: Any,
    mesh: jax.sharding.Mesh,
    rules: Optional[Rules] = None,
) -> Any:
  """`NamedSharding`s for every array of a (typically abstract) pytree.

  An `nnx.Variable` with `out_sharding` metadata (model parameters, and the
  parameter-shaped moments optax builds from them) is sharded by its logical
  axes through the rules; every other array (step counters, scalars, RNG
  keys) is replicated. See `tree_shardings_like` for states of plain arrays.

  Args:
    abstract_tree: pytree of arrays or `jax.ShapeDtypeStruct`s, possibly
      inside `nnx.Variable`s (e.g. from `jax.eval_shape`).
    mesh: the mesh.
    rules: logical axis rules; default `DEFAULT_RULES`.

  Returns:
    A pytree of the same structure with `NamedSharding` leaves (Variables
    kept as Variables holding a `NamedSharding`), usable as `in_shardings` /
    `out_shardings` of `jax.jit` and with `jax.device_put`.

  Raises:
    ValueError: from `logical_to_spec` (unknown logical axis, rank mismatch).
  """
  return _tree_shardings(abstract_tree, mesh, rules, {})


def _reference_index(shardings, abstract) -> dict:
  """{path without `.value`: (sharding, shape)} of a reference tree."""
  s_leaves = jax.tree_util.tree_flatten_with_path(shardings)[0]
  a_leaves = jax.tree.leaves(abstract)
  if len(s_leaves) != len(a_leaves):
    raise ValueError("reference shardings and abstract tree differ in structure")
  return {_strip_value_key(path): (s, tuple(a.shape))
          for (path, s), a in zip(s_leaves, a_leaves)}


def _tree_shardings(abstract_tree, mesh, rules, ref_index: dict) -> Any:
  """`tree_shardings`, plus path-suffix matching against `ref_index`."""

  def from_reference(path, shape):
    key = _strip_value_key(path)
    for start in range(len(key)):
      hit = ref_index.get(key[start:])
      if hit is not None and hit[1] == tuple(shape):
        return hit[0]
    return None

  def leaf_sharding(path, x, logical=None):
    shape = tuple(getattr(x, "shape", ()))
    if logical is not None and len(logical) == len(shape):
      return NamedSharding(mesh, logical_to_spec(logical, shape, mesh, rules))
    found = from_reference(path, shape) if ref_index else None
    return found if found is not None else NamedSharding(mesh, P())

  def visit(path, x):
    if isinstance(x, nnx.Variable):
      return x.replace(leaf_sharding(path, x.get_value(), _logical_axes_of(x)))
    return leaf_sharding(path, x)

  return jax.tree_util.tree_map_with_path(
      visit, abstract_tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


# ---------------------------------------------------------------- parameters


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


def shard_model(model_config: transformer.ModelConfig, mesh: MeshLike,
                rules: Optional[Rules] = None) -> ShardedModel:
  """Parameter shardings of a model from `jax.eval_shape` (allocates nothing).

  Args:
    model_config: the model shape.
    mesh: a `Mesh`, or an `AbstractMesh` to plan without devices.
    rules: logical axis rules; default `DEFAULT_RULES`.

  Raises:
    ValueError: `model_config` is not a `ModelConfig`, or bad `rules`.
  """
  if not isinstance(model_config, transformer.ModelConfig):
    raise ValueError(f"model_config must be a ModelConfig, got {type(model_config).__name__}")
  rules = canonical_rules(rules)
  graphdef, abstract = transformer.abstract_model(model_config)
  shardings = tree_shardings(abstract, mesh, rules)
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


def tree_shardings_like(abstract_tree: Any, sharded: ShardedModel) -> Any:
  """`tree_shardings` with the model's parameters as path reference.

  Use for any state built from the parameters (optimizer state, a frozen
  reference policy, an EMA copy): parameter-shaped leaves are sharded like
  the parameter, the rest replicated.
  """
  return _tree_shardings(abstract_tree, sharded.mesh, sharded.rules,
                         _reference_index(sharded.param_shardings, sharded.abstract_params))


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


def row_sharding(mesh: jax.sharding.Mesh, rules: Optional[Rules] = None) -> NamedSharding:
  """`P(batch axes)`: dimension 0 split over the `batch` rule's mesh axes.

  As a `jit` sharding prefix it applies to every leaf of a batch dict whose
  leaves all have rows as dimension 0 (rows must divide evenly: see
  `batch_devices`).
  """
  return NamedSharding(mesh, P(_batch_entry(mesh, rules)))


def batch_devices(mesh: jax.sharding.Mesh, rules: Optional[Rules] = None) -> int:
  """How many ways batch rows are split (the product of the `batch` rule's mesh axes)."""
  return _batch_devices(mesh, rules)


@dataclasses.dataclass(frozen=True, eq=False)
class TreeShardings(learner.Shardings):
  """`learner.Shardings` holding sharding *trees*, hashable by value.

  The learner caches its jitted steps on the shardings; `nnx.State` and
  `TrainState` trees are not hashable, so equality and hash here compare the
  flattened tree structure and its `NamedSharding` leaves.
  """

  def _key(self):
    leaves, treedef = jax.tree.flatten((self.state, self.batch, self.ref_params))
    return str(treedef), tuple(leaves)

  def __hash__(self):
    return hash(self._key())

  def __eq__(self, other):
    return isinstance(other, TreeShardings) and self._key() == other._key()


def learner_shardings(model_config: transformer.ModelConfig, mesh: jax.sharding.Mesh,
                      optimizer: Any, rules: Optional[Rules] = None, *,
                      with_reference: bool = True
                      ) -> tuple[ShardedModel, learner.Shardings]:
  """The learner's jit shardings on `mesh`, from `jax.eval_shape` of its state.

  Args:
    model_config: the model shape.
    mesh: from `make_mesh`.
    optimizer: the learner's optax transformation (`learner.make_optimizer`);
      any optimizer with the same state structure shares these shardings.
    rules: logical axis rules; default `DEFAULT_RULES`.
    with_reference: the step takes reference parameters (KL term on); when
      False the step's `ref_params` argument may be None.

  Returns:
    `(sharded_model, TreeShardings)` (a hashable `learner.Shardings`):
    `TrainState` parameters and
    parameter-shaped optimizer moments sharded by the rules, counters and
    PRNG key replicated; reference parameters like the parameters (or a
    replicated prefix that also fits None, without reference); batches
    `None`: the step takes the batch's own sharding, so place batches with
    `put_batch` / `shard_batch`, which split rows as far as their count
    allows (one compilation per batch shape, as before).
  """
  sm = shard_model(model_config, mesh, rules)
  plain = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), sm.abstract_params)
  abstract_state = jax.eval_shape(lambda p: learner.init_state(p, optimizer, 0), plain)
  return sm, TreeShardings(state=tree_shardings_like(abstract_state, sm),
                           batch=None,
                           ref_params=(sm.param_shardings if with_reference
                                       else NamedSharding(mesh, P())))


# ---------------------------------------------------------------- batches and caches


def batch_sharding(mesh: jax.sharding.Mesh, shape: Sequence[int],
                   rules: Optional[Rules] = None) -> NamedSharding:
  """Sharding of a `[rows, ...]` batch array: rows split by the `batch` rule.

  Only dimension 0 is split (over the mesh axes of the `batch` rule that
  divide it); other dimensions are whole; a scalar is replicated.
  """
  shape = tuple(shape)
  if not shape:
    return NamedSharding(mesh, P())
  logical = ("batch",) + (None,) * (len(shape) - 1)
  return NamedSharding(mesh, logical_to_spec(logical, shape, mesh, rules))


def put_batch(batch: Any, mesh: jax.sharding.Mesh, rules: Optional[Rules] = None) -> Any:
  """Places a whole host batch on the mesh, rows split by the `batch` rule.

  Every process passes the same global batch (as when all processes run the
  same host loop); see `shard_batch` for process-local rows. Rows are split
  over the batch mesh axes that divide their count (`batch_sharding`);
  0-d leaves are replicated.

  Args:
    batch: pytree of NumPy / JAX arrays `[rows, ...]`.
    mesh: the mesh.
    rules: logical axis rules; default `DEFAULT_RULES`.

  Returns:
    The same pytree of global `jax.Array`s.
  """
  return jax.tree.map(
      lambda x: jax.device_put(x, batch_sharding(mesh, np.shape(x), rules)), batch)


def shard_batch(batch: Any, mesh: jax.sharding.Mesh, rules: Optional[Rules] = None) -> Any:
  """Turns each process's host batch into global arrays sharded over the mesh.

  Every leaf is this process's rows: `[n_local, ...]`, the same `n_local` in
  every process; the global array has `n = n_local * process_count()` rows
  split by the `batch` rule (`batch_sharding`). When that split gives each
  process exactly `n_local` rows of its own, they are this process's rows
  (`jax.make_array_from_process_local_data`; which global rows they are
  follows the device order, and `local_rows` reads them back). Otherwise
  (e.g. rows not split across processes, as on a `tensor`-only mesh) the
  rows of all processes are gathered first, in process order. With one
  process it is `jax.device_put` with `batch_sharding`. Leaves that are 0-d
  are replicated (each process must pass the same value).

  Args:
    batch: pytree of numpy / JAX arrays (process-local rows).
    mesh: the mesh.
    rules: logical axis rules; default `DEFAULT_RULES`.

  Returns:
    The same pytree of global `jax.Array`s.

  Raises:
    ValueError: leaves whose row counts differ between processes (raised
      by JAX in `process_allgather`, naming the shapes).
  """
  n_proc = jax.process_count()

  def put(x):
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.make_array_from_process_local_data(NamedSharding(mesh, P()), x, x.shape)
    global_shape = (x.shape[0] * n_proc,) + x.shape[1:]
    sharding = batch_sharding(mesh, global_shape, rules)
    if n_proc == 1 or _own_row_blocks(sharding, global_shape) is not None:
      return jax.make_array_from_process_local_data(sharding, x, global_shape)
    everything = np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.make_array_from_process_local_data(sharding, everything, global_shape)

  return jax.tree.map(put, batch)


def _own_row_blocks(sharding: jax.sharding.Sharding, global_shape: Sequence[int]
                    ) -> Optional[list[tuple[int, int]]]:
  """This process's row blocks `[(start, stop), ...]` (sorted) when `sharding` gives every
  process `rows / process_count` rows of its own, disjoint from the others'; else None."""
  n_proc = jax.process_count()
  rows = int(global_shape[0])
  blocks: dict[int, set] = {}
  for device, index in sharding.devices_indices_map(tuple(global_shape)).items():
    start, stop, _ = index[0].indices(rows) if index else (0, rows, 1)
    blocks.setdefault(device.process_index, set()).add((start, stop))
  counts = {p: sum(b - a for a, b in bs) for p, bs in blocks.items()}
  covered = set()
  for bs in blocks.values():
    for a, b in bs:
      covered.update(range(a, b))
  if (len(blocks) != n_proc or rows % n_proc or len(covered) != rows
      or any(c != rows // n_proc for c in counts.values())):
    return None
  return sorted(blocks[jax.process_index()])


def local_rows(tree: Any) -> Any:
  """This process's rows of global row-split arrays, as NumPy: the inverse of `shard_batch`.

  For `[n, ...]` arrays placed by `shard_batch` (or produced by a `jit` with the same row
  sharding) this gives back the `[n / process_count, ...]` rows the process contributed, in
  the order it contributed them. With one process it is `jax.device_get`; host arrays are
  returned as they are.

  Raises:
    ValueError: a leaf whose row count is not a multiple of the process count.
  """
  n_proc = jax.process_count()

  def get(x):
    if not isinstance(x, jax.Array) or n_proc == 1 or x.ndim == 0:
      return fetch(x)
    rows = x.shape[0]
    if rows % n_proc:
      raise ValueError(f"rows ({rows}) must be a multiple of the process count {n_proc}")
    blocks = _own_row_blocks(x.sharding, x.shape)
    if blocks is None:  # `shard_batch` gathered the rows in process order
      n, p = rows // n_proc, jax.process_index()
      return fetch(x)[p * n:(p + 1) * n]
    pieces = {}
    for shard in x.addressable_shards:
      start, stop, _ = shard.index[0].indices(rows)
      if all(s.indices(d)[:2] == (0, d) for s, d in zip(shard.index[1:], x.shape[1:])):
        pieces.setdefault((start, stop), shard.data)
    if all(b in pieces for b in blocks):
      return np.concatenate([np.asarray(pieces[b]) for b in blocks])
    everything = fetch(x)  # rows split further along other dimensions
    return np.concatenate([everything[a:b] for a, b in blocks])

  return jax.tree.map(get, tree)


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


def kv_cache_shardings(model_config: transformer.ModelConfig, mesh: MeshLike,
                       batch_size: int, max_len: int,
                       rules: Optional[Rules] = None) -> transformer.KVCache:
  """Shardings of `transformer.init_cache(model_config, batch_size, max_len)`.

  Keys and values are split by rows (`batch`) and key/value heads
  (`kv_heads`), slots and head width whole; `valid` `[N, S]` by rows;
  `index` is replicated.

  Returns:
    A `KVCache` whose leaves are `NamedSharding`s.
  """
  abstract = jax.eval_shape(lambda: transformer.init_cache(model_config, batch_size, max_len))
  axes = _kv_cache_axes(model_config)
  kv = NamedSharding(mesh, logical_to_spec(axes, abstract.k[0].shape, mesh, rules))
  valid = NamedSharding(mesh, logical_to_spec(("batch", "cache_length"),
                                              abstract.valid.shape, mesh, rules))
  layers = len(abstract.k)
  return transformer.KVCache(k=(kv,) * layers, v=(kv,) * layers, valid=valid,
                             index=NamedSharding(mesh, P()))


def sampler_shardings(model_config: transformer.ModelConfig, mesh: jax.sharding.Mesh,
                      rules: Optional[Rules] = None) -> sampler_lib.Shardings:
  """The sampler's shardings on `mesh` (`sampler.sample(..., shardings=)`).

  Parameters as the learner holds them (`shard_model`); prompt rows and outputs split by the
  `batch` rule as far as the global row count allows (`batch_sharding`); the KV cache by
  `kv_cache_shardings` (rows over the batch axes, key/value heads over `tensor` where they
  divide, slots and head width whole); host rows placed with `shard_batch` (process-local
  rows in a multi-process run). Cached: the same arguments give the same object, so the
  sampler's compiled programs are reused.

  Raises:
    ValueError: `model_config` is not a `ModelConfig`, or bad `rules`.
  """
  return _sampler_shardings(model_config, mesh, canonical_rules(rules))


@functools.lru_cache(maxsize=8)
def _sampler_shardings(model_config, mesh, rules) -> sampler_lib.Shardings:
  sm = shard_model(model_config, mesh, rules)
  rows = functools.lru_cache(maxsize=None)(
      lambda n: NamedSharding(mesh, logical_to_spec(("batch",), (n,), mesh, rules)))
  cache = functools.lru_cache(maxsize=None)(
      lambda n, slots: kv_cache_shardings(model_config, mesh, n, slots, rules))
  return sampler_lib.Shardings(params=sm.param_shardings, rows=rows, cache=cache,
                               put_rows=lambda tree: shard_batch(tree, mesh, rules))


# ---------------------------------------------------------------- jitted functions


def jit_sequence_logprobs(sharded: ShardedModel, *, temperature=1.0, top_k: int = 0,
                          top_p=1.0) -> Callable[..., jax.Array]:
  """`transformer.sequence_logprobs` jitted over the mesh.

  Returns:
    `fn(params, tokens [N, T], positions [N, T], segment_mask [N, T]) ->
    [N, T] f32`, parameters in `sharded.param_shardings`, rows split over the
    batch axes; the output is row-sharded like the inputs.
  """
  mesh, rules = sharded.mesh, sharded.rules
  rows = row_sharding(mesh, rules)

  def fn(params, tokens, positions, segment_mask):
    return transformer.sequence_logprobs(
        sharded.graphdef, params, tokens, positions, segment_mask,
        temperature=temperature, top_k=top_k, top_p=top_p)

  jitted = jax.jit(fn, in_shardings=(sharded.param_shardings, rows, rows, rows),
                   out_shardings=rows)

  def call(params, tokens, positions, segment_mask):
    n = tokens.shape[0]
    if n % _batch_devices(mesh, rules):
      raise ValueError(f"tokens rows ({n}) must be a multiple of the batch mesh axes' size "
                       f"{_batch_devices(mesh, rules)}")
    return jitted(params, tokens, positions, segment_mask)

  call.jitted = jitted
  return call


def _batch_entry(mesh, rules):
  axes = _normalise_rules(rules).get("batch", ())
  axes = tuple(a for a in axes if a in mesh.shape)
  return None if not axes else axes[0] if len(axes) == 1 else axes


def _batch_devices(mesh, rules) -> int:
  axes = _normalise_rules(rules).get("batch", ())
  return int(np.prod([mesh.shape[a] for a in axes if a in mesh.shape]))


# ---------------------------------------------------------------- multi-process


def _env_flag(name: str) -> Optional[bool]:
  value = os.environ.get(name)
  if value is None or value == "":
    return None
  if value.lower() in ("1", "true", "yes", "on"):
    return True
  if value.lower() in ("0", "false", "no", "off"):
    return False
  raise ValueError(f"environment variable {name} must be a boolean (1/0/true/false), "
                   f"got {value!r}")


def _env_int(name: str) -> Optional[int]:
  value = os.environ.get(name)
  if value is None or value == "":
    return None
  try:
    return int(value)
  except ValueError as e:
    raise ValueError(f"environment variable {name} must be an int, got {value!r}") from e


def initialize_distributed(
    enabled: Union[str, bool, None] = "auto",
    coordinator_address: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    timeout_s: int = 300,
) -> bool:
  """Starts JAX's multi-controller runtime when asked; call before any JAX use.

  With `enabled="auto"` (or None) the run is multi-process when the
  environment says so: `AGENTIC_GRPO_DISTRIBUTED=1`, or
  `JAX_COORDINATOR_ADDRESS` set. Missing arguments come from the environment
  (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`), else
  from JAX's cluster auto-detection (Cloud TPU pods, SLURM, ...), which is
  what `launch/tpu_pod.sh` relies on. Calling it again after a successful
  start is a no-op.

  Args:
    enabled: `"auto"`/None, `"on"`/True or `"off"`/False.
    coordinator_address: `host:port` of process 0's coordinator service.
    num_processes: total processes.
    process_id: this process, in `[0, num_processes)`.
    timeout_s: seconds to wait for every process to connect.

  Returns:
    True when the runtime is (now) initialised, False for a single-process run.

  Raises:
    ValueError: unknown `enabled`, malformed environment values, or a
      `process_id` outside `[0, num_processes)`.
  """
  if isinstance(enabled, str):
    if enabled not in ("auto", "on", "off"):
      raise ValueError(f"enabled must be 'auto', 'on', 'off' or a bool, got {enabled!r}")
    enabled = {"auto": None, "on": True, "off": False}[enabled]
  elif enabled is not None and not isinstance(enabled, bool):
    raise ValueError(f"enabled must be 'auto', 'on', 'off' or a bool, got {enabled!r}")
  if enabled is None:
    enabled = _env_flag(ENV_DISTRIBUTED)
    if enabled is None:
      enabled = bool(os.environ.get(ENV_COORDINATOR))
  if not enabled:
    return False
  if jax.distributed.is_initialized():
    return True
  coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
  num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
  process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
  if num_processes is not None and num_processes <= 0:
    raise ValueError(f"num_processes must be positive, got {num_processes}")
  if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
  logging.info("jax.distributed.initialize(coordinator_address=%s, num_processes=%s, "
               "process_id=%s)", coordinator_address, num_processes, process_id)
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             initialization_timeout=int(timeout_s))
  logging.info("process %d of %d, %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  return True


def process_slice(n: int, process_index: Optional[int] = None,
                  process_count: Optional[int] = None) -> slice:
  """This process's contiguous share of `n` items (tasks, episodes).

  Shares differ by at most one item; together they cover `range(n)` exactly.

  Raises:
    ValueError: negative `n` or a process index outside the count.
  """
  p = jax.process_index() if process_index is None else process_index
  c = jax.process_count() if process_count is None else process_count
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  if c <= 0 or not 0 <= p < c:
    raise ValueError(f"process_index must be in [0, process_count={c}), got {p}")
  base, extra = divmod(n, c)
  start = p * base + min(p, extra)
  return slice(start, start + base + (p < extra))


def fetch(tree: Any) -> Any:
  """Host (NumPy) copy of a pytree of global arrays, on every process.

  Arrays that span other processes' devices are gathered
  (`multihost_utils.process_allgather`); others are `jax.device_get`.
  """
  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(get, tree)


def is_primary() -> bool:
  """True in the process that writes logs and metrics (process 0)."""
  return jax.process_index() == 0


def host_allgather(x: Any) -> np.ndarray:
  """Every process's value of a host array, stacked: `[process_count, *x.shape]`.

  A collective (`multihost_utils.process_allgather`): every process must call it at the same
  point of the program with the same shape and dtype. With one process it is `x[None]`, with
  no device work. Use it for the small agreements a multi-process run needs (how many rows are
  ready, which length bucket, whether to stop).
  """
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x[None]
  return np.asarray(multihost_utils.process_allgather(x, tiled=False)).reshape(
      (jax.process_count(),) + x.shape)


def _json_scalar(x):
  if isinstance(x, (np.generic, np.ndarray)) and np.ndim(x) == 0:
    return x.item()
  raise TypeError(f"{type(x).__name__} is not JSON-serialisable")


def allgather_json(obj: Any) -> list[Any]:
  """Every process's JSON-serialisable `obj`, in process order (a collective).

  For host-side metrics and counters whose keys may differ between processes. The encoded
  bytes are padded to a power of two, so that few gather programs are compiled.

  Raises:
    TypeError: `obj` is not JSON-serialisable (NumPy scalars are accepted).
  """
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj, sort_keys=True, default=_json_scalar).encode(), np.uint8)
  lengths = host_allgather(np.int64(data.size))
  width = 1 << max(6, int(lengths.max() - 1).bit_length())
  padded = np.zeros((width,), np.uint8)
  padded[:data.size] = data
  everything = host_allgather(padded)
  return [json.loads(bytes(everything[p, :int(n)]).decode()) for p, n in enumerate(lengths)]
