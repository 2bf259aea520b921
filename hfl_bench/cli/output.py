"""What every command prints with: the stdout and stderr consoles, the one-line error exit, JSON
output and number formatting. Imports no other module of the CLI, so every command can use it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer
from rich.console import Console

from hfl_bench.config import ConfigError
from hfl_bench.data import DatasetError
from hfl_bench.partition import PartitionError
from hfl_bench.registry import RegistryError

err = Console(stderr=True)
out = Console()

# Errors whose message is meant for the user: printed on one line, exit code 2.
USER_ERRORS = (ConfigError, DatasetError, PartitionError, RegistryError)


def fail(message: str, code: int = 2):
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


def fmt(x: Any, nd: int = 2) -> str:
    """A table cell: '-' for None, floats to ``nd`` decimals."""
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def wide_out() -> Console:
    """stdout for wide tables: piped or captured output gets 160 columns unless COLUMNS says
    otherwise (a terminal keeps its own width)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)
    return console
