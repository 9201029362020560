r"""Peak host memory of a sharded Hugging Face checkpoint load, against the model size.

Writes a random checkpoint of Qwen2-0.5B shape (bfloat16, index-sharded
safetensors, written with safetensors + NumPy: nothing is downloaded and no
torch is needed), then loads it in a fresh process onto a (2, 2, 2) mesh of 8
simulated CPU devices with `hf_import.load_hf_checkpoint(..., shardings=...)`
and reports:

- `model_bytes`: the size of the full model in the param dtype;
- `device_bytes`: the bytes the 8 devices hold after the load (parameters
  split over `fsdp` x `tensor` and replicated over `data`); on the CPU backend
  these buffers are host memory too;
- `staging_peak_bytes`: `tracemalloc`'s peak of Python/NumPy allocations
  during the load, minus what is still allocated afterwards, i.e. the
  loader's transient host buffers (the slices read and cast before they are
  handed to the devices);
- `largest_block_bytes`: the largest block one device holds;
- `largest_read_bytes`: the largest single read from a safetensors file (a
  block is filled in pieces of whole rows);
- `rss_peak_delta_bytes`: growth of the process's peak resident set over the
  load (Linux `VmHWM`, reset through `/proc/self/clear_refs` just before the
  load; `resource.getrusage`'s `ru_maxrss` is not used for the delta because
  it survives `exec` and so carries the writer's peak): device buffers +
  staging + touched pages of the memory-mapped safetensors files.

  python benchmarks/hf_load_memory.py [--dir=/tmp/qwen2_0_5b_random] [--keep]
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

_DIR = flags.DEFINE_string("dir", "", "Checkpoint directory (default: a temporary one).")
_KEEP = flags.DEFINE_bool("keep", False, "Keep the written checkpoint.")
_MEASURE = flags.DEFINE_bool("measure", False, "Internal: load and measure (child process).")
_SHARD_BYTES = flags.DEFINE_integer("shard_bytes", 256 << 20,
                                    "Target size of one safetensors file.")

# Qwen2-0.5B config.json (shape keys).
QWEN2_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "use_sliding_window": False, "torch_dtype": "bfloat16",
}


def write_random_checkpoint(path: str, hf: dict, shard_bytes: int, seed: int = 0) -> int:
  """Writes `hf` as config.json plus random bf16 tensors in index-sharded files; returns bytes."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  from agentic_grpo.models import hf_config  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import hf_layout  # pylint: disable=g-import-not-at-top

  os.makedirs(path, exist_ok=True)
  config = hf_config.model_config_from_hf(hf)
  specs = sorted(hf_layout.tensor_specs(config).values(), key=lambda s: s.name)
  rng = np.random.default_rng(seed)
  groups, current, size = [], [], 0
  for spec in specs:
    nbytes = 2 * int(np.prod(spec.hf_shape))
    if current and size + nbytes > shard_bytes:
      groups.append(current)
      current, size = [], 0
    current.append(spec)
    size += nbytes
  groups.append(current)
  weight_map, total = {}, 0
  for i, group in enumerate(groups):
    name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
    tensors = {s.name: (0.02 * rng.standard_normal(s.hf_shape, np.float32)).astype(
        ml_dtypes.bfloat16) for s in group}
    save_file(tensors, os.path.join(path, name))
    for s in group:
      weight_map[s.name] = name
      total += tensors[s.name].nbytes
    del tensors
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f)
  return total


def _vm_hwm() -> int:
  """Peak resident set size of this process in bytes (Linux `VmHWM`)."""
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("no VmHWM in /proc/self/status")


def measure(path: str) -> dict:
  """Loads `path` onto a (2, 2, 2) mesh and returns the memory figures (see module doc)."""
  import tracemalloc  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from agentic_grpo import parallel  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import hf_import  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import hf_layout  # pylint: disable=g-import-not-at-top
  from agentic_grpo.models import placement  # pylint: disable=g-import-not-at-top

  mesh = parallel.make_mesh((2, 2, 2))
  jax.block_until_ready(jax.device_put(np.zeros(8), jax.devices()[0]))  # backend up
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
  rss_before = _vm_hwm()
  largest = [0]
  original = hf_layout.read_slice

  def counting(*args, **kwargs):
    block = original(*args, **kwargs)
    largest[0] = max(largest[0], block.nbytes)
    return block

  hf_layout.read_slice = counting
  tracemalloc.start()
  config, params = hf_import.load_hf_checkpoint(
      path, shardings=lambda c: placement.shard_model(c, mesh).param_shardings)
  jax.block_until_ready(params)
  current, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  rss_after = _vm_hwm()
  leaves = jax.tree.leaves(params)
  return {
      "param_dtype": str(config.param_dtype),
      "params": int(sum(x.size for x in leaves)),
      "model_bytes": int(sum(x.nbytes for x in leaves)),
      "device_bytes": int(sum(s.data.nbytes for x in leaves for s in x.addressable_shards)),
      "staging_peak_bytes": int(peak - current),
      "tracemalloc_peak_bytes": int(peak),
      "largest_block_bytes": int(max(s.data.nbytes for x in leaves
                                     for s in x.addressable_shards)),
      "largest_read_bytes": int(largest[0]),
      "rss_before_bytes": int(rss_before),
      "rss_peak_delta_bytes": int(rss_after - rss_before),
      "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
  }


def main(argv):
  del argv
  if _MEASURE.value:
    print(json.dumps(measure(_DIR.value)))
    return
  path = _DIR.value or tempfile.mkdtemp(prefix="qwen2_0_5b_random_")
  written = write_random_checkpoint(path, QWEN2_0_5B, _SHARD_BYTES.value)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure",
                        f"--dir={path}"], env=env, check=True, capture_output=True, text=True)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  result["checkpoint_bytes"] = written
  for key, value in result.items():
    mib = f"  ({value / 2**20:,.0f} MiB)" if key.endswith("bytes") else ""
    print(f"{key:>24}: {value}{mib}")
  if not _KEEP.value and not _DIR.value:
    shutil.rmtree(path)


if __name__ == "__main__":
  app.run(main)
