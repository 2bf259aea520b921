"""The work a group's runs did, from each record's ``cost.budget`` (schema 1.6): the "steps /
client / round" the views show beside the accuracies.

A record from before schema 1.6 has no budget: its group shows "-". The figure is the mean over
the group's ok seeds of each record's per-client-per-round optimizer steps on private data; where
a method also trains on public or synthetic data the total follows, and the server's own steps per
round where it trains a model (``hfl_bench.metering.Budget``). The readers read records that passed
the record check (``record.check``): a budget has every part, each a finite count.

FLOPs (``cost.flops``, schema 1.9; ``hfl_bench.flops``): the training FLOPs per client per round,
all the clients' kinds of data together, as a figure with its unit (``flops_label``); a record
without them (older than 1.9) reads as not recorded, "-", never 0. Inference FLOPs
(``cost.flops.inference``, 1.10 on): forward-only passes per client per round, the kinds of data
and the server's together, evaluation apart (``inference_label``); a record without them reads
``not recorded``, never 0.

Bytes (``cost.bytes_sent_per_client_per_round``): what each client sent per round, as the
``bytes / client / round`` column shows it (``bytes_sent_per_client_round``; None where a record does
not say).
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional

CLIENT_KINDS = ("private", "public", "synthetic")
INFERENCE_KINDS = (*CLIENT_KINDS, "server")  # a method's forward-only passes; "evaluation" is the engine's
NOT_RECORDED = "not recorded"


def budget_of(record: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The record's ``cost.budget`` when it has one, else None."""
    return (record.get("cost") or {}).get("budget")


def steps_per_client_round(record: dict[str, Any], kind: str) -> Optional[float]:
    """A record's optimizer steps per client per round on ``kind`` data (``server``: the server's
    steps per round); None for a record without a budget."""
    budget = budget_of(record)
    if budget is None:
        return None
    part = budget["server_per_round"] if kind == "server" else budget["per_client_round"][kind]
    return float(part["steps"])


def mean_steps(records: Iterable[dict[str, Any]], kind: str) -> Optional[float]:
    """The mean over ``records`` that have a budget of their steps per client per round on ``kind``."""
    values = [v for v in (steps_per_client_round(r, kind) for r in records) if v is not None]
    return statistics.fmean(values) if values else None


def group_steps(records: list[dict[str, Any]]) -> dict[str, Optional[float]]:
    """Per kind (and ``all``: the clients' kinds summed, ``server``) the seeds' mean steps per client
    per round; every value None for a group without budgets."""
    out = {kind: mean_steps(records, kind) for kind in (*CLIENT_KINDS, "server")}
    client = [out[k] for k in CLIENT_KINDS]
    out["all"] = None if any(v is None for v in client) else sum(client)  # type: ignore[arg-type]
    return out


def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def steps_label(records: list[dict[str, Any]]) -> str:
    """The "steps / client / round" cell: private steps; ``(all T)`` when the clients also train on
    public or synthetic data; ``server S`` when the server trains; "-" without budgets."""
    steps = group_steps(records)
    private, total, server = steps["private"], steps["all"], steps["server"]
    if private is None:
        return "-"
    extra = []
    if total is not None and total - private > 1e-9:
        extra.append(f"all {_fmt(total)}")
    if server:
        extra.append(f"server {_fmt(server)}")
    return _fmt(private) + (f" ({', '.join(extra)})" if extra else "")


def bytes_sent_per_client_round(record: dict[str, Any]) -> Optional[float]:
    """A record's bytes sent per client per round (``cost.bytes_sent_per_client_per_round``); None
    where the record does not say."""
    value = (record.get("cost") or {}).get("bytes_sent_per_client_per_round")
    return None if value is None else float(value)


def mean_bytes_sent(records: Iterable[dict[str, Any]]) -> Optional[float]:
    """The mean over ``records`` that say it of their bytes sent per client per round."""
    values = [v for v in (bytes_sent_per_client_round(r) for r in records) if v is not None]
    return statistics.fmean(values) if values else None


def flops_of(record: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The record's ``cost.flops`` when it has one (schema 1.9), else None: not recorded."""
    return (record.get("cost") or {}).get("flops")


def training_flops_per_client_round(record: dict[str, Any]) -> Optional[float]:
    """A record's training FLOPs per client per round, its clients' kinds of data summed; None for a
    record without FLOPs."""
    section = flops_of(record)
    if section is None:
        return None
    return float(sum(section["training"]["per_client_round"][k] for k in CLIENT_KINDS))


def mean_training_flops(records: Iterable[dict[str, Any]]) -> Optional[float]:
    """The mean over ``records`` that have FLOPs of their training FLOPs per client per round."""
    values = [v for v in (training_flops_per_client_round(r) for r in records) if v is not None]
    return statistics.fmean(values) if values else None


FLOP_UNITS = ((1e15, "PFLOPs"), (1e12, "TFLOPs"), (1e9, "GFLOPs"), (1e6, "MFLOPs"), (1e3, "kFLOPs"))


def human_flops(x: float) -> str:
    """``x`` FLOPs with a unit, three significant digits: the largest unit of which it is at least a
    tenth (0.656 GFLOPs, 12.3 GFLOPs, 1.2 TFLOPs)."""
    for scale, unit in FLOP_UNITS:
        if x >= scale / 10:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} FLOPs"


def flops_label(records: list[dict[str, Any]]) -> str:
    """The "train FLOPs / client / round" cell: the seeds' mean training FLOPs per client per round
    with its unit; "-" where no seed recorded FLOPs."""
    value = mean_training_flops(records)
    return "-" if value is None else human_flops(value)


def inference_flops_per_client_round(record: dict[str, Any], evaluation: bool = False) -> Optional[float]:
    """A record's inference FLOPs per client per round: a method's forward-only passes (its kinds of
    data and the server's summed), or with ``evaluation`` the engine's evaluation; None for a record
    without them (before 1.10's ``cost.flops.inference``)."""
    section = (flops_of(record) or {}).get("inference")
    if section is None:
        return None
    means = section["per_client_round"]
    return float(means["evaluation"]) if evaluation else float(sum(means[k] for k in INFERENCE_KINDS))


def mean_inference_flops(records: Iterable[dict[str, Any]], evaluation: bool = False) -> Optional[float]:
    values = [v for v in (inference_flops_per_client_round(r, evaluation) for r in records) if v is not None]
    return statistics.fmean(values) if values else None


def inference_label(records: list[dict[str, Any]], evaluation: bool = False) -> str:
    """The "inference FLOPs / client / round" cell (``evaluation``: the "eval FLOPs" one): the seeds'
    mean with its unit; ``not recorded`` where no seed has inference FLOPs."""
    value = mean_inference_flops(records, evaluation)
    return NOT_RECORDED if value is None else human_flops(value)
