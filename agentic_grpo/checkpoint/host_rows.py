"""Per-process host state in a multi-process checkpoint: one uint8 row per process.

The learner state is one set of global arrays, but host state is per process (each process has
its own replay, in-flight episodes and data position). Orbax saves global arrays, so each
process's host arrays and meta are encoded into one byte row (`encode_row`), the rows are padded
to a common width and form a global `[process_count, width]` uint8 array sharded one row per
process (`global_rows`), and each process writes and reads back only its own row (`own_row`,
`decode_row`).

A row is an 8-byte length (uint64, native byte order) followed by that many bytes of an `.npz`
holding the host arrays and, under `META_ENTRY`, the meta as UTF-8 JSON; the rest of the row is
zero padding. The common width is the smallest power of two of at least 1 KiB that holds the
longest row.
"""

import io
import json
from typing import Any

import jax
import numpy as np

from agentic_grpo import parallel

META_ENTRY = "_meta"  # the per-process meta inside a process's row
_LENGTH_BYTES = 8
_MIN_WIDTH_BITS = 10  # rows are at least 1 KiB wide


def row_sharding() -> jax.sharding.NamedSharding:
  """`[process_count, ...]` arrays with row `p` on (all of) process `p`'s devices.

  Raises:
    ValueError: processes hold different numbers of devices.
  """
  count = parallel.process_count()
  devices = [[d for d in jax.devices() if d.process_index == p] for p in range(count)]
  if len({len(d) for d in devices}) != 1:
    raise ValueError(f"processes hold different numbers of devices "
                     f"{[len(d) for d in devices]}; per-process host state needs equal counts")
  mesh = jax.sharding.Mesh(np.array(devices), ("process", "device"))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("process"))


def encode_row(flat: dict[str, np.ndarray], meta: dict[str, Any]) -> np.ndarray:
  """One process's host arrays and meta as bytes.

  Args:
    flat: `{name: numpy array}`; `META_ENTRY` is reserved.
    meta: a JSON-serialisable dict.

  Returns:
    `[8 + n]` uint8: the `.npz`'s length `n` (uint64), then the `.npz`.

  Raises:
    ValueError: `flat` uses the reserved name `META_ENTRY`.
  """
  if META_ENTRY in flat:
    raise ValueError(f"host array name {META_ENTRY!r} is reserved for the meta")
  buf = io.BytesIO()
  entries = dict(flat)
  entries[META_ENTRY] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
  np.savez(buf, **entries)
  body = np.frombuffer(buf.getvalue(), np.uint8)
  return np.concatenate([np.frombuffer(np.uint64(body.size).tobytes(), np.uint8), body])


def decode_row(row: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """The inverse of `encode_row`; trailing padding is ignored.

  Args:
    row: `[width]` uint8, a row as `encode_row` wrote it, possibly zero-padded.

  Returns:
    `(flat, meta)` as encoded.

  Raises:
    ValueError: the row is shorter than its length prefix says (a truncated row).
  """
  row = np.asarray(row, np.uint8)
  if row.size < _LENGTH_BYTES:
    raise ValueError(f"host row of {row.size} bytes has no {_LENGTH_BYTES}-byte length")
  size = int(np.frombuffer(row[:_LENGTH_BYTES].tobytes(), np.uint64)[0])
  if size > row.size - _LENGTH_BYTES:
    raise ValueError(f"host row says {size} bytes follow its length, but {row.size} bytes "
                     f"hold only {row.size - _LENGTH_BYTES}")
  body = row[_LENGTH_BYTES:_LENGTH_BYTES + size].tobytes()
  with np.load(io.BytesIO(body), allow_pickle=False) as npz:
    flat = {k: np.asarray(npz[k]) for k in npz.files}
  meta = json.loads(flat.pop(META_ENTRY).tobytes().decode())
  return flat, meta


def global_rows(row: np.ndarray) -> tuple[jax.Array, int]:
  """Every process's row as one global array; every process must call it with its own row.

  Args:
    row: `[n]` uint8, this process's `encode_row`.

  Returns:
    `(rows, width)`: `rows` is `[process_count, width]` uint8 with `row_sharding()`, row `p`
    process `p`'s row zero-padded to `width`, the smallest power of two >= 1024 that holds the
    longest row.
  """
  sizes = parallel.host_allgather(np.int64(row.size))
  width = 1 << max(_MIN_WIDTH_BITS, int(sizes.max() - 1).bit_length())
  padded = np.zeros((1, width), np.uint8)
  padded[0, :row.size] = row
  rows = jax.make_array_from_process_local_data(row_sharding(), padded,
                                                (parallel.process_count(), width))
  return rows, width


def abstract_rows(count: int, width: int) -> jax.ShapeDtypeStruct:
  """The `[count, width]` uint8 rows array to restore, with `row_sharding()`."""
  return jax.ShapeDtypeStruct((int(count), int(width)), np.uint8, sharding=row_sharding())


def own_row(rows: jax.Array) -> np.ndarray:
  """This process's `[width]` uint8 row of a `[process_count, width]` array of `global_rows`."""
  return np.asarray(rows.addressable_shards[0].data)[0]
