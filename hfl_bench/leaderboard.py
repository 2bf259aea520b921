"""Leaderboards: reproduced runs grouped over seeds, published figures beside them.

A **group** is every reproduced record of one setting: the same config hash (method, its
hyperparameters, task, pool, partition scheme and parameters, clients, rounds, optimizer; seed,
paths and device excluded) on the same data. The config hash leaves the data folder out and the
partition hash changes with the seed (the partition is drawn from the run seed), so neither
alone says "same data": a group is keyed on the config hash plus the task version and its
train / test sizes, and if two records of one key still have the same seed but different partition
hashes (same config, different data), the key is split by partition hash (a record that failed
before its data loaded joins its config's only data variant). Per group: mean and
sample standard deviation (ddof = 1; None, shown as '-', for a single seed) of global and local
accuracy and of every extra endpoint, over the records with status ok, one per seed (the newest
if a seed was run twice; the others are counted as duplicates). Failed and diverged records are
counted, never averaged in.

A **published** record (source.kind = published) holds one figure from a paper. It sits beside
every group of the same method and task whose setting it does not contradict: partition scheme
and parameters, clients, active clients per round and the hyperparameters the paper pins must
agree where the paper states them; rounds, local epochs and pool may differ, which turns the
shown setting match to approximate. The delta is reproduced mean - published figure (of the same
endpoint and metric). Published figures are never averaged in.

The **rank** ranks methods within each protocol (task, partition, clients, active clients,
rounds, local epochs) that at least two methods ran, by the mean global accuracy of the method's
best group there (higher is better); tied means share the average of their ranks. A method's
score is its mean rank over the protocols it ran in.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIRS = (REPO / "leaderboards" / "reproduced", REPO / "leaderboards" / "published")
FORMATS = ("table", "csv", "markdown", "json")
METRICS = ("global_acc", "local_acc")
NOT_OK = ("failed", "diverged")


class LeaderboardError(ValueError):
    """Bad input to the leaderboard (a path that does not exist)."""


# ----------------------------------------------------------------------------- loading


def record_files(paths: Iterable[str | Path]) -> list[Path]:
    """JSON files named directly or found (recursively) under folders, in a stable order."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.json"))
        elif p.is_file():
            files.append(p)
        else:
            raise LeaderboardError(f"no such file or folder: {p}")
    return files


