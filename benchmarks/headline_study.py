"""Which figure of a record should be the headline? A measurement on the committed records.

Question (issue: a headline chosen by measurement): every record carries the global accuracy at the
selected round (``metrics.global_acc``: the round of the best mean validation accuracy, the papers'
rule) and the mean over the last 10 evaluated rounds (``metrics.final.global_acc``); its ``history``
holds every evaluated round, so the mean of the last k evaluated rounds is a candidate for any k.
Which of them is the steadiest?

Candidates, each a function of one record (all clients' figure, and the headline clients' figure:
the honest clients under faults, the recipients of a multimodal run):

- ``selected``: the figure at the selected round;
- ``final``: the record's own final figure (mean of the last 10 evaluated rounds, after round 0);
- ``last-k`` (k = 1, 3, 5, 20): the mean of the last k evaluated rounds, from ``history``
  (``last-10`` is recomputed from ``history`` too, as a check that it equals ``final``).

Measures:

(a) across hosts: records of the same config hash, method version, data, partition hash and seed run
    on two hosts (``environment.platform`` differs); median, RMS and max absolute difference per
    candidate, per folder pair;
(b) paired-seed sd between methods in one setting: in each board (the project's grouping,
    ``hfl_bench.results.board.build_groups``) over one folder set, every two groups of one protocol
    (``SettingGroup.protocol``), paired by seed (the same partition hash), with 3 or more shared seeds:
    the sample sd (ddof 1) of the per-seed differences; median over the pairs;
(c) order changes: over the same pairs, how often the sign of the mean paired difference under a
    candidate differs from that under ``selected``;
(d) tied selections: runs whose best mean validation accuracy is reached by more than one round
    (the earliest wins);
(e) power: the paired seeds needed to resolve a difference d at a paired sd s with 80% power in a
    two-sided paired t-test at 5% (exact, by the noncentral t distribution: the smallest n whose
    power reaches 0.8), for the measured median paired sds and a grid.

Rerun from the repository root (no training; seconds):

    python benchmarks/headline_study.py            # writes benchmarks/results/headline_study.json
    python benchmarks/headline_study.py --power-table   # also prints (e) as the docs' markdown table

The write-up is ``docs/studies/headline.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

from hfl_bench.results.board import board_records, build_groups
from hfl_bench.results.figures import figure, final_figure, headline_of
from hfl_bench.results.loading import Loaded, load_records

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "headline_study.json"
# Folder sets read as one board each for (b) and (c): the current records, and the earlier runs of
# other hosts / commits kept in the archive (a board per set, so no seed counts twice).
BOARDS = {
    "reproduced": ["leaderboards/reproduced"],
    "archive/other-host": ["leaderboards/archive/other-host"],
    "archive/first-wave": ["leaderboards/archive/first-wave"],
    "archive/dfml-1.0": ["leaderboards/archive/dfml-1.0"],
}
CROSS_HOST = ["leaderboards/reproduced", "leaderboards/archive"]
LAST_K = (1, 3, 5, 10, 20)
MIN_SHARED_SEEDS = 3


def history_rows(record: dict[str, Any], clients: str) -> list[dict[str, Any]]:
    """Evaluated rounds after round 0, each with the global accuracy of ``clients`` (all clients or
    a client group's per-round block, schema 1.5 on)."""
    rows = []
    for h in record.get("history") or []:
        block = h if clients == "all" else (h.get(clients) or {})
        if h.get("round", 0) >= 1 and block.get("global_acc") is not None:
            rows.append(block)
    return rows


def last_k(k: int) -> Callable[[dict[str, Any], str], Optional[float]]:
    def value(record: dict[str, Any], clients: str) -> Optional[float]:
        rows = history_rows(record, clients)[-k:]
        return statistics.fmean(r["global_acc"] for r in rows) if rows else None
    return value


CANDIDATES: dict[str, Callable[[dict[str, Any], str], Optional[float]]] = {
    "selected": lambda r, c: figure(r, "global_acc", c),
    "final": lambda r, c: final_figure(r, "global_acc", c),
    **{f"last-{k}": last_k(k) for k in LAST_K},
}


def clients_of(record: dict[str, Any], who: str) -> str:
    return headline_of(record) if who == "headline" else "all"


def summary(values: list[float]) -> dict[str, Any]:
    """Median, RMS and max of absolute values (n = how many)."""
    if not values:
        return {"n": 0}
    a = [abs(v) for v in values]
    return {"n": len(a), "median": round(statistics.median(a), 3),
            "rms": round(math.sqrt(statistics.fmean(v * v for v in a)), 3), "max": round(max(a), 3)}


def folder_of(r: Loaded) -> str:
    parts = Path(r.path).relative_to(ROOT).parts if Path(r.path).is_absolute() else Path(r.path).parts
    return "/".join(parts[1:3]) if parts[1] == "archive" else parts[1]


def host_of(r: Loaded) -> str:
    return str((r.record.get("environment") or {}).get("platform"))


def cross_host(records: list[Loaded]) -> dict[str, Any]:
    """(a): every two ok records of one run identity on two hosts."""
    by_run: dict[tuple, list[Loaded]] = defaultdict(list)
    for r in records:
        if r.kind == "reproduced" and r.status == "ok":
            task = r.record.get("task") or {}
            key = (r.config_hash, r.method_version, r.selection_rule, r.partition_hash, r.seed,
                   task.get("name"), task.get("version"), task.get("n_train"), task.get("data_fingerprint"))
            by_run[key].append(r)
    pairs = []
    for runs in by_run.values():
        for x, y in itertools.combinations(runs, 2):
            if host_of(x) != host_of(y):
                pairs.append((x, y))
    out: dict[str, Any] = {}
    for who in ("all", "headline"):
        per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for x, y in pairs:
            label = " vs ".join(sorted((folder_of(x), folder_of(y))))
            vals = {name: (f(x.record, clients_of(x.record, who)), f(y.record, clients_of(y.record, who)))
                    for name, f in CANDIDATES.items()}
            if any(a is None or b is None for a, b in vals.values()):
                continue  # compare candidates on the same pairs only
            for name, (a, b) in vals.items():
                per[label][name].append(a - b)
                per["all pairs"][name].append(a - b)
        out[who] = {label: {name: summary(d) for name, d in cands.items()} for label, cands in sorted(per.items())}
    return out


def method_pairs(groups) -> list[tuple]:
    """Every two groups of one protocol (different methods or versions) and their seeds in common."""
    by_protocol = defaultdict(list)
    for g in groups:
        by_protocol[g.protocol()].append(g)
    out = []
    for protocol, gs in by_protocol.items():
        for a, b in itertools.combinations(gs, 2):
            sa = {(r.seed, r.partition_hash): r for r in a.ok}
            sb = {(r.seed, r.partition_hash): r for r in b.ok}
            shared = sorted(set(sa) & set(sb), key=str)
            if len(shared) >= MIN_SHARED_SEEDS:
                out.append((protocol, a, b, [(sa[k], sb[k]) for k in shared]))
    return out


def pair_diffs(paths: list[str]) -> tuple[int, dict[str, list[dict[str, list[float]]]]]:
    """The number of group pairs of one board and, for all clients and the headline clients, each
    usable pair's per-seed differences under every candidate (a pair is usable when every candidate
    has a figure on every shared seed; ``final`` may be missing on records older than schema 1.2, so
    it is left out of that check, and its own list holds the pairs where it exists)."""
    loaded, _ = load_records([ROOT / p for p in paths])
    records, _ = board_records(loaded)
    pairs = method_pairs(build_groups(records))
    out: dict[str, list[dict[str, list[float]]]] = {"all": [], "headline": []}
    for who in out:
        for _, a, b, seeds in pairs:
            diffs: dict[str, list] = {}
            for name, f in CANDIDATES.items():
                ds = []
                for x, y in seeds:
                    u, v = f(x.record, clients_of(x.record, who)), f(y.record, clients_of(y.record, who))
                    ds.append(None if u is None or v is None else u - v)
                diffs[name] = ds
            if any(d is None for name, ds in diffs.items() if name != "final" for d in ds):
                continue
            if any(d is None for d in diffs["final"]):
                diffs["final"] = []
            out[who].append(diffs)
    return len(pairs), out


def paired_summary(pairs: list[dict[str, list[float]]]) -> dict[str, Any]:
    """(b) and (c) over usable pairs (``pair_diffs``); ``final`` over the pairs that have it."""
    sds: dict[str, list[float]] = defaultdict(list)
    changed: dict[str, list[bool]] = defaultdict(list)
    smaller: dict[str, list[bool]] = defaultdict(list)
    for diffs in pairs:
        sel_sd, sel_mean = statistics.stdev(diffs["selected"]), statistics.fmean(diffs["selected"])
        if diffs["final"]:  # the selected figure's sd on the same pairs as final's
            sds["selected, pairs with final"].append(sel_sd)
        for name, ds in diffs.items():
            if not ds:
                continue
            sds[name].append(statistics.stdev(ds))
            if name != "selected":
                mean = statistics.fmean(ds)
                changed[name].append(mean != 0 and sel_mean != 0 and (mean > 0) != (sel_mean > 0))
                smaller[name].append(statistics.stdev(ds) < sel_sd)
    return {
        "pairs": len(pairs),
        "paired_sd_median": {n: round(statistics.median(v), 3) for n, v in sds.items()},
        "paired_sd_n": {n: len(v) for n, v in sds.items()},
        "order_changes_vs_selected": {n: {"changed": sum(v), "of": len(v),
                                          "percent": round(100 * sum(v) / len(v), 1)} for n, v in changed.items()},
        "pairs_where_sd_smaller_than_selected": {n: sum(v) for n, v in smaller.items()},
    }


def paired(boards: dict[str, list[str]]) -> dict[str, Any]:
    """(b) and (c): per board, and pooled over the boards (each board's pairs once)."""
    out: dict[str, Any] = {}
    pooled: dict[str, list] = {"all": [], "headline": []}
    for name, paths in boards.items():
        n, diffs = pair_diffs(paths)
        out[name] = {"group_pairs": n, **{who: paired_summary(d) for who, d in diffs.items()}}
        for who, d in diffs.items():
            pooled[who] += d
    out["pooled"] = {who: paired_summary(d) for who, d in pooled.items()}
    return out


def final_check(records: list[Loaded]) -> dict[str, Any]:
    """The largest gap between a record's ``metrics.final.global_acc`` and the mean of the last 10
    evaluated rounds of its history (they are one figure; ``last-10`` stands for ``final`` on
    records older than schema 1.2, which have a history but no ``final``)."""
    gaps = [abs(final_figure(r.record, "global_acc", "all") - last_k(10)(r.record, "all")) for r in records
            if r.status == "ok" and final_figure(r.record, "global_acc", "all") is not None]
    return {"records": len(gaps), "max_abs_gap": round(max(gaps), 4)}


def tied_selections(records: list[Loaded]) -> dict[str, Any]:
    """(d): runs whose best mean validation accuracy is reached by more than one round."""
    ties = runs = 0
    for r in records:
        if r.kind != "reproduced" or r.status != "ok":
            continue
        vals = [h.get("mean_val_acc") for h in r.record.get("history") or [] if h.get("round", 0) >= 1]
        vals = [v for v in vals if v is not None]
        if not vals:
            continue
        runs += 1
        ties += sum(v == max(vals) for v in vals) > 1
    return {"runs": runs, "tied": ties}


POWER, POWER_ALPHA = 0.8, 0.05
POWER_D = (1.0, 2.0, 3.0, 5.0)
POWER_SD = (1.0, 1.5, 2.0, 2.5, 3.0)


def paired_t_power(n: int, d: float, sd: float, alpha: float = POWER_ALPHA) -> float:
    """Power of a two-sided paired t-test over n pairs for a true mean difference d, pair sd sd."""
    from scipy.stats import nct, t

    df, nc = n - 1, d / sd * math.sqrt(n)
    crit = t.ppf(1 - alpha / 2, df)
    return float(nct.sf(crit, df, nc) + nct.cdf(-crit, df, nc))


def seeds_needed(d: float, sd: float, power: float = POWER) -> int:
    """The fewest paired seeds (n >= 2) whose paired t-test reaches ``power`` for difference d."""
    n = 2
    while paired_t_power(n, d, sd) < power:
        n += 1
    return n


def power_table(measured: dict[str, float]) -> dict[str, Any]:
    sds = {**{f"{s:g}": s for s in POWER_SD}, **measured}
    return {"power": POWER, "alpha": POWER_ALPHA, "test": "two-sided paired t",
            "sd": sds, "seeds": {f"{d:g}": {name: seeds_needed(d, s) for name, s in sds.items()} for d in POWER_D}}


def power_markdown(table: dict[str, Any]) -> str:
    names = list(table["sd"])
    head = "| difference d (points) | " + " | ".join(f"sd {n}" if n[0].isdigit() else f"{n} ({table['sd'][n]:g})"
                                                   for n in names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 1)]
    lines += [f"| {d} | " + " | ".join(str(row[n]) for n in names) + " |" for d, row in table["seeds"].items()]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--power-table", action="store_true", help="print the power table (e) as markdown")
    args = p.parse_args(argv)
    loaded, _ = load_records([ROOT / p for p in CROSS_HOST])
    result = {
        "candidates": list(CANDIDATES),
        "cross_host": cross_host(loaded),
        "paired_seed": paired(BOARDS),
        "final_equals_last_10": final_check(loaded),
        "tied_selections": {"reproduced": tied_selections([r for r in loaded if folder_of(r) != "archive"
                                                          and not folder_of(r).startswith("archive/")]),
                            "all": tied_selections(loaded)},
    }
    rep = result["paired_seed"]["reproduced"]["headline"]["paired_sd_median"]
    result["power"] = power_table({"final, measured": rep["final"], "selected, measured": rep["selected"]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    if args.power_table:
        print(power_markdown(result["power"]))
    else:
        json.dump(result, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
