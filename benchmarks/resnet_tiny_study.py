"""Why does resnet_tiny gain nothing from peer distillation on digits?

Question (open issue): on ``digits`` (10 clients, Dirichlet alpha 0.3, ``cpu`` pool = mlp_small,
cnn_small, resnet_tiny round-robin), CRAD lifts mlp_small and cnn_small well above local training
but not resnet_tiny. Is it the architecture (8x8 inputs, a stride-2 stage, capacity),
BatchNorm (tiny batches; teachers evaluated in eval mode with running statistics learned on their
own skewed shard), or a defect in how the method treats it?

Method (all at the calibrated digits defaults: 30 rounds, batch 16, lr 0.05, 5 local epochs,
held-out fraction 0.3):

- ``cli``: the real CLI, ``local`` and ``crad`` at seeds 0 and 1; per-architecture global accuracy
  at the selected round and over the last 10 rounds (from ``per_client`` of the records, and the
  history's per-round means).
- ``static``: code-path facts that need no training: batch sizes each client's BatchNorm sees
  (``training.batch_bounds``), parameter counts, the feature-map size before GAP, whether
  timm's ``BasicBlock.zero_init_last`` was applied (it is only called by timm's ``ResNet``).
- ``diag``: ``local`` and ``crad`` seed 0 run in-process (``engine.Simulation``, same numbers as
  the CLI), instrumented:
  * after every round, each client's global test accuracy in eval mode (what the benchmark
    reports) and with batch statistics (train-mode BN over the whole balanced test set, running
    stats untouched), split into the classes the client holds (>= 5 train samples) and the rest;
  * crad only, by wrapping ``peer_kd.train_students`` (called after the teachers ran and before
    any student trains): each teacher's accuracy on every peer's training shard in eval mode vs.
    with batch statistics of that shard; the aggregated targets' accuracy / true-class mass;
    each student's KD term T^2 KL(q || p_T) on its shard before and after its round of training.
- ``variants``: ``rot`` and ``rot2``, the ``cpu`` pool rotated (with ``cpu`` itself, every
  architecture trains on every client shard once: separates shard from architecture); and the
  ``cpu`` pool with resnet_tiny replaced by one variant (registered here as
  new timm models and pools): ``gn`` (every BatchNorm -> GroupNorm(4): no running statistics,
  no batch dependence), ``s1`` (second stage at stride 1: GAP over 8x8 instead of 4x4, same
  parameters); ``nonorm`` (no normalization) is defined but was not run (compute budget:
  ``python benchmarks/resnet_tiny_study.py`` does not run it unless added to ``part_variants``'s
  names). ``local`` and ``crad`` seed 0 each, in-process, with the same post-round diagnostics.
- ``summary``: no training; the shard x architecture gain matrix from the runs above.

Rerun (resumable: a run whose key is already in the JSON is skipped; ``--force`` reruns):

    # from the repository root, in its virtual environment
    export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
    nice -n 15 python benchmarks/resnet_tiny_study.py static cli diag variants summary

Raw numbers go to ``benchmarks/results/resnet_tiny_study.json``; the write-up is
``docs/studies/resnet-tiny.md``. CPU cost on a loaded 2-core machine: a local run
~1.3 CPU-min, a crad run ~2 CPU-min.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
OUT_JSON = ROOT / "benchmarks" / "results" / "resnet_tiny_study.json"
# The runs' records and checkpoints: under the repository's ignored runs/ folder (the study keeps
# only their figures, in OUT_JSON).
RUNS = ROOT / "runs" / "resnet_tiny_study"
COMMON = dict(task="digits", rounds=30, batch_size=16, lr=0.05, local_epochs=5, heldout_fraction=0.3)
CLI_ARGS = ["--task", "digits", "--rounds", "30", "--batch-size", "16", "--lr", "0.05", "--local-epochs", "5",
            "--heldout-fraction", "0.3", "--quiet", "--json", "--checkpoint-every", "0"]
MAJOR = 5  # a class the client holds >= MAJOR training samples of counts as "held"
DIAG_ROUNDS = {1, 2, 5, 10, 15, 20, 25, 30}


# ----------------------------------------------------------------------------- results file

def load_results() -> dict:
    return json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {}


def save(key: str, value) -> None:
    res = load_results()
    res[key] = value
    OUT_JSON.parent.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps(res, indent=1, sort_keys=True))


def cpu_seconds() -> float:
    import resource
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


# ----------------------------------------------------------------------------- variant models

def _tiny_resnet(num_classes, in_chans, norm, strides=(1, 2), widths=(16, 32)):
    """pools.TinyResNet with a chosen norm layer and stage strides (norm=BatchNorm2d, strides
    (1, 2) builds the same modules in the same order as pools.resnet_tiny)."""
    from timm.models.resnet import BasicBlock

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(in_chans, widths[0], 3, padding=1, bias=False), norm(widths[0]),
                                      nn.ReLU(inplace=True))
            blocks, cin = [], widths[0]
            for cout, stride in zip(widths, strides):
                down = None
                if stride != 1 or cin != cout:
                    down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm(cout))
                blocks.append(BasicBlock(cin, cout, stride=stride, downsample=down, norm_layer=norm))
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.num_features = cin
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))

    return Tiny()


def _gn(c, **kw):
    return nn.GroupNorm(4, c)


def _none(c, **kw):
    return nn.Identity()


def _bn(c, **kw):
    return nn.BatchNorm2d(c)


def resnet_tiny_gn(pretrained=False, num_classes=10, in_chans=1, img_size=None, **kwargs):
    return _tiny_resnet(num_classes, in_chans, _gn)


def resnet_tiny_s1(pretrained=False, num_classes=10, in_chans=1, img_size=None, **kwargs):
    return _tiny_resnet(num_classes, in_chans, _bn, strides=(1, 1))


def resnet_tiny_nonorm(pretrained=False, num_classes=10, in_chans=1, img_size=None, **kwargs):
    return _tiny_resnet(num_classes, in_chans, _none)


VARIANTS = {"gn": resnet_tiny_gn, "s1": resnet_tiny_s1, "nonorm": resnet_tiny_nonorm}


def register_variants() -> None:
    from timm.models import register_model

    from hfl_bench.pools import ArchPool, PoolMember, register_pool, timm_module
    from hfl_bench.registry import POOLS

    timm = timm_module()
    for name, fn in VARIANTS.items():
        if not timm.is_model(fn.__name__):
            register_model(fn)
        pool = f"cpu-rt-{name}"
        if pool not in POOLS.names():
            register_pool(ArchPool(pool, (PoolMember("mlp_small"), PoolMember("cnn_small"), PoolMember(fn.__name__)),
                                   f"cpu pool with resnet_tiny -> {fn.__name__} (resnet_tiny_study)"))
    if "cpu-rt-rot" not in POOLS.names():
        # the cpu pool rotated: resnet_tiny on clients 0,3,6,9 (mlp_small's shards in the cpu pool),
        # mlp_small on 1,4,7 (cnn_small's), cnn_small on 2,5,8 (resnet_tiny's): separates shard from architecture
        register_pool(ArchPool("cpu-rt-rot", (PoolMember("resnet_tiny"), PoolMember("mlp_small"),
                                              PoolMember("cnn_small")), "cpu pool rotated (resnet_tiny_study)"))
    if "cpu-rt-rot2" not in POOLS.names():
        # rotated once more: cnn_small on 0,3,6,9, resnet_tiny on 1,4,7, mlp_small on 2,5,8; with
        # ``cpu`` and ``rot`` every architecture trains on every shard once
        register_pool(ArchPool("cpu-rt-rot2", (PoolMember("cnn_small"), PoolMember("resnet_tiny"),
                                               PoolMember("mlp_small")), "cpu pool rotated twice (resnet_tiny_study)"))


# ----------------------------------------------------------------------------- helpers

@torch.no_grad()
def batchstat_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits with train-mode BatchNorm over ``x`` as one batch; the model is not changed."""
    m = copy.deepcopy(model).train()
    return m(x)


