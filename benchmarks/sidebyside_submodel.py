"""HeteroFL and FedRolex side by side with their authors' code (issue 66).

The authors' code is never copied into this repository: the script exports each reference from a
git checkout (``--heterofl``: Diao et al.'s HeteroFL repository, its ``src/``; ``--fedrolex``:
Alam et al.'s FedRolex repository) into a temporary folder, applies the patches listed in
``PATCHES`` there, and runs it through ``benchmarks/sidebyside_submodel_driver.py``.

The split: the first ``--clients`` client files of an HtFLlib MNIST folder (``--data``, the
project's mnist-htfl: real MNIST, Dirichlet 0.1), each train file cut to a seeded ``--train-per-
client`` images and each test file to ``--test-per-client``, written in the same layout to a
temporary folder (task ``pfl-npz``). Both sides use the very tensors hfl-bench built from it: each
client's training rows (80% of its train file, the task's seeded split), the global test set (the
union of the test files), normalized as hfl-bench normalizes them.

Runs, all on one CPU thread, in one process each:

- **hfl-bench**: ``heterofl`` and ``fedrolex`` through ``hfl_bench.run`` (the code path of
  ``hfl-bench run``) with pool ``heterofl-cnn-paper`` (HeteroFL's CNN at 64-512 channels), the
  profile ``--profile`` fixed, uniform weighting, every client every round, ``--batch``, ``--lr``,
  SGD with momentum 0.9 and weight decay 5e-4, gradients clipped at norm 1 (the authors' clients
  clip at 1; hfl-bench's protocol at 10), ``eval_every`` R (the engine tests only its final
  window of rounds: its own figures are per client and are not compared). The script wraps the family's
  ``setup`` and ``run_round`` to keep a copy of the global model after each round; this reads the
  method's state and changes none of its numerics.
- **the references**: HeteroFL's ``train`` (``train_classifier_fed.py``) with its ``Federation``
  (``fed.py``), and FedRolex's ``ResnetServerRoll`` and ``ResnetClient`` driven as
  ``main_resnet.py`` drives them, on the same clients, with each client at the width rate hfl-bench
  drew for it and from hfl-bench's initial global model.

Evaluation: every global model (round 0 to R) of the four runs is measured here by the same code
on the same global test set, two ways: ``sbn``, HeteroFL's own (``stats`` in
``train_classifier_fed.py``: a pass over the pooled training data in batches of ``--batch`` that
gathers running statistics, then evaluation with them), and ``batch``, hfl-bench's evaluator
(``training.predict_logits``: static batch norm normalizes with the test batch's statistics, as
FedRolex's ``test`` does too).

Also, ``checks``: their slicing and aggregation functions (HeteroFL's ``Federation.distribute`` and
``combine``, FedRolex's ``ResnetServerRoll`` at several rounds) on hfl-bench's initial global model
and seeded random client updates, beside hfl-bench's ``slice_state`` and ``aggregate`` on the same
tensors and the same windows, and whether each of their windows is the one hfl-bench draws.

    OMP_NUM_THREADS=1 python benchmarks/sidebyside_submodel.py --heterofl CHECKOUT --fedrolex CHECKOUT \\
        --data MNIST_HTFL_FOLDER [--rounds 15] [--out benchmarks/results/sidebyside/FILE.json]
    python benchmarks/sidebyside_submodel.py --report FILE.json [--doc docs/studies/submodel-sidebyside.md]

``--report`` prints the per-round tables as markdown; with ``--doc`` it rewrites the block between
``<!-- written by: ... -->`` and ``<!-- end written -->`` in that page instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().with_name("sidebyside_submodel_driver.py")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "sidebyside" / "submodel-mnist.json"
PAPER_HIDDEN = (64, 128, 256, 512)

# What is changed in each temporary export, and what the driver does in their main script's
# place; each textual patch must match exactly once.
PATCHES = {
    "heterofl": [
        ("none to their files", None, None, None),
        ("driver: their train() round after round, as runExperiment calls it; their stats/test and "
         "checkpointing are not run (the script evaluates every global model itself)", None, None, None),
        ("driver: cfg after their process_control: the side by side's clients, rates, batch, lr, rounds, "
         "hidden sizes 64-512, device cpu, mask 0, no lr decay", None, None, None),
        ("driver: data from hfl-bench's split (the clients' training rows as tensors, already normalized), "
         "not their MNIST loader and iid split", None, None, None),
        ("driver: every client's label_split is every class (no masking; the output layer's rows are "
         "averaged over every holder, as hfl-bench does)", None, None, None),
        ("driver: the initial global model is hfl-bench's (same layers, same order)", None, None, None),
        ("driver: anytree, which their dataset modules import and which is not installed, is an empty module "
         "(their datasets are not used)", None, None, None),
    ],
    "fedrolex": [
        ("models/conv.py: the Sequential's members named so the server's key rules apply to the CNN "
         "(convolutions 'conv1_i': sliced and rolled; the classifier 'linear'); the layers are unchanged",
         "models/conv.py", "        self.blocks = nn.Sequential(*blocks)\n",
         "        self.blocks = nn.Sequential(__import__('collections').OrderedDict(\n"
         "            ('conv1_%d' % i if isinstance(b, nn.Conv2d) else 'linear' if isinstance(b, nn.Linear)\n"
         "             else 'm%d' % i, b) for i, b in enumerate(blocks)))\n"),
        ("resnet_client.py: the client builds the CNN (their models/conv.py), not ResNet-18",
         "resnet_client.py", "from models import resnet\n", "from models import conv\n"),
        ("resnet_client.py: on the CPU",
         "resnet_client.py", "self.model = resnet.resnet18(model_rate=self.model_rate, cfg=self.cfg).to('cuda')",
         "self.model = conv.conv(model_rate=self.model_rate).to('cpu')"),
        ("resnet_client.py: the batches on the CPU",
         "resnet_client.py", "step_input = to_device(step_input, 'cuda')", "step_input = to_device(step_input, 'cpu')"),
        ("driver: ray replaced by an in-process shim (put/get return their argument; an actor's method "
         "runs at once, clients one after another)", None, None, None),
        ("driver: main_resnet.py's round (broadcast, each client's step, server.step) without its test and "
         "checkpointing; cfg, data, label_split and initial model as for HeteroFL; overlap None and weighting "
         "'avg' (main_resnet.py's defaults)", None, None, None),
        ("driver: anytree an empty module, as for HeteroFL", None, None, None),
    ],
}


def log(msg: str) -> None:
    print(f"[{dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {msg}", flush=True)


# ---------------------------------------------------------------- the split


def write_subsample(src: Path, dst: Path, clients: int, n_train: int, n_test: int, seed: int) -> None:
    """The first ``clients`` client files of ``src``, each cut to a seeded sample, in the same layout."""
    from hfl_bench.tasks.pfl_npz import read_client_file

    rng = np.random.default_rng(seed)
    counts = []
    for split in ("train", "test"):
        (dst / split).mkdir(parents=True)
    for cid in range(clients):
        ys = []
        for split, n in (("train", n_train), ("test", n_test)):
            x, y = read_client_file(src / split / f"{cid}.npz")
            keep = np.sort(rng.permutation(len(y))[:n])
            np.savez(dst / split / f"{cid}.npz", data=np.array({"x": x[keep], "y": y[keep]}, dtype=object))
            ys.append(y[keep])
        classes, k = np.unique(np.concatenate(ys), return_counts=True)
        counts.append([[int(c), int(n)] for c, n in zip(classes, k)])
    (dst / "config.json").write_text(json.dumps({"num_clients": clients, "num_classes": 10, "non_iid": True,
                                                 "balance": False, "partition": "dir",
                                                 "Size of samples for labels in clients": counts}))


# ---------------------------------------------------------------- hfl-bench's side


def run_ours(method: str, args, data_dir: Path, out_dir: Path) -> dict:
    """One hfl-bench run; returns the global model after each round and the clients' data."""
    import hfl_bench
    from hfl_bench.families import submodel

    kept: dict = {"states": []}
    setup, run_round = submodel.SubmodelRounds.setup, submodel.SubmodelRounds.run_round

    def copy(state):
        return [v.detach().clone().float().cpu() for v in state.values() if v.is_floating_point()]

    def setup_and_keep(self, fed):
        setup(self, fed)
        kept["states"].append(copy(self.global_state))
        kept["rates"] = list(self.rates)
        kept["train_x"], kept["train_y"] = fed.data.train_x.cpu(), fed.data.train_y.cpu()
        kept["test_x"], kept["test_y"] = fed.data.test_x.cpu(), fed.data.test_y.cpu()
        kept["client_idx"] = [c.train_idx.cpu() for c in fed.clients]

    def round_and_keep(self, fed, rnd, active):
        t0 = time.perf_counter()
        out = run_round(self, fed, rnd, active)
        kept.setdefault("seconds", []).append(time.perf_counter() - t0)
        kept["states"].append(copy(self.global_state))
        return out

    submodel.SubmodelRounds.setup, submodel.SubmodelRounds.run_round = setup_and_keep, round_and_keep
    try:
        t0 = time.perf_counter()
        record = hfl_bench.run(method=method, task="pfl-npz", data_dir=str(data_dir), pool="heterofl-cnn-paper",
                               clients=args.clients, rounds=args.rounds, local_epochs=args.local_epochs,
                               batch_size=args.batch, lr=args.lr, momentum=0.9, weight_decay=5e-4, grad_clip=1.0,
                               seed=args.seed, eval_every=args.rounds, device="cpu", out=str(out_dir), threads=1,
                               method_params={"profile": args.profile, "weighting": "uniform"})
        kept["total_seconds"] = time.perf_counter() - t0
    finally:
        submodel.SubmodelRounds.setup, submodel.SubmodelRounds.run_round = setup, run_round
    kept["record_status"] = record.status
    kept["code"] = record.data.get("code", {})
    return kept


