"""``hfl-bench leaderboard show`` and ``validate``: reproduced runs grouped over seeds with the
published figures beside them, and the schema check of record files. The leaderboard itself
(grouping, published figures, rank, rendering) is ``hfl_bench.results``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from hfl_bench.cli.options import BenchCommand, BenchGroup
from hfl_bench.cli.output import err, fail, note, output_format, plain, print_titled, spelled_for, wide_out
from hfl_bench.results.text import ascii_spelled, markdown_cell, terminal

# The results layer (and numpy under it) is imported inside each command, so that `hfl-bench
# --help` and `list` do not pay for it.
if TYPE_CHECKING:
    from hfl_bench.results.board import Board

# The folders of a source checkout; an installed package is given paths.
REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIRS = (REPO / "leaderboards" / "reproduced", REPO / "leaderboards" / "published")
FORMATS = ("table", "csv", "markdown", "json")
COMPARE_FORMATS = ("table", "markdown", "json")
PATHS_HELP = ("Record files or folders (searched recursively). "
              "\\[default: leaderboards/reproduced and leaderboards/published]")

app = typer.Typer(help="Leaderboards: reproduced runs grouped over seeds, published figures beside them.",
                  no_args_is_help=True, cls=BenchGroup)


def _paths(paths: Optional[list[Path]]) -> list[Path]:
    return list(paths) if paths else [d for d in DEFAULT_DIRS if d.exists()]


def _board_records(paths: Optional[list[Path]]) -> tuple[list, list[str]]:
    """The valid records under ``paths`` and one line per file skipped (each also noted on stderr):
    every other file is listed, never averaged in. No record file at all fails in one line."""
    from hfl_bench.results.board import board_records
    from hfl_bench.results.loading import ResultsError, load_records

    try:
        loaded, not_records = load_records(_paths(paths))
    except ResultsError as e:
        fail(str(e))
    if not loaded and not not_records:
        fail("no record files found in " + ", ".join(map(str, _paths(paths))))
    records, excluded = board_records(loaded)
    skipped = [s.line() for s in not_records + excluded]
    for line in skipped:
        note("skipped:", line)
    return records, skipped


@app.command(cls=BenchCommand)
def show(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable)."),
    method: list[str] = typer.Option([], "--method", "-m", help="Only this method (repeatable)."),
    pool: list[str] = typer.Option([], "--pool", help="Only this architecture pool (repeatable)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv, markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    rank: bool = typer.Option(False, "--rank", help="Print the mean rank of each method across tasks instead "
                              "(within each setting section), with its rank interval."),
    against: Optional[str] = typer.Option(None, "--against", help="Add a column 'vs METHOD': each group's paired "
                                          "difference to METHOD in its protocol [95% interval], * when resolved "
                                          "(`leaderboard compare`)."),
    columns: Optional[str] = typer.Option(None, "--columns", help="The table's and markdown's columns, comma-"
                                          "separated (e.g. method,global acc,local acc), or 'all'. Default: the "
                                          "columns that differ within a section (one value in every row goes into "
                                          "the section's title, empty ones are left out), as many as fit the "
                                          "terminal. csv and json keep every field. The fairness columns (client "
                                          "sd, worst 10%, below local) may be named too; 'all' has them with "
                                          "--fairness."),
    fairness: bool = typer.Option(False, "--fairness", help="Add the fairness columns, per group over its seeds: "
                                  "client sd (population sd of the clients' final local-test accuracy), worst 10% "
                                  "(mean of the worst max(1, ceil(n/10)) clients), below local (% of clients below "
                                  "their own accuracy under local on the same seed and protocol; 'not available' "
                                  "without that record); 'not recorded' for records before schema 1.6. Table, "
                                  "markdown, csv and json; the HTML site always has them."),
    clock: bool = typer.Option(False, "--clock", help="Add the simulated-time columns of runs with --devices, per "
                               "group over its seeds: sim time (s) (the run's total simulated time), time to local "
                               "(s) (simulated time at which the global test accuracy first reaches local's final "
                               "global accuracy on the same seed and protocol), acc @ time budget (with "
                               "--time-budget); 'not recorded' for records without a clock. Table, markdown, csv "
                               "and json."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", min=0.0, help="Seconds of simulated time: "
                                                "the acc @ time budget column is each seed's global test accuracy "
                                                "of the last tested round that ended by then (implies --clock)."),
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
    without faults (records selected on the honest clients' validation by an older rule are kept
    apart: `selection=honest-val`).
    Only records that `leaderboard validate` accepts are read; each other file is listed on stderr
    (skipped, with the reason) and never averaged in. The rank interval of a method is the range of
    ranks consistent with its resolved paired comparisons (docs: Paired comparisons)."""
    from hfl_bench.results.board import build_board
    from hfl_bench.results.ranking import rank_methods, unranked_methods

    fmt = output_format(fmt, as_json, FORMATS)
    if columns is not None and fmt in ("csv", "json"):
        fail(f"--columns chooses the table's and markdown's columns; {fmt} keeps every field")
    if rank and (fairness or clock or time_budget is not None):
        fail(f"{'--fairness' if fairness else '--clock'} adds columns to the groups, not to --rank")
    if time_budget is not None and not math.isfinite(time_budget):
        fail(f"--time-budget must be a finite number of seconds, got {time_budget}")
    if rank and against:
        fail("--against adds a column to the groups, not to --rank (whose rank intervals come from the same "
             "paired comparisons); use one or the other")
    records, skipped = _board_records(paths)  # valid records only; the rest listed, never averaged
    board = build_board(records, task, method, pool, skipped)
    if rank:
        from hfl_bench.results.rank_intervals import with_rank_intervals

        ranked = with_rank_intervals(rank_methods(board.groups), board.groups)
        chosen = _chosen(columns, RANK_COLUMNS)
        _print_rank(ranked, unranked_methods(board.groups, ranked), fmt, chosen)
    else:
        from hfl_bench.results.columns import CLOCK, FAIRNESS, opt_in_sets
        from hfl_bench.results.render import text_columns
        from hfl_bench.results.timing import set_time_budget

        vs = _vs(records, against)
        set_time_budget(board.groups, time_budget)
        opt_in = (FAIRNESS,) * fairness + (CLOCK,) * (clock or time_budget is not None)
        vs_column = (paired_view_column(vs[0]),) if vs else ()
        # --columns may name an opt-in column; 'all' is every column the view shows (--fairness adds its set)
        known = text_columns(opt_in_sets()) + vs_column
        _print_board(board, fmt, vs, _chosen(columns, known, text_columns(opt_in) + vs_column), opt_in)


