"""Why does MSFKD's ensemble score below chance at one class per client (issue 62)?

Question: in ``suites/label-skew-k1.yaml`` (mnist1d, 10 clients, ``--partition classes
--classes-per-client 1``, public set 400), MSFKD's ``ensemble`` endpoint (the mean of every
client's softmax, ``hfl_bench/families/ensemble.py``) averages 4.29 % over the last 10 rounds
under Adam: far below chance (10 %). A defect, or what the predictor does?

Method: each case runs one cell in-process (``engine.Simulation``, the settings of the suite's
cell: the same config hash for the suite's own cells), then, outside the evaluator, recomputes
the ensemble from the final models on the global test set and measures each client's model:

- ``p_own_on_own`` / ``p_own_on_others``: its mean softmax probability of its own class on the
  test inputs of that class and on the other classes' inputs;
- ``constant``: whether it predicts its own class on at least 99 % of all test inputs (a model
  trained on one class that ignores its input).

Cases (chosen before any was run, to separate the distillation from everything else):
``msfkd`` under Adam (the suite's cell) and the same with ``distill_epochs=0`` (MSFKD without its
distillation: the control; it should equal ``local``), seeds 0-2; ``msfkd`` under the protocol's
SGD, and ``local`` under Adam, seed 0.

Rerun (resumable: a case already in the JSON is skipped; ``--force`` reruns all):

    export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
    python benchmarks/one_class_ensemble_study.py        # about 2 min a case on a 2-core CPU

Writes ``benchmarks/results/one-class-ensemble.json``; ``--table`` prints the study page's table
from it (``docs/studies/one-class-ensemble.md``), running nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from hfl_bench.engine import Simulation
from hfl_bench.resolved import resolve_run
from hfl_bench.training import predict_logits

OUT = Path(__file__).parent / "results" / "one-class-ensemble.json"
ADAM = {"optimizer": "adam", "lr": 0.001}
CASES = {
    **{f"msfkd-adam-seed{s}": ("msfkd", s, ADAM, {}) for s in (0, 1, 2)},
    **{f"msfkd-adam-nodistill-seed{s}": ("msfkd", s, ADAM, {"distill_epochs": 0}) for s in (0, 1, 2)},
    "msfkd-sgd-seed0": ("msfkd", 0, {}, {}),
    "local-adam-seed0": ("local", 0, ADAM, {}),
}


def settings(method: str, seed: int, optimizer: dict, method_params: dict, out: str) -> dict:
    """The suite's k = 1 mnist1d cell (suites/label-skew-k1.yaml), ``out`` aside."""
    return dict(method=method, task="mnist1d", partition="classes", classes_per_client=1, public_size=400,
                ensemble=True, seed=seed, method_params=method_params, out=out, **optimizer)


def probe(method: str, seed: int, optimizer: dict, method_params: dict) -> dict:
    with tempfile.TemporaryDirectory() as out:
        run = resolve_run(settings(method, seed, optimizer, method_params, out))
        sim = Simulation(run.cfg)
        sim.run()
    fed = sim.fed
    x, y = fed.data.test_x, fed.data.test_y
    own = [int(torch.mode(fed.data.train_y[cl.train_idx]).values) for cl in fed.clients]
    with torch.no_grad():
        probs = torch.stack([torch.softmax(predict_logits(cl.model.eval(), x), -1) for cl in fed.clients])
    ensemble = probs.mean(0).argmax(-1)
    models = [{"own_class": c,
               "p_own_on_own": round(probs[k, y == c, c].mean().item(), 4),
               "p_own_on_others": round(probs[k, y != c, c].mean().item(), 4),
               "constant": bool((probs[k].argmax(-1) == c).float().mean().item() >= 0.99)}
              for k, c in enumerate(own)]
    constant = [m for m in models if m["constant"]]
    last = sim.history[-1].get("endpoints", {}).get("ensemble", {})
    return {"config_hash": run.config_hash,
            "ensemble_global_acc_last_round_record": last.get("global_acc"),
            "ensemble_global_acc_recomputed": round(100 * (ensemble == y).float().mean().item(), 2),
            "ensemble_predicted_classes": torch.bincount(ensemble, minlength=len(own)).tolist(),
            "constant_models": len(constant),
            "constant_models_less_sure_on_own_class": sum(m["p_own_on_own"] < m["p_own_on_others"] for m in constant),
            "models": models}


def table(study: dict) -> str:
    """The study page's table: one row per case, from the JSON."""
    rows = ["| case | config hash | ensemble, record (last round) | ensemble, recomputed | classes the ensemble "
            "predicts (of 1,000 test inputs) | constant models | of which less sure on their own class |",
            "|---|---|---|---|---|---|---|"]
    for name, c in study["cases"].items():
        predicted = ", ".join(f"{k}: {n}" for k, n in enumerate(c["ensemble_predicted_classes"]) if n)
        rows.append(f"| {name} | `{c['config_hash']}` | {c['ensemble_global_acc_last_round_record']} | "
                    f"{c['ensemble_global_acc_recomputed']} | {predicted} | {c['constant_models']} of "
                    f"{len(c['models'])} | {c['constant_models_less_sure_on_own_class']} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rerun the cases already in the JSON")
    ap.add_argument("--table", action="store_true", help="print the study page's table from the JSON and exit")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(OUT.read_text())))
        return
    torch.set_num_threads(1)
    done = json.loads(OUT.read_text()) if OUT.exists() and not args.force else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    for name, (method, seed, optimizer, params) in CASES.items():
        if name in done.get("cases", {}):
            continue
        t = time.perf_counter()
        case = probe(method, seed, optimizer, params)
        case.update(method=method, seed=seed, optimizer=optimizer or "protocol", method_params=params,
                    seconds=round(time.perf_counter() - t, 1))
        done = {"commit": commit, "uncommitted_changes": dirty, "cases": {**done.get("cases", {}), name: case}}
        tmp = OUT.with_suffix(".tmp")
        tmp.write_text(json.dumps(done, indent=1) + "\n")
        os.replace(tmp, OUT)  # atomic: an interrupted study keeps every finished case
        print(name, case["ensemble_global_acc_recomputed"], case["seconds"], "s", flush=True)


if __name__ == "__main__":
    main()
