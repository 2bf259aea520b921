"""HtFLlib's implementation of a method beside hfl-bench's, under HtFLlib's own metric (issue 31).

On HtFLlib's MNIST split (``--data``, 20 clients, task ``pfl-npz``), or on the harder CIFAR-10
subsample ``benchmarks/pfl_cifar10.py`` writes in the same layout (task ``pfl-npz-cifar10``,
HtFLlib's CIFAR-10 FedAvgCNN; the folder's image shape decides), with HtFLlib's FedAvgCNN on
both sides (hfl-bench: the plugin pool in ``benchmarks/htfl_pool.py``), HtFLlib's learning rate,
batch size and local epochs (``system/total.sh``: lr 0.01, batch 10, one epoch, feature dim 512),
for each method and seed:

- **HtFLlib**: its code at ``--htfllib-commit`` of the checkout ``--htfllib`` (exported to a
  temporary folder, never copied here; default the commit before FD's target became the raw
  logits, ``htfllib_run``), run by ``benchmarks/htfllib_driver.py`` with the method's
  hyperparameters from total.sh (``METHODS``). Its per-round figure is its ``Averaged Test
  Accuracy``: correct predictions over all clients' test files / their total size (each client's
  model on its own test file), round 0 being the untrained models.
- **hfl-bench**: the method of the same name through the engine (``Simulation``, the code path of
  ``hfl-bench run``; the engine API because the pool is a plugin registered by importing
  ``htfl_pool`` and because a record keeps per-client figures for the selected round only),
  ``--eval-every`` (default 0: the engine tests only the last round; its own figures do not
  enter the comparison, and a run's training does not depend on them, so the global test of
  every model, about 80 CPU s, is not paid at 11 of 30 rounds as under the default policy; N > 0
  is the engine's policy with test rounds every N), SGD without momentum or weight decay as HtFLlib's clients, held-out
  fraction ``--heldout-fraction``. Per round it computes, from the models the engine evaluates for
  each client (``Method.eval_models``):

  - ``test_files`` (the compared figure): HtFLlib's metric on the very images HtFLlib uses, each
    client's model on its own test file (client i's block of the global test set: the task joins
    the test files in client order), correct over total;
  - ``local_test``: the same metric on hfl-bench's own local test halves (2.5% of each client's
    train file at the harness's held-out 0.05), computed as the evaluator computes a client's local
    test figure (the figures the record's ``local_acc`` averages without weights).

Differences that stay (reported in the output's ``notes``): hfl-bench trains on the train files
less the held-out fraction (``HELDOUT``, 0.05: the smallest share at which every client of both
folders keeps a validation and a local test sample, which the engine requires; its tasks' usual
0.2 cost hfl-bench's ``local`` about 3 points on the CIFAR-10 folder), HtFLlib on all of them;
HtFLlib's loaders neither shuffle nor keep a last partial batch, hfl-bench shuffles each epoch
(seeded) and keeps it; HtFLlib's clients share one initial model (each of its client
constructors reseeds torch with 0, which the driver turns into the run's seed so that HtFLlib's
seeds differ at all), hfl-bench's clients each draw their own (``--shared-init`` copies client 0's
initial model into every client, as HtFLlib). Both sides feed the files' [-1, 1]
values as they are (``--standardize`` gives hfl-bench its tasks' rule, each channel standardized
with the training statistics). Gradients are clipped as HtFLlib's clients clip them: at global
norm 10 in FML, FedKD and FedMRL (``CLIPPED``), not at all otherwise (hfl-bench's protocol clips
every method at 10; the harness sets ``grad_clip`` per method).

Output (``--out``, default ``benchmarks/results/htfllib-side-by-side.json``, written atomically
after each run): every run's curves and seconds per round, and per method the mean curves of
both sides, their mean absolute difference over rounds 0..R, and the best round (each seed's
maximum, averaged: HtFLlib's ``average_data``). ``--resume`` keeps the runs already in ``--out``
that match the settings and runs only the rest. ``--report`` adds, for two seeds or more a side,
each round's difference with Welch's 95% interval and the rounds it resolves, unadjusted and after
Holm's adjustment over the rounds (``interval_lines``).

    OMP_NUM_THREADS=1 python benchmarks/htfllib_side_by_side.py --htfllib PATH \\
        [--data FOLDER] [--methods local fedproto lg-fedavg fedgh fedtgp fd] [--seeds 0 1 2]
        [--rounds 30] [--resume]
    python benchmarks/htfllib_side_by_side.py --report [--plot PNG] [--out FILE]   # as markdown (and a figure)
    python benchmarks/htfllib_side_by_side.py --merge A.json B.json --out FILE   # one file from two processes
    python benchmarks/htfllib_side_by_side.py --overview A.json B.json   # one table over the folders' files
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# hfl-bench name -> (HtFLlib's -algo, its hyperparameters in system/total.sh)
METHODS = {
    "local": ("Local", []),
    "fml": ("FML", ["-al", "0.5", "-bt", "0.5"]),
    "fedproto": ("FedProto", ["-lam", "10"]),
    "lg-fedavg": ("LG-FedAvg", []),
    "fedgh": ("FedGH", ["-slr", "0.01", "-se", "1"]),
    "fedtgp": ("FedTGP", ["-lam", "10", "-se", "100", "-mart", "100"]),
    "fd": ("FD", ["-lam", "1"]),
    "fedkd": ("FedKD", ["-mlr", "0.01", "-Ts", "0.95", "-Te", "0.98"]),
    "fedgen": ("FedGen", ["-nd", "32", "-glr", "0.1", "-hd", "512", "-se", "100"]),
    "fedmrl": ("FedMRL", ["-sfd", "128"]),
}
CLIPPED = {"fml", "fedkd", "fedmrl"}  # HtFLlib's clients that clip gradients (at norm 10)
# `local` first: the control. Its two sides differ only by the differences that stay (NOTES), so a
# method's difference beyond local's is the method's own.
DEFAULT_METHODS = ["local", "fedproto", "lg-fedavg", "fedgh", "fedtgp", "fd"]
LR, BATCH, EPOCHS, CLIENTS = 0.01, 10, 1, 20
HELDOUT = 0.05  # hfl-bench's held-out share: the smallest at which every client keeps a val and a test sample
NOTES = [
    "hfl-bench trains on each client's train file less the held-out fraction (validation and local test "
    "halves, 5% by default); HtFLlib trains on the whole file",
    "HtFLlib's loaders do not shuffle and drop the last partial batch; hfl-bench shuffles every epoch "
    "(seeded) and keeps it",
    "HtFLlib's clients share one initial model (each client constructor reseeds torch; the driver gives it the "
    "run's seed instead of 0, seed 0 being HtFLlib's run unchanged); hfl-bench's clients each draw their own "
    "unless --shared-init (settings: hfl_bench_init) copies client 0's into every client",
    "gradients clipped as HtFLlib's clients clip them: at norm 10 in FML, FedKD and FedMRL, not otherwise "
    "(hfl-bench's own protocol clips every method at 10)",
    "both sides feed the files' [-1, 1] values as they are (hfl-bench's tasks standardize each channel; "
    "--standardize restores that)",
    "both sides use SGD without momentum or weight decay at lr 0.01, batch 10, one local epoch",
]
ROUND_MARK = "HFL_ROUND"


# ----------------------------------------------------------------------------- the data


def image_shape(data: str) -> tuple[int, ...]:
    """The image shape of the folder's first train file: MNIST's 1x28x28 or CIFAR-10's 3x32x32."""
    from hfl_bench.tasks.pfl_npz import read_client_file

    return tuple(read_client_file(Path(data) / "train" / "0.npz")[0].shape[1:])


