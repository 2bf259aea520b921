"""hfl-bench against HtFLlib on HtFLlib's FML workload: seconds per round, training and evaluation.

The workload (issue 18): FML on HtFLlib's shipped MNIST partition (20 clients, Dirichlet 0.1;
``../shared/data/mnist-htfl``, task ``pfl-npz``), every client's private model and the meme
HtFLlib's ``FedAvgCNN`` (conv 32-64, fc 512; built here through the plugin pool in
``benchmarks/htfl_pool.py``), batch 64, one local epoch, lr 0.01, held-out fraction 0.2, CPU, one
torch thread.

With ``--htfllib PATH`` (an HtFLlib checkout) both sides run now, in one session on one machine:
HtFLlib's own FML (``system/`` exported at ``--htfllib-commit`` into a temporary folder and run by
``benchmarks/htfllib_driver.py`` as a subprocess, its data linked to ``--data``) one gated round
at a time, interleaved with hfl-bench's rounds in this process, so load drift hits both. It
reports HtFLlib's seconds per round (its loop: evaluation of every model on its own client's test
file, then training and aggregation) and hfl-bench's

- **tested round** (``--eval-every 1``: validation, the global test set, the local test halves and
  the meme endpoint after every round),
- **amortized round over a 300-round run** at the default evaluation policy (``--eval-every 10``):
  ``(n_plain * plain + n_tested * tested) / 300``, where ``plain`` is the mean measured round
  without a test (training + validation), ``tested`` the mean measured tested round and
  ``n_tested`` = 39 the test rounds of such a run (every 10th and each of the last 10); the best
  round's deferred figures, computed at most once per checkpoint, are not in it,

and both ratios to HtFLlib's round, in wall seconds and in CPU seconds of each process (less
sensitive to other jobs on the machine), with the load average around each pair of rounds.
Writes ``benchmarks/results/htfllib-fml-mnist20-live.json``.

Without ``--htfllib`` (history): HtFLlib's side is the figures stored when issue 18 was filed, and
hfl-bench's side is measured for the two evaluation policies (``htfllib-fml-mnist20.json``).

    OMP_NUM_THREADS=1 python benchmarks/bench_htfllib.py --htfllib PATH [--data ../shared/data/mnist-htfl]
        [--rounds 10] [--tested-rounds 2]
    OMP_NUM_THREADS=1 python benchmarks/bench_htfllib.py [--rounds 10] [--every-round-rounds 1] [--digits-crad]
        [--floor]

``--floor`` measures only the bare-torch training floor of the workload (``torch_floor``): what
one round's training costs on this CPU with no framework at all.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# History (the path without --htfllib): measured when issue 18 was filed: HtFLlib's FML
# (system/main.py -algo FML, its FedAvgCNN, batch 64, one local epoch, CPU, one thread) on the same
# data on one 2-core machine of this project, beside hfl-bench's own run under the same load.
HTFLLIB = {
    "source": "issue 18 (measured side by side on this project's 2-core machine type, same load)",
    "training_s_per_round": [71, 79],
    "training_samples": 52492,
    "evaluation_s_per_round": 4.4,
    "evaluation": "each private model on its own client's test split (17,508 images in all), every round",
    "round_s": [76, 84],
}
# hfl-bench before the evaluation policy, from the same table (commit of the issue).
BEFORE = {"source": "issue 18", "training_s_per_round": 34.4, "evaluation_s_per_round": [179, 187],
          "round_s": [213, 218], "training_samples": 41998}


def config(data: str, eval_every: int, budget: int):
    from hfl_bench.config import RunConfig
    from hfl_bench.engine import load_task

    import htfl_pool

    return load_task(RunConfig(method="fml", task="pfl-npz", data_dir=data, pool=htfl_pool.POOL, batch_size=64,
                               local_epochs=1, lr=0.01, heldout_fraction=0.2, rounds=budget, seed=0,
                               eval_every=eval_every, checkpoint_every=0, device="cpu"))[1]


def measure(data: str, eval_every: int, rounds: int) -> dict:
    from hfl_bench.engine import Simulation

    t = time.perf_counter()
    sim = Simulation(config(data, eval_every, budget=10_000))
    setup_s = time.perf_counter() - t
    entries = []
    for rnd in range(1, rounds + 1):
        entries.append(e := sim.step(rnd))
        print(f"  k={eval_every} round {rnd}: {e['seconds']:.1f} s (training {e['phases'].get('training', 0):.1f}, "
              f"evaluation {e['phases'].get('evaluation', 0):.1f})", flush=True)
    training = [e["phases"].get("training", 0.0) for e in entries]
    evaluation = [e["phases"].get("evaluation", 0.0) for e in entries]
    seconds = [e["seconds"] for e in entries]
    out = {
        "eval_every": eval_every, "rounds": rounds, "setup_s": round(setup_s, 1),
        "round_s": round(statistics.mean(seconds), 2),
        "training_s": round(statistics.mean(training), 2),
        "evaluation_s": round(statistics.mean(evaluation), 2),
        "other_s": round(statistics.mean(seconds) - statistics.mean(training) - statistics.mean(evaluation), 2),
        "per_round": [{"round": e["round"], "s": round(e["seconds"], 2), "training_s": round(tr, 2),
                       "evaluation_s": round(ev, 2), "tested": e["global_acc"] is not None}
                      for e, tr, ev in zip(entries, training, evaluation)],
        "training_samples": sum(len(c.train_idx) for c in sim.fed.clients),
        "test_images": len(sim.fed.data.test_y),
    }
    return out


def test_round_seconds(data: str) -> float:
    """One test round's evaluation on its own: every model on the global test set and its local
    test half, the meme endpoint (one evaluation: the memes are one model after the broadcast)."""
    from hfl_bench.engine import Simulation

    sim = Simulation(config(data, 1, budget=10_000))
    models, ev = sim.method.eval_models(sim.fed), sim.evaluator
    t = time.perf_counter()
    ev(1, models, list(range(sim.fed.n_clients)), last=True, endpoints=sim.method.endpoints(sim.fed))
    return time.perf_counter() - t


def whole_run(method: str, task: str, eval_every: int) -> dict:
    """A whole run at the task's defaults: mean seconds per round, training and evaluation."""
    from hfl_bench.config import RunConfig
    from hfl_bench.engine import load_task, run

    cfg = load_task(RunConfig(method=method, task=task, seed=0, eval_every=eval_every, checkpoint_every=0,
                              device="cpu"))[1]
    result = run(cfg)
    rounds = result.history[1:]
    phase = lambda name: statistics.mean(h["phases"].get(name, 0.0) for h in rounds)  # noqa: E731
    return {"method": method, "task": task, "rounds": len(rounds), "eval_every": eval_every,
            "round_s": round(statistics.mean(h["seconds"] for h in rounds), 3),
            "training_s": round(phase("training") + phase("teacher_inference") + phase("training_with_teachers"), 3),
            "evaluation_s": round(phase("evaluation"), 3),
            "tested_rounds": sum(h["global_acc"] is not None for h in rounds),
            "selected": {"round": result.best.round, "global_acc": round(float(result.best.global_acc.mean()), 4)}}


