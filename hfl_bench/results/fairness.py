"""Whom a method serves: three fairness figures of a group, each taken per seed, then summarized
over the seeds like every other figure (mean, sample sd: ``setting.Stat``).

Every figure reads each client's **final local-test accuracy**: the client's model on its own
test split, averaged over the final window (``metrics.final.per_client[].local_acc``, schema 1.6
on), over the headline's clients (``figures.headline_of``: the honest clients under faults,
``faults.honest_clients``; the recipients of a multimodal run, ``modalities.recipients``; else
every client). A client without the figure is left out. Per seed:

- ``client_sd``: the population standard deviation (ddof = 0) of those accuracies over the clients;
- ``worst10``: the mean accuracy of the worst 10 % of the clients, k = max(1, ceil(n / 10)) of the
  n clients (rounded up, so 15 clients give 2, and never fewer than one);
- ``below_local``: the share (percent) of the clients whose accuracy is strictly below their own
  accuracy under ``local`` (each client alone), client by client (matched by client id), on the
  same seed and protocol: the ``local`` record of that seed in a ``local`` group of the same
  protocol (``SettingGroup.protocol``) and the same architecture pool, which drew the same
  partition (the same partition hash); of several such groups (versions, parameters), the one with
  the highest mean headline (as ``paired.best_group`` picks a reference). A seed with no such
  record has no ``below_local``: **not available**, never guessed. A ``local`` group is its own
  twin (0 %).

A record written before schema 1.6 has no final per-client figures: its seed is **not recorded**
(the selected round's per-client figures are not mixed in: one statistic per figure). A group whose
every seed lacks a figure shows ``not recorded`` (``not available`` for ``below_local`` where the
figures exist but no ``local`` twin does).

``attach_fairness`` sets ``SettingGroup.fairness`` on every group before any filter (as the drop
is: a filter never hides a ``local`` twin). ``compare`` pairs these per-seed figures by seed
against a reference (``leaderboard compare --fairness``) with ``paired``'s machinery.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from hfl_bench.results.figures import FigureError, has_recipients
from hfl_bench.results.headline import headline_stat
from hfl_bench.results.loading import Loaded
from hfl_bench.results.paired import Side, Table, against, table
from hfl_bench.results.setting import SettingGroup, Stat

FIGURES = ("client_sd", "worst10", "below_local")
LOCAL = "local"  # the method whose per-client accuracy ``below_local`` compares with
NOT_RECORDED = "not recorded"
NOT_AVAILABLE = "not available"
DEFINITIONS = {
    "accuracy": "each client's final local-test accuracy (metrics.final.per_client[].local_acc: its model on its own "
                "test split, mean over the final window), over the headline's clients",
    "client_sd": "population sd (ddof=0) over the clients of that accuracy, per seed; mean and sample sd over seeds",
    "worst10": "mean accuracy of the worst max(1, ceil(n/10)) of the n clients, per seed; mean and sample sd over "
               "seeds",
    "below_local": "percent of the clients strictly below their own accuracy under local on the same seed and "
                   "protocol (same pool, same partition hash), client by client; not available without such a record",
    "not_recorded": "records before schema 1.6 have no final per-client figures",
}


# ----------------------------------------------------------------------------- one record


def headline_client_ids(record: dict[str, Any]) -> Optional[set[int]]:
    """The client ids the headline is over: the honest ones under faults, the recipients of a
    multimodal run with recipients; None: every client."""
    faults = record.get("faults")
    if isinstance(faults, dict):
        return set(faults.get("honest_clients") or [])
    if has_recipients(record):
        return set(record["modalities"]["recipients"])
    return None


def client_accuracies(record: dict[str, Any], clients: Optional[set[int]] = None) -> dict[int, float]:
    """Each client's final local-test accuracy by client id (only ``clients`` where given); {} for
    a record without final per-client figures."""
    final = (record.get("metrics") or {}).get("final") or {}
    return {row["cid"]: float(row["local_acc"]) for row in final.get("per_client") or []
            if row.get("local_acc") is not None and (clients is None or row["cid"] in clients)}


def client_sd(accs: Iterable[float]) -> Optional[float]:
    xs = list(accs)
    return round(statistics.pstdev(xs), 4) if xs else None


def worst_count(n: int) -> int:
    """How many clients are the worst 10 %: ceil(n / 10), at least one."""
    return max(1, -(-n // 10))


def worst10(accs: Iterable[float]) -> Optional[float]:
    xs = sorted(accs)
    return round(statistics.fmean(xs[:worst_count(len(xs))]), 4) if xs else None


def below_local(accs: dict[int, float], local: dict[int, float]) -> Optional[float]:
    """Percent of the clients of ``accs`` that ``local`` also has whose accuracy is strictly below
    their own under local; None where no client is in both."""
    both = [cid for cid in accs if cid in local]
    if not both:
        return None
    return round(100.0 * sum(accs[cid] < local[cid] for cid in both) / len(both), 4)


# ----------------------------------------------------------------------------- a group


@dataclass
class SeedFairness:
    """One seed's figures (None: not recorded, or for ``below_local`` no ``local`` twin)."""

    seed: Any
    n_clients: int
    client_sd: Optional[float]
    worst10: Optional[float]
    below_local: Optional[float]
    local_record: Optional[str] = None  # the twin's path

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "n_clients": self.n_clients, "client_sd": self.client_sd, "worst10": self.worst10,
                "below_local": self.below_local, "local_record": self.local_record}


