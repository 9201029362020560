"""Device parallelism without model code: meshes, logical axis rules, batches, processes.

* `mesh`: the `(data, fsdp, tensor)` mesh, logical axis rules and the shardings
  they give an array or a pytree.
* `batch`: placing batches of rows on the mesh (`put_batch`, `shard_batch`) and
  reading a process's rows back (`local_rows`).
* `collectives`: the multi-process runtime (`initialize_distributed`), host
  collectives (`host_allgather`, `allgather_json`, `fetch`, `sync_processes`,
  `broadcast_from_primary`), the process questions (`process_count`, `process_index`,
  `is_primary`: the package asks them here, nowhere else).
* `peer_watch`: the peer-failure timeout around the collectives (`peer_watchdog`), the
  heartbeat and the report naming the failed peers.

Model placement (parameters, optimizer state, KV cache) is `models/placement.py`.
"""

from agentic_grpo.parallel.batch import batch_devices
from agentic_grpo.parallel.batch import batch_sharding
from agentic_grpo.parallel.batch import local_rows
from agentic_grpo.parallel.batch import put_batch
from agentic_grpo.parallel.batch import row_sharding
from agentic_grpo.parallel.batch import shard_batch
from agentic_grpo.parallel.collectives import allgather_json
from agentic_grpo.parallel.collectives import broadcast_from_primary
from agentic_grpo.parallel.collectives import ENV_COORDINATOR
from agentic_grpo.parallel.collectives import ENV_DISTRIBUTED
from agentic_grpo.parallel.collectives import ENV_NUM_PROCESSES
from agentic_grpo.parallel.collectives import ENV_PROCESS_ID
from agentic_grpo.parallel.collectives import fetch
from agentic_grpo.parallel.collectives import host_allgather
from agentic_grpo.parallel.collectives import initialize_distributed
from agentic_grpo.parallel.collectives import is_primary
from agentic_grpo.parallel.collectives import process_count
from agentic_grpo.parallel.collectives import process_index
from agentic_grpo.parallel.collectives import process_slice
from agentic_grpo.parallel.collectives import sync_processes
from agentic_grpo.parallel.mesh import BATCH_AXES
from agentic_grpo.parallel.mesh import canonical_rules
from agentic_grpo.parallel.mesh import DEFAULT_RULES
from agentic_grpo.parallel.mesh import logical_mesh_axes
from agentic_grpo.parallel.mesh import logical_to_spec
from agentic_grpo.parallel.mesh import make_mesh
from agentic_grpo.parallel.mesh import MESH_AXES
from agentic_grpo.parallel.mesh import MeshLike
from agentic_grpo.parallel.mesh import resolve_mesh_shape
from agentic_grpo.parallel.mesh import Rules
from agentic_grpo.parallel.mesh import rules_from_config
from agentic_grpo.parallel.mesh import tree_shardings
from agentic_grpo.parallel.peer_watch import EXIT_PEER_FAILURE
from agentic_grpo.parallel.peer_watch import peer_watchdog
