"""Fitting a checkpoint's saved array tree to today's tree (checkpoints of earlier versions).

A checkpoint holds the pytree that its version of the code saved. When today's tree has gained
a field since (`TrainState.master`, the float32 master copy of low-precision parameters, came
after the first checkpoints), Orbax refuses to restore into today's tree ("tree structures do
not match"). `plan` compares the saved tree (Orbax's metadata of the item: the key path, shape
and dtype of every saved leaf) with today's abstract tree, leaf by leaf by key path:

* a leaf saved with today's shape is read from disk, cast by Orbax to today's dtype (a cast is
  noted: e.g. the bfloat16 AdamW moments of a checkpoint written before the master, read into
  today's float32 moments, exactly);
* a leaf that today's tree has and the checkpoint lacks is derived when a `Derivation` covers
  it (named by the key of the field that was added; e.g. `master` from its sibling `params`);
* anything else cannot be made to fit: a missing leaf no derivation covers, a saved leaf
  today's tree lacks, a leaf of another shape. `plan` raises `LayoutError` naming each path,
  before anything is read.

A checkpoint of today's layout (same paths, `None` nodes, shapes and dtypes) is restored into
today's tree as it is (`Plan.same`): nothing is derived or converted. Otherwise the item is read
by the saved tree's own structure (`Plan.item`: nested dicts and lists, each leaf with today's
dtype and sharding) and today's tree is assembled from it (`Plan.assemble`).

Paths are tuples of key strings as Orbax names them (`('state', 'opt_state', 'inner_state', '1',
'0', 'mu', 'embed', 'value')`), written joined by dots in messages. `None` nodes (the `master`
of float32 parameters) hold no data: they count as absent on both sides.
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

Path = tuple[str, ...]
_SHOWN = 6  # paths named per kind of mismatch in a `LayoutError`


@dataclasses.dataclass(frozen=True)
class Derivation:
  """A field that checkpoints of earlier versions lack, and how a restore rebuilds it.

  Attributes:
    field: the key of the added node (a dataclass field or dict key), e.g. `master`. It matches
      at any depth: every missing leaf whose path passes through a key `field` is covered.
    note: what the field is and since when it exists (logged when it is derived).
    source: the key of a sibling node with the same subtree (e.g. `params`): each missing leaf
      is the sibling's leaf at the same relative path, cast to the missing leaf's dtype.
    constant: else, every missing leaf is this value in its shape and dtype (e.g. 0 for a
      counter that started after the checkpoint was written).
  """
  field: str
  note: str
  source: Optional[str] = None
  constant: Union[int, float, bool, None] = None

  def __post_init__(self):
    if (self.source is None) == (self.constant is None):
      raise ValueError(f"Derivation {self.field!r}: give exactly one of source and constant, "
                       f"got source={self.source!r}, constant={self.constant!r}")


def dotted(path: Path) -> str:
  """`('state', 'master', 'embed')` -> `state.master.embed`, as messages write paths."""
  return ".".join(path) if path else "<root>"


class LayoutError(ValueError):
  """A checkpoint's saved tree cannot be made to fit today's tree.

  Attributes:
    missing: paths today's tree has, the checkpoint lacks, and no derivation covers.
    extra: paths the checkpoint has and today's tree lacks.
    reshaped: `(path, saved shape, today's shape)` of leaves of another shape.
  """

  def __init__(self, where: str, missing: dict[Path, Any], extra: dict[Path, Any],
               reshaped: list[tuple[Path, tuple, tuple]], *, today: Sequence[Path] = (),
               saved: Sequence[Path] = ()):
    self.missing, self.extra, self.reshaped = sorted(missing), sorted(extra), reshaped
    lines = [f"{where} does not fit today's tree (written by another version of the code, or "
             f"for another config):"]
    if missing:
      lines.append("  missing from the checkpoint, with no derivation: "
                   + _listing(_collapse(missing, today), missing))
    if extra:
      lines.append("  in the checkpoint, not in today's tree: "
                   + _listing(_collapse(extra, saved), extra))
    if reshaped:
      shown = [f"{dotted(p)} saved {list(a)}, today {list(b)}" for p, a, b in reshaped[:_SHOWN]]
      more = len(reshaped) - len(shown)
      lines.append("  another shape: " + "; ".join(shown) + (f"; and {more} more" if more else ""))
    lines.append("Nothing was restored, moved or deleted.")
    super().__init__("\n".join(lines))


def _collapse(paths: dict[Path, Any], universe: Sequence[Path]) -> list[tuple[Path, int]]:
  """`paths` as the fewest subtrees: `(node, leaves under it)`, each node the shortest prefix
  whose every leaf in `universe` is in `paths`."""
  total, chosen = collections.Counter(), collections.Counter()
  for p in universe:
    total.update(p[:i] for i in range(1, len(p) + 1))
  for p in paths:
    chosen.update(p[:i] for i in range(1, len(p) + 1))
  nodes: dict[Path, int] = {}
  for p in sorted(paths):
    node = next((p[:i] for i in range(1, len(p) + 1) if chosen[p[:i]] == total[p[:i]]), p)
    nodes[node] = chosen[node]
  return sorted(nodes.items())


def _listing(nodes: list[tuple[Path, int]], leaves: dict[Path, Any]) -> str:
  shown = []
  for node, count in nodes[:_SHOWN]:
    leaf = leaves.get(node)
    if leaf is not None:
      shown.append(f"{dotted(node)} {list(leaf.shape)} {np.dtype(leaf.dtype).name}")
    else:
      shown.append(f"{dotted(node)} ({count} arrays)")
  more = len(nodes) - len(shown)
  return "; ".join(shown) + (f"; and {more} more" if more else "")


def _key(entry) -> str:
  """One key of a jax key path as Orbax names it (dict key, attribute, index)."""
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  raise TypeError(f"unknown pytree key {entry!r}")


def key_path(path) -> Path:
  """A jax key path (`tree_util.tree_flatten_with_path`) as a `Path` of Orbax's key names."""
  return tuple(_key(k) for k in path)


