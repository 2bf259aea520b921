"""Published figures beside reproduced groups.

A **published** record (source.kind = published) holds one figure from a paper. It sits beside
every group of the same method and task whose setting it does not contradict: partition scheme
and parameters, clients, active clients per round and the hyperparameters the paper pins must
agree where the paper states them; rounds, local epochs and pool may differ, which turns the
shown setting match to approximate. The delta is reproduced mean - published figure (of the same
endpoint and metric). Published figures are never averaged in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hfl_bench.results.setting import METRICS, Group, Stat


@dataclass
class Published:
    """One published figure (one record of source.kind = published)."""

    record: dict[str, Any]

    @property
    def method(self) -> str:
        return self.record["method"]["name"]

    @property
    def task(self) -> str:
        return self.record["task"]["name"]

    @property
    def metric(self) -> str:
        return next((m for m in METRICS if (self.record.get("metrics") or {}).get(m) is not None), "global_acc")

    @property
    def value(self) -> Optional[float]:
        return (self.record.get("metrics") or {}).get(self.metric)

    @property
    def sd(self) -> Optional[float]:
        return (self.record.get("metrics") or {}).get("sd")

    @property
    def n_seeds(self) -> Optional[int]:
        return (self.record.get("metrics") or {}).get("n_seeds")

    @property
    def endpoint(self) -> Optional[str]:
        return (self.record.get("metrics") or {}).get("endpoint")

    @property
    def citation(self) -> dict[str, Any]:
        return self.record["source"].get("citation") or {}

    @property
    def setting(self) -> dict[str, Any]:
        return self.record.get("setting") or {}

    @property
    def pool(self) -> Optional[str]:
        return (self.setting.get("pool") or {}).get("suite_name")

    def as_dict(self) -> dict[str, Any]:
        c = self.citation
        return {
            "record_id": self.record.get("record_id"), "method": self.method, "task": self.task,
            "published_method": self.record["method"].get("published_name"), "metric": self.metric,
            "endpoint": self.endpoint, "value": self.value, "sd": self.sd, "n_seeds": self.n_seeds,
            "citation_key": c.get("key"), "arxiv_or_doi": c.get("arxiv_or_doi"), "locator": c.get("locator"),
            "setting_match": c.get("setting_match"), "deviations": c.get("deviations", []), "setting": self.setting,
        }


@dataclass
class Match:
    """A published figure beside a group: the reproduced figure it compares to and the delta."""

    published: Published
    setting_match: str  # the record's own, downgraded to approximate where the group differs
    differences: list[str]
    reproduced: Stat

    @property
    def delta(self) -> Optional[float]:
        if self.reproduced.mean is None or self.published.value is None:
            return None
        return round(self.reproduced.mean - self.published.value, 4)

    def as_dict(self) -> dict[str, Any]:
        return self.published.as_dict() | {
            "setting_match": self.setting_match, "differences": self.differences,
            "reproduced": self.reproduced.as_dict(), "delta": self.delta,
        }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) < 1e-9
    return a == b


def match(pub: Published, g: Group) -> Optional[Match]:
    """The published figure beside this group, or None if the setting contradicts it."""
    if pub.method != g.method or pub.task != g.task:
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
