"""Faults in the results: the drop of a group run with faults against the same seeds without
faults, and where a fault setting sits on the robustness plot's x axis.

**The drop.** A record run with faults names its fault-free baseline by config hash
(``faults.baseline_config_hash``: the hash of the same config with ``faults`` empty). Each ok seed
of a group with faults is paired with the counted record (``grouping``: the newest ok record of
that seed) of a fault-free group with that config hash and the same method version, the same seed,
the same data identity (``grouping.data_identity``) and, where both records carry one, the same
partition hash. Per pair: the honest clients' global accuracy with faults minus the baseline's
global accuracy (all its clients, which are all honest); the group's drop is the mean over the
paired seeds (negative: accuracy lost), with how many seeds were paired. No pair: no drop
(``-`` / null).

**The x axis** of ``hfl-bench plot robustness``: ``label-noise`` and ``straggler`` have a strength
(share of labels flipped, probability of missing a round), which is x; ``byzantine`` and
``free-rider`` have none, so x is the fraction of faulty clients (``faults.fraction``, or the
faulty clients over N for an explicit list). The fault-free baseline is x = 0.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from hfl_bench.results.grouping import data_identity, recency
from hfl_bench.results.loading import Loaded
from hfl_bench.results.setting import SettingGroup, figure

STRENGTH_AXIS = ("label-noise", "straggler")  # x = strength; every other kind: x = fraction of faulty clients
X_LABELS = {
    "label-noise": "share of a faulty client's training labels flipped (strength)",
    "straggler": "probability a straggler misses a round (strength)",
    "byzantine": "fraction of clients that are byzantine",
    "free-rider": "fraction of clients that are free-riders",
}


def faults_section(r: Loaded) -> dict[str, Any]:
    section = r.record.get("faults")
    return section if isinstance(section, dict) else {}


def baseline_hash(r: Loaded) -> Optional[str]:
    from hfl_bench.results.identity import canonical_hash

    return canonical_hash(r.record, faults_section(r).get("baseline_config_hash"), faults="")


@dataclass
class Pair:
    """One seed with faults and the same seed without."""

    seed: Any
    faulty: Loaded
    baseline: Loaded

    @property
    def drop(self) -> Optional[float]:
        with_faults = figure(self.faulty.record, "global_acc", "honest")
        without = figure(self.baseline.record, "global_acc", "all")
        if with_faults is None or without is None:
            return None
        return round(float(with_faults) - float(without), 4)

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "drop": self.drop,
                "honest_global_acc": figure(self.faulty.record, "global_acc", "honest"),
                "baseline_global_acc": figure(self.baseline.record, "global_acc", "all"),
                "record": str(self.faulty.path), "baseline_record": str(self.baseline.path)}


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
    def seeds(self) -> list[Any]:
        return [p.seed for p in self.pairs if p.drop is not None]

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "n_paired": self.n_paired, "seeds": self.seeds,
                "baseline_config_hash": self.baseline_config_hash, "baseline_group_ids": self.baseline_group_ids,
                "pairs": [p.as_dict() for p in self.pairs if p.drop is not None],
                "rule": "honest global accuracy with faults minus the fault-free baseline's global accuracy, "
                        "paired by seed, mean over the paired seeds"}


def _same_partition(a: Loaded, b: Loaded) -> bool:
    return a.partition_hash is None or b.partition_hash is None or a.partition_hash == b.partition_hash


def find_drop(g: SettingGroup, fault_free: list[SettingGroup]) -> Drop:
    """``g``'s drop against the fault-free groups given (module doc)."""
    wanted = next((h for h in (baseline_hash(r) for r in g.ok) if h), None)
    drop = Drop(wanted)
    if wanted is None:
        return drop
    candidates = [b for b in fault_free if b.config_hash == wanted and b.method_version == g.method_version]
    used: set[str] = set()
    for r in g.ok:
        if baseline_hash(r) != wanted:
            continue
        matches = [(b, base) for b in candidates for base in b.ok
                   if base.seed == r.seed and data_identity(base) == data_identity(r) and _same_partition(r, base)]
        if not matches:
            continue
        group, base = max(matches, key=lambda m: recency(m[1]))
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
    kind = faults_section(r).get("kind")
    return kind if isinstance(kind, str) else None


def fault_fraction(r: Loaded) -> Optional[float]:
    """The fraction of faulty clients: the spec's, or the faulty clients over N for a list."""
    section = faults_section(r)
    fraction = section.get("fraction")
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool):
        return float(fraction)
    faulty, honest = section.get("faulty_clients"), section.get("honest_clients")
    if isinstance(faulty, list) and isinstance(honest, list) and faulty + honest:
        return round(len(faulty) / (len(faulty) + len(honest)), 4)
    return None


def fault_x(r: Loaded) -> Optional[float]:
    """Where a record run with faults sits on the robustness plot's x axis (module doc)."""
    kind = fault_kind(r)
    if kind in STRENGTH_AXIS:
        strength = faults_section(r).get("strength")
        return float(strength) if isinstance(strength, (int, float)) and not isinstance(strength, bool) else None
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
    return " ".join(parts)
