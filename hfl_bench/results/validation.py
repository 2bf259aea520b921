"""Which records the views read: each one checked (``hfl_bench.record.check``), every invalid one
listed with its first problem, never averaged in or drawn; ``leaderboard validate`` lists every
problem of every file."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from hfl_bench.record.check import problems
from hfl_bench.record.io import loads_strict
from hfl_bench.results.loading import Loaded, Skipped


def file_errors(path: Path) -> list[str]:
    """Each problem of one file, its own version's frozen schema included; [] for a valid record."""
    try:
        raw = loads_strict(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # JSONDecodeError and NaN / Infinity are ValueErrors
        return [f"not readable JSON: {e}"]
    return problems(raw, frozen=True)


def invalid_files(files: Iterable[Path]) -> dict[str, list[str]]:
    """The files with problems, each with its problems."""
    found = {str(f): file_errors(f) for f in files}
    return {f: errs for f, errs in found.items() if errs}


def valid_records(loaded: Iterable[Loaded]) -> tuple[list[Loaded], list[Skipped]]:
    """The records that are valid, and one Skipped (with the first problem) per other one."""
    keep, skipped = [], []
    for r in loaded:
        found = problems(r.record)
        if not found:
            keep.append(r)
            continue
        more = f" (and {len(found) - 1} more problem{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
        task = r.task if isinstance((r.record.get("task") or {}), dict) else None
        skipped.append(Skipped(str(r.path), f"invalid record: {found[0]}{more}", task=task))
    return keep, skipped
