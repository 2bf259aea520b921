"""``hfl-bench matrix``: run a suite (methods x tasks x seeds, optionally x fault settings) and
print its summary, with progress over cells (and over rounds for in-process runs): a bar on a
terminal, plain lines when piped."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from hfl_bench.cli.options import BenchCommand
from hfl_bench.cli.output import (
    USER_ERRORS,
    RoundLines,
    cell,
    clock,
    command_line,
    emit_json,
    err,
    fail,
    interrupted,
    note,
    out,
    plain,
)
from hfl_bench.results.text import terminal

if TYPE_CHECKING:
    from hfl_bench.matrix.suite import Cell, Suite


EXECUTOR_HELP = "How the cells run: a registered executor (MatrixCommand lists them here)."


class MatrixCommand(BenchCommand):
    """``matrix``: its --help lists the executors registered when it is shown (the built-ins and
    any installed plugin's, entry point group ``hfl_bench.executors``), read only then, so other
    commands never load them."""

    def format_help(self, ctx, formatter) -> None:
        from hfl_bench.matrix.executors import EXECUTORS
        from hfl_bench.registry import describe

        listed = "; ".join(f"{name}: {_lower_first(describe(cls).rstrip('.'))}" for name, cls in EXECUTORS.items())
        for param in self.params:
            if param.name == "executor":
                param.help = f"How the cells run, one of the registered executors: {listed}."
        super().format_help(ctx, formatter)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def matrix(
    suite_file: Path = typer.Argument(..., metavar="SUITE", help="Suite YAML (methods x tasks x seeds, "
                                      "optionally x fault settings; see README)."),
    executor: str = typer.Option("local", help=EXECUTOR_HELP),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="local: worker processes \\[default: 1, in-process]; "
                                       "pool: worker processes \\[default: the CPUs]; ray: most cells in flight "
                                       "\\[default: all]."),
    threads: Optional[int] = typer.Option(None, help="Torch threads per cell; default: 1 in a pool worker, "
                                          "--cpus-per-cell in a Ray task, unchanged in-process."),
    address: Optional[str] = typer.Option(None, help="Ray: address of an existing cluster (or 'auto'); "
                                          "default: start a local Ray on loopback."),
    cpus_per_cell: Optional[float] = typer.Option(None, help="Ray: CPUs each cell asks for \\[default: 1]."),
    gpus_per_cell: Optional[float] = typer.Option(None, help="Ray: GPUs each cell asks for; default: 1 if the cell's "
                                                  "device is cuda, or auto on a cluster with GPUs, else 0."),
    cells_per_gpu: Optional[str] = typer.Option(
        None, "--cells-per-gpu", metavar="<int|auto>",
        help="Pool (--executor pool, or local with --jobs > 1): most cells at once on each visible GPU, for cells "
             "whose device is cuda, "
             "cuda:N or auto (when there is a GPU); each such cell runs on the GPU with the fewest cells running "
             "(a cell set to cuda:N keeps it). auto: one per GPU until a cell reports its peak CUDA memory after "
             "its first round, then floor(0.8 x the GPU's memory / the largest peak so far), 1 to 8. --jobs caps "
             "all cells. \\[default: auto]"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Record folder; default: the suite's out."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Seeds instead of the suite's: a range 0-9 "
                                        "(inclusive), a list 0,1,2, or both (0-4,7)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="List the cells and what would happen (run, skip, fail: a bad name, a "
                                      "task whose data is not found), and size the cells that would run: the "
                                      "median wall time of each one's records for other seeds in the folder "
                                      "(~ in the time column; summed under the table); run nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress (on a terminal a bar with the running "
                               "cell's round and the time left; piped, a line per finished cell and every few "
                               "rounds)."),
):
    """Run every cell of a suite (methods x tasks x seeds, x fault settings when the suite lists
    faults), one record per cell.

    A cell whose record is already in the output folder (same config hash and seed, status ok or
    diverged, same data) is skipped, so a rerun resumes; failed cells are retried. Anything a cell
    raises, while running or while its record is written, makes that cell failed and the matrix
    goes on; a record --out cannot take is saved under ~/.cache/hfl-bench/unsaved (the summary
    says where). Ctrl-C stops every cell and prints the command that continues. Exit code: 0 when
    every cell is ok, diverged or skipped; 1 when any cell failed (with --dry-run: would fail); 2
    for a bad suite, flag or --out; 130 when interrupted.
    """
    # Imported here so that `hfl-bench --help` does not pay for the matrix runner.
    from hfl_bench.config import ConfigError
    from hfl_bench.matrix.executors import executor_options
    from hfl_bench.matrix.gpus import parse_cells_per_gpu
    from hfl_bench.matrix.runner import count_statuses, dry_run_row, estimate_rows, exit_code, run_matrix, throughput
    from hfl_bench.matrix.suite import check_names, load_suite, parse_seeds, suite_cells
    from hfl_bench.paths import check_out_dir

    # The flags given, by options field; the executor's options dataclass takes them or says which
    # executor does (executor_api.executor_options).
    given = {name: value for name, value in (("jobs", jobs), ("threads", threads), ("address", address),
                                             ("cpus_per_cell", cpus_per_cell), ("gpus_per_cell", gpus_per_cell),
                                             ("cells_per_gpu", cells_per_gpu)) if value is not None}
    try:
        if "cells_per_gpu" in given:  # auto stays given (None, the default): refused where not taken
            given["cells_per_gpu"] = parse_cells_per_gpu(cells_per_gpu)
        options = executor_options(executor, given)
    except ConfigError as e:
        fail(str(e))
    finished: list[dict[str, Any]] = []
    cells: list[Cell] = []
    try:
        suite = load_suite(suite_file)
        if seeds is not None:
            suite = dataclasses.replace(suite, seeds=list(parse_seeds(seeds)))
        check_names(suite, str(suite_file))  # a misspelt name: one line, before any folder or record is made
        folder = out_dir if out_dir is not None else Path(suite.out)
        check_out_dir(folder, create=not dry_run)  # a file or an unwritable folder: refused before any cell
        cells = suite_cells(suite, out_dir)
        if dry_run:
            data_seen: dict = {}  # each task's data looked up once
            rows = [dry_run_row(cell, data_seen) for cell in cells]
            estimate = estimate_rows(rows, cells)
        else:
            t0 = time.perf_counter()
            with _CellProgress(len(cells), enabled=not (quiet or as_json)) as bar:
                def on_cell(row: dict[str, Any]) -> None:
                    finished.append(row)
                    bar.cell_done(row)

                rows = run_matrix(cells, executor, options, on_cell=on_cell, round_progress=bar.rounds,
                                  trackers=suite.trackers)
            elapsed = time.perf_counter() - t0
    except USER_ERRORS as e:
        fail(str(e))
    except KeyboardInterrupt:
        what = (f"{len(finished)} of {len(cells)} cells done, their records kept; the rerun skips them"
                if cells else "before any cell ran")
        interrupted(what, command_line())
    code = exit_code(rows)
    folder = str(out_dir if out_dir is not None else suite.out)
    speed = throughput(rows, None if dry_run else elapsed)
    if as_json:
        emit_json({"suite": suite.name, "out": folder, "dry_run": dry_run, "counts": count_statuses(rows),
                   "exit_code": code, **speed, **({"estimate": estimate} if dry_run else {}), "cells": rows})
    else:
        _print_table(suite, folder, rows, speed, estimate if dry_run else None)
    raise typer.Exit(code)


STATUS_STYLE = {"ok": "green", "diverged": "yellow", "failed": "bold red", "skipped": "dim",
                "would run": "cyan", "would skip": "dim", "would fail": "bold red"}


def _print_table(suite: Suite, folder: str, rows: list[dict[str, Any]], speed: dict[str, Any],
                 estimate: dict[str, Any] | None = None) -> None:
    from hfl_bench.matrix.runner import count_statuses

    title = f"suite {suite.name}: {len(rows)} cells -> {folder}"
    t = Table(title=plain(title))
    faults = any(r.get("faults", "none") != "none" for r in rows)
    variants = any(r.get("variant") for r in rows)
    columns = (("method", "left"), *((("variant", "left"),) if variants else ()), ("task", "left"),
               *((("faults", "left"),) if faults else ()), ("seed", "right"),
               ("status", "left"), ("global acc (%)", "right"), ("time (s)", "right"), ("record", "left"))
    for col, justify in columns:
        t.add_column(col, justify=justify)
    for r in rows:
        style = STATUS_STYLE.get(r["status"], "")
        record = Path(r["record"]).name if r["record"] else "-"
        t.add_row(plain(r["method"]), *((plain(r.get("variant") or "-"),) if variants else ()), plain(r["task"]),
                  *((plain(r.get("faults", "none")),) if faults else ()),
                  cell(r["seed"]), plain(r["status"], style),
                  cell(r["global_acc"]), _seconds(r), plain(record))
    out.print(t)
    counts = ", ".join(f"{n} {s}" for s, n in count_statuses(rows).items())
    took = f" in {speed['wall_time_s']:.1f} s" if speed["wall_time_s"] is not None else ""
    if speed["cell_rounds"]:
        took += f"; {speed['cell_rounds']} cell-rounds, {speed['cell_rounds_per_min']:.1f} per minute"
    out.print(plain(f"{counts}{took}"), highlight=False)
    if estimate is not None and estimate["cells"] + estimate["without"]:
        out.print(plain(estimate_line(estimate)), highlight=False)
    for r in rows:
        if r["error"] and r["status"] in ("failed", "would fail"):
            faults_note = f", faults {r['faults']}" if r.get("faults", "none") != "none" else ""
            variant = f" [{r['variant']}]" if r.get("variant") else ""
            note(f"{r['status']}:", f"{r['method']}{variant} on {r['task']}, seed {r['seed']}{faults_note}: "
                 f"{r['error']}", style="red")


def _seconds(row: dict[str, Any]):
    """A record's wall time; for a cell that would run, ``~`` and the estimate from its other seeds."""
    if row.get("estimated_s") is not None:
        return plain(f"~{row['estimated_s']:.1f}", "dim")
    return cell(row["wall_time_s"], 1)


def estimate_line(estimate: dict[str, Any]) -> str:
    """The dry run's sizing: the cells that would run, by their other seeds' wall times here."""
    hours = estimate["seconds"] / 3600
    known = (f"about {estimate['seconds']:,.0f} s ({hours:.1f} h) of cell time for the {estimate['cells']} that "
             f"would run with a record of another seed here (its median wall time, under the load it ran with)"
             if estimate["cells"] else "no cell that would run has a record of another seed here")
    rest = f"; {estimate['without']} without one (run one seed, timed, to size them)" if estimate["without"] else ""
    return f"estimate: {known}{rest}"


class _CellProgress:
    """Progress on stderr. On a terminal: a rich bar over cells with the time left, and the running
    cell's round with its own time left. Otherwise (piped, redirected, captured): plain lines, as
    ``run`` prints them: one per finished cell (its status, headline, time and the matrix's time
    left) and, for a cell running in this process, one every max(1, rounds // 20) rounds and at its
    last. Pool and Ray workers report their cells when they finish (not their rounds)."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled
        self.tty = err.is_terminal
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=err,
                            transient=True)
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self.round_task = None

    def __enter__(self):
        self.start = time.monotonic()
        if self.enabled and self.tty:
            self.bar.start()
            self.cells = self.bar.add_task("cells", total=self.total)
        return self

    def cell_done(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.done += 1
        variant = f" [{row['variant']}]" if row.get("variant") else ""
        what = f"{row['method']}{variant} on {row['task']}"
        if self.tty:
            last = escape(terminal(f"{what}: {row['status']}"))  # the column reads markup
            self.bar.update(self.cells, advance=1, description=f"cells (last: {last})")
            return
        elapsed = time.monotonic() - self.start
        acc = row.get("global_acc")
        took = row.get("wall_time_s")
        left = elapsed / self.done * (self.total - self.done)
        text = (f"cell {self.done}/{self.total} {row['status']}: {what}, seed {row['seed']}"
                + (f", global acc {acc:.2f}" if isinstance(acc, (int, float)) else "")
                + (f", {clock(took)}" if isinstance(took, (int, float)) else "")
                + f"; matrix elapsed {clock(elapsed)}, left {clock(left) if self.done < self.total else '0:00:00'}")
        _line(text)

    def rounds(self, cell: Cell) -> Optional[Callable]:
        if not self.enabled:
            return None
        if not self.tty:
            return _round_lines(cell)
        if self.round_task is not None:
            self.bar.remove_task(self.round_task)
        self.round_task = self.bar.add_task(f"  {escape(terminal(cell.label))}", total=cell.cfg.rounds)

        def update(rnd: int, total: int, entry: dict[str, Any]) -> None:
            self.bar.update(self.round_task, completed=rnd, total=total)

        return update

    def __exit__(self, *exc):
        if self.enabled and self.tty:
            self.bar.stop()
        return False


def _line(text: str) -> None:
    sys.stderr.write(terminal(text) + "\n")
    sys.stderr.flush()


def _round_lines(cell: Cell) -> RoundLines:
    """A running cell's rounds as plain lines (``run``'s cadence), indented under the cells' lines."""
    return RoundLines(f"  {cell.label}")
