#!/usr/bin/env bash
# Continue training the shipped model on a lent GPU machine, as ONE call of the `device` tool.
#
# That machine starts bare, reaches no network, takes at most 64 MiB of files with the repository, and gives back
# at most 8 files of 16 MiB from $OUT. So, here first (see engine/training/README.md, "On a lent GPU"):
#
#   python -m diffgemma_engine.training.pack --out .cache/gpu/corpus.jsonl.gz --max-mb 34
#   and the wheels that engine/training/device_env.sh installs (its header has the pip download command)
#
# then   run(command="export OUT; bash engine/training/device_train.sh 6", carry=[".cache/gpu"], timeout_s=570)
# and    python -m diffgemma_engine.training.export --src <files_at>/model    (or copy its three files into engine/default_model)
#
# It trains from engine/default_model's weights for MINUTES (first argument, default 6) with a fresh optimizer,
# after a 30-second smoke run that fails fast, and leaves in $OUT: model/ (config, weights, generation config)
# and train.log. The examples are the recipe's (engine/training/data.py: the cursor anywhere, the line canvas for
# the rest of a line). SIZE=<a size of engine/training/configs.py other than mini> trains that size from scratch
# instead (a larger model for a GPU's budget: SIZE=tiny, 8.0 M parameters, is the largest whose keystroke replay
# keeps p50 <= 100 ms and p95 <= 250 ms on the 2-core CPU, python -m benchmarks.size_sweep). DEVICE, PYTHON, BATCH
# and WORKERS can be overridden, e.g. for a dry run on a CPU:
#   DEVICE=cpu PYTHON=.venv/bin/python BATCH=8 WORKERS=2 OUT=/tmp/out bash engine/training/device_train.sh 0.3
set -euo pipefail

MINUTES=${1:-6}
BATCH=${BATCH:-512}
WORKERS=${WORKERS:-12}
SIZE=${SIZE:-mini}
source engine/training/device_env.sh  # DEVICE, PYTHON and OUT; the carried wheels on PYTHONPATH; sets SITE
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"

start=(--init engine/default_model)  # the shipped weights (mini); another size starts from scratch
[ "$SIZE" = mini ] || start=()
common=(--device "$DEVICE" --corpus .cache/gpu/corpus.jsonl.gz --size "$SIZE" "${start[@]}" --workers "$WORKERS"
    --batch "$BATCH" --lr 2e-3 --warmup 100 --save-minutes 1000)
"$PYTHON" -m diffgemma_engine.training.train "${common[@]}" --out "$SITE/smoke" --minutes 0.5 --eval-minutes 1000 --n-em 2 \
    | grep -v '"event": "train"' | cut -c1-400
"$PYTHON" -m diffgemma_engine.training.train "${common[@]}" --out "$SITE/run" --minutes "$MINUTES" --eval-minutes 2 \
    | grep -v '"event": "train"' | cut -c1-600
"$PYTHON" -m diffgemma_engine.training.export --src "$SITE/run/last" --dst "$OUT/model"
cp "$SITE/run/train.log" "$OUT/train.log"
