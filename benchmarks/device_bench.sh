#!/usr/bin/env bash
# Issue 5's GPU figures for the shipped model, as part of ONE call of the `device` tool.
#
# On these 2 CPU cores a batch of 4 canvases costs more than twice one (benchmarks/README.md), so four clients
# cannot get 2.5 times the throughput of one; on a GPU a step of this small model costs the same for 1 or 4 rows.
# This runs the same two scripts as on the CPU, with the engine on CUDA (bfloat16):
#   benchmarks.engine_vs_generate  -> $OUT/engine_vs_generate_gpu.json   (speedup_median)
#   benchmarks.concurrency         -> $OUT/concurrency_gpu.json          (throughput_ratio_4_vs_1)
#
# The device machine needs the wheels that engine/training/device_env.sh installs (its header says how to fetch
# them here first); then, with training in the same call (device_train.sh also needs .cache/gpu/corpus.jsonl.gz):
#   run(command="export OUT; bash benchmarks/device_bench.sh && bash engine/training/device_train.sh 5",
#       carry=[".cache/gpu"], timeout_s=590)
# Dry run on a CPU:  DEVICE=cpu PYTHON=.venv/bin/python SECONDS_PER_RUN=5 REQUESTS=4 OUT=/tmp/out \
#                    bash benchmarks/device_bench.sh
set -euo pipefail

SECONDS_PER_RUN=${SECONDS_PER_RUN:-20}
REQUESTS=${REQUESTS:-40}
source engine/training/device_env.sh  # DEVICE, PYTHON and OUT; the carried wheels on PYTHONPATH; sets SITE
"$PYTHON" -m benchmarks.engine_vs_generate --device "$DEVICE" --requests "$REQUESTS" \
    --out "$OUT/engine_vs_generate_gpu.json" | grep -E '"(device|speedup_median|engine_ms_median|generate_ms_median)"'
"$PYTHON" -m benchmarks.concurrency --device "$DEVICE" --seconds "$SECONDS_PER_RUN" \
    --out "$OUT/concurrency_gpu.json" | grep -E '"(per_s|latency_p50_ms|throughput_ratio_4_vs_1)"'
rm -f "$OUT"/*.png  # $OUT gives back at most 8 files, and device_train.sh's model and log need 4 of them
