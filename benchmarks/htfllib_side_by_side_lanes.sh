#!/usr/bin/env bash
# The side-by-side study of docs/studies/htfllib.md (issue 31) in two lanes, one per core, each a
# chain of resumable harness runs: the CIFAR-10 folder first (three seeds), then HtFLlib's MNIST
# split one seed at a time. Rerunning a lane's command continues where it stopped (--resume keeps
# finished runs; a run stopped midway is rerun). Each lane writes its own results files into
# OUTDIR; `htfllib_side_by_side.py --merge` joins the two lanes' files of one folder afterwards.
#
#   HTFLLIB=<HtFLlib git checkout> CIFAR=<folder of pfl_cifar10.py> MNIST=<mnist-htfl folder> \
#       bash benchmarks/htfllib_side_by_side_lanes.sh A|B OUTDIR
#
# Run it from a clean checkout of hfl-bench (the results record its commit), one process per lane.
set -euo pipefail
lane="${1:?lane A or B}"
outdir="${2:?an output folder}"
here="$(cd "$(dirname "$0")" && pwd)"
: "${HTFLLIB:?HTFLLIB=<HtFLlib git checkout>}" "${CIFAR:?CIFAR=<CIFAR-10 folder>}" "${MNIST:?MNIST=<mnist-htfl folder>}"
case "$lane" in
    # FedTGP (100 server epochs a round) is the costliest method, so it shares a lane with the
    # cheaper two; local, the control, comes first.
    A) cifar_methods=(local fedproto lg-fedavg); mnist_methods=(fedproto lg-fedavg fedgh) ;;
    B) cifar_methods=(fedgh fedtgp fd); mnist_methods=(fedtgp fd local) ;;
    *) echo "lane must be A or B, got: $lane" >&2; exit 2 ;;
esac
mkdir -p "$outdir"
harness=(python "$here/htfllib_side_by_side.py" --htfllib "$HTFLLIB" --rounds 30 --shared-init --threads 1 --resume)
OMP_NUM_THREADS=1 "${harness[@]}" --data "$CIFAR" --methods "${cifar_methods[@]}" --seeds 0 1 2 \
    --out "$outdir/cifar10-$lane.json"
for seed in 0 1 2; do  # MNIST rounds cost about 4x CIFAR's: every method's seed 0 comes first
    OMP_NUM_THREADS=1 "${harness[@]}" --data "$MNIST" --methods "${mnist_methods[@]}" --seeds $(seq 0 "$seed") \
        --out "$outdir/mnist-$lane.json"
done