# ---------------------------------------------------------------- the references


def git(checkout: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def export(checkout: Path, kind: str, into: Path) -> tuple[Path, str]:
    """Their code at HEAD into ``into`` (HeteroFL: its src/), with ``PATCHES`` applied."""
    commit = git(checkout, "rev-parse", "HEAD")
    into.mkdir(parents=True)
    sub = ["src"] if kind == "heterofl" else []
    archive = subprocess.run(["git", "-C", str(checkout), "archive", "HEAD", *sub], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    root = into / "src" if kind == "heterofl" else into
    for _, path, old, new in PATCHES[kind]:
        if path is None:
            continue
        text = (root / path).read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{kind}: patch to {path} does not match their code once: {old!r}")
        (root / path).write_text(text.replace(old, new))
    return root, commit


def run_driver(kind: str, root: Path, job: dict, work: Path, name: str) -> dict:
    path = work / f"{name}.pt"
    torch.save({**job, "kind": kind}, path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with open(work / f"{name}.log", "w") as logf:
        proc = subprocess.run([sys.executable, str(DRIVER), str(path)], cwd=root, env=env, stdout=logf,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = (work / f"{name}.log").read_text()[-3000:]
        raise SystemExit(f"{name}: their code failed (exit {proc.returncode}):\n{tail}")
    return torch.load(str(path) + ".out", weights_only=False)


# ---------------------------------------------------------------- evaluation


def global_model(tensors: list[torch.Tensor], shape: tuple[int, ...]):
    from hfl_bench.width_models import heterofl_cnn

    model = heterofl_cnn(num_classes=10, in_chans=shape[0], img_size=shape[1:], hidden=PAPER_HIDDEN, rate=1.0)
    state = model.state_dict()
    keys = [k for k, v in state.items() if v.is_floating_point()]
    model.load_state_dict({**state, **dict(zip(keys, tensors))})
    return model


@torch.no_grad()
def evaluate(tensors: list[torch.Tensor], kept: dict, batch: int, seed: int) -> dict:
    """The global model's test accuracy (%), ``sbn`` and ``batch`` (module docstring)."""
    from torch import nn

    from hfl_bench.training import predict_logits

    x, y = kept["test_x"], kept["test_y"]
    model = global_model(tensors, tuple(x.shape[1:]))
    by_batch = (predict_logits(model, x).argmax(1) == y).float().mean().item() * 100
    # HeteroFL's stats(): the same model with running statistics (momentum None: the plain mean
    # over batches), gathered in train mode over the pooled training data, shuffled
    for i, m in enumerate(model.features):
        if isinstance(m, nn.BatchNorm2d):
            tracked = nn.BatchNorm2d(m.num_features, momentum=None, track_running_stats=True)
            tracked.load_state_dict({**tracked.state_dict(), "weight": m.weight, "bias": m.bias})
            model.features[i] = tracked
    rows = torch.cat(kept["client_idx"])
    order = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))]
    model.train()
    for s in range(0, len(order), batch):
        model(kept["train_x"][order[s:s + batch]])
    model.eval()
    sbn = (torch.cat([model(x[s:s + 100]) for s in range(0, len(x), 100)]).argmax(1) == y).float().mean().item() * 100
    return {"sbn": round(sbn, 2), "batch": round(by_batch, 2)}


def curves(states: list[list[torch.Tensor]], kept: dict, args) -> dict:
    evals = [evaluate(s, kept, args.batch, args.seed) for s in states]
    return {k: [e[k] for e in evals] for k in ("sbn", "batch")}


# ---------------------------------------------------------------- function-level checks


def check_functions(args, roots: dict, kept: dict, work: Path) -> dict:
    """Their slicing and aggregation beside ours on the same tensors (module docstring)."""
    from hfl_bench.families.submodel import aggregate, slice_state, window
    from hfl_bench.width_models import scaled_width

    shape = tuple(kept["test_x"].shape[1:])
    model = global_model(kept["states"][0], shape)
    axes = model.width_axes()
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rates = kept["rates"]
    n = len(rates)
    gen = torch.Generator().manual_seed(args.seed + 1)
    rounds = {"heterofl": [1], "fedrolex": [1, 2, 3, 17, 70]}
    out = {}
    for kind, root in roots.items():
        locals_ = []
        for rnd in rounds[kind]:
            per = []
            for cid in range(n):
                idx = {layer: torch.arange(scaled_width(full, rates[cid])) for layer, full in enumerate(PAPER_HIDDEN)}
                sliced = slice_state(state, axes, idx)
                per.append([torch.randn(sliced[k].shape, generator=gen) * 0.05 + sliced[k] for k in keys])
            locals_.append(per)
        job = {"settings": settings(args), "rates": rates, "init": kept["states"][0],
               "train_x": kept["train_x"][:1], "train_y": kept["train_y"][:1], "client_idx": kept["client_idx"],
               "check_rounds": rounds[kind], "locals": locals_}
        theirs = run_driver(f"check:{kind}", root, job, work, f"check-{kind}")["checks"]
        rows = []
        for rnd, per, got in zip(rounds[kind], locals_, theirs):
            conv_keys = [k for k in keys if len(axes[k]) == 4]
            their_idx = [{layer: got["indices"][cid][keys.index(k)][0] for layer, k in enumerate(conv_keys)}
                         for cid in range(n)]
            slice_diff = max((slice_state(state, axes, their_idx[cid])[k] - got["sliced"][cid][i]).abs().max().item()
                             for cid in range(n) for i, k in enumerate(keys))
            parts = [({k: t for k, t in zip(keys, per[cid])}, their_idx[cid], 1.0 / n) for cid in range(n)]
            mine = aggregate(state, axes, parts)
            diffs = {k: (mine[k] - got["combined"][i]).abs().max().item() for i, k in enumerate(keys)}
            # FedRolex's combine weights the biases, the BN affine parameters and the classifier by
            # update counts that it increments while it loops over the clients: kept apart from the
            # convolutions' weights, which it averages plainly ('avg')
            agg_conv = max(d for k, d in diffs.items() if k in conv_keys)
            agg_rest = max(d for k, d in diffs.items() if k not in conv_keys)
            # the window each side draws for a client below full width: ours starts at (t - 1) mod C
            # and moves up; theirs is torch.roll(arange(C), t - 1)[:k], which starts at -(t - 1) mod C
            same, mirror = True, True
            for cid in range(n):
                for layer, full in enumerate(PAPER_HIDDEN):
                    size = scaled_width(full, rates[cid])
                    if size == full:
                        continue
                    start = 0 if kind == "heterofl" else (rnd - 1) % full
                    same &= torch.equal(their_idx[cid][layer], window(full, size, start))
                    mirror &= torch.equal(their_idx[cid][layer], window(full, size, (-start) % full))
            rows.append({"round": rnd, "max_abs_diff_slices": slice_diff, "max_abs_diff_aggregate_conv": agg_conv,
                         "max_abs_diff_aggregate_other": agg_rest,
                         "windows_equal_ours": bool(same), "windows_equal_ours_mirrored": bool(mirror)})
            log(f"check {kind} round {rnd}: {rows[-1]}")
        out[kind] = rows
    return out


# ---------------------------------------------------------------- report


def settings(args) -> dict:
    return {"clients": args.clients, "train_per_client": args.train_per_client, "test_per_client": args.test_per_client,
            "rounds": args.rounds, "local_epochs": args.local_epochs, "batch": args.batch, "lr": args.lr,
            "momentum": 0.9, "weight_decay": 5e-4, "grad_clip": 1.0, "seed": args.seed, "profile": args.profile,
            "hidden": list(PAPER_HIDDEN), "participation": 1.0}


def within(a: list[float], b: list[float], points: float = 2.0) -> dict:
    d = [abs(x - y) for x, y in zip(a, b)]
    return {"max_abs_diff": round(max(d), 2), "mean_abs_diff": round(sum(d) / len(d), 2),
            "rounds_within": sum(x <= points for x in d), "rounds": len(d),
            "last_diff": round(a[-1] - b[-1], 2)}


def report(doc: dict) -> str:
    s = doc["settings"]
    lines = [f"Global full model's test accuracy (%), {s['clients']} clients, profile {s['profile']} fixed, "
             f"{s['rounds']} rounds; hfl-bench {doc['commit'][:7]}{' (uncommitted changes)' if doc['dirty'] else ''}, "
             f"HeteroFL {doc['references']['heterofl'][:7]}, FedRolex {doc['references']['fedrolex'][:7]}; "
             f"{doc['host']['name']}, {doc['host']['date']}.", ""]
    for how, title in (("sbn", "HeteroFL's evaluation (running statistics gathered over the training data)"),
                       ("batch", "hfl-bench's evaluation (static BN: each test batch's own statistics)")):
        lines += [f"**{title}**", "",
                  "| round | HeteroFL (theirs) | heterofl (ours) | diff | FedRolex (theirs) | fedrolex (ours) | diff |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        ran = [m for m in ("heterofl", "fedrolex") if m in doc["runs"]]  # a file written part way holds fewer
        for r in range(s["rounds"] + 1):
            cells = []
            for m in ("heterofl", "fedrolex"):
                if m not in ran:
                    cells += ["-", "-", "-"]
                    continue
                a, b = doc["runs"][m]["reference"][how][r], doc["runs"][m]["ours"][how][r]
                cells += [f"{a:.2f}", f"{b:.2f}", f"{b - a:+.2f}"]
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        lines.append("")
        for m in ran:
            w = doc["runs"][m]["within_2_points"][how]
            lines.append(f"- {m}: within 2 points at {w['rounds_within']} of {w['rounds']} rounds; largest difference "
                         f"{w['max_abs_diff']:.2f}, mean {w['mean_abs_diff']:.2f}, last round {w['last_diff']:+.2f} "
                         "(ours minus theirs).")
        lines.append("")
    lines += ["**Seconds** (training rounds only, one CPU thread; the evaluation here is not counted)", "",
              "| run | theirs | ours |", "|---|---:|---:|"]
    for m in ran:
        r = doc["runs"][m]
        lines.append(f"| {m} | {sum(r['reference']['seconds']):.0f} | {sum(r['ours']['seconds']):.0f} |")
    lines += ["", "**Function-level checks**: their slicing and aggregation beside ours on the same tensors (largest "
              "absolute difference; hfl-bench's initial global model, seeded random client updates)", "",
              "| method | round | slices | aggregate: conv weights | aggregate: biases, BN, classifier | "
              "windows as ours | windows as ours mirrored |", "|---|---:|---:|---:|---:|---|---|"]
    for m, rows in doc.get("checks", {}).items():
        for c in rows:
            lines.append(f"| {m} | {c['round']} | {c['max_abs_diff_slices']:.2g} | "
                         f"{c['max_abs_diff_aggregate_conv']:.2g} | {c['max_abs_diff_aggregate_other']:.2g} | "
                         f"{'yes' if c['windows_equal_ours'] else 'no'} | "
                         f"{'yes' if c['windows_equal_ours_mirrored'] else 'no'} |")
    return "\n".join(lines) + "\n"


def write_doc(page: Path, text: str, json_path: str) -> None:
    marker = re.compile(r"(<!-- written by: [^\n]*-->\n)(.*?)(<!-- end written -->)", re.S)
    doc = page.read_text()
    if len(marker.findall(doc)) != 1:
        raise SystemExit(f"{page}: expected one '<!-- written by: ... -->' ... '<!-- end written -->' block")
    head = f"<!-- written by: python benchmarks/sidebyside_submodel.py --report {json_path} --doc {page} -->\n"
    page.write_text(marker.sub(lambda m: head + text + m.group(3), doc))


# ---------------------------------------------------------------- main


def write_result(args, kept: dict, commits: dict, started: float, runs: dict, checks: dict | None) -> dict:
    code = kept["code"]
    doc = {"what": "HeteroFL and FedRolex, hfl-bench beside the authors' code (issue 66)",
           "commit": code.get("git_sha") or git(ROOT, "rev-parse", "HEAD"), "dirty": bool(code.get("git_dirty")),
           "references": commits,
           "host": {"name": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"},
           "seconds": round(time.perf_counter() - started, 1),
           "settings": settings(args), "client_rates": kept["rates"],
           "patches": {k: [p[0] for p in v] for k, v in PATCHES.items()},
           "runs": runs, **({"checks": checks} if checks is not None else {})}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"wrote {out} ({doc['seconds']:.0f} s)")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heterofl", help="a git checkout of the HeteroFL authors' repository")
    ap.add_argument("--fedrolex", help="a git checkout of the FedRolex authors' repository")
    ap.add_argument("--data", help="an HtFLlib MNIST folder (config.json, train/, test/), e.g. mnist-htfl")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--train-per-client", type=int, default=250)
    ap.add_argument("--test-per-client", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="a1-b1-c1-d1-e1")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--report", metavar="JSON", help="print the tables of a result file (no run)")
    ap.add_argument("--doc", help="with --report: rewrite the page's written block instead of printing")
    args = ap.parse_args()
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        text = report(doc)
        if args.doc:
            write_doc(Path(args.doc), text, args.report)
        else:
            print(text, end="")
        return
    if not (args.heterofl and args.fedrolex and args.data):
        ap.error("--heterofl, --fedrolex and --data are needed to run (or --report FILE)")
    torch.set_num_threads(1)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="hfl-sidebyside-"))
    log(f"working in {work}")
    try:
        data_dir = work / "data"
        write_subsample(Path(args.data), data_dir, args.clients, args.train_per_client, args.test_per_client,
                        args.seed)
        roots, commits = {}, {}
        for kind in ("heterofl", "fedrolex"):
            roots[kind], commits[kind] = export(Path(getattr(args, kind)), kind, work / f"ref-{kind}")
        runs = {}
        for method in ("heterofl", "fedrolex"):
            log(f"hfl-bench {method}")
            kept = run_ours(method, args, data_dir, work / "runs")
            log(f"  {kept['total_seconds']:.0f} s; the reference's {method}")
            job = {"settings": settings(args), "rates": kept["rates"], "init": kept["states"][0],
                   "train_x": kept["train_x"], "train_y": kept["train_y"], "client_idx": kept["client_idx"]}
            theirs = run_driver(method, roots[method], job, work, method)
            log(f"  {theirs['total_seconds']:.0f} s; evaluating {len(kept['states']) + len(theirs['states'])} models")
            ours_c, theirs_c = curves(kept["states"], kept, args), curves(theirs["states"], kept, args)
            runs[method] = {
                "ours": {**ours_c, "seconds": [round(s, 2) for s in kept["seconds"]],
                         "run_seconds": round(kept["total_seconds"], 1), "record_status": kept["record_status"]},
                "reference": {**theirs_c, "seconds": [round(s, 2) for s in theirs["seconds"]],
                              "run_seconds": round(theirs["total_seconds"], 1)},
                "within_2_points": {k: within(ours_c[k], theirs_c[k]) for k in ("sbn", "batch")},
            }
            log(f"  sbn ours {ours_c['sbn'][-1]} theirs {theirs_c['sbn'][-1]}; "
                f"batch ours {ours_c['batch'][-1]} theirs {theirs_c['batch'][-1]}")
            write_result(args, kept, commits, started, runs, None)  # kept if a later step fails
        doc = write_result(args, kept, commits, started, runs, check_functions(args, roots, kept, work))
        print(report(doc), end="")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