@torch.no_grad()
def eval_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from hfl_bench.training import predict_logits
    return predict_logits(model, x)


def has_bn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def per_arch(values: dict[int, float], fed) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for cid, v in values.items():
        out.setdefault(fed.clients[cid].arch.name, []).append(v)
    return {a: round(float(np.nanmean(v)), 3) for a, v in out.items()}


def global_diag(fed) -> dict:
    """Per client: global accuracy eval-mode vs batch-stat, on held / not-held classes."""
    x, y = fed.data.test_x, fed.data.test_y
    out = {"eval": {}, "batchstat": {}, "eval_held": {}, "eval_unheld": {}, "bs_held": {}, "bs_unheld": {}}
    for c in fed.clients:
        held = torch.as_tensor(c.train_counts >= MAJOR)[y]
        pe = eval_logits(c.model, x).argmax(-1) == y
        pb = (batchstat_logits(c.model, x).argmax(-1) == y) if has_bn(c.model) else pe
        out["eval"][c.cid] = float(pe.float().mean()) * 100
        out["batchstat"][c.cid] = float(pb.float().mean()) * 100
        out["eval_held"][c.cid] = float(pe[held].float().mean()) * 100
        out["eval_unheld"][c.cid] = float(pe[~held].float().mean()) * 100 if (~held).any() else float("nan")
        out["bs_held"][c.cid] = float(pb[held].float().mean()) * 100
        out["bs_unheld"][c.cid] = float(pb[~held].float().mean()) * 100 if (~held).any() else float("nan")
    return out


