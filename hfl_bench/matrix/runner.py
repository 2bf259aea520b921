"""The matrix run: every cell not already done, on one executor, and one summary row per cell
(also for a dry run, which checks what it can without loading data)."""

from __future__ import annotations

import glob
import statistics
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from hfl_bench import locks, runpath
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.matrix.cells import error_text, failed_record
from hfl_bench.matrix.executor_api import Executor, ExecutorOptions
from hfl_bench.matrix.executors import make_executor
from hfl_bench.matrix.resume import existing_record
from hfl_bench.matrix.suite import Cell
from hfl_bench.record.io import load_record
from hfl_bench.recording import FINAL_STATUSES, save_record
from hfl_bench.registry import resolve_plugins
from hfl_bench.resolved import resolve_run
from hfl_bench.results.figures import headline_value
from hfl_bench.trackers import Trackers, check_names


def _record_path(cell: Cell) -> Optional[Path]:
    try:
        return cell.record_path()
    except ValueError:  # a name that cannot be a file name
        return None


def summary_row(cell: Cell, record: Optional[dict[str, Any]], status: str, path: Optional[Path]) -> dict[str, Any]:
    """One line of the summary: ``status`` is ok, diverged, failed or skipped (a final record
    was already there); ``record_status`` is the status inside the record file; ``global_acc``
    the headline (``results.figures.headline_value``: the mean over the last evaluated rounds, of
    the honest clients under faults, the recipients of a multimodal run); ``variant`` the method's
    variant when the suite lists several (``suite.variant_text``), else None."""
    record = record or {}
    error = record.get("error") or cell.error
    return {
        "method": cell.cfg.method,
        "variant": cell.variant or None,
        "task": cell.cfg.task,
        "seed": cell.cfg.seed,
        "faults": cell.cfg.faults or "none",
        "status": status,
        "record_status": record.get("status"),
        "global_acc": headline_value(record),
        "wall_time_s": (record.get("cost") or {}).get("wall_time_total_s"),
        "rounds_now": rounds_now(record) if status in RAN else 0,
        "record": str(path) if path else None,
        "error": error.splitlines()[0] if error else None,
    }


RAN = ("ok", "diverged", "failed")  # the statuses of a cell that ran in this invocation (or tried to)


def rounds_now(record: dict[str, Any]) -> int:
    """The rounds a cell's record says were run in this invocation: all it ran, less those of the
    checkpoint it continued from (``federation.resumed_from_rounds``, its last entry); 0 for a
    failed record (no federation section)."""
    federation = record.get("federation") or {}
    resumed = federation.get("resumed_from_rounds") or [0]
    return max(0, int(federation.get("rounds_run") or 0) - int(resumed[-1]))


def throughput(rows: list[dict[str, Any]], wall_time_s: Optional[float]) -> dict[str, Any]:
    """The matrix's wall time and the cell-rounds it ran per minute of it (``rounds_now`` summed:
    skipped cells count nothing, a resumed cell only the rounds after its checkpoint); None for
    each when nothing ran (a dry run, ``wall_time_s`` None)."""
    if wall_time_s is None:
        return {"wall_time_s": None, "cell_rounds": None, "cell_rounds_per_min": None}
    cell_rounds = sum(r.get("rounds_now") or 0 for r in rows)
    per_min = cell_rounds / (wall_time_s / 60) if wall_time_s > 0 else 0.0
    return {"wall_time_s": round(wall_time_s, 3), "cell_rounds": cell_rounds,
            "cell_rounds_per_min": round(per_min, 2)}


def failed_row(cell: Cell, error: str, path: Optional[Path] = None) -> dict[str, Any]:
    """A failed cell with no record of its own to show (a conflict, a record not written)."""
    row = summary_row(cell, None, "failed", path)
    row["error"] = error.splitlines()[0] if error else error
    return row


def record_cell(cell: Cell, record: dict[str, Any], trackers: Optional[list[str]] = None,
                logged: Optional[Trackers] = None) -> dict[str, Any]:
    """Write a cell's record (``runpath.save``: strict JSON, atomic, a fallback folder when
    ``--out`` cannot take it, a finished record never replaced by a failed one nor by one of other
    data or another method version) and return its summary row; then log it to ``trackers``:
    ``logged``, the trackers that logged its rounds live, finish with what they did not see (a
    late-scored round) and the record; without them (a Ray cell, a cell that never reported a
    round) its history is replayed. A record written anywhere but its own path, or nowhere,
    makes the cell failed and its error says where the record is (or that it is lost)."""
    if cell.run is not None:
        if logged is None:
            logged = _started(cell, trackers if trackers is not None else [])
        saved = runpath.save(cell.run, record, keep_final=True, trackers=logged)
    else:  # a cell that did not resolve: no run path to take, its failed record is written as is
        saved = save_record(record, cell.cfg.out, keep_final=True)
    written = saved.record
    if saved.problem is None:
        return summary_row(cell, written, written["status"], saved.path)
    first = (written.get("error") or "").splitlines()[0] if written.get("error") else ""
    row = summary_row(cell, written, "failed", saved.path)
    row["error"] = f"{first}; record {saved.problem}" if first else f"record {saved.problem}"
    return row


