#!/usr/bin/env bash
# The GPU check, one command for a lent CUDA machine (benchmarks/gpu_check.py says what it
# measures; under 8 minutes on one H200). Prepared here, before the device call:
#   pip wheel --no-deps -w .whl .                                # this project's wheel
#   mkdir -p .gpu-data && cp ../shared/data/cifar10-jpg.tar.gz .gpu-data/   # real CIFAR-10 JPEGs
# (both folders are in .gitignore; the device call carries them), then on the
# machine: bash benchmarks/gpu_check.sh --commit <the commit measured>
# It installs the wheel into a private folder (the machine's own torch and timm are used) and
# writes $OUT/gpu-check.json (OUT: the device tool's result folder, else a temporary one).
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SITE="$(mktemp -d)"  # a private install folder on the lent machine
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/hfl_bench-*.whl
export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH"
OUT="${OUT:-$(mktemp -d)}"
echo "results go to $OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi here"
python3 benchmarks/gpu_check.py --data .gpu-data --out "$OUT/gpu-check.json" "$@"