def _flat(tree) -> dict[Path, Any]:
  """`{path: leaf}` with `None` nodes as `None` leaves."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
  return {key_path(path): leaf for path, leaf in leaves}


def saved_tree(item_dir: epath.PathLike) -> Any:
  """The saved tree of an Orbax `StandardSave` item directory: nested dicts and lists whose
  leaves have `shape` and `dtype` (`None` for `None` nodes). Reads only metadata."""
  return ocp.StandardCheckpointHandler().metadata(epath.Path(item_dir)).tree


@dataclasses.dataclass(frozen=True)
class Plan:
  """How to read a saved item into today's tree (from `plan`).

  Attributes:
    same: the saved tree is today's: restore `item` (today's abstract tree) as it is.
    item: the restore target: today's abstract tree when `same`, else the saved tree's
      structure with today's dtype and sharding on every leaf.
    abstract: today's tree, `jax.ShapeDtypeStruct` leaves.
    derived: `{path: (derivation, source path or None)}` of the leaves to derive.
    notes: what is derived or converted, one line each (empty when `same`).
  """
  same: bool
  item: Any
  abstract: Any
  derived: dict[Path, tuple[Derivation, Optional[Path]]]
  notes: list[str]

  def assemble(self, loaded: Any, only: Optional[Callable[[Path], bool]] = None) -> Any:
    """Today's tree from `loaded` (what Orbax restored into `item`), derived leaves added.

    With `only` (a path predicate), a leaf it rejects is `orbax.checkpoint.PLACEHOLDER` (not
    read, not derived).
    """
    if self.same:
      return loaded
    values = {p: v for p, v in _flat(loaded).items() if v is not None}

    def leaf(path, target):
      p = key_path(path)
      if only is not None and not only(p):
        return ocp.PLACEHOLDER
      if p in values:
        return values[p]
      derivation, source = self.derived[p]
      if source is not None:
        return _placed(lambda x: x.astype(target.dtype), target, values[source])
      return _placed(lambda: jnp.full(target.shape, derivation.constant, target.dtype), target)

    return jax.tree_util.tree_map_with_path(leaf, self.abstract)


def _placed(fn, target, *args):
  """`fn(*args)` in `target`'s sharding (one global array in a multi-process run)."""
  sharding = getattr(target, "sharding", None)
  if sharding is None:
    return np.asarray(fn(*args))
  return jax.jit(fn, out_shardings=sharding)(*args)


