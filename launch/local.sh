#!/usr/bin/env bash
# Run N processes on this machine as one multi-host job (JAX multi-controller runtime,
# gloo collectives on CPU): the way to rehearse a pod launch on a laptop.
#
# Usage (from the repository root):
#   launch/local.sh NUM_PROCESSES CONFIG WORKDIR [--config.a.b=v ...]
# Example, 2 processes x 4 CPU devices = an 8-device mesh split across 2 "hosts":
#   DEVICES_PER_PROCESS=4 launch/local.sh 2 configs/bert_tiny.py /tmp/bert_tiny_mh \
#       --config.mesh.dcn_data=2
# Environment: DEVICES_PER_PROCESS (CPU devices each, default 4), PORT (coordinator
# port, default 12355), PYTHON (interpreter, default python). Logs: WORKDIR/process_I.log.
# Ctrl-C (or SIGTERM) is forwarded to every process: they save at the same step and exit.
set -euo pipefail

if [[ $# -lt 3 ]]; then
  sed -n '2,14p' "$0"; exit 2
fi
NUM=$1 CONFIG=$2 WORKDIR=$3
shift 3
mkdir -p "$WORKDIR"
PIDS=()
trap 'kill -TERM "${PIDS[@]}" 2>/dev/null || true' INT TERM
for ((i = 0; i < NUM; i++)); do
  JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=${DEVICES_PER_PROCESS:-4} \
    ${PYTHON:-python} -m bertjax.main --config="$CONFIG" --workdir="$WORKDIR" \
      --coordinator_address="127.0.0.1:${PORT:-12355}" --num_processes="$NUM" \
      --process_id="$i" "$@" > "$WORKDIR/process_$i.log" 2>&1 &
  PIDS+=($!)
done
status=0
for pid in "${PIDS[@]}"; do wait "$pid" || status=$?; done
tail -n 3 "$WORKDIR/process_0.log"
exit $status
