"""A round of the engine against a plain PyTorch loop doing the same work, interleaved.

Run on demand (never as a timed test):

    python benchmarks/bench_engine_vs_loop.py                      # both presets, 12 measured rounds each
    python benchmarks/bench_engine_vs_loop.py --preset digits --rounds 20

Both sides run in one process on copies of the same initial models, with the same shards and
the same seeded batch order (``training.make_plan``), and alternate round by round (the side
that goes first alternates too), so load drift on a shared machine hits both. The plain loop is
what one would write by hand for the method's round:

- ``crad`` (and the other peer-KD methods): every active teacher predicts once on each sample of
  its peers' shards (eval mode, no grad), the aggregation rule forms each student's targets, then
  each student trains its local epochs with (1 - lambda) CE + lambda KD, a gradient-norm clip and
  SGD, batch by batch;
- ``local``: the same training with plain cross-entropy;
- then, like the engine, every trained model is tested on its validation half, and at the
  engine's test rounds on its local test half and the global test set.

The aggregation rule and the loss are the project's own functions (the same arithmetic), so the
plain loop's models stay equal to the engine's while both compute the same thing: the record
says whether they did (``models_equal``). Ratios are engine / plain; above 1 the engine is slower.
Wall and process CPU time are both recorded: with one thread, CPU time is the less load-sensitive.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported at run time after the thread settings
    import torch

PRESETS = {
    # the calibrated digits protocol (task defaults: cpu pool, N = 10, batch 16, 5 local epochs)
    "digits": dict(task="digits", method="crad"),
    # a convolutional pool at batch 64 (the first wave's batch size), otherwise the digits defaults
    "cpu-cnn": dict(task="digits", method="crad", pool="cpu-cnn", batch_size=64),
}
KD_METHODS = {"crad", "uniform-kd", "uncertainty-kd"}


class PlainLoop:
    """The round written as a plain PyTorch loop over copies of the simulation's initial models."""

    def __init__(self, sim):
        import torch

        self.sim, self.fed = sim, sim.fed
        fed = self.fed
        self.models = [copy.deepcopy(c.model) for c in fed.clients]
        self.opts = [fed.make_optimizer(m) for m in self.models]
        self.kd = fed.cfg.method in KD_METHODS
        self.params = sim.method.params
        self.val_correct = torch.zeros_like(fed.val_correct)
        self.row_of = torch.zeros(len(fed.data.train_x), dtype=torch.long)  # train index -> row of its shard
        for c in fed.clients:
            self.row_of[c.train_idx] = torch.arange(len(c.train_idx))
        for i in range(fed.n_clients):
            self.validate(i)

    def round(self, rnd: int, active: list[int], test: bool) -> None:
        from hfl_bench.training import make_plan

        fed = self.fed
        plans = {i: make_plan(fed, i, rnd) for i in active}
        targets = self.teacher_targets(active) if self.kd else {}
        for i in active:
            self.train(i, plans[i], targets.get(i))
        for i in active:
            self.validate(i)
        if test:
            for i in range(fed.n_clients):
                self.test(i)

    def teacher_targets(self, active: list[int]) -> dict:
        """Each student's aggregated targets on the rows of its shard: every teacher runs once over
        the concatenation of its peers' shards."""
        import torch

        from hfl_bench.training import soft_targets

        fed, p = self.fed, self.params
        shard = {i: fed.data.train_x[fed.clients[i].train_idx] for i in active}
        probs: dict[int, dict[int, torch.Tensor]] = {i: {} for i in active}
        for j in active:
            peers = [i for i in active if i != j]
            model = self.models[j].eval()
            with torch.no_grad():
                out = soft_targets(model(torch.cat([shard[i] for i in peers])), p.temperature)
            for i, part in zip(peers, out.split([len(shard[i]) for i in peers])):
                probs[i][j] = part
        accs = self.val_correct / fed.val_counts.clamp_min(1)
        counts = self.sim.method.shared_counts
        out = {}
        for i in active:
            peers = [j for j in active if j != i]
            out[i] = self.sim.method.aggregate(torch.stack([probs[i][j] for j in peers]), counts[peers], accs[peers])
        return out

    def train(self, i: int, plan, q) -> None:
        import torch
        import torch.nn.functional as F

        from hfl_bench.training import student_loss

        fed, model, opt = self.fed, self.models[i], self.opts[i]
        model.train()
        total = torch.zeros(())
        for s, e in plan.bounds:
            idx = plan.indices[s:e]
            x, y = fed.data.train_x[idx], fed.data.train_y[idx]
            logits = model(x)
            loss = (student_loss(logits, y, q[self.row_of[idx]], self.params.lam, self.params.temperature)
                    if q is not None else F.cross_entropy(logits, y))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), fed.cfg.grad_clip)
            opt.step()
            total += loss.detach()
        float(total)

    def predict(self, i: int, idx) -> "torch.Tensor":
        import torch

        model = self.models[i].eval()
        with torch.no_grad():
            return model(self.fed.data.train_x[idx] if idx is not None else self.fed.data.test_x)

    def validate(self, i: int) -> None:
        import torch

        fed, c = self.fed, self.fed.clients[i]
        y = fed.data.train_y[c.val_idx]
        hit = self.predict(i, c.val_idx).argmax(-1) == y
        self.val_correct[i] = torch.bincount(y[hit], minlength=fed.num_classes).float()

    def test(self, i: int) -> None:
        fed, c = self.fed, self.fed.clients[i]
        int((self.predict(i, c.test_idx).argmax(-1) == fed.data.train_y[c.test_idx]).sum())
        int((self.predict(i, None).argmax(-1) == fed.data.test_y).sum())


