"""``hfl-bench describe NAME``: everything one plugin declares. A method's hyperparameters (type,
default, help), fidelity, topology, citation, notes and whether it needs a public set; a task's
``TaskInfo``; a pool's members; an aggregator's or partitioner's docstring.

Plugin text is untrusted: it is printed through ``plain`` (never markup, no control characters).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hfl_bench.cli.output import USER_ERRORS, emit_json, fail, note, out, plain
from hfl_bench.registry import REGISTRIES, describe as first_line

# The order a name found in several registries is resolved in (``--kind`` picks another).
KINDS = ("methods", "tasks", "pools", "partitions", "aggregators")


def describe(
    name: str = typer.Argument(..., help="A method, task, pool, partitioner or aggregator (hfl-bench list ...)."),
    kind: Optional[str] = typer.Option(
        None, "--kind", help="methods, tasks, pools, partitions or aggregators: which registry to look in "
        "(a name in several, e.g. crad, is a method unless this says otherwise)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Show what a plugin declares: a method's hyperparameters, fidelity, citation and notes; a task's metadata; a pool's members.

    An aggregator or partitioner shows its documentation; --json prints it all as JSON."""
    if kind is not None and kind not in REGISTRIES:
        fail(f"unknown kind {kind!r}; choose one of: {', '.join(KINDS)}")
    try:
        found = [k for k in ([kind] if kind else KINDS) if name in REGISTRIES[k]]
        if not found:
            fail(_unknown(name, kind))
        chosen = found[0]
        info = DESCRIBERS[chosen](name, REGISTRIES[chosen].get(name))
        info["origin"] = REGISTRIES[chosen].origin(name)
    except USER_ERRORS as e:
        fail(str(e))
    if len(found) > 1:
        others = ", ".join(found[1:])
        note("note:", f"{name!r} is also in {others}; hfl-bench describe {name} --kind {found[1]} shows it")
    if as_json:
        emit_json(info)
        return
    RENDERERS[chosen](info, out)


def _unknown(name: str, kind: Optional[str]) -> str:
    if kind:
        return REGISTRIES[kind].unknown_message(name)
    return (f"{name!r} is no method, task, pool, partitioner or aggregator; "
            "hfl-bench list methods (tasks, pools, partitions, aggregators) shows them")


# ----------------------------------------------------------------------------- facts


def _type_name(f: dataclasses.Field) -> str:
    t = f.type
    if isinstance(t, str):  # from __future__ import annotations: the source text
        return t
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return "(required)"


def hyperparameters(params_cls: type) -> list[dict[str, Any]]:
    """A method's hyperparameters: name, type, default and help, in declaration order."""
    if not dataclasses.is_dataclass(params_cls):
        return []
    return [{"name": f.name, "type": _type_name(f), "default": _default(f), "help": f.metadata.get("help", "")}
            for f in dataclasses.fields(params_cls)]


def _method(name: str, cls: Any) -> dict[str, Any]:
    return {
        "kind": "method", "name": name, "description": inspect.getdoc(cls) or "",
        "fidelity": getattr(cls, "fidelity", None), "topology": getattr(cls, "topology", None),
        "citation": getattr(cls, "citation", ""), "needs_public": bool(getattr(cls, "needs_public", False)),
        "notes": list(getattr(cls, "notes", ()) or ()),
        "hyperparameters": hyperparameters(getattr(cls, "Params", None)),
    }


def _task(name: str, task: Any) -> dict[str, Any]:
    info = task.info
    return {"kind": "task", "name": name, **info.as_record(), "defaults": dict(info.defaults)}


def _pool(name: str, pool: Any) -> dict[str, Any]:
    return {"kind": "pool", "name": name, "description": pool.description,
            "members": [{"name": m.name, "model": m.model, "kwargs": dict(m.kwargs)} for m in pool.members],
            "assignment": "round-robin: client i gets member i mod " + str(len(pool.members))}


def _documented(kind: str):
    def facts(name: str, obj: Any) -> dict[str, Any]:
        try:
            signature = f"{getattr(obj, '__name__', name)}{inspect.signature(obj)}"
        except (TypeError, ValueError):
            signature = None
        return {"kind": kind, "name": name, "summary": first_line(obj), "description": inspect.getdoc(obj) or "",
                "signature": signature}

    return facts


