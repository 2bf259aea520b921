"""The one figure of a record that paired comparisons and rank intervals compare: the headline's
global accuracy, at the selected round (``selected``, the papers' rule: ``metrics.global_acc``)
or the mean over the last evaluated rounds (``final``: ``metrics.final.global_acc``), over the
headline's clients (``setting.headline_of``: the honest clients under faults, the recipients of a
multimodal run, all clients otherwise), of the model or of a named extra endpoint.

``HEADLINE`` is the headline's statistic (``headline.HEADLINE_STATISTIC``, chosen by
measurement: the final figure); every comparison that is not given a figure reads it. A
comparison reads exactly the figure asked for: a record without it (no final figure before schema
1.2) leaves its pair out, counted, rather than mixing two statistics in one difference.
"""

from __future__ import annotations

from typing import Any, Optional

from hfl_bench.results.headline import HEADLINE_STATISTIC
from hfl_bench.results.setting import endpoint_figure, figure, final_endpoint_figure, final_figure

FIGURES = ("selected", "final")
HEADLINE = HEADLINE_STATISTIC  # which of FIGURES the headline is


class FigureError(ValueError):
    """A figure that cannot be read as asked (an unknown name)."""


def check_figure(name: Optional[str], endpoint: Optional[str] = None) -> str:
    """``name`` (the headline's statistic when None, for the model and for an extra endpoint alike:
    an endpoint's final figure is in records from schema 1.7 on), checked: one of ``FIGURES``."""
    name = HEADLINE if name is None else name
    if name not in FIGURES:
        raise FigureError(f"unknown figure {name!r}; choose one of: {', '.join(FIGURES)}")
    return name


def headline_value(record: dict[str, Any], which: Optional[str] = None,
                   endpoint: Optional[str] = None) -> Optional[float]:
    """The record's headline global accuracy (``which``: ``selected`` or ``final``, the headline's
    by default), of the model or of ``endpoint``; None where the record has no such figure (an
    endpoint's final figure in a record written before schema 1.7)."""
    which = check_figure(which, endpoint)
    if endpoint:
        if which == "final":
            return final_endpoint_figure(record, endpoint, "global_acc")
        return endpoint_figure(record, endpoint, "global_acc")
    if which == "final":
        return final_figure(record, "global_acc")
    return figure(record, "global_acc")
