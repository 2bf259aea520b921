"""``hfl-bench describe NAME``: everything one plugin declares. A method's card
(``hfl_bench.method_card``: version, fidelity, topology, citation, the transfer data it reads,
whether it needs one architecture or runs missing modalities, the fault kinds it refuses, notes, changelog)
and its hyperparameters (type, default, help); a task's ``TaskInfo``; a pool's members; an
aggregator's or partitioner's docstring.

The facts come from ``hfl_bench.cli.catalog``: the metadata index when it is current (nothing of
the plugins imported), else the imported registries. Plugin text is untrusted: it is printed
through ``plain`` (never markup, no control characters).
"""

from __future__ import annotations

from typing import Any, Optional

import typer
from rich.console import Console

from hfl_bench.cli import catalog
from hfl_bench.cli.catalog import KINDS, hyperparameters  # noqa: F401 - hyperparameters: for ``run``
from hfl_bench.cli.output import USER_ERRORS, emit_json, fail, note, out
from hfl_bench.registry import REGISTRIES, unknown_message


def describe(
    name: str = typer.Argument(..., help="A method, task, pool, partitioner or aggregator (hfl-bench list ...)."),
    kind: Optional[str] = typer.Option(
        None, "--kind", help="methods, tasks, pools, partitioners or aggregators: which registry to look in "
        "(a name in several, e.g. crad, is a method unless this says otherwise)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Show what a plugin declares: a method's card and hyperparameters; a task's metadata; a pool's members.

    A method's card: version, fidelity, topology, citation, transfer data, refusals, notes and changelog. An
    aggregator or partitioner shows its documentation; --json prints it all as JSON. Read from
    the metadata index, like list (HFL_BENCH_NO_INDEX=1 imports the plugins instead)."""
    if kind is not None and kind not in REGISTRIES:
        fail(unknown_message("kind", kind, list(KINDS)))
    try:
        found, entry, unknown = catalog.answer(lambda c: _look_up(c, name, kind))
    except USER_ERRORS as e:
        fail(str(e))
    if unknown is not None:
        fail(unknown)
    if len(found) > 1:
        others = ", ".join(found[1:])
        note("note:", f"{name!r} is also in {others}; hfl-bench describe {name} --kind {found[1]} shows it")
    if as_json:
        emit_json(entry["json"])
        return
    catalog.render(out, entry["view"])


def _look_up(c: Any, name: str, kind: Optional[str]) -> tuple[list[str], Any, Optional[str]]:
    """The kinds ``name`` is in, the entry of the first, and the message when it is in none."""
    found = [k for k in ([kind] if kind else KINDS) if name in c.names(k)]
    if not found:
        return found, None, _unknown(c, name, kind)
    return found, c.describe_entry(found[0], name), None


def _unknown(c: Any, name: str, kind: Optional[str]) -> str:
    if kind:
        return c.unknown_message(kind, name)
    import difflib

    names = {n: k for k in reversed(KINDS) for n in c.names(k)}  # the first kind wins a shared name
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    kind_of = names[close[0]].rstrip("s") if close else ""
    hint = f" Did you mean {close[0]!r} ({'an' if kind_of[:1] in 'aeiou' else 'a'} {kind_of})?" if close else ""
    return (f"{name!r} is no method, task, pool, partitioner or aggregator.{hint} "
            "hfl-bench list methods (tasks, pools, partitioners, aggregators) shows them")


def print_params(console: Console, method: str, params: list[dict[str, Any]]) -> None:
    """The hyperparameter table (``--set key=value``) of ``method``, or a line saying it has none."""
    catalog.render(console, catalog.params_view(method, params))
