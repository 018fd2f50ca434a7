#!/usr/bin/env bash
# Train on a Cloud TPU VM slice: create it, install the code on every worker, run the training
# CLI on all workers at once (one JAX process per worker; they find each other through the TPU
# metadata server), stream their logs here, and delete the slice at the end.
#
# Usage:
#   launch/tpu_vm.sh [options] CONFIG WORKDIR [-- extra flags for transformer_jax.main]
#
#   CONFIG   a config file, relative to the repository (e.g. configs/tpu.py or configs/tpu.py:big)
#   WORKDIR  the run folder as the workers see it; it must be shared by all workers (an NFS
#            share such as Filestore, see --nfs), since Orbax checkpoints are written jointly,
#            or a bucket URL gs://BUCKET/PATH (the workers then also install gcsfs).
#
# Options:
#   --dry-run          print every command (one per line, starting with '+') and run none
#   --name NAME        TPU VM name (default: transformer-jax-$USER)
#   --zone ZONE        zone (default: $TPU_ZONE or us-west4-a)
#   --project PROJECT  project (default: gcloud's configured project)
#   --type TYPE        accelerator type (default: v5litepod-64, i.e. TPU v5e with 64 chips)
#   --version VERSION  TPU software version (default: v2-alpha-tpuv5-lite)
#   --spot             use Spot capacity (preemptible: the run resumes from its last checkpoint)
#   --nfs SERVER:PATH  mount this NFS export at /mnt/shared on every worker first
#   --data-dir DIR     TRANSFORMER_JAX_DATA_DIR on the workers (default: /mnt/shared/data)
#   --reuse            the VM exists already: skip creating it
#   --keep             do not delete the VM at the end
#   --log FILE         also append the streamed logs to FILE (default: NAME.log here)
#
# Example:
#   launch/tpu_vm.sh --nfs 10.0.0.2:/share configs/tpu.py /mnt/shared/runs/base -- \
#       --config.train.num_steps=100000
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

DRY_RUN=0
NAME="transformer-jax-${USER:-user}"
ZONE="${TPU_ZONE:-us-west4-a}"
PROJECT=""
TYPE="v5litepod-64"
VERSION="v2-alpha-tpuv5-lite"
SPOT=0
NFS=""
DATA_DIR="/mnt/shared/data"
REUSE=0
KEEP=0
LOG=""
POSITIONAL=()
EXTRA=()

while (($#)); do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --name) NAME="$2"; shift ;;
    --zone) ZONE="$2"; shift ;;
    --project) PROJECT="$2"; shift ;;
    --type) TYPE="$2"; shift ;;
    --version) VERSION="$2"; shift ;;
    --spot) SPOT=1 ;;
    --nfs) NFS="$2"; shift ;;
    --data-dir) DATA_DIR="$2"; shift ;;
    --reuse) REUSE=1 ;;
    --keep) KEEP=1 ;;
    --log) LOG="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) POSITIONAL+=("$1") ;;
  esac
  shift
done
if ((${#POSITIONAL[@]} != 2)); then
  echo "error: expected CONFIG and WORKDIR (see --help)" >&2
  exit 2
fi
CONFIG="${POSITIONAL[0]}"
WORKDIR="${POSITIONAL[1]}"
LOG="${LOG:-${NAME}.log}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CONFIG_FILE="${CONFIG%%:*}"
if [[ ! -f "$REPO/$CONFIG_FILE" ]]; then
  echo "error: config file $CONFIG_FILE not found in $REPO" >&2
  exit 2
fi

# A command as one line of shell: words with special characters in single quotes.
quote() {
  local out="" word
  for word in "$@"; do
    if [[ "$word" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
      out+=" $word"
    else
      out+=" '${word//\'/\'\\\'\'}'"
    fi
  done
  printf '%s\n' "${out# }"
}

# Runs a command, or only prints it (--dry-run).
run() {
  echo "+ $(quote "$@")"
  if ((!DRY_RUN)); then
    "$@"
  fi
}

GCLOUD_FLAGS=(--zone="$ZONE")
if [[ -n "$PROJECT" ]]; then
  GCLOUD_FLAGS+=(--project="$PROJECT")
fi

on_all_workers() {  # on_all_workers COMMAND: runs COMMAND (a shell string) on every worker
  run gcloud compute tpus tpu-vm ssh "$NAME" "${GCLOUD_FLAGS[@]}" --worker=all --command="$1"
}

cleanup() {
  if ((!KEEP)); then
    run gcloud compute tpus tpu-vm delete "$NAME" "${GCLOUD_FLAGS[@]}" --quiet
  else
    echo "# kept $NAME; delete it with: gcloud compute tpus tpu-vm delete $NAME --zone=$ZONE"
  fi
}

# 1. The slice.
if ((!REUSE)); then
  CREATE=(gcloud compute tpus tpu-vm create "$NAME" "${GCLOUD_FLAGS[@]}"
          --accelerator-type="$TYPE" --version="$VERSION")
  if ((SPOT)); then
    CREATE+=(--spot)
  fi
  run "${CREATE[@]}"
fi
trap cleanup EXIT

# 2. The code: this checkout's committed HEAD, copied to every worker.
SHA="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
TARBALL="${TMPDIR:-/tmp}/transformer_jax-${SHA}.tar.gz"
run git -C "$REPO" archive --format=tar.gz --output="$TARBALL" HEAD
run gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME:transformer_jax.tar.gz" "${GCLOUD_FLAGS[@]}" \
  --worker=all

# 3. Install (and mount the shared folder) on every worker.
SETUP="set -e; rm -rf ~/transformer_jax && mkdir -p ~/transformer_jax"
SETUP+=" && tar -xzf ~/transformer_jax.tar.gz -C ~/transformer_jax"
SETUP+=" && python3 -m pip install -q -U pip"
PACKAGES="'jax[tpu]'"
if [[ "$WORKDIR" == gs://* ]]; then
  PACKAGES+=" gcsfs"  # the workdir's own files (lock, metrics, vocabulary) go through fsspec
fi
SETUP+=" && python3 -m pip install -q -e ~/transformer_jax $PACKAGES"
if [[ -n "$NFS" ]]; then
  SETUP+=" && (mountpoint -q /mnt/shared || (sudo apt-get -qq update && sudo apt-get -qq install -y nfs-common"
  SETUP+=" && sudo mkdir -p /mnt/shared && sudo mount -t nfs -o rw,hard $NFS /mnt/shared))"
fi
on_all_workers "$SETUP"

# 4. Train: the same command on every worker; output streamed here and appended to $LOG.
TRAIN=(python3 -m transformer_jax.main "--config=$CONFIG" "--workdir=$WORKDIR" "${EXTRA[@]}")
# pipefail: the worker's exit status is the trainer's, not tee's (a failed run must not report success).
RUN="set -o pipefail && cd ~/transformer_jax && export TRANSFORMER_JAX_DATA_DIR=$(quote "$DATA_DIR")"
RUN+=" && $(quote "${TRAIN[@]}") 2>&1 | tee -a ~/train.log"
if ((DRY_RUN)); then
  on_all_workers "$RUN"
  echo "# (logs would be appended to $LOG)"
else
  on_all_workers "$RUN" 2>&1 | tee -a "$LOG"
fi
