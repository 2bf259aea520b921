"""Three rankings side by side (issue 65): per task, device setting and protocol, each method's rank
by final accuracy, by time-to-accuracy and by worst-client accuracy, with the figures, the seeds, and
a generated line of which methods move between the rankings (``leaderboard rankings``).

**Device setting.** A record's ``clock`` section (``--devices``, schema 1.10) names it: the profile
(a preset's name, or a file's name and the first 8 characters of its SHA-256), the assignment
(``random`` / ``by-size``) and the deadline; a record without one is ``none`` (its time figure is
**not recorded**). Without a deadline the profile is not part of the config hash (the clock only
observes), so ``show`` puts a run under two presets into one group as two copies of a seed; here
each device setting's records are grouped on their own (``board.build_groups`` per setting), so a
group, its seeds and its ``local`` twin are all of one device setting.

**Protocols.** Within a device setting, methods are ranked within one protocol (``ranking``'s:
task, partition, clients, rounds, ..., the setting section), each by its best group there
(``ranking.protocol_scores``: the highest mean headline; versions apart where there are several).
A protocol that one method alone ran has no ranking (``alone``). Per method:

- **final accuracy**: the headline global accuracy (``headline``: mean of the last evaluated rounds),
  mean over seeds; higher ranks first.
- **time to local**: ``timing``'s time-to-accuracy, per seed the simulated time at which the global
  accuracy first reaches ``local``'s final global accuracy on the same seed and protocol. Of a
  method's seeds that have that target, the share that reached it ranks first (more first), then the
  mean time over the seeds that reached it (less first): a method that reached it on every seed
  ranks ahead of one that missed it on some, and methods that **never reach it rank last** (tied).
  A method with no target on any seed (no clock: **not recorded**; no ``local`` twin of its
  protocol, e.g. another setting section: **not available**) is not ranked by time.
- **worst 10 %**: ``fairness``' worst-client figure, per seed the mean final local-test accuracy
  of the worst max(1, ceil(n/10)) clients, mean over seeds; higher ranks first. A method without
  final per-client figures (records before schema 1.6) is not ranked by it (**not recorded**).

**Ties** share the mean of the ranks they span (figures equal to 4 decimals), as ``ranking`` ranks.
**What changed** compares each of the two other rankings with the one by final accuracy, over the
methods ranked in both: the methods that move most (up to ``MAX_MOVES``), by how many places, and a
count of the others that move and of those that keep their place.

Reads JSON only: no torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from hfl_bench.results.fairness import group_fairness
from hfl_bench.results.headline import headline_stat
from hfl_bench.results.loading import Loaded
from hfl_bench.results.ranking import protocol_scores
from hfl_bench.results.setting import SettingGroup, Stat, section_reasons
from hfl_bench.results.timing import group_timing

NO_DEVICES = "none"  # the device setting of records without a clock
FIGURES = ("global_acc", "time_to_local", "worst10")
NAMES = {"global_acc": "final accuracy", "time_to_local": "time to local", "worst10": "worst 10%"}
NOT_RECORDED, NOT_AVAILABLE, NOT_REACHED = "not recorded", "not available", "not reached"
MAX_MOVES = 5  # the biggest moves a line names; the others are counted (json names every rank)
DEFINITIONS = {
    "devices": "the record's device setting (clock section: profile, assignment, deadline); none: no --devices. "
               "Records of two device settings are grouped apart",
    "global_acc": "headline global test accuracy (mean of the last 10 evaluated rounds), mean ± sample sd over "
                  "seeds; higher ranks first",
    "time_to_local": "simulated seconds until the global accuracy first reaches local's final global accuracy on "
                     "the same seed and protocol; ranked by the share of seeds that reached it (more first), then "
                     "the mean time over those seeds (less first); never reached: last, tied; no target (no clock: "
                     "not recorded; no local of the protocol: not available): not ranked",
    "worst10": "mean final local-test accuracy of the worst max(1, ceil(n/10)) clients, per seed, then mean ± "
               "sample sd over seeds; higher ranks first; not recorded before schema 1.6: not ranked",
    "ties": "equal figures (4 decimals) share the mean of the ranks they span",
    "reclocked_seeds": "how many of a method's seeds' records were re-clocked (hfl-bench reclock) from a run under "
                       "another device setting: the same training timed on these devices, exactly as a run on "
                       "them would be",
    "changes": "per ranking, the methods whose place differs most from their place by final accuracy (of the "
               f"methods ranked in both; at most {MAX_MOVES} named, the others counted): up or down by how many "
               "places",
}


def device_setting(record: dict[str, Any]) -> str:
    """The record's device setting, as one label: ``mixed-phones, by-size`` (``, deadline 30 s``
    where one was set); a profile file by its name and digest; ``none`` without a clock."""
    clock = record.get("clock")
    if not isinstance(clock, dict):
        return NO_DEVICES
    profile = str(clock.get("profile"))
    if not clock.get("preset"):
        profile = f"{profile} ({str(clock.get('profile_sha256') or '')[:8]})"
    deadline = clock.get("deadline_s")
    return f"{profile}, {clock.get('assignment')}" + (f", deadline {deadline:g} s" if deadline is not None else "")


# ----------------------------------------------------------------------------- one method's figures


@dataclass
class Entry:
    """One method in one protocol: its group's three figures and its ranks (None: not ranked)."""

    method: str
    group: SettingGroup = field(repr=False)
    seeds: int = 0
    acc: Stat = field(default_factory=lambda: Stat(None, None, 0))
    time: Stat = field(default_factory=lambda: Stat(None, None, 0))  # over the seeds that reached it
    with_target: int = 0  # seeds with a local twin's target
    time_state: str = ""  # why no time figure: not recorded, not available, not reached ("" where one)
    worst: Stat = field(default_factory=lambda: Stat(None, None, 0))
    worst_state: str = ""
    ranks: dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def reclocked(self) -> int:
        """How many of its ok seeds' records were re-clocked from another device setting
        (``clock.reclocked``, ``hfl-bench reclock``): the same training, timed on these devices."""
        return sum(is_reclocked(r.record) for r in self.group.ok)

    def time_key(self) -> Optional[tuple[float, float]]:
        """The time ranking's key (smaller first): the share of target seeds not reached, then the
        mean time over the reached ones (inf: none). None: no target on any seed, not ranked."""
        if not self.with_target:
            return None
        missed = round(1 - self.time.n / self.with_target, 4)
        return missed, (math.inf if self.time.mean is None else round(self.time.mean, 4))


