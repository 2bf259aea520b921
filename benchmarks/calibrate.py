"""Calibration study: how much work a client does per round, chosen on `local` alone.

Why: with the first wave's defaults (batch 64, lr 0.01, one local epoch) a digits client holds
about 115 training samples and takes two SGD steps a round; the CRAD paper's clients (CIFAR-10,
N = 10) take 60-80. This study varies batch size, learning rate and local epochs on each CPU task,
runs **only the `local` method** (no communication, the floor every method must beat) and picks
each task's defaults by a rule that never looks at another method:

1. Held-out fraction (fixed before any run, from the data sizes alone): the smallest of 0.2, 0.3,
   0.4 that gives every client a validation half of at least ``MIN_VAL`` samples on average
   (validation and test halves are equal).
2. Steps per client per round (median client, from the real partition): between ``MIN_STEPS``
   and ``MAX_STEPS`` - "tens, not two", the order of the paper's 60-80.
3. Converged within the budget: the trailing ``SMOOTH``-round mean of `local`'s mean validation
   accuracy comes within ``TOLERANCE`` points of its maximum by half the study's rounds.
   3b (a curve that still creeps up, decided 2026-12-07 for every task alike): failing that, a
   configuration passes when, by half the study's rounds, the trailing mean reaches a *plateau
   round*: the first round from which it rises by at most ``TOLERANCE`` over the next
   ``PLATEAU_WINDOW`` rounds (50: the half of the standard 100-round study over which rule 3 asks the
   same). Its convergence round is then the plateau round. Rule 3 asks for no gain over all the
   rest of the study, so on a slowly rising curve its round moves with the study's length;
   the plateau round does not once the study is long enough to see it. Applied to every
   committed study, 3b changes no earlier choice (tests/test_calibration_rule.py).
4. Among the configurations that pass 2 and 3: the highest final validation accuracy (mean of the
   last 10 rounds); configurations within ``TIE`` points of the best count as tied and the one
   with the fewest steps per round (the cheapest) is chosen.
5. The task's round budget: 1.5 x the chosen configuration's convergence round, rounded up to a
   multiple of 10 (at least 30).

Run it (resumable: a configuration whose record exists is not run again):

    OMP_NUM_THREADS=1 python benchmarks/calibrate.py run --jobs 2      # digits and mnist1d (about an hour on 2 cores)
    OMP_NUM_THREADS=1 python benchmarks/calibrate.py run --task cifar10-jpg --data-dir DIR   # real CIFAR-10 (JPEGs)
    OMP_NUM_THREADS=1 python benchmarks/calibrate.py run --task cifar10-jpg-full --data-dir DIR   # all 50,000 (N = 20)
    python benchmarks/calibrate.py report [--data-dir DIR]              # the summary and the choice

The real-CIFAR protocol (``cifar10-jpg``: 10,000 training images, 2,000 test images, both
stratified subsamples) is calibrated by the same rule on a smaller grid and fewer study rounds,
because one round of one configuration costs ~15-30 s on a 2-core machine: batch 32 (the one batch
size whose steps per round are of the paper's order for 800 training samples a client), learning
rates 0.01 and 0.05, one local epoch.

Records go to ``benchmarks/results/calibration/<task>/``; the summary (every configuration's
steps, seconds, curve and verdict, and the choice) to ``benchmarks/results/calibration.json``.
Global test accuracy is in the summary for the reader and is never read by the rule.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "calibration"
SUMMARY = ROOT / "benchmarks" / "results" / "calibration.json"

SEED = 0
BASELINE = (64, 0.01, 1)  # the first wave's defaults: batch, lr, local epochs
GRID = [BASELINE] + [(b, lr, e) for b in (16, 32) for lr in (0.01, 0.05) for e in (1, 2, 5)]
# task -> (grid, study rounds)
STUDIES = {
    "digits": (GRID, 100),
    "mnist1d": (GRID, 100),
    # 40 study rounds first: both configurations came within 1 point of their best at round 27, not
    # by round 20, so neither passed rule 3; those records stay in the results folder, and the
    # study was extended to 60 rounds (the same rule, the same grid).
    "cifar10-jpg": ([(32, 0.01, 1), (32, 0.05, 1)], 60),
    # Issue 64's tasks, a grid of the configurations whose steps per round are in rule 2's range at
    # batch 32 (about 630 training windows a hapt client of three users, 820 reviews a
    # rotten-tomatoes client): one and two epochs, two learning rates; 60 study rounds.
    "hapt": ([(32, 0.01, 1), (32, 0.05, 1), (32, 0.01, 2), (32, 0.05, 2)], 60),
    "rotten-tomatoes": ([(32, 0.01, 1), (32, 0.05, 1), (32, 0.01, 2), (32, 0.05, 2)], 60),
    # The same grid as cifar10-jpg's (the same 10,000-image subsample and pool). At 60 study rounds
    # neither configuration converged by round 30 (46 and 51), so, as cifar10-jpg's study was, it
    # is extended: 100 study rounds (the 60-round records stay in the results folder). At 100 neither
    # passed either (within a point of the smoothed best at rounds 66 and 70, not by 50; both curves
    # level off from about round 70 with round-to-round swings of 2-3 points): extended by half
    # again, 150 study rounds (the 100-round records stay too).
    "fashion-mnist": ([(32, 0.01, 1), (32, 0.05, 1)], 150),
    # Issue 67's pool-size study: every training image at N = 20, 10 active a round (the task's
    # defaults, which the study runs at). cifar10-jpg's chosen configuration alone, so the protocol
    # stays cifar10-jpg's and only the rounds are chosen (rule 5), still subject to rules 2 and 3:
    # 61.5 steps a round for the median client (2,000 training images at batch 32). At 60 study
    # rounds (1,526 s, one process beside other jobs) it came within 1 point of its best at round 35,
    # not by round 30, so it did not pass rule 3; as cifar10-jpg's study was, it is extended by half:
    # 90 study rounds (the 60-round record stays in the results folder). At 90 (1,590 s) the curve
    # was still rising (63.4 at round 60, 65.6 over the last 10) and came within a point of its best
    # at round 71, not by 45: extended by half again, 135 study rounds (both records stay). At 135
    # (3,116 s, beside CI and a suite) it was within a point of its best at round 80, not by 67: not
    # passed either (rule 5 would give R >= 120 at that round). From round 80 the curve wanders
    # between 65 and 66.5, so it is extended by a third, as far as one core-hour allows: 180 study
    # rounds (the three earlier records stay). At 180 (5,429 s, beside two suites and CI) it came
    # within a point of its best at round 122, not by 90: the convergence round moves with the
    # study's length (35, 71, 80, 122), so no further extension. Rule 3b (the module docstring),
    # decided for every task alike, finds its plateau at round 80 in both the 135- and the 180-round
    # study: 120 rounds.
    "cifar10-jpg-full": ([(32, 0.01, 1)], 180),
}
TASKS = ("digits", "mnist1d")  # the default of run and report; cifar10-jpg(-full) needs its data folder
HELDOUT_CHOICES = (0.2, 0.3, 0.4)
MIN_VAL = 20
MIN_STEPS, MAX_STEPS = 20, 100
SMOOTH, TOLERANCE, TIE = 5, 1.0, 0.5
PLATEAU_WINDOW = 50  # rule 3b


def heldout_for(task: str, data_dir: str | None = None) -> float:
    """Rule 1: the smallest held-out fraction giving >= MIN_VAL validation samples per client."""
    from hfl_bench import engine
    from hfl_bench.config import RunConfig

    t, cfg = engine.load_task(RunConfig(method="local", task=task, data_dir=data_dir))
    n_train = len(t.load(cfg.data_dir).train_y)
    for fraction in HELDOUT_CHOICES:
        if n_train / cfg.clients * fraction / 2 >= MIN_VAL:
            return fraction
    return HELDOUT_CHOICES[-1]


def study_config(task: str, batch: int, lr: float, epochs: int, heldout: float, data_dir: str | None = None):
    from hfl_bench import engine
    from hfl_bench.config import RunConfig

    cfg = RunConfig(method="local", task=task, batch_size=batch, lr=lr, local_epochs=epochs, heldout_fraction=heldout,
                    rounds=STUDIES[task][1], seed=SEED, out=str(OUT / task), checkpoint_every=0, data_dir=data_dir)
    return engine.load_task(cfg)[1]


def steps_per_round(cfg) -> list[int]:
    """SGD steps each client takes in one round (its training shard, the batch rule, the epochs)."""
    from hfl_bench import engine
    from hfl_bench.data import get_task
    from hfl_bench.training import batch_bounds

    task = get_task(cfg.task)
    part = engine.partition_for(cfg, task.info, task.load(cfg.data_dir))
    return [len(batch_bounds(len(c.train), cfg.batch_size)) * cfg.local_epochs for c in part.clients]


def command(cfg) -> list[str]:
    return [str(Path(sys.executable).with_name("hfl-bench")), "run", "--method", "local", "--task", cfg.task,
            "--batch-size", str(cfg.batch_size), "--lr", str(cfg.lr), "--local-epochs", str(cfg.local_epochs),
            "--heldout-fraction", str(cfg.heldout_fraction), "--rounds", str(cfg.rounds), "--seed", str(cfg.seed),
            "--out", cfg.out, "--checkpoint-every", "0", "--threads", "1", "--quiet", "--json",
            *(["--data-dir", cfg.data_dir] if cfg.data_dir else [])]


def run_all(tasks: tuple[str, ...], jobs: int, data_dir: str | None) -> None:
    from hfl_bench.paths import record_path

    todo = []
    for task in tasks:
        heldout = heldout_for(task, data_dir)
        for batch, lr, epochs in STUDIES[task][0]:
            cfg = study_config(task, batch, lr, epochs, heldout, data_dir)
            if not record_path(cfg).exists():
                todo.append(cfg)
    print(f"{len(todo)} runs to do", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def one(cfg) -> None:
        done = subprocess.run(command(cfg), capture_output=True, text=True, env=env, cwd=ROOT)
        tail = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or [""]
        print(f"{cfg.task} b{cfg.batch_size} lr{cfg.lr} e{cfg.local_epochs}: rc {done.returncode} {tail[0][:200]}",
              flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, todo))


def smoothed(values: list[float], window: int = SMOOTH) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1): i + 1]) for i in range(len(values))]


def convergence_round(rounds: list[int], val: list[float]) -> int:
    """Rule 3: the first round whose trailing mean is within TOLERANCE points of the curve's best."""
    curve = smoothed(val)
    best = max(curve)
    return next(r for r, v in zip(rounds, curve) if v >= best - TOLERANCE)


