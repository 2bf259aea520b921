"""Per-round cost of the peer-KD backbone: reference (per-batch, Algorithm 1) vs fast
(teacher-major) path, split into teacher inference / aggregation / training / evaluation, with
peak memory, bytes and achieved FLOP/s against a measured matmul ceiling.

Run on demand (never as a timed test):

    python benchmarks/bench_round.py --preset cpu            # this machine: digits + small synthetic CIFAR
    python benchmarks/bench_round.py --preset gpu            # a CUDA machine: synthetic CIFAR-10, paper pool

Each (task, N) setting runs in its own subprocess, so its peak memory is its own; the two paths
of one setting run in the same process, one after the other, so their ratio is measured under the
same conditions. Times are medians over the rounds after the first (warm-up) round.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = {
    # digits with the CPU pool and a small CIFAR-shaped synthetic set with the paper pool
    "cpu": [
        dict(task="digits", pool="cpu", clients=[10, 20, 50, 100], rounds=6, paths=["reference", "fast"]),
        dict(task="synthetic-cifar10", pool="paper", clients=[10], rounds=2, paths=["reference", "fast"],
             train_size=400, test_size=100),
        # memory of 100 paper-pool clients (10 active); the data is kept small so a round is quick
        dict(task="synthetic-cifar10", pool="paper", clients=[100], rounds=2, paths=["fast"],
             train_size=2000, test_size=100, flops=False),
    ],
    "gpu": [
        # the most informative rows first: a lent machine's time may run out
        dict(task="synthetic-cifar10", pool="paper", clients=[10, 100, 20, 50], rounds=3, paths=["fast"]),
        dict(task="synthetic-cifar10", pool="paper", clients=[10], rounds=2, paths=["reference"]),
    ],
}


def matmul_ceiling(device: str) -> dict[str, float]:
    """Measured FLOP/s of a large matrix product on the device (median of repeats)."""
    import torch

    out = {}
    dtypes = [("fp32", torch.float32)] + ([("bf16", torch.bfloat16)] if device.startswith("cuda") else [])
    n = 8192 if device.startswith("cuda") else 1024
    for name, dtype in dtypes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        times = []
        for i in range(8):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            a @ b
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t)
        out[name] = 2 * n**3 / statistics.median(times)
    return out


def child(spec: dict) -> None:
    """One setting in this process: every requested path, each printed as a JSON line as soon as
    it is measured (a failing path records its error and the others still run), then the peak RSS."""
    import resource
    import traceback

    import torch

    from hfl_bench.data import get_task

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    task = get_task(spec["task"])
    if spec.get("train_size"):  # shrink the synthetic benchmark data (benchmark-only knob)
        type(task).n_train, type(task).n_test = spec["train_size"], spec["test_size"]
    for path in spec["paths"]:
        try:
            entry = measure_path(spec, path, task)
        except Exception:
            entry = {"error": traceback.format_exc()[-2000:]}
        print(json.dumps({"path": path, "entry": entry}), flush=True)
    print(json.dumps({"cpu_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)


def measure_path(spec: dict, path: str, task) -> dict:
    """Run one path of one setting; with FLOP counting, one more fast round under the counter."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from hfl_bench.config import RunConfig, resolve
    from hfl_bench.engine import Simulation

    cfg = resolve(RunConfig(
        method=spec["method"], task=spec["task"], pool=spec["pool"], clients=spec["clients"],
        clients_per_round=min(spec["active"], spec["clients"]), rounds=spec["rounds"], exec=path,
        device=spec["device"], seed=spec["seed"], out="/dev/null",
    ), task.info.defaults)
    sim = Simulation(cfg)
    if sim.fed.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = sim.run()
    rounds = result.history[2:] or result.history[1:]
    phases: dict[str, list[float]] = {}
    for h in rounds:
        for k, v in h["phases"].items():
            phases.setdefault(k, []).append(v)
    fed = result.fed
    entry = {
        "round_s": statistics.median(h["seconds"] for h in rounds),
        "phases_s": {k: statistics.median(v) for k, v in phases.items()},
        "bytes_per_round": statistics.median(h["bytes"] for h in rounds),
        "selected": {"round": result.best.round, "global_acc": float(result.best.global_acc.mean()),
                     "mean_val": result.best.mean_val},
        "model_state_bytes": sum(sum(t.numel() * t.element_size() for t in c.model.state_dict().values())
                                 for c in fed.clients),
        "cuda_peak_bytes": torch.cuda.max_memory_allocated() if fed.device.type == "cuda" else None,
    }
    if path == "fast" and spec["flops"]:
        with FlopCounterMode(display=False) as counter:
            sim.step(spec["rounds"] + 1)
        entry["flops_per_round"] = counter.get_total_flops()
        entry["achieved_flops"] = entry["flops_per_round"] / entry["round_s"]
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--method", default="crad")
    ap.add_argument("--device", default=None, help="default: cuda for the gpu preset, else cpu")
    ap.add_argument("--active", type=int, default=10, help="active clients per round")
    ap.add_argument("--clients", default=None, help="comma-separated N values to keep (default: the preset's)")
    ap.add_argument("--tasks", default=None, help="comma-separated tasks to keep (default: the preset's)")
    ap.add_argument("--paths", default=None, help="comma-separated paths to keep: reference, fast")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1 is the steady choice on 2 cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-flops", action="store_true", help="skip the FLOP count")
    ap.add_argument("--out", default=None, help="JSON result path (default benchmarks/results/<preset>-<time>.json)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    device = args.device or ("cuda" if args.preset == "gpu" else "cpu")
    out = Path(args.out or f"benchmarks/results/{args.preset}-{dt.datetime.now():%Y%m%d-%H%M%S}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": device,
              "matmul_flops": matmul_ceiling(device), "platform": platform_info(device), "rows": []}
    keep = {int(n) for n in args.clients.split(",")} if args.clients else None
    for block in PRESETS[args.preset]:
        if args.tasks and block["task"] not in args.tasks.split(","):
            continue
        for n in block["clients"]:
            if keep is not None and n not in keep:
                continue
            spec = dict(dict(flops=not args.no_flops), **block)
            if args.paths:
                spec["paths"] = [p for p in spec["paths"] if p in args.paths.split(",")]
                if not spec["paths"]:
                    continue
            spec.update(clients=n, method=args.method, device=device, active=args.active, threads=args.threads,
                        seed=args.seed)
            row = {"spec": spec, "paths": {}, "cpu_peak_rss_bytes": None}
            report["rows"].append(row)
            run_child(row, args.threads, lambda: out.write_text(json.dumps(report, indent=1) + "\n"))
    print_table(report)
    print(f"written to {out}")


def run_child(row: dict, threads: int, save) -> None:
    """Measure one setting in a subprocess, saving the report after every path it finishes, so a
    run stopped early (a lent machine's time running out) keeps what was measured."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(row["spec"])],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "path" in msg:
                row["paths"][msg["path"]] = msg["entry"]
                print_path(row["spec"], msg["path"], msg["entry"])
            else:
                row.update(msg)
            save()
        if proc.wait() != 0:
            err.seek(0)
            row["error"] = err.read()[-2000:]
            print(row["error"], file=sys.stderr)
            save()


def platform_info(device: str) -> dict:
    import platform

    import torch

    from hfl_bench.provenance import git_info

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "code": git_info()}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def print_path(s: dict, path: str, r: dict) -> None:
    head = f"{s['task']:>18} N={s['clients']:<3} {path:>13}:"
    if "error" in r:
        print(head, "failed:", r["error"].strip().splitlines()[-1], flush=True)
    else:
        print(head, f"{r['round_s']:.3f} s/round { {k: round(v, 3) for k, v in r['phases_s'].items()} }", flush=True)


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"per-round cost on {report['device']} ({report['platform'].get('gpu', 'CPU')})")
    for col in ("task", "N", "path", "s/round", "teacher", "aggregation", "training", "evaluation", "MB sent",
                "peak mem MB", "GFLOP/s", "% of matmul"):
        t.add_column(col, justify="right")
    peak = max(report["matmul_flops"].values())
    for row in report["rows"]:
        s = row["spec"]
        if "error" in row and not row["paths"]:
            t.add_row(s["task"], str(s["clients"]), "error", *["-"] * 9)
            continue
        for path, r in row["paths"].items():
            if "error" in r:
                t.add_row(s["task"], str(s["clients"]), path, "error", *["-"] * 8)
                continue
            ph = r["phases_s"]
            mem = r["cuda_peak_bytes"] if r["cuda_peak_bytes"] is not None else (row["cpu_peak_rss_bytes"] or 0)
            fl = r.get("achieved_flops")
            t.add_row(s["task"], str(s["clients"]), path, f"{r['round_s']:.3f}",
                      f"{ph.get('teacher_inference', 0):.3f}", f"{ph.get('aggregation', 0):.3f}",
                      f"{ph.get('training', ph.get('training_with_teachers', 0)):.3f}",
                      f"{ph.get('evaluation', 0):.3f}", f"{r['bytes_per_round'] / 1e6:.1f}", f"{mem / 2**20:.0f}",
                      "-" if fl is None else f"{fl / 1e9:.1f}", "-" if fl is None else f"{100 * fl / peak:.1f}")
    Console(width=200).print(t)
    print("matmul ceiling (FLOP/s):", {k: f"{v / 1e12:.2f} T" for k, v in report["matmul_flops"].items()})
    for row in report["rows"]:
        p = {k: v for k, v in row.get("paths", {}).items() if "error" not in v}
        if "reference" in p and "fast" in p:
            print(f"{row['spec']['task']} N={row['spec']['clients']}: fast is "
                  f"{p['reference']['round_s'] / p['fast']['round_s']:.1f}x faster per round; selected round "
                  f"reference {p['reference']['selected']} vs fast {p['fast']['selected']}")


if __name__ == "__main__":
    main()