def _started(cell: Cell, names: list[str]) -> Trackers:
    """The trackers ``names`` for ``cell``'s run, started (none when no name is given). A tracker
    whose start failed (one warning) is removed from ``names``: the matrix's later cells go on
    without it, and do not each wait for it and warn again."""
    logged = Trackers(names, in_matrix=True)
    if logged:
        logged.start(cell.run)
        names[:] = [n for n in names if n not in logged.failed]
    return logged


def engine_check(cfg: RunConfig) -> None:
    """Raise what can be known about a resolved cell without loading data: an unknown method,
    pool or hyperparameter, a name that cannot name a record file (``resolve_run``). (A method's
    own ``check`` needs the clients, so runs only in a run.)"""
    from hfl_bench.pools import get_pool

    resolve_run(cfg)
    get_pool(cfg.pool)


def data_problem(cfg: RunConfig, seen: dict[tuple, str | None]) -> str | None:
    """Why the cell's data cannot be read (missing, not prepared), or None: the task's cheap data
    fingerprint, once per task and data folder in ``seen``. Without it a dry run on a machine
    without the data said "would run" even of a cell whose record is there, and the run fails."""
    from hfl_bench.errors import DatasetError
    from hfl_bench.recording import data_fingerprint

    key = (cfg.task, cfg.data_dir)
    if key not in seen:
        try:
            data_fingerprint(cfg)
            seen[key] = None
        except DatasetError as e:
            seen[key] = error_text(e, with_traceback=False)
    return seen[key]


def dry_run_row(cell: Cell, data_seen: dict[tuple, str | None] | None = None) -> dict[str, Any]:
    """What a run would do with this cell, checking what can be checked without training: the
    names, the record already there, and whether the task's data can be found (``data_seen``
    keeps that answer across a suite's cells)."""
    existing = existing_record(cell)
    if existing.record is not None:
        return summary_row(cell, existing.record, "would skip", _record_path(cell))
    problem = existing.conflict or cell.error
    if problem is None:
        try:
            engine_check(cell.cfg)
        except Exception as e:  # noqa: BLE001
            problem = error_text(e, with_traceback=False)
    if problem is None:
        problem = data_problem(cell.cfg, {} if data_seen is None else data_seen)
    row = summary_row(cell, None, "would fail" if problem else "would run", _record_path(cell))
    row["error"] = problem
    return row


def _finished_seconds(folder: Path, stem: str) -> dict[str, float]:
    """File name -> wall time (``cost.wall_time_total_s``) of each finished record (status ok or
    diverged) named ``<stem>__seed*.json`` in ``folder`` whose config hash is the stem's, read and
    checked as any record; an unreadable file is no evidence."""
    times = {}
    for path in sorted(folder.glob(f"{glob.escape(stem)}__seed*.json")):
        try:
            record = load_record(path)
        except ValueError:
            continue
        seconds = (record.get("cost") or {}).get("wall_time_total_s")
        if (record.get("status") in FINAL_STATUSES and record.get("config_hash") == stem.rsplit("__", 1)[-1]
                and isinstance(seconds, (int, float)) and seconds >= 0):
            times[path.name] = float(seconds)
    return times


def estimate_rows(rows: list[dict[str, Any]], cells: list[Cell]) -> dict[str, Any]:
    """For a dry run: each "would run" row's ``estimated_s``, the median wall time of its cell's
    finished records for other seeds in its output folder (same task, method and config hash: the
    seed is not in the hash; None when there is none), and the total: how many of those cells have
    an estimate, their seconds summed, and how many have none. Each config's records are read once
    for all its seeds. Wall times are as those runs ran (their machine, their load, their
    ``--jobs``), so this sizes, it does not promise."""
    known, seconds, to_run = 0, 0.0, 0
    read: dict[tuple[Path, str], dict[str, float]] = {}
    for row, cell in zip(rows, cells):
        if row["status"] != "would run":
            continue
        to_run += 1
        path = _record_path(cell)
        times = []
        if path is not None and path.parent.is_dir():
            key = (path.parent, path.name.rsplit("__seed", 1)[0])
            if key not in read:
                read[key] = _finished_seconds(*key)
            times = [t for name, t in read[key].items() if name != path.name]
        row["estimated_s"] = round(statistics.median(times), 1) if times else None
        row["estimated_from"] = len(times)
        if times:
            known += 1
            seconds += row["estimated_s"]
    return {"cells": known, "seconds": round(seconds, 1), "without": to_run - known}