def torch_floor(samples: int, batch: int = 64, repeats: int = 3) -> dict:
    """The floor under any framework's training on this workload: two FedAvgCNNs trained mutually
    (forward both, CE + KL each, one backward, clip, SGD step each) in a bare torch loop on random
    images, no data pipeline, no evaluation. Milliseconds per sample (best of ``repeats`` passes
    over 2,100 samples, one client's share), and the seconds one round of ``samples`` would take;
    also with channels-last weights and inputs (not what hfl-bench trains with)."""
    import torch
    import torch.nn.functional as F

    from htfl_pool import FedAvgCNN

    def one_pass(channels_last: bool, n: int = 2100) -> float:
        torch.manual_seed(0)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        models = [FedAvgCNN().to(memory_format=fmt) for _ in range(2)]
        opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4) for m in models]
        x_all, y_all = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
        t = time.perf_counter()
        for s in range(0, n, batch):
            x, y = x_all[s:s + batch].contiguous(memory_format=fmt), y_all[s:s + batch]
            logits = [m(x) for m in models]
            probs = [z.detach().softmax(-1) for z in logits]
            loss = sum(0.5 * F.cross_entropy(z, y) + 0.5 * F.kl_div(z.log_softmax(-1), p, reduction="batchmean")
                       for z, p in zip(logits, reversed(probs)))
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()
            for m, o in zip(models, opts):
                torch.nn.utils.clip_grad_norm_(m.parameters(), 10.0)
                o.step()
        return (time.perf_counter() - t) / n * 1e3

    out = {"what": torch_floor.__doc__.split("\n\n")[0].replace("\n", " "), "samples": samples}
    for name, cl in (("contiguous", False), ("channels_last", True)):
        ms = min(one_pass(cl) for _ in range(repeats))
        out[name] = {"ms_per_sample": round(ms, 3), "round_training_s": round(ms * samples / 1e3, 1)}
    return out


LIVE_RUN_ROUNDS = 300  # the run length the amortized round is for


def tested_rounds_in(run_rounds: int, eval_every: int) -> int:
    """Test rounds of a ``run_rounds`` run (``Evaluator.is_test_round``, round 0 not counted)."""
    from hfl_bench.config import FINAL_ROUNDS

    return sum(r % eval_every == 0 or r > run_rounds - FINAL_ROUNDS for r in range(1, run_rounds + 1))