def summarize_round_diags(fed, diags: dict[int, dict]) -> dict:
    """Per-arch means of each diagnostic per round, and the mean over the last 10 rounds."""
    rounds = sorted(diags)
    by_round = {r: {k: per_arch(v, fed) for k, v in diags[r].items()} for r in rounds}
    last = [r for r in rounds if r > max(rounds) - 10]
    final = {}
    for k in diags[rounds[-1]]:
        final[k] = {a: round(float(np.nanmean([by_round[r][k][a] for r in last])), 3) for a in by_round[rounds[-1]][k]}
    return {"final_last10": final, "by_round": {str(r): by_round[r] for r in rounds if r in DIAG_ROUNDS}}


# ----------------------------------------------------------------------------- crad hooks

class KDProbe:
    """Wraps peer_kd.train_students: teacher/target diagnostics before training, student fit after."""

    def __init__(self, sim):
        self.sim, self.rnd, self.rows = sim, 0, {}

    def install(self):
        from hfl_bench.families import peer_kd
        self.orig = peer_kd.train_students
        probe = self

        def wrapped(fed, cids, plans, *, targets=None, lam=0.0, temperature=1.0):
            pre = probe.before(fed, cids, plans, targets or {}, temperature) if probe.rnd in DIAG_ROUNDS else None
            losses = probe.orig(fed, cids, plans, targets=targets, lam=lam, temperature=temperature)
            if pre is not None:
                probe.after(fed, cids, plans, targets or {}, temperature, losses, pre)
            return losses

        peer_kd.train_students = wrapped

    def uninstall(self):
        from hfl_bench.families import peer_kd
        peer_kd.train_students = self.orig

    @staticmethod
    def shard(fed, plan):
        n = len(fed.clients[plan.cid].train_idx)
        return plan.view(fed, 0, n), plan.labels(fed, 0, n), n  # epoch 0 = every train sample once

    def before(self, fed, cids, plans, targets, T):
        from hfl_bench.training import kd_loss
        teach = {"eval": {}, "batchstat": {}}  # per teacher: mean accuracy over peers' shards
        for j in cids:
            acc_e, acc_b = [], []
            for i in cids:
                if i == j:
                    continue
                x, y, _ = self.shard(fed, plans[i])
                m = fed.clients[j].model
                acc_e.append(float((eval_logits(m, x).argmax(-1) == y).float().mean()) * 100)
                acc_b.append(float(((batchstat_logits(m, x) if has_bn(m) else eval_logits(m, x)).argmax(-1) == y)
                                   .float().mean()) * 100)
            teach["eval"][j], teach["batchstat"][j] = float(np.mean(acc_e)), float(np.mean(acc_b))
        tgt = {"argmax_acc": {}, "true_mass": {}, "kd_before": {}}
        for i in cids:
            if i not in targets:
                continue
            x, y, n = self.shard(fed, plans[i])
            q = targets[i][:n]
            tgt["argmax_acc"][i] = float((q.argmax(-1) == y).float().mean()) * 100
            tgt["true_mass"][i] = float(q.gather(1, y[:, None]).mean())
            tgt["kd_before"][i] = float(kd_loss(eval_logits(fed.clients[i].model, x), q, T))
        return {"teacher": teach, "targets": tgt}

    def after(self, fed, cids, plans, targets, T, losses, pre):
        import torch.nn.functional as F

        from hfl_bench.training import kd_loss
        fit = {"kd_after_eval": {}, "kd_after_batchstat": {}, "ce_after_eval": {}, "train_loss": {}}
        for i, loss in zip(cids, losses):
            fit["train_loss"][i] = float(loss)
            if i not in targets:
                continue
            x, y, n = self.shard(fed, plans[i])
            m = fed.clients[i].model
            le = eval_logits(m, x)
            lb = batchstat_logits(m, x) if has_bn(m) else le
            fit["kd_after_eval"][i] = float(kd_loss(le, targets[i][:n], T))
            fit["kd_after_batchstat"][i] = float(kd_loss(lb, targets[i][:n], T))
            fit["ce_after_eval"][i] = float(F.cross_entropy(le, y))
        row = {f"teacher_{k}": per_arch(v, fed) for k, v in pre["teacher"].items()}
        row.update({f"target_{k}": per_arch(v, fed) for k, v in pre["targets"].items()})
        row.update({k: per_arch(v, fed) for k, v in fit.items()})
        self.rows[str(self.rnd)] = row


