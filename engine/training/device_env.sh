# Sourced by the scripts that run as ONE call of the `device` tool (engine/training/device_train.sh,
# benchmarks/device_bench.sh): the lent machine starts bare and offline, with an older transformers and none of
# the project's wire-format packages, so the wheels carried in .cache/gpu/whl go into a fresh folder on
# PYTHONPATH. Sets DEVICE (default cuda) and PYTHON (default python3) unless given, requires OUT (the folder that
# comes back), and sets SITE (that folder on PYTHONPATH, also usable as scratch space). Fetch the wheels here first:
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .cache/gpu/whl \
#       transformers==5.24.0 cattrs==26.2.1 attrs==26.1.0 typing_extensions==4.16.0
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
OUT=${OUT:?set OUT to the folder that comes back}
SITE=$(mktemp -d)
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .cache/gpu/whl/*.whl
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
