"""Running one cell: its record, or a failed record that says what broke (the matrix goes on)."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any, Callable, Optional

from hfl_bench.config import RunConfig
from hfl_bench.paths import checkpoint_path

if TYPE_CHECKING:
    from hfl_bench.matrix.suite import Cell

TRACEBACK_LINES = 12  # lines of traceback kept in a failed record's error text


def error_text(exc: BaseException, with_traceback: bool = True) -> str:
    """``Type: message``, then the tail of the traceback (where in the code it broke)."""
    text = f"{type(exc).__name__}: {exc}"
    if with_traceback and exc.__traceback__ is not None:
        lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
        text += "\n" + "\n".join(lines[-TRACEBACK_LINES:])
    return text


def run_cell(cfg: RunConfig, threads: Optional[int] = None,
             progress: Optional[Callable[[int, int, dict], None]] = None) -> dict[str, Any]:
    """Run one resolved cell and return its record; any exception becomes a failed record.

    A cell continues from its checkpoint if an interrupted matrix left one (on the machine that
    runs it); a checkpoint of other code or settings is dropped and the cell starts over. The
    cell removes its own checkpoint once it has a record, so a Ray worker leaves none behind."""
    from hfl_bench import engine
    from hfl_bench.checkpoint import CheckpointError
    from hfl_bench.results import records

    if threads:
        import torch

        torch.set_num_threads(threads)
    checkpoint = checkpoint_path(cfg)
    try:
        try:
            result = engine.run(cfg, progress=progress, resume=True)
        except CheckpointError:
            checkpoint.unlink(missing_ok=True)
            result = engine.run(cfg, progress=progress)
        record = records.build_record(cfg, result)
    except Exception as e:  # noqa: BLE001 - the matrix records every failure and goes on
        return records.build_failed_record(cfg, error_text(e))
    checkpoint.unlink(missing_ok=True)
    return record


def failed_record(cell: Cell, error: str) -> dict[str, Any]:
    from hfl_bench.results.records import build_failed_record

    return build_failed_record(cell.cfg, error)