def load() -> list[float]:
    return list(os.getloadavg())


def measure(spec: dict, rounds: int, warmup: int, threads: int, seed: int) -> dict:
    import torch

    from hfl_bench.config import RunConfig, resolve
    from hfl_bench.data import get_task
    from hfl_bench.engine import Simulation

    torch.set_num_threads(threads)
    task = get_task(spec["task"])
    total = warmup + rounds
    settings = {k: v for k, v in spec.items() if k not in ("task", "method")}
    cfg = resolve(RunConfig(method=spec["method"], task=spec["task"], seed=seed, device="cpu", out="/dev/null",
                            **settings), task.info.defaults)
    if cfg.rounds < total:  # a longer run than the protocol's: the evaluator's schedule follows it
        cfg.rounds = total
    sim = Simulation(cfg)
    plain = PlainLoop(sim)
    load_before = load()
    rows = []
    for rnd in range(1, total + 1):
        active = sim.active_clients(rnd)
        test = sim.evaluator.is_test_round(rnd, rnd == cfg.rounds)
        sides = {"engine": lambda: sim.step(rnd), "plain": lambda: plain.round(rnd, active, test)}
        order = ["engine", "plain"] if rnd % 2 else ["plain", "engine"]
        row = {"round": rnd, "test_round": test, "first": order[0]}
        for side in order:
            w, c = time.perf_counter(), time.process_time()
            sides[side]()
            row[f"{side}_wall_s"] = time.perf_counter() - w
            row[f"{side}_cpu_s"] = time.process_time() - c
        row["phases"] = sim.history[-1]["phases"]
        rows.append(row)
        print(f"  round {rnd:>2}{' (test)' if test else '       '}: engine {row['engine_wall_s']:.3f} s, "
              f"plain {row['plain_wall_s']:.3f} s, ratio {row['engine_wall_s'] / row['plain_wall_s']:.2f} "
              f"(CPU time {row['engine_cpu_s'] / row['plain_cpu_s']:.2f})", flush=True)
    measured = rows[warmup:]
    summary = {}
    for clock in ("wall", "cpu"):
        e = [r[f"engine_{clock}_s"] for r in measured]
        p = [r[f"plain_{clock}_s"] for r in measured]
        summary[clock] = {"engine_median_s": statistics.median(e), "plain_median_s": statistics.median(p),
                          "median_ratio": statistics.median(a / b for a, b in zip(e, p)),
                          "total_ratio": sum(e) / sum(p)}
    equal = all(all(torch.equal(a, b) for a, b in zip(c.model.state_dict().values(), m.state_dict().values()))
                for c, m in zip(sim.fed.clients, plain.models))
    return {"spec": spec, "config": {"pool": cfg.pool, "clients": cfg.clients, "batch_size": cfg.batch_size,
                                     "local_epochs": cfg.local_epochs, "eval_every": cfg.eval_every},
            "rounds_measured": rounds, "warmup_rounds": warmup, "load_before": load_before, "load_after": load(),
            "summary": summary, "models_equal": equal, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), action="append", help="default: every preset")
    ap.add_argument("--rounds", type=int, default=12, help="measured rounds per preset (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None,
                    help="JSON result path (default benchmarks/results/engine-vs-loop-<time>.json)")
    args = ap.parse_args()
    import torch

    from hfl_bench.provenance import cpu_info, git_info

    out = Path(args.out or f"benchmarks/results/engine-vs-loop-{dt.datetime.now():%Y%m%d-%H%M%S}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
              "threads": args.threads, "cpu_count": os.cpu_count(), **cpu_info(), "code": git_info(), "presets": {}}
    for name in args.preset or list(PRESETS):
        print(f"{name}: {PRESETS[name]}", flush=True)
        result = measure(PRESETS[name], args.rounds, args.warmup, args.threads, args.seed)
        report["presets"][name] = result
        out.write_text(json.dumps(report, indent=1) + "\n")
        s = result["summary"]
        print(f"{name}: engine / plain, median over {args.rounds} rounds: wall {s['wall']['median_ratio']:.2f}x "
              f"({s['wall']['engine_median_s']:.3f} s against {s['wall']['plain_median_s']:.3f} s), CPU time "
              f"{s['cpu']['median_ratio']:.2f}x; models equal at the end: {result['models_equal']}; load "
              f"{result['load_before'][0]:.1f} -> {result['load_after'][0]:.1f}", flush=True)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