def plan(saved: Any, abstract: Any, derivations: Sequence[Derivation] = (), *,
         where: str = "the checkpoint") -> Plan:
  """Compares a saved tree (`saved_tree`) with today's `abstract` tree.

  Args:
    saved: the saved tree's metadata (leaves with `shape`, `dtype`; `None` nodes).
    abstract: today's tree: arrays or `jax.ShapeDtypeStruct`s (with today's shardings).
    derivations: the fields today's tree may have that older checkpoints lack.
    where: names the checkpoint in messages.

  Returns:
    The `Plan`.

  Raises:
    LayoutError: the saved tree cannot be made to fit (see the module docstring).
  """
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract)
  have, want = _flat(saved), _flat(abstract)
  if have.keys() == want.keys() and all(
      v is None or (tuple(v.shape) == tuple(want[p].shape) and np.dtype(v.dtype) ==
                    np.dtype(want[p].dtype)) for p, v in have.items()):
    return Plan(True, abstract, abstract, {}, [])
  have = {p: v for p, v in have.items() if v is not None}
  want = {p: v for p, v in want.items() if v is not None}
  extra = {p: v for p, v in have.items() if p not in want}
  reshaped = [(p, tuple(v.shape), tuple(want[p].shape)) for p, v in sorted(have.items())
              if p in want and tuple(v.shape) != tuple(want[p].shape)]
  derived, missing = {}, {}
  for p, target in want.items():
    if p not in have:
      found = _derivation(p, have, want, derivations)
      if found is None:
        missing[p] = target
      else:
        derived[p] = found
  if missing or extra or reshaped:
    raise LayoutError(where, missing, extra, reshaped, today=list(want), saved=list(have))
  return Plan(False, _fill(saved, want), abstract, derived, _notes(have, want, derived))


def _fill(saved: Any, want: dict[Path, Any]) -> Any:
  """The saved tree's structure with today's `jax.ShapeDtypeStruct` at each leaf."""
  def leaf(path, v):
    return None if v is None else want[tuple(_key(k) for k in path)]
  return jax.tree_util.tree_map_with_path(leaf, saved, is_leaf=lambda x: x is None)


def _derivation(path: Path, have, want, derivations) -> Optional[tuple[Derivation,
                                                                       Optional[Path]]]:
  """The derivation covering missing leaf `path` and its source path, or None."""
  for i, key in enumerate(path):
    for d in derivations:
      if key != d.field:
        continue
      if d.source is None:
        return d, None
      source = path[:i] + (d.source,) + path[i + 1:]
      if source in have:  # (a source of another shape is reported as reshaped)
        return d, source
  return None


def _notes(have, want, derived) -> list[str]:
  """One line per derived field (by node) and per kind of dtype cast."""
  notes = []
  by_node: dict[Path, list] = {}
  for p, (d, source) in derived.items():
    i = p.index(d.field)
    by_node.setdefault(p[:i + 1], [d, source and source[:i + 1], 0])[2] += 1
  for node, (d, source, count) in sorted(by_node.items()):
    how = f"from {dotted(source)}" if source else f"as {d.constant!r}"
    notes.append(f"derived {dotted(node)} ({count} arrays) {how}: {d.note}")
  casts: dict[tuple[str, str], list[Path]] = {}
  for p, v in sorted(have.items()):
    a, b = np.dtype(v.dtype).name, np.dtype(want[p].dtype).name
    if a != b:
      casts.setdefault((a, b), []).append(p)
  for (a, b), paths in sorted(casts.items()):
    notes.append(f"read {len(paths)} arrays saved as {a} as {b} (e.g. {dotted(paths[0])})")
  return notes
