"""A record's headline figure: the one function every view reads (run summary, ``leaderboard show``
in every format, the rank, the HTML site, the plots, paired comparisons), so no two views disagree.

**The rule, chosen by measurement** (docs/studies/headline.md, ``benchmarks/headline_study.py``): the
headline is the **final** figure, the mean over the last evaluated rounds (``records.FINAL_ROUNDS``,
10; ``metrics.final``, schema 1.2 on) of the headline's clients (``figures.headline_of``: the honest
clients under faults, the recipients of a multimodal run, else all clients). On the committed
records it moved about a quarter as much as the selected round's figure between two hosts, and its
paired-seed sd between methods is smaller. The papers' rule, the figure at the round of the best
mean validation accuracy, stays a reported figure (``SELECTED``: the ``selected`` columns); a
published figure is compared with it (``published``), since that is the statistic the papers use.

The same rule holds for each extra endpoint a method reports (a shared model, an ensemble, Joint,
a meme): its final figure (``metrics.final.endpoints``, schema 1.7 on), else its selected round's.

A record without that final figure (schema 1.0 and 1.1; a run with faults or a multimodal run
before schema 1.5, which has only all clients' final figures; an endpoint before 1.7) falls back to its selected-round
figure, and ``headline_basis`` says so: every view marks a group whose headline is not (only) the
final figure (``group_basis``: ``selected`` or ``mixed``).
"""

from __future__ import annotations

from typing import Iterable, Optional

from hfl_bench.results.figures import FINAL, MIXED, headline_basis, headline_value
from hfl_bench.results.setting import SettingGroup, Stat

# How the table, markdown and HTML mark a group whose headline fell back (``group_basis`` not FINAL).
FALLBACK_MARK = "*"
FALLBACK_NOTE = (f"{FALLBACK_MARK} no final figure in (some of) these records (written by an older hfl-bench; "
                 "docs: Older records): the figure at the selected round stands in for the headline")


def headline_stat(group: SettingGroup, metric: str = "global_acc", clients: str = "headline",
                  endpoint: Optional[str] = None) -> Stat:
    """The headline figure over a group's ok seeds (mean, sample sd)."""
    return Stat.of(headline_value(r.record, metric, clients, endpoint) for r in group.ok)


def group_basis(group: SettingGroup, metric: str = "global_acc", clients: str = "headline",
                endpoint: Optional[str] = None) -> Optional[str]:
    """``final`` when every ok seed's headline is its final figure, ``selected`` when every one fell
    back, ``mixed`` otherwise; None for a group with no figure."""
    return basis_of(headline_basis(r.record, metric, clients, endpoint) for r in group.ok)


def basis_of(bases: Iterable[Optional[str]]) -> Optional[str]:
    kinds = {b for b in bases if b is not None}
    return None if not kinds else kinds.pop() if len(kinds) == 1 else MIXED


def marked(text: str, basis: Optional[str]) -> str:
    """A figure's cell, with ``FALLBACK_MARK`` when its headline is not (only) the final figure."""
    return text if basis in (None, FINAL) or text == "-" else f"{text}{FALLBACK_MARK}"