def entry(method: str, g: SettingGroup) -> Entry:
    timing, fairness = group_timing(g), group_fairness(g)
    targets = [s for s in timing.seeds if s.target is not None]
    time = Stat.of(s.time_to_local for s in targets)
    if not timing.seeds:
        time_state = NOT_RECORDED
    elif not targets:
        time_state = NOT_AVAILABLE
    else:
        time_state = "" if time.n else NOT_REACHED
    worst = fairness.stat("worst10")
    return Entry(method, g, len(g.ok), headline_stat(g), time, len(targets), time_state, worst,
                 "" if worst.n else fairness.state("worst10"))


def shared_ranks(keys: dict[str, Any]) -> dict[str, float]:
    """Rank 1 = the smallest key; equal keys share the mean of the ranks they span."""
    order = sorted(keys, key=lambda m: (keys[m], m))
    out, i = {}, 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and keys[order[j + 1]] == keys[order[i]]:
            j += 1
        for m in order[i:j + 1]:
            out[m] = (i + 1 + j + 1) / 2
        i = j + 1
    return out


def rank_entries(entries: list[Entry]) -> None:
    """Set each entry's three ranks (``shared_ranks`` over the entries with that figure)."""
    keys = {
        "global_acc": {e.method: -round(e.acc.mean, 4) for e in entries if e.acc.mean is not None},
        "time_to_local": {e.method: k for e in entries if (k := e.time_key()) is not None},
        "worst10": {e.method: -round(e.worst.mean, 4) for e in entries if e.worst.mean is not None},
    }
    for figure, by_method in keys.items():
        ranks = shared_ranks(by_method)
        for e in entries:
            e.ranks[figure] = ranks.get(e.method)


def place(rank: Optional[float]) -> str:
    return "-" if rank is None else f"{rank:g}"


