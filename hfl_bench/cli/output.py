"""What every command prints with: the stdout and stderr consoles, the one-line error exit, the
one-line interrupt exit, JSON output and number formatting. Imports no other module of the CLI,
so every command can use it.

Text that is not the CLI's own (record fields, suite names, flag values, error messages that quote
them) is printed through ``plain``: a ``rich.text.Text``, so never read as markup (``[/x]`` is
shown, not parsed), and cleaned by ``hfl_bench.results.text.terminal`` (no escape sequences or
control characters). Markup is used only in the CLI's own literals.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

import typer
from rich.console import Console
from rich.text import Text

from hfl_bench.config import ConfigError
from hfl_bench.errors import DatasetError, PartitionError
from hfl_bench.registry import RegistryError
from hfl_bench.results.text import terminal

err = Console(stderr=True)
out = Console()

# Errors whose message is meant for the user: printed on one line, exit code 2.
USER_ERRORS = (ConfigError, DatasetError, PartitionError, RegistryError)
# The exit code of a command ended by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130


def plain(value: Any, style: Optional[str] = None, one_line: bool = True) -> Text:
    """Untrusted text for rich: no markup, no emoji codes, no control characters."""
    return Text(terminal("" if value is None else value, one_line=one_line), style=style or "")


def line(label: str, style: str, message: Any) -> Text:
    """``label`` in ``style``, then ``message`` as plain text: one line."""
    return Text.assemble((label, style), " ", plain(message))


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(line("error:", "bold red", message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def output_format(fmt: str, as_json: bool, formats: tuple[str, ...]) -> str:
    """The output format a command was asked for (``--json`` wins), or one line and exit 2."""
    fmt = "json" if as_json else fmt
    if fmt not in formats:
        fail(f"unknown --format {fmt!r}; choose one of: {', '.join(formats)}")
    return fmt


def note(label: str, message: Any, style: str = "yellow") -> None:
    """One line on stderr: a styled label, then the message as plain text."""
    err.print(line(label, style, message), highlight=False, soft_wrap=True)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


def fmt(x: Any, nd: int = 2) -> str:
    """A table cell: '-' for None, floats to ``nd`` decimals."""
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def cell(x: Any, nd: int = 2) -> Text:
    """A table cell of any value (``fmt``), as plain text."""
    return plain(fmt(x, nd))


def spelled_for(console: Console, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with their text spelled for ``console``'s encoding (``results.text.ascii_spelled``:
    "+/-" on an ASCII-only stdout) before a rich table measures them. The stream's error handler
    (``hfl_bench.cli.main``) would spell them only when written, wider than rich measured them,
    and the table's columns would no longer line up."""
    from hfl_bench.results.text import ascii_spelled

    encoding = console.encoding or "utf-8"
    return [{k: ascii_spelled(v, encoding) if isinstance(v, str) else v for k, v in r.items()} for r in rows]


def print_titled(console: Console, table: Any) -> None:
    """A rich table with its title above and its caption below as lines of their own, wrapped at the
    console's width: as the table's own they wrap at the table's width, and a narrow table (one row
    of DFML) printed its title as a paragraph 78 columns wide on a wide terminal."""
    above, below, table.title, table.caption = table.title, table.caption, None, None
    if above:
        console.print(above, style="table.title", highlight=False)
    console.print(table)
    if below:
        console.print(below, style="table.caption", highlight=False)


def wide_out() -> Console:
    """stdout for wide tables: piped or captured output gets 200 columns unless COLUMNS says
    otherwise (a terminal keeps its own width)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)
    return console


# ----------------------------------------------------------------------------- Ctrl-C


def shell_quote(arg: str) -> str:
    """``arg`` quoted for a POSIX shell; an argument holding control characters in bash's
    ``$'...'`` form, so the printed command stays one line and holds no raw control character."""
    if arg.isprintable():
        return shlex.quote(arg)
    escaped = "".join(c if c.isprintable() and c not in "\\'" else
                      ("\\" + c if c in "\\'" else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                      for c in arg)
    return f"$'{escaped}'"


def _program(argv0: str) -> str:
    """How to start this program again: ``hfl-bench`` when that is what the PATH finds, else the
    script's path; ``python -m hfl_bench.cli`` for the module."""
    path = Path(argv0)
    if path.name == "__main__.py" or argv0 == "-m":
        python = shutil.which("python")
        same = python is not None and Path(python).resolve() == Path(sys.executable).resolve()
        return f"{'python' if same else shell_quote(sys.executable)} -m hfl_bench.cli"
    if path.name == "hfl-bench":
        found = shutil.which("hfl-bench")
        if found is not None and Path(found).resolve() == path.resolve():
            return "hfl-bench"
        return shell_quote(argv0)
    return "hfl-bench"


def command_line(add: Sequence[str] = (), argv: Optional[Sequence[str]] = None) -> str:
    """The command line this process was started with (``sys.argv``), with the arguments of
    ``add`` appended unless already there: the exact command that continues it."""
    argv = list(sys.argv if argv is None else argv)
    args = argv[1:] + [a for a in add if a not in argv[1:]]
    return " ".join([_program(argv[0] if argv else "hfl-bench"), *map(shell_quote, args)])


def interrupted(what: str, command: str) -> NoReturn:
    """Ctrl-C: one line naming the command that continues, exit code 130, no traceback."""
    err.print(Text.assemble(("interrupted", "bold yellow"), f" ({terminal(what)}); continue with: ", command),
              highlight=False, soft_wrap=True)
    raise typer.Exit(INTERRUPTED)


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class RoundLines:
    """A run's rounds as plain lines on stderr (piped, redirected, captured): one every
    max(1, rounds // 20) rounds and at the last, with the mean validation accuracy, the elapsed
    time and the time left (``run`` and each in-process matrix cell)."""

    def __init__(self, label: str, left: str = "left"):
        self.label, self.left = label, left
        self.start = time.monotonic()
        self.first_round: Optional[int] = None  # the round before the first reported (a resumed run)

    def __call__(self, rnd: int, total: int, entry: dict[str, Any]) -> None:
        if self.first_round is None:
            self.first_round = rnd - 1
        if rnd % max(1, total // 20) and rnd != total:
            return
        elapsed = time.monotonic() - self.start
        done = rnd - self.first_round
        left = elapsed / done * (total - rnd) if done > 0 else None
        val = entry.get("mean_val_acc")
        sys.stderr.write(terminal(f"{self.label}: round {rnd}/{total}  "
                                  f"val {f'{val:.1f}%' if isinstance(val, (int, float)) else '-'}  "
                                  f"elapsed {clock(elapsed)}  {self.left} {clock(left) if left is not None else '-'}")
                         + "\n")
        sys.stderr.flush()
