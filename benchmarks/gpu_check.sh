#!/usr/bin/env bash
# The GPU check of the fast-simulation work, as one prepared command for a lent CUDA machine:
# installs this project's wheel (built beforehand into .whl/ with `pip wheel --no-deps -w .whl .`)
# into a private folder, then runs the gpu benchmark preset (synthetic CIFAR-10, paper pool).
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/hfl_bench-*.whl
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)"
python3 benchmarks/bench_round.py --preset gpu --out "${OUT:-/tmp}/gpu-bench.json" "$@"
