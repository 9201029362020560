"""Device meshes and logical axis rules: which mesh axes split which array dimension.

Every device computation of this package runs under `jax.jit` with explicit
`NamedSharding`s over one `jax.sharding.Mesh` with three axes:

* `data`   — pure data parallelism: batch rows split, parameters replicated;
* `fsdp`   — fully sharded data parallelism (ZeRO-3, Rajbhandari et al., 2020):
  batch rows split *and* parameters / optimizer state split along their
  `embed` dimension, gathered by XLA where a layer needs them;
* `tensor` — tensor (model) parallelism (Shoeybi et al., 2019, "Megatron-LM"):
  attention heads, MLP hidden units and the vocabulary split.

Arrays name their dimensions with *logical axes* (MaxText-style): model
parameters `vocab`, `embed`, `mlp`, `heads`, `kv_heads`, `head_dim` (see
`models/transformer.py`), batches and the KV cache `batch`, `length` and
`cache_length`. A table of *logical axis rules* (`DEFAULT_RULES`, overridable
in the config) maps each logical axis to zero, one or several mesh axes.
`logical_to_spec` applies the rules to one array, with two safety rules: a
mesh axis is used at most once per array, and a dimension whose size the mesh
axes do not divide keeps the longest prefix of those axes that does divide it
(possibly none: replicated), so e.g. 4 key/value heads on a tensor axis of 8
are replicated rather than rejected. `tree_shardings` does the same for a
whole (abstract) pytree whose `nnx.Variable`s carry `out_sharding` metadata.

Axis types. The mesh uses `jax.sharding.AxisType.Auto` on every axis (where
`jax.make_mesh` would default to `Explicit`). With Auto axes the shardings
given at the `jit` boundary (parameters, optimizer state, batch, KV cache)
are the contract, and the XLA partitioner (Shardy/GSPMD) propagates shardings
through the model and inserts the collectives. Explicit axes
("sharding in types") would make every contraction over a sharded dimension
in the model state its output sharding or raise `ShardingTypeError`; the
model code stays mesh-agnostic instead, and the numerical equality of every
mesh with one device is what the tests check.

This module knows nothing of any model: it maps names to mesh axes.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from absl import logging
from flax import nnx
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

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


def logical_mesh_axes(name: str, rules: Optional[Rules] = None) -> tuple[str, ...]:
  """The mesh axes the logical axis `name` maps to (`()`: replicated or not in the rules).

  Raises:
    ValueError: malformed rules (see `canonical_rules`).
  """
  return _normalise_rules(rules).get(name, ())


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


# ---------------------------------------------------------------- pytrees


def _logical_axes_of(variable: nnx.Variable) -> Optional[tuple]:
  meta = variable.get_metadata()
  axes = meta.get("out_sharding")
  return tuple(axes) if axes else None


def _strip_value_key(path):
  return tuple(k for k in path if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))


def _reference_index(shardings, abstract) -> dict:
  """{path without `.value`: (sharding, shape)} of a reference tree."""
  s_leaves = jax.tree_util.tree_flatten_with_path(shardings)[0]
  a_leaves = jax.tree.leaves(abstract)
  if len(s_leaves) != len(a_leaves):
    raise ValueError("reference shardings and abstract tree differ in structure")
  return {_strip_value_key(path): (s, tuple(a.shape))
          for (path, s), a in zip(s_leaves, a_leaves)}


def tree_shardings(
    abstract_tree: Any,
    mesh: jax.sharding.Mesh,
    rules: Optional[Rules] = None,
    *,
    reference: Optional[tuple[Any, Any]] = None,
) -> Any:
  """`NamedSharding`s for every array of a (typically abstract) pytree.

  An `nnx.Variable` with `out_sharding` metadata (model parameters, and the
  parameter-shaped moments optax builds from them) is sharded by its logical
  axes through the rules. Any other array takes the sharding of a `reference`
  leaf of the same shape whose tree path (without `.value`) is a suffix of its
  own, so that states of plain arrays built from parameters (e.g.
  `optax.adam(...).init(nnx.to_pure_dict(params))`) follow the parameters;
  the rest (step counters, scalars, RNG keys) is replicated.

  Args:
    abstract_tree: pytree of arrays or `jax.ShapeDtypeStruct`s, possibly
      inside `nnx.Variable`s (e.g. from `jax.eval_shape`).
    mesh: the mesh.
    rules: logical axis rules; default `DEFAULT_RULES`.
    reference: optional `(shardings, abstract)` of a reference tree (e.g. a
      model's parameter shardings and abstract parameters), same structure.

  Returns:
    A pytree of the same structure with `NamedSharding` leaves (Variables
    kept as Variables holding a `NamedSharding`), usable as `in_shardings` /
    `out_shardings` of `jax.jit` and with `jax.device_put`.

  Raises:
    ValueError: from `logical_to_spec` (unknown logical axis, rank mismatch),
      or a `reference` whose two trees differ in structure.
  """
  ref_index = _reference_index(*reference) if reference is not None else {}

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
