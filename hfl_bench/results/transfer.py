"""Do methods' gains transfer across tasks? Each method's paired gain over a reference method
(``local`` by default) on every task that has records, and how well two tasks' rankings of those
gains agree.

**The gains.** A task is read in one protocol (``SettingGroup.protocol``): among the protocols of
the task where the reference ran, the first setting section in the sections' order (data-free,
heterogeneous pool, protocol budget ... : ``section_order``), then the one with the most other
methods, then the most reference seeds, then by label (``choose_protocol``; the output names it
and counts the task's other protocols left out). In it, each method's group with its default
parameters (``paired.default_group``; the best group where it has none) is compared with the
reference's best group exactly as ``leaderboard compare`` does (``paired.compare``: paired by
seed and partition, the mean difference with its 95% t-interval). A method with no group on the
task is **not run**; one whose groups there are all in other protocols (another setting section,
other rounds ...) is **other protocol only**; one with fewer than ``MIN_SEEDS`` paired seeds
takes no part in the agreement.

**The agreement** of two tasks is Kendall's tau-b (``scipy.stats.kendalltau``) between the
methods' mean differences on the two tasks, over the methods compared on both (at least
``MIN_METHODS``, else "too few methods"). Its interval is a seed bootstrap: each (method, task)
cell's paired differences are resampled with replacement (as many as it has), the means and tau
recomputed, ``RESAMPLES`` times, and the 2.5 / 97.5 percentiles taken. The generator is numpy's,
seeded by ``BOOTSTRAP_SEED`` and the two task names, so the same records always give the same
interval, whichever other tasks are read. A resample in which every method's mean is equal on a
task has no tau and is left out (counted). The reading follows the interval and nothing else:
above 0, the rankings agree; below 0, they disagree; covering 0, no evidence of agreement.

Tasks of different modalities run different pools (image, sensor, text models): the methods
are the same, the models are not, and each pair says when its tasks' pools differ.
"""

from __future__ import annotations

import math
import statistics
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from hfl_bench.results.paired import Comparison, Side, best_group, by_protocol, compare, default_group
from hfl_bench.results.ranking import protocol_labels
from hfl_bench.results.setting import SettingGroup

REFERENCE = "local"  # no communication at all: what every method's gain is measured from
MIN_METHODS = 4  # methods compared on both tasks below which no tau is read
MIN_SEEDS = 2  # paired seeds a cell needs to take part (one seed has nothing to resample)
RESAMPLES = 2_000
BOOTSTRAP_SEED = 0
LEVELS = (2.5, 97.5)  # the bootstrap interval's percentiles

COMPARED, FEW_SEEDS, NO_PAIRS, OTHER_PROTOCOL, NOT_RUN = (
    "compared", "too few seeds", "no paired seeds", "other protocol only", "not run")
AGREE, DISAGREE, NO_EVIDENCE, TOO_FEW, UNDEFINED = (
    "agree", "disagree", "no evidence", "too few methods", "undefined")

MODALITY_NOTE = ("tasks of different modalities use different pools (image, sensor and text models): the methods "
                 "are the same, the models are not")
DEFINITIONS = {
    "gain": "the method's paired difference over the reference on the same seeds (and partitions), inside the "
            "task's chosen protocol: mean [95% t-interval], n paired seeds (leaderboard compare's pairing)",
    "protocol": "per task, of the protocols the reference ran: the first setting section, then the most other "
                "methods, then the most reference seeds, then by label",
    "tau": f"Kendall's tau-b between the methods' mean gains on two tasks, over the methods compared on both "
           f"with {MIN_SEEDS}+ paired seeds (at least {MIN_METHODS})",
    "interval": f"seed bootstrap: each (method, task) cell's paired differences resampled with replacement, "
                f"{RESAMPLES} times (numpy, seed {BOOTSTRAP_SEED} and the task names), tau's 2.5 and 97.5 "
                "percentiles",
    "reading": "agree: the interval is above 0; disagree: below 0; no evidence: it covers 0",
    "modalities": MODALITY_NOTE,
}