def plateau_round(rounds: list[int], val: list[float]) -> int | None:
    """Rule 3b: the first round from which the trailing mean rises by at most TOLERANCE points over
    the next PLATEAU_WINDOW rounds (all of them inside the study), or None."""
    curve = smoothed(val)
    for i, (r, v) in enumerate(zip(rounds, curve)):
        if rounds[-1] < r + PLATEAU_WINDOW:
            return None  # the window runs past the study: it cannot be seen (nor for a later round)
        ahead = [c for q, c in zip(rounds[i:], curve[i:]) if q <= r + PLATEAU_WINDOW]
        if max(ahead) <= v + TOLERANCE:
            return r
    return None


def converged(rounds: list[int], val: list[float], study_rounds: int) -> tuple[int, str | None]:
    """(the convergence round, the rule passed: "3", "3b" or None) for one curve. Rule 3 first, so
    a configuration that passes it keeps the round it always had."""
    conv = convergence_round(rounds, val)
    if conv <= study_rounds // 2:
        return conv, "3"
    plateau = plateau_round(rounds, val)
    if plateau is not None and plateau <= study_rounds // 2:
        return plateau, "3b"
    return conv, None


def summarize(task: str, heldout: float, batch: int, lr: float, epochs: int, data_dir: str | None) -> dict | None:
    from hfl_bench.paths import record_path

    cfg = study_config(task, batch, lr, epochs, heldout, data_dir)
    path = record_path(cfg)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    history = [h for h in record["history"] if h["round"] >= 1]
    rounds = [h["round"] for h in history]
    val = [h["mean_val_acc"] for h in history]
    glob = [h["global_acc"] for h in history if h.get("global_acc") is not None]
    steps = steps_per_round(cfg)
    conv, rule = converged(rounds, val, cfg.rounds)
    median_steps = statistics.median(steps)
    return {
        "batch_size": batch, "lr": lr, "local_epochs": epochs, "heldout_fraction": heldout,
        "steps_per_round": {"median": median_steps, "min": min(steps), "max": max(steps)},
        "seconds": round(record["cost"]["wall_time_total_s"], 1),
        "convergence_round": conv,
        "converged_by_rule": rule,
        "final_val_acc": round(statistics.fmean(val[-10:]), 2),
        "best_val_acc": round(max(val), 2),
        "final_global_acc": round(statistics.fmean(glob[-10:]), 2) if glob else None,  # reported, never read
        "val_curve": [round(v, 2) for v in val],
        "passes": {"steps": MIN_STEPS <= median_steps <= MAX_STEPS, "converged": rule is not None},
        "record": str(path.relative_to(ROOT)),
    }


