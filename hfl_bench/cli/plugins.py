"""``hfl-bench list``: the registered plugins of one kind (methods, tasks, pools, ...)."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from hfl_bench.cli.output import USER_ERRORS, emit_json, fail, fmt, out, plain
from hfl_bench.config import ConfigError
from hfl_bench.registry import REGISTRIES, describe
from hfl_bench.results.text import terminal


def list_(
    kind: str = typer.Argument(..., help="methods, tasks, pools, partitions or aggregators."),
    task: str = typer.Option("digits", help="For pools: the task whose input shape sizes the models."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """List registered plugins of one kind."""
    if kind not in REGISTRIES:
        fail(f"unknown kind {kind!r}; choose one of: {', '.join(REGISTRIES)}")
    try:
        rows = _list_rows(kind, task)
    except USER_ERRORS as e:
        fail(str(e))
    if as_json:
        emit_json(rows)
        return
    t = Table(title=kind)
    columns = [c for c in (rows[0].keys() if rows else ["name"]) if c != "origin"]  # origin: --json only
    for col in columns:  # short fields stay on one line; descriptions and member lists wrap
        t.add_column(col, no_wrap=col not in WRAPPED, overflow="fold" if col in WRAPPED else "ellipsis")
    for row in rows:
        t.add_row(*[_shape(row[c]) if c == "input" else _cell(row[c]) for c in columns])
    out.print(t)


# Columns that may wrap at a narrow terminal; the others keep their values on one line.
WRAPPED = ("description", "members", "source")


def _shape(v: Any) -> Text:
    """An input shape as one word, ``1x8x8`` (a list would be a cell of one line per number)."""
    return plain(("x".join(map(str, v)) or "-") if isinstance(v, list) else fmt(v))  # []: set by the data


def _cell(v: Any) -> Text:
    """Plugin text (names, docstrings) as plain text: a docstring's ``[0, 1]`` is not markup."""
    if isinstance(v, list):
        return plain("\n".join(terminal(x) for x in v), one_line=False)
    return plain(fmt(v), one_line=False)


def _list_rows(kind: str, task_name: str) -> list[dict[str, Any]]:
    registry = REGISTRIES[kind]
    rows = []
    if kind == "pools":
        from hfl_bench.data import get_task
        from hfl_bench.pools import build_model, n_params

        import torch

        info = get_task(task_name).info
        if info.num_classes is None:  # imagefolder: known once its folder is loaded
            raise ConfigError(f"task {task_name} takes its classes and input shape from its data folder; "
                              "size the pools with a task that declares them, e.g. --task cifar10-jpg")
        for name, pool in registry.items():
            with torch.device("meta"):  # counted without allocating or initializing weights
                members = [f"{m.name} ({m.model}): {n_params(build_model(m, info)):,} params" for m in pool.members]
            rows.append({"name": name, "members": members, "description": pool.description})
        return rows
    for name, obj in registry.items():
        row = {"name": name, "description": describe(obj)}
        if kind == "methods":
            row.update(fidelity=obj.fidelity, topology=obj.topology)
        if kind == "tasks":
            info = obj.info
            row.update(version=info.version, classes=info.num_classes, input=list(info.input_shape),
                       source=info.source)
        row["origin"] = registry.origin(name)
        rows.append(row)
    return rows
