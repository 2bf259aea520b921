#!/usr/bin/env bash
# The GPU check of the fast-simulation work, as one prepared command for a lent CUDA machine:
# installs this project's wheel (built beforehand into .whl/ with `pip wheel --no-deps -w .whl .`)
# into a private folder, then measures, most informative first (a lent machine's time may run out;
# every result file is written as it grows):
#   1. student training per architecture, loop vs --lockstep on (synthetic CIFAR-10, paper pool);
#   2. the gpu preset of bench_round.py: N = 10 fast and fast+lockstep, then N = 100, 20, 50, then
#      fast+vmap and the reference path.
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SITE="$(mktemp -d)"  # a private install folder on the lent machine
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/hfl_bench-*.whl
export PYTHONPATH="$SITE"
OUT="${OUT:-$(mktemp -d)}"
echo "results go to $OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)"
python3 benchmarks/bench_lockstep.py --task synthetic-cifar10 --pool paper --train-size 10000 --device cuda \
    --repeats 3 --out "$OUT/gpu-lockstep-families.json"
python3 benchmarks/bench_round.py --preset gpu --out "$OUT/gpu-bench.json" "$@"
