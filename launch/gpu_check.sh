#!/usr/bin/env bash
# The GPU check (benchmarks/gpu.py) on a device machine that reaches no package
# index: installs the wheels of .wheels/ (built here by `python launch/gpu_wheels.py`),
# then runs `python -m benchmarks gpu` under a time limit, from the repository
# root, writing into $OUT (gpu.txt, gpu.json, tests.log, profile.xplane.pb; gpu.log:
# everything printed). Extra arguments go to the benchmark (e.g. --parts=smoke,kernels).
#
#   device tool: command "bash launch/gpu_check.sh", carry [".wheels"], timeout_s 600
#   LIMIT_S (default 560): the seconds the benchmark may run, its --budget_s (510) and
#   the report included.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/bertjax_gpu}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-cache-dir --find-links .wheels \
    -r .wheels/requirements.txt 2>&1 | tee "$out/gpu.log" || exit 1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout -k 15 "${LIMIT_S:-560}" python3 -m benchmarks gpu --out="$out" "$@" 2>&1 \
    | tee -a "$out/gpu.log"