def changes(entries: list[Entry]) -> list[str]:
    """One line per other ranking: the methods whose place differs from their place by final
    accuracy (the ``MAX_MOVES`` biggest moves, the others counted), or that it keeps the order."""
    out = []
    for figure in FIGURES[1:]:
        both = [e for e in entries if e.ranks.get("global_acc") is not None and e.ranks.get(figure) is not None]
        if len(both) < 2:
            out.append(f"by {NAMES[figure]}: fewer than two methods ranked by both, nothing to compare")
            continue
        moved = sorted(((e.ranks["global_acc"] - e.ranks[figure], e) for e in both if e.ranks["global_acc"]
                        != e.ranks[figure]), key=lambda m: (-abs(m[0]), -m[0], m[1].method))
        if not moved:
            out.append(f"by {NAMES[figure]}: the same order as by final accuracy ({len(both)} methods)")
            continue
        moves = ", ".join(f"{e.method} {'up' if d > 0 else 'down'} {abs(d):g} ({place(e.ranks['global_acc'])} -> "
                          f"{place(e.ranks[figure])})" for d, e in moved[:MAX_MOVES])
        rest = moved[MAX_MOVES:]
        most = abs(rest[0][0]) if rest else 0
        more = (f"; {len(rest)} more move{'s' if len(rest) == 1 else ''} by {most:g} place{'s' if most != 1 else ''} "
                "or fewer" if rest else "")
        kept = len(both) - len(moved)
        stay = "; 1 other keeps its place" if kept == 1 else f"; {kept} others keep their place" if kept else ""
        out.append(f"by {NAMES[figure]} vs final accuracy: {moves}{more}{stay}")
    return out


def notes(entries: list[Entry]) -> list[str]:
    """Who is not ranked by a figure, and why; who never reached local's figure (ranked last)."""
    out = []
    never = [e.method for e in entries if e.time_state == NOT_REACHED]
    if never:
        out.append(f"never reached local's final accuracy (ranked last by time, tied): {', '.join(never)}")
    for figure, state_of in (("time_to_local", lambda e: e.time_state), ("worst10", lambda e: e.worst_state)):
        by_state: dict[str, list[str]] = defaultdict(list)
        for e in entries:
            if e.ranks.get(figure) is None:
                by_state[state_of(e) or NOT_RECORDED].append(e.method)
        out += [f"not ranked by {NAMES[figure]} ({state}): {', '.join(ms)}" for state, ms in by_state.items()]
    partial = [f"{e.method} {e.time.n}/{e.with_target}" for e in entries if 0 < e.time.n < e.with_target]
    if partial:
        out.append("reached local's final accuracy on some seeds only (ranked after those that reached it on every "
                   "seed): " + ", ".join(partial))
    return out


# ----------------------------------------------------------------------------- the tables


@dataclass
class Ranking:
    """One protocol of one task under one device setting, its methods ranked three ways."""

    task: str
    devices: str
    section: str
    protocol: str
    entries: list[Entry]
    order: tuple = ()

    @property
    def changes(self) -> list[str]:
        return changes(self.entries)

    @property
    def notes(self) -> list[str]:
        return section_reasons(self.section) + notes(self.entries) + reclocked_note(self.entries)

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "devices": self.devices, "section": self.section, "protocol": self.protocol,
                "methods": [entry_json(e) for e in self.entries], "changes": self.changes, "notes": self.notes}


def is_reclocked(record: dict[str, Any]) -> bool:
    """Whether the record's clock was re-clocked (``hfl-bench reclock``) rather than timed as it trained."""
    clock = record.get("clock")
    return isinstance(clock, dict) and isinstance(clock.get("reclocked"), dict)


def reclocked_note(entries: list[Entry]) -> list[str]:
    """A line saying how many seeds' records were re-clocked (none: no line)."""
    done, seeds = sum(e.reclocked for e in entries), sum(e.seeds for e in entries)
    return [f"re-clocked: {done} of {seeds} seeds' records were timed on these devices by hfl-bench reclock "
            "from a run under another device setting (the same training: exact)"] if done else []


@dataclass
class Rankings:
    tables: list[Ranking]
    alone: list[dict[str, str]]  # protocols one method alone ran: no ranking

    def as_dict(self) -> dict[str, Any]:
        return {"definitions": DEFINITIONS, "tables": [t.as_dict() for t in self.tables], "alone": self.alone}


