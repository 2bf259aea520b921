"""Faults in the results: the drop of a group run with faults against the same seeds without
faults, and where a fault setting sits on the robustness plot's x axis.

**The drop.** A record run with faults names its fault-free baseline by config hash
(``faults.baseline_config_hash``: the hash of the same config with ``faults`` empty). Each ok seed
of a group with faults is paired with the counted record (``grouping``: the earliest-written ok record of
that seed) of a fault-free group with that config hash and the same method version, the same seed,
the same data identity (``grouping.data_identity``) and, where both records carry one, the same
partition hash. Per pair the drop is taken **over the same clients**: the honest clients of the
run with faults (``faults.honest_clients``), their mean global accuracy with faults minus the same
clients' mean global accuracy in the baseline, each run at its own selected round (the records'
``metrics.per_client``). So a fault that leaves the honest clients' models as they were (``local``
under any message fault) drops exactly 0; a change of which clients are averaged is not a drop.
A pair where either record lacks one of those clients' figures has no drop. The group's drop is
the mean over the paired seeds (negative: accuracy lost), with how many seeds were paired. No
pair: no drop (``-`` / null). The same drop is also taken on the final window's per-client
figures (``metrics.final.per_client``, schema 1.6: ``final_mean``), where no round is selected.

Pairs are formed only between records of one selection rule
(``Loaded.selection_rule``: a record selected on the honest clients' validation, written before
issue 30, has no drop against a baseline selected on every client's).

**The drop a view shows** follows the headline (``results.headline``): the final-window drop
when every paired seed has one, else the selected-round drop (``statistic``: ``final`` or
``selected``, which views mark as a fallback), with its 95% t-interval over the paired seeds
(``paired.t_interval``; none for one seed).

**The x axis** of ``hfl-bench plot robustness``: ``label-noise`` and ``straggler`` have a strength
(share of labels flipped, probability of missing a round), which is x; ``byzantine`` and
``free-rider`` have none, so x is the fraction of faulty clients (``faults.fraction``, or the
faulty clients over N for an explicit list). The fault-free baseline is x = 0.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from hfl_bench.results.figures import FINAL, SELECTED
from hfl_bench.results.grouping import data_identity, precedence
from hfl_bench.results.loading import Loaded, selection_mark
from hfl_bench.results.paired import t_interval
from hfl_bench.results.setting import SettingGroup

STRENGTH_AXIS = ("label-noise", "straggler")  # x = strength; every other kind: x = fraction of faulty clients
X_LABELS = {
    "label-noise": "share of a faulty client's training labels flipped (strength)",
    "straggler": "probability a straggler misses a round (strength)",
    "byzantine": "fraction of clients that are byzantine",
    "free-rider": "fraction of clients that are free-riders",
}


def faults_section(r: Loaded) -> dict[str, Any]:
    return r.record.get("faults") or {}


def baseline_hash(r: Loaded) -> Optional[str]:
    """The config hash of the same run without faults (canonical: an older record's is mapped by its
    upgrade, ``record.identity``)."""
    return faults_section(r).get("baseline_config_hash")


@dataclass
class Pair:
    """One seed with faults and the same seed without."""

    seed: Any
    faulty: Loaded
    baseline: Loaded

    @property
    def clients(self) -> list[int]:
        """The clients the drop is over: the honest clients of the run with faults."""
        return honest_clients(self.faulty)

    @property
    def with_faults(self) -> Optional[float]:
        """Those clients' mean global accuracy at the selected round of the run with faults."""
        return same_clients_mean(self.faulty, self.clients)

    @property
    def without_faults(self) -> Optional[float]:
        """The same clients' mean global accuracy at the baseline's own selected round."""
        return same_clients_mean(self.baseline, self.clients)

    @property
    def drop(self) -> Optional[float]:
        return _difference(self.with_faults, self.without_faults)

    @property
    def final_drop(self) -> Optional[float]:
        """The same drop on the final window's figures (``metrics.final.per_client``, schema 1.6):
        the end of the budget, where no selection is involved; None for older records."""
        return _difference(same_clients_mean(self.faulty, self.clients, final=True),
                           same_clients_mean(self.baseline, self.clients, final=True))

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "drop": self.drop, "final_drop": self.final_drop, "clients": self.clients,
                "honest_global_acc": self.with_faults, "baseline_global_acc": self.without_faults,
                "record": str(self.faulty.path), "baseline_record": str(self.baseline.path)}