@dataclass
class Fairness:
    """A group's fairness figures: per seed and over the seeds."""

    seeds: list[SeedFairness] = field(default_factory=list)  # the ok seeds with final per-client figures
    not_recorded: list[Any] = field(default_factory=list)  # ok seeds whose records have none
    no_local: list[Any] = field(default_factory=list)  # seeds with figures but no local twin

    def value(self, seed: Any, name: str) -> Optional[float]:
        return next((getattr(s, name) for s in self.seeds if s.seed == seed), None)

    def stat(self, name: str) -> Stat:
        return Stat.of(getattr(s, name) for s in self.seeds)

    def state(self, name: str) -> str:
        """Why a figure has no value: ``not recorded`` (no seed has per-client figures), ``not
        available`` (below_local: no seed has a local twin); "" where it has one."""
        if not self.seeds:
            return NOT_RECORDED
        return "" if self.stat(name).n else NOT_AVAILABLE

    def label(self, name: str, n_seeds: int) -> str:
        """``3.21 ± 0.40``, ``(n=2)`` appended where fewer seeds than the group's have it, or the state."""
        st = self.stat(name)
        if not st.n:
            return self.state(name)
        sd = "-" if st.sd is None else f"{st.sd:.2f}"
        return f"{st.mean:.2f} ± {sd}" + (f" (n={st.n})" if st.n < n_seeds else "")

    def as_dict(self) -> dict[str, Any]:
        return {**{name: {**self.stat(name).as_dict(), "state": self.state(name) or None} for name in FIGURES},
                "per_seed": [s.as_dict() for s in self.seeds], "not_recorded_seeds": self.not_recorded,
                "no_local_seeds": self.no_local}


def local_twin(g: SettingGroup, groups: Iterable[SettingGroup]) -> Optional[SettingGroup]:
    """The ``local`` group of ``g``'s protocol and pool (the highest mean headline of several);
    ``g`` itself where it is one."""
    if g.method == LOCAL:
        return g
    mine = [x for x in groups if x.method == LOCAL and x.pool == g.pool and x.protocol() == g.protocol()]
    return max(mine, key=_headline_mean) if mine else None


def _headline_mean(g: SettingGroup) -> float:
    mean = headline_stat(g).mean
    return -math.inf if mean is None else mean


def fairness_of(g: SettingGroup, twin: Optional[SettingGroup]) -> Fairness:
    out = Fairness()
    by_seed: dict[Any, Loaded] = {r.seed: r for r in twin.ok} if twin is not None else {}
    for r in g.ok:
        accs = client_accuracies(r.record, headline_client_ids(r.record))
        if not accs:
            out.not_recorded.append(r.seed)
            continue
        t = by_seed.get(r.seed)
        paired = t is not None and r.partition_hash is not None and t.partition_hash == r.partition_hash
        below = below_local(accs, client_accuracies(t.record)) if paired else None
        if below is None:
            out.no_local.append(r.seed)
        out.seeds.append(SeedFairness(r.seed, len(accs), client_sd(accs.values()), worst10(accs.values()), below,
                                      str(t.path) if paired else None))
    return out


def with_local_twins(groups: list[SettingGroup]) -> list[tuple[SettingGroup, Optional[SettingGroup]]]:
    """Every group beside its ``local`` twin (``local_twin``) found among all of ``groups``: the
    pairing the fairness and the clock views both read."""
    locals_by: dict[tuple, list[SettingGroup]] = defaultdict(list)
    for x in groups:
        if x.method == LOCAL:
            locals_by[(x.protocol(), x.pool)].append(x)
    return [(g, local_twin(g, locals_by.get((g.protocol(), g.pool), []))) for g in groups]


def attach_fairness(groups: list[SettingGroup]) -> None:
    """Set ``fairness`` on every group, its ``local`` twin found among all of ``groups``."""
    for g, twin in with_local_twins(groups):
        g.fairness = fairness_of(g, twin)


def group_fairness(g: SettingGroup) -> Fairness:
    """The group's figures (computed here for a group built without ``attach_fairness``: no twin)."""
    if g.fairness is None:
        g.fairness = fairness_of(g, local_twin(g, [g]))
    return g.fairness


# ----------------------------------------------------------------------------- paired by seed


@dataclass(frozen=True)
class FairnessSide(Side):
    """A side of a paired comparison read at a fairness figure of each seed."""

    def checked(self, figure: Optional[str], other_endpoint: Optional[str] = None) -> str:
        if figure not in FIGURES:
            raise FigureError(f"unknown fairness figure {figure!r}; choose one of: {', '.join(FIGURES)}")
        return figure

    def seed_value(self, r: Loaded, figure: str) -> Optional[float]:
        return group_fairness(self.group).value(r.seed, figure)


def compare(groups: list[SettingGroup], reference: str, methods: Iterable[str] = ()) -> list[Table]:
    """Per protocol where ``reference`` ran (the groups ``paired.against`` meets there), one table per
    fairness figure: each group's figure minus the reference's, paired by seed, Holm over the table."""
    out = []
    for t in against(groups, reference, methods):
        ref = FairnessSide(t.reference.group, None, t.reference.with_version, t.reference.variant)
        rows = [FairnessSide(c.a.group, None, c.a.with_version, c.a.variant) for c in t.comparisons]
        out += [table(rows, ref, name, t.protocol, t.notes, t.key) for name in FIGURES]
    return out
