"""Time on devices: a group's simulated time (``--devices``, schema 1.10; ``hfl_bench.clock``), taken
per seed, then summarized over the seeds like every other figure (mean, sample sd: ``setting.Stat``).

Per seed, from the record's ``clock`` section and each round's ``history[].clock``:

- ``sim_time``: the run's total simulated time (``clock.total_s``), in seconds;
- ``time_to_local``: time-to-accuracy, the simulated time at which the global test accuracy curve
  (``history[].global_acc``, the rounds that ran a test) first reaches a target: the end of that
  round (``start_s + seconds``; 0 where the initial models already reach it). The target is the
  final global accuracy (``metrics.final.global_acc``, else the selected round's) of the ``local``
  record on the same seed and protocol, as the fairness view finds it (``fairness.local_twin``:
  same protocol, pool and partition hash). A seed whose curve never reaches it is **not reached**
  (no figure); one without a ``local`` twin is **not available**;
- ``acc_at_budget``: with a time budget (``leaderboard show --time-budget S``), the global
  accuracy of the last tested round that ended by S (the initial models' at time 0).

A record without a clock (older than 1.10, or run without ``--devices``) has **not recorded**
seeds: never 0. The server's time is not modelled (``clock.SERVER``). Reads JSON only: no torch.

``compare`` pairs these per-seed figures by seed against a reference (``leaderboard compare
--clock``) with ``paired``'s machinery, as ``fairness.compare`` does: a seed either side has no
figure for (not recorded, not reached, not available) is left out of the pairing and counted in the
comparison's notes, by why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from hfl_bench.results.fairness import local_twin, with_local_twins
from hfl_bench.results.figures import FigureError
from hfl_bench.results.loading import Loaded
from hfl_bench.results.paired import Side, Table, against, table
from hfl_bench.results.setting import SettingGroup, Stat

FIGURES = ("sim_time", "time_to_local", "acc_at_budget")
NOT_RECORDED = "not recorded"
NOT_AVAILABLE = "not available"
NOT_REACHED = "not reached"
NO_BUDGET = "no --time-budget"
DEFINITIONS = {
    "sim_time": "the run's total simulated time on its devices (clock.total_s, --devices), seconds, per seed",
    "time_to_local": "simulated time (s) at which the global test accuracy first reaches the final global accuracy "
                     "of local on the same seed and protocol (same pool, same partition hash); not reached: never; "
                     "not available: no such local record",
    "acc_at_budget": "global test accuracy of the last tested round that ended by the time budget (--time-budget S)",
    "not_recorded": "records without a clock (before schema 1.10, or run without --devices)",
}


def clock_of(record: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The record's ``clock`` section (schema 1.10, ``--devices``), else None: not recorded."""
    clock = record.get("clock")
    return clock if isinstance(clock, dict) else None


def total_time(record: dict[str, Any]) -> Optional[float]:
    clock = clock_of(record)
    return None if clock is None else float(clock["total_s"])


def curve(record: dict[str, Any]) -> list[tuple[float, float]]:
    """(simulated time at the round's end, global test accuracy) of every tested round, in order;
    the initial models' at time 0. [] without a clock."""
    if clock_of(record) is None:
        return []
    out = []
    for h in record.get("history") or []:
        acc = h.get("global_acc")
        c = h.get("clock")
        if h.get("round") == 0:
            end = 0.0
        elif isinstance(c, dict):
            end = float(c["start_s"]) + float(c["seconds"])
        else:
            continue
        if acc is not None:
            out.append((end, float(acc)))
    return out


def time_to_accuracy(record: dict[str, Any], target: float) -> Optional[float]:
    """The simulated time at which the global accuracy curve first reaches ``target`` (None: never)."""
    return next((t for t, acc in curve(record) if acc >= target), None)


def accuracy_at(record: dict[str, Any], budget: float) -> Optional[float]:
    """The global accuracy of the last tested round that ended by ``budget`` seconds (None: none)."""
    reached = [acc for t, acc in curve(record) if t <= budget]
    return reached[-1] if reached else None


