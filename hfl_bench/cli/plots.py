"""``hfl-bench plot``: figures drawn from records (the drawing is ``hfl_bench.results.plots``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hfl_bench.cli.output import cell, emit_json, fail, out, plain


def plot_command(
    kind: str = typer.Argument(..., help="curves, per-class, per-arch, seen-unseen, bytes, robustness, cd or all "
                              "(all draws robustness only when some record ran with --faults, and never cd)."),
    inputs: list[Path] = typer.Argument(..., metavar="RECORDS...",
                                        help="Record files or folders (searched recursively for *.json)."),
    out_dir: Path = typer.Option(Path("plots"), "--out", help="Folder for the PNGs and their sidecars."),
    tasks: list[str] = typer.Option([], "--task", "-t", help="Only records of this task (repeatable)."),
    methods: list[str] = typer.Option([], "--method", "-m", help="Only records of this method (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written files (and skipped records) as JSON."),
):
    """Draw figures from records: one PNG per kind and task, named KIND__TASK.png, each with a
    caption naming its records and a KIND__TASK.png.sources.json sidecar listing them.
    robustness: the honest clients' global accuracy (mean ± sd over seeds) against fault strength,
    one panel per fault kind, the run without faults at 0. cd: a critical-difference diagram per
    setting section across tasks (Friedman test, Nemenyi post-hoc; needs 2+ protocols and 3+
    methods run in all of them, and the stats extra), named cd__SECTION.png."""
    from hfl_bench.paths import OutDirError, check_folder_target
    from hfl_bench.results.plots import PlotError, make_plots  # here: --help does not load numpy

    try:
        check_folder_target(out_dir, "--out")
        written, skipped = make_plots(kind, inputs, out_dir, tasks, methods)
    except (PlotError, OutDirError) as e:
        fail(str(e))
    if as_json:
        emit_json({"written": [w.as_dict() for w in written], "skipped": [s.as_dict() for s in skipped]})
        return
    t = Table(title="plots written")
    for col in ("kind", "task", "png", "records", "settings"):
        t.add_column(col, overflow="fold")  # paths whole, not cut with an ellipsis
    for w in written:  # record text as plain text: never markup, no control characters
        t.add_row(plain(w.kind), plain(w.task), plain(w.png), cell(len(w.drawn)), cell(len(w.groups)))
    out.print(t)
    if skipped:
        s = Table(title="skipped")
        s.add_column("file", overflow="fold")
        s.add_column("reason", overflow="fold")
        for item in skipped:
            s.add_row(plain(item.path), plain(item.reason))
        out.print(s)