def load_records(paths: Iterable[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Records under ``paths`` and one line per file that is not a record (skipped)."""
    from hfl_bench.records import load_record

    records, skipped = [], []
    for f in record_files(paths):
        try:
            record = load_record(f)
        except ValueError as e:
            skipped.append(str(e))
            continue
        if not all(isinstance(record.get(k), dict) and record[k].get("name") for k in ("method", "task")):
            skipped.append(f"{f}: no method or task name")  # `leaderboard validate` says what else is wrong
            continue
        record.setdefault("_path", str(f))  # where it came from, for messages; never written back
        records.append(record)
    return records, skipped


def kind(record: dict[str, Any]) -> str:
    return (record.get("source") or {}).get("kind", "reproduced")


# ----------------------------------------------------------------------------- statistics


@dataclass
class Stat:
    """Mean and sample standard deviation (ddof = 1) of one figure over seeds; sd None for n < 2."""

    mean: Optional[float]
    sd: Optional[float]
    n: int

    @classmethod
    def of(cls, values: Iterable[Optional[float]]) -> "Stat":
        xs = [float(v) for v in values if v is not None]
        if not xs:
            return cls(None, None, 0)
        return cls(round(statistics.fmean(xs), 4), round(statistics.stdev(xs), 4) if len(xs) > 1 else None, len(xs))

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "sd": self.sd, "n": self.n}


# ----------------------------------------------------------------------------- groups


@dataclass
class Group:
    """The reproduced records of one setting (see the module docstring)."""

    group_id: str
    method: str
    task: str
    pool: str
    partition_scheme: str
    partition_params: dict[str, Any]
    n_clients: Optional[int]
    clients_per_round: Optional[int]
    rounds: Optional[int]
    local_epochs: Optional[int]
    method_params: dict[str, Any]
    hparams: dict[str, Any]
    config_hash: str
    ok: list[dict[str, Any]] = field(default_factory=list)
    n_failed: int = 0
    n_diverged: int = 0
    n_duplicates: int = 0
    split_by_partition: bool = False
    published: list["Match"] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted(_seed(r) for r in self.ok)

    def stat(self, metric: str = "global_acc", endpoint: Optional[str] = None) -> Stat:
        """One figure over the group's ok seeds: the headline, or a named extra endpoint."""
        def value(r):
            m = r.get("metrics") or {}
            if endpoint:
                m = (m.get("extra_endpoints") or {}).get(endpoint) or {}
            return m.get(metric)
        return Stat.of(value(r) for r in self.ok)

    def endpoints(self) -> list[str]:
        names = {e for r in self.ok for e in ((r.get("metrics") or {}).get("extra_endpoints") or {})}
        return sorted(names)

    def protocol(self) -> tuple:
        return (self.task, self.partition_scheme, _canonical(self.partition_params), self.n_clients,
                self.clients_per_round, self.rounds, self.local_epochs)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _seed(record: dict[str, Any]) -> int:
    return (record.get("config") or {}).get("seed", (record.get("seeds") or {}).get("python", -1))


def _data_id(record: dict[str, Any]) -> Optional[tuple]:
    """The data a run saw, as far as its record says (None for a run that failed before loading)."""
    task = record.get("task") or {}
    if task.get("n_train") is None:
        return None
    return (task.get("name"), task.get("version"), task.get("n_train"), task.get("n_test"))


def _partition_hash(record: dict[str, Any]) -> Optional[str]:
    return (record.get("partition") or {}).get("hash")


def build_groups(records: Iterable[dict[str, Any]]) -> list[Group]:
    """Group reproduced records by config hash, split by data identity and, where the same seed
    still appears with two partition hashes, by partition hash (see the module docstring)."""
    by_config: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if kind(r) == "reproduced":
            by_config[r.get("config_hash")].append(r)
    groups = []
    for members in by_config.values():
        for same_data in _split_by_data(members):
            hashes_per_seed: dict[int, set] = defaultdict(set)
            for r in same_data:
                if _partition_hash(r) is not None:
                    hashes_per_seed[_seed(r)].add(_partition_hash(r))
            if any(len(h) > 1 for h in hashes_per_seed.values()):
                by_hash: dict[Optional[str], list] = defaultdict(list)
                for r in same_data:
                    by_hash[_partition_hash(r)].append(r)
                groups += [_make_group(rs, split=True) for rs in by_hash.values()]
            else:
                groups.append(_make_group(same_data, split=False))
    return groups


def _split_by_data(members: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    # A record that failed before its data loaded has no data identity: it joins the only
    # identity there is, or stays apart when there are several.
    by_data: dict[Optional[tuple], list] = defaultdict(list)
    for r in members:
        by_data[_data_id(r)].append(r)
    known = [k for k in by_data if k is not None]
    if len(known) == 1 and None in by_data:
        by_data[known[0]] += by_data.pop(None)
    return list(by_data.values())


def _make_group(records: list[dict[str, Any]], split: bool) -> Group:
    # Describe the group from a record that ran (a failed one may lack partition and federation).
    first = next((r for r in records if r.get("partition")), records[0])
    part, fed, cfg = first.get("partition") or {}, first.get("federation") or {}, first.get("config") or {}
    group_id = first.get("config_hash") or "?"
    if split:
        group_id += f"/{_partition_hash(first)}"
    n_clients = fed.get("n_clients", cfg.get("clients"))
    g = Group(
        group_id=group_id, method=first["method"]["name"], task=first["task"]["name"],
        pool=(first.get("arch_pool") or {}).get("name") or cfg.get("pool") or "?",
        partition_scheme=part.get("scheme", cfg.get("partition") or "?"),
        partition_params=_with_public(dict(part.get("params") or _config_partition_params(cfg)),
                                      part.get("public_size", cfg.get("public_size"))),
        n_clients=n_clients, clients_per_round=fed.get("clients_per_round", cfg.get("clients_per_round") or n_clients),
        rounds=fed.get("rounds", cfg.get("rounds")), local_epochs=fed.get("local_epochs", cfg.get("local_epochs")),
        method_params=dict(cfg.get("method_params") or {}), hparams=dict(first["method"].get("hparams") or {}),
        config_hash=first.get("config_hash") or "?", split_by_partition=split,
    )
    newest_ok: dict[int, dict[str, Any]] = {}
    for r in records:
        status = r.get("status")
        if status in NOT_OK:
            g.n_failed += status == "failed"
            g.n_diverged += status == "diverged"
            continue
        seed = _seed(r)
        if seed in newest_ok:  # a seed run twice: keep the newest, count the other
            g.n_duplicates += 1
            if str(r.get("date") or "") <= str(newest_ok[seed].get("date") or ""):
                continue
        newest_ok[seed] = r
    g.ok = [newest_ok[s] for s in sorted(newest_ok)]
    return g


def _with_public(params: dict[str, Any], public_size: Optional[int]) -> dict[str, Any]:
    """A public hold-out changes every client's shard, so it is part of the setting (shown and
    ranked on); published settings never name it, so it does not block a match."""
    return {**params, "public": public_size} if public_size else params


def _config_partition_params(cfg: dict[str, Any]) -> dict[str, Any]:
    scheme = cfg.get("partition")
    if scheme == "dirichlet" and cfg.get("alpha") is not None:
        return {"alpha": cfg["alpha"]}
    if scheme == "classes" and cfg.get("classes_per_client") is not None:
        return {"k": cfg["classes_per_client"]}
    return {}


# ----------------------------------------------------------------------------- published


@dataclass
class Published:
    """One published figure (one record of source.kind = published)."""

    record: dict[str, Any]

    @property
    def method(self) -> str:
        return self.record["method"]["name"]

    @property
    def task(self) -> str:
        return self.record["task"]["name"]

    @property
    def metric(self) -> str:
        return next((m for m in METRICS if (self.record.get("metrics") or {}).get(m) is not None), "global_acc")

    @property
    def value(self) -> Optional[float]:
        return (self.record.get("metrics") or {}).get(self.metric)

    @property
    def sd(self) -> Optional[float]:
        return (self.record.get("metrics") or {}).get("sd")

    @property
    def n_seeds(self) -> Optional[int]:
        return (self.record.get("metrics") or {}).get("n_seeds")

    @property
    def endpoint(self) -> Optional[str]:
        return (self.record.get("metrics") or {}).get("endpoint")

    @property
    def citation(self) -> dict[str, Any]:
        return self.record["source"].get("citation") or {}

    @property
    def setting(self) -> dict[str, Any]:
        return self.record.get("setting") or {}

    @property
    def pool(self) -> Optional[str]:
        return (self.setting.get("pool") or {}).get("suite_name")

    def as_dict(self) -> dict[str, Any]:
        c = self.citation
        return {
            "record_id": self.record.get("record_id"), "method": self.method, "task": self.task,
            "published_method": self.record["method"].get("published_name"), "metric": self.metric,
            "endpoint": self.endpoint, "value": self.value, "sd": self.sd, "n_seeds": self.n_seeds,
            "citation_key": c.get("key"), "arxiv_or_doi": c.get("arxiv_or_doi"), "locator": c.get("locator"),
            "setting_match": c.get("setting_match"), "deviations": c.get("deviations", []), "setting": self.setting,
        }


@dataclass
class Match:
    """A published figure beside a group: the reproduced figure it compares to and the delta."""

    published: Published
    setting_match: str  # the record's own, downgraded to approximate where the group differs
    differences: list[str]
    reproduced: Stat

    @property
    def delta(self) -> Optional[float]:
        if self.reproduced.mean is None or self.published.value is None:
            return None
        return round(self.reproduced.mean - self.published.value, 4)

    def as_dict(self) -> dict[str, Any]:
        return self.published.as_dict() | {
            "setting_match": self.setting_match, "differences": self.differences,
            "reproduced": self.reproduced.as_dict(), "delta": self.delta,
        }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) < 1e-9
    return a == b


def match(pub: Published, g: Group) -> Optional[Match]:
    """The published figure beside this group, or None if the setting contradicts it."""
    if pub.method != g.method or pub.task != g.task:
        return None
    s = pub.setting
    part = s.get("partition") or {}
    if part.get("scheme") is not None and part["scheme"] != g.partition_scheme:
        return None
    if any(not _same(v, g.partition_params.get(k)) for k, v in (part.get("params") or {}).items()):
        return None
    for name, mine in (("n_clients", g.n_clients), ("clients_per_round", g.clients_per_round)):
        if s.get(name) is not None and not _same(s[name], mine):
            return None
    hparams = pub.record["method"].get("hparams") or {}
    if any(k not in g.hparams or not _same(v, g.hparams[k]) for k, v in hparams.items()):
        return None
    if pub.endpoint and pub.endpoint not in g.endpoints():
        return None
    differences = [f"{name}: published {s[name]}, here {mine}"
                   for name, mine in (("rounds", g.rounds), ("local_epochs", g.local_epochs))
                   if s.get(name) is not None and not _same(s[name], mine)]
    if pub.pool is not None and pub.pool != g.pool:
        differences.append(f"pool: published {pub.pool}, here {g.pool}")
    own = pub.citation.get("setting_match", "approximate")
    return Match(pub, "exact" if own == "exact" and not differences else "approximate", differences,
                 g.stat(pub.metric, pub.endpoint))


# ----------------------------------------------------------------------------- the board


@dataclass
class Board:
    groups: list[Group]
    unmatched: list[Published]
    skipped: list[str]


def build_board(records: list[dict[str, Any]], tasks: Iterable[str] = (), methods: Iterable[str] = (),
                pools: Iterable[str] = (), skipped: Optional[list[str]] = None) -> Board:
    """Groups (filtered, sorted by task then mean global accuracy) with published figures beside."""
    tasks, methods, pools = set(tasks), set(methods), set(pools)

    def keep(task, method, pool):
        return (not tasks or task in tasks) and (not methods or method in methods) and (not pools or pool in pools)

    groups = [g for g in build_groups(records) if keep(g.task, g.method, g.pool)]
    published = [Published(r) for r in records if kind(r) == "published"]
    published = [p for p in published if keep(p.task, p.method, p.pool)]
    matched = set()
    for g in groups:
        for i, p in enumerate(published):
            m = match(p, g)
            if m is not None:
                g.published.append(m)
                matched.add(i)
    groups.sort(key=lambda g: (g.task, -(g.stat().mean if g.stat().mean is not None else -1e9), g.method, g.group_id))
    unmatched = sorted((p for i, p in enumerate(published) if i not in matched),
                       key=lambda p: (p.task, p.method, p.citation.get("key", ""), p.citation.get("locator", "")))
    return Board(groups, unmatched, list(skipped or []))


def rank_methods(groups: list[Group]) -> list[dict[str, Any]]:
    """Mean rank of each method over the protocols that two or more methods ran (see module doc)."""
    best: dict[tuple, dict[str, float]] = defaultdict(dict)
    labels: dict[tuple, str] = {}
    for g in groups:
        mean = g.stat().mean
        if mean is None:
            continue
        key = g.protocol()
        labels[key] = protocol_label(g)
        best[key][g.method] = max(mean, best[key].get(g.method, float("-inf")))
    ranks: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for key, scores in sorted(best.items(), key=lambda kv: labels[kv[0]]):
        if len(scores) < 2:
            continue
        for method, rank in average_ranks(scores).items():
            ranks[method].append({"protocol": labels[key], "task": key[0], "rank": rank,
                                  "global_acc": scores[method], "n_methods": len(scores)})
    rows = [{"method": m, "mean_rank": round(statistics.fmean(r["rank"] for r in rs), 4), "n_protocols": len(rs),
             "ranks": rs} for m, rs in ranks.items()]
    return sorted(rows, key=lambda r: (r["mean_rank"], -r["n_protocols"], r["method"]))


def average_ranks(scores: dict[str, float]) -> dict[str, float]:
    """Rank 1 = highest score; equal scores (to 4 decimals) share the mean of the ranks they span."""
    order = sorted(scores, key=lambda m: -scores[m])
    out, i = {}, 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and round(scores[order[j + 1]], 4) == round(scores[order[i]], 4):
            j += 1
        for m in order[i:j + 1]:
            out[m] = (i + 1 + j + 1) / 2
        i = j + 1
    return out


# ----------------------------------------------------------------------------- rendering


def partition_label(scheme: str, params: dict[str, Any]) -> str:
    # min_size is a repair detail of the Dirichlet draw, not the setting people compare on.
    shown = [f"{k}={v}" for k, v in params.items() if k != "min_size"]
    return " ".join([scheme or "?", *shown])


def protocol_label(g: Group) -> str:
    active = "" if g.clients_per_round in (None, g.n_clients) else f"/{g.clients_per_round}"
    return f"{g.task} {partition_label(g.partition_scheme, g.partition_params)} N={g.n_clients}{active} R={g.rounds}"


def _num(x: Optional[float], nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _pm(mean: Optional[float], sd: Optional[float]) -> str:
    return "-" if mean is None else f"{mean:.2f} ± {_num(sd)}"


def _params_label(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items())) or "default"


def _setting_label(partition: str, n_clients: Any, clients_per_round: Any, rounds: Any) -> str:
    n = "?" if n_clients is None else str(n_clients)
    if clients_per_round not in (None, n_clients):
        n += f"/{clients_per_round}"
    return f"{partition} N={n} R={'?' if rounds is None else rounds}"


def _published_setting(p: Published) -> str:
    s = p.setting
    part = s.get("partition") or {}
    partition = partition_label(part["scheme"], part.get("params") or {}) if part.get("scheme") else "?"
    return _setting_label(partition, s.get("n_clients"), s.get("clients_per_round"), s.get("rounds"))


def display_rows(board: Board) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Rows for the table and markdown formats: each group followed by the published figures
    beside it; then the published figures that match no group."""
    rows = []
    for g in board.groups:
        gl, lo = g.stat("global_acc"), g.stat("local_acc")
        setting = _setting_label(partition_label(g.partition_scheme, g.partition_params), g.n_clients,
                                 g.clients_per_round, g.rounds)
        if g.method_params:
            setting += " " + _params_label(g.method_params)
        rows.append({
            "method": g.method, "task": g.task, "pool": g.pool, "setting": setting, "seeds": str(gl.n),
            "global acc": _pm(gl.mean, gl.sd), "local acc": _pm(lo.mean, lo.sd),
            "failed/diverged": f"{g.n_failed}/{g.n_diverged}", "source": "", "locator": "",
            "match": "", "delta": "",
        })
        rows += [_published_row(m.published, m) for m in g.published]
    return rows, [_published_row(p, None) for p in board.unmatched]


def _published_row(p: Published, m: Optional[Match]) -> dict[str, str]:
    value = _pm(p.value, p.sd)
    c = p.citation
    endpoint = f" [{p.endpoint}]" if p.endpoint else ""
    published_as = p.record["method"].get("published_name") or p.method
    return {
        "method": f"  ↳ {published_as}{endpoint}" if m else f"{p.method}{endpoint}", "task": "" if m else p.task,
        "published as": published_as,
        "pool": p.pool or "(other)", "setting": _published_setting(p), "seeds": str(p.n_seeds or "?"),
        "global acc": value if p.metric == "global_acc" else "", "local acc": value if p.metric == "local_acc" else "",
        "failed/diverged": "", "source": str(c.get("key")), "locator": str(c.get("locator")),
        "match": m.setting_match if m else str(c.get("setting_match", "")),
        "delta": ("-" if m.delta is None else f"{m.delta:+.2f}") if m else "",
    }


# The terminal table leaves out the locator (long); markdown, csv and json keep it.
COLUMNS = ("method", "task", "pool", "setting", "seeds", "global acc", "local acc", "failed/diverged", "source",
           "locator", "match", "delta")
TABLE_COLUMNS = tuple(c for c in COLUMNS if c != "locator")
UNMATCHED_COLUMNS = ("method", "published as", "task", "pool", "setting", "seeds", "global acc", "local acc",
                     "source", "locator", "match")

CSV_COLUMNS = (
    "row_type", "group_id", "method", "task", "pool", "partition_scheme", "partition_params", "n_clients",
    "clients_per_round", "rounds", "local_epochs", "method_params", "seeds", "n_seeds", "global_mean", "global_sd",
    "local_mean", "local_sd", "n_failed", "n_diverged", "n_duplicates", "endpoint", "citation_key", "arxiv_or_doi",
    "locator", "setting_match", "published_metric", "published_value", "published_sd", "reproduced_mean", "delta",
)


def csv_rows(board: Board) -> list[dict[str, Any]]:
    """Flat rows: one per group (row_type reproduced), one per published figure beside it
    (row_type published, same group_id), one per unmatched published figure (empty group_id)."""
    rows = []
    for g in board.groups:
        gl, lo = g.stat("global_acc"), g.stat("local_acc")
        rows.append({
            "row_type": "reproduced", "group_id": g.group_id, "method": g.method, "task": g.task, "pool": g.pool,
            "partition_scheme": g.partition_scheme, "partition_params": _canonical(g.partition_params),
            "n_clients": g.n_clients, "clients_per_round": g.clients_per_round, "rounds": g.rounds,
            "local_epochs": g.local_epochs, "method_params": _canonical(g.method_params),
            "seeds": " ".join(map(str, g.seeds)), "n_seeds": gl.n, "global_mean": gl.mean, "global_sd": gl.sd,
            "local_mean": lo.mean, "local_sd": lo.sd, "n_failed": g.n_failed, "n_diverged": g.n_diverged,
            "n_duplicates": g.n_duplicates,
        })
        rows += [_published_csv(m.published, m, g.group_id) for m in g.published]
    rows += [_published_csv(p, None, "") for p in board.unmatched]
    return [{c: ("" if r.get(c) is None else r.get(c)) for c in CSV_COLUMNS} for r in rows]


def _published_csv(p: Published, m: Optional[Match], group_id: str) -> dict[str, Any]:
    s, c = p.setting, p.citation
    part = s.get("partition") or {}
    return {
        "row_type": "published", "group_id": group_id, "method": p.method, "task": p.task, "pool": p.pool,
        "partition_scheme": part.get("scheme"), "partition_params": _canonical(part.get("params") or {}),
        "n_clients": s.get("n_clients"), "clients_per_round": s.get("clients_per_round"), "rounds": s.get("rounds"),
        "local_epochs": s.get("local_epochs"), "n_seeds": p.n_seeds, "endpoint": p.endpoint,
        "citation_key": c.get("key"), "arxiv_or_doi": c.get("arxiv_or_doi"), "locator": c.get("locator"),
        "setting_match": m.setting_match if m else c.get("setting_match"), "published_metric": p.metric,
        "published_value": p.value, "published_sd": p.sd,
        "reproduced_mean": m.reproduced.mean if m else None, "delta": m.delta if m else None,
    }


def board_json(board: Board) -> dict[str, Any]:
    groups = []
    for g in board.groups:
        groups.append({
            "group_id": g.group_id, "config_hash": g.config_hash, "method": g.method, "task": g.task,
            "pool": g.pool, "partition": {"scheme": g.partition_scheme, "params": g.partition_params},
            "partition_hashes": sorted({_partition_hash(r) for r in g.ok}, key=str),
            "split_by_partition": g.split_by_partition, "n_clients": g.n_clients,
            "clients_per_round": g.clients_per_round, "rounds": g.rounds, "local_epochs": g.local_epochs,
            "method_params": g.method_params, "seeds": g.seeds, "n_seeds": len(g.ok),
            "global_acc": g.stat("global_acc").as_dict(), "local_acc": g.stat("local_acc").as_dict(),
            "endpoints": {e: {m: g.stat(m, e).as_dict() for m in METRICS} for e in g.endpoints()},
            "n_failed": g.n_failed, "n_diverged": g.n_diverged, "n_duplicates": g.n_duplicates,
            "records": [r.get("_path") for r in g.ok],
            "published": [m.as_dict() for m in g.published],
        })
    return {"sd": "sample standard deviation (ddof=1); null for a single seed", "groups": groups,
            "unmatched_published": [p.as_dict() for p in board.unmatched], "skipped": board.skipped}


def rank_rows(ranked: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"#": str(i), "method": r["method"], "mean rank": f"{r['mean_rank']:.2f}",
             "protocols": str(r["n_protocols"]),
             "ranks": "; ".join(f"{x['protocol']}: {x['rank']:g}/{x['n_methods']}" for x in r["ranks"])}
            for i, r in enumerate(ranked, 1)]


def to_markdown(rows: list[dict[str, str]], columns: Iterable[str]) -> str:
    columns = list(columns)

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict[str, Any]], columns: Iterable[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def to_rich(rows: list[dict[str, str]], columns: Iterable[str], title: str) -> Table:
    t = Table(title=title)
    for c in columns:
        right = c in ("seeds", "global acc", "local acc", "delta", "mean rank", "protocols", "#")
        # fold, not ellipsis: a narrow terminal still shows every character
        t.add_column(c, justify="right" if right else "left", overflow="fold")
    for r in rows:
        published = bool(r.get("source"))
        t.add_row(*[Text(r.get(c, "")) for c in columns], style="dim" if published else None)  # Text: no markup
    return t


# ----------------------------------------------------------------------------- CLI

app = typer.Typer(help="Leaderboards: reproduced runs grouped over seeds, published figures beside them.",
                  no_args_is_help=True)


def _out() -> Console:
    """stdout; piped or captured output gets a wide table (160 columns) unless COLUMNS says otherwise."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)
    return console

err = Console(stderr=True)
PATHS_HELP = ("Record files or folders (searched recursively). "
              "\\[default: leaderboards/reproduced and leaderboards/published]")


def _fail(message: str, code: int = 2):
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _paths(paths: Optional[list[Path]]) -> list[Path]:
    return list(paths) if paths else [d for d in DEFAULT_DIRS if d.exists()]


@app.command()
def show(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable)."),
    method: list[str] = typer.Option([], "--method", "-m", help="Only this method (repeatable)."),
    pool: list[str] = typer.Option([], "--pool", help="Only this architecture pool (repeatable)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv, markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    rank: bool = typer.Option(False, "--rank", help="Print the mean rank of each method across tasks instead."),
):
    """Group reproduced records by setting (mean, sample sd, seeds; failed runs counted apart) and
    put the matching published figures beside each group with the delta reproduced - published."""
    fmt = "json" if as_json else fmt
    if fmt not in FORMATS:
        _fail(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    try:
        records, skipped = load_records(_paths(paths))
    except LeaderboardError as e:
        _fail(str(e))
    for line in skipped:
        err.print(f"[yellow]skipped:[/] {line}", highlight=False, soft_wrap=True)
    board = build_board(records, task, method, pool, skipped)
    if rank:
        _print_rank(rank_methods(board.groups), fmt)
    else:
        _print_board(board, fmt)


def _print_board(board: Board, fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(board_json(board), indent=1) + "\n")
        return
    if fmt == "csv":
        sys.stdout.write(to_csv(csv_rows(board), CSV_COLUMNS))
        return
    rows, unmatched = display_rows(board)
    title = "published figures with no reproduced group"
    if fmt == "markdown":
        sys.stdout.write(to_markdown(rows, COLUMNS))
        if unmatched:
            sys.stdout.write(f"\n{title}:\n\n" + to_markdown(unmatched, UNMATCHED_COLUMNS))
        return
    if rows:
        title_groups = "reproduced groups: mean ± sample sd over seeds ('-': one seed); delta = reproduced - published"
        _out().print(to_rich(rows, TABLE_COLUMNS, title_groups))
    else:
        _out().print("no reproduced records match", highlight=False)
    if unmatched:
        _out().print(to_rich(unmatched, tuple(c for c in UNMATCHED_COLUMNS if c != "locator"), title))


def _print_rank(ranked: list[dict[str, Any]], fmt: str) -> None:
    columns = ("#", "method", "mean rank", "protocols", "ranks")
    if fmt == "json":
        sys.stdout.write(json.dumps({"ties": "average rank", "rank": ranked}, indent=1) + "\n")
    elif fmt == "csv":
        rows = [{"method": r["method"], "mean_rank": r["mean_rank"], "n_protocols": r["n_protocols"],
                 "ranks": "; ".join(f"{x['protocol']}: {x['rank']:g}" for x in r["ranks"])} for r in ranked]
        sys.stdout.write(to_csv(rows, ("method", "mean_rank", "n_protocols", "ranks")))
    elif fmt == "markdown":
        sys.stdout.write(to_markdown(rank_rows(ranked), columns))
    else:
        title = "mean rank by global accuracy over protocols run by 2+ methods (ties: average rank)"
        _out().print(to_rich(rank_rows(ranked), columns, title))


@app.command()
def validate(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Check every record against the JSON Schema; exit 1 listing each error if any is invalid."""
    try:
        import jsonschema
    except ImportError:
        _fail("validating records needs jsonschema: pip install jsonschema (or pip install -e '.[test]')")
    from hfl_bench.records import SCHEMA_PATH

    try:
        files = record_files(_paths(paths))
    except LeaderboardError as e:
        _fail(str(e))
    if not files:
        _fail("no record files found in " + ", ".join(map(str, _paths(paths))))
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    problems = {str(f): _record_errors(f, validator) for f in files}
    invalid = {f: errs for f, errs in problems.items() if errs}
    if as_json:
        sys.stdout.write(json.dumps({"checked": len(files), "invalid": invalid}, indent=1) + "\n")
    else:
        for f, errs in invalid.items():
            for e in errs:
                err.print(f"{f}: {e}", highlight=False, soft_wrap=True, markup=False)
        _out().print(f"{len(files) - len(invalid)} of {len(files)} records valid", highlight=False)
    if invalid:
        raise typer.Exit(1)


def _record_errors(path: Path, validator) -> list[str]:
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"not readable JSON: {e}"]
    errors = sorted(validator.iter_errors(record), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(record)'}: {e.message}" for e in errors]