def timed_step(sim, rnd: int) -> dict:
    cpu = time.process_time()
    e = sim.step(rnd)
    return {"round": rnd, "s": round(e["seconds"], 3), "cpu_s": round(time.process_time() - cpu, 3),
            "training_s": round(e["phases"].get("training", 0.0), 3),
            "evaluation_s": round(e["phases"].get("evaluation", 0.0), 3), "tested": e["global_acc"] is not None}


def live(args) -> None:
    """Both sides now, HtFLlib's rounds interleaved with hfl-bench's (module docstring)."""
    import shutil

    import htfllib_run
    import torch

    from hfl_bench.config import EVAL_EVERY
    from hfl_bench.engine import Simulation
    from hfl_bench.provenance import git_info

    system, commit = htfllib_run.export(Path(args.htfllib), Path(args.data), args.htfllib_commit)
    log = Path(tempfile.gettempdir()) / "htfllib-driver.log"  # HtFLlib's own output, kept for a failed run
    log.unlink(missing_ok=True)
    n_htfl = args.rounds + args.tested_rounds
    cmd = htfllib_run.driver_command("FML", n_htfl, 64, 1, 0.01, 20, ["-al", "0.5", "-bt", "0.5"], gate=True)
    driver = htfllib_run.Driver(system, cmd, log)
    pairs = []
    try:
        for policy, every, rounds in (("default", EVAL_EVERY, args.rounds), ("tested", 1, args.tested_rounds)):
            sim = Simulation(config(args.data, every, budget=10_000))
            for rnd in range(1, rounds + 1):
                load0 = os.getloadavg()[0]
                h = driver.round()
                mine = timed_step(sim, rnd)
                pair = {"policy": policy, "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
                        "htfllib": {k: h[k] for k in ("round", "seconds", "cpu_s", "training_s", "evaluation_s")},
                        "hfl_bench": mine}
                pairs.append(pair)
                print(f"{policy:7s} round {rnd}: HtFLlib {h['seconds']:.1f} s (cpu {h['cpu_s']:.1f}; training "
                      f"{h['training_s']:.1f}, evaluation {h['evaluation_s']:.1f}) | hfl-bench {mine['s']:.1f} s "
                      f"(cpu {mine['cpu_s']:.1f}; training {mine['training_s']:.1f}, evaluation "
                      f"{mine['evaluation_s']:.1f}, tested {mine['tested']}) | load {pair['load_1min']}", flush=True)
            del sim
    finally:
        driver.close()
        shutil.rmtree(system.parent, ignore_errors=True)
    doc = {"what": __doc__.splitlines()[0], "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "command": "OMP_NUM_THREADS=1 python benchmarks/bench_htfllib.py --htfllib <HtFLlib checkout> "
                      f"--rounds {args.rounds} --tested-rounds {args.tested_rounds}",
           "htfllib_commit": commit, "hfl_bench_code": git_info(), "machine": machine(torch), "pairs": pairs,
           "summary": summarize(pairs, tested_rounds_in(LIVE_RUN_ROUNDS, EVAL_EVERY))}
    out = HERE / "results" / "htfllib-fml-mnist20-live.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for unit, fig in doc["summary"].items():
        if isinstance(fig, dict):
            print(f"{unit}: HtFLlib {fig['htfllib_round']} s/round; hfl-bench tested round {fig['tested_round']} "
                  f"({fig['tested_ratio']}x), amortized over {LIVE_RUN_ROUNDS} rounds {fig['amortized_round']} "
                  f"({fig['amortized_ratio']}x)")
    print(f"wrote {out}")


def summarize(pairs: list[dict], n_tested: int) -> dict:
    """Mean seconds per round of each side and the two ratios, in wall and in CPU seconds."""
    out = {"run_rounds": LIVE_RUN_ROUNDS, "tested_rounds_in_run": n_tested,
           "load_1min_mean": round(statistics.mean(x for p in pairs for x in p["load_1min"]), 2)}
    for unit, key in (("wall", "s"), ("cpu", "cpu_s")):
        htfl = statistics.mean(p["htfllib"]["seconds" if key == "s" else key] for p in pairs)
        tested = [p["hfl_bench"][key] for p in pairs if p["hfl_bench"]["tested"]]
        plain = [p["hfl_bench"][key] for p in pairs if not p["hfl_bench"]["tested"]]
        if not tested or not plain:
            out[unit] = "needs at least one tested and one untested hfl-bench round"
            continue
        amortized = ((LIVE_RUN_ROUNDS - n_tested) * statistics.mean(plain) + n_tested * statistics.mean(tested)) \
            / LIVE_RUN_ROUNDS
        out[unit] = {"htfllib_round": round(htfl, 2), "untested_round": round(statistics.mean(plain), 2),
                     "tested_round": round(statistics.mean(tested), 2), "amortized_round": round(amortized, 2),
                     "tested_ratio": round(statistics.mean(tested) / htfl, 3),
                     "amortized_ratio": round(amortized / htfl, 3)}
    return out


