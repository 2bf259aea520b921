"""The leaderboard: valid records (``validation``) only, reproduced runs grouped over seeds
(``grouping``'s rule), described and summarized (``setting``), with the published figures beside
each group (``published``) and, for a group run with faults, its drop against the same seeds
without faults (``robustness``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from hfl_bench.results.fairness import attach_fairness
from hfl_bench.results.grouping import group_seeds
from hfl_bench.results.headline import headline_stat
from hfl_bench.results.loading import Loaded, Skipped
from hfl_bench.results.published import Published, match
from hfl_bench.results.robustness import attach_drops
from hfl_bench.results.setting import SettingGroup, describe
from hfl_bench.results.timing import attach_timing
from hfl_bench.results.validation import valid_records


@dataclass
class Board:
    groups: list[SettingGroup]
    unmatched: list[Published]
    skipped: list[str]


def named_records(loaded: Iterable[Loaded]) -> tuple[list[Loaded], list[Skipped]]:
    """The records a board can place (they name their method and task); the others are skipped
    (``leaderboard validate`` says what else is wrong with them)."""
    keep, skipped = [], []
    for r in loaded:
        if all(isinstance(r.record.get(k), dict) and r.record[k].get("name") for k in ("method", "task")):
            keep.append(r)
        else:
            skipped.append(Skipped(str(r.path), "no method or task name"))
    return keep, skipped


def board_records(loaded: Iterable[Loaded]) -> tuple[list[Loaded], list[Skipped]]:
    """The records a board reads: named (``named_records``) and valid (``validation``: the
    schema, finite numbers, accuracies within [0, 100]); every other one skipped with the reason,
    never averaged in."""
    named, unnamed = named_records(loaded)
    valid, invalid = valid_records(named)
    return valid, unnamed + invalid


def build_groups(records: Iterable[Loaded]) -> list[SettingGroup]:
    """Every reproduced group, described; a group run with faults with its drop, every group with
    its fairness figures and its simulated time (paired before any filter, so a filter never hides
    a baseline or a ``local`` twin)."""
    groups = [describe(g) for g in group_seeds(records)]
    attach_drops(groups)
    attach_fairness(groups)
    attach_timing(groups)  # time-to-accuracy reads the same local twins
    return groups


def build_board(records: list[Loaded], tasks: Iterable[str] = (), methods: Iterable[str] = (),
                pools: Iterable[str] = (), skipped: Optional[list[str]] = None) -> Board:
    """Groups (filtered, sorted by setting section, task, then the mean headline global accuracy,
    ``headline``) with published figures beside."""
    tasks, methods, pools = set(tasks), set(methods), set(pools)

    def keep(task, method, pool):
        return (not tasks or task in tasks) and (not methods or method in methods) and (not pools or pool in pools)

    groups = [g for g in build_groups(records) if keep(g.task, g.method, g.pool)]
    published = [Published(r.record) for r in records if r.kind == "published"]
    published = [p for p in published if keep(p.task, p.method, p.pool)]
    matched = set()
    for g in groups:
        for i, p in enumerate(published):
            m = match(p, g)
            if m is not None:
                g.published.append(m)
                matched.add(i)
    # one setting section after another (``SettingGroup.section_key``), then by task and accuracy
    means = {id(g): headline_stat(g).mean for g in groups}
    groups.sort(key=lambda g: (g.section_key(), g.task, -(means[id(g)] if means[id(g)] is not None else -1e9),
                               g.method, g.group_id))
    unmatched = sorted((p for i, p in enumerate(published) if i not in matched),
                       key=lambda p: (p.task, p.method, p.citation.get("key", ""), p.citation.get("locator", "")))
    return Board(groups, unmatched, list(skipped or []))
