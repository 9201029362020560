#!/usr/bin/env bash
# Runs launch/train.py as N JAX processes on this machine, over loopback.
#
# The multi-host code path (jax.distributed, per-process task shards, process-0 logging, Orbax
# multi-process checkpoints) without a pod: each process gets D simulated CPU devices, and the
# processes meet at a coordinator on 127.0.0.1. Everything after `--` goes to launch/train.py.
#
#   launch/multihost_local.sh -n 2 -d 2 -- --config=experiments/tiny_codegen.py --workdir=/tmp/run
#
# Options:
#   -n N        processes (default 2)
#   -d D        CPU devices per process (default 2)
#   -p PORT     coordinator port (default: a free one)
#   -t SECONDS  kill every process after this long (default 0: no limit)
#   -l DIR      write process i's output to DIR/process_i.log (default: process 0 to the
#               terminal, the others to a temporary directory, printed at the start)
#
# Environment: PYTHON (default .venv/bin/python), TRAIN_MODULE (default launch.train).
# Exit status: 0 when every process exits 0; otherwise the first non-zero status (124 on
# timeout, 137 when a process had to be killed: JAX catches SIGTERM). When one process fails,
# the others are stopped. Ctrl-C stops all of them.
set -euo pipefail

NUM_PROCESSES=2
DEVICES=2
PORT=""
TIMEOUT_S=0
LOG_DIR=""
PYTHON="${PYTHON:-}"
MODULE="${TRAIN_MODULE:-launch.train}"  # the Python module every process runs

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while getopts "n:d:p:t:l:h" opt; do
  case "$opt" in
    n) NUM_PROCESSES="$OPTARG" ;;
    d) DEVICES="$OPTARG" ;;
    p) PORT="$OPTARG" ;;
    t) TIMEOUT_S="$OPTARG" ;;
    l) LOG_DIR="$OPTARG" ;;
    h) usage 0 ;;
    *) usage 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ "${1:-}" == "--" ]]; then shift; fi

for pair in "n:$NUM_PROCESSES" "d:$DEVICES" "t:$TIMEOUT_S"; do
  if ! [[ "${pair#*:}" =~ ^[0-9]+$ ]]; then
    echo "multihost_local.sh: -${pair%%:*} must be a non-negative integer, got '${pair#*:}'" >&2
    exit 2
  fi
done
if (( NUM_PROCESSES < 1 || DEVICES < 1 )); then
  echo "multihost_local.sh: -n and -d must be >= 1" >&2
  exit 2
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "$PYTHON" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ -z "$PORT" ]]; then
  PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
if [[ -z "$LOG_DIR" ]]; then
  OTHERS_DIR="$(mktemp -d)"
  echo "multihost_local.sh: logs of processes 1..$((NUM_PROCESSES - 1)) in $OTHERS_DIR" >&2
else
  mkdir -p "$LOG_DIR"
fi

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    # Each process runs in its own session (setsid): stop the whole group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 1
  for pid in "${PIDS[@]}"; do
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  done
}
trap 'cleanup; exit 130' INT TERM

cd "$ROOT"
for ((i = 0; i < NUM_PROCESSES; i++)); do
  if [[ -n "$LOG_DIR" ]]; then
    out="$LOG_DIR/process_$i.log"
  elif (( i == 0 )); then
    out=/dev/stdout
  else
    out="$OTHERS_DIR/process_$i.log"
  fi
  cmd=("$PYTHON" -m "$MODULE" "$@")
  if (( TIMEOUT_S > 0 )); then cmd=(timeout --kill-after=10 "$TIMEOUT_S" "${cmd[@]}"); fi
  JAX_PLATFORMS=cpu \
  XLA_FLAGS="--xla_force_host_platform_device_count=$DEVICES ${XLA_FLAGS:-}" \
  AGENTIC_GRPO_DISTRIBUTED=1 \
  JAX_COORDINATOR_ADDRESS="127.0.0.1:$PORT" \
  JAX_NUM_PROCESSES="$NUM_PROCESSES" \
  JAX_PROCESS_ID="$i" \
    setsid "${cmd[@]}" >"$out" 2>&1 &
  PIDS+=("$!")
done

# Wait for all; on the first failure stop the rest (a lone survivor would wait for its peers).
status=0
remaining=("${PIDS[@]}")
while (( ${#remaining[@]} > 0 )); do
  next=()
  for pid in "${remaining[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      next+=("$pid")
    else
      rc=0
      wait "$pid" || rc=$?
      if (( rc != 0 && status == 0 )); then
        status=$rc
        echo "multihost_local.sh: process with pid $pid exited with status $rc; stopping the others" >&2
        cleanup
      fi
    fi
  done
  remaining=("${next[@]+"${next[@]}"}")
  if (( ${#remaining[@]} > 0 )); then sleep 0.5; fi
done
exit "$status"
