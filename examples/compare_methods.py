"""Run two methods, compare them, plot their curves: hfl-bench from a script or a notebook.

    python examples/compare_methods.py [--out DIR] [--rounds R] [--seeds N]

Runs ``local`` (no federation) and ``crad`` on digits for a few seeds, reads the records back,
pairs them by seed (``leaderboard compare``'s statistics) and draws the accuracy curves, with
``hfl-bench plot``'s figure and a hand-drawn one from the records' histories. Its defaults take
about a minute on one CPU core; CI runs it smaller (tests/test_examples.py). Each cell is an
ordinary run, so a second invocation reruns the runs and writes the same records again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import hfl_bench

METHODS = ("local", "crad")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("example-runs"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args(argv)
    records_dir = args.out / "records"

    # 1. Run: each call is `hfl-bench run`, and returns the record it wrote.
    for method in METHODS:
        for seed in range(args.seeds):
            r = hfl_bench.run(method=method, task="digits", seed=seed, rounds=args.rounds, clients=args.clients,
                              local_epochs=1, out=str(records_dir))
            print(f"{r.method:>6} seed {r.seed}: headline {r.headline:.2f}  selected round {r.selected.round} "
                  f"({r.selected.global_acc:.2f})  -> {r.path.name}")

    # 2. Compare: read the folder back, pair crad with local by seed.
    records = hfl_bench.load_records(records_dir)
    [table] = hfl_bench.compare(records, against="local")
    for c in table.comparisons:
        print(f"{c.a.label} - {c.b.label}: {c.interval_label()} over {c.n} seeds ({c.verdict})")

    # 3. Plot: hfl-bench's own curves figure, and one drawn here from each record's history.
    figures = hfl_bench.plot(records_dir, kind="curves", out=args.out / "plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in records:
        rounds, acc = zip(*r.curve("global_acc"))
        ax.plot(rounds, acc, color="C0" if r.method == METHODS[0] else "C1", alpha=0.6,
                label=r.method if r.seed == 0 else None)
    ax.set_xlabel("round")
    ax.set_ylabel("global test accuracy (%)")
    ax.legend()
    mine = args.out / "plots" / "curves-by-hand.png"
    fig.savefig(mine, dpi=100)
    plt.close(fig)
    for path in [*figures, mine]:
        print(f"figure: {path}")
    return {"records": records, "table": table, "figures": [*figures, mine]}


if __name__ == "__main__":
    main()
