"""Checkpoints for exact resume, with Orbax's `CheckpointManager`.

One checkpoint holds everything a run needs to continue as if it had never stopped:

* `state`: the learner `TrainState` (params, optimizer state, step, PRNG key);
* `host`: host-side numpy arrays (the replay's segment store: pending episodes with their
  provisional advantages, i.e. pending corrections, and ready rows; the agent loop's in-flight
  episodes);
* `meta`: a JSON document (phase, global step, data position, replay and loop bookkeeping,
  metric counters).

Multi-process runs: every process calls `save` and `restore` at the same step. The learner state
is one set of global arrays, written shard by shard by the processes that hold them (Orbax
multi-host saving). Host state is per process (each process has its own replay, in-flight
episodes and data position): each process's host arrays and meta are one uint8 row of a global
`[process_count, width]` array (`host_rows`), so that each process writes and reads
back only its own row. The JSON `meta` item holds process
0's meta (for inspection) and the process count; a checkpoint restores only into a run with the
same number of processes.

Saves are atomic: Orbax writes into a temporary directory and renames it only when every item is
written, so a process killed during a save (even with SIGKILL) leaves the previous checkpoint as
the latest restorable one; the half-written directory is ignored and cleaned up.

Integrity: once a save is committed (every process's files), process 0 writes a manifest of
every file's SHA-256 and size into the step directory (`integrity`). A restore of the
latest checkpoint verifies the newest checkpoints until one is intact, logs every damaged one by
step and file, and moves the damaged ones newer than the restored step aside (to
`<directory>-damaged/<step>`, where they can be inspected and do not block later saves of the
same step numbers); when checkpoints exist but none is intact it raises
`CheckpointIntegrityError` naming each one. A checkpoint without a manifest (a save that died
between Orbax's commit and the manifest, or one written before manifests existed) is not intact;
`Checkpointer.adopt(step)` writes the manifest of a checkpoint known to be good. In a
multi-process run process 0 verifies and every process restores the step it chose.

Checkpoints of earlier versions restore into today's state, each conversion logged
(`last_restore_notes`); one that cannot be made to fit raises `checkpoint_layout.LayoutError`
naming the missing, extra and reshaped paths, before anything is read or moved. Derived:
* `state.master` (float32 master of low-precision parameters, absent before it existed): the
  saved `params` cast to float32 (`learner.STATE_DERIVATIONS`); for float32 parameters there
  is nothing to derive (`master` is None). Saved bfloat16 AdamW moments of such a checkpoint
  are read as today's float32 moments.
* JSON records (`records`), a missing key only where a default is safe: the run's
  metric `counters` ({}), `warmstart_passed` (None: no paired gain), `rl_phase` (None: no
  unlogged rows) and its `harvest_rows`/`updates` ([]), `tokens`/`idle_batches` (0); the
  replay's `counters` ({}). Everything else (the loop's ids, counters and in-flight batches,
  the replay's groups, episodes and items, the host arrays) is required, named when absent.
"""

import datetime
import os
from typing import Any, Callable, Optional, Sequence

from absl import logging
from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from agentic_grpo import exit_codes
from agentic_grpo import parallel
from agentic_grpo.checkpoint import host_rows
from agentic_grpo.checkpoint import integrity
from agentic_grpo.checkpoint import layout

# Orbax refuses zero-size arrays; host arrays are stored with one leading pad element.
_PAD = 1
# Orbax refuses an empty tree; this entry (the host-state format version) is always saved.
_FORMAT_KEY = "_format/version"
_FORMAT_VERSION = 1
# Meta keys the checkpointer writes itself.
_RESERVED_META = ("host_shapes", "process_count", "host_blob_width")


class CheckpointIntegrityError(RuntimeError):
  """Checkpoints exist but none that was asked for is intact (the message names each damaged
  step and file)."""
  exit_code = exit_codes.CHECKPOINT_DAMAGED


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


class MissingCheckpointError(FileNotFoundError):
  """No checkpoint at all, or none at the step asked for (the message lists the steps there)."""
  exit_code = exit_codes.CHECKPOINT_DAMAGED


def state_field(name: str) -> Callable[[layout.Path], bool]:
  """An `only` for `Checkpointer.restore` of a run's state tree (`{'state': TrainState, 'ref':
  params}`): one field of the learner state, e.g. `params` (evaluation, export) or `master`."""
  return lambda path: path[:2] == ("state", name)


