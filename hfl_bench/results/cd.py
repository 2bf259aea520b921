"""The critical-difference diagram (Demsar, JMLR 2006): methods compared across blocks.

A **block** is one protocol of one setting section (``SettingGroup.protocol``: task, partition,
clients, rounds, data ...), the unit the rank ranks within; a method's score in a block is the mean
headline global accuracy of its best group there (``ranking.protocol_scores``, ``headline``). Only
methods run in every block of the section take part (a Friedman test needs complete blocks); the
others are named as left out. Per section:

- the average rank of each method over the blocks (rank 1 = highest score, ties share the mean rank);
- the Friedman test over the blocks (``scipy.stats.friedmanchisquare``: chi-square statistic and p);
- the Nemenyi post-hoc test (``scikit_posthocs.posthoc_nemenyi_friedman``): a p-value per pair;
- the critical difference CD = q_alpha * sqrt(k (k + 1) / (6 N)) at alpha = 0.05 (k methods, N
  blocks; q_alpha the studentized range quantile over sqrt 2, Demsar's Table 5).

The diagram is ``scikit_posthocs.critical_difference_diagram``: methods on the average-rank axis,
those the Nemenyi test cannot tell apart joined by a bar. It needs at least 2 blocks and 3 methods.
scikit-posthocs is an optional dependency (the ``stats`` extra), imported only when drawing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hfl_bench.results.ranking import average_ranks, protocol_scores
from hfl_bench.results.setting import SettingGroup

ALPHA = 0.05
MIN_BLOCKS, MIN_METHODS = 2, 3


@dataclass
class CDTable:
    """One setting section's complete blocks: ``scores[b][m]`` is method ``methods[m]``'s score in
    block ``blocks[b]``."""

    section: str
    order: tuple
    methods: list[str]
    blocks: list[str]
    scores: list[list[float]]
    left_out: list[str] = field(default_factory=list)  # methods missing from some block
    members: list[SettingGroup] = field(default_factory=list)  # the groups scored (each method's best per block)

    @property
    def drawable(self) -> bool:
        return len(self.blocks) >= MIN_BLOCKS and len(self.methods) >= MIN_METHODS

    def shape(self) -> str:
        return f"{len(self.blocks)} block(s), {len(self.methods)} method(s) run in all of them"


def cd_tables(groups: list[SettingGroup]) -> list[CDTable]:
    """Per setting section (in the sections' order), the blocks and the methods run in all of them."""
    by_section: dict[tuple, list[dict[str, Any]]] = {}
    for p in protocol_scores(groups):
        by_section.setdefault(p["section"], []).append(p)
    tables = []
    for (order, label), protocols in sorted(by_section.items(), key=lambda kv: kv[0][0]):
        every = set.intersection(*(set(p["scores"]) for p in protocols))
        methods = sorted(every)
        left_out = sorted(set().union(*(set(p["scores"]) for p in protocols)) - every)
        tables.append(CDTable(label, order, methods, [p["protocol"] for p in protocols],
                              [[p["scores"][m] for m in methods] for p in protocols], left_out,
                              [p["groups"][m] for p in protocols for m in methods]))
    return tables


def critical_difference(k: int, n: int, alpha: float = ALPHA) -> float:
    """Nemenyi's critical difference of average ranks for k methods over n blocks (Demsar 2006)."""
    from scipy.stats import studentized_range

    q = studentized_range.ppf(1 - alpha, k, math.inf) / math.sqrt(2)
    return float(q * math.sqrt(k * (k + 1) / (6 * n)))


def cd_statistics(table: CDTable) -> dict[str, Any]:
    """Average ranks, the Friedman test, the Nemenyi p-values and the critical difference."""
    import numpy as np
    import scikit_posthocs
    from scipy.stats import friedmanchisquare

    ranks = [average_ranks(dict(zip(table.methods, row))) for row in table.scores]
    mean_ranks = {m: round(sum(r[m] for r in ranks) / len(ranks), 4) for m in table.methods}
    columns = np.asarray(table.scores, dtype=float).T
    friedman = friedmanchisquare(*columns)
    nemenyi = scikit_posthocs.posthoc_nemenyi_friedman(np.asarray(table.scores, dtype=float))
    pairs = {a: {b: round(float(nemenyi.iloc[i, j]), 6) for j, b in enumerate(table.methods)}
             for i, a in enumerate(table.methods)}
    return {"alpha": ALPHA, "average_ranks": mean_ranks,
            "friedman": {"statistic": round(float(friedman.statistic), 6), "p": float(friedman.pvalue),
                         "df": len(table.methods) - 1},
            "nemenyi_p": pairs, "critical_difference": round(critical_difference(len(table.methods),
                                                                                len(table.blocks)), 4)}


def draw_cd(fig, table: CDTable, stats: dict[str, Any]) -> None:
    """The diagram on ``fig`` (scikit-posthocs' drawing, on an Agg figure: no pyplot state)."""
    import pandas as pd
    import scikit_posthocs

    from hfl_bench.results.text import mpl_text

    # room on both sides: the diagram's labels are drawn outside the axes
    ax = fig.add_axes((0.2, 0.05, 0.6, 0.62))
    names = {m: mpl_text(m) for m in table.methods}
    ranks = pd.Series({names[m]: r for m, r in stats["average_ranks"].items()})
    sig = pd.DataFrame([[stats["nemenyi_p"][a][b] for b in table.methods] for a in table.methods],
                       index=[names[m] for m in table.methods], columns=[names[m] for m in table.methods])
    scikit_posthocs.critical_difference_diagram(ranks, sig, alpha=ALPHA, ax=ax)
    f = stats["friedman"]
    ax.set_title(mpl_text(f"average rank over {len(table.blocks)} blocks (1 = best); Friedman chi2 = "
                          f"{f['statistic']:.2f}, p = {f['p']:.3g}\nNemenyi CD = {stats['critical_difference']:.2f} "
                          f"(alpha {ALPHA}): a bar joins methods the test does not tell apart", one_line=False),
                 fontsize=8)
