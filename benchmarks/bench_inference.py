"""Evaluation-inference options on this machine's CPU (or a GPU), one process, ratios.

For each model (HtFLlib's FedAvgCNN on 1x28x28, the ``cpu`` pool's members on digits-sized and
CIFAR-sized inputs) it times the logits of a test-set-sized batch under: ``torch.no_grad`` with
the engine's chunk size (today's path), ``torch.inference_mode``, channels-last inputs and
weights, other chunk sizes, and a traced, frozen graph (``torch.jit.freeze`` with
``optimize_for_inference``). Medians over repeats, images per second, and each option's speed
against the baseline. Results: ``benchmarks/results/inference-<device>.json``.

    OMP_NUM_THREADS=1 python benchmarks/bench_inference.py [--n 4096] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hfl_bench.data import TaskInfo  # noqa: E402
from hfl_bench.pools import PoolMember, build_model, get_pool  # noqa: E402
from hfl_bench.training import inference_chunk  # noqa: E402

import htfl_pool  # noqa: E402,F401  (registers htfl_fedavgcnn)

SHAPES = {"mnist-28": (1, 28, 28), "digits-8": (1, 8, 8), "cifar-32": (3, 32, 32)}


def info_for(shape) -> TaskInfo:
    return TaskInfo(name="bench", version="0", num_classes=10, input_shape=shape, source="", citation="", license="")


def timed(fn, repeats: int) -> float:
    fn()  # warm-up (allocations, oneDNN primitive creation, tracing)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_chunks(model, x, chunk, ctx):
    with ctx():
        return torch.cat([model(x[i : i + chunk]) for i in range(0, len(x), chunk)])


def options(model: torch.nn.Module, x: torch.Tensor) -> dict:
    base_chunk = inference_chunk(x)
    opts = {
        f"no_grad, chunk {base_chunk} (today)": lambda: run_chunks(model, x, base_chunk, torch.no_grad),
        f"inference_mode, chunk {base_chunk}": lambda: run_chunks(model, x, base_chunk, torch.inference_mode),
    }
    for chunk in sorted({256, 1024, 4096} - {base_chunk}):
        opts[f"inference_mode, chunk {chunk}"] = (
            lambda c: lambda: run_chunks(model, x, c, torch.inference_mode))(chunk)
    if x.dim() == 4:
        xl = x.contiguous(memory_format=torch.channels_last)
        m_cl = _copy(model).to(memory_format=torch.channels_last)
        opts[f"channels-last, inference_mode, chunk {base_chunk}"] = (
            lambda: run_chunks(m_cl, xl, base_chunk, torch.inference_mode))
    try:
        with torch.no_grad():
            frozen = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(_copy(model), x[:base_chunk])))
        opts[f"traced+frozen, chunk {base_chunk}"] = lambda: run_chunks(frozen, x, base_chunk, torch.no_grad)
    except Exception as e:  # noqa: BLE001  a model that cannot be traced is reported, not fatal
        opts[f"traced+frozen (failed: {type(e).__name__})"] = None
    return opts


def _copy(model):
    import copy

    return copy.deepcopy(model).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="test images per timing")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    cases = [("fedavgcnn", PoolMember("htfl_fedavgcnn"), "mnist-28")]
    cases += [(m.name, m, "digits-8") for m in get_pool("cpu").members]
    cases += [(m.name, m, "cifar-32") for m in get_pool("cpu").members]
    rows = []
    for name, member, shape_name in cases:
        shape = SHAPES[shape_name]
        model = build_model(member, info_for(shape)).to(args.device).eval()
        x = torch.randn(args.n, *shape, device=args.device)
        base = None
        for label, fn in options(model, x).items():
            if fn is None:
                rows.append({"model": name, "input": shape_name, "option": label, "images_per_s": None})
                continue
            sec = timed(fn, args.repeats)
            base = base or sec
            rows.append({"model": name, "input": shape_name, "option": label,
                         "images_per_s": round(args.n / sec), "speed_vs_today": round(base / sec, 3)})
            print(f"{name:12s} {shape_name:9s} {label:45s} {args.n / sec:10.0f} img/s  x{base / sec:.2f}", flush=True)
    out = Path(__file__).parent / "results" / f"inference-{args.device.split(':')[0]}.json"
    out.write_text(json.dumps({
        "what": "evaluation inference options, medians of repeats, one process",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(),
        "n_images": args.n, "repeats": args.repeats, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
