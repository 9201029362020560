"""Multi-process runtime and host collectives.

Multi-process (multi-host) runs use JAX's own multi-controller runtime:
`initialize_distributed` calls `jax.distributed.initialize`; every process
runs the same program, takes its share of the task list with
`process_slice`, and agrees with the others through the small host
collectives here (`host_allgather`, `allgather_json`), which every process
must call at the same point of the program. `fetch` copies global arrays to
the host on every process; `is_primary` names the process that writes.
With one process every function here is local, with no device work.

Peer failures: with a collective timeout (`initialize_distributed(collective_timeout_s=)`,
from `config.mesh`) every host collective here, and every wait here on a program that spans
processes, runs under `peer_watch.peer_watchdog`, which ends the process with a message naming
the failed peers (`peer_watch`'s module docstring has how they are found, and the limits).
"""

import inspect
import json
import os
from typing import Any, Optional, Union

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from agentic_grpo.parallel import peer_watch

# Environment variables read by `initialize_distributed` (set by the launch
# scripts). JAX itself reads JAX_COORDINATOR_ADDRESS; the other two are ours.
ENV_DISTRIBUTED = "AGENTIC_GRPO_DISTRIBUTED"
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"

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
    collective_timeout_s: Optional[float] = None,
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
    collective_timeout_s: when set and positive, the peer-failure timeout (see
      the module docstring): host collectives are watched (`peer_watch.peer_watchdog`),
      and JAX's heartbeat and shutdown timeouts take this value (where the
      installed `jax.distributed.initialize` has those options). None or 0:
      unwatched, JAX's defaults.

  Returns:
    True when the runtime is (now) initialised, False for a single-process run.

  Raises:
    ValueError: unknown `enabled`, malformed environment values, a
      `process_id` outside `[0, num_processes)`, or a negative
      `collective_timeout_s`.
  """
  if collective_timeout_s is not None and not collective_timeout_s >= 0:
    raise ValueError(f"collective_timeout_s must be >= 0 or None, got {collective_timeout_s!r}")
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
  peer_watch.set_timeout(float(collective_timeout_s or 0))
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
  options = {}
  if collective_timeout_s:
    accepted = inspect.signature(jax.distributed.initialize).parameters
    wanted = {"heartbeat_timeout_seconds": int(np.ceil(collective_timeout_s)),
              "shutdown_timeout_seconds": int(np.ceil(collective_timeout_s))}
    options = {k: v for k, v in wanted.items() if k in accepted}
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             initialization_timeout=int(timeout_s), **options)
  logging.info("process %d of %d, %d local / %d global devices; collective timeout %s",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count(),
               f"{peer_watch.timeout_s():g} s" if peer_watch.timeout_s() else "off")
  if peer_watch.timeout_s() and jax.process_count() > 1:
    peer_watch.start_heartbeat()
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
  (`multihost_utils.process_allgather`, a collective); others are `jax.device_get`.
  """
  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      with peer_watch.peer_watchdog("fetch"):
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(get, tree)


def is_primary() -> bool:
  """True in the process that writes logs and metrics (process 0)."""
  return jax.process_index() == 0


def process_count() -> int:
  """The number of processes in the run (1 without `jax.distributed`).

  The one place outside `jax` that answers it: the rest of the package asks here (or the run's
  `train.coordination.Coordinator`), so that every multi-process question has one answer.
  """
  return jax.process_count()


def process_index() -> int:
  """This process's index, in `[0, process_count())`."""
  return jax.process_index()


def sync_processes(name: str) -> None:
  """A barrier across processes named `name` (the same string in every process); nothing in a
  one-process run.

  Not under `peer_watch.peer_watchdog`: a barrier may wait on long work in one process
  (process 0 hashing a large checkpoint for its manifest), longer than the collective timeout.
  """
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def broadcast_from_primary(value: int) -> int:
  """Process 0's integer `value`, in every process (a collective; `value` itself in a
  one-process run). For decisions one process makes and all must follow (which checkpoint
  step to restore, whether it is intact)."""
  if jax.process_count() == 1:
    return int(value)
  # Not watched, as `sync_processes`: process 0 may verify a large checkpoint first.
  return int(multihost_utils.broadcast_one_to_all(np.int64(value)))


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
  with peer_watch.peer_watchdog("host_allgather"):
    gathered = np.asarray(multihost_utils.process_allgather(x, tiled=False))
  return gathered.reshape((jax.process_count(),) + x.shape)


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