def task_of(data: str) -> str:
    """hfl-bench's task for the folder: the registered kind of the layout with its image shape
    (``pfl-npz`` 1x28x28, ``pfl-npz-cifar10`` 3x32x32)."""
    from hfl_bench.tasks.pfl_npz import FOLDER_TASKS

    return {t.info.input_shape: t.info.name for t in FOLDER_TASKS}[image_shape(data)]


# ----------------------------------------------------------------------------- hfl-bench's side


def simulation(args, task: str):
    """hfl-bench's run of ``args.worker`` on ``task`` at the harness's settings: the engine's
    ``Simulation`` with its setup done (round 0 not yet reported)."""
    import torch

    from hfl_bench.config import RunConfig
    from hfl_bench.engine import Simulation, load_task

    if not args.standardize:  # the files' [-1, 1] values as they are, as HtFLlib feeds them (module docstring)
        import hfl_bench.data

        hfl_bench.data.channel_stats = lambda x: (torch.zeros(x.shape[1]), torch.ones(x.shape[1]))
    import htfl_pool

    params = dict(kv.split("=", 1) for kv in args.set)
    cfg = load_task(RunConfig(method=args.worker, task=task, data_dir=args.data, pool=htfl_pool.POOL,
                              batch_size=BATCH, local_epochs=EPOCHS, lr=LR, momentum=0.0, weight_decay=0.0,
                              grad_clip=10.0 if args.worker in CLIPPED else 0.0,
                              heldout_fraction=args.heldout_fraction, rounds=args.rounds, seed=args.seed,
                              eval_every=max(args.eval_every, 1), checkpoint_every=0, device="cpu",
                              method_params=params))[1]
    sim = Simulation(cfg)
    # Every client starts from client 0's initial model, as HtFLlib's clients do (the model each client
    # is evaluated with; a method's extra per-client models, FML's meme say, stay as the method drew them).
    if args.shared_init:
        first = sim.fed.clients[0].model.state_dict()
        for client in sim.fed.clients[1:]:
            client.model.load_state_dict(first)
    if args.eval_every == 0:  # the engine's global test only at the last round (module docstring)
        sim.evaluator.is_test_round = lambda rnd, last=False: last
    return sim