# The table's title with --fairness: what the fairness columns are (docs: Leaderboards, Fairness).
FAIRNESS_TITLE = ("client sd / worst 10% / below local: over each seed's clients' final local-test accuracy, then mean "
                  "± sample sd over seeds; below local: % of clients below their own under local, same seed and "
                  "protocol")
# The table's title with --clock: what the time columns are (docs: Devices and the simulated clock).
CLOCK_TITLE = ("sim time / time to local / acc @ time budget: simulated seconds on the run's devices (--devices; "
               "server time not modelled), per seed, then mean ± sample sd over seeds; time to local: until the "
               "global accuracy first reaches local's final one, same seed and protocol")
RANK_COLUMNS = ("#", "method", "mean rank", "rank interval", "protocols", "ranks")


def paired_view_column(reference: str) -> str:
    from hfl_bench.results.paired_view import vs_column

    return vs_column(reference)


def _chosen(spec: Optional[str], known: tuple[str, ...],
            every: Optional[tuple[str, ...]] = None) -> Optional[tuple[str, ...]]:
    """``--columns``: the named columns in the order given (``all``: ``every`` one, default all
    ``known``), or one line and exit 2 naming the closest known column; None without --columns."""
    if spec is None:
        return None
    from hfl_bench.registry import unknown_message

    if spec.strip() == "all":
        return known if every is None else every
    names = [c.strip() for c in spec.split(",") if c.strip()]
    if not names:
        fail("--columns: give column names separated by commas, or 'all'; known: " + ", ".join(known))
    for name in names:
        if name not in known:
            fail(f"--columns: {unknown_message('column', name, list(known))}")
    return tuple(dict.fromkeys(names))


def _vs(records: list, reference: Optional[str]) -> Optional[tuple[str, dict]]:
    """``show --against``: every group's comparison with ``reference`` (from all groups, filters
    aside, so a filter never changes a comparison's Holm family); None without --against."""
    if reference is None:
        return None
    from hfl_bench.registry import unknown_message
    from hfl_bench.results.board import build_groups
    from hfl_bench.results.paired_view import vs_comparisons

    groups = build_groups(records)
    names = sorted({g.method for g in groups})
    if reference not in names:
        fail(f"--against: {unknown_message('method', reference, names)}")
    return reference, vs_comparisons(groups, reference)


def _print_board(board: Board, fmt: str, vs: Optional[tuple[str, dict]] = None,
                 chosen: Optional[tuple[str, ...]] = None, opt_in: tuple[str, ...] = ()) -> None:
    from hfl_bench.results import paired_view
    from hfl_bench.results.columns import CLOCK, FAIRNESS
    from hfl_bench.results.render import (
        KIND,
        UNMATCHED_COLUMNS,
        board_json,
        by_section,
        csv_columns,
        csv_rows,
        display_rows,
        section_title,
        sections_markdown,
        table_columns,
        text_columns,
        to_csv,
        to_markdown,
    )

    if fmt == "json":
        data = board_json(board, opt_in)
        if vs:
            data["vs"] = {"against": vs[0], "definitions": paired_view.DEFINITIONS}
            for g in data["groups"]:
                g["vs"] = paired_view.vs_json(g["group_id"], *vs)
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
        return
    if fmt == "csv":
        rows = csv_rows(board, opt_in)
        columns = csv_columns(opt_in) + (paired_view.VS_CSV if vs else ())
        for r in rows if vs else ():
            r.update(paired_view.vs_csv(r["group_id"], *vs) if r["row_type"] == "reproduced" else {})
        sys.stdout.write(to_csv(rows, columns))
        return
    rows, unmatched = display_rows(board)
    vs_columns: tuple[str, ...] = ()
    if vs:
        paired_view.add_vs_cells(rows, board, vs[0], vs[1], KIND)
        vs_columns = (paired_view.vs_column(vs[0]),)
    title = "published figures with no reproduced group"
    if fmt == "markdown":
        sys.stdout.write(sections_markdown(rows, chosen or text_columns(opt_in) + vs_columns,
                                           chosen=chosen is not None))
        if unmatched:
            sys.stdout.write(f"\n{title}:\n\n" + to_markdown(unmatched, UNMATCHED_COLUMNS))
        return
    if rows:
        title_groups = ("reproduced groups: mean ± sample sd over seeds ('-': one seed); global / local acc: the "
                        "headline, mean of the last 10 evaluated rounds; selected: at the selected round (the "
                        "papers' rule); delta = reproduced (selected) - published"
                        + ("; faults: accuracy (and selected figures) over the honest clients, "
                           "drop = with faults - the same seeds and clients without"
                           if any(g.has_faults for g in board.groups) else "")
                        + (f"; {paired_view.vs_title(vs[0])}" if vs else "")
                        + (f"; {FAIRNESS_TITLE}" if FAIRNESS in opt_in else "")
                        + (f"; {CLOCK_TITLE}" if CLOCK in opt_in else ""))
        wide_out().print(plain(title_groups), highlight=False)
        for label, part in by_section(rows):  # one table per setting section: the rows that compete
            _print_table(part, chosen or table_columns(opt_in) + vs_columns, f"setting: {section_title(label)}",
                         chosen=chosen is not None)
        for g in board.groups:  # which copy of a seed recorded twice counted, as markdown and the site say
            if g.copies_note:
                wide_out().print(plain(f"note: {g.copies_note}"), highlight=False)
    else:
        wide_out().print("no reproduced records match", highlight=False)
    if unmatched:
        _print_table(unmatched, tuple(c for c in UNMATCHED_COLUMNS if c != "locator"), title)