def entry_json(e: Entry) -> dict[str, Any]:
    return {"method": e.method, "group_id": e.group.group_id, "seeds": e.seeds, "reclocked_seeds": e.reclocked,
            "global_acc": {**e.acc.as_dict(), "rank": e.ranks.get("global_acc")},
            "time_to_local": {**e.time.as_dict(), "rank": e.ranks.get("time_to_local"),
                              "seeds_with_target": e.with_target, "state": e.time_state or None},
            "worst10": {**e.worst.as_dict(), "rank": e.ranks.get("worst10"), "state": e.worst_state or None}}


def profile_name(record: dict[str, Any]) -> str:
    """The name ``--devices`` filters by: the clock's profile (a preset's or a file's name), or ``none``."""
    clock = record.get("clock")
    return str(clock.get("profile")) if isinstance(clock, dict) else NO_DEVICES


def by_device_setting(records: Iterable[Loaded]) -> dict[str, list[Loaded]]:
    out: dict[str, list[Loaded]] = defaultdict(list)
    for r in records:
        out[device_setting(r.record)].append(r)
    return dict(out)


def rankings(records: Iterable[Loaded], tasks: Iterable[str] = (), devices: Iterable[str] = ()) -> Rankings:
    """Every protocol's three rankings, per device setting (``tasks``, ``devices``: only these, by
    task name and by profile name, ``profile_name``)."""
    from hfl_bench.results.board import build_groups

    tasks, devices = set(tasks), set(devices)
    tables, alone = [], []
    records = [r for r in records if not devices or profile_name(r.record) in devices]
    for label, members in by_device_setting(records).items():
        for p in protocol_scores(build_groups(members)):
            if tasks and p["task"] not in tasks:
                continue
            order, section = p["section"]
            if len(p["groups"]) < 2:
                alone += [{"task": p["task"], "devices": label, "section": section, "protocol": p["protocol"],
                           "method": m} for m in p["groups"]]
                continue
            entries = [entry(m, g) for m, g in p["groups"].items()]
            rank_entries(entries)
            entries.sort(key=lambda e: (e.ranks["global_acc"] if e.ranks["global_acc"] is not None else math.inf,
                                        e.method))
            tables.append(Ranking(p["task"], label, section, p["protocol"], entries,
                                  (p["task"], label == NO_DEVICES, label, order, p["protocol"])))
    tables.sort(key=lambda t: t.order)
    alone.sort(key=lambda a: (a["task"], a["devices"] == NO_DEVICES, a["devices"], a["protocol"], a["method"]))
    return Rankings(tables, alone)


def device_names(records: Iterable[Loaded]) -> list[str]:
    """The profile names the records' device settings hold (what ``--devices`` filters by)."""
    return sorted({profile_name(r.record) for r in records})


# ----------------------------------------------------------------------------- rows for the views


COLUMNS = ("method", "seeds", "# acc", "# time", "# worst", "global acc", "time to local (s)", "worst 10%")


def _figure(st: Stat, seeds: int) -> str:
    sd = "-" if st.sd is None else f"{st.sd:.2f}"
    return f"{st.mean:.2f} ± {sd}" + (f" (n={st.n})" if st.n < seeds else "")


def _time_cell(e: Entry) -> str:
    if not e.with_target or not e.time.n:
        return e.time_state + (f" (0/{e.with_target})" if e.time_state == NOT_REACHED else "")
    sd = "-" if e.time.sd is None else f"{e.time.sd:.2f}"
    return f"{e.time.mean:.2f} ± {sd}" + (f" ({e.time.n}/{e.with_target} reached)" if e.time.n < e.with_target else "")


def rows(t: Ranking) -> list[dict[str, str]]:
    return [{"method": e.method, "seeds": str(e.seeds), "# acc": place(e.ranks.get("global_acc")),
             "# time": place(e.ranks.get("time_to_local")), "# worst": place(e.ranks.get("worst10")),
             "global acc": _figure(e.acc, e.seeds) if e.acc.n else NOT_RECORDED,
             "time to local (s)": _time_cell(e),
             "worst 10%": _figure(e.worst, e.seeds) if e.worst.n else e.worst_state}
            for e in t.entries]


def title(t: Ranking) -> str:
    return f"{t.task}, devices: {t.devices}; setting: {t.section}; {t.protocol}"