def hfl_bench_worker(args) -> None:
    """One hfl-bench run, one ``HFL_ROUND {json}`` line per round (rounds 0..R) on stdout."""
    import time

    import numpy as np
    import torch

    from hfl_bench.evaluation import channels_last
    from hfl_bench.tasks.pfl_npz import find_folder, read_config, read_split
    from hfl_bench.training import predict_logits

    torch.set_num_threads(args.threads)
    task = task_of(args.data)
    folder = find_folder(args.data, task)
    sizes = [len(y) for _, y in read_split(folder, "test", read_config(folder)["num_clients"])]
    bounds = np.cumsum([0, *sizes])
    t = time.perf_counter()
    sim = simulation(args, task)
    setup_s = time.perf_counter() - t

    def figures(rnd: int, seconds: float, cpu_s: float) -> dict:
        fed, ev = sim.fed, sim.evaluator
        models = sim.method.eval_models(fed)
        with channels_last(models, ev.fast_layout):  # the evaluator's layout
            correct = [int((predict_logits(m, ev._layout(fed.data.test_x[lo:hi])).argmax(-1)
                            == fed.data.test_y[lo:hi]).sum()) for m, lo, hi in zip(models, bounds[:-1], bounds[1:])]
            # the local halves here, not from the evaluator: it tests them only at its test rounds
            local = [ev.local_test_correct(m, cid) for cid, m in enumerate(models)]
        return {"round": rnd, "seconds": round(seconds, 3), "cpu_s": round(cpu_s, 3),
                "test_files": 100 * sum(correct) / sum(sizes), "correct": correct,
                "local_test": 100 * sum(local) / max(int(ev.local_total.sum()), 1),
                "local_correct": local, "local_sizes": [int(n) for n in ev.local_total]}

    print(f"{ROUND_MARK} {json.dumps({'setup_s': round(setup_s, 2), 'test_sizes': sizes})}", flush=True)
    print(f"{ROUND_MARK} {json.dumps(figures(0, 0.0, 0.0))}", flush=True)
    for rnd in range(1, args.rounds + 1):
        cpu = time.process_time()  # the round's CPU seconds (training and the engine's evaluation)
        entry = sim.step(rnd)
        print(f"{ROUND_MARK} {json.dumps(figures(rnd, entry['seconds'], time.process_time() - cpu))}", flush=True)


