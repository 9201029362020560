#!/usr/bin/env bash
# Runs launch/train.py on every worker of a Cloud TPU VM slice (a pod slice such as v5p-64).
#
#   launch/tpu_pod.sh --name=grpo-v5p --zone=us-east5-a --accelerator=v5p-64 \
#       -- --config=experiments/tiny_codegen.py --config.mesh.fsdp=8 --workdir=gs://BUCKET/run1
#
# Steps (each idempotent, so re-running resumes a half-done setup):
#   1. create the slice with `gcloud compute tpus tpu-vm create`, or reuse it if it exists;
#   2. put the code on every worker: `git clone` of --repo at --ref, or (default) an archive of
#      this checkout's HEAD (`git archive`, committed files only) copied with `tpu-vm scp`;
#   3. make a virtualenv on every worker and install the package with `jax[tpu]`;
#   4. start launch/train.py on all workers at once (`tpu-vm ssh --worker=all`). JAX finds the
#      other workers itself (`jax.distributed.initialize()` with TPU auto-detection, enabled
#      by AGENTIC_GRPO_DISTRIBUTED=1); every worker runs the same program on its share of tasks.
# The workdir must be storage every worker sees (a gs:// bucket): Orbax writes checkpoints
# from all processes; process 0 writes metrics.
#
# Options (also as environment variables TPU_NAME, TPU_ZONE, ...):
#   --name=NAME             slice name (required)
#   --zone=ZONE             zone (required)
#   --project=PROJECT       project (default: gcloud's)
#   --accelerator=TYPE      accelerator type (default v5p-64)
#   --version=RUNTIME       TPU software version (default v2-alpha-tpuv5)
#   --spot                  create a Spot slice
#   --repo=URL --ref=REF    clone this repository at REF on the workers instead of copying
#   --dir=PATH              code directory on the workers (default agentic_grpo)
#   --skip-setup            only start the run (code and venv already there)
#   --delete                delete the slice when the run ends
#   --dry-run               print the gcloud commands instead of running them
# Everything after `--` is passed to launch/train.py.
set -euo pipefail

NAME="${TPU_NAME:-}"
ZONE="${TPU_ZONE:-}"
PROJECT="${TPU_PROJECT:-}"
ACCELERATOR="${TPU_ACCELERATOR:-v5p-64}"
VERSION="${TPU_VERSION:-v2-alpha-tpuv5}"
SPOT=0
REPO=""
REF="main"
DIR="agentic_grpo"
SKIP_SETUP=0
DELETE=0
DRY_RUN=0
GCLOUD="${GCLOUD:-gcloud}"

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

TRAIN_ARGS=()
while (( $# > 0 )); do
  case "$1" in
    --name=*) NAME="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --accelerator=*) ACCELERATOR="${1#*=}" ;;
    --version=*) VERSION="${1#*=}" ;;
    --spot) SPOT=1 ;;
    --repo=*) REPO="${1#*=}" ;;
    --ref=*) REF="${1#*=}" ;;
    --dir=*) DIR="${1#*=}" ;;
    --skip-setup) SKIP_SETUP=1 ;;
    --delete) DELETE=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage 0 ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) echo "tpu_pod.sh: unknown option '$1' (train.py arguments go after --)" >&2; exit 2 ;;
  esac
  shift
done

if [[ -z "$NAME" || -z "$ZONE" ]]; then
  echo "tpu_pod.sh: --name and --zone are required" >&2
  exit 2
fi
if [[ ! "$DIR" =~ ^[A-Za-z0-9._/-]+$ ]]; then
  echo "tpu_pod.sh: --dir must be a plain path, got '$DIR'" >&2
  exit 2
fi

COMMON=(--zone="$ZONE")
if [[ -n "$PROJECT" ]]; then COMMON+=(--project="$PROJECT"); fi

run() {
  if (( DRY_RUN )); then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

tpu() { run "$GCLOUD" compute tpus tpu-vm "$@"; }

on_all_workers() { tpu ssh "$NAME" "${COMMON[@]}" --worker=all --command="$1"; }

# 1. Slice.
if "$GCLOUD" compute tpus tpu-vm describe "$NAME" "${COMMON[@]}" >/dev/null 2>&1; then
  echo "tpu_pod.sh: reusing slice $NAME" >&2
else
  create=(create "$NAME" "${COMMON[@]}" --accelerator-type="$ACCELERATOR" --version="$VERSION")
  if (( SPOT )); then create+=(--spot); fi
  tpu "${create[@]}"
fi

# 2-3. Code and environment on every worker.
if (( ! SKIP_SETUP )); then
  if [[ -n "$REPO" ]]; then
    on_all_workers "set -e; if [ -d $DIR/.git ]; then git -C $DIR fetch -q origin; else git clone -q $(printf %q "$REPO") $DIR; fi; git -C $DIR checkout -q $(printf %q "$REF")"
  else
    ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    ARCHIVE_DIR="$(mktemp -d)"
    ARCHIVE="$ARCHIVE_DIR/code.tar.gz"
    run git -C "$ROOT" archive --format=tar.gz -o "$ARCHIVE" HEAD
    tpu scp "$ARCHIVE" "$NAME:code.tar.gz" "${COMMON[@]}" --worker=all
    rm -rf "$ARCHIVE_DIR"
    on_all_workers "set -e; mkdir -p $DIR; tar -xzf code.tar.gz -C $DIR"
  fi
  on_all_workers "set -e; cd $DIR; python3 -m venv .venv; .venv/bin/pip install -q -U pip; .venv/bin/pip install -q -e . 'jax[tpu]'"
fi

# 4. The run, on all workers at once.
QUOTED_ARGS=""
if (( ${#TRAIN_ARGS[@]} > 0 )); then QUOTED_ARGS="$(printf '%q ' "${TRAIN_ARGS[@]}")"; fi
status=0
on_all_workers "cd $DIR && AGENTIC_GRPO_DISTRIBUTED=1 .venv/bin/python -m launch.train $QUOTED_ARGS" || status=$?

if (( DELETE )); then
  tpu delete "$NAME" "${COMMON[@]}" --quiet
fi
exit "$status"