# ----------------------------------------------------------------------------- in-process runs

def inprocess(method: str, seed: int, pool: str | None = None, probe: bool = False) -> dict:
    from hfl_bench import engine
    from hfl_bench.config import RunConfig

    cfg = RunConfig(method=method, seed=seed, pool=pool, checkpoint_every=0, out=str(RUNS / "inproc"), **COMMON)
    _, cfg = engine.load_task(cfg)
    t0 = cpu_seconds()
    sim = engine.Simulation(cfg, code={})
    fed = sim.fed
    kd = KDProbe(sim) if probe else None
    if kd:
        kd.install()
    per_round_global: dict[int, list[float]] = {}
    diags: dict[int, dict] = {}
    try:
        for rnd in range(1, cfg.rounds + 1):
            if kd:
                kd.rnd = rnd
            sim.step(rnd)
            ev = sim.evaluator
            per_round_global[rnd] = (ev.global_correct.sum(1) / ev.test_class_counts.sum() * 100).tolist()
            diags[rnd] = global_diag(fed)
    finally:
        if kd:
            kd.uninstall()
    best = sim.best
    arch = [c.arch.name for c in fed.clients]
    last10 = np.mean([per_round_global[r] for r in range(cfg.rounds - 9, cfg.rounds + 1)], axis=0)
    out = {
        "method": method, "seed": seed, "pool": cfg.pool, "assignment": arch,
        "n_params": {a: sum(p.numel() for p in c.model.parameters()) for a, c in zip(arch, fed.clients)},
        "selected_round": best.round,
        "per_arch_global_selected": per_arch(dict(enumerate(best.global_acc.tolist())), fed),
        "per_arch_global_last10": per_arch(dict(enumerate(last10.tolist())), fed),
        "per_client_global_last10": [round(float(v), 3) for v in last10],
        "per_arch_local_selected": per_arch(dict(enumerate(best.local_acc.tolist())), fed),
        "global_acc_selected": round(float(np.mean(best.global_acc)), 3),
        "diag": summarize_round_diags(fed, diags),
        "cpu_s": round(cpu_seconds() - t0, 1),
    }
    if kd:
        out["kd_probe"] = kd.rows
    return out