def _difference(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else round(a - b, 4)


def honest_clients(r: Loaded) -> list[int]:
    """The honest client ids a record run with faults names ([] when it names none)."""
    return list(faults_section(r).get("honest_clients") or [])


def per_client_figures(r: Loaded, metric: str = "global_acc", final: bool = False) -> dict[int, float]:
    """Each client's selected-round figure (``metrics.per_client``; ``final``: its final-window
    mean, ``metrics.final.per_client``), by client id; a client without a number is left out."""
    metrics = r.record.get("metrics") or {}
    if final:
        metrics = metrics.get("final") or {}
    return {row["cid"]: float(row[metric]) for row in metrics.get("per_client") or [] if row.get(metric) is not None}


def same_clients_mean(r: Loaded, clients: list[int], metric: str = "global_acc",
                      final: bool = False) -> Optional[float]:
    """The mean of ``clients``' selected-round (``final``: final-window) figures in ``r``; None
    when it lacks any of them."""
    figures = per_client_figures(r, metric, final)
    if not clients or any(c not in figures for c in clients):
        return None
    return statistics.fmean(figures[c] for c in clients)


@dataclass
class Drop:
    """A group's drop against the same seeds without faults (module doc)."""

    baseline_config_hash: Optional[str]
    pairs: list[Pair] = field(default_factory=list)
    baseline_group_ids: list[str] = field(default_factory=list)

    @property
    def values(self) -> list[float]:
        return [p.drop for p in self.pairs if p.drop is not None]

    @property
    def n_paired(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> Optional[float]:
        return round(statistics.fmean(self.values), 4) if self.values else None

    @property
    def final_values(self) -> list[float]:
        return [p.final_drop for p in self.pairs if p.final_drop is not None]

    @property
    def final_mean(self) -> Optional[float]:
        """The mean final-window drop over the seeds that have one (None: records before schema 1.6)."""
        return round(statistics.fmean(self.final_values), 4) if self.final_values else None

    @property
    def statistic(self) -> Optional[str]:
        """``final`` when every paired seed has a final-window drop, ``selected`` when only the
        selected rounds' pair, None without a pair (module doc: the drop a view shows)."""
        if not self.values:
            return None
        return FINAL if len(self.final_values) == self.n_paired else SELECTED

    @property
    def headline_values(self) -> list[float]:
        return self.final_values if self.statistic == FINAL else self.values

    @property
    def headline_mean(self) -> Optional[float]:
        """The drop a view shows: the final-window mean, else the selected rounds' (``statistic``)."""
        return self.final_mean if self.statistic == FINAL else self.mean

    @property
    def interval(self) -> Optional[tuple[float, float]]:
        """The 95% t-interval of ``headline_mean`` over the paired seeds (None for fewer than two)."""
        ci = t_interval(self.headline_values)
        return None if ci is None else (round(ci[0], 4), round(ci[1], 4))

    @property
    def seeds(self) -> list[Any]:
        return [p.seed for p in self.pairs if p.drop is not None]

    def as_dict(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "headline_mean": self.headline_mean,
                "ci95": None if self.interval is None else list(self.interval),
                "mean": self.mean, "final_mean": self.final_mean, "n_final_paired": len(self.final_values),
                "n_paired": self.n_paired, "seeds": self.seeds,
                "baseline_config_hash": self.baseline_config_hash, "baseline_group_ids": self.baseline_group_ids,
                "pairs": [p.as_dict() for p in self.pairs if p.drop is not None],
                "rule": "the honest clients' mean global accuracy with faults minus the same clients' in the "
                        "fault-free run, each at its own selected round, paired by seed, mean over the paired seeds; "
                        "final_mean: the same over the final window's per-client figures; headline_mean: "
                        "final_mean when every paired seed has one (statistic final), else mean (selected); "
                        "ci95: its 95% t-interval over the paired seeds"}


def _same_partition(a: Loaded, b: Loaded) -> bool:
    return a.partition_hash is None or b.partition_hash is None or a.partition_hash == b.partition_hash


def find_drop(g: SettingGroup, fault_free: list[SettingGroup]) -> Drop:
    """``g``'s drop against the fault-free groups given (module doc)."""
    wanted = next((h for h in (baseline_hash(r) for r in g.ok) if h), None)
    drop = Drop(wanted)
    if wanted is None:
        return drop
    candidates = [b for b in fault_free if b.config_hash == wanted and b.method_version == g.method_version
                  and b.selection_rule == g.selection_rule]
    used: set[str] = set()
    for r in g.ok:
        if baseline_hash(r) != wanted:
            continue
        matches = [(b, base) for b in candidates for base in b.ok
                   if base.seed == r.seed and data_identity(base) == data_identity(r) and _same_partition(r, base)]
        if not matches:
            continue
        group, base = min(matches, key=lambda m: precedence(m[1]))  # the seed as its group counts it
        drop.pairs.append(Pair(r.seed, r, base))
        used.add(group.group_id)
    drop.baseline_group_ids = sorted(used)
    return drop


def attach_drops(groups: list[SettingGroup]) -> None:
    """Set ``drop`` on every group run with faults (None stays on fault-free groups)."""
    fault_free = [g for g in groups if not g.has_faults]
    for g in groups:
        if g.has_faults:
            g.drop = find_drop(g, fault_free)


# ----------------------------------------------------------------------------- the plot's axis


def fault_kind(r: Loaded) -> Optional[str]:
    return faults_section(r).get("kind")


def fault_fraction(r: Loaded) -> Optional[float]:
    """The fraction of faulty clients: the spec's, or the faulty clients over N for a list."""
    section = faults_section(r)
    if section.get("fraction") is not None:
        return float(section["fraction"])
    faulty, honest = section.get("faulty_clients") or [], section.get("honest_clients") or []
    if faulty + honest:
        return round(len(faulty) / (len(faulty) + len(honest)), 4)
    return None


def fault_x(r: Loaded) -> Optional[float]:
    """Where a record run with faults sits on the robustness plot's x axis (module doc)."""
    kind = fault_kind(r)
    if kind in STRENGTH_AXIS:
        strength = faults_section(r).get("strength")
        return None if strength is None else float(strength)
    return fault_fraction(r) if kind else None


def series_params(r: Loaded) -> str:
    """What else sets a fault apart, beside x: the mode, and who is faulty where x is the strength."""
    section = faults_section(r)
    parts = []
    if fault_kind(r) in STRENGTH_AXIS:
        spec = str(section.get("spec") or "")
        who = spec.split(":", 1)[1].split("@")[0].split("/")[0] if ":" in spec else ""
        parts.append(f"clients={who}")
    if section.get("mode"):
        parts.append(str(section["mode"]))
    if mark := selection_mark(r.selection_rule):  # an old rule's points are a line of their own
        parts.append(f"selection={mark}")
    return " ".join(parts)
