"""Rank intervals: the ranks a method could hold given what its paired comparisons resolve.

In one protocol of k ranked methods (``ranking.rank_methods``: each method's best group there),
every pair of methods is compared paired by seed (``paired.compare`` on the headline figure, with
``compare``'s verdict: the 95% t-interval excludes zero and the sign-flip p is below 5%; so three
seeds resolve no pair). A method's **rank interval** there is

    [1 + (methods resolved better than it), k - (methods resolved worse than it)]

("resolved better": a resolved difference in their favour): the ranks consistent with the resolved
comparisons, where every unresolved pair could go either way. A method that no comparison resolves
spans [1, k]; a fully resolved order gives each method a single rank. Across protocols the interval
of the mean rank is the mean of the lower and of the upper ends. The p-values are not adjusted
for multiplicity: Holm over every pair of 15 methods (105) could resolve none at ten seeds (the
smallest exact p, 2/1024, times 105 is 0.21), so the intervals are a per-pair reading, and a
claim about one pair is `compare`'s, with its table's Holm.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from hfl_bench.results.headline import headline_stat
from hfl_bench.results.paired import Side, by_protocol, compare, group_mean
from hfl_bench.results.ranking import protocol_labels, rank_name
from hfl_bench.results.setting import SettingGroup

DEFINITION = ("the ranks consistent with the resolved paired comparisons (95% t-interval over seeds excluding 0 "
              "and sign-flip p < 0.05, not adjusted over the pairs): [1 + methods resolved better, "
              "k - methods resolved worse], averaged over the protocols")


def protocol_rank_intervals(groups: list[SettingGroup]) -> dict[tuple[str, str], dict[str, tuple[int, int]]]:
    """Per (setting section, protocol label) ranked by two or more methods: each ranked name's
    rank interval (module doc)."""
    versions: dict[str, set] = defaultdict(set)
    for g in groups:
        versions[g.method].add(g.method_version)
    labels = protocol_labels(groups)
    out = {}
    for key, members in by_protocol(groups).items():
        best: dict[str, SettingGroup] = {}
        for g in members:
            if headline_stat(g).mean is None:  # as the rank: a group with no figure is not ranked
                continue
            name = rank_name(g, versions)
            if name not in best or group_mean(g) > group_mean(best[name]):
                best[name] = g
        if len(best) < 2:
            continue
        better = dict.fromkeys(best, 0)  # how many methods are resolved better than each
        worse = dict.fromkeys(best, 0)
        names = sorted(best)
        # compare's verdict on the unadjusted p (module doc: no Holm over the k(k-1)/2 pairs)
        pairs = [(a, b, compare(Side(best[a]), Side(best[b]))) for i, a in enumerate(names) for b in names[i + 1:]]
        for a, b, c in pairs:
            if c.resolved and c.low > 0:
                better[b] += 1
                worse[a] += 1
            elif c.resolved:
                better[a] += 1
                worse[b] += 1
        k = len(best)
        first = next(iter(best.values()))
        out[(first.section, labels[key])] = {m: (1 + better[m], k - worse[m]) for m in best}
    return out


def with_rank_intervals(ranked: list[dict[str, Any]], groups: list[SettingGroup]) -> list[dict[str, Any]]:
    """``ranked`` (``rank_methods(groups)``) with a ``rank_interval`` [best, worst] on each
    protocol's rank and, the means of those, on each row."""
    intervals = protocol_rank_intervals(groups)
    for row in ranked:
        for entry in row["ranks"]:
            entry["rank_interval"] = list(intervals[(row["section"], entry["protocol"])][row["method"]])
        row["rank_interval"] = [round(statistics.fmean(e["rank_interval"][i] for e in row["ranks"]), 4)
                                for i in (0, 1)]
    return ranked
