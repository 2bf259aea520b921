"""What a group's gain is made of: the seen / unseen-class accuracy of its records (schema 1.6).

A record's ``metrics.seen_unseen`` holds, at the selected round, each client's global test accuracy
on the test samples of the classes it holds in training (seen) and of those it lacks (unseen),
averaged over the clients that have the figure (a client that lacks no class has no unseen
figure), with the final window's means beside them (``final``), each architecture's means
(``per_arch``) and each client's figures; a client group (honest / faulty, recipients / donors)
has its own block (``metrics.<group>.seen_unseen``). These readers take the headline's block by
default (the leaderboard's rule: ``figures.headline_of``). A record from before schema 1.6 has
none: every reader gives None, and the views show "-".
"""

from __future__ import annotations

from typing import Any, Optional

from hfl_bench.results.figures import clients_metrics
from hfl_bench.results.setting import SettingGroup, Stat

SEEN_UNSEEN = ("seen_acc", "unseen_acc")


def block(record: dict[str, Any], clients: str = "headline") -> dict[str, Any]:
    """The record's seen / unseen block over ``clients`` (``figures.clients_metrics``); {} if none."""
    return clients_metrics(record, clients).get("seen_unseen") or {}


def value(record: dict[str, Any], metric: str, clients: str = "headline", final: bool = False) -> Optional[float]:
    """``seen_acc`` or ``unseen_acc`` at the selected round, or over the final window with ``final``."""
    found = block(record, clients)
    if final:
        found = found.get("final") or {}
    x = found.get(metric)
    return None if x is None else float(x)


def stat(g: SettingGroup, metric: str, clients: str = "headline", final: bool = False) -> Stat:
    """One seen / unseen figure over the group's ok seeds (n: the seeds whose records have it)."""
    return Stat.of(value(r.record, metric, clients, final) for r in g.ok)


def arch_value(record: dict[str, Any], arch: str, metric: str) -> Optional[float]:
    """An architecture's mean ``seen_acc`` / ``unseen_acc`` over its clients at the selected round."""
    x = (block(record, "all").get("per_arch") or {}).get(arch, {}).get(metric)
    return None if x is None else float(x)


def as_json(g: SettingGroup, clients: str = "headline") -> dict[str, Any]:
    """A group's seen / unseen figures for ``leaderboard show --format json``: each at the
    selected round and over the final window, mean / sd / n over seeds."""
    return {**{m: stat(g, m, clients).as_dict() for m in SEEN_UNSEEN},
            **{f"final_{m}": stat(g, m, clients, final=True).as_dict() for m in SEEN_UNSEEN}}


def n_clients_unseen(g: SettingGroup, clients: str = "headline") -> str:
    """How many clients lack a class (have an unseen figure), over the seeds: ``3`` or ``2-4``."""
    counts = sorted({n for r in g.ok if isinstance(n := block(r.record, clients).get("n_clients_unseen"), int)})
    if not counts:
        return "-"
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
