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


def _version_text() -> str:
    """``hfl-bench X.Y`` and, on a second line, the versions that decide what a run does (Python,
    torch, torchvision, timm, numpy), read without importing them."""
    from hfl_bench import __version__
    from hfl_bench.stack import versions

    return f"hfl-bench {__version__}\n{versions()}"


def _print_version(value: bool) -> None:
    if value:
        import typer

        typer.echo(_version_text())
        raise typer.Exit()


def _build_app():
    import typer

    from hfl_bench.cli import describe, leaderboard, matrix, partition, plots, plugins, prepare, reclock, run
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
    command()(reclock.reclock)
    command("list")(plugins.list_)
    command()(describe.describe)
    command()(partition.partition)
    app.add_typer(leaderboard.app, name="leaderboard")
    app.command("matrix", cls=matrix.MatrixCommand)(matrix.matrix)  # --help lists the registered executors
    command("plot")(plots.plot_command)
    app.add_typer(prepare.app, name="prepare")
    return app


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = _build_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ERRORS = "hfl-bench-fallback"


def _fallback(e: UnicodeError) -> tuple[str, int]:
    """The codec error handler ``ERRORS``: ``results.text.ascii_spelled`` for what the stream's
    encoding lacks ("+/-" for the plus-minus sign, a backslash escape for the rest)."""
    if not isinstance(e, UnicodeEncodeError):
        raise e
    from hfl_bench.results.text import ascii_spelled

    return ascii_spelled(e.object[e.start:e.end], e.encoding), e.end


def _survive_narrow_encodings() -> None:
    """Let every command's output survive a stdout or stderr that cannot encode it: reconfigure
    both streams, once, at the start of ``main``, with an error handler that spells what the
    encoding lacks (``_fallback``). Done here, not per command or per character: every table,
    markdown, CSV, error line and progress line of every command (and of any plugin's text they
    show) goes through these two streams, so one place covers them all, and a command added later
    is covered without knowing about it. JSON is unaffected (``json.dumps`` writes ASCII escapes)."""
    import codecs

    try:
        codecs.lookup_error(ERRORS)
    except LookupError:
        codecs.register_error(ERRORS, _fallback)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a plain TextIOWrapper; not a test's capture
        # strict: stdout's default, which raises; backslashreplace: stderr's default, which the
        # handler extends (it escapes what it cannot spell); anything else the user chose is kept
        if reconfigure is None or (getattr(stream, "errors", None) or "strict") not in ("strict", "backslashreplace"):
            continue
        try:
            if codecs.lookup(stream.encoding or "ascii").name != "utf-8":
                reconfigure(errors=ERRORS)
        except (LookupError, ValueError, OSError):
            pass


# The commands that train, and so import torch and torchvision: checked at start-up.
TRAINING_COMMANDS = ("run", "matrix")


def _stack_error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


def main() -> None:
    _survive_narrow_encodings()
    if sys.argv[1:] == ["--version"]:  # the fast path: nothing else imported
        sys.stdout.write(_version_text() + "\n")
        return
    from hfl_bench import stack

    # a dry run (``matrix --dry-run``) lists cells and trains nothing: it never imports torch
    training = (bool(sys.argv[1:2]) and sys.argv[1] in TRAINING_COMMANDS
                and not {"--help", "-h", "--dry-run"} & set(sys.argv))
    if training and (problem := stack.version_problem()):  # torch and torchvision not a pair: one line
        _stack_error(problem)
    try:
        if training:
            import torchvision  # noqa: F401 - fails here, not after the setup, when its operators do not load
        __getattr__("app")()
    except (RuntimeError, ImportError, OSError) as e:  # a torchvision built for another torch, found late
        if (problem := stack.import_problem(e)) is None:
            raise
        _stack_error(problem)
