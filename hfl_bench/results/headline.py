"""A record's headline figure: the one function every view reads (run summary, ``leaderboard show``
in every format, the rank, the HTML site, the plots, paired comparisons), so no two views disagree.

**The rule, chosen by measurement** (docs/studies/headline.md, ``benchmarks/headline_study.py``): the
headline is the **final** figure, the mean over the last evaluated rounds (``records.FINAL_ROUNDS``,
10; ``metrics.final``, schema 1.2 on) of the headline's clients (``setting.headline_of``: the honest
clients under faults, the recipients of a multimodal run, else all clients). On the committed
records it moved about a quarter as much as the selected round's figure between two hosts, and its
paired-seed sd between methods is smaller. The papers' rule, the figure at the round of the best
mean validation accuracy, stays a reported figure (``SELECTED``: the ``selected`` columns); a
published figure is compared with it (``published``), since that is the statistic the papers use.

A record without that final figure (schema 1.0 and 1.1; a run with faults or a multimodal run
before schema 1.5, which has only all clients' final figures) falls back to its selected-round
figure, and ``headline_basis`` says so: every view marks a group whose headline is not (only) the
final figure (``group_basis``: ``selected`` or ``mixed``).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from hfl_bench.results.setting import SettingGroup, Stat, figure, final_figure

FINAL, SELECTED, MIXED = "final", "selected", "mixed"
HEADLINE_STATISTIC = FINAL  # what the measurement chose; SELECTED is the fallback
# How the table, markdown and HTML mark a group whose headline fell back (``group_basis`` not FINAL).
FALLBACK_MARK = "*"
FALLBACK_NOTE = (f"{FALLBACK_MARK} no final figure in (some of) these records (schema < 1.2, or a client group's "
                 "before 1.5): the figure at the selected round stands in for the headline")


def headline_basis(record: dict[str, Any], metric: str = "global_acc", clients: str = "headline") -> Optional[str]:
    """Which statistic ``headline_value`` reads for this record: ``final``, ``selected`` (fallback),
    or None when the record has neither."""
    if final_figure(record, metric, clients) is not None:
        return FINAL
    return SELECTED if figure(record, metric, clients) is not None else None


def headline_value(record: dict[str, Any], metric: str = "global_acc", clients: str = "headline") -> Optional[float]:
    """A record's headline figure (module doc): the final figure of the headline's clients (or of
    ``clients``), else the figure at the selected round; None when it has neither."""
    value = final_figure(record, metric, clients)
    return value if value is not None else figure(record, metric, clients)


def headline_stat(group: SettingGroup, metric: str = "global_acc", clients: str = "headline") -> Stat:
    """The headline figure over a group's ok seeds (mean, sample sd)."""
    return Stat.of(headline_value(r.record, metric, clients) for r in group.ok)


def group_basis(group: SettingGroup, metric: str = "global_acc", clients: str = "headline") -> Optional[str]:
    """``final`` when every ok seed's headline is its final figure, ``selected`` when every one fell
    back, ``mixed`` otherwise; None for a group with no figure."""
    return basis_of(headline_basis(r.record, metric, clients) for r in group.ok)


def basis_of(bases: Iterable[Optional[str]]) -> Optional[str]:
    kinds = {b for b in bases if b is not None}
    return None if not kinds else kinds.pop() if len(kinds) == 1 else MIXED


def marked(text: str, basis: Optional[str]) -> str:
    """A figure's cell, with ``FALLBACK_MARK`` when its headline is not (only) the final figure."""
    return text if basis in (None, FINAL) or text == "-" else f"{text}{FALLBACK_MARK}"
