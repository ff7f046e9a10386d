#!/usr/bin/env bash
# Issue 20's GPU figures, as ONE call of the `device` tool: the release's 26B-A4B shape (random bf16 weights), the
# engine's eager loop against the capturable step (engine/canvas/static_step.py) run op by op and captured as a
# CUDA graph (torch.compile mode="reduce-overhead"), ms per step and tokens/s beside the bandwidth floor.
#
# Canvas 256 first (the bar: within 2x of the floor, 22 ms or less on an H200), then 64 and 32; each row is
# written to $OUT/gpu_shape.json as soon as it is measured, so a call cut short keeps what it got. A CUDA graph is
# compiled once per canvas (about a minute or more each at the release's depth: the call's budget goes there).
#
# The machine needs the wheels that engine/training/device_env.sh installs (its header says how to fetch them):
#   run(command="export OUT; bash benchmarks/device_step.sh", carry=[".cache/gpu"], timeout_s=570)
# Dry run on a CPU (small shape, a few steps):
#   DEVICE=cpu PYTHON=.venv/bin/python SHAPE=small STEPS=2,4 PROMPT=64 OUT=/tmp/out bash benchmarks/device_step.sh
set -euo pipefail

SHAPE=${SHAPE:-release}
CANVASES=${CANVASES:-256,64,32}
STEPS=${STEPS:-8,16,48}
PROMPT=${PROMPT:-1024}
source engine/training/device_env.sh  # DEVICE, PYTHON and OUT; the carried wheels on PYTHONPATH
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"$PYTHON" -m benchmarks.gpu_shape --shape "$SHAPE" --canvases "$CANVASES" --steps "$STEPS" --prompt "$PROMPT" \
    --loops eager static captured --out "$OUT/gpu_shape.json"
