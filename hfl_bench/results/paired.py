"""Paired comparisons: is the difference between two groups of one protocol real?

Two groups are compared only within one protocol (``SettingGroup.protocol``: the same task and
data, partition scheme, clients, rounds, setting section...), and their records are **paired by
seed**: seed s of method A against seed s of method B, and only when both records drew the same
partition (the same ``partition.hash``). A seed only one group ran, or whose two records drew
different partitions or lack the figure, is dropped and counted (``Pairing``), never compared.
Pairs whose records ran on different kinds of processor (``setting.processor``: CPU model and
kernel set, or GPU) are kept but the comparison is marked ``mixed hosts``: two kinds of processor
round differently, which adds noise the pairing does not remove.

For the n paired differences d = A - B (the figure: ``figures.statistic_value``, the headline's
global accuracy, or a named extra endpoint's):

- the mean difference and the two-sided 95% t-interval (``scipy.stats.ttest_rel``; n - 1 degrees
  of freedom);
- the two-sided sign-flip (paired permutation) p-value: under "no difference" each d is as likely
  to have either sign, so p is the share of the 2^n sign patterns whose mean is at least as far
  from zero as the observed one (``scipy.stats.permutation_test``, ``permutation_type="samples"``):
  exact up to n = 20, a Monte Carlo estimate over ``MONTE_CARLO`` seeded patterns beyond (its
  standard error, sqrt(p(1 - p) / 100,000), is at most 0.0016: the output marks such a p ``(MC)``).
  The patterns are evaluated in batches of at most ``BATCH_VALUES`` values, so memory stays bounded
  at any seed count. With three seeds the smallest possible p is 2/8 = 0.25;
- Holm's adjustment of those p-values over the comparisons of one table (one protocol), for the
  family-wise error (``statsmodels.stats.multitest.multipletests``, ``method="holm"``).

**The verdict** (``Comparison.verdict``) follows both: **resolved** when the 95% interval excludes
zero and the Holm-adjusted p is below ``ALPHA`` (5%); **not resolved** otherwise; **n=N cannot
resolve at 5%** where no outcome could (the smallest sign-flip p, 2 / 2^n, is at least 5% up to
n = 5 seeds); **too few pairs** under two. Every paired difference equal (zero variance) is no
exception: the interval has zero width, and the p (at least 2 / 2^n) decides. Rank intervals use
the same verdicts (``rank_intervals``).

The reference group of a method in a protocol (when the method ran there more than once: several
pools, versions or hyperparameters) is its group with the highest mean figure, as the rank takes it.

**Variants of one method** (``variants``): the groups of one method in one protocol that differ in
method parameters (an ablation, a weighting rule) are each compared with the method's group run
with none (its defaults: the reference), paired by seed as above, and labelled by the parameters
that differ from the reference's (``crad [aggregator=crad-stage1]``); a protocol where the method
has no default group has no reference and no table. Named other methods join the table as rows of
their own (their best group, as above). Holm runs over the rows of one table.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from hfl_bench.results.figures import check_figure, statistic_value
from hfl_bench.results.loading import Loaded
from hfl_bench.results.ranking import protocol_labels
from hfl_bench.results.setting import SettingGroup, canonical, processor, section_reasons

CONFIDENCE = 0.95
ALPHA = 0.05  # the level a (Holm-adjusted) p-value must be below for "resolved"
EXACT_UP_TO = 20  # seeds: every sign pattern enumerated up to here (2^20 patterns)
MONTE_CARLO = 100_000  # sign patterns drawn beyond EXACT_UP_TO
MONTE_CARLO_SEED = 0  # so the same records always give the same p-value
BATCH_VALUES = 2 ** 21  # sign-pattern values evaluated at once (16 MiB of float64), any seed count
# The fewest pairs whose smallest sign-flip p (2 / 2^n, every difference of one sign) is below ALPHA:
# 6 (2 / 64 = 0.031); up to 5 no outcome can resolve. The claims page asks as many seeds of a trend's level.
MIN_RESOLVABLE = next(n for n in range(1, EXACT_UP_TO + 1) if 2.0 / 2 ** n < ALPHA)


class ComparisonError(ValueError):
    """A comparison that cannot be made as asked (one line for the CLI)."""


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a group, read at its model's figure or at a named extra endpoint."""

    group: SettingGroup
    endpoint: Optional[str] = None
    with_version: bool = False  # the label names the method version (two versions in one table)
    variant: str = ""  # the method parameters that tell this group from the reference (``params_label``)

    @property
    def label(self) -> str:
        version = f"@{self.group.method_version or 'unversioned'}" if self.with_version else ""
        variant = f" [{self.variant}]" if self.variant else ""
        return self.group.method + version + variant + (f" [{self.endpoint}]" if self.endpoint else "")

    def value(self, record: dict[str, Any], figure: str) -> Optional[float]:
        return statistic_value(record, figure, self.endpoint)

    def seed_value(self, r: Loaded, figure: str) -> Optional[float]:
        """The figure of one of the group's seeds (``fairness.FairnessSide`` reads a per-seed figure of the group)."""
        return self.value(r.record, figure)

    def checked(self, figure: Optional[str], other_endpoint: Optional[str] = None) -> str:
        """The figure's name as this side reads it (``figures.check_figure``)."""
        return check_figure(figure, self.endpoint or other_endpoint)

    def missing(self, r: Loaded, figure: str) -> str:
        """Why seed ``r`` has no figure, as the notes say it (``timing.TimingSide``: not recorded,
        not reached, not available)."""
        return "no figure"


