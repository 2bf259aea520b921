"""The GPU check: one command on a lent GPU, one JSON (``benchmarks/gpu_check.sh`` runs it).

Stages, most informative first (each runs in a subprocess of its own, with its own time limit;
the JSON is rewritten after every stage, so a machine whose time runs out keeps what was measured):

1. ``round``: the paper-scale round. ``crad``, the paper pool, N = 10 (all active), Dirichlet 0.3,
   every CIFAR-10 image through the ``imagefolder`` task (real JPEGs, decoded once and cached),
   rounds 1..k of a 300-round run (so the rounds are not in the final test window), with student
   steps replayed as CUDA graphs (``--cuda-graphs on``) and eager (``--cuda-graphs off``), same
   seed: seconds per round and per phase, and each round's validation figures.
2. ``floor``: a plain PyTorch loop over the same three architectures (SGD momentum, CE + KD, grad
   clip, batch 64): ms per step eager, replayed as a CUDA graph (``hfl_bench.graphs``' recorder),
   and ``torch.compile(mode="reduce-overhead")`` on the model with its compile time.
3. ``matrix``: ``hfl-bench matrix`` with one cell of a short run, then four (seeds 0-3) at once on
   the one GPU: wall time, cell-rounds per minute, and each cell's phases.
4. ``spread``: the eager run again, same seed: the GPU's own run-to-run spread, against which
   the replayed path's difference from eager is read.
5. ``methods``: every registered method for 6 rounds on digits on the device (nothing breaks on
   CUDA; the students that replay their steps capture in these rounds).

    python benchmarks/gpu_check.py --data DIR --out result.json            # on the GPU
    python benchmarks/gpu_check.py --data DIR --out r.json --device cpu --quick   # a CPU dry run

DIR holds ``cifar10-jpg.tar.gz`` (unpacked into a temporary folder) or the unpacked
``cifar10-jpg/`` folder. ``--quick`` shrinks everything (a subsample of the images, two rounds,
few steps) to check the script itself; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

STAGES = ("round", "floor", "matrix", "spread", "methods")


# ----------------------------------------------------------------------------- shared by stages


def base_config(args, **overrides):
    from hfl_bench import engine
    from hfl_bench.config import RunConfig

    cfg = RunConfig(method="crad", task="imagefolder", pool=args.pool, clients=10, alpha=0.3, seed=0,
                    rounds=300, device=args.device, data_dir=str(args.root), out=str(args.work / "runs"),
                    checkpoint_every=0, **overrides)
    return engine.load_task(cfg)[1]


def run_rounds(args, k: int, **overrides) -> dict:
    """Rounds 1..k of one run: per-round seconds, phases, validation and (test rounds) test figures."""
    import numpy as np
    import torch

    from hfl_bench.engine import Simulation
    from hfl_bench.evaluation import selection_score

    cfg = base_config(args, **overrides)
    t0 = time.perf_counter()
    sim = Simulation(cfg)
    setup = time.perf_counter() - t0
    cuda = sim.fed.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rounds = []
    for rnd in range(1, k + 1):
        entry = sim.step(rnd)
        val = sim.fed.val_correct.sum(1).cpu().numpy() / np.maximum(sim.fed.val_counts.sum(1).cpu().numpy(), 1) * 100
        rounds.append({
            "round": rnd, "seconds": entry["seconds"], "phases": entry["phases"],
            "mean_val_acc": entry.get("mean_val_acc"), "val_acc": [round(float(v), 4) for v in val],
            "global_acc": entry.get("global_acc"), "train_loss": entry.get("train_loss"),
        })
    steady = rounds[1:] or rounds
    phases: dict[str, list[float]] = {}
    for r in steady:
        for name, v in r["phases"].items():
            phases.setdefault(name, []).append(v)
    graphs = sim.fed.step_graphs
    return {
        "settings": {k: v for k, v in overrides.items()},
        "setup_s": round(setup, 3),
        "round_s_median": statistics.median(r["seconds"] for r in steady),
        "phases_s_median": {name: statistics.median(v) for name, v in phases.items()},
        "selection_scores": [round(selection_score(np.array(r["val_acc"])), 4) for r in rounds],
        "rounds": rounds,
        "step_kinds": dict(graphs.counts) if graphs is not None else None,
        "cuda_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "n_train": int(len(sim.fed.data.train_y)), "n_test": int(len(sim.fed.data.test_y)),
    }


def stage_round(args) -> dict:
    k = 2 if args.quick else 5
    return {"graphs": run_rounds(args, k, cuda_graphs="on"), "eager": run_rounds(args, k, cuda_graphs="off")}


def stage_spread(args) -> dict:
    return {"eager_again": run_rounds(args, 2 if args.quick else 5, cuda_graphs="off")}


def stage_methods(args) -> dict:
    from hfl_bench import engine
    from hfl_bench.config import RunConfig
    from hfl_bench.registry import METHODS

    out = {}
    for name in args.methods.split(",") if args.methods else METHODS.names():
        t = time.perf_counter()
        try:
            extra = {"public_size": 200} if METHODS.get(name).card.needs_public else {}
            if METHODS.get(name).card.single_architecture:
                extra["pool"] = "cpu-cnn"
            cfg = engine.load_task(RunConfig(method=name, task="digits", rounds=2 if args.quick else 6, seed=0,
                                             device=args.device, out=str(args.work / "runs"), checkpoint_every=0,
                                             cuda_graphs="on", **extra))[1]
            result = engine.run(cfg)
            graphs = result.fed.step_graphs
            out[name] = {"status": result.status, "seconds": round(time.perf_counter() - t, 2),
                         "global_acc_last": result.history[-1].get("global_acc"),
                         "step_kinds": dict(graphs.counts) if graphs is not None else None}
        except Exception:  # noqa: BLE001 - a method that breaks on the device is the finding
            out[name] = {"error": traceback.format_exc()[-1500:]}
        print("PARTIAL " + json.dumps({name: out[name]}), flush=True)  # kept if the stage runs out of time
    return out


# ----------------------------------------------------------------------------- the plain-loop floor


def stage_floor(args) -> dict:
    import torch
    import torch.nn.functional as F

    from hfl_bench.data import get_task
    from hfl_bench.graphs import CudaRecorder, EagerRecorder, sgd_step
    from hfl_bench.pools import build_model, get_pool

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    info = get_task("cifar10").info  # 10 classes of 3x32x32 images
    steps = 5 if args.quick else 200
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 32, 32, generator=gen).to(device)
    y = torch.randint(0, 10, (64,), generator=gen).to(device)
    q = torch.softmax(torch.randn(64, 10, generator=gen), -1).to(device)
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)

    def fresh(member):
        torch.manual_seed(0)
        model = build_model(member, info).to(device)
        if cuda:
            model = model.to(memory_format=torch.channels_last)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def timed(fn, n) -> float:
        sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - t) / n * 1e3

    def sync():
        if cuda:
            torch.cuda.synchronize()

    out = {}
    for member in get_pool("paper").members:
        row = {}
        model, opt = fresh(member)
        eager = lambda: sgd_step(model, opt, x, y, q, 0.5, 3.0, 10.0)  # noqa: E731
        for _ in range(3):
            eager()
        row["eager_ms"] = timed(eager, steps)
        model, opt = fresh(member)
        recorder = CudaRecorder(device) if cuda else EagerRecorder()
        with recorder.side():
            for _ in range(3):
                sgd_step(model, opt, x, y, q, 0.5, 3.0, 10.0)
        sx, sy, sq = x.clone(), y.clone(), q.clone()
        t = time.perf_counter()
        replay, _ = recorder.capture(lambda: sgd_step(model, opt, sx, sy, sq, 0.5, 3.0, 10.0))
        row["capture_s"] = time.perf_counter() - t

        def replayed():
            sx.copy_(x)
            sy.copy_(y)
            sq.copy_(q)
            replay()

        row["graph_ms"] = timed(replayed, steps)
        if member.label == "resnet18":
            try:
                model, opt = fresh(member)
                compiled = torch.compile(model, mode="reduce-overhead")

                def step():
                    opt.zero_grad(set_to_none=True)
                    logits = compiled(x)
                    loss = (0.5 * F.cross_entropy(logits, y)
                            + 0.5 * 9.0 * F.kl_div(F.log_softmax(logits / 3.0, -1), q, reduction="batchmean"))
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
                    opt.step()

                t = time.perf_counter()
                for _ in range(3):
                    step()
                sync()
                row["compile_first_3_steps_s"] = time.perf_counter() - t
                row["compiled_ms"] = timed(step, steps)
            except Exception:  # noqa: BLE001 - a compile failure is a result
                row["compiled_error"] = traceback.format_exc()[-1500:]
        out[member.label or member.model] = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
    return {"steps_timed": steps, "batch": 64, "archs": out}


# ----------------------------------------------------------------------------- the matrix


def stage_matrix(args) -> dict:
    """One cell alone, then four cells at once (seeds 0-3) on the one GPU."""
    rounds = 2 if args.quick else 6
    out = {}
    for label, seeds, jobs in (("one_cell", 1, 1), ("four_cells", 4, 4)):
        out[label] = run_matrix(args, label, seeds, jobs, rounds)
    one, four = out["one_cell"], out["four_cells"]
    if one.get("cell_rounds_per_min") and four.get("cell_rounds_per_min"):
        out["throughput_ratio"] = round(four["cell_rounds_per_min"] / one["cell_rounds_per_min"], 3)
    if one.get("steady_cell_rounds_per_min") and four.get("steady_cell_rounds_per_min"):
        out["steady_throughput_ratio"] = round(
            four["steady_cell_rounds_per_min"] / one["steady_cell_rounds_per_min"], 3)
    return out


def run_matrix(args, label: str, seeds: int, jobs: int, rounds: int) -> dict:
    """``hfl-bench matrix`` over ``seeds`` cells with ``jobs`` at once: wall time, cell-rounds per
    minute (all rounds over the wall time, start-up included; and steady: the sum over cells of
    60 / their median seconds per round after the first), each cell's phases."""
    folder = args.work / f"matrix-{label}"
    suite = args.work / f"suite-{label}.yaml"
    suite.write_text(json.dumps({  # JSON is YAML
        "name": f"gpu-check-{label}", "out": str(folder), "tasks": ["imagefolder"], "methods": ["crad"],
        "seeds": f"0-{seeds - 1}",
        "settings": {"pool": args.pool, "clients": 10, "alpha": 0.3, "rounds": rounds, "device": args.device,
                     "data_dir": str(args.root), "checkpoint_every": 0, "cuda_graphs": "on"},
    }))
    cmd = ["hfl-bench", "matrix", str(suite), "--jobs", str(jobs), "--json"]
    if jobs > 1 and args.device.startswith("cuda"):
        cmd += ["--cells-per-gpu", str(jobs)]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.matrix_timeout)
        tails = {"returncode": proc.returncode, "stderr_tail": proc.stderr[-1500:], "json_tail": proc.stdout[-1500:]}
    except subprocess.TimeoutExpired:
        tails = {"error": f"timed out after {args.matrix_timeout} s"}
    wall = time.perf_counter() - t
    cells = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        history = record.get("history") or []
        steady = history[2:] or history[1:]
        phases: dict[str, list[float]] = {}
        for h in steady:
            for name, v in (h.get("phases") or {}).items():
                phases.setdefault(name, []).append(v)
        cells.append({
            "seed": record["config"]["seed"], "status": record.get("status"), "rounds": len(history) - 1,
            "round_s_median": statistics.median(h["seconds"] for h in steady) if steady else None,
            "phases_s_median": {n: statistics.median(v) for n, v in phases.items()},
            "device": record["config"].get("device"),
        })
    steady_rate = sum(60 / c["round_s_median"] for c in cells if c["round_s_median"])
    return {"jobs": jobs, "cells_planned": seeds, "wall_s": round(wall, 2),
            "cell_rounds_per_min": round(sum(c["rounds"] for c in cells) / wall * 60, 2),
            "steady_cell_rounds_per_min": round(steady_rate, 2) if cells else None, "cells": cells, **tails}