# ----------------------------------------------------------------------------- parts

def part_static(force: bool) -> None:
    from hfl_bench.testing import tiny_federation
    from hfl_bench.training import batch_bounds

    fed = tiny_federation(clients=10, rounds=30, batch_size=16, lr=0.05, local_epochs=5, heldout_fraction=0.3)
    register_variants()
    from hfl_bench.pools import PoolMember, build_model
    clients = []
    for c in fed.clients:
        n = len(c.train_idx)
        sizes = [e - s for s, e in batch_bounds(n, 16)]
        clients.append({"cid": c.cid, "arch": c.arch.name, "n_train": n, "batches_per_epoch": len(sizes),
                        "last_batch": sizes[-1], "classes_held_ge5": int((c.train_counts >= MAJOR).sum()),
                        "classes_present": int((c.train_counts > 0).sum()),
                        "train_counts": c.train_counts.tolist()})
    rt = next(c.model for c in fed.clients if c.arch.name == "resnet_tiny")
    zero_init = [float(b.bn2.weight.abs().sum()) == 0 for b in rt.blocks]
    feats = {}
    x = fed.data.test_x[:2]
    for name in ("mlp_small", "cnn_small", "resnet_tiny", *[f.__name__ for f in VARIANTS.values()]):
        m = build_model(PoolMember(name), fed.info)
        entry = {"n_params": sum(p.numel() for p in m.parameters()),
                 "bn_layers": sum(isinstance(mm, nn.BatchNorm2d) for mm in m.modules())}
        if hasattr(m, "blocks"):
            entry["pre_gap_map"] = list(m.blocks(m.stem(x)).shape[1:])
        elif hasattr(m, "features"):
            entry["pre_gap_map"] = list(m.features(x).shape[1:])
        feats[name] = entry
    # the BN variant builder reproduces resnet_tiny exactly (same modules, same init order)
    torch.manual_seed(0)
    a = build_model(PoolMember("resnet_tiny"), fed.info)
    torch.manual_seed(0)
    b = _tiny_resnet(10, 1, _bn)
    same = all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))
    save("static", {"clients": clients, "models": feats, "resnet_tiny_bn2_zero_init": zero_init,
                    "variant_builder_reproduces_resnet_tiny": same})
    print(json.dumps(feats, indent=1), zero_init, same)


def part_cli(force: bool) -> None:
    res = load_results().get("cli", {})
    for seed in (0, 1):
        for method in ("local", "crad"):
            key = f"{method}_s{seed}"
            if key in res and not force:
                continue
            out = RUNS / key
            existing = sorted(out.glob("*.json")) if out.exists() else []
            t0 = cpu_seconds()
            if not existing or force:
                cmd = [sys.executable, "-m", "hfl_bench.cli", "run", "--method", method, "--seed", str(seed),
                       "--out", str(out), *CLI_ARGS]
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                assert proc.returncode == 0, proc.stderr[-2000:]
                existing = [Path(json.loads(proc.stdout)["record"])]
            rec = json.loads(existing[0].read_text())
            m = rec["metrics"]
            res[key] = {
                "record": existing[0].name,
                "selected_round": rec["selection"]["round"],
                "per_arch_global_acc": m["per_arch_global_acc"],
                "global_acc": m["global_acc"], "local_acc": m["local_acc"], "final": m.get("final"),
                "per_client": [(c["cid"], c["arch"], c["global_acc"], c["local_acc"]) for c in m["per_client"]],
                "cpu_s_this_invocation": round(cpu_seconds() - t0, 1),
            }
            save("cli", res)
            print(key, m["per_arch_global_acc"], flush=True)


