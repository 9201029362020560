"""Checkpoints for exact resume, with Orbax's `CheckpointManager`.

One checkpoint holds everything a run needs to continue as if it had never stopped:

* `state`: the learner `TrainState` (params, optimizer state, step, PRNG key);
* `host`: host-side numpy arrays (the replay's segment store: pending episodes with their
  provisional advantages, i.e. pending corrections, and ready rows; the agent loop's in-flight
  episodes);
* `meta`: a JSON document (phase, global step, data position, replay and loop bookkeeping,
  metric counters).

Saves are atomic: Orbax writes into a temporary directory and renames it only when every item is
written, so a process killed during a save (even with SIGKILL) leaves the previous checkpoint as
the latest restorable one; the half-written directory is ignored and cleaned up.
"""

import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

# Orbax refuses zero-size arrays; host arrays are stored with one leading pad element.
_PAD = 1
# Orbax refuses an empty tree; this entry (the host-state format version) is always saved.
_FORMAT_KEY = "_format/version"
_FORMAT_VERSION = 1


def _pad(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  for k, v in arrays.items():
    v = np.asarray(v)
    if v.ndim != 1:
      raise ValueError(f"host array {k!r} must be 1-D, got shape {v.shape}")
    out[k] = np.concatenate([np.zeros((_PAD,), v.dtype), v])
  return out


def _unpad(arrays: dict[str, Any]) -> dict[str, np.ndarray]:
  return {k: np.asarray(v)[_PAD:] for k, v in arrays.items()}


def _flatten_host(tree: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {f"{group}/{name}": v for group, arrays in tree.items() for name, v in arrays.items()}


def _unflatten_host(flat: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
  out: dict[str, dict[str, np.ndarray]] = {}
  for key, v in flat.items():
    group, name = key.split("/", 1)
    out.setdefault(group, {})[name] = v
  return out


class Checkpointer:
  """Saves and restores `(state, host arrays, meta)` under `directory`.

  Args:
    directory: checkpoint root (created if missing).
    max_to_keep: newest checkpoints kept.
  """

  def __init__(self, directory: str, *, max_to_keep: int = 2):
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    self.directory = directory if "://" in str(directory) else os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                             enable_async_checkpointing=False, create=True))

  def latest_step(self) -> Optional[int]:
    """Step of the newest complete checkpoint, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of the complete checkpoints, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, host: dict[str, dict[str, np.ndarray]],
           meta: dict[str, Any]) -> None:
    """Writes checkpoint `step` and waits until it is committed.

    Args:
      step: monotonically increasing checkpoint number (the run's global step).
      state: a pytree of arrays (the `TrainState`).
      host: `{group: {name: 1-D numpy array}}` host state (e.g. `{"replay": ...}`).
      meta: JSON-serialisable dict. Its `host_shapes` entry is reserved.

    Raises:
      ValueError: a host array that is not 1-D, or a `meta` that reserves `host_shapes`.
    """
    if "host_shapes" in meta:
      raise ValueError("meta must not contain the reserved key 'host_shapes'")
    if any(group.startswith("_") for group in host):
      raise ValueError(f"host groups must not start with '_', got {sorted(host)}")
    flat = _flatten_host(host)
    flat[_FORMAT_KEY] = np.array([_FORMAT_VERSION], np.int32)
    flat = _pad(flat)
    meta = dict(meta, host_shapes={k: [int(v.shape[0]), v.dtype.str] for k, v in flat.items()})
    self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        host=ocp.args.StandardSave(flat),
        meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def restore(self, step: Optional[int], abstract_state: Any
              ) -> tuple[Any, dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """Restores checkpoint `step` (the latest when None).

    Args:
      step: which checkpoint, or None for the latest.
      abstract_state: a pytree with the structure of the saved state whose leaves give shape,
        dtype (and sharding): arrays or `jax.ShapeDtypeStruct`s.

    Returns:
      `(state, host, meta)` as saved.

    Raises:
      FileNotFoundError: when there is no checkpoint.
    """
    if step is None:
      step = self.latest_step()
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    meta = self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore())).meta
    shapes = meta.pop("host_shapes")
    abstract_host = {k: np.zeros((n,), np.dtype(dt)) for k, (n, dt) in shapes.items()}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract),
        host=ocp.args.StandardRestore(abstract_host)))
    flat = _unpad({k: np.asarray(v) for k, v in restored.host.items()})
    flat.pop(_FORMAT_KEY)
    host = _unflatten_host(flat)
    return restored.state, host, meta

  def close(self) -> None:
    self._manager.close()