DESCRIBERS = {"methods": _method, "tasks": _task, "pools": _pool,
              "partitions": _documented("partitioner"), "aggregators": _documented("aggregator")}


# ----------------------------------------------------------------------------- text


def _value(v: Any) -> str:
    return "None" if v is None else repr(v) if isinstance(v, str) else str(v)


def params_table(params: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=plain(title))
    t.add_column("hyperparameter", no_wrap=True)
    t.add_column("type", no_wrap=True)
    t.add_column("default", no_wrap=True)
    t.add_column("help")
    for p in params:
        t.add_row(plain(p["name"]), plain(p["type"]), plain(_value(p["default"])), plain(p["help"], one_line=False))
    return t


def print_params(console: Console, method: str, params: list[dict[str, Any]]) -> None:
    """The hyperparameter table (``--set key=value``) of ``method``, or a line saying it has none."""
    if params:
        console.print(params_table(params, f"{method} hyperparameters (--set key=value)"))
    else:
        console.print(plain(f"{method} has no hyperparameters"), highlight=False)


def _fields(console: Console, rows: list[tuple[str, Any]]) -> None:
    for label, value in rows:
        console.print(Text.assemble((f"{label}: ", "bold"), plain(_value(value) if not isinstance(value, str)
                                                                   else value, one_line=False)),
                      highlight=False)


def _show_method(info: dict[str, Any], console: Console) -> None:
    _fields(console, [("method", info["name"]), ("description", info["description"]),
                      ("fidelity", info["fidelity"]), ("topology", info["topology"]),
                      ("citation", info["citation"] or "-"), ("needs a public set", info["needs_public"]),
                      ("origin", info["origin"])])
    if info["notes"]:
        console.print(Text("notes (choices the suite made where the source leaves room):", style="bold"))
        for n in info["notes"]:
            console.print(Text.assemble("  - ", plain(n, one_line=False)), highlight=False)
    print_params(console, info["name"], info["hyperparameters"])


FROM_DATA = "set from the data folder when it is loaded"


def _show_task(info: dict[str, Any], console: Console) -> None:
    # A task that learns its classes and shape from its folder (imagefolder) registers neither.
    shape = "x".join(str(s) for s in info.get("input_shape", [])) or FROM_DATA
    classes = info.get("num_classes")
    _fields(console, [("task", info["name"]), ("description", info.get("description") or "-"),
                      ("version", info.get("version")), ("classes", FROM_DATA if classes is None else classes),
                      ("input shape", shape), ("source", info.get("source")),
                      ("citation", info.get("citation")), ("license", info.get("license")),
                      ("main score", info.get("main_score")), ("augmentation", info.get("augmentation")),
                      ("origin", info["origin"])])
    defaults = info.get("defaults") or {}
    if defaults:
        t = Table(title="protocol defaults (flags override them)")
        t.add_column("setting", no_wrap=True)
        t.add_column("default")
        for k, v in defaults.items():
            t.add_row(plain(k), plain(_value(v)))
        console.print(t)


def _show_pool(info: dict[str, Any], console: Console) -> None:
    _fields(console, [("pool", info["name"]), ("description", info["description"] or "-"),
                      ("assignment", info["assignment"]), ("origin", info["origin"])])
    t = Table(title="members")
    for col in ("#", "name", "model", "kwargs"):
        t.add_column(col)
    for i, m in enumerate(info["members"]):
        t.add_row(str(i), plain(m["name"]), plain(m["model"]), plain(m["kwargs"] or "-"))
    console.print(t)


def _show_documented(info: dict[str, Any], console: Console) -> None:
    _fields(console, [(info["kind"], info["name"]), ("signature", info["signature"] or "-"),
                      ("origin", info["origin"])])
    console.print(plain(info["description"] or "(no documentation)", one_line=False), highlight=False)


RENDERERS = {"methods": _show_method, "tasks": _show_task, "pools": _show_pool,
             "partitions": _show_documented, "aggregators": _show_documented}