@dataclass
class TaskProtocol:
    """The protocol a task is read in, and its reference group."""

    task: str
    protocol: str
    section: str
    reference: SettingGroup
    pools: list[str]
    left_out: int  # the task's other protocols where the reference ran

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "protocol": self.protocol, "section": self.section, "pools": self.pools,
                "reference_group_id": self.reference.group_id, "reference_seeds": len(self.reference.ok),
                "other_protocols_with_reference": self.left_out}


@dataclass
class Cell:
    """One method on one task: its gain over the reference, or why it has none."""

    method: str
    task: str
    status: str
    comparison: Optional[Comparison] = None

    @property
    def differences(self) -> list[float]:
        p = self.comparison.pairing if self.comparison else None
        return [a - b for a, b in zip(p.a, p.b)] if p else []

    @property
    def mean(self) -> Optional[float]:
        d = self.differences
        return statistics.fmean(d) if d else None

    def label(self, nd: int = 2) -> str:
        if self.status in (COMPARED, FEW_SEEDS):
            c = self.comparison
            text = f"{c.interval_label(nd)} n={c.n}" if c.low is not None else c.interval_label(nd)
            return text + (" (not in tau)" if self.status == FEW_SEEDS else "")
        return self.status

    def as_dict(self) -> dict[str, Any]:
        c = self.comparison
        return {"method": self.method, "task": self.task, "status": self.status,
                "n": c.n if c else 0, "mean_difference": c.mean if c else None,
                "ci95": None if c is None or c.low is None else [c.low, c.high],
                "seeds": c.pairing.seeds if c else [], "group_id": c.a.group.group_id if c else None,
                "version": c.a.group.method_version if c else None}


@dataclass
class Agreement:
    """Two tasks' rankings of the gains: tau-b, its bootstrap interval and the reading."""

    a: str
    b: str
    methods: list[str]
    tau: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    undefined_resamples: int = 0
    pools_differ: bool = False

    @property
    def verdict(self) -> str:
        if len(self.methods) < MIN_METHODS:
            return TOO_FEW
        if self.tau is None or self.low is None:
            return UNDEFINED
        return AGREE if self.low > 0 else DISAGREE if self.high < 0 else NO_EVIDENCE

    def interval_label(self) -> str:
        return f"tau = {self.tau:.2f} [{self.low:.2f}, {self.high:.2f}]"

    @property
    def sentence(self) -> str:
        v = self.verdict
        if v == TOO_FEW:
            return f"too few methods ({len(self.methods)} compared on both; at least {MIN_METHODS})"
        if v == UNDEFINED:
            return "no tau: every method's mean gain is the same on one of the tasks"
        if v == AGREE:
            return f"rankings agree ({self.interval_label()})"
        if v == DISAGREE:
            return f"rankings disagree ({self.interval_label()})"
        return f"no evidence of agreement (interval covers 0: {self.interval_label()})"

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": [self.a, self.b], "methods": self.methods, "n_methods": len(self.methods),
                "tau": self.tau, "ci95": None if self.low is None else [self.low, self.high],
                "resamples": RESAMPLES, "undefined_resamples": self.undefined_resamples,
                "pools_differ": self.pools_differ, "verdict": self.verdict, "sentence": self.sentence}


@dataclass
class Transfer:
    """The whole reading: the tasks' protocols, the methods' cells and each pair of tasks."""

    reference: str
    tasks: list[TaskProtocol]
    methods: list[str]  # with a gain on at least one task, by name
    cells: dict[tuple[str, str], Cell]  # (method, task)
    agreements: list[Agreement] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # methods with a group but no gain on any task

    @property
    def summary(self) -> Optional[str]:
        """One sentence where fewer than two tasks have a gain to rank (None otherwise)."""
        ranked = [t.task for t in self.tasks if any(self.cells[(m, t.task)].status == COMPARED
                                                     for m in self.methods)]
        if len(ranked) >= 2:
            return None
        which = f" ({ranked[0]})" if ranked else ""
        return (f"{len(ranked)} task{'' if len(ranked) == 1 else 's'}{which} with methods compared against "
                f"{self.reference}: comparing rankings across tasks needs two")

    def as_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "figure": "headline", "definitions": DEFINITIONS,
                "tasks": [t.as_dict() for t in self.tasks], "methods": self.methods,
                "cells": [self.cells[(m, t.task)].as_dict() for m in sorted(self.methods + self.not_compared)
                          for t in self.tasks],
                "pairs": [a.as_dict() for a in self.agreements], "not_compared": self.not_compared,
                "summary": self.summary}


