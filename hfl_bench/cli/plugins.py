"""``hfl-bench list``: the registered plugins of one kind (methods, tasks, pools, ...).

Answered from the metadata index when it is current (``hfl_bench.cli.catalog``): no plugin, torch
or timm is imported; the first call after an install or an edit imports them and writes it."""

from __future__ import annotations

import typer

from hfl_bench.cli import catalog
from hfl_bench.cli.output import USER_ERRORS, emit_json, fail, out, output_format
from hfl_bench.registry import REGISTRIES, unknown_message

FORMATS = ("table", "markdown", "json")


def list_(
    kind: str = typer.Argument(..., help="methods, tasks, pools, partitioners or aggregators."),
    task: str = typer.Option("digits", help="For pools: the task whose input shape sizes the models."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, markdown or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
    columns: str = typer.Option(
        None, "--columns", help="Comma-separated columns to show, in that order (any field of --json, "
        "e.g. name,version,presets for methods, name,defaults for tasks)."),
    levels: bool = typer.Option(
        False, "--levels", help="For pools: each capacity level of each sub-model pool (width a-e, depth a-d) "
        "with its parameters and FLOPs per sample (forward; training: forward + backward), on --task's inputs."),
):
    """List registered plugins of one kind.

    Read from a metadata index under ~/.cache/hfl-bench/index (rebuilt when a plugin, hfl-bench or a
    package changes); HFL_BENCH_NO_INDEX=1 imports the plugins instead."""
    if kind not in REGISTRIES:
        fail(unknown_message("kind", kind, list(REGISTRIES)))
    fmt = output_format(fmt, as_json, FORMATS)
    if levels:
        if kind != "pools":
            fail(f"--levels lists the capacity levels of the sub-model pools: give it with pools, not {kind}")
        return list_levels(task, fmt, columns)
    try:
        entry = catalog.answer(lambda c: c.list_entry(kind, task))
    except USER_ERRORS as e:
        fail(str(e))
    chosen = [c.strip() for c in columns.split(",") if c.strip()] if columns is not None else None
    try:
        rows = entry["json"] if chosen is None else catalog.select_columns(kind, entry["json"], chosen)
    except USER_ERRORS as e:
        fail(str(e))
    if fmt == "json":
        emit_json(rows)
        return
    if fmt == "markdown":
        typer.echo(catalog.markdown_list(rows, kind, chosen), nl=False)
        return
    catalog.render(out, entry["view"] if chosen is None else catalog.list_view(kind, rows, chosen))


def list_levels(task: str, fmt: str, columns: str | None) -> None:
    """``list pools --levels``: computed live (``catalog.level_rows``), never from the index."""
    chosen = [c.strip() for c in columns.split(",") if c.strip()] if columns is not None else None
    try:
        rows = catalog.level_rows(task)
        if chosen is not None:
            rows = catalog.select_columns("levels", rows, chosen)
    except USER_ERRORS as e:
        fail(str(e))
    if fmt == "json":
        emit_json(rows)
    elif fmt == "markdown":
        typer.echo(catalog.markdown_list(catalog.thousands(rows), "levels"), nl=False)
    else:
        catalog.render(out, catalog.list_view("levels", catalog.thousands(rows)))