def _print_table(rows: list[dict[str, Any]], columns: tuple[str, ...], title: str, legend: str = "",
                 chosen: bool = False) -> None:
    """A rich table on wide stdout, its cells and title spelled for the stream's encoding before
    rich measures them (``spelled_for``: the columns line up on an ASCII-only stdout too).

    Unless the columns were ``chosen`` (--columns): the columns with one value in every row go into
    the title and the empty ones are left out (``readable``), then as many as fit the console's
    width (``fit_columns``), the ones left out named under the table. ``legend`` (what the figures
    are) follows the title."""
    from hfl_bench.results.render import fit_columns, readable, same_label, to_rich

    console = wide_out()
    rows = spelled_for(console, rows)
    caption = ""
    if not chosen:
        shown, same = readable(rows, columns)
        fitted, left_out = fit_columns(rows, shown, console.width)
        columns = tuple(fitted)
        title = "; ".join(x for x in (title, same_label(same)) if x)
        if left_out:
            caption = f"left out to fit {console.width} columns: {', '.join(left_out)} (--columns chooses)"
    title = "; ".join(x for x in (title, legend) if x)
    encoding = console.encoding or "utf-8"
    print_titled(console, to_rich(rows, columns, ascii_spelled(title, encoding), ascii_spelled(caption, encoding)))


def _print_rank(ranked: list[dict[str, Any]], unranked: list[dict[str, Any]], fmt: str,
                chosen: Optional[tuple[str, ...]] = None) -> None:
    """The rank in ``fmt``; ``unranked`` (``ranking.unranked_methods``): the methods alone in a
    section, listed with it after the rank (json: ``unranked``; csv has rank rows only)."""
    from hfl_bench.results.rank_intervals import DEFINITION
    from hfl_bench.results.render import (
        by_section,
        rank_rows,
        reasons_json,
        section_title,
        sections_markdown,
        to_csv,
        unranked_lines,
    )

    columns = chosen or RANK_COLUMNS
    if fmt == "json":
        sys.stdout.write(json.dumps({"ties": "average rank", "within": "one ranking per setting section",
                                     "by": "headline global accuracy (mean of the last evaluated rounds)",
                                     "rank_interval": DEFINITION,
                                     "section_reasons": reasons_json(dict.fromkeys(r["section"]
                                                                                   for r in ranked + unranked)),
                                     "rank": ranked, "unranked": unranked}, indent=1) + "\n")
    elif fmt == "csv":
        rows = [{"section": r["section"], "method": r["method"], "mean_rank": r["mean_rank"],
                 "rank_best": r["rank_interval"][0], "rank_worst": r["rank_interval"][1],
                 "n_protocols": r["n_protocols"],
                 "ranks": "; ".join(f"{x['protocol']}: {x['rank']:g}" for x in r["ranks"])} for r in ranked]
        sys.stdout.write(to_csv(rows, ("section", "method", "mean_rank", "rank_best", "rank_worst", "n_protocols",
                                       "ranks")))
    elif fmt == "markdown":
        sys.stdout.write(sections_markdown(rank_rows(ranked), columns, chosen=chosen is not None))
        sys.stdout.write("".join(f"\n{markdown_cell(line)}\n" for line in unranked_lines(unranked)))
    else:
        title = ("mean rank by headline global accuracy over protocols run by 2+ methods (ties: average rank); "
                 f"rank interval: {DEFINITION}")
        if not ranked:
            wide_out().print("no protocol was run by two or more methods of one setting", highlight=False)
        else:
            wide_out().print(plain(title), highlight=False)
        for label, part in by_section(rank_rows(ranked)):  # ranked within each setting section only
            _print_table(part, columns, f"setting: {section_title(label)}", chosen=chosen is not None)
        for line in unranked_lines(unranked):
            wide_out().print(terminal(line), highlight=False, markup=False)