# ----------------------------------------------------------------------------- the driver


class BusySampler:
    """The GPU's busy share (nvidia-smi's utilization.gpu, every 200 ms) while a stage runs."""

    def __init__(self, device: str):
        self.proc = None
        if device.startswith("cuda"):
            try:
                self.proc = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.proc = None

    def stop(self) -> dict | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        text = self.proc.communicate(timeout=10)[0]
        values = [float(v) for v in text.split() if v.replace(".", "", 1).isdigit()]
        return {"mean": round(statistics.mean(values), 1), "samples": len(values)} if values else None


def environment(device: str) -> dict:
    import timm
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
           "cpu_count": os.cpu_count(), "device": device}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = f"unavailable: {e}"
    return env


def prepare_data(args) -> dict:
    """Unpack the tarball (if given one) and decode the images once, so every stage reads the cache."""
    src = Path(args.data)
    if (src / "cifar10-jpg").is_dir():
        root = src / "cifar10-jpg"
    else:
        t = time.perf_counter()
        with tarfile.open(src / "cifar10-jpg.tar.gz") as tar:
            tar.extractall(args.work, filter="data")
        root = args.work / "cifar10-jpg"
        print(f"unpacked in {time.perf_counter() - t:.1f} s", flush=True)
    if args.quick:  # a small copy: 100 images of each class in train/, 20 in test/
        small = args.work / "cifar10-small"
        for split, n in (("train", 100), ("test", 20)):
            for cls in sorted(p for p in (root / split).iterdir() if p.is_dir()):
                dst = small / split / cls.name
                dst.mkdir(parents=True, exist_ok=True)
                for f in sorted(cls.iterdir())[:n]:
                    (dst / f.name).write_bytes(f.read_bytes())
        root = small
    args.root = root
    from hfl_bench.data import get_task

    t = time.perf_counter()
    data = get_task("imagefolder").load(root)
    return {"decode_and_cache_s": round(time.perf_counter() - t, 2), "n_train": int(len(data.train_y)),
            "n_test": int(len(data.test_y))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="folder holding cifar10-jpg.tar.gz or cifar10-jpg/")
    ap.add_argument("--out", required=True, help="the result JSON")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a dry run of the script (figures mean nothing)")
    ap.add_argument("--pool", default="paper", help="the runs' pool (a CPU dry run: cpu)")
    ap.add_argument("--methods", default=None, help="the methods stage's methods, comma-separated (default: all)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated, from: " + ", ".join(STAGES))
    ap.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD here)")
    ap.add_argument("--matrix-timeout", type=int, default=200)
    ap.add_argument("--stage-timeout", type=int, default=240)
    ap.add_argument("--budget", type=int, default=450, help="seconds for all stages; a stage gets what is left")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.root, args.work = Path(args.root), Path(args.work)
        result = globals()[f"stage_{args.child}"](args)
        print("RESULT " + json.dumps(result), flush=True)
        return
    out = Path(args.out)
    args.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    commit, dirty = args.commit, None
    if commit is None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                    text=True).stdout.strip())
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit or None, "dirty": dirty, "quick": args.quick,
              "environment": environment(args.device), "stages": {}}

    def save():  # the machine's temporary folder is no part of a result: written as <work>
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1).replace(str(args.work), "<work>") + "\n")
        tmp.replace(out)

    start = time.perf_counter()
    report["data"] = prepare_data(args)
    save()
    for stage in args.stages.split(","):
        t = time.perf_counter()
        left = int(args.budget - (t - start))
        if left < 20:
            report["stages"][stage] = {"error": "skipped: the check's time budget is spent"}
            save()
            continue
        cmd = [sys.executable, __file__, "--child", stage, "--data", args.data, "--out", args.out, "--device",
               args.device, "--pool", args.pool, "--root", str(args.root), "--work", str(args.work),
               *(["--quick"] if args.quick else []), *(["--methods", args.methods] if args.methods else [])]
        busy = BusySampler(args.device)
        # a session of its own: a stage that runs out of time is killed with everything it started
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=min(args.stage_timeout, left))
            line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
            entry = json.loads(line[7:]) if line else {"error": stderr[-3000:], "returncode": proc.returncode}
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            entry = {"error": f"timed out after {min(args.stage_timeout, left)} s", "stderr_tail": stderr[-1500:],
                     "partial": partial_results(stdout)}
        entry["stage_wall_s"] = round(time.perf_counter() - t, 1)
        entry["gpu_busy_percent"] = busy.stop()
        report["stages"][stage] = entry
        save()
        print(f"{stage}: {entry['stage_wall_s']} s{' ERROR' if 'error' in entry else ''}", flush=True)
        print(summary(stage, entry), flush=True)
    print(f"written to {out}")


