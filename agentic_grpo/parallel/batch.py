"""Batch placement: host rows in, global row-split arrays out, and back.

A batch is a pytree of `[rows, ...]` arrays. Its rows are split over the mesh
axes of the `batch` logical axis (`data` and `fsdp` by default) as far as
their count allows, other dimensions whole, 0-d leaves replicated
(`batch_sharding`). `put_batch` places a global host batch that every process
holds; `shard_batch` builds global arrays from each process's own rows
(`jax.make_array_from_process_local_data`) and `local_rows` reads a process's
rows back.
"""

from collections.abc import Sequence
from typing import Any, Optional

import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from agentic_grpo.parallel import collectives
from agentic_grpo.parallel import mesh as mesh_lib
from agentic_grpo.parallel import peer_watch


def _batch_axes(mesh: mesh_lib.MeshLike, rules: Optional[mesh_lib.Rules]) -> tuple[str, ...]:
  return tuple(a for a in mesh_lib.logical_mesh_axes("batch", rules) if a in mesh.shape)


def row_sharding(mesh: jax.sharding.Mesh,
                 rules: Optional[mesh_lib.Rules] = None) -> NamedSharding:
  """`P(batch axes)`: dimension 0 split over the `batch` rule's mesh axes.

  As a `jit` sharding prefix it applies to every leaf of a batch dict whose
  leaves all have rows as dimension 0 (rows must divide evenly: see
  `batch_devices`).
  """
  axes = _batch_axes(mesh, rules)
  return NamedSharding(mesh, P(None if not axes else axes[0] if len(axes) == 1 else axes))


def batch_devices(mesh: mesh_lib.MeshLike, rules: Optional[mesh_lib.Rules] = None) -> int:
  """How many ways batch rows are split (the product of the `batch` rule's mesh axes)."""
  return int(np.prod([mesh.shape[a] for a in _batch_axes(mesh, rules)]))


def batch_sharding(mesh: mesh_lib.MeshLike, shape: Sequence[int],
                   rules: Optional[mesh_lib.Rules] = None) -> NamedSharding:
  """Sharding of a `[rows, ...]` batch array: rows split by the `batch` rule.

  Only dimension 0 is split (over the mesh axes of the `batch` rule that
  divide it); other dimensions are whole; a scalar is replicated.
  """
  shape = tuple(shape)
  if not shape:
    return NamedSharding(mesh, P())
  logical = ("batch",) + (None,) * (len(shape) - 1)
  return NamedSharding(mesh, mesh_lib.logical_to_spec(logical, shape, mesh, rules))


def put_batch(batch: Any, mesh: jax.sharding.Mesh,
              rules: Optional[mesh_lib.Rules] = None) -> Any:
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


def shard_batch(batch: Any, mesh: jax.sharding.Mesh,
                rules: Optional[mesh_lib.Rules] = None) -> Any:
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
      by JAX in `process_allgather`, naming the shapes; with a collective
      timeout the process ends instead, see `peer_watch.peer_watchdog`).
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
    with peer_watch.peer_watchdog("shard_batch"):
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
  returned as they are. With several, every process must call it at the same point (it waits
  on programs that span processes, under `peer_watch.peer_watchdog`).

  Raises:
    ValueError: a leaf whose row count is not a multiple of the process count.
  """
  n_proc = jax.process_count()

  def get(x):
    if not isinstance(x, jax.Array) or n_proc == 1 or x.ndim == 0:
      return collectives.fetch(x)
    rows = x.shape[0]
    if rows % n_proc:
      raise ValueError(f"rows ({rows}) must be a multiple of the process count {n_proc}")
    blocks = _own_row_blocks(x.sharding, x.shape)
    if blocks is None:  # `shard_batch` gathered the rows in process order
      n, p = rows // n_proc, jax.process_index()
      return collectives.fetch(x)[p * n:(p + 1) * n]
    pieces = {}
    for shard in x.addressable_shards:
      start, stop, _ = shard.index[0].indices(rows)
      if all(s.indices(d)[:2] == (0, d) for s, d in zip(shard.index[1:], x.shape[1:])):
        pieces.setdefault((start, stop), shard.data)
    if all(b in pieces for b in blocks):
      return np.concatenate([np.asarray(pieces[b]) for b in blocks])
    everything = collectives.fetch(x)  # rows split further along other dimensions
    return np.concatenate([everything[a:b] for a, b in blocks])

  with peer_watch.peer_watchdog("local_rows"):  # waits on programs that span processes
    return jax.tree.map(get, tree)