@app.command(cls=BenchCommand)
def compare(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    against: Optional[str] = typer.Option(None, "--against", "-b", help="The reference method B: each comparison is "
                                          "A - B \\[default: local, unless --variants]. With --variants: one more "
                                          "row, B's best group against the method's default group."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Compare the groups of this method that differ "
                                           "in method parameters (e.g. --set aggregator=...) against its group with "
                                           "none (its defaults), each labelled by the parameters that differ."),
    method: list[str] = typer.Option([], "--method", "-m", help="The method A (repeatable); default: every other "
                                     "method in a protocol the reference ran."),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable)."),
    figure: Optional[str] = typer.Option(None, "--figure", help="selected (the selected round's global accuracy) "
                                         "or final (the mean over the last rounds); default: the headline's."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Compare this extra endpoint of A (e.g. joint) "
                                           "instead of its model."),
    against_endpoint: Optional[str] = typer.Option(None, "--against-endpoint",
                                                   help="Compare this extra endpoint of B instead of its model."),
    digits: int = typer.Option(2, "--digits", min=0, max=4, help="Decimals of the differences and intervals "
                               "printed (JSON: 4)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table (plain lines when piped), markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    fairness: bool = typer.Option(False, "--fairness", help="Compare the fairness figures instead (client_sd, "
                                  "worst10, below_local: `leaderboard show --fairness`), each taken per seed and "
                                  "paired by seed against B: one table per figure and protocol, Holm within it, "
                                  "each side's own figure (mean ± sd over its seeds) beside."),
    clock: bool = typer.Option(False, "--clock", help="Compare the simulated-time figures of runs with --devices "
                               "instead (sim_time, time_to_local: `leaderboard show --clock`), each taken per seed "
                               "and paired by seed against B: one table per figure and protocol, Holm within it; a "
                               "seed either side has no figure for (not recorded, not reached, not available) is "
                               "left out and counted in the notes."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", min=0.0, help="Seconds of simulated time: "
                                                "also compare acc_at_budget, each seed's global test accuracy of "
                                                "the last tested round that ended by then (implies --clock)."),
):
    """Paired comparisons A - B within each protocol both ran (B: --against, local by default):
    records paired by seed (a pair must
    share its partition hash; other seeds are dropped and counted; mixed hosts and uncommitted trees marked), the mean
    difference with its 95% t-interval, the exact sign-flip p-value and its Holm adjustment over the
    comparisons of one table; "resolved" when the interval excludes zero and the Holm-adjusted p is
    below 0.05 ("n=N cannot resolve at 5%" where no outcome could). Groups of two setting
    sections are never compared.

    With --variants METHOD instead of --against: the variants of one method, each of its groups run
    with method parameters (an ablation, another aggregation rule) against its group run with none,
    in each protocol where that one ran, labelled like `crad [aggregator=crad-stage1]`; Holm over
    each table, as above.

    With --fairness: the fairness figures instead of the headline (`leaderboard show --fairness`:
    client_sd, worst10, below_local, each taken per seed from the clients' final local-test
    accuracy), paired by seed against B in the same protocols, one table per figure and protocol.

    With --clock (or --time-budget S): the simulated-time figures instead (`leaderboard show
    --clock`: sim_time, time_to_local, and acc_at_budget with --time-budget), paired by seed the
    same way; seeds without the figure (not recorded, not reached, not available) are left out and
    counted in each comparison's notes."""
    from hfl_bench.registry import unknown_message
    from hfl_bench.results.board import board_records, build_groups
    from hfl_bench.results.figures import FigureError, check_figure
    from hfl_bench.results.loading import ResultsError, load_records
    from hfl_bench.results.paired import against as compare_against
    from hfl_bench.results.paired import variants as compare_variants
    from hfl_bench.results.paired import why_not_comparable

    fmt = output_format(fmt, as_json, COMPARE_FORMATS)
    clock = clock or time_budget is not None
    if time_budget is not None and not math.isfinite(time_budget):
        fail(f"--time-budget must be a finite number of seconds, got {time_budget}")
    if fairness and clock:
        fail(f"--fairness and {'--clock' if time_budget is None else '--time-budget'} each choose the figures "
             "compared: run one, then the other")
    if fairness or clock:
        what = ("the fairness figures of the groups' models (the clients' final local-test accuracy)" if fairness
                else "the simulated-time figures of the groups' runs")
        for value, flag in ((variants, "--variants"), (figure, "--figure"), (endpoint, "--endpoint"),
                            (against_endpoint, "--against-endpoint")):
            if value is not None:
                fail(f"{'--fairness' if fairness else '--clock'} compares {what}, so {flag} does not apply")
    default_reference = against is None and variants is None
    if default_reference:
        against = DEFAULT_REFERENCE
    if variants is not None and method:
        fail("--method picks the methods compared against --against; with --variants every variant is compared "
             "(name another method with --against)")
    try:
        figure = check_figure(figure, endpoint or against_endpoint)
        loaded, not_records = load_records(_paths(paths))
    except (FigureError, ResultsError) as e:
        fail(str(e))
    records, excluded = board_records(loaded)
    for s in not_records + excluded:
        note("skipped:", s.line())
    groups = [g for g in build_groups(records) if not task or g.task in task]
    names = sorted({g.method for g in groups})
    named = [(variants, "--variants"), (against, "--against"), *((m, "--method") for m in method)]
    if default_reference and against not in names:
        fail(f"no records of {against}, the default reference; name another with --against METHOD (one of: "
             f"{', '.join(names) or 'none'}) or compare a method's variants with --variants METHOD")
    for name, flag in named:
        if name is not None and name not in names:
            fail(f"{flag}: {unknown_message('method', name, names)}")
    if variants is not None:
        _check_endpoint(groups, {variants, against} - {None}, endpoint, "--endpoint")
        _check_endpoint(groups, {variants}, against_endpoint, "--against-endpoint")
        tables = compare_variants(groups, variants, [against] if against else [], figure, endpoint, against_endpoint)
        if not tables:
            fail(f"--variants: no protocol holds both {variants}'s group with no method parameters (the reference) "
                 "and another group to compare with it")
        _print_tables(tables, figure, digits, fmt)
        return
    _check_endpoint(groups, set(method) or set(names) - {against}, endpoint, "--endpoint")
    _check_endpoint(groups, {against}, against_endpoint, "--against-endpoint")
    if fairness:
        from hfl_bench.results.fairness import compare as compare_fairness

        tables = compare_fairness(groups, against, method)
    elif clock:
        from hfl_bench.results.timing import compare as compare_clock

        tables = compare_clock(groups, against, method, time_budget)
    else:
        tables = compare_against(groups, against, method, figure, endpoint, against_endpoint)
    compared = {c.a.group.method for t in tables for c in t.comparisons}
    for m in method:
        if m not in compared:
            fail(why_not_comparable(groups, m, against))
    if not tables:
        fail(f"no other method ran a protocol {against} ran, so nothing can be paired")
    if fairness or clock:
        from hfl_bench.results.paired_view import clock_set, fairness_set

        _print_fairness(tables, digits, fmt, clock_set(time_budget) if clock else fairness_set())
        return
    _print_tables(tables, figure, digits, fmt)


