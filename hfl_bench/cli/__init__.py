"""The ``hfl-bench`` command line (Typer): rich tables for people, ``--json`` for machines.

This package is the top of the dependency graph: it imports the results layer, the matrix and
the engine; nothing outside it imports it. ``output`` holds what every command prints with; each
other module holds commands, registered on ``app`` here.

``app`` is built on first use (``from hfl_bench.cli import app`` builds it), so ``hfl-bench
--version`` answers before any command module, typer, rich or numpy is imported.
"""

from __future__ import annotations

import sys
from typing import Any

_app: Any = None


def _print_version(value: bool) -> None:
    if value:
        import typer

        from hfl_bench import __version__

        typer.echo(f"hfl-bench {__version__}")
        raise typer.Exit()


def _build_app():
    import typer

    from hfl_bench.cli import describe, leaderboard, matrix, partition, plots, plugins, run
    from hfl_bench.cli.options import BenchCommand, BenchGroup

    app = typer.Typer(
        cls=BenchGroup,
        help="hfl-bench: heterogeneous federated learning benchmarks. Run methods on tasks under one "
        "protocol and write standardized JSON records.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                     help="Print the version and exit."),
    ) -> None:
        """hfl-bench: heterogeneous federated learning benchmarks. Run methods on tasks under one
        protocol and write standardized JSON records."""

    def command(name: str | None = None):
        return app.command(name, cls=BenchCommand)

    # In this order in --help.
    command()(run.run)
    command()(run.show)
    command("list")(plugins.list_)
    command()(describe.describe)
    command()(partition.partition)
    app.add_typer(leaderboard.app, name="leaderboard")
    command("matrix")(matrix.matrix)
    command("plot")(plots.plot_command)
    return app


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = _build_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    if sys.argv[1:] == ["--version"]:  # the fast path: nothing else imported
        from hfl_bench import __version__

        sys.stdout.write(f"hfl-bench {__version__}\n")
        return
    __getattr__("app")()