def run_hfl_bench(method: str, seed: int, args, log) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", method, "--seed", str(seed),
           "--rounds", str(args.rounds), "--data", args.data, "--heldout-fraction", str(args.heldout_fraction),
           *(["--standardize"] if args.standardize else []), *(["--shared-init"] if args.shared_init else []),
           "--eval-every", str(args.eval_every),
           "--threads", str(args.threads), *sum((["--set", kv] for kv in args.set_for(method)), [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    rounds, head = [], None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=HERE.parent) as proc:
        for line in proc.stdout:
            mark, _, body = line.partition(" ")
            if mark != ROUND_MARK:
                continue
            rec = json.loads(body)
            if "round" not in rec:
                head = rec
                continue
            rounds.append(rec)
            print(f"  hfl-bench {method} seed {seed} round {rec['round']}: {rec['test_files']:.2f}% "
                  f"(local halves {rec['local_test']:.2f}%) {rec['seconds']:.1f} s (cpu {rec['cpu_s']:.1f})",
                  flush=True)
    if proc.returncode != 0 or len(rounds) != args.rounds + 1:
        raise RuntimeError(f"hfl-bench {method} seed {seed} failed (exit {proc.returncode}); see {log.name}")
    return {"setup_s": head["setup_s"] if head else None, "test_sizes": head["test_sizes"] if head else None,
            "curve": [r["test_files"] for r in rounds], "curve_local_test": [r["local_test"] for r in rounds],
            "seconds": [r["seconds"] for r in rounds], "cpu_s": [r["cpu_s"] for r in rounds], "rounds": rounds}


# ----------------------------------------------------------------------------- HtFLlib's side


def run_htfllib(method: str, seed: int, args, system: Path, log_path: Path) -> dict:
    import htfllib_run

    algo, extra = METHODS[method]
    extra = [*extra, "--loader", args.htfllib_loader, "--tgp-protos", args.htfllib_tgp_protos]
    cmd = htfllib_run.driver_command(algo, args.rounds, BATCH, EPOCHS, LR, CLIENTS, extra, seed=seed,
                                     image_shape=image_shape(args.data))
    driver = htfllib_run.Driver(system, cmd, log_path, threads=args.threads)
    rounds = []
    try:
        for rec in driver.rounds():
            rounds.append(rec)
            print(f"  HtFLlib {algo} seed {seed} round {rec['round']}: {100 * rec['acc']:.2f}% "
                  f"{rec['seconds']:.1f} s (cpu {rec['cpu_s']:.1f})", flush=True)
    finally:
        driver.close()
    if len(rounds) != args.rounds + 1:
        raise RuntimeError(f"HtFLlib {algo} seed {seed}: {len(rounds)} rounds, expected {args.rounds + 1}")
    return {"algorithm": algo, "args": driver.setup.get("args"), "setup_s": driver.setup.get("setup_s"),
            "test_sizes": rounds[0]["test_sizes"], "curve": [100 * r["acc"] for r in rounds],
            "seconds": [r["seconds"] for r in rounds], "cpu_s": [r["cpu_s"] for r in rounds],
            "training_s": [r["training_s"] for r in rounds],
            "evaluation_s": [r["evaluation_s"] for r in rounds],
            "correct": [r["correct"] for r in rounds]}


# ----------------------------------------------------------------------------- the comparison


def best(curve: list[float]) -> tuple[int, float]:
    """HtFLlib's best accuracy of a run (its maximum over the evaluated rounds) and its round."""
    rnd = max(range(len(curve)), key=lambda r: curve[r])
    return rnd, curve[rnd]


STEADY_FROM = 5  # the round-to-round change is taken after the first rounds' climb


def round_to_round(curve: list[float]) -> float | None:
    """The mean absolute change of a run's accuracy from one round to the next after round
    ``STEADY_FROM`` (how much its curve jitters); None for a run that short."""
    steps = [abs(curve[r] - curve[r - 1]) for r in range(STEADY_FROM + 1, len(curve))]
    return statistics.mean(steps) if steps else None


def summarize(runs: dict, methods: list[str], seeds: list[int]) -> dict:
    out = {}
    for method in methods:
        sides = {}
        for side in ("htfllib", "hfl_bench"):
            done = [runs[key(method, side, s)] for s in seeds if key(method, side, s) in runs]
            if not done:
                continue
            curves = [r["curve"] for r in done]
            mean_curve = [statistics.mean(c[i] for c in curves) for i in range(min(map(len, curves)))]
            bests = [best(c) for c in curves]
            sides[side] = {"seeds": len(done), "mean_curve": [round(x, 3) for x in mean_curve],
                           "best_acc": round(statistics.mean(b for _, b in bests), 3),
                           "best_rounds": [r for r, _ in bests],
                           "round_to_round": _mean_or_none([j for j in map(round_to_round, curves) if j is not None]),
                           "seconds_per_round": round(statistics.mean(x for r in done for x in r["seconds"][1:]), 2),
                           "cpu_s_per_round": _mean_or_none([x for r in done for x in r.get("cpu_s", [])[1:]])}
        if len(sides) == 2:
            a, b = sides["htfllib"]["mean_curve"], sides["hfl_bench"]["mean_curve"]
            sides["mean_abs_curve_diff"] = round(statistics.mean(abs(x - y) for x, y in zip(a, b)), 3)
            sides["best_diff"] = round(sides["hfl_bench"]["best_acc"] - sides["htfllib"]["best_acc"], 3)
        out[method] = sides
    return out


EARLY = range(1, 6)  # MNIST saturates near 99% within a few rounds: the early rounds carry the check
SHOWN_ROUNDS = (0, 1, 2, 3, 5, 10, 20, 30)


def diagnostics(settings: dict) -> str:
    """``" (diagnostics: ...)"`` naming the HtFLlib diagnostics a file was made with; empty for none."""
    on = [f"{k.removeprefix('htfllib_').replace('_', ' ')} {settings[k]}" for k in HTFLLIB_DIAGNOSTICS
          if settings.get(k, SETTING_DEFAULTS[k]) != SETTING_DEFAULTS[k]]
    return f" (diagnostics: {', '.join(on)})" if on else ""


def report(doc: dict) -> str:
    """The comparison as markdown: a summary row per method, then both mean curves at a few rounds.

    Best round: each seed's maximum over rounds 0..R, averaged over seeds (HtFLlib's ``average_data``);
    the curve differences compare the two sides' mean curves round by round."""
    settings, lines = doc["settings"], []
    lines += [f"{settings['rounds']} rounds, lr {settings['lr']}, batch {settings['batch_size']}, "
              f"{settings['local_epochs']} local epoch, {settings['clients']} clients, HtFLlib "
              f"{settings['htfllib_commit'][:7]}{diagnostics(settings)}; accuracy in % (HtFLlib's metric: correct "
              "over total on the clients' test files).", "",
              "| method | seeds (HtFLlib / hfl-bench) | HtFLlib best | hfl-bench best | difference "
              f"| mean abs. curve difference | rounds 1-{settings['rounds']} | rounds 1-5 | largest (round) "
              f"| round-to-round change after round {STEADY_FROM} (HtFLlib / hfl-bench) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    shown = []
    for method, s in doc.get("summary", {}).items():
        h, b = s.get("htfllib"), s.get("hfl_bench")
        if not (h and b):
            continue
        diffs = [y - x for x, y in zip(h["mean_curve"], b["mean_curve"])]
        trained = [abs(d) for d in diffs[1:]]  # round 0 aside: untrained models, and 0% for HtFLlib's
        early = [abs(diffs[r]) for r in EARLY if r < len(diffs)]  # prototype methods (no global prototypes yet)
        worst = max(range(len(diffs)), key=lambda r: abs(diffs[r]))
        lines.append(f"| {method} | {h['seeds']} / {b['seeds']} | {h['best_acc']:.2f} | {b['best_acc']:.2f} "
                     f"| {s['best_diff']:+.2f} | {s['mean_abs_curve_diff']:.2f} | {_mean_or_nan(trained):.2f} "
                     f"| {_mean_or_nan(early):.2f} | {diffs[worst]:+.2f} ({worst}) "
                     f"| {_or_dash(h.get('round_to_round'))} / {_or_dash(b.get('round_to_round'))} |")
        shown.append((method, h["mean_curve"], b["mean_curve"]))
    rounds = [r for r in SHOWN_ROUNDS if r <= settings["rounds"]]
    lines += ["", "Mean curves (HtFLlib / hfl-bench) at rounds " + ", ".join(map(str, rounds)) + ":", "",
              "| method | " + " | ".join(f"round {r}" for r in rounds) + " |",
              "|---|" + "---|" * len(rounds)]
    for method, a, b in shown:
        lines.append(f"| {method} | " + " | ".join(f"{a[r]:.2f} / {b[r]:.2f}" for r in rounds
                                                    if r < min(len(a), len(b))) + " |")
    return "\n".join(lines + interval_lines(doc, [m for m, _, _ in shown])) + "\n"


def overview(docs: list[dict]) -> str:
    """One markdown table over several results files (the study's folders): per file and method the
    two best rounds, their difference, the mean curves' mean absolute difference over rounds 1..R
    and the rounds whose Welch interval is clear of 0 after Holm's adjustment (``interval_lines``)."""
    lines = ["| task | method | seeds (HtFLlib / hfl-bench) | HtFLlib best | hfl-bench best | difference "
             "| mean abs. curve difference, rounds 1-R | after Holm: hfl-bench above (rounds) "
             "| after Holm: HtFLlib above (rounds) |", "|---|---|---|---|---|---|---|---|---|"]
    for doc in docs:
        task = f"{doc['settings'].get('task', 'pfl-npz')}{diagnostics(doc['settings'])}"
        for method, s in summary_of(doc.get("runs", {})).items():
            h, b = s.get("htfllib"), s.get("hfl_bench")
            if not (h and b):
                continue
            trained = [abs(y - x) for x, y in zip(h["mean_curve"][1:], b["mean_curve"][1:])]
            iv = round_intervals(doc, method)
            above, below = map(_spans, resolved_rounds(iv)[2:]) if iv else ("-", "-")  # "-": under two seeds
            lines.append(f"| {task} | {method} | {h['seeds']} / {b['seeds']} | {h['best_acc']:.2f} "
                         f"| {b['best_acc']:.2f} | {s['best_diff']:+.2f} | {_mean_or_nan(trained):.2f} "
                         f"| {above} | {below} |")
    return "\n".join(lines) + "\n"


def round_intervals(doc: dict, method: str) -> list[tuple[float, float, float, float]] | None:
    """Per round 0..R: hfl-bench's mean accuracy minus HtFLlib's over seeds, Welch's 95% interval and
    p-value (the two sides' runs are independent draws, not paired); None under two seeds a side."""
    from scipy import stats

    curves = {side: [run["curve"] for k, run in doc.get("runs", {}).items()
                  if k.startswith(f"{method}/{side}/")]
              for side in ("htfllib", "hfl_bench")}
    if min(len(c) for c in curves.values()) < 2:
        return None
    out = []
    for r in range(min(len(c) for side in curves.values() for c in side)):
        a, b = ([c[r] for c in curves[side]] for side in ("hfl_bench", "htfllib"))
        with warnings.catch_warnings():  # a side without spread (HtFLlib's 0% at round 0): nan, said so
            warnings.simplefilter("ignore", RuntimeWarning)
            test = stats.ttest_ind(a, b, equal_var=False)
        ci = test.confidence_interval(0.95)
        out.append((statistics.mean(a) - statistics.mean(b), float(ci.low), float(ci.high), float(test.pvalue)))
    return out


def interval_lines(doc: dict, methods: list[str]) -> list[str]:
    """The report's per-round intervals: rounds 1-5 in full, the rounds whose interval is clear of 0,
    the same after Holm's adjustment over rounds 1-R (R tests: some clear 0 by chance alone), and the
    largest difference after round 5."""
    rows = [(m, iv) for m in methods if (iv := round_intervals(doc, m))]
    if not rows:
        return []
    shown = [r for r in EARLY if r < min(len(iv) for _, iv in rows)]
    last = min(len(iv) for _, iv in rows) - 1
    lines = ["", "Per-round difference, hfl-bench minus HtFLlib, with Welch's 95% interval over seeds (the "
             "sides' runs are independent, not paired). The rounds whose interval is clear of 0 are listed "
             f"as they are and after Holm's adjustment over rounds 1-{last} (with {last} tests, some "
             "intervals clear 0 by chance alone):", "",
             "| method | " + " | ".join(f"round {r}" for r in shown) + " | hfl-bench above (rounds) "
             f"| HtFLlib above (rounds) | after Holm: hfl-bench above | after Holm: HtFLlib above "
             f"| largest after round {STEADY_FROM} (round) |",
             "|---|" + "---|" * (len(shown) + 5)]
    for method, iv in rows:
        late = range(STEADY_FROM + 1, len(iv))
        worst = max(late, key=lambda r: abs(iv[r][0])) if late else None
        lines.append(f"| {method} | " + " | ".join(_interval(*iv[r][:3]) for r in shown) + " | "
                     + " | ".join(map(_spans, resolved_rounds(iv))) + " | "
                     + ("-" if worst is None else f"{_interval(*iv[worst][:3])} ({worst})") + " |")
    return lines


def resolved_rounds(iv: list[tuple[float, float, float, float]]) -> tuple[list[int], ...]:
    """Of rounds 1..R (``round_intervals``): those whose interval is above 0 (hfl-bench's side above),
    below 0 (HtFLlib's above), and the same two after Holm's adjustment over the R rounds (a round
    without spread on either side counts as p = 1)."""
    from hfl_bench.results.paired import holm

    trained = range(1, len(iv))
    p_holm = dict(zip(trained, holm([1.0 if iv[r][3] != iv[r][3] else iv[r][3] for r in trained])))
    above = [r for r in trained if iv[r][1] > 0]
    below = [r for r in trained if iv[r][2] < 0]
    return above, below, [r for r in above if p_holm[r] < 0.05], [r for r in below if p_holm[r] < 0.05]


def _interval(mean: float, low: float, high: float) -> str:
    return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]" if low == low else f"{mean:+.2f} [-]"  # nan: no spread


def _spans(rounds: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1-3, 7"``; ``"none"`` for no round."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or "none"


def plot(doc: dict, png: Path) -> None:
    """Both sides' mean curves, one panel per method, written atomically to ``png``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = [(m, s) for m, s in doc.get("summary", {}).items() if s.get("htfllib") and s.get("hfl_bench")]
    if not shown:
        raise ValueError("no method has runs on both sides yet")
    cols = min(3, len(shown))
    rows = -(-len(shown) // cols)
    fig = Figure(figsize=(max(6, 4 * cols), 3 * rows + 0.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    for ax, (method, s) in zip(axes, shown):
        for side, label, style in (("htfllib", "HtFLlib", "-"), ("hfl_bench", "hfl-bench", "--")):
            curve = s[side]["mean_curve"]
            ax.plot(range(len(curve)), curve, style, label=f"{label} ({s[side]['seeds']} seeds)")
        ax.set_title(f"{method}: mean |difference| {s['mean_abs_curve_diff']:.2f}", fontsize=9)
        ax.grid(True, alpha=0.2)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    st = doc["settings"]
    fig.supxlabel("round", fontsize=8)
    fig.supylabel("accuracy on the clients' test files (%)", fontsize=8)
    fig.suptitle(f"HtFLlib (at {st['htfllib_commit'][:7]}) and hfl-bench, mean curves\n"
                 f"{st.get('task', 'pfl-npz')}, {st['clients']} clients, {st['rounds']} rounds", fontsize=10)
    write(png, lambda f: fig.savefig(f, format="png", dpi=100))


def methods_and_seeds(runs: dict) -> tuple[list[str], list[int]]:
    return list(dict.fromkeys(k.split("/")[0] for k in runs)), sorted({int(k.rsplit("seed", 1)[1]) for k in runs})


def summary_of(runs: dict) -> dict:
    """The summary of every method and seed in ``runs``."""
    return summarize(runs, *methods_and_seeds(runs))


def merge(docs: list[dict]) -> dict:
    """One results document from several made with the same settings: their runs joined (a run in
    two files must be the same run), the union of the methods' hfl-bench parameters, a fresh summary."""
    first = docs[0]
    params: dict = {}
    runs: dict = {}
    for d in docs:
        if not same_setting(d["settings"], first["settings"]):
            raise ValueError("the files were made with different settings; only runs of one setting can be joined")
        for m, p in d["settings"].get("hfl_bench_params", {}).items():
            join(params, m, p, f"{m}'s hfl-bench parameters differ between the files")
        for k, run in d["runs"].items():
            join(runs, k, run, f"run {k} differs between the files")
    return {**first, "settings": {**first["settings"], "hfl_bench_params": params}, "runs": runs,
            "merged_from": len(docs), "summary": summary_of(runs)}


# Settings of HtFLlib's side alone that only the diagnostics change: hfl-bench's runs do not depend on them.
HTFLLIB_DIAGNOSTICS = ("htfllib_loader", "htfllib_tgp_protos")


def borrow_hfl_bench(doc: dict, others: list[dict]) -> dict:
    """``doc`` (a diagnostic run of HtFLlib's side) with hfl-bench's runs of its methods taken from
    ``others``: results files whose settings agree but for HtFLlib's diagnostics (hfl-bench's side
    is the same run there), with the same hfl-bench parameters per method; a fresh summary."""
    blind = lambda settings: settings | dict.fromkeys(HTFLLIB_DIAGNOSTICS)  # same_setting fills the rest  # noqa: E731
    runs = dict(doc["runs"])
    methods, seeds = methods_and_seeds(runs)
    for other in others:
        if not same_setting(blind(other["settings"]), blind(doc["settings"])):
            raise ValueError("a file to borrow from was made with other settings than HtFLlib's diagnostics")
        for k, run in other["runs"].items():
            method, side, _ = k.split("/")
            if side != "hfl_bench" or method not in methods or int(k.rsplit("seed", 1)[1]) not in seeds:
                continue
            mine, theirs = (d["settings"].get("hfl_bench_params", {}).get(method, []) for d in (doc, other))
            if mine != theirs:
                raise ValueError(f"{method}'s hfl-bench parameters differ between the files")
            join(runs, k, run, f"run {k} differs between the files")
    return {**doc, "runs": runs, "hfl_bench_runs_from": len(others), "summary": summary_of(runs)}


def join(into: dict, k: str, value, message: str) -> None:
    """``into[k] = value`` unless ``into`` holds another value there: then ValueError(message)."""
    if into.setdefault(k, value) != value:
        raise ValueError(message)


def _or_dash(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _mean_or_nan(xs: list[float]) -> float:
    return statistics.mean(xs) if xs else float("nan")


def _mean_or_none(xs: list[float]) -> float | None:
    return round(statistics.mean(xs), 2) if xs else None


def key(method: str, side: str, seed: int) -> str:
    return f"{method}/{side}/seed{seed}"


def write(path: Path, doc) -> None:
    """``doc`` as JSON, or what a callable writes to a binary file, atomically."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    if callable(doc):
        with tmp.open("wb") as f:
            doc(f)
    else:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def settings(args, commit: str) -> dict:
    return {"task": task_of(args.data), "data": data_identity(args.data), "rounds": args.rounds, "lr": LR,
            "batch_size": BATCH, "local_epochs": EPOCHS, "clients": CLIENTS,
            "feature_dim": 512, "grad_clip_10": sorted(CLIPPED), "heldout_fraction": args.heldout_fraction,
            "eval_every": args.eval_every,
            "hfl_bench_inputs": "standardized" if args.standardize else "as in the files",
            "hfl_bench_init": "shared" if args.shared_init else "own",
            "htfllib_commit": commit, "htfllib_loader": args.htfllib_loader,
            "htfllib_tgp_protos": args.htfllib_tgp_protos,
            "hfl_bench_params": {m: args.set_for(m) for m in args.methods}}


# Settings added after results files were first written, with the value those files had.
SETTING_DEFAULTS = {"hfl_bench_init": "own", "htfllib_loader": "as-is", "htfllib_tgp_protos": "as-is"}


def same_setting(a: dict, b: dict) -> bool:
    """Two results files' settings agree, hfl-bench's per-method parameters aside (checked per method)."""
    return SETTING_DEFAULTS | a | {"hfl_bench_params": None} == SETTING_DEFAULTS | b | {"hfl_bench_params": None}


# The settings HtFLlib's runs depend on: a change to any other (hfl-bench's side) keeps them.
HTFLLIB_SETTINGS = ("task", "data", "rounds", "lr", "batch_size", "local_epochs", "clients", "feature_dim",
                    "htfllib_commit", "htfllib_loader", "htfllib_tgp_protos")


def resumable(doc: dict, wanted: dict) -> dict:
    """The runs of an earlier results file that this command's settings can keep: all of them when
    the settings match (hfl-bench's per-method parameters are checked per method by the caller),
    HtFLlib's alone when only hfl-bench's side changed, none otherwise."""
    old, new, runs = SETTING_DEFAULTS | doc.get("settings", {}), SETTING_DEFAULTS | wanted, doc.get("runs", {})
    if same_setting(old, new):
        return dict(runs)
    if all(old.get(k) == new.get(k) for k in HTFLLIB_SETTINGS):
        return {k: v for k, v in runs.items() if k.split("/")[1] == "htfllib"}
    return {}


def data_identity(data: str) -> str:
    """The folder's fingerprint (hfl-bench's hash of config.json and every client file)."""
    from hfl_bench.data import get_task

    return get_task(task_of(data)).fingerprint(Path(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--htfllib", help="an HtFLlib checkout (git), exported at --htfllib-commit")
    ap.add_argument("--htfllib-commit", default=None, help="default: htfllib_run.DEFAULT_COMMIT (6e6f1ae)")
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "mnist-htfl"),
                    help="a folder in the PFLlib / HtFLlib layout (config.json, train/, test/): HtFLlib's MNIST "
                         "split, or the CIFAR-10 subsample of benchmarks/pfl_cifar10.py")
    ap.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help=f"of {', '.join(METHODS)}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--heldout-fraction", type=float, default=HELDOUT, help="hfl-bench's held-out fraction")
    ap.add_argument("--standardize", action="store_true", help="hfl-bench standardizes each channel with its "
                    "training statistics, as its tasks do (default: the files' values as they are, as HtFLlib)")
    ap.add_argument("--shared-init", action="store_true",
                    help="hfl-bench's clients all start from client 0's initial model, as HtFLlib's clients "
                         "share one (default: each client draws its own, as hfl-bench's protocol does)")
    ap.add_argument("--eval-every", type=int, default=0, help="hfl-bench's own test rounds (figures not compared): "
                    "0 = the last round only")
    ap.add_argument("--set", action="append", default=[], metavar="METHOD:KEY=VALUE",
                    help="an hfl-bench hyperparameter of one method (repeatable), e.g. fedproto:lam=10")
    ap.add_argument("--htfllib-loader", choices=("as-is", "shuffled"), default="as-is",
                    help="a diagnostic: 'shuffled' gives HtFLlib's clients a training loader that shuffles every "
                         "epoch and keeps the last partial batch, as hfl-bench's training does (default: HtFLlib's "
                         "own, fixed order, last partial batch dropped)")
    ap.add_argument("--htfllib-tgp-protos", choices=("as-is", "after-training"), default="as-is",
                    help="a diagnostic: 'after-training' makes HtFLlib's FedTGP clients upload the prototypes of "
                         "the model they have just trained, as the paper and hfl-bench's fedtgp do (default: "
                         "HtFLlib's own, those of the model saved at the start of the round)")
    ap.add_argument("--sides", nargs="+", default=["htfllib", "hfl_bench"], choices=["htfllib", "hfl_bench"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results" / "htfllib-side-by-side.json"))
    ap.add_argument("--resume", action="store_true", help="keep the matching runs already in --out")
    ap.add_argument("--report", action="store_true", help="print --out's comparison as markdown and exit")
    ap.add_argument("--plot", metavar="PNG", help="draw --out's mean curves, one panel per method, and exit")
    ap.add_argument("--hfl-bench-from", nargs="+", metavar="FILE", help="with --report / --plot of a diagnostic run of "
                    "HtFLlib's side alone: hfl-bench's runs of its methods and seeds from these results files (made "
                    "with the same settings but HtFLlib's diagnostics)")
    ap.add_argument("--overview", nargs="+", metavar="FILE", help="print one markdown table over results files "
                    "(the study's folders): per method the best rounds, their difference, the curves' mean "
                    "absolute difference and the rounds resolved after Holm's adjustment, and exit")
    ap.add_argument("--merge", nargs="+", metavar="FILE", help="join the runs of results files made with the same "
                    "settings (e.g. two processes, one per core, on different methods) into --out and exit")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one hfl-bench run (hfl_bench_worker)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        hfl_bench_worker(args)
        return
    if args.overview:
        sys.stdout.write(overview([json.loads(Path(f).read_text()) for f in args.overview]))
        return
    if args.report or args.plot:
        doc = json.loads(Path(args.out).read_text())
        if args.hfl_bench_from:  # summarizes the joined runs
            try:
                doc = borrow_hfl_bench(doc, [json.loads(Path(f).read_text()) for f in args.hfl_bench_from])
            except ValueError as e:
                ap.error(str(e))
        elif doc.get("runs"):  # summarized anew: a file written by an earlier harness gets today's figures
            doc["summary"] = summary_of(doc["runs"])
        if args.plot:
            plot(doc, Path(args.plot))
        if args.report:
            sys.stdout.write(report(doc))
        return
    if args.merge:
        try:
            doc = merge([json.loads(Path(f).read_text()) for f in args.merge])
        except ValueError as e:
            ap.error(str(e))
        write(Path(args.out), doc)
        print(f"wrote {args.out}: {len(doc['runs'])} runs")
        return
    unknown = [m for m in args.methods if m not in METHODS]
    bad_set = [s for s in args.set if ":" not in s or "=" not in s.partition(":")[2]]
    if unknown or bad_set or not args.htfllib:
        ap.error(f"unknown methods {unknown} (known: {', '.join(METHODS)})" if unknown else
                 f"--set takes METHOD:KEY=VALUE, got {bad_set}" if bad_set else "--htfllib PATH is required")
    args.set_for = lambda m: [s.partition(":")[2] for s in args.set if s.partition(":")[0] == m]

    import htfllib_run
    import torch

    from hfl_bench.provenance import git_info

    system, commit = htfllib_run.export(Path(args.htfllib), Path(args.data),
                                        args.htfllib_commit or htfllib_run.DEFAULT_COMMIT)
    out = Path(args.out)
    wanted = settings(args, commit)
    doc = json.loads(out.read_text()) if args.resume and out.exists() else {}
    runs = resumable(doc, wanted)
    if args.resume and doc and len(runs) < len(doc.get("runs", {})):
        print(f"{out}: settings differ from this command's; kept {len(runs)} of its {len(doc['runs'])} runs",
              flush=True)
    for m in args.methods:  # a method whose hfl-bench hyperparameters changed is rerun on that side
        old = doc.get("settings", {}).get("hfl_bench_params", {}).get(m)
        if old is not None and old != args.set_for(m):
            runs = {k: v for k, v in runs.items() if not k.startswith(f"{m}/hfl_bench/")}
    log = Path(tempfile.gettempdir()) / "htfllib-side-by-side.log"
    print(f"HtFLlib {commit[:10]} in {system}; logs in {log}", flush=True)
    doc = {"what": __doc__.splitlines()[0], "settings": wanted, "notes": NOTES, "hfl_bench_code": git_info(),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                       "threads": args.threads},
           "runs": runs}
    try:
        with log.open("a") as log_file:
            for method in args.methods:
                for seed in args.seeds:
                    for side in args.sides:
                        k = key(method, side, seed)
                        if k in runs:
                            continue
                        print(f"{k}", flush=True)
                        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
                        runs[k] = (run_htfllib(method, seed, args, system, log) if side == "htfllib"
                                   else run_hfl_bench(method, seed, args, log_file))
                        runs[k].update(started=started, load_1min=round(os.getloadavg()[0], 2),
                                       harness_commit=doc["hfl_bench_code"].get("git_sha"))
                        doc["summary"] = summarize(runs, args.methods, args.seeds)
                        write(out, doc)
    finally:
        import shutil

        shutil.rmtree(system.parent, ignore_errors=True)
    for method, s in summarize(runs, args.methods, args.seeds).items():
        h, b = s.get("htfllib"), s.get("hfl_bench")
        print(f"{method}: HtFLlib best {h and h['best_acc']} ({h and h['cpu_s_per_round']} CPU s/round), hfl-bench "
              f"best {b and b['best_acc']} ({b and b['cpu_s_per_round']} CPU s/round), mean |curve diff| "
              f"{s.get('mean_abs_curve_diff')}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
