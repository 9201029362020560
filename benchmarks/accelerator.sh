#!/usr/bin/env bash
# Benchmarks on a GPU or TPU host: update_flops (MFU against the chip's published bf16 peak),
# sampler, continuous batching against static (continuous), reused conversation prefixes
# (continuous_prefix) and grpo_step on a random model of Qwen2.5-0.5B shape in bfloat16, in
# under 9 minutes,
# into one results file (JSON lines). Not part of CI; meant to run unattended the first time it
# meets a device:
#
#   bash benchmarks/accelerator.sh [RESULTS_FILE]
#
# It creates (once) a virtual environment under $AGENTIC_GRPO_BENCH_CACHE (default
# ~/.cache/agentic_grpo/bench) with jax for the detected platform and this repository installed,
# or uses $PYTHON when set (an interpreter that already has both). Each part has its own time
# limit; a part that fails or times out is recorded as failed and the others still run. Exit
# status: 0 when every part succeeded, 1 when some failed, 2 when there is no accelerator.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="${1:-$ROOT/benchmarks/results-accelerator-$(date -u +%Y%m%dT%H%M%SZ).jsonl}"
CACHE="${AGENTIC_GRPO_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentic_grpo/bench}"
BUDGET_S="${BUDGET_S:-530}"   # the whole run, installation excluded
START="$(date +%s)"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  PLATFORM=cuda; JAX_EXTRA="jax[cuda12]==0.10.2"
elif ls /dev/accel* >/dev/null 2>&1 || ls /dev/vfio/* >/dev/null 2>&1; then
  PLATFORM=tpu; JAX_EXTRA="jax[tpu]==0.10.2"
else
  echo "accelerator.sh: no NVIDIA GPU (nvidia-smi) or TPU (/dev/accel*, /dev/vfio) found" >&2
  exit 2
fi
echo "platform: $PLATFORM; results: $RESULTS"

if [[ -z "${PYTHON:-}" ]]; then
  VENV="$CACHE/venvs/accelerator-$PLATFORM"
  if [[ ! -f "$VENV/.ready" ]]; then
    python3 -m venv --clear "$VENV" || exit 1
    "$VENV/bin/python" -m pip install -q --upgrade pip || exit 1
    "$VENV/bin/python" -m pip install -q "$JAX_EXTRA" -r "$ROOT/benchmarks/requirements.txt" \
      || exit 1
    "$VENV/bin/python" -m pip install -q -e "$ROOT" || exit 1
    touch "$VENV/.ready"
  fi
  PYTHON="$VENV/bin/python"
fi

# The device must be the accelerator, not a silent CPU fallback.
JAX_PLATFORMS="$PLATFORM" timeout 120 "$PYTHON" -c "
import jax; d = jax.devices()[0]
assert jax.default_backend() != 'cpu', jax.default_backend()
print('device:', d.device_kind, 'count:', jax.device_count())" || {
  echo "accelerator.sh: jax does not see the $PLATFORM device" >&2; exit 2; }

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" JAX_PLATFORMS="$PLATFORM"
# Compilation cache: a second run skips most compilation.
export JAX_COMPILATION_CACHE_DIR="$CACHE/jax-cache-$PLATFORM"
if [[ "$PLATFORM" == cuda ]]; then export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9; fi

status=0
run_part() {  # name, seconds
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  local limit=$(( $2 < left ? $2 : left ))
  if (( limit < 20 )); then
    echo "{\"benchmark\": \"$1\", \"failed\": \"skipped: time budget spent\"}" >> "$RESULTS"
    status=1; return
  fi
  echo "== $1 (limit ${limit} s)"
  timeout --kill-after=10 "$limit" "$PYTHON" -m benchmarks.accelerator --only="$1" \
    --results="$RESULTS" --part_timeout=$(( limit - 10 ))
  local rc=$?
  if (( rc == 124 || rc == 137 )); then  # killed: the part could not record its failure
    echo "{\"benchmark\": \"$1\", \"failed\": \"time limit of ${limit} s\"}" >> "$RESULTS"
  fi
  if (( rc != 0 )); then status=1; fi
}
run_part update_flops 100
run_part sampler 80
run_part continuous 120
run_part continuous_prefix 120
run_part grpo_step 110
echo "done in $(( $(date +%s) - START )) s; results in $RESULTS"
exit $status