def machine(torch) -> dict:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "processor": platform.processor() or None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "mnist-htfl"),
                    help="the PFLlib / HtFLlib MNIST folder (config.json, train/, test/)")
    ap.add_argument("--htfllib", help="an HtFLlib checkout: run its FML now, interleaved (module docstring)")
    ap.add_argument("--htfllib-commit", default=None, help="the HtFLlib commit to run (default: htfllib_run's)")
    ap.add_argument("--tested-rounds", type=int, default=2, help="with --htfllib: hfl-bench rounds with a test "
                    "every round")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of the default policy (one full period)")
    ap.add_argument("--every-round-rounds", type=int, default=1, help="rounds with a test every round")
    ap.add_argument("--digits-crad", action="store_true", help="also: whole crad runs on digits at its defaults, "
                    "with a test every round and with the default policy")
    ap.add_argument("--only-digits", action="store_true", help="skip the MNIST-20 workload")
    ap.add_argument("--floor", action="store_true", help="only the bare-torch training floor of the workload; "
                    "added to the results file, the rest of it kept")
    args = ap.parse_args()
    import torch

    from hfl_bench.config import EVAL_EVERY

    torch.set_num_threads(1)
    if args.htfllib:
        import htfllib_run

        args.htfllib_commit = args.htfllib_commit or htfllib_run.DEFAULT_COMMIT
        live(args)
        return
    if args.floor:
        path = HERE / "results" / "htfllib-fml-mnist20.json"
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc["torch_floor"] = f = torch_floor(BEFORE["training_samples"])
        print(f"bare-torch FML training: {f['contiguous']['ms_per_sample']} ms/sample = "
              f"{f['contiguous']['round_training_s']} s per round of {f['samples']} samples "
              f"(channels-last {f['channels_last']['ms_per_sample']} ms = {f['channels_last']['round_training_s']} s)",
              flush=True)
        # hfl-bench's own training of one round, right after, under the same load: the ratio is the
        # framework's overhead over the bare loop.
        engine = measure(args.data, EVAL_EVERY, 1)
        f["hfl_bench_round_training_s"] = engine["training_s"]
        f["hfl_bench_ms_per_sample"] = round(engine["training_s"] / engine["training_samples"] * 1e3, 3)
        f["hfl_bench_over_floor"] = round(f["hfl_bench_ms_per_sample"] / f["contiguous"]["ms_per_sample"], 2)
        f["date"], f["load_average"] = dt.date.today().isoformat(), os.getloadavg()
        print(f"hfl-bench: {f['hfl_bench_ms_per_sample']} ms/sample ({engine['training_samples']} samples), "
              f"{f['hfl_bench_over_floor']}x the bare loop", flush=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}")
        return
    results, digits = {}, {}
    if args.digits_crad or args.only_digits:
        for name, every in (("every round", 1), ("default", EVAL_EVERY)):
            digits[name] = d = whole_run("crad", "digits", every)
            print(f"digits crad {name:12s} (k={every}): {d['round_s']:.3f} s/round, training {d['training_s']:.3f}, "
                  f"evaluation {d['evaluation_s']:.3f}; selected round {d['selected']['round']} "
                  f"{d['selected']['global_acc']}%", flush=True)
    plans = [] if args.only_digits else [("default", EVAL_EVERY, args.rounds),
                                         ("every round", 1, args.every_round_rounds)]
    for name, every, rounds in plans:
        results[name] = measure(args.data, every, rounds)
        r = results[name]
        print(f"{name:12s} (k={every}): {r['round_s']:7.1f} s/round = training {r['training_s']:.1f} + evaluation "
              f"{r['evaluation_s']:.1f} + other {r['other_s']:.1f}  ({rounds} rounds)", flush=True)
    one_test = None
    if plans:
        one_test = round(test_round_seconds(args.data), 1)
        print(f"one test round's evaluation: {one_test:.1f} s (each of a run's last 10 rounds)")
        print(f"HtFLlib (issue 18): {HTFLLIB['round_s'][0]}-{HTFLLIB['round_s'][1]} s/round; half: "
              f"{HTFLLIB['round_s'][0] / 2:.0f}-{HTFLLIB['round_s'][1] / 2:.0f} s")
    out = HERE / "results" / ("htfllib-fml-mnist20.json" if plans else "eval-policy-digits-crad.json")
    out.write_text(json.dumps({
        "what": __doc__.splitlines()[0], "date": dt.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "load_average": os.getloadavg()},
        "htfllib": HTFLLIB, "hfl_bench_before": BEFORE, "hfl_bench": results,
        "one_test_round_evaluation_s": one_test, "digits_crad": digits,
    }, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