@dataclass
class Pairing:
    """The seeds two groups share, paired, and the seeds left out and why."""

    seeds: list[Any] = field(default_factory=list)
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    only_a: list[Any] = field(default_factory=list)  # seeds only A ran (ok)
    only_b: list[Any] = field(default_factory=list)
    partition_differs: list[Any] = field(default_factory=list)  # same seed, different (or unknown) partition
    no_figure: list[Any] = field(default_factory=list)  # a record of the pair lacks the figure
    no_figure_why: dict[Any, str] = field(default_factory=dict)  # each such seed: why (``Side.missing``)
    processors: list[str] = field(default_factory=list)  # the distinct kinds the paired records ran on
    unknown_processor: bool = False  # a paired record names none
    uncommitted: list[Any] = field(default_factory=list)  # paired seeds with a record from a dirty tree

    @property
    def mixed_hosts(self) -> bool:
        return len(self.processors) > 1

    def as_dict(self) -> dict[str, Any]:
        return {"seeds": self.seeds, "only_a": self.only_a, "only_b": self.only_b,
                "partition_differs": self.partition_differs, "no_figure": self.no_figure,
                "no_figure_why": [{"seed": s, "why": why} for s, why in self.no_figure_why.items()],
                "processors": self.processors, "mixed_hosts": self.mixed_hosts,
                "unknown_processor": self.unknown_processor, "uncommitted": self.uncommitted}


def uncommitted(record: dict[str, Any]) -> bool:
    """Whether the record's run came from a checkout with uncommitted changes (``code.git_dirty``)."""
    code = record.get("code")
    return isinstance(code, dict) and code.get("git_dirty") is True


def pair(a: Side, b: Side, figure: str) -> Pairing:
    """Pair ``a``'s and ``b``'s ok seeds (module doc)."""
    out = Pairing()
    b_by_seed = {r.seed: r for r in b.group.ok}
    a_seeds = {r.seed for r in a.group.ok}
    kinds: set[str] = set()
    for ra in a.group.ok:
        rb = b_by_seed.get(ra.seed)
        if rb is None:
            out.only_a.append(ra.seed)
            continue
        if ra.partition_hash is None or ra.partition_hash != rb.partition_hash:
            out.partition_differs.append(ra.seed)
            continue
        va, vb = a.seed_value(ra, figure), b.seed_value(rb, figure)
        if va is None or vb is None:
            out.no_figure.append(ra.seed)
            out.no_figure_why[ra.seed] = a.missing(ra, figure) if va is None else b.missing(rb, figure)
            continue
        out.seeds.append(ra.seed)
        out.a.append(float(va))
        out.b.append(float(vb))
        if any(uncommitted(r.record) for r in (ra, rb)):
            out.uncommitted.append(ra.seed)
        for r in (ra, rb):
            kind = processor(r.record)
            out.unknown_processor |= kind is None
            kinds |= {kind} if kind else set()
    out.only_b = [r.seed for r in b.group.ok if r.seed not in a_seeds]
    out.processors = sorted(kinds)
    return out


