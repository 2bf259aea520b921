"""The ``hfl-bench`` command line (Typer): rich tables for people, ``--json`` for machines.

This package is the top of the dependency graph: it imports the results layer, the matrix and
the engine; nothing outside it imports it. ``output`` holds what every command prints with; each
other module holds commands, registered on ``app`` here.
"""

from __future__ import annotations

import typer

from hfl_bench.cli import leaderboard, matrix, partition, plots, plugins, run

app = typer.Typer(
    help="hfl-bench: heterogeneous federated learning benchmarks. Run methods on tasks under one "
    "protocol and write standardized JSON records.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# In this order in --help.
app.command()(run.run)
app.command()(run.show)
app.command("list")(plugins.list_)
app.command()(partition.partition)
app.add_typer(leaderboard.app, name="leaderboard")
app.command("matrix")(matrix.matrix)
app.command("plot")(plots.plot_command)


def main() -> None:
    app()