# ----------------------------------------------------------------------------- the gains


def choose_protocol(members_by_protocol: dict[tuple, list[SettingGroup]], reference: str) -> Optional[tuple]:
    """The protocol a task is read in (module doc), among those where ``reference`` ran."""
    def key(item: tuple[tuple, list[SettingGroup]]) -> tuple:
        protocol, members = item
        ref = best_group(members, reference)
        return (members[0].section_key(), -len({g.method for g in members} - {reference}), -len(ref.ok),
                labels[protocol])

    labels = protocol_labels([g for ms in members_by_protocol.values() for g in ms])
    candidates = [(p, ms) for p, ms in members_by_protocol.items() if any(g.method == reference for g in ms)]
    return min(candidates, key=key)[0] if candidates else None


def gains(groups: list[SettingGroup], reference: str = REFERENCE) -> Transfer:
    """Every method's gain over ``reference`` on every task where ``reference`` ran (module doc),
    without the agreements (``transfer`` adds them)."""
    labels = protocol_labels(groups)
    tasks: list[TaskProtocol] = []
    cells: dict[tuple[str, str], Cell] = {}
    all_methods = sorted({g.method for g in groups} - {reference})
    for task in sorted({g.task for g in groups}):
        protocols = by_protocol(g for g in groups if g.task == task)
        chosen = choose_protocol(protocols, reference)
        if chosen is None:
            continue
        members = protocols[chosen]
        ref = best_group(members, reference)
        with_ref = sum(any(g.method == reference for g in ms) for ms in protocols.values())
        tasks.append(TaskProtocol(task, labels[chosen], ref.section, ref, sorted({g.pool for g in members}),
                                  with_ref - 1))
        on_task = {g.method for ms in protocols.values() for g in ms}
        for m in all_methods:
            g = default_group(members, m) or best_group(members, m)
            if g is None:
                cells[(m, task)] = Cell(m, task, OTHER_PROTOCOL if m in on_task else NOT_RUN)
                continue
            c = compare(Side(g), Side(ref))
            status = COMPARED if c.n >= MIN_SEEDS else FEW_SEEDS if c.n else NO_PAIRS
            cells[(m, task)] = Cell(m, task, status, c)
    methods = [m for m in all_methods if any(cells[(m, t.task)].status == COMPARED for t in tasks)]
    return Transfer(reference, tasks, methods, cells, not_compared=[m for m in all_methods if m not in methods])


# ----------------------------------------------------------------------------- the agreement


def tau_b(x: Iterable[float], y: Iterable[float]) -> Optional[float]:
    """Kendall's tau-b of two paired lists (``scipy.stats.kendalltau``); None where it is undefined
    (every value of one list equal)."""
    from scipy.stats import kendalltau

    tau = float(kendalltau(list(x), list(y)).statistic)
    return None if math.isnan(tau) else tau


def batch_tau_b(x, y):
    """Tau-b of each row of ``x`` against the same row of ``y`` (arrays of shape (resamples, methods)):
    (concordant - discordant) / sqrt((pairs - pairs tied in x) (pairs - pairs tied in y)), as
    ``scipy.stats.kendalltau`` computes it row by row (a test checks), NaN where a row is all ties."""
    import numpy as np

    i, j = np.triu_indices(x.shape[1], k=1)
    sx, sy = np.sign(x[:, j] - x[:, i]), np.sign(y[:, j] - y[:, i])
    pairs = len(i)
    denominator = np.sqrt((pairs - (sx == 0).sum(axis=1)) * (pairs - (sy == 0).sum(axis=1)).astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (sx * sy).sum(axis=1) / denominator, np.nan)


def bootstrap_means(rng, differences: list[float], resamples: int = RESAMPLES):
    """The means of ``resamples`` resamples of ``differences`` (with replacement, as many as it has)."""
    import numpy as np

    d = np.asarray(differences, dtype=float)
    return d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)