def run_matrix(cells: list[Cell], executor: str | Executor = "local", options: Optional[ExecutorOptions] = None, *,
               on_cell: Optional[Callable[[dict], None]] = None,
               round_progress: Optional[Callable[[Cell], Callable]] = None,
               trackers: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Run every cell not already done; returns the summary rows in cell order. Nothing one cell
    raises, while running or while its record is built or written, stops the others: that cell
    is failed and the matrix goes on (Ctrl-C, a KeyboardInterrupt, does stop it).
    ``executor``: a registered name (``executor_api.EXECUTORS``: local, pool, ray, plugins') with
    ``options``, its options dataclass (None: its defaults; the wrong kind is a ConfigError), or an
    ``Executor`` instance (it has its options). The plugins are resolved once, here: worker processes
    and Ray tasks load exactly the entry points this process loaded (one installed meanwhile is not
    loaded by a later cell). ``on_cell`` gets each summary row as its cell ends; ``round_progress(cell)``
    a progress callback (round, rounds, entry) for a cell's rounds, for an executor that runs one
    cell at a time here (``Executor.serial``). ``trackers``: tracker names each cell is logged to
    (``hfl_bench.trackers``): the driver logs a cell's rounds as they end, whatever the executor,
    then the record; a tracker that fails to start is one warning and no later cell starts it."""
    runner = make_executor(executor, options)
    trackers = check_names(trackers)  # the driver starts each cell's: one that fails to start leaves it
    rows: dict[int, dict[str, Any]] = {}
    index = {id(cell): i for i, cell in enumerate(cells)}
    live: dict[int, Trackers] = {}  # the trackers of the cells whose rounds are being logged as they end
    progress = round_progress if runner.serial else None
    shown: dict[int, Optional[Callable]] = {}  # the progress callback of the cell running now

    def on_round(cell: Cell, entry: dict[str, Any]) -> None:
        if trackers:
            logged = live.get(id(cell))
            if logged is None and cell.run is not None:
                logged = live[id(cell)] = _started(cell, trackers)
            if logged is not None:
                logged.round(entry)
        show = shown.get(id(cell))
        if show is not None and isinstance(entry.get("round"), int):
            show(entry["round"], cell.cfg.rounds, entry)

    def report(cell: Cell, row: dict[str, Any]) -> None:
        rows[index[id(cell)]] = row
        if on_cell:
            on_cell(row)

    held: dict[int, locks.Claim] = {}

    def done(cell: Cell, record: dict[str, Any]) -> None:
        try:
            row = record_cell(cell, record, trackers, live.pop(id(cell), None))
        except Exception as e:  # noqa: BLE001 - one cell's record never stops the matrix
            row = failed_row(cell, f"record not written: {error_text(e, with_traceback=False)}")
        claim = held.pop(id(cell), None)
        if claim is not None:
            claim.release()
        report(cell, row)

    todo = []
    for cell in cells:
        existing = existing_record(cell)
        if existing.record is not None:
            report(cell, summary_row(cell, existing.record, "skipped", _record_path(cell)))
        elif existing.conflict is not None:  # a finished record of other data: neither skipped nor replaced
            report(cell, failed_row(cell, existing.conflict, _record_path(cell)))
        elif cell.error is not None:  # unresolvable: nothing to run
            done(cell, failed_record(cell.cfg, cell.error))
        else:
            todo.append(cell)

    todo = claim_cells(todo, held, report)
    upcoming = iter(todo)

    def next_progress() -> None:  # a serial executor runs the cells in order: the next one starts now
        shown.clear()
        cell = next(upcoming, None)
        if cell is not None and progress is not None:
            shown[id(cell)] = progress(cell)

    def ran(cell: Cell, record: dict[str, Any]) -> None:
        done(cell, record)
        next_progress()

    try:
        if todo:
            plugins = resolve_plugins()
            next_progress()
            runner.run(todo, ran, on_round if trackers or progress is not None else None, plugins)
    finally:
        for logged in live.values():  # interrupted: their runs end without a record
            logged.close()
        for claim in held.values():
            claim.release()
    return [rows[i] for i in range(len(cells))]


def claim_cells(todo: list[Cell], held: dict[int, "locks.Claim"],
                report: Callable[[Cell, dict[str, Any]], None]) -> list[Cell]:
    """Claim each cell's record path for this matrix and check it (``runpath.begin``, as every run
    does): a cell another running process is writing, or whose path holds a finished record of
    other data or another method version, is failed with one line, neither run nor written; the
    claims taken go to ``held``. (The output folder was checked once for the whole matrix.)"""
    runnable = []
    for cell in todo:
        path = _record_path(cell)
        if path is None or cell.run is None:  # a name that cannot be a file name: the cell runs and fails on its own
            runnable.append(cell)
            continue
        try:
            held[id(cell)] = runpath.begin(cell.run, check_out=False)
        except ConfigError as e:  # locks.ClaimError, or a record of other data / method version
            report(cell, failed_row(cell, str(e), path))
            continue
        except OSError:  # the folder cannot take the lock file: the record write reports that
            pass
        runnable.append(cell)
    return runnable


def exit_code(rows: list[dict[str, Any]]) -> int:
    return 1 if any(r["status"] in ("failed", "would fail") for r in rows) else 0


def count_statuses(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many cells ended (or would end) in each status, in order of first appearance."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts
