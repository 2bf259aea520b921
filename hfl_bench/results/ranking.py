"""The rank: methods ranked within each protocol (task, partition, clients, active clients,
rounds, local epochs, selection rule, data: fingerprint and class count, and the setting section: transfer data,
single architecture or not, budget class, fault setting, modality setting) that at least two
methods ran, by the mean headline global accuracy of the method's best group there (``headline``:
the final figure; over the honest clients under faults, the recipients of a multimodal run; higher
is better); tied means share the
average of their ranks. A method's score is its mean rank over the protocols it ran in **within
one setting section** (``SettingGroup.section``): the rank is one table per section, and a method
that ran in two sections has a row in each, never one score across them. Versions of a method are
ranked apart (``crad@1.1``, ``crad@unversioned``) when the groups hold more than one; never merged.
A method with a figure in a section but no rival there (DFML, alone in the section of models
trained on peers' data) has no rank; ``unranked_methods`` lists it with its section.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from hfl_bench.results.headline import headline_stat
from hfl_bench.results.loading import selection_mark
from hfl_bench.results.setting import SettingGroup, partition_label


def rank_methods(groups: list[SettingGroup]) -> list[dict[str, Any]]:
    """Mean rank of each method over the protocols that two or more methods ran, one ranking per
    setting section (see module doc): rows ordered by section (``SettingGroup.section_key``), then
    by mean rank; each row names its ``section``."""
    ranks: dict[tuple, list[dict[str, Any]]] = defaultdict(list)  # (section, method) -> its protocols' ranks
    for p in protocol_scores(groups):
        scores = p["scores"]
        if len(scores) < 2:
            continue
        for method, rank in average_ranks(scores).items():
            ranks[(p["section"], method)].append({"protocol": p["protocol"], "task": p["task"], "rank": rank,
                                                  "global_acc": scores[method], "n_methods": len(scores)})
    rows = [{"section": section[1], "method": m, "mean_rank": round(statistics.fmean(r["rank"] for r in rs), 4),
             "n_protocols": len(rs), "ranks": rs, "_order": section[0]} for (section, m), rs in ranks.items()]
    rows.sort(key=lambda r: (r["_order"], r["mean_rank"], -r["n_protocols"], r["method"]))
    return [{k: v for k, v in r.items() if k != "_order"} for r in rows]


def unranked_methods(groups: list[SettingGroup], ranked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The methods with a headline figure in a setting section where no protocol gave them a rival
    (``rank_methods``' ``ranked`` has no row of theirs there), in the sections' order: each one's
    ``section``, ``method`` and ``protocols`` (how many it ran there)."""
    in_rank = {(r["section"], r["method"]) for r in ranked}
    alone: dict[tuple, set] = defaultdict(set)  # (section order, section label, method) -> its protocols
    for p in protocol_scores(groups):
        order, label = p["section"]
        alone.update({(order, label, m): alone[(order, label, m)] | {p["protocol"]} for m in p["scores"]
                      if (label, m) not in in_rank})
    return [{"section": label, "method": m, "n_protocols": len(protocols)}
            for (_, label, m), protocols in sorted(alone.items(), key=lambda kv: (kv[0][0], kv[0][2]))]


def protocol_scores(groups: list[SettingGroup]) -> list[dict[str, Any]]:
    """Each protocol (``SettingGroup.protocol``) with a figure, ordered by label: its ``protocol``
    label, ``task``, ``section`` (order, label) and ``scores``, the mean headline global accuracy
    (``headline``) of each method's best group there (``groups``), versions apart where the groups
    hold several (what the rank and the critical-difference plot rank)."""
    best: dict[tuple, dict[str, float]] = defaultdict(dict)
    best_groups: dict[tuple, dict[str, SettingGroup]] = defaultdict(dict)
    labels: dict[tuple, str] = {}
    sections: dict[tuple, tuple[tuple, str]] = {}  # protocol -> (section order, section label)
    versions: dict[str, set] = defaultdict(set)
    distinct = protocol_labels(groups)
    for g in groups:
        versions[g.method].add(g.method_version)
    for g in groups:
        mean = headline_stat(g).mean
        if mean is None:
            continue
        key = g.protocol()
        labels[key] = distinct[key]
        sections[key] = (g.section_key(), g.section)
        name = rank_name(g, versions)
        if mean > best[key].get(name, float("-inf")):
            best[key][name], best_groups[key][name] = mean, g
    return [{"protocol": labels[key], "task": key[0], "section": sections[key], "scores": scores,
             "groups": best_groups[key]}
            for key, scores in sorted(best.items(), key=lambda kv: labels[kv[0]])]


def rank_name(g: SettingGroup, versions: dict[str, set]) -> str:
    """The name ``g`` is ranked under: its method, with its version where ``versions`` (each
    method's versions among the ranked groups) holds more than one."""
    return g.method if len(versions[g.method]) == 1 else f"{g.method}@{g.method_version or 'unversioned'}"


def average_ranks(scores: dict[str, float]) -> dict[str, float]:
    """Rank 1 = highest score; equal scores (to 4 decimals) share the mean of the ranks they span."""
    order = sorted(scores, key=lambda m: -scores[m])
    out, i = {}, 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and round(scores[order[j + 1]], 4) == round(scores[order[i]], 4):
            j += 1
        for m in order[i:j + 1]:
            out[m] = (i + 1 + j + 1) / 2
        i = j + 1
    return out


def protocol_labels(groups: list[SettingGroup]) -> dict[tuple, str]:
    """Each protocol's label (``protocol_label``), with the data (``SettingGroup.data_label``) appended
    where protocols of one setting section differ only in their data: two image folders under one
    task name are two protocols, and their labels say which is which. (Protocols of two sections
    are told apart by the section each view shows them under.)"""
    by_label: dict[tuple, set] = defaultdict(set)
    for g in groups:
        by_label[(g.section, protocol_label(g))].add(g.protocol())
    out = {}
    for g in groups:
        label = protocol_label(g)
        out[g.protocol()] = f"{label} {g.data_label}" if len(by_label[(g.section, label)]) > 1 else label
    return out


def protocol_label(g: SettingGroup) -> str:
    active = "" if g.clients_per_round in (None, g.n_clients) else f"/{g.clients_per_round}"
    faults = f" faults={g.faults}" if g.has_faults else ""
    modalities = f" {g.modalities}" if g.is_multimodal else ""  # missing=<modality> recipients=<fraction>
    mark = selection_mark(g.selection_rule)  # an old rule (records selected on the honest clients' validation)
    return (f"{g.task} {partition_label(g.partition_scheme, g.partition_params)} N={g.n_clients}{active} "
            f"R={g.rounds}{faults}{modalities}{f' selection={mark}' if mark else ''}")
