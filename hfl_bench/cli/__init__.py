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


def _one_value_per_option() -> None:
    """Click keeps the last of an option given twice (``--faults a --faults b`` runs ``b``) without a
    word; a benchmark run must be what its command line says, so a value option given more than once
    is refused in one line (exit 2). Repeatable options (``--set``, ``--task`` of ``plot``) and flags
    are not affected."""
    from typer.core import TyperCommand

    parse = TyperCommand.parse_args
    if getattr(parse, "_one_value", False):
        return

    def parse_args(self, ctx, args):
        try:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        except Exception:  # noqa: BLE001 - a malformed command line: the real parse below reports it
            order = []
        seen: set[str] = set()
        for param in order:
            if getattr(param, "multiple", True) or getattr(param, "is_flag", True) or getattr(param, "count", False):
                continue
            if param.name in seen:
                from hfl_bench.cli.output import fail

                fail(f"{max(param.opts, key=len)} is given more than once: give it once")
            seen.add(param.name)
        return parse(self, ctx, args)

    parse_args._one_value = True  # type: ignore[attr-defined]
    TyperCommand.parse_args = parse_args  # type: ignore[method-assign]


def _build_app():
    import typer

    from hfl_bench.cli import describe, leaderboard, matrix, partition, plots, plugins, run

    _no_type_for_flags()
    _one_value_per_option()
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
