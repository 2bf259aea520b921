"""Published figures beside reproduced groups.

A **published** record (source.kind = published) holds one figure from a paper. It sits beside
every group of the same method and task whose setting it does not contradict: partition scheme
and parameters, clients, active clients per round and the hyperparameters the paper pins must
agree where the paper states them; rounds, local epochs and pool may differ, which turns the
shown setting match to approximate. The delta is reproduced mean - published figure (of the same
endpoint and metric). Published figures are never averaged in, and never sit beside a group run
with faults (no paper's figure was measured under this suite's faults), nor beside a multimodal
group (a published setting has no modality setting to match).
"""

from __future__ import annotations

from typing import Any, Optional

from hfl_bench.results.setting import (  # noqa: F401  (Match, Published: re-exported)
    METRICS,
    Match,
    Published,
    SettingGroup,
    Stat,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) < 1e-9
    return a == b


def match(pub: Published, g: SettingGroup) -> Optional[Match]:
    """The published figure beside this group, or None if the setting contradicts it."""
    if pub.method != g.method or pub.task != g.task or g.has_faults or g.is_multimodal:
        return None
    s = pub.setting
    part = s.get("partition") or {}
    if part.get("scheme") is not None and part["scheme"] != g.partition_scheme:
        return None
    if any(not _same(v, g.partition_params.get(k)) for k, v in (part.get("params") or {}).items()):
        return None
    for name, mine in (("n_clients", g.n_clients), ("clients_per_round", g.clients_per_round)):
        if s.get(name) is not None and not _same(s[name], mine):
            return None
    hparams = pub.record["method"].get("hparams") or {}
    if any(k not in g.hparams or not _same(v, g.hparams[k]) for k, v in hparams.items()):
        return None
    if pub.endpoint and pub.endpoint not in g.endpoints():
        return None
    differences = [f"{name}: published {s[name]}, here {mine}"
                   for name, mine in (("rounds", g.rounds), ("local_epochs", g.local_epochs))
                   if s.get(name) is not None and not _same(s[name], mine)]
    if pub.pool is not None and pub.pool != g.pool:
        differences.append(f"pool: published {pub.pool}, here {g.pool}")
    own = pub.citation.get("setting_match", "approximate")
    return Match(pub, "exact" if own == "exact" and not differences else "approximate", differences,
                 g.stat(pub.metric, pub.endpoint))
