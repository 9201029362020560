"""Multi-process runtime and host collectives.

Multi-process (multi-host) runs use JAX's own multi-controller runtime:
`initialize_distributed` calls `jax.distributed.initialize`; every process
runs the same program, takes its share of the task list with
`process_slice`, and agrees with the others through the small host
collectives here (`host_allgather`, `allgather_json`), which every process
must call at the same point of the program. `fetch` copies global arrays to
the host on every process; `is_primary` names the process that writes.
With one process every function here is local, with no device work.
"""

import json
import os
from typing import Any, Optional, Union

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

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
  (`multihost_utils.process_allgather`, a collective); others are `jax.device_get`.
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
