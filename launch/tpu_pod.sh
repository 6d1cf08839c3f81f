#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM pod slice: one process per TPU VM worker, joined by JAX's
# multi-controller runtime (`--multihost`: jax.distributed.initialize reads the pod's
# metadata), checkpoints in a gs:// workdir shared by all workers.
#
# Usage (from the repository root):
#   launch/tpu_pod.sh all NAME ZONE ACCELERATOR CONFIG WORKDIR [--config.a.b=v ...]
#   launch/tpu_pod.sh {create|install|run|logs|delete} NAME ZONE ACCELERATOR CONFIG WORKDIR [...]
# Example:
#   launch/tpu_pod.sh all bert-large us-central2-b v4-32 configs/bert_large.py \
#       gs://my-bucket/bert_large --config.mesh.fsdp=-1 --config.mesh.data=1 \
#       --config.data.corpus='/data/wiki/*.txt' --config.data.tokenizer.path=/data/vocab.txt
#
# `all` = create, install, run (streams every worker's output), delete. `run` again
# resumes from the newest checkpoint in WORKDIR; `logs` tails worker 0's log of a run
# started with DETACH=1. Environment: TPU_RUNTIME (software version), DETACH=1 (run in
# the background), KEEP=1 (`all` keeps the VMs).
set -euo pipefail

if [[ $# -lt 6 ]]; then
  sed -n '2,20p' "$0"; exit 2
fi
ACTION=$1 NAME=$2 ZONE=$3 ACCELERATOR=$4 CONFIG=$5 WORKDIR=$6
shift 6
OVERRIDES=("$@")
RUNTIME=${TPU_RUNTIME:-tpu-ubuntu2204-base}
TPU=(gcloud compute tpus tpu-vm)

create() {
  "${TPU[@]}" create "$NAME" --zone="$ZONE" --accelerator-type="$ACCELERATOR" \
      --version="$RUNTIME"
}

install() {  # Ship this checkout to every worker and install it with the TPU extra.
  local archive
  archive=$(mktemp -d)/bertjax.tar.gz
  git ls-files -z | tar --null -czf "$archive" -T -
  "${TPU[@]}" scp "$archive" "$NAME":bertjax.tar.gz --zone="$ZONE" --worker=all
  "${TPU[@]}" ssh "$NAME" --zone="$ZONE" --worker=all --command \
      "mkdir -p bertjax && tar -xzf bertjax.tar.gz -C bertjax && cd bertjax && pip install -e '.[tpu]'"
}

run() {
  local cmd="cd bertjax && python -m bertjax.main --config=$CONFIG --workdir=$WORKDIR --multihost"
  for o in "${OVERRIDES[@]}"; do cmd+=" $(printf '%q' "$o")"; done
  if [[ -n "${DETACH:-}" ]]; then
    cmd="nohup sh -c $(printf '%q' "$cmd") > bertjax.log 2>&1 &"
  fi
  "${TPU[@]}" ssh "$NAME" --zone="$ZONE" --worker=all --command "$cmd"
}

logs() {
  "${TPU[@]}" ssh "$NAME" --zone="$ZONE" --worker=0 --command "tail -n +1 -f bertjax.log"
}

delete() {
  "${TPU[@]}" delete "$NAME" --zone="$ZONE" --quiet
}

case "$ACTION" in
  create|install|run|logs|delete) "$ACTION" ;;
  all) create; install; run; [[ -n "${KEEP:-}" ]] || delete ;;
  *) echo "unknown action '$ACTION'; use create, install, run, logs, delete or all" >&2; exit 2 ;;
esac
