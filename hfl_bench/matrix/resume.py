"""Resuming a matrix: a cell whose final record (ok or diverged, same setting and seed) is
already in the output folder is skipped; failed cells run again."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from hfl_bench import config as config_mod
from hfl_bench.matrix.suite import Cell
from hfl_bench.results.records import load_record

# A record with one of these statuses is final: its cell is skipped on a rerun.
FINAL_STATUSES = ("ok", "diverged")


def finished_record(cell: Cell) -> Optional[dict[str, Any]]:
    """The cell's existing record if it is final (ok or diverged) and of the same setting and
    seed; None when the cell still has to run (no record, a failed one, or an unreadable one)."""
    path = cell.record_path()
    if cell.error is not None or not path.is_file():
        return None
    try:
        record = load_record(path)
    except ValueError:
        return None
    cfg_dict = dataclasses.asdict(cell.cfg)
    same = (record.get("config_hash") == config_mod.config_hash(cfg_dict)
            and (record.get("config") or {}).get("seed") == cell.cfg.seed)
    return record if same and record.get("status") in FINAL_STATUSES else None