def choose(rows: list[dict]) -> dict | None:
    """Rules 2-4 over one task's rows."""
    ok = [r for r in rows if all(r["passes"].values())]
    if not ok:
        return None
    best = max(r["final_val_acc"] for r in ok)
    tied = [r for r in ok if r["final_val_acc"] >= best - TIE]
    return min(tied, key=lambda r: (r["steps_per_round"]["median"], -r["final_val_acc"]))


def rounds_for(convergence: int) -> int:
    """Rule 5: 1.5 x the convergence round, rounded up to a multiple of 10, at least 30."""
    return max(30, int(math.ceil(1.5 * convergence / 10.0)) * 10)


def report(tasks: tuple[str, ...], data_dir: str | None) -> dict:
    old = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    summary: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "rule": {"study_rounds": {t: r for t, (_, r) in STUDIES.items()}, "seed": SEED, "min_val": MIN_VAL,
                              "min_steps": MIN_STEPS, "max_steps": MAX_STEPS, "smooth": SMOOTH, "tolerance": TOLERANCE,
                              "tie": TIE, "plateau_window": PLATEAU_WINDOW},
                     "tasks": dict(old.get("tasks", {}))}  # a task not reported now keeps its summary
    for task in tasks:
        grid = STUDIES[task][0]
        heldout = heldout_for(task, data_dir)
        rows = [r for r in (summarize(task, heldout, *g, data_dir) for g in grid) if r is not None]
        chosen = choose(rows)
        budget = None if chosen is None else rounds_for(chosen["convergence_round"])
        summary["tasks"][task] = {"heldout_fraction": heldout, "configs": rows, "complete": len(rows) == len(grid),
                                  "chosen": None if chosen is None else {
                                      k: chosen[k] for k in ("batch_size", "lr", "local_epochs", "heldout_fraction")},
                                  "rounds": budget}
        print(f"\n{task} (held-out fraction {heldout}; {len(rows)}/{len(grid)} configurations run)")
        print("| batch | lr | epochs | steps/round (median) | seconds | converged by | final val | final global |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        by = {"3": "", "3b": " (3b)", None: " (not passed)"}
        for r in rows:
            mark = " *" if chosen is r else ""
            print(f"| {r['batch_size']} | {r['lr']} | {r['local_epochs']} | {r['steps_per_round']['median']:g} | "
                  f"{r['seconds']} | {r['convergence_round']}{by[r['converged_by_rule']]} | "
                  f"{r['final_val_acc']}{mark} | {r['final_global_acc']} |")
        print(f"chosen: {summary['tasks'][task]['chosen']}, rounds {budget}")
    from hfl_bench.paths import write_atomic

    write_atomic(SUMMARY, json.dumps(summary, indent=1) + "\n")  # a reader never sees half a summary
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--task", action="append", choices=sorted(STUDIES), help="default: digits and mnist1d")
        p.add_argument("--data-dir", default=None,
                       help="the data folder (cifar10-jpg, cifar10-jpg-full: the one holding cifar10-jpg/)")
        if name == "run":
            p.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    tasks = tuple(args.task or TASKS)
    if args.cmd == "run":
        run_all(tasks, args.jobs, args.data_dir)
    report(tasks, args.data_dir)


if __name__ == "__main__":
    main()