@dataclass
class Comparison:
    """A - B over the paired seeds (module doc); ``p_holm`` is set by ``holm_adjust`` over a table."""

    a: Side
    b: Side
    figure: str
    pairing: Pairing
    mean: Optional[float] = None
    sd: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    p: Optional[float] = None
    p_exact: bool = True
    p_holm: Optional[float] = None

    @property
    def n(self) -> int:
        return len(self.pairing.seeds)

    @property
    def reachable(self) -> bool:
        """Whether the sign-flip test can reach ``ALPHA`` at this seed count at all: its smallest
        p is 2 / 2^n (every difference of one sign), 0.0625 at n = 5; a Monte Carlo estimate
        (n > ``EXACT_UP_TO``) can."""
        return self.n >= MIN_RESOLVABLE

    @property
    def equal_differences(self) -> bool:
        """Every paired difference the same (zero variance): the t-interval has zero width, so only
        the sign-flip p (at least 2 / 2^n) can tell chance from a difference."""
        return self.n >= 2 and self.sd == 0

    @property
    def resolved(self) -> bool:
        """The verdict rule (module doc): the 95% t-interval excludes zero **and** the sign-flip p,
        Holm-adjusted over its table where it was (``holm_adjust``), is below ``ALPHA``."""
        if self.low is None or not (self.low > 0 or self.high < 0):
            return False
        p = self.p_holm if self.p_holm is not None else self.p
        return p is not None and p < ALPHA

    @property
    def verdict(self) -> str:
        if self.low is None:
            return "too few pairs"
        if self.resolved:
            return "resolved"
        if self.p is not None and not self.reachable:
            return f"n={self.n} cannot resolve at {ALPHA:.0%}"
        return "not resolved"

    def interval_label(self, nd: int = 2) -> str:
        """``+5.03 [0.58, 9.48]``, or ``+1.00 (n=1)`` / ``-`` where there is no interval."""
        if self.mean is None:
            return "-"
        if self.low is None:
            return f"{self.mean:+.{nd}f} (n={self.n})"
        return f"{self.mean:+.{nd}f} [{self.low:.{nd}f}, {self.high:.{nd}f}]"

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a.label, "b": self.b.label, "a_method": self.a.group.method,
                "b_method": self.b.group.method, "a_version": self.a.group.method_version,
                "b_version": self.b.group.method_version, "a_group_id": self.a.group.group_id,
                "b_group_id": self.b.group.group_id, "a_endpoint": self.a.endpoint, "b_endpoint": self.b.endpoint,
                "figure": self.figure, "n": self.n, "mean_difference": self.mean, "sd_difference": self.sd,
                "ci95": None if self.low is None else [self.low, self.high], "p_sign_flip": self.p,
                "p_exact": self.p_exact, "p_holm": self.p_holm, "resolved": self.resolved, "verdict": self.verdict,
                "pairing": self.pairing.as_dict()}


def t_interval(d: list[float]) -> Optional[tuple[float, float]]:
    """The two-sided ``CONFIDENCE`` t-interval of the mean of ``d`` (None for fewer than two);
    a zero-width one where every difference is the same."""
    if len(d) < 2:
        return None
    if len(set(d)) == 1:
        return d[0], d[0]
    from scipy.stats import ttest_rel

    ci = ttest_rel(d, [0.0] * len(d)).confidence_interval(CONFIDENCE)
    return float(ci.low), float(ci.high)