def agreement(t: Transfer, a: TaskProtocol, b: TaskProtocol, resamples: int = RESAMPLES) -> Agreement:
    """Tasks ``a`` and ``b``'s agreement (module doc)."""
    import numpy as np

    methods = [m for m in t.methods if t.cells[(m, a.task)].status == COMPARED
               and t.cells[(m, b.task)].status == COMPARED]
    out = Agreement(a.task, b.task, methods, pools_differ=set(a.pools) != set(b.pools))
    if len(methods) < MIN_METHODS:
        return out
    xa = [t.cells[(m, a.task)] for m in methods]
    xb = [t.cells[(m, b.task)] for m in methods]
    tau = tau_b([c.mean for c in xa], [c.mean for c in xb])
    if tau is None:
        return out
    out.tau = round(tau, 4)
    # seeded by the two names, so a pair's interval does not depend on which other tasks were read
    rng = np.random.default_rng([BOOTSTRAP_SEED, zlib.crc32(a.task.encode()), zlib.crc32(b.task.encode())])
    ma = np.stack([bootstrap_means(rng, c.differences, resamples) for c in xa], axis=1)
    mb = np.stack([bootstrap_means(rng, c.differences, resamples) for c in xb], axis=1)
    taus = batch_tau_b(ma, mb)
    defined = taus[~np.isnan(taus)]
    out.undefined_resamples = int(len(taus) - len(defined))
    if len(defined):
        low, high = np.percentile(defined, LEVELS)
        out.low, out.high = round(float(low), 4), round(float(high), 4)
    return out


def transfer(groups: list[SettingGroup], reference: str = REFERENCE, resamples: int = RESAMPLES) -> Transfer:
    """The gains (``gains``) and the agreement of every pair of tasks, in the tasks' order."""
    t = gains(groups, reference)
    t.agreements = [agreement(t, a, b, resamples) for i, a in enumerate(t.tasks) for b in t.tasks[i + 1:]]
    return t


# ----------------------------------------------------------------------------- text


TASK_COLUMNS = ("task", "protocol", "setting section", "pools", "reference seeds", "other protocols")
PAIR_COLUMNS = ("task A", "task B", "methods", "pools", "reading")
CD_POINTER = ("the critical-difference diagram over tasks' protocols: hfl-bench plot cd RECORDS... (one per setting "
              "section)")


def task_rows(t: Transfer) -> list[dict[str, str]]:
    return [{"task": p.task, "protocol": p.protocol, "setting section": p.section, "pools": ", ".join(p.pools),
             "reference seeds": str(len(p.reference.ok)), "other protocols": str(p.left_out)} for p in t.tasks]


def gain_columns(t: Transfer) -> tuple[str, ...]:
    return ("method", *(p.task for p in t.tasks))


def gain_rows(t: Transfer, nd: int = 2) -> list[dict[str, str]]:
    return [{"method": m, **{p.task: t.cells[(m, p.task)].label(nd) for p in t.tasks}} for m in t.methods]


def pair_rows(t: Transfer) -> list[dict[str, str]]:
    return [{"task A": a.a, "task B": a.b, "methods": str(len(a.methods)),
             "pools": "different" if a.pools_differ else "same", "reading": a.sentence} for a in t.agreements]


def notes(t: Transfer) -> list[str]:
    """The lines under the tables: what the figures are and what they cannot say."""
    out = [f"gain: each method's paired difference - {t.reference} (headline global accuracy) on the same seeds "
           f"inside each task's protocol above, mean [95% t-interval] and n paired seeds; "
           f"'{OTHER_PROTOCOL}': the method ran on the task, but not in that protocol",
           f"tau: Kendall's tau-b of the mean gains over the methods compared on both tasks (at least {MIN_METHODS}, "
           f"{MIN_SEEDS}+ seeds each) [95% seed bootstrap, {RESAMPLES} resamples, fixed seed]; the reading "
           "follows the interval only",
           MODALITY_NOTE]
    if t.not_compared:
        out.append(f"no gain on any task (ran only in other protocols or setting sections than {t.reference}'s "
                   f"chosen ones): {', '.join(t.not_compared)}")
    undefined = [a for a in t.agreements if a.undefined_resamples]
    out += [f"{a.a} / {a.b}: {a.undefined_resamples} of {RESAMPLES} resamples had no tau (every mean equal on a "
            "task) and were left out" for a in undefined]
    out.append(CD_POINTER)
    return out
