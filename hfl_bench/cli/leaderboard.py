"""``hfl-bench leaderboard show`` and ``validate``: reproduced runs grouped over seeds with the
published figures beside them, and the schema check of record files. The leaderboard itself
(grouping, published figures, rank, rendering) is ``hfl_bench.results``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from hfl_bench.cli.options import BenchCommand, BenchGroup
from hfl_bench.cli.output import err, fail, note, plain, wide_out

# The results layer (and numpy under it) is imported inside each command, so that `hfl-bench
# --help` and `list` do not pay for it.
if TYPE_CHECKING:
    from hfl_bench.results.board import Board

# The folders of a source checkout; an installed package is given paths.
REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIRS = (REPO / "leaderboards" / "reproduced", REPO / "leaderboards" / "published")
FORMATS = ("table", "csv", "markdown", "json")
PATHS_HELP = ("Record files or folders (searched recursively). "
              "\\[default: leaderboards/reproduced and leaderboards/published]")

app = typer.Typer(help="Leaderboards: reproduced runs grouped over seeds, published figures beside them.",
                  no_args_is_help=True, cls=BenchGroup)


def _paths(paths: Optional[list[Path]]) -> list[Path]:
    return list(paths) if paths else [d for d in DEFAULT_DIRS if d.exists()]


@app.command(cls=BenchCommand)
def show(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable)."),
    method: list[str] = typer.Option([], "--method", "-m", help="Only this method (repeatable)."),
    pool: list[str] = typer.Option([], "--pool", help="Only this architecture pool (repeatable)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv, markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    rank: bool = typer.Option(False, "--rank", help="Print the mean rank of each method across tasks instead "
                              "(within each setting section)."),
):
    """Group reproduced records by setting (mean, sample sd, seeds; failed runs counted apart) and
    put the matching published figures beside each group with the delta reproduced - published.
    Groups are shown one setting section at a time (the transfer data the method reads, one
    architecture or a heterogeneous pool, the budget class, faults, modalities): only the rows of
    one section compete, and --rank ranks within each section. The headline (global / local acc,
    the rank) is each run's mean over its last 10 evaluated rounds (measured steadier than the
    selected round's figure, which stays in the `selected` columns; published deltas use it; `*`
    marks records with no final figure, whose selected round's stands in). Under faults the headline is the
    honest clients' accuracy and `drop` the mean change against the same seeds and the same clients
    without faults (records selected on the honest clients' validation, written before issue 30,
    are kept apart: `selection=honest-val`).
    Only records that `leaderboard validate` accepts are read; each other file is listed on stderr
    (skipped, with the reason) and never averaged in."""
    from hfl_bench.results.board import board_records, build_board
    from hfl_bench.results.loading import ResultsError, load_records
    from hfl_bench.results.ranking import rank_methods

    fmt = "json" if as_json else fmt
    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    try:
        loaded, not_records = load_records(_paths(paths))
    except ResultsError as e:
        fail(str(e))
    records, excluded = board_records(loaded)  # valid records only; the rest listed, never averaged
    skipped = [s.line() for s in not_records + excluded]
    for line in skipped:
        note("skipped:", line)
    board = build_board(records, task, method, pool, skipped)
    if rank:
        _print_rank(rank_methods(board.groups), fmt)
    else:
        _print_board(board, fmt)


def _print_board(board: Board, fmt: str) -> None:
    from hfl_bench.results.render import (
        COLUMNS,
        CSV_COLUMNS,
        TABLE_COLUMNS,
        UNMATCHED_COLUMNS,
        board_json,
        by_section,
        csv_rows,
        display_rows,
        sections_markdown,
        to_csv,
        to_markdown,
        to_rich,
    )

    if fmt == "json":
        sys.stdout.write(json.dumps(board_json(board), indent=1) + "\n")
        return
    if fmt == "csv":
        sys.stdout.write(to_csv(csv_rows(board), CSV_COLUMNS))
        return
    rows, unmatched = display_rows(board)
    title = "published figures with no reproduced group"
    if fmt == "markdown":
        sys.stdout.write(sections_markdown(rows, COLUMNS))
        if unmatched:
            sys.stdout.write(f"\n{title}:\n\n" + to_markdown(unmatched, UNMATCHED_COLUMNS))
        return
    if rows:
        title_groups = ("reproduced groups: mean ± sample sd over seeds ('-': one seed); global / local acc: the "
                        "headline, mean of the last 10 evaluated rounds; selected: at the selected round (the "
                        "papers' rule); delta = reproduced (selected) - published"
                        + ("; faults: accuracy (and selected figures) over the honest clients, "
                           "drop = with faults - the same seeds and clients without"
                           if any(g.has_faults for g in board.groups) else ""))
        for label, part in by_section(rows):  # one table per setting section: the rows that compete
            wide_out().print(to_rich(part, TABLE_COLUMNS, f"setting: {label}; {title_groups}"))
    else:
        wide_out().print("no reproduced records match", highlight=False)
    if unmatched:
        wide_out().print(to_rich(unmatched, tuple(c for c in UNMATCHED_COLUMNS if c != "locator"), title))


def _print_rank(ranked: list[dict[str, Any]], fmt: str) -> None:
    from hfl_bench.results.render import by_section, rank_rows, sections_markdown, to_csv, to_rich

    columns = ("#", "method", "mean rank", "protocols", "ranks")
    if fmt == "json":
        sys.stdout.write(json.dumps({"ties": "average rank", "within": "one ranking per setting section",
                                     "by": "headline global accuracy (mean of the last evaluated rounds)",
                                     "rank": ranked}, indent=1) + "\n")
    elif fmt == "csv":
        rows = [{"section": r["section"], "method": r["method"], "mean_rank": r["mean_rank"],
                 "n_protocols": r["n_protocols"],
                 "ranks": "; ".join(f"{x['protocol']}: {x['rank']:g}" for x in r["ranks"])} for r in ranked]
        sys.stdout.write(to_csv(rows, ("section", "method", "mean_rank", "n_protocols", "ranks")))
    elif fmt == "markdown":
        sys.stdout.write(sections_markdown(rank_rows(ranked), columns))
    else:
        title = "mean rank by headline global accuracy over protocols run by 2+ methods (ties: average rank)"
        if not ranked:
            wide_out().print("no protocol was run by two or more methods of one setting", highlight=False)
        for label, part in by_section(rank_rows(ranked)):  # ranked within each setting section only
            wide_out().print(to_rich(part, columns, f"setting: {label}; {title}"))


@app.command(cls=BenchCommand)
def validate(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Check every record against the JSON Schema, and that its numbers are finite (no NaN or
    Infinity) and its accuracies within [0, 100]; exit 1 listing each problem if any is invalid.
    (The leaderboard and the plots read only the records this accepts.)"""
    from hfl_bench.results.loading import ResultsError, record_files
    from hfl_bench.results.validation import invalid_files, schema_validator

    validator = schema_validator()
    try:
        files = record_files(_paths(paths))
    except ResultsError as e:
        fail(str(e))
    if not files:
        searched = _paths(paths)
        if not searched:  # an installed package has no leaderboards/ folders of its own
            fail("no record files or folders given, and the default folders are not here: "
                 + ", ".join(map(str, DEFAULT_DIRS)))
        fail("no record files found in " + ", ".join(map(str, searched)))
    invalid = invalid_files(files, validator)
    if as_json:
        sys.stdout.write(json.dumps({"checked": len(files), "invalid": invalid}, indent=1) + "\n")
    else:
        for f, errs in invalid.items():
            for e in errs:
                err.print(plain(f"{f}: {e}"), highlight=False, soft_wrap=True)
        wide_out().print(f"{len(files) - len(invalid)} of {len(files)} records valid", highlight=False)
    if invalid:
        raise typer.Exit(1)


@app.command(cls=BenchCommand)
def html(
    out_dir: Path = typer.Argument(..., help="The folder to write the site into (new, empty, or a site this wrote)."),
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
):
    """Write the leaderboard as a static HTML site (OUT_DIR/index.html).

    Per task and protocol a sortable, filterable table of groups with the published figures
    beside them, the rank, the plots, one page per group (config, provenance, per-class and
    per-architecture tables) and the record files copied beside them. No server, CDN or network:
    open index.html from disk or put the folder on any static host. Skipped files are listed on
    stderr and on the index page."""
    from hfl_bench.paths import OutDirError, check_folder_target
    from hfl_bench.results.html import build_site
    from hfl_bench.results.loading import ResultsError

    try:
        check_folder_target(out_dir, "OUT_DIR")
        site = build_site(out_dir, _paths(paths))
    except (ResultsError, OutDirError) as e:
        fail(str(e))
    for s in site.skipped:
        note("skipped:", s.line())
    if site.plot_note:
        note("plots:", site.plot_note)
    wide_out().print(plain(f"wrote {site.index} ({site.n_groups} groups from {site.n_records} records, "
                           f"{len(site.group_pages)} group pages, {len(site.plots)} plots)"), highlight=False)