def partial_results(stdout: str) -> dict:
    """What a stage that ran out of time had reported line by line (``PARTIAL`` lines)."""
    out: dict = {}
    for line in stdout.splitlines():
        if line.startswith("PARTIAL "):
            out.update(json.loads(line[8:]))
    return out


def summary(stage: str, entry: dict) -> str:
    """One or two lines per stage for the log (the JSON holds everything)."""
    try:
        if stage == "round":
            g, e = entry["graphs"], entry["eager"]
            return (f"  graphs {g['round_s_median']:.2f} s/round {g['phases_s_median']} | eager "
                    f"{e['round_s_median']:.2f} s/round {e['phases_s_median']}\n"
                    f"  val graphs {g['selection_scores']}\n  val eager  {e['selection_scores']}")
        if stage == "floor":
            return "  " + json.dumps(entry["archs"])
        if stage == "matrix":
            one, four = entry["one_cell"], entry["four_cells"]
            return (f"  one {one['cell_rounds_per_min']} four {four['cell_rounds_per_min']} cell-rounds/min, "
                    f"ratio {entry['throughput_ratio']} steady {entry.get('steady_throughput_ratio')}")
        if stage == "spread":
            return f"  val eager again {entry['eager_again']['selection_scores']}"
        if stage == "methods":
            found = entry.get("partial", entry)
            return "  " + ", ".join(f"{k}: {v.get('status', 'ERROR')}" for k, v in found.items() if isinstance(v, dict))
    except (KeyError, TypeError, ZeroDivisionError) as e:
        return f"  (no summary: {e!r})"
    return ""


if __name__ == "__main__":
    main()