def part_diag(force: bool) -> None:
    res = load_results().get("diag", {})
    for method in ("local", "crad"):
        key = f"{method}_s0"
        if key in res and not force:
            continue
        res[key] = inprocess(method, 0, probe=method == "crad")
        save("diag", res)
        print(key, res[key]["per_arch_global_last10"], res[key]["cpu_s"], flush=True)


def part_variants(force: bool, names=("rot", "rot2", "gn", "s1"), seeds=(0,)) -> None:
    register_variants()
    res = load_results().get("variants", {})
    for name in names:
        for seed in seeds:
            for method in ("local", "crad"):
                key = f"{name}_{method}_s{seed}"
                if key in res and not force:
                    continue
                res[key] = inprocess(method, seed, pool=f"cpu-rt-{name}")
                save("variants", res)
                print(key, res[key]["per_arch_global_last10"], res[key]["cpu_s"], flush=True)


def part_summary(force: bool) -> None:
    """No training: the shard x architecture gain matrix (seed 0, last-10-round means) from the
    ``cpu``, ``rot``, ``rot2`` runs, and the resnet_tiny variants on the ``cpu`` pool's shards."""
    R = load_results()
    d, v = R["diag"], R["variants"]
    runs = {"cpu": (d["local_s0"], d["crad_s0"])}
    runs.update({n: (v[f"{n}_local_s0"], v[f"{n}_crad_s0"]) for n in ("rot", "rot2", "gn", "s1")
                 if f"{n}_crad_s0" in v})
    groups = {"A=0,3,6,9": [0, 3, 6, 9], "B=1,4,7": [1, 4, 7], "C=2,5,8": [2, 5, 8]}
    per_client, matrix, by_arch = {}, {}, {}
    for name, (loc, crad) in runs.items():
        for cid, arch in enumerate(loc["assignment"]):
            a, b = loc["per_client_global_last10"][cid], crad["per_client_global_last10"][cid]
            per_client.setdefault(str(cid), {})[name] = {"arch": arch, "local": a, "crad": b, "gain": round(b - a, 2)}
            if name in ("cpu", "rot", "rot2"):
                by_arch.setdefault(arch, []).append(b - a)
        for g, cids in groups.items():
            arch = loc["assignment"][cids[0]]
            loc_m = float(np.mean([loc["per_client_global_last10"][c] for c in cids]))
            crad_m = float(np.mean([crad["per_client_global_last10"][c] for c in cids]))
            matrix.setdefault(g, {})[f"{arch} ({name})"] = {"local": round(loc_m, 2), "crad": round(crad_m, 2),
                                                            "gain": round(crad_m - loc_m, 2)}
    out = {"per_client_last10": per_client, "shard_group_x_arch_last10": matrix,
           "mean_gain_per_arch_over_all_10_shards": {a: round(float(np.mean(g)), 2) for a, g in by_arch.items()}}
    save("summary", out)
    print(json.dumps(out["shard_group_x_arch_last10"], indent=1), out["mean_gain_per_arch_over_all_10_shards"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="+", choices=["static", "cli", "diag", "variants", "variants1", "summary"])
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for part in args.parts:
        t0 = time.time()
        if part == "variants1":  # seed 1 of the variants
            part_variants(args.force, seeds=(1,))
        else:
            globals()[f"part_{part}"](args.force)
        print(f"[{part}] {time.time() - t0:.0f}s wall", flush=True)


if __name__ == "__main__":
    main()