def sign_flip_p(d: list[float]) -> tuple[Optional[float], bool]:
    """The two-sided sign-flip p-value of the mean of ``d`` and whether it is exact (module doc);
    (None, True) for no differences."""
    if not d:
        return None, True
    if len(d) == 1:  # both sign patterns are as far from zero as the observed one (scipy needs two)
        return 1.0, True
    import numpy as np
    from scipy.stats import permutation_test

    exact = len(d) <= EXACT_UP_TO
    # ``batch`` bounds the memory: at most BATCH_VALUES sign-pattern values at once, whatever n (scipy
    # would otherwise build every pattern together: 100,000 x n floats beyond the exact limit)
    result = permutation_test((np.asarray(d),), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                              permutation_type="samples", alternative="two-sided",
                              n_resamples=2 ** len(d) if exact else MONTE_CARLO,
                              batch=max(1, BATCH_VALUES // len(d)), rng=np.random.default_rng(MONTE_CARLO_SEED))
    return min(1.0, float(result.pvalue)), exact


def compare(a: Side, b: Side, figure: Optional[str] = None) -> Comparison:
    """A - B paired by seed (module doc)."""
    figure = a.checked(figure, b.endpoint)
    pairing = pair(a, b, figure)
    d = [x - y for x, y in zip(pairing.a, pairing.b)]
    c = Comparison(a, b, figure, pairing)
    if d:
        c.mean = round(statistics.fmean(d), 4)
        c.sd = round(statistics.stdev(d), 4) if len(d) > 1 else None
    if (ci := t_interval(d)) is not None:
        c.low, c.high = round(ci[0], 4), round(ci[1], 4)
    c.p, c.p_exact = sign_flip_p(d)
    return c


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``ps`` (statsmodels' ``multipletests``, ``method="holm"``)."""
    if not ps:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(ps, method="holm")[1]]


def holm_adjust(comparisons: Iterable[Comparison]) -> None:
    """Set ``p_holm`` on each comparison that has a p-value, adjusted over all of them (one family)."""
    with_p = [c for c in comparisons if c.p is not None]
    for c, adjusted in zip(with_p, holm([c.p for c in with_p])):
        c.p_holm = round(adjusted, 6)


# ----------------------------------------------------------------------------- tables


@dataclass
class Table:
    """The comparisons of one protocol against one reference group, Holm-adjusted together."""

    section: str
    protocol: str
    task: str
    reference: Side
    comparisons: list[Comparison]
    notes: list[str] = field(default_factory=list)
    key: tuple = ()  # the protocol (``SettingGroup.protocol``)

    def as_dict(self) -> dict[str, Any]:
        return {"section": self.section, "protocol": self.protocol, "task": self.task,
                "reference": self.reference.label, "reference_group_id": self.reference.group.group_id,
                "notes": self.notes, "comparisons": [c.as_dict() for c in self.comparisons]}


def group_mean(g: SettingGroup, figure: Optional[str] = None, endpoint: Optional[str] = None) -> float:
    """The group's mean figure over its ok seeds (-inf where none has it): what picks a method's
    reference group in a protocol."""
    xs = [v for r in g.ok if (v := statistic_value(r.record, figure, endpoint)) is not None]
    return statistics.fmean(xs) if xs else -math.inf


def by_protocol(groups: Iterable[SettingGroup]) -> dict[tuple, list[SettingGroup]]:
    """The groups of each protocol, in the order given."""
    out: dict[tuple, list[SettingGroup]] = defaultdict(list)
    for g in groups:
        out[g.protocol()].append(g)
    return out


def best_group(groups: Iterable[SettingGroup], method: str, figure: Optional[str] = None,
               endpoint: Optional[str] = None) -> Optional[SettingGroup]:
    """``method``'s group with the highest mean figure among ``groups`` (None where it has none)."""
    mine = [g for g in groups if g.method == method]
    return max(mine, key=lambda g: group_mean(g, figure, endpoint)) if mine else None


def against(groups: list[SettingGroup], reference: str, methods: Iterable[str] = (), figure: Optional[str] = None,
            endpoint: Optional[str] = None, reference_endpoint: Optional[str] = None) -> list[Table]:
    """One table per protocol where ``reference`` ran: each group of ``methods`` (every other
    method when empty) there against ``reference``'s group (its best, module doc), Holm-adjusted
    within the table. ``endpoint`` / ``reference_endpoint``: read that extra endpoint instead of
    the model's figure on the compared groups / the reference."""
    methods = set(methods)
    labels = protocol_labels(groups)
    tables = []
    for key, members in by_protocol(groups).items():
        ref = best_group(members, reference, figure, reference_endpoint)
        if ref is None:
            continue
        versions: dict[str, set] = defaultdict(set)
        count: dict[str, int] = defaultdict(int)
        for g in members:
            versions[g.method].add(g.method_version)
            count[g.method] += 1

        def side(g: SettingGroup, end: Optional[str]) -> Side:
            # a method with several groups here (its variants: other hyperparameters) names each one's
            variant = params_label(g.method_params, {}) if count[g.method] > 1 else ""
            return Side(g, end, len(versions[g.method]) > 1, variant)

        ref_side = side(ref, reference_endpoint)
        compared = [g for g in members if (g.method in methods if methods else g.method != reference)
                    and (g is not ref or endpoint != reference_endpoint)]
        if not compared:
            continue
        notes = []
        if (others := sum(g.method == reference for g in members)) > 1:
            notes.append(f"{reference} ran {others} groups here: the reference is the one with the highest mean")
        rows = [side(g, endpoint) for g in compared]
        tables.append(table(rows, ref_side, figure, labels[key], notes, key))
    return tables


def table(rows: list[Side], reference: Side, figure: Optional[str], protocol: str, notes: list[str],
          key: tuple) -> Table:
    """Each of ``rows`` against ``reference``, Holm-adjusted together: one table of one protocol."""
    comparisons = [compare(side, reference, figure) for side in rows]
    holm_adjust(comparisons)
    g = reference.group
    return Table(g.section, protocol, g.task, reference, comparisons, notes, key)


def param_text(value: Any) -> str:
    """A method parameter's value as a label shows it: text as itself, anything else as JSON."""
    return value if isinstance(value, str) else canonical(value)


def params_label(params: dict[str, Any], reference: dict[str, Any]) -> str:
    """The method parameters of ``params`` that differ from ``reference``'s, sorted by name:
    ``aggregator=crad-stage1``; a parameter only the reference sets reads ``name=default``."""
    absent = object()
    keys = sorted(k for k in set(params) | set(reference) if params.get(k, absent) != reference.get(k, absent))
    return ", ".join(f"{k}={param_text(params[k]) if k in params else 'default'}" for k in keys)


def default_group(groups: Iterable[SettingGroup], method: str, figure: Optional[str] = None,
                  endpoint: Optional[str] = None) -> Optional[SettingGroup]:
    """``method``'s group run with no method parameters (its defaults) among ``groups``; of two
    versions, the one with the highest mean figure (as ``best_group``); None where there is none."""
    return best_group([g for g in groups if not g.method_params], method, figure, endpoint)


def variants(groups: list[SettingGroup], method: str, others: Iterable[str] = (), figure: Optional[str] = None,
             endpoint: Optional[str] = None, reference_endpoint: Optional[str] = None) -> list[Table]:
    """One table per protocol where ``method`` ran with its defaults: each other group of ``method``
    there against that group, labelled by its differing parameters, and the best group of each of
    ``others`` (module doc), Holm-adjusted within the table."""
    labels = protocol_labels(groups)
    tables = []
    for key, members in by_protocol(groups).items():
        ref = default_group(members, method, figure, reference_endpoint)
        if ref is None:
            continue
        mine = [g for g in members if g.method == method]
        with_version = len({g.method_version for g in mine}) > 1
        rows = sorted((Side(g, endpoint, with_version, params_label(g.method_params, ref.method_params))
                       for g in mine if g is not ref), key=lambda s: s.label)
        rows += [Side(b, endpoint) for m in others if m != method
                 and (b := best_group(members, m, figure, endpoint)) is not None]
        if not rows:
            continue
        notes = [f"reference: {method} with its default parameters"]
        tables.append(table(rows, Side(ref, reference_endpoint, with_version), figure, labels[key], notes, key))
    return tables


def why_not_comparable(groups: list[SettingGroup], method: str, reference: str) -> str:
    """Why ``method`` and ``reference`` share no protocol, in one line."""
    tasks_a = {g.task: g for g in groups if g.method == method}
    tasks_b = {g.task: g for g in groups if g.method == reference}
    shared = sorted(set(tasks_a) & set(tasks_b))
    if not shared:
        return f"{method} and {reference} never ran on one task, so no seed can be paired"
    task = shared[0]
    sections_a = {g.section for g in groups if g.method == method and g.task == task}
    sections_b = {g.section for g in groups if g.method == reference and g.task == task}
    if not sections_a & sections_b:
        reasons = sorted({r for label in sections_a | sections_b for r in section_reasons(label)})
        return (f"{method} and {reference} are in different setting sections on {task} "
                f"({'; '.join(sorted(sections_a))} vs {'; '.join(sorted(sections_b))}): "
                "paired comparisons stay within one section" + "".join(f" ({r})" for r in reasons))
    return (f"{method} and {reference} never ran the same protocol on {task} (partition, clients, rounds, "
            "faults or data differ), so no seed can be paired")