def _print_tables(tables: list, figure: str, digits: int, fmt: str) -> None:
    """``compare``'s tables as json, markdown, rich tables on a terminal or plain lines when piped."""
    from hfl_bench.results.paired_view import markdown_tables, plain_lines, rich_tables, tables_json

    if fmt == "json":
        sys.stdout.write(json.dumps(tables_json(tables, figure), indent=1) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(markdown_tables(tables, figure, digits))
    elif wide_out().is_terminal:
        for table in rich_tables(tables, figure, digits):
            print_titled(wide_out(), table)
    else:
        lines = plain_lines(tables, digits)
        sys.stdout.write((COMPARE_HEADER + "\n" + lines) if lines else lines)


def _print_fairness(tables: list, digits: int, fmt: str, figures: Any) -> None:
    """``compare --fairness``'s (``--clock``'s: ``figures``, a ``paired_view.FigureSet``) tables as
    json, markdown, rich tables on a terminal or plain lines when piped."""
    from hfl_bench.results.paired_view import (
        FAIRNESS_HEADER,
        fairness_json,
        fairness_lines,
        fairness_markdown,
        fairness_rich,
    )

    if fmt == "json":
        sys.stdout.write(json.dumps(fairness_json(tables, figures), indent=1) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(fairness_markdown(tables, digits, figures))
    elif wide_out().is_terminal:
        for table in fairness_rich(tables, digits, figures):
            print_titled(wide_out(), table)
    else:
        lines = fairness_lines(tables, digits, figures)
        sys.stdout.write((FAIRNESS_HEADER + "\n" + lines) if lines else lines)


# The header row of the plain lines (piped output): the name of each " | " field, in order (a
# comparison's notes, where it has any, last).
COMPARE_HEADER = "section | protocol | A - B | A - B [95% CI] | n | p sign-flip | p Holm | verdict | notes"
# claims' plain lines: a claim's own line fills paper, claim id, the test, verdict; each of its
# comparisons every field
CLAIMS_HEADER = ("paper | claim id | CPU-scale test: A - B | records, task | figure | n | A, B (means) | "
                 "A - B [95% CI] | p Holm | at the paper's figure | verdict")


def _check_endpoint(groups: list, methods: set, endpoint: Optional[str], flag: str) -> None:
    """One line, exit 2, when no group of ``methods`` reports ``endpoint`` (with the closest name)."""
    if endpoint is None:
        return
    from hfl_bench.registry import unknown_message

    names = sorted({e for g in groups if g.method in methods for e in g.endpoints()})
    if endpoint not in names:
        fail(f"{flag}: {unknown_message('endpoint', endpoint, names)}")


CLAIMS_FORMATS = ("table", "markdown", "json")
DEFAULT_REFERENCE = "local"  # compare's B without --against: no communication at all


@app.command(cls=BenchCommand)
def claims(
    claims_file: Path = typer.Argument(..., help="The claims file (YAML), e.g. leaderboards/claims.yaml; its "
                                       "records folders are relative to its folder."),
    digits: int = typer.Option(2, "--digits", min=0, max=4, help="Decimals of the differences and intervals "
                               "printed (JSON: 4)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table (one line per row), markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    paper: Optional[str] = typer.Option(None, "--paper", help="Only this paper's claims (as the claims file "
                                        "names it, e.g. FedCC).", show_default=False),
    brief: bool = typer.Option(False, "--brief", help="One line per claim: its verdict and a count of its "
                               "tested lines' verdicts (table and markdown; JSON is always whole)."),
):
    """Each headline claim of the seed papers tested on the records: per claim its paper's figures,
    the suite's CPU-scale test (records folder, task, figure, seeds n, the difference A - B with its
    95% interval and Holm-adjusted p) and a verdict: reproduced (the interval excludes 0 in the
    claimed direction and the Holm-adjusted p < 0.05), contradicted (excludes 0 the other way, p <
    0.05), not resolved, n cannot resolve (fewer than six paired seeds, a trend's level included),
    or not yet tested (no records yet; the claims file says what it needs). Each verdict says the
    setting it was reached in where that is not the paper's ("contradicted on a proxy",
    "reproduced, other experiment"; the claim's setting match says what differs). Where the paper
    reports the selected round, each comparison's test at that figure stands beside the headline's,
    and a row whose verdict there differs says so. Comparisons are paired by seed, Holm over the
    comparisons of one claim; a claim is contradicted when any of its comparisons is, reproduced
    when all are. A trend (an advantage that widens as the pool grows or the label skew gets more
    severe) compares the per-seed differences (or ratios) at the last level the claim lists with
    those at the first (Welch's t-test). Rows say mixed hosts where their records ran on more than
    one kind of processor, uncommitted where some ran from a tree with uncommitted changes. A CPU
    test checks direction and mechanism, not the paper's absolute figure. A bad claims file is one
    line, exit 2."""
    from hfl_bench.results.claims import ClaimsError, evaluate
    from hfl_bench.results.claims_view import brief_lines, brief_markdown, claims_json, markdown, plain_lines
    from hfl_bench.results.loading import ResultsError

    fmt = output_format(fmt, as_json, CLAIMS_FORMATS)
    try:
        results, skipped = evaluate(claims_file, paper)
    except (ClaimsError, ResultsError) as e:
        fail(str(e))
    for line in skipped:
        note("skipped:", line)
    if fmt == "json":
        sys.stdout.write(json.dumps(claims_json(results), indent=1) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(brief_markdown(results) if brief else markdown(results, digits))
    else:
        from hfl_bench.results.claims_view import BRIEF_COLUMNS

        lines = brief_lines(results) if brief else plain_lines(results, digits)
        header = " | ".join(BRIEF_COLUMNS) if brief else CLAIMS_HEADER
        sys.stdout.write((header + "\n" + lines) if lines else lines)


TRANSFER_FORMATS = ("table", "markdown", "json")


@app.command(cls=BenchCommand)
def transfer(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable; at least two to compare)."),
    reference: str = typer.Option(DEFAULT_REFERENCE, "--reference", "-b", help="The method every gain is measured "
                                  "from: each method's paired difference - REFERENCE."),
    digits: int = typer.Option(2, "--digits", min=0, max=4, help="Decimals of the gains and intervals printed "
                               "(JSON: 4)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table (plain lines when piped), markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
):
    """Do methods' gains transfer across tasks? Per task (read in one protocol: of those the
    reference ran, the first setting section, then the most methods, the most reference seeds;
    the output names it), each method's paired gain over the reference on the same seeds (mean
    [95% t-interval], n; `leaderboard compare`'s pairing), or "not run" / "other protocol only".
    Per pair of tasks, Kendall's tau-b between the methods' mean gains over the methods compared on
    both (at least 4), with a 95% seed-bootstrap interval (each method's paired differences on
    each task resampled, 2,000 times, fixed seed: the same records give the same output), read by
    the interval alone: rankings agree (above 0), disagree (below 0), or no evidence of agreement
    (it covers 0). Tasks of different modalities use different pools: the methods are the same,
    the models are not."""
    from hfl_bench.registry import unknown_message
    from hfl_bench.results.board import build_groups
    from hfl_bench.results.transfer import transfer as read_transfer

    fmt = output_format(fmt, as_json, TRANSFER_FORMATS)
    records, _ = _board_records(paths)
    groups = build_groups(records)
    tasks = sorted({g.task for g in groups})
    for name in task:
        if name not in tasks:
            fail(f"--task: {unknown_message('task', name, tasks)}")
    groups = [g for g in groups if not task or g.task in task]
    names = sorted({g.method for g in groups})
    if reference not in names:
        fail(f"--reference: {unknown_message('method', reference, names)}")
    _print_transfer(read_transfer(groups, reference), digits, fmt)


def _print_transfer(t: Any, digits: int, fmt: str) -> None:
    """``transfer``'s three tables (the tasks' protocols, the gains, the pairs of tasks) and its
    notes, as json, markdown, rich tables on a terminal or plain lines when piped."""
    from hfl_bench.results.render import to_markdown, to_rich
    from hfl_bench.results.transfer import (
        PAIR_COLUMNS,
        TASK_COLUMNS,
        gain_columns,
        gain_rows,
        notes,
        pair_rows,
        task_rows,
    )

    if fmt == "json":
        sys.stdout.write(json.dumps(t.as_dict(), indent=1) + "\n")
        return
    gains_title = f"gain over {t.reference} (paired by seed, mean [95% CI] n)"
    tables = [(f"tasks, each read in one protocol (where {t.reference} ran)", task_rows(t), TASK_COLUMNS),
              (gains_title, gain_rows(t, digits), gain_columns(t))]
    if t.summary is None:
        tables.append(("do the rankings agree? (Kendall's tau-b, 95% seed bootstrap)", pair_rows(t), PAIR_COLUMNS))
    lines = ([t.summary] if t.summary else []) + notes(t)
    if fmt == "markdown":
        sys.stdout.write("\n".join(f"**{markdown_cell(title)}**\n\n" + to_markdown(rows, columns)
                                   for title, rows, columns in tables if rows)
                         + "".join(f"\n{markdown_cell(line)}\n" for line in lines))
        return
    console = wide_out()
    for title, rows, columns in tables:
        if not rows:
            continue
        if console.is_terminal:
            print_titled(console, to_rich(spelled_for(console, rows), columns, title))
        else:
            sys.stdout.write(f"{terminal(title)}\n" + " | ".join(columns) + "\n"
                             + "".join(" | ".join(terminal(r[c]) for c in columns) + "\n" for r in rows) + "\n")
    for line in lines:
        if console.is_terminal:
            console.print(plain(line), highlight=False)
        else:
            sys.stdout.write(terminal(line) + "\n")


RANKINGS_FORMATS = ("table", "markdown", "json")


@app.command(cls=BenchCommand)
def rankings(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable)."),
    devices: list[str] = typer.Option([], "--devices", help="Only this device profile (repeatable): a preset's "
                                      "name (uniform, mixed-phones), a profile file's name, or none (records "
                                      "without a clock)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table (plain lines when piped), markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
):
    """Three rankings side by side: per task, device setting (the record's clock: profile,
    assignment, deadline; records of two device settings are grouped apart) and protocol (one
    setting section, as `show` separates them), each method's rank by final accuracy (the
    headline global accuracy), by time to local (simulated time until the global accuracy first
    reaches local's final figure on the same seed and protocol: the share of seeds that reached it
    first, then the mean time; methods that never reach it rank last, tied) and by worst 10% (the
    mean accuracy of the worst tenth of the clients), with the figures and the seeds, then a
    generated line per ranking of which methods move against the ranking by final accuracy, and by
    how many places. Ties share the mean of their ranks; a method without a figure is not ranked by
    it, and the notes say why (not recorded: no clock or no per-client figures; not available: no
    local of its protocol)."""
    from hfl_bench.registry import unknown_message
    from hfl_bench.results.rankings import device_names
    from hfl_bench.results.rankings import rankings as read_rankings

    fmt = output_format(fmt, as_json, RANKINGS_FORMATS)
    records, _ = _board_records(paths)
    tasks = sorted({r.record["task"]["name"] for r in records})
    for name in task:
        if name not in tasks:
            fail(f"--task: {unknown_message('task', name, tasks)}")
    known = device_names(records)
    for name in devices:
        if name not in known:
            fail(f"--devices: {unknown_message('device profile', name, known)}")
    _print_rankings(read_rankings(records, task, devices), fmt)


def _print_rankings(result: Any, fmt: str) -> None:
    """``rankings``' tables, one per protocol, each with its lines of what changed and its notes,
    as json, markdown, rich tables on a terminal or plain lines when piped."""
    from hfl_bench.results.rankings import COLUMNS, DEFINITIONS, rows, title
    from hfl_bench.results.render import to_markdown, to_rich

    if fmt == "json":
        sys.stdout.write(json.dumps(result.as_dict(), indent=1) + "\n")
        return
    legend = ("# acc / # time / # worst: the rank by final accuracy, by time to local, by worst 10%; "
              f"time to local: {DEFINITIONS['time_to_local']}; {DEFINITIONS['ties']}")
    alone = [f"one method only, no ranking: {a['method']} on {a['task']}, devices: {a['devices']}; setting: "
             f"{a['section']}; {a['protocol']}" for a in result.alone]
    if not result.tables:
        alone.insert(0, "no protocol has two methods to rank")
    if fmt == "markdown":
        parts = [markdown_cell(legend) + "\n"]
        for t in result.tables:
            parts.append(f"**{markdown_cell(title(t))}**\n\n" + to_markdown(rows(t), COLUMNS)
                         + "".join(f"\n{markdown_cell(line)}\n" for line in t.changes + t.notes))
        parts += [f"{markdown_cell(line)}\n" for line in alone]
        sys.stdout.write("\n".join(parts))
        return
    console = wide_out()

    def lines(texts: list[str]) -> None:
        _print_lines(console, texts)

    lines([legend])
    for t in result.tables:
        if console.is_terminal:
            print_titled(console, to_rich(spelled_for(console, rows(t)), COLUMNS, title(t)))
        else:
            sys.stdout.write("\n" + terminal(title(t)) + "\n" + " | ".join(COLUMNS) + "\n"
                             + "".join(" | ".join(terminal(r[c]) for c in COLUMNS) + "\n" for r in rows(t)))
        lines(t.changes + t.notes)
    lines(alone)


FAMILIES_FORMATS = ("table", "markdown", "json")


@app.command(cls=BenchCommand)
def families(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table (plain lines when piped), markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
):
    """The two families of model heterogeneity on the same clients: per task, protocol and
    capacity profile (a sub-model record's method parameter profile, a knowledge-exchange record's
    --capacity-profile; records with neither are left out and counted), one row per method with
    its family (sub-model: one global model, sub-models per client; knowledge exchange; local the
    floor), seeds, headline global and local accuracy, the paired difference against local on the
    same seeds (95% CI, Holm-adjusted p, verdict) and its budget (steps, bytes sent and training
    FLOPs per client per round; not recorded where no record has them); then every sub-model
    method against every knowledge-exchange method, paired by seed, Holm-adjusted over all pairs
    (no best method is picked before testing), on the global test and again on each client's local
    test half (each its own Holm family), and a generated line per profile and figure of which
    family comes out ahead and how many pairs are resolved."""
    from hfl_bench.registry import unknown_message
    from hfl_bench.results.families import families as read_families
    from hfl_bench.results.families import record_profile

    fmt = output_format(fmt, as_json, FAMILIES_FORMATS)
    records, _ = _board_records(paths)
    tasks = sorted({r.record["task"]["name"] for r in records if r.kind == "reproduced"})
    for name in task:
        if name not in tasks:
            fail(f"--task: {unknown_message('task', name, tasks)}")
    result = read_families(records, task)
    if not result.tables:
        with_profile = any(record_profile(r.record) is not None for r in records if r.kind == "reproduced")
        fail("no record here names a capacity profile (a sub-model method's --set profile=P, or "
             "--capacity-profile P on a levels pool): nothing to compare" if not with_profile else
             "no record of " + ", ".join(task) + " names a capacity profile: nothing to compare")
    _print_families(result, fmt)


def _print_lines(console: Any, texts: list[str]) -> None:
    """Lines of text: through rich on a terminal, plain when piped (``rankings`` and ``families``)."""
    for text in texts:
        if console.is_terminal:
            console.print(plain(text), highlight=False)
        else:
            sys.stdout.write(terminal(text) + "\n")


def _print_families(result: Any, fmt: str) -> None:
    """``families``' tables, per task, protocol and profile: the methods with their budget, the pairs
    of the two families, the reading and the notes; as json, markdown, rich tables on a terminal or
    plain lines when piped."""
    from hfl_bench.results.families import COLUMNS, DEFINITIONS, PAIR_COLUMNS, any_fallback, pair_rows, rows, title
    from hfl_bench.results.headline import FALLBACK_NOTE
    from hfl_bench.results.render import to_markdown, to_rich

    if fmt == "json":
        sys.stdout.write(json.dumps(result.as_dict(), indent=1) + "\n")
        return
    legend = (f"family: {DEFINITIONS['family']}; vs local: {DEFINITIONS['vs_local']}; "
              f"pairs: {DEFINITIONS['pairs']}; local pairs: {DEFINITIONS['local_pairs']}; "
              f"budget: {DEFINITIONS['budget']}")
    tail = [result.left_out_line] if result.left_out else []

    def notes(t: Any) -> list[str]:
        return [*t.notes, *([FALLBACK_NOTE] if any_fallback(t) else [])]

    def pairs_title(t: Any, local: bool = False) -> str:
        figure = "final local (each client's local test half)" if local else "final (global test)"
        return f"{title(t)}: sub-model - knowledge exchange, paired by seed, figure: {figure}"

    if fmt == "markdown":
        parts = [markdown_cell(legend) + "\n"]
        for t in result.tables:
            part = f"**{markdown_cell(title(t))}**\n\n" + to_markdown(rows(t), COLUMNS)
            for local in (False, True):
                if t.pairs:
                    part += (f"\n{markdown_cell(pairs_title(t, local))}\n\n"
                             + to_markdown(pair_rows(t, local), PAIR_COLUMNS))
            readings = [f"Reading: {t.reading}", *([f"Reading: {t.local_reading}"] if t.pairs else [])]
            part += "".join(f"\n{markdown_cell(line)}\n" for line in [*readings, *notes(t)])
            parts.append(part)
        parts += [f"{markdown_cell(line)}\n" for line in tail]
        sys.stdout.write("\n".join(parts))
        return
    console = wide_out()

    def lines(texts: list[str]) -> None:
        _print_lines(console, texts)

    def table(heading: str, body: list[dict[str, str]], columns: tuple[str, ...]) -> None:
        if console.is_terminal:
            print_titled(console, to_rich(spelled_for(console, body), columns, heading))
        else:
            sys.stdout.write("\n" + terminal(heading) + "\n" + " | ".join(columns) + "\n"
                             + "".join(" | ".join(terminal(r[c]) for c in columns) + "\n" for r in body))

    lines([legend])
    for t in result.tables:
        table(title(t), rows(t), COLUMNS)
        for local in (False, True):
            if t.pairs:
                table(pairs_title(t, local), pair_rows(t, local), PAIR_COLUMNS)
        readings = [f"reading: {t.reading}", *([f"reading: {t.local_reading}"] if t.pairs else [])]
        lines([*readings, *notes(t)])
    lines(tail)


@app.command(cls=BenchCommand)
def provenance(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    fmt: str = typer.Option("table", "--format", "-f", help="table (plain text), markdown or json."),
):
    """Say in one sentence where the reproduced records came from: how many ran from which commit,
    from a clean tree or one with uncommitted changes, on which kind of processor (and whose records
    each part holds). README's results paragraph embeds it (docs/regenerate.py), so that sentence
    is the records', never typed."""
    from hfl_bench.results.board import board_records
    from hfl_bench.results.loading import ResultsError, load_records
    from hfl_bench.results.sources import provenance_sentence

    fmt = output_format(fmt, False, COMPARE_FORMATS)
    try:
        loaded, _ = load_records(_paths(paths))
    except ResultsError as e:
        fail(str(e))
    records, _ = board_records(loaded)
    sentence = provenance_sentence(records)
    if fmt == "json":
        print(json.dumps({"provenance": sentence}))
    else:
        print(markdown_cell(sentence) if fmt == "markdown" else terminal(sentence))


@app.command(cls=BenchCommand)
def schema(
    version: Optional[str] = typer.Option(None, "--version", help="A schema version (default: the current one).",
                                          show_default=False),
):
    """Print the record JSON Schema (draft 2020-12): the current version's, generated from the record
    model, or an older version's, as it shipped (older records are validated against their own)."""
    from hfl_bench.record.io import CURRENT_VERSION, SCHEMA_VERSIONS

    version = CURRENT_VERSION if version is None else version
    if version not in SCHEMA_VERSIONS:
        fail(f"no record schema {version!r}; known: {', '.join(SCHEMA_VERSIONS)}")
    if version == CURRENT_VERSION:
        from hfl_bench.record.model import json_schema

        sys.stdout.write(json.dumps(json_schema(), indent=1) + "\n")
    else:
        from hfl_bench.record.io import schema_file

        sys.stdout.write(schema_file(version).read_text(encoding="utf-8"))


@app.command(cls=BenchCommand)
def validate(
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Check every record: an older one against the JSON Schema of its own version, then, upgraded
    to the current version, against the record model (its numbers finite, accuracies within
    [0, 100], its sections consistent); exit 1 listing each problem if any is invalid. (The
    leaderboard and the plots read only the records this accepts.)"""
    from hfl_bench.results.loading import ResultsError, record_files
    from hfl_bench.results.validation import invalid_files

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
    invalid = invalid_files(files)
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
    paths: Optional[list[Path]] = typer.Argument(None, help=PATHS_HELP, show_default=False),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The folder to write the site into (new, empty, "
                                       "or a site this wrote). Without --out, the first path is taken as it "
                                       "(deprecated)."),
):
    """Write the leaderboard as a static HTML site (OUT/index.html).

    Per task and protocol a sortable, filterable table of groups with the published figures
    beside them, the rank, the plots, one page per group (config, provenance, per-class and
    per-architecture tables) and the record files copied beside them. No server, CDN or network:
    open index.html from disk or put the folder on any static host. Skipped files are listed on
    stderr and on the index page."""
    from hfl_bench.paths import OutDirError, check_folder_target
    from hfl_bench.results.html import build_site
    from hfl_bench.results.loading import ResultsError

    if out is None:
        if not paths:
            fail("give the folder to write the site into: --out FOLDER")
        out_dir, paths = paths[0], paths[1:]
        note("deprecated:", f"the output folder as the first argument; write --out {out_dir} (the positional form "
             "goes in the next version)")
    else:
        out_dir = out
    try:
        check_folder_target(out_dir, "--out")
        site = build_site(out_dir, _paths(paths))
    except (ResultsError, OutDirError) as e:
        fail(str(e))
    for s in site.skipped:
        note("skipped:", s.line())
    if site.plot_note:
        note("plots:", site.plot_note)
    wide_out().print(plain(f"wrote {site.index} ({site.n_groups} groups from {site.n_records} records, "
                           f"{len(site.group_pages)} group pages, {len(site.plots)} plots)"), highlight=False)
