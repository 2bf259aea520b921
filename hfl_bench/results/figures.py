"""The one figure of a record that paired comparisons and rank intervals compare: the headline's
global accuracy, at the selected round (``selected``, the papers' rule: ``metrics.global_acc``)
or the mean over the last evaluated rounds (``final``: ``metrics.final.global_acc``), over the
headline's clients (``figures.headline_of``: the honest clients under faults, the recipients of a
multimodal run, all clients otherwise), of the model or of a named extra endpoint.

``HEADLINE`` is the headline's statistic (``HEADLINE_STATISTIC``, chosen by
measurement: the final figure); every comparison that is not given a figure reads it. A
comparison reads exactly the figure asked for: a record without it (no final figure before schema
1.2) leaves its pair out, counted, rather than mixing two statistics in one difference.

Every getter of a figure from one record lives here (whose clients the headline is, the
selected-round and final figures of the model and of each extra endpoint, the headline with its
fallback and the exact statistic a comparison reads), so no two views read a record two ways;
``headline`` holds the group-level statistics built on them.
"""

from __future__ import annotations

from typing import Any, Optional

FINAL, SELECTED, MIXED = "final", "selected", "mixed"
HEADLINE_STATISTIC = FINAL  # what the measurement chose (``headline``); SELECTED is the fallback
FIGURES = (SELECTED, FINAL)
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


def statistic_value(record: dict[str, Any], which: Optional[str] = None,
                    endpoint: Optional[str] = None) -> Optional[float]:
    """The record's headline clients' global accuracy as exactly the statistic ``which`` (``selected``
    or ``final``, the headline's by default; no fallback, unlike ``headline_value``), of the model or
    of ``endpoint``; None where the record has no such figure (an endpoint's final figure in a record
    written before schema 1.7)."""
    which = check_figure(which, endpoint)
    if endpoint:
        if which == "final":
            return final_endpoint_figure(record, endpoint, "global_acc")
        return endpoint_figure(record, endpoint, "global_acc")
    if which == "final":
        return final_figure(record, "global_acc")
    return figure(record, "global_acc")


def has_recipients(record: dict[str, Any]) -> bool:
    """A multimodal record with at least one recipient (a client that misses a modality)."""
    section = record.get("modalities")
    return isinstance(section, dict) and bool(section.get("recipients"))


def headline_of(record: dict[str, Any]) -> str:
    """Whose figure a record's headline is (module doc): honest, recipients or all."""
    if isinstance(record.get("faults"), dict):
        return "honest"
    return "recipients" if has_recipients(record) else "all"


def clients_metrics(record: dict[str, Any], clients: str = "headline") -> dict[str, Any]:
    """A record's metrics over all clients (``metrics``) or one client group's block
    (``metrics.honest`` ...), the headline's by default; {} where the record has no such block."""
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    if clients == "headline":
        clients = headline_of(record)
    if clients != "all":
        metrics = metrics.get(clients) if isinstance(metrics.get(clients), dict) else {}
    return metrics


def figure(record: dict[str, Any], metric: str, clients: str = "headline") -> Optional[float]:
    """One selected-round figure of a record: over all clients, the honest or the faulty ones, the
    recipients or the donors, or the headline (``headline_of``; module doc)."""
    return clients_metrics(record, clients).get(metric)


def final_figure(record: dict[str, Any], metric: str, clients: str = "headline") -> Optional[float]:
    """One final figure (mean over the last evaluated rounds) of a record, over the same clients
    as ``figure``; None where the record has none (a group's final figures came with schema 1.5)."""
    final = clients_metrics(record, clients).get("final")
    return final.get(metric) if isinstance(final, dict) else None


def endpoint_figure(record: dict[str, Any], endpoint: str, metric: str, clients: str = "headline") -> Optional[float]:
    """One selected-round figure of a named extra endpoint: over all clients
    (``metrics.extra_endpoints``), the recipients or the donors (``metrics.<who>.endpoints``), or
    the headline (the recipients' for a multimodal record with recipients; all clients' otherwise,
    faults or not: a record has no honest clients' endpoint figures). None where the record has no
    such figure."""
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    if clients == "headline":
        clients = "recipients" if has_recipients(record) else "all"
    if clients == "all":
        block = metrics.get("extra_endpoints")
    else:
        who = metrics.get(clients)
        block = who.get("endpoints") if isinstance(who, dict) else None
    figures = block.get(endpoint) if isinstance(block, dict) else None
    return figures.get(metric) if isinstance(figures, dict) else None


def final_endpoint_figure(record: dict[str, Any], endpoint: str, metric: str,
                          clients: str = "headline") -> Optional[float]:
    """One final figure (mean over the final window, schema 1.7) of a named extra endpoint, over the
    clients ``endpoint_figure`` reads (the recipients of a multimodal record with recipients, all
    clients otherwise: ``metrics.final.endpoints`` / ``metrics.<who>.final.endpoints``); None where
    the record has none (written before 1.7)."""
    if clients == "headline":
        clients = "recipients" if has_recipients(record) else "all"
    final = clients_metrics(record, clients).get("final")
    block = final.get("endpoints") if isinstance(final, dict) else None
    figures = block.get(endpoint) if isinstance(block, dict) else None
    return figures.get(metric) if isinstance(figures, dict) else None


def _figures(record: dict[str, Any], metric: str, clients: str,
             endpoint: Optional[str]) -> tuple[Optional[float], Optional[float]]:
    """A record's final and selected-round figure, of the model or of a named extra endpoint."""
    if endpoint:
        return (final_endpoint_figure(record, endpoint, metric, clients),
                endpoint_figure(record, endpoint, metric, clients))
    return final_figure(record, metric, clients), figure(record, metric, clients)


def headline_basis(record: dict[str, Any], metric: str = "global_acc", clients: str = "headline",
                   endpoint: Optional[str] = None) -> Optional[str]:
    """Which statistic ``headline_value`` reads for this record: ``final``, ``selected`` (fallback),
    or None when the record has neither."""
    final, selected = _figures(record, metric, clients, endpoint)
    return FINAL if final is not None else SELECTED if selected is not None else None


def headline_value(record: dict[str, Any], metric: str = "global_acc", clients: str = "headline",
                   endpoint: Optional[str] = None) -> Optional[float]:
    """A record's headline figure (module doc): the final figure of the headline's clients (or of
    ``clients``), of the model or of an extra ``endpoint``, else the figure at the selected round;
    None when it has neither."""
    final, selected = _figures(record, metric, clients, endpoint)
    return final if final is not None else selected
