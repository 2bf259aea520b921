"""Where a folder's records came from, in one sentence generated from the records (``leaderboard
provenance``; README's results paragraph embeds it, ``docs/regenerate.py``), so no page types a
claim such as "one clean commit, one host" that the records can contradict.

The reproduced records a board reads (``board.board_records``) are split by their provenance: the
code commit (``code.git_sha``, its first seven characters; "an unknown commit" outside a checkout),
whether that tree had uncommitted changes (``code.git_dirty``) and the kind of processor
(``setting.processor``, its CPU or GPU model). Each part names its count and, where it is not every
method, the methods whose records it holds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

from hfl_bench.results.loading import Loaded
from hfl_bench.results.paired import uncommitted
from hfl_bench.results.setting import processor


def _processor_name(record: dict) -> str:
    """The processor's model alone (``cpu Intel(R) Xeon(R) Processor``), without its instruction sets."""
    kind: Optional[str] = processor(record)
    return kind.split(" | ")[0].strip() if kind else "an unnamed processor"


def _tree(record: dict) -> str:
    code = record.get("code") if isinstance(record.get("code"), dict) else {}
    sha = code.get("git_sha")
    commit = f"commit {sha[:7]}" if isinstance(sha, str) and sha else "an unknown commit"
    if code.get("git_dirty") is None:
        return commit
    return f"{commit} with uncommitted changes" if uncommitted(record) else f"{commit}, a clean tree"


def provenance_sentence(records: Iterable[Loaded]) -> str:
    """One sentence (module doc): ``180 records of 18 methods: 170 (...) from commit d5e9c25, a clean
    tree, on cpu Intel(R) Xeon(R) Processor; 10 (fml) from commit 0a77e5d with uncommitted changes,
    on cpu AMD EPYC.``"""
    reproduced = [r for r in records if r.kind == "reproduced"]
    if not reproduced:
        return "No reproduced records."
    parts: dict[tuple[str, str], list[Loaded]] = defaultdict(list)
    for r in reproduced:
        parts[(_tree(r.record), _processor_name(r.record))].append(r)
    methods = sorted({r.method for r in reproduced})
    lines = []
    for (tree, kind), rs in sorted(parts.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        own = sorted({r.method for r in rs})
        who = f"{len(own)} methods" if len(own) > 3 else ", ".join(own)
        whose = "" if len(parts) == 1 else f" ({who})"
        lines.append(f"{len(rs)}{whose} from {tree}, on {kind}")
    head = f"{len(reproduced)} records of {len(methods)} method{'s' if len(methods) != 1 else ''}"
    commits = {(r.record.get("code") or {}).get("git_sha") for r in reproduced}
    dirty = sum(uncommitted(r.record) for r in reproduced)
    hosts = len({k for _, k in parts})
    summary = ", ".join([
        "one clean commit" if len(commits) == 1 and not dirty and None not in commits
        else f"{len(commits)} commit{'s' if len(commits) > 1 else ''}"
        + (f", {dirty} record{'s' if dirty > 1 else ''} from a tree with uncommitted changes" if dirty else ""),
        "one kind of processor" if hosts == 1 else f"{hosts} kinds of processor"])
    return f"{head} ({summary}): " + "; ".join(lines) + "."