class Checkpointer:
  """Saves and restores `(state, host arrays, meta)` under `directory`.

  Rotation (after each save): the `max_to_keep` newest checkpoints are kept, and besides them
  every checkpoint of `keep_steps` (the run's end of the warm-start,
  `checkpoint.keep_warmstart`), through Orbax's preservation policies (`LatestN` or
  `CustomSteps`). A kept step is never deleted by rotation; it is still verified, and set aside
  when damaged and newer than the restored step, like any other.

  Args:
    directory: checkpoint root (created if missing).
    max_to_keep: newest checkpoints kept.
    keep_steps: steps never deleted by rotation (each counts among the newest while it is one
      of them).
  """

  def __init__(self, directory: str, *, max_to_keep: int = 2, keep_steps: Sequence[int] = ()):
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    if any(int(s) < 0 for s in keep_steps):
      raise ValueError(f"keep_steps must be >= 0, got {list(keep_steps)}")
    self.directory = directory if "://" in str(directory) else os.path.abspath(directory)
    self.keep_steps = tuple(sorted({int(s) for s in keep_steps}))
    policies = ocp.checkpoint_managers
    keep = policies.AnyPreservationPolicy([policies.LatestN(n=max_to_keep),
                                           policies.CustomSteps(self.keep_steps)])
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(preservation_policy=keep,
                                             enable_async_checkpointing=False, create=True))
    self._problems: dict[int, list[integrity.Problem]] = {}  # verified steps (process 0)
    # What the last `restore` derived or converted to fit an earlier layout (empty: none).
    self.last_restore_notes: list[str] = []

  @staticmethod
  def exists(directory: str) -> bool:
    """Whether `directory` holds a checkpoint step directory (cheap: one listing; Orbax's
    temporary directories of unfinished saves do not count)."""
    path = epath.Path(directory)
    return path.is_dir() and any(p.name.isdigit() for p in path.iterdir())

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
      meta: JSON-serialisable dict. Its keys `host_shapes`, `process_count` and
        `host_blob_width` are reserved.

    In a multi-process run `host` and `meta` are this process's own (see the module
    docstring); every process must call `save`.

    Raises:
      ValueError: a host array that is not 1-D, a host group starting with `_`, or a `meta`
        that uses a reserved key.
    """
    reserved = [k for k in _RESERVED_META if k in meta]
    if reserved:
      raise ValueError(f"meta must not contain the reserved keys {reserved}")
    if any(group.startswith("_") for group in host):
      raise ValueError(f"host groups must not start with '_', got {sorted(host)}")
    if parallel.process_count() > 1:
      self._save_per_process(step, state, host, meta)
      return
    flat = _flatten_host(host)
    flat[_FORMAT_KEY] = np.array([_FORMAT_VERSION], np.int32)
    flat = _pad(flat)
    meta = dict(meta, host_shapes={k: [int(v.shape[0]), v.dtype.str] for k, v in flat.items()})
    self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        host=ocp.args.StandardSave(flat),
        meta=ocp.args.JsonSave(meta)), force=True)
    self._finish_save(step)

  def _save_per_process(self, step, state, host, meta) -> None:
    for group, arrays in host.items():
      for name, v in arrays.items():
        if np.ndim(v) != 1:
          raise ValueError(f"host array {group + '/' + name!r} must be 1-D, got shape "
                           f"{np.shape(v)}")
    flat = _flatten_host(host)
    flat[_FORMAT_KEY] = np.array([_FORMAT_VERSION], np.int32)
    rows, width = host_rows.global_rows(host_rows.encode_row(flat, meta))
    shared = dict(meta, process_count=parallel.process_count(), host_blob_width=width)
    self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        host_rows=ocp.args.StandardSave({"rows": rows}),
        meta=ocp.args.JsonSave(shared)), force=True)
    self._finish_save(step)

  def _step_dir(self, step: int) -> epath.Path:
    return epath.Path(self.directory) / str(int(step))

  def _finish_save(self, step: int) -> None:
    """Waits for the commit of every process's files, then process 0 writes the manifest."""
    self._manager.wait_until_finished()
    parallel.sync_processes(f"checkpoint_committed_{step}")
    if parallel.is_primary():
      integrity.write_manifest(self._step_dir(step))
    self._problems.pop(int(step), None)
    parallel.sync_processes(f"checkpoint_manifest_{step}")

  def adopt(self, step: int) -> None:
    """Writes the integrity manifest of checkpoint `step` as it is now.

    For a checkpoint known to be good that has no manifest (written before manifests
    existed) or whose manifest is stale: an existing manifest is replaced, atomically.
    Afterwards it restores like any other. Every process must call it.

    Raises:
      MissingCheckpointError (a FileNotFoundError): there is no checkpoint `step`.
    """
    if int(step) not in self.all_steps():
      raise MissingCheckpointError(f"no checkpoint {step} in {self.directory}")
    if parallel.is_primary():
      integrity.write_manifest(self._step_dir(step))
    self._problems.pop(int(step), None)
    parallel.sync_processes(f"checkpoint_adopt_{step}")

  def problems(self, step: int) -> list[integrity.Problem]:
    """What is wrong with checkpoint `step` (empty when intact); hashes every file once."""
    step = int(step)
    if step not in self._problems:
      self._problems[step] = integrity.verify(self._step_dir(step))
    return self._problems[step]

  def intact_step(self) -> Optional[int]:
    """The newest intact checkpoint's step, the same in every process (process 0 verifies).

    Every damaged checkpoint newer than it is logged as a warning naming its step and files.

    Returns:
      The step, or None when there is no checkpoint at all.

    Raises:
      CheckpointIntegrityError: checkpoints exist but none is intact.
    """
    steps = self.all_steps()
    if not steps:
      return None
    choice, damaged = -1, []
    if parallel.is_primary():
      for step in reversed(steps):
        found = self.problems(step)
        if not found:
          choice = step
          break
        damaged.append(integrity.describe(step, found))
        logging.warning("damaged %s in %s", damaged[-1], self.directory)
    choice = parallel.broadcast_from_primary(choice)
    if choice < 0:
      detail = ("\n  ".join(damaged) if damaged else "see process 0's log")
      raise CheckpointIntegrityError(
          f"no intact checkpoint in {self.directory} (steps {steps}):\n  {detail}\nMove the "
          f"workdir aside to start afresh, or, for a checkpoint known to be good that predates "
          f"integrity manifests, call Checkpointer(...).adopt(step).")
    if choice != steps[-1] and parallel.is_primary():
      logging.warning("restoring checkpoint %d of %s, the newest intact one", choice,
                      self.directory)
    return choice

  def require(self, step: int) -> int:
    """`step`, checked to have a checkpoint here (its integrity is not checked: `restore` does
    that). Every process must call it (process 0 decides).

    Raises:
      MissingCheckpointError: none at `step`; the message lists the steps there.
    """
    steps = self.all_steps()
    if not parallel.broadcast_from_primary(int(int(step) in steps) if parallel.is_primary() else 0):
      raise MissingCheckpointError(f"no checkpoint at step {step} in {self.directory}; steps "
                                   f"there: {steps}")
    return int(step)

  def _resolve(self, step: Optional[int]) -> int:
    """`step` checked for existence and integrity, or the newest intact step when None.

    Raises:
      MissingCheckpointError: no checkpoint at all, or none at `step`.
      CheckpointIntegrityError: checkpoint `step` is damaged.
    """
    if step is None:
      step = self.intact_step()
      if step is None:
        raise MissingCheckpointError(f"no checkpoint in {self.directory}")
      return step
    step = self.require(step)
    ok = parallel.broadcast_from_primary(int(not self.problems(step)) if parallel.is_primary() else 0)
    if not ok:
      detail = (integrity.describe(step, self.problems(step), None)
                if parallel.is_primary() else "see process 0's log")
      raise CheckpointIntegrityError(f"damaged checkpoint in {self.directory}: {detail}")
    return int(step)

  def _set_aside_newer(self, step: int) -> None:
    """Moves the (damaged) checkpoints newer than `step` to `<directory>-damaged/`."""
    newer = [s for s in self.all_steps() if s > step]
    if not newer:
      return
    if parallel.is_primary():
      aside = epath.Path(str(self.directory).rstrip("/") + "-damaged")
      stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
      for s in newer:
        target = integrity.set_aside(self._step_dir(s), aside, stamp=stamp)
        logging.warning("moved damaged checkpoint %d to %s", s, target)
    parallel.sync_processes(f"checkpoint_set_aside_{step}")
    for s in newer:
      self._problems.pop(s, None)
    self._manager.reload()

  def read_meta(self, step: Optional[int] = None) -> dict[str, Any]:
    """The shared `meta` of checkpoint `step` (the newest intact one when None), without the
    state. Verified like `restore`.

    Raises:
      MissingCheckpointError (a FileNotFoundError): no checkpoint (at `step`).
      CheckpointIntegrityError: as `restore`.
    """
    step = self._resolve(step)
    return dict(self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore())).meta)

  def restore(self, step: Optional[int], abstract_state: Any, *,
              derivations: Sequence[layout.Derivation] = (),
              only: Optional[Callable[[layout.Path], bool]] = None
              ) -> tuple[Any, dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """Restores checkpoint `step` (the newest intact one when None), verified first.

    With `step=None`, damaged checkpoints newer than the restored one are logged and moved to
    `<directory>-damaged/` (see the module docstring). Every process must call it. A state
    saved by an earlier version is fitted to `abstract_state` (`layout`); what was
    derived or converted is logged and kept in `last_restore_notes`.

    Args:
      step: which checkpoint, or None for the latest.
      abstract_state: a pytree with the structure of today's state whose leaves give shape,
        dtype (and sharding): arrays or `jax.ShapeDtypeStruct`s.
      derivations: fields of today's state that older checkpoints may lack
        (`learner.STATE_DERIVATIONS` for the learner's state).
      only: which leaves to read, by path (`checkpoint_layout.Path`, e.g. `('state',
        'params', 'embed', 'value')`); the others are not read from disk (nor held in memory)
        and come back as `orbax.checkpoint.PLACEHOLDER`. Default: every leaf. Evaluation reads
        the parameters only, not the optimizer's moments (twice the parameters in float32).

    Returns:
      `(state, host, meta)` as saved; in a multi-process run, this process's own `host` and
      `meta`.

    Raises:
      MissingCheckpointError (a FileNotFoundError): no checkpoint, or none at `step`.
      CheckpointIntegrityError: checkpoint `step` is damaged, or (`step=None`) checkpoints exist
        but none is intact; the message names each damaged step and file.
      ValueError: the checkpoint was written by a different number of processes.
      checkpoint_layout.LayoutError (a ValueError): the saved state cannot be made to fit
        `abstract_state`; it names the missing, extra and reshaped paths. Nothing is moved.
    """
    latest = step is None
    step = self._resolve(step)
    where = f"checkpoint {step} in {self.directory}: the saved state"
    fit = layout.plan(layout.saved_tree(self._step_dir(step) / "state"), abstract_state,
                      derivations, where=where)
    if latest:
      self._set_aside_newer(step)
    meta = self.read_meta(step)
    written_by = int(meta.get("process_count", 1))
    if written_by != parallel.process_count():
      raise ValueError(f"checkpoint {step} in {self.directory} holds the host state of "
                       f"{written_by} processes; this run has {parallel.process_count()}")
    self.last_restore_notes = fit.notes
    for note in fit.notes:
      logging.warning("checkpoint %d in %s (an earlier layout): %s", step, self.directory, note)
    abstract = fit.item
    if written_by > 1:
      rows = host_rows.abstract_rows(written_by, int(meta["host_blob_width"]))
      restored = self._read(step, abstract, only, host_rows={"rows": rows})
      flat, own_meta = host_rows.decode_row(host_rows.own_row(restored["host_rows"]["rows"]))
      flat.pop(_FORMAT_KEY)
      return fit.assemble(restored["state"], only), _unflatten_host(flat), own_meta
    shapes = meta.pop("host_shapes")
    abstract_host = {k: np.zeros((n,), np.dtype(dt)) for k, (n, dt) in shapes.items()}
    restored = self._read(step, abstract, only, host=abstract_host)
    flat = _unpad({k: np.asarray(v) for k, v in restored["host"].items()})
    flat.pop(_FORMAT_KEY)
    return fit.assemble(restored["state"], only), _unflatten_host(flat), meta

  def _read(self, step: int, abstract: Any, only: Optional[Callable[[layout.Path], bool]],
            **host_items: Any) -> dict[str, Any]:
    """Reads the `state` item into `abstract` and the named host items of checkpoint `step`.

    With `only`, the leaves it rejects are `ocp.PLACEHOLDER`s and are not read: the state item
    is then read by Orbax's PyTree handler (the standard one takes no placeholders; the files
    are the same), the host items through the manager.
    """
    host_args = {k: ocp.args.StandardRestore(v) for k, v in host_items.items()}
    if only is None:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), **host_args))
      return {k: restored[k] for k in ("state", *host_items)}
    item = jax.tree_util.tree_map_with_path(
        lambda path, leaf: leaf if only(layout.key_path(path)) else ocp.PLACEHOLDER, abstract)
    restore_args = jax.tree.map(
        lambda leaf: leaf if leaf is ocp.PLACEHOLDER else
        ocp.checkpoint_utils.construct_restore_args(leaf), item)
    with ocp.PyTreeCheckpointer() as reader:
      state = reader.restore(self._step_dir(step) / "state",
                             args=ocp.args.PyTreeRestore(item, restore_args=restore_args))
    restored = self._manager.restore(step, args=ocp.args.Composite(**host_args))
    return {"state": state, **{k: restored[k] for k in host_items}}

  def close(self) -> None:
    self._manager.close()
