"""Student training per architecture: the plain loop against lockstep (``--lockstep on``).

Run on demand (never as a timed test):

    python benchmarks/bench_lockstep.py                                   # digits, CPU pool, this machine
    python benchmarks/bench_lockstep.py --task synthetic-cifar10 --pool paper --train-size 10000 --device cuda

For each architecture of the pool, the clients that have it train one epoch of their round-1
plans with peer-KD-shaped targets (lambda 0.7, T 2), alternately through the loop and in
lockstep, in one process; times are medians over repeats, and the ratio (loop / lockstep; above 1
means lockstep is faster) is what decides whether ``--lockstep auto`` should use it for that
family on that device.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path


def measure(args) -> dict:
    import torch

    from hfl_bench import engine, lockstep
    from hfl_bench.config import RunConfig, resolve
    from hfl_bench.data import get_task
    from hfl_bench.paths import portable_path
    from hfl_bench.training import make_plan

    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    if args.train_size:  # shrink the synthetic benchmark data (benchmark-only knob)
        type(task).n_train, type(task).n_test = args.train_size, 100
    cfg = resolve(RunConfig(task=args.task, pool=args.pool, clients=args.clients, seed=0, device=args.device),
                  task.info.defaults)
    device = engine.pick_device(cfg.device)
    fed = engine.build_federation(cfg, task.info, task.load(cfg.data_dir), device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    families: dict[str, list[int]] = {}
    for c in fed.clients:
        families.setdefault(c.arch.name, []).append(c.cid)
    rows = []
    for name, ids in families.items():
        plans = {i: make_plan(fed, i, 1) for i in ids}
        gen = torch.Generator().manual_seed(0)
        targets = {i: torch.softmax(torch.randn(len(plans[i]), fed.num_classes, generator=gen), -1).to(device)
                   for i in ids}
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.repeats + 1):  # the first pass of each mode is a warm-up
            for mode in ("off", "on"):
                fed.cfg.lockstep = mode
                sync()
                t = time.perf_counter()
                lockstep.train_students(fed, ids, plans, targets=targets, lam=0.7, temperature=2.0)
                sync()
                times[mode].append(time.perf_counter() - t)
        loop, stacked = statistics.median(times["off"][1:]), statistics.median(times["on"][1:])
        steps = sum(len(p.bounds) for p in plans.values())
        rows.append({"arch": name, "students": len(ids), "sgd_steps": steps, "loop_s": loop, "lockstep_s": stacked,
                     "speedup": loop / stacked})
        print(f"{name:>16}: {len(ids)} students, {steps} steps: loop {loop * 1e3:.1f} ms, lockstep "
              f"{stacked * 1e3:.1f} ms, lockstep speed-up {loop / stacked:.2f}x", flush=True)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": str(device),
            "gpu": gpu, "torch": torch.__version__,
            "args": {**vars(args), "out": portable_path(args.out, "<out file>")}, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="digits")
    ap.add_argument("--pool", default="cpu")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--train-size", type=int, default=None, help="synthetic tasks: training images")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON result path (default: print only)")
    args = ap.parse_args()
    report = measure(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