def reclocked_from(record: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Where a re-clocked record's clock came from (``clock.reclocked``, ``hfl-bench reclock``): the
    source record's id, file, SHA-256 and device setting, and the re-clocking commit; None: timed as
    it trained."""
    clock = clock_of(record)
    source = clock.get("reclocked") if clock is not None else None
    return dict(source) if isinstance(source, dict) else None


def final_global(record: dict[str, Any]) -> Optional[float]:
    """A record's final global accuracy (``metrics.final``), else its selected round's."""
    metrics = record.get("metrics") or {}
    final = metrics.get("final") or {}
    value = final.get("global_acc")
    return value if value is not None else metrics.get("global_acc")


@dataclass
class SeedTiming:
    seed: Any
    sim_time: float
    target: Optional[float]  # the local twin's final global accuracy (None: no twin)
    time_to_local: Optional[float]
    record: dict[str, Any] = field(repr=False, default_factory=dict)

    def acc_at_budget(self, budget: Optional[float]) -> Optional[float]:
        return None if budget is None else accuracy_at(self.record, budget)

    def as_dict(self, budget: Optional[float]) -> dict[str, Any]:
        return {"seed": self.seed, "sim_time": self.sim_time, "target": self.target,
                "time_to_local": self.time_to_local, "acc_at_budget": self.acc_at_budget(budget),
                "reclocked_from": reclocked_from(self.record)}


@dataclass
class Timing:
    """A group's time figures: per seed (the ok seeds with a clock) and over the seeds."""

    seeds: list[SeedTiming] = field(default_factory=list)
    not_recorded: list[Any] = field(default_factory=list)
    budget: Optional[float] = None  # leaderboard show --time-budget

    def seed(self, seed: Any) -> Optional[SeedTiming]:
        return next((s for s in self.seeds if s.seed == seed), None)

    def value(self, seed: Any, name: str) -> Optional[float]:
        """One seed's figure (None: not recorded, not reached, not available, or no budget)."""
        s = self.seed(seed)
        if s is None:
            return None
        return s.acc_at_budget(self.budget) if name == "acc_at_budget" else getattr(s, name)

    def why_missing(self, seed: Any, name: str) -> str:
        """Why one seed has no figure: not recorded (no clock), not available (no local twin), not reached."""
        s = self.seed(seed)
        if s is None:
            return NOT_RECORDED
        if name == "acc_at_budget" and self.budget is None:
            return NO_BUDGET
        if name == "time_to_local" and s.target is None:
            return NOT_AVAILABLE
        return NOT_REACHED

    def values(self, name: str) -> list[Optional[float]]:
        if name == "acc_at_budget":
            return [s.acc_at_budget(self.budget) for s in self.seeds]
        return [getattr(s, name) for s in self.seeds]

    def stat(self, name: str) -> Stat:
        return Stat.of(self.values(name))

    def state(self, name: str) -> str:
        """Why a figure has no value ("" where it has one)."""
        if not self.seeds:
            return NOT_RECORDED
        if self.stat(name).n:
            return ""
        if name == "acc_at_budget":
            return NO_BUDGET if self.budget is None else NOT_REACHED
        if name == "time_to_local" and all(s.target is None for s in self.seeds):
            return NOT_AVAILABLE
        return NOT_REACHED

    def label(self, name: str, n_seeds: int) -> str:
        """``mean ± sd`` with ``(n=k)`` where fewer seeds than the group's have it, or the state."""
        st = self.stat(name)
        if not st.n:
            return self.state(name)
        sd = "-" if st.sd is None else f"{st.sd:.2f}"
        return f"{st.mean:.2f} ± {sd}" + (f" (n={st.n})" if st.n < n_seeds else "")

    def as_dict(self) -> dict[str, Any]:
        return {**{name: {**self.stat(name).as_dict(), "state": self.state(name) or None} for name in FIGURES},
                "time_budget_s": self.budget, "per_seed": [s.as_dict(self.budget) for s in self.seeds],
                "not_recorded_seeds": self.not_recorded}


def timing_of(g: SettingGroup, twin: Optional[SettingGroup]) -> Timing:
    out = Timing()
    by_seed: dict[Any, Loaded] = {r.seed: r for r in twin.ok} if twin is not None else {}
    for r in g.ok:
        total = total_time(r.record)
        if total is None:
            out.not_recorded.append(r.seed)
            continue
        t = by_seed.get(r.seed)
        paired = t is not None and r.partition_hash is not None and t.partition_hash == r.partition_hash
        target = final_global(t.record) if paired else None
        reached = None if target is None else time_to_accuracy(r.record, target)
        out.seeds.append(SeedTiming(r.seed, total, target, reached, r.record))
    return out


def attach_timing(groups: list[SettingGroup]) -> None:
    """Set ``timing`` on every group, its ``local`` twin found among all of ``groups``."""
    for g, twin in with_local_twins(groups):
        g.timing = timing_of(g, twin)


def group_timing(g: SettingGroup) -> Timing:
    if g.timing is None:
        g.timing = timing_of(g, local_twin(g, [g]))
    return g.timing


def set_time_budget(groups: Iterable[SettingGroup], budget: Optional[float]) -> None:
    """``leaderboard show --time-budget S``: the budget every group's ``acc_at_budget`` reads."""
    for g in groups:
        group_timing(g).budget = budget


# ----------------------------------------------------------------------------- paired by seed


def compared_figures(budget: Optional[float]) -> tuple[str, ...]:
    """The figures ``compare --clock`` pairs: acc_at_budget only with a time budget."""
    return FIGURES if budget is not None else tuple(f for f in FIGURES if f != "acc_at_budget")


@dataclass(frozen=True)
class TimingSide(Side):
    """A side of a paired comparison read at a time figure of each seed."""

    def checked(self, figure: Optional[str], other_endpoint: Optional[str] = None) -> str:
        if figure not in FIGURES:
            raise FigureError(f"unknown time figure {figure!r}; choose one of: {', '.join(FIGURES)}")
        return figure

    def seed_value(self, r: Loaded, figure: str) -> Optional[float]:
        return group_timing(self.group).value(r.seed, figure)

    def missing(self, r: Loaded, figure: str) -> str:
        return f"{self.label} {group_timing(self.group).why_missing(r.seed, figure)}"


def compare(groups: list[SettingGroup], reference: str, methods: Iterable[str] = (),
            budget: Optional[float] = None) -> list[Table]:
    """Per protocol where ``reference`` ran (the groups ``paired.against`` meets there), one table per
    time figure (``compared_figures``): each group's figure minus the reference's, paired by seed,
    Holm over the table. ``budget``: the time budget every group's acc_at_budget reads."""
    set_time_budget(groups, budget)
    out = []
    for t in against(groups, reference, methods):
        ref = TimingSide(t.reference.group, None, t.reference.with_version, t.reference.variant)
        rows = [TimingSide(c.a.group, None, c.a.with_version, c.a.variant) for c in t.comparisons]
        out += [table(rows, ref, name, t.protocol, t.notes, t.key) for name in compared_figures(budget)]
    return out
