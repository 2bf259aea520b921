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


def _no_type_for_flags() -> None:
    """Typer (0.2x) shows ``<bool>`` as the type of every flag in rich help (``--download <bool>``):
    its ``TyperOption.display_type_rich`` does not tell flags apart. A flag takes no value, so it
    shows none."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_flags_untyped", False):
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich._flags_untyped = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def _build_app():
    import typer

    from hfl_bench.cli import describe, leaderboard, matrix, partition, plots, plugins, run

    _no_type_for_flags()
    app = typer.Typer(
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

    # In this order in --help.
    app.command()(run.run)
    app.command()(run.show)
    app.command("list")(plugins.list_)
    app.command()(describe.describe)
    app.command()(partition.partition)
    app.add_typer(leaderboard.app, name="leaderboard")
    app.command("matrix")(matrix.matrix)
    app.command("plot")(plots.plot_command)
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
