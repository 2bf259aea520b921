"""What ``hfl-bench list`` and ``describe`` print, as data: from the metadata index when its key
matches (``hfl_bench.metadata_index``; nothing of the plugins is imported), else from the imported
registries, writing the index for the next call.

An *entry* is one command's answer: ``{"json": what --json prints, "view": blocks}`` or
``{"error": message}`` for a plugin whose facts raise a user error. A *view* is a list of
``[tag, body]`` blocks of plain strings (``fields``, ``heading``, ``bullet``, ``line``, ``text``,
``table``) that ``render`` prints: every value is formatted to text when the entry is built, so the
index and the live registries print the same thing. Strings from an index are printed through
``plain`` like any plugin text (no markup, no control characters), and a malformed entry sends the
command back to the imported registries, which rebuild the index.

The index holds every registry's names, every ``list`` answer (pools sized for ``digits`` and for
each task asked since) and every ``describe`` answer. It is built only in a process whose
registries are untouched (nothing registered or discovered before): one that registered something
itself, such as a test, gets the live answers and leaves the index alone.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Callable, TypeVar

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hfl_bench import metadata_index
from hfl_bench.cli.output import USER_ERRORS, fmt, plain
from hfl_bench.config import ConfigError
from hfl_bench.registry import REGISTRIES, skipped_entry_points, unknown_message
from hfl_bench.registry import describe as first_line
from hfl_bench.results.text import markdown_cell, terminal

# The order a name found in several registries is resolved in (``describe --kind`` picks another).
KINDS = ("methods", "tasks", "pools", "partitioners", "aggregators")
# The task ``list pools`` sizes the models for unless --task says otherwise.
DEFAULT_POOL_TASK = "digits"
R = TypeVar("R")


class StoredError(ConfigError):
    """A user error recorded in the index when it was built (a plugin's facts raised one)."""


class Stale(Exception):
    """The index lacks an entry (pools for a task not asked before) or holds a malformed one."""

    def __init__(self, pool_task: str | None = None):
        super().__init__(pool_task)
        self.pool_task = pool_task


# ----------------------------------------------------------------------------- facts


def list_rows(kind: str, task_name: str) -> list[dict[str, Any]]:
    """The rows of ``hfl-bench list KIND`` (pools: sized for ``task_name``)."""
    registry = REGISTRIES[kind]
    rows = []
    if kind == "pools":
        import torch

        from hfl_bench.data import get_task
        from hfl_bench.pools import build_model, n_params

        info = get_task(task_name).info
        if info.num_classes is None:  # imagefolder: known once its folder is loaded
            raise ConfigError(f"task {task_name} takes its classes and input shape from its data folder; "
                              "size the pools with a task that declares them, e.g. --task cifar10-jpg")
        for name, pool in registry.items():
            text = info.input_kind == "tokens"
            with torch.device("meta"):  # counted without allocating or initializing weights
                members = [f"{m.name} ({m.model}): {n_params(build_model(m, info)):,} params"
                           if m.multimodal == bool(info.modalities) and m.text == text else
                           f"{m.name} ({m.model}): for {'text' if m.text else 'non-text'} tasks" if m.text != text else
                           f"{m.name} ({m.model}): for {'multimodal' if m.multimodal else 'single-modality'} tasks"
                           for m in pool.members]
            rows.append({"name": name, "members": members, "description": pool.description})
        return rows
    for name, obj in registry.items():
        row = {"name": name, "description": first_line(obj)}
        if kind == "methods":
            card = obj.card
            row.update(description=card.summary, fidelity=card.fidelity, topology=card.topology,
                       transfer=card.transfer, single_architecture=card.single_architecture,
                       peer_data=card.peer_data, submodels=card.submodels, model_family=card.pool,
                       predictor=card.predictor, refuses_faults=sorted(card.refuses_faults),
                       version=card.version, presets={n: dict(v) for n, v in card.presets.items()},
                       on_digits=quick_start_text(card), on_text=text_task_text(card))
        if kind == "tasks":
            info = obj.info
            row.update(version=info.version, classes=info.num_classes, input=list(info.input_shape),
                       source=info.source)
            if info.modalities:
                row["modalities"] = {m.name: list(m.shape) for m in info.modalities}
            row["defaults"] = dict(info.defaults)
        if kind == "aggregators":
            from hfl_bench.aggregation import aggregator_version  # here: an index answer imports no plugin

            row["version"] = aggregator_version(name)
        row["origin"] = registry.origin(name)
        rows.append(row)
    return rows


def level_rows(task_name: str) -> list[dict[str, Any]]:
    """The rows of ``hfl-bench list pools --levels``: every capacity level of every sub-model pool
    (one width-scalable member: levels a-e at width rates 1 to 1/16; one depth-scalable member:
    levels a-d, one block fewer each), built for ``task_name``'s inputs, with its parameters and
    its FLOPs per sample as the record counts them (``hfl_bench.flops``: a forward pass, and a
    training step's forward and backward). Computed here, not read from the index."""
    import torch

    from hfl_bench.data import get_task
    from hfl_bench.families.depth import DEPTH_LEVELS, level_depth
    from hfl_bench.families.submodel import LEVELS
    from hfl_bench.flops import COUNT_BATCH, count
    from hfl_bench.pools import PoolMember, build_model, n_params

    info = get_task(task_name).info
    if info.num_classes is None or info.input_kind == "tokens" or info.modalities:
        raise ConfigError(f"--levels sizes the sub-model pools for an image or signal task that declares its input; "
                          f"task {task_name} does not (e.g. --task digits or --task cifar10-jpg)")
    rows = []
    for name, pool in REGISTRIES["pools"].items():
        if len(pool.members) != 1 or pool.members[0].text or pool.members[0].multimodal:
            continue
        member = pool.members[0]
        with torch.device("meta"):
            probe = build_model(member, info)
        if hasattr(probe, "width_axes"):
            levels = [(level, "rate", rate, f"width {rate:g}" if rate == 1 else f"width 1/{round(1 / rate)}")
                      for level, rate in LEVELS.items()]
        elif hasattr(probe, "exit_logits"):
            full = probe.full_depth
            levels = [(level, "depth", level_depth(level, full), f"depth {level_depth(level, full)} of {full}")
                      for level in DEPTH_LEVELS[:full]]
        else:
            continue
        for level, key, value, scale in levels:
            model = build_model(PoolMember(member.model, {**member.kwargs, key: value}, member.name), info)
            per = count(model, torch.zeros(COUNT_BATCH, *info.input_shape))
            rows.append({"pool": name, "level": level, "scale": scale, "params": n_params(model),
                         "forward_flops": per.forward, "training_flops": per.training})
    return rows


def thousands(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with their integers written with thousands separators (a table's cells)."""
    return [{k: f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else v for k, v in r.items()} for r in rows]


def quick_start_text(card: Any) -> str:
    """What the method needs to run on the quick-start task (digits, the task of its smoke run):
    "runs" with no flag, else the flags its declared requirements call for, read from the card (a
    public set for a method that reads one, a one-architecture pool, the smoke run's pretraining
    split), never typed by hand. tests/test_readme.py checks it against real runs."""
    smoke = card.smoke_config()
    needs = [f"--public-size {smoke['public_size']}"] if card.needs_public and smoke["public_size"] else []
    needs += [f"--pool {smoke['pool']}"] if card.single_architecture and smoke["pool"] else []
    needs += [f"--pretrain-size {smoke['pretrain_size']}"] if smoke.get("pretrain_size") else []
    return "needs " + " ".join(needs) if needs else "runs"


def text_task_text(card: Any) -> str:
    """What the method needs to run on the text task (``rotten-tomatoes``: token ids, clients of
    whole movies), from the card: "refuses: " and the card's reason where it cannot read token ids
    (``why_not_tokens``: the results page lists them from here), the
    public set its smoke run holds out for a method that reads one (held out of the movies' reviews),
    the text pool of one architecture for a single-architecture method, else "runs"."""
    if card.why_not_tokens.strip():
        return f"refuses: {card.why_not_tokens.strip()}"
    smoke = card.smoke_config()
    needs = [f"--public-size {smoke['public_size']}"] if card.needs_public and smoke["public_size"] else []
    needs += ["--pool text-cnn"] if card.single_architecture else []
    return "needs " + " ".join(needs) if needs else "runs"


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
    card = cls.card
    return {"kind": "method", **card.as_dict(), "description": card.summary,
            "hyperparameters": hyperparameters(cls.Params)}


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
        facts = {"kind": kind, "name": name, "summary": first_line(obj), "description": inspect.getdoc(obj) or "",
                 "signature": signature}
        if kind == "aggregator":  # bumped whenever what the rule computes changes
            from hfl_bench.aggregation import aggregator_version  # here: an index answer imports no plugin

            facts["version"] = aggregator_version(name)
        return facts

    return facts


DESCRIBERS = {"methods": _method, "tasks": _task, "pools": _pool,
              "partitioners": _documented("partitioner"), "aggregators": _documented("aggregator")}


# ----------------------------------------------------------------------------- views


def value_text(v: Any) -> str:
    return "None" if v is None else repr(v) if isinstance(v, str) else str(v)


def _fields(rows: list[tuple[str, Any]]) -> list:
    return ["fields", [[label, value if isinstance(value, str) else value_text(value)] for label, value in rows]]


def _column(header: str, no_wrap: bool = False, overflow: str = "ellipsis", one_line: bool = True) -> dict:
    return {"header": header, "no_wrap": no_wrap, "overflow": overflow, "one_line": one_line}


def _table(title: str, columns: list[dict], rows: list[list[str]], styled_title: bool = True) -> list:
    # styled_title: the title in rich's table-title style (a str title); else as plain text
    return ["table", {"title": title, "styled_title": styled_title, "columns": columns, "rows": rows}]


# Columns of ``list`` that may wrap at a narrow terminal; the others keep their values on one line.
WRAPPED = ("description", "members", "source", "declares", "on_digits", "on_text")
# A method card's facts that ``list methods --json`` gives as fields and the table in one column.
DECLARED = ("transfer", "single_architecture", "peer_data", "submodels", "model_family", "predictor", "refuses_faults")
# method_card.LIVE_MODEL, spelled here: an answer from the metadata index imports no method (nor torch).
LIVE_MODEL = "live model"


def _shape_text(v: Any) -> str:
    """An input shape as one word, ``1x8x8`` (a list would be a cell of one line per number)."""
    return ("x".join(map(str, v)) or "-") if isinstance(v, list) else fmt(v)  # []: set by the data


def _cell_text(v: Any) -> str:
    return "\n".join(terminal(x) for x in v) if isinstance(v, list) else fmt(v)


def _declares(row: dict[str, Any]) -> str:
    """A method's transfer data, one-architecture need, peer data, sub-models of one global model,
    its own default pool, evaluated predictor (where not the live model) and refused fault kinds, as
    one cell."""
    parts = [row["transfer"]] if row["transfer"] != "none" else []
    parts += ["one architecture"] if row["single_architecture"] else []
    parts += ["models trained on peers' data"] if row["peer_data"] else []
    parts += ["sub-models of one global model"] if row.get("submodels") else []
    parts += [f"default pool {row['model_family']}"] if row.get("model_family") else []
    parts += [f"evaluates the {row['predictor']}"] if row["predictor"] != LIVE_MODEL else []
    parts += [f"refuses {', '.join(row['refuses_faults'])}"] if row["refuses_faults"] else []
    return "; ".join(parts) or "-"


def _table_row(row: dict[str, Any]) -> dict[str, Any]:
    if not all(k in row for k in DECLARED):
        return row
    return {**{k: v for k, v in row.items() if k not in DECLARED}, "declares": _declares(row)}


# Fields of ``list``'s rows that --json always gives but a table or markdown shows only when --columns
# names them (they would crowd the default view; ``describe`` shows them).
ON_REQUEST = {"origin", "methods.version", "methods.presets", "tasks.defaults"}


def shown_by_default(kind: str, column: str) -> bool:
    return column not in ON_REQUEST and f"{kind}.{column}" not in ON_REQUEST


def _empty(v: Any) -> bool:
    return v is None or v == "" or (isinstance(v, (list, dict)) and not v)


def _filled(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """``columns`` less those no row fills (e.g. ``refuses_faults`` where no method refuses a fault
    kind): a default view shows no column empty in every row; --columns and --json still give it."""
    return [c for c in columns if any(c in r and not _empty(r[c]) for r in rows)] or columns[:1]


def select_columns(kind: str, rows: list[dict[str, Any]], columns: list[str]) -> list[dict[str, Any]]:
    """``rows`` with only ``columns``, in that order (``list --columns``); ConfigError, one line
    naming the known columns, for one no row has."""
    known = list(dict.fromkeys(c for row in rows for c in row))
    unknown = [c for c in columns if c not in known]
    if unknown or not columns:
        raise ConfigError(f"--columns: {', '.join(unknown) or 'none given'} is no column of {kind}; "
                          f"known: {', '.join(known)}")
    return [{c: row[c] for c in columns if c in row} for row in rows]


def list_view(kind: str, rows: list[dict[str, Any]], columns: list[str] | None = None) -> list:
    if columns is not None:
        rows = select_columns(kind, rows, columns)
    else:
        rows = [{c: v for c, v in row.items() if shown_by_default(kind, c)} for row in rows]
    rows = [_table_row(row) for row in rows]
    if columns is None:
        rows = [{c: row[c] for c in _filled(rows, list(row))} for row in rows]
    columns = list(rows[0].keys()) if rows else ["name"]
    return [_table(kind, [_column(c, no_wrap=c not in WRAPPED, overflow="fold" if c in WRAPPED else "ellipsis",
                                  one_line=c == "input") for c in columns],
                   [[_shape_text(row[c]) if c == "input" else _cell_text(row[c]) for c in columns] for row in rows])]


def _markdown_value(v: Any, column: str = "") -> str:
    if column == "presets":
        return presets_text(v)
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return _shape_text(v)  # an input shape, 1x8x8
    if isinstance(v, list):
        return "; ".join(map(str, v))
    if isinstance(v, dict) and column == "defaults":  # a task's protocol defaults, as --set-like pairs
        return ", ".join(f"{k}={x}" for k, x in v.items())
    if isinstance(v, dict):
        return "; ".join(f"{k}: {_shape_text(x)}" for k, x in v.items())
    return fmt(v)


def markdown_list(rows: list[dict[str, Any]], kind: str = "", columns: list[str] | None = None) -> str:
    """``hfl-bench list KIND --format markdown``: the rows of ``--json`` as a markdown table (the
    columns shown by default, or ``columns`` in their order), every cell escaped as plugin text."""
    if columns is not None:
        rows = select_columns(kind, rows, columns)
    else:
        columns = [c for c in (rows[0].keys() if rows else ["name"]) if shown_by_default(kind, c)]
        for row in rows:  # a column only some rows have (a task's modalities) goes last
            columns += [c for c in row if c not in columns and shown_by_default(kind, c)]
        columns = _filled(rows, columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(markdown_cell(_markdown_value(r[c], c)) if c in r else "" for c in columns) + " |"
              for r in rows]
    return "\n".join(lines) + "\n"


def params_view(method: str, params: list[dict[str, Any]]) -> list:
    """The hyperparameter table (``--set key=value``) of ``method``, or a line saying it has none."""
    if not params:
        return [["line", f"{method} has no hyperparameters"]]
    columns = [_column("hyperparameter", no_wrap=True), _column("type", no_wrap=True),
               _column("default", no_wrap=True), _column("help", one_line=False)]
    rows = [[str(p["name"]), str(p["type"]), value_text(p["default"]), str(p["help"])] for p in params]
    return [_table(f"{method} hyperparameters (--set key=value)", columns, rows, styled_title=False)]


FROM_DATA = "set from the data folder when it is loaded"


def presets_text(presets: dict[str, Any]) -> str:
    """A card's presets in one line, ``paper: optimizer=adam, pseudo_in_budget=false``, or the
    line saying the method has none (its defaults are the protocol's budget)."""
    if not presets:
        return "none"
    return "; ".join(f"{name}: " + ", ".join(f"{k}={value_text(v)}" for k, v in values.items())
                     for name, values in presets.items())


def _method_view(info: dict[str, Any]) -> list:
    refused = info["refuses_faults"]
    view = [_fields([("method", info["name"]), ("description", info["description"]),
                     ("version", info["version"]), ("fidelity", info["fidelity"]), ("topology", info["topology"]),
                     ("citation", info["citation"] or "-"), ("transfer", info["transfer"]),
                     ("needs a public set", info["needs_public"]),
                     ("single architecture", info["single_architecture"]),
                     ("models trained on peers' data", info["peer_data"]),
                     ("sub-models of one global model", info.get("submodels", False)),
                     ("default pool", info.get("pool") or "the task's"),
                     ("evaluated predictor", f"{info['predictor']} (at the default hyperparameters)"),
                     ("missing modalities", "runs" if info["missing_modalities"]
                      else f"refuses: {info['why_single_modality']}"),
                     ("token ids (text tasks)", f"refuses: {info['why_not_tokens']}" if info["why_not_tokens"]
                      else "runs"),
                     ("refuses faults", "; ".join(f"{kind}: {why}" for kind, why in refused.items()) or "none"),
                     ("presets", presets_text(info.get("presets") or {})),
                     ("origin", info["origin"])])]
    if info["notes"]:
        view.append(["heading", "notes (choices the suite made where the source leaves room):"])
        view += [["bullet", str(n)] for n in info["notes"]]
    changelog = info.get("changelog") or []  # an index written before the card had one: none
    if changelog:
        view.append(["heading", "changelog (what each version changed, oldest first):"])
        view += [["bullet", f"{e['version']}: {e['change']}"] for e in changelog]
    return view + params_view(info["name"], info["hyperparameters"])


def _task_view(info: dict[str, Any]) -> list:
    # A task that learns its classes and shape from its folder (imagefolder) registers neither.
    shape = "x".join(str(s) for s in info.get("input_shape", [])) or FROM_DATA
    classes = info.get("num_classes")
    view = [_fields([("task", info["name"]), ("description", info.get("description") or "-"),
                     ("version", info.get("version")), ("classes", FROM_DATA if classes is None else classes),
                     ("input shape", shape), ("source", info.get("source")),
                     ("citation", info.get("citation")), ("license", info.get("license")),
                     ("main score", info.get("main_score")), ("augmentation", info.get("augmentation")),
                     *([("modalities", ", ".join(f"{m['name']} {'x'.join(map(str, m['shape']))}"
                                                 for m in info["modalities"]))] if info.get("modalities") else []),
                     ("origin", info["origin"])])]
    defaults = info.get("defaults") or {}
    if defaults:
        view.append(_table("protocol defaults (flags override them)",
                           [_column("setting", no_wrap=True), _column("default")],
                           [[str(k), value_text(v)] for k, v in defaults.items()]))
    return view


def _pool_view(info: dict[str, Any]) -> list:
    return [_fields([("pool", info["name"]), ("description", info["description"] or "-"),
                     ("assignment", info["assignment"]), ("origin", info["origin"])]),
            _table("members", [_column(c) for c in ("#", "name", "model", "kwargs")],
                   [[str(i), str(m["name"]), str(m["model"]), str(m["kwargs"] or "-")]
                    for i, m in enumerate(info["members"])])]


def _documented_view(info: dict[str, Any]) -> list:
    return [_fields([(info["kind"], info["name"]), *([("version", info["version"])] if "version" in info else []),
                     ("signature", info["signature"] or "-"), ("origin", info["origin"])]),
            ["text", info["description"] or "(no documentation)"]]


VIEWS = {"methods": _method_view, "tasks": _task_view, "pools": _pool_view,
         "partitioners": _documented_view, "aggregators": _documented_view}


def _as_json(obj: Any) -> Any:
    """``obj`` as ``--json`` prints it (``emit_json``: unknown types as ``str``), as JSON data."""
    return json.loads(json.dumps(obj, default=str))


def list_entry_live(kind: str, task: str) -> dict[str, Any]:
    rows = list_rows(kind, task)
    return {"json": _as_json(rows), "view": list_view(kind, rows)}


def describe_entry_live(kind: str, name: str) -> dict[str, Any]:
    info = DESCRIBERS[kind](name, REGISTRIES[kind].get(name))
    info["origin"] = REGISTRIES[kind].origin(name)
    return {"json": _as_json(info), "view": VIEWS[kind](info)}


# ----------------------------------------------------------------------------- printing


def render(console: Console, view: list) -> None:
    """Print a view (its strings as plain text: never markup, no control characters)."""
    for tag, body in view:
        if tag == "fields":
            for label, value in body:
                console.print(Text.assemble((f"{terminal(label)}: ", "bold"), plain(value, one_line=False)),
                              highlight=False)
        elif tag == "heading":
            console.print(plain(body, style="bold"))
        elif tag == "bullet":
            console.print(Text.assemble("  - ", plain(body, one_line=False)), highlight=False)
        elif tag == "line":
            console.print(plain(body), highlight=False)
        elif tag == "text":
            console.print(plain(body, one_line=False), highlight=False)
        elif tag == "table":
            console.print(_rich_table(body))


def _rich_table(spec: dict[str, Any]) -> Table:
    title = plain(spec["title"], style="table.title" if spec["styled_title"] else None)
    t = Table(title=title)
    for c in spec["columns"]:
        t.add_column(plain(c["header"]), no_wrap=c["no_wrap"], overflow=c["overflow"])
    for row in spec["rows"]:
        t.add_row(*[plain(v, one_line=c["one_line"]) for v, c in zip(row, spec["columns"])])
    return t


# ----------------------------------------------------------------------------- checking stored entries


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _valid_table(spec: Any) -> bool:
    if not (isinstance(spec, dict) and isinstance(spec.get("title"), str)
            and isinstance(spec.get("styled_title"), bool) and isinstance(spec.get("columns"), list)
            and isinstance(spec.get("rows"), list)):
        return False
    for c in spec["columns"]:
        if not (isinstance(c, dict) and isinstance(c.get("header"), str) and isinstance(c.get("no_wrap"), bool)
                and c.get("overflow") in ("fold", "ellipsis") and isinstance(c.get("one_line"), bool)):
            return False
    return all(_strs(row) and len(row) == len(spec["columns"]) for row in spec["rows"])


def valid_view(view: Any) -> bool:
    if not isinstance(view, list):
        return False
    for block in view:
        if not (isinstance(block, list) and len(block) == 2 and isinstance(block[0], str)):
            return False
        tag, body = block
        if tag == "fields":
            if not (isinstance(body, list) and all(_strs(f) and len(f) == 2 for f in body)):
                return False
        elif tag in ("heading", "bullet", "line", "text"):
            if not isinstance(body, str):
                return False
        elif tag != "table" or not _valid_table(body):
            return False
    return True


def _checked(entry: Any, json_type: type) -> dict[str, Any]:
    """A stored entry, or StoredError for a stored user error; Stale when malformed."""
    if isinstance(entry, dict) and set(entry) == {"error"} and isinstance(entry["error"], str):
        raise StoredError(entry["error"])
    if (isinstance(entry, dict) and set(entry) == {"json", "view"} and isinstance(entry["json"], json_type)
            and valid_view(entry["view"])):
        return entry
    raise Stale()


# ----------------------------------------------------------------------------- catalogs


class Live:
    """Answers from the imported registries (every registry discovered first, in ``KINDS`` order,
    as for the index; a plugin that fails to load is skipped with a warning, ``registry``)."""

    def __init__(self) -> None:
        try:
            for kind in KINDS:
                REGISTRIES[kind].discover()
        except Exception:  # noqa: BLE001 - raised again, as before, by the kind that needs it
            pass

    def names(self, kind: str) -> list[str]:
        return REGISTRIES[kind].names()

    def unknown_message(self, kind: str, name: str) -> str:
        return REGISTRIES[kind].unknown_message(name)

    def list_entry(self, kind: str, task: str) -> dict[str, Any]:
        return list_entry_live(kind, task)

    def describe_entry(self, kind: str, name: str) -> dict[str, Any]:
        return describe_entry_live(kind, name)


class Indexed:
    """Answers from index data (checked as used: Stale when something is missing or malformed)."""

    def __init__(self, data: dict[str, Any]):
        names = data.get("names")
        if not (isinstance(names, dict) and all(_strs(names.get(k)) for k in KINDS)
                and all(isinstance(data.get(part), dict) for part in ("list", "pools", "describe"))):
            raise Stale()
        self.data = data
        self._names = {k: names[k] for k in KINDS}

    def names(self, kind: str) -> list[str]:
        return self._names[kind]

    def unknown_message(self, kind: str, name: str) -> str:
        return unknown_message(REGISTRIES[kind].kind, name, self._names[kind])

    def pool_tasks(self) -> list[str]:
        return [t for t in self.data["pools"] if isinstance(t, str)]

    def list_entry(self, kind: str, task: str) -> dict[str, Any]:
        if kind == "pools":
            if task not in self._names["tasks"]:  # what ``data.get_task`` raises
                raise StoredError(unknown_message(REGISTRIES["tasks"].kind, task, self._names["tasks"]))
            if task not in self.data["pools"]:
                raise Stale(pool_task=task)
            return _checked(self.data["pools"][task], list)
        return _checked(self.data["list"].get(kind), list)

    def describe_entry(self, kind: str, name: str) -> dict[str, Any]:
        by_name = self.data["describe"].get(kind)
        if not isinstance(by_name, dict):
            raise Stale()
        return _checked(by_name.get(name), dict)


def _entry(make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return make()
    except USER_ERRORS as e:  # the message the live command would fail with
        return {"error": str(e)}


def build(pool_tasks: set[str]) -> dict[str, Any]:
    """The index data, from the registries (discovered here): every answer ``list`` and
    ``describe`` can give, pools sized for ``DEFAULT_POOL_TASK`` and ``pool_tasks``."""
    for kind in KINDS:
        REGISTRIES[kind].discover()
    names = {kind: REGISTRIES[kind].names() for kind in KINDS}
    data = {
        "names": names,
        "list": {kind: _entry(lambda kind=kind: list_entry_live(kind, DEFAULT_POOL_TASK))
                 for kind in KINDS if kind != "pools"},
        "pools": {},
        "describe": {kind: {name: _entry(lambda kind=kind, name=name: describe_entry_live(kind, name))
                            for name in names[kind]} for kind in KINDS},
    }
    for task in sorted({DEFAULT_POOL_TASK, *pool_tasks}):
        add_pools(data, task)
    return _as_json(data)


def add_pools(data: dict[str, Any], task: str) -> None:
    """Add ``list pools --task TASK`` to index data built in this process (a known task only)."""
    if task in data["names"]["tasks"]:
        data["pools"][task] = _as_json(_entry(lambda: list_entry_live("pools", task)))


def _indexed() -> tuple[str | None, Indexed | None]:
    """The key of now (None: no index to use in this process) and the index stored under it."""
    if not metadata_index.enabled() or not all(r.untouched() for r in REGISTRIES.values()):
        return None, None
    key = metadata_index.current_key()
    if key is None:
        return None, None
    data = metadata_index.read(key)
    try:
        return key, (Indexed(data) if data is not None else None)
    except Stale:
        return key, None


def answer(question: Callable[[Any], R]) -> R:
    """``question(catalog)``, asked of the index when its key matches, else of a freshly built
    index (written for the next call), else of the live registries. ``question`` must only read:
    it may be asked again (a Stale answer from the index is dropped)."""
    key, indexed = _indexed()
    pool_tasks: set[str] = set()
    if indexed is not None:
        try:
            return question(indexed)
        except Stale as e:
            pool_tasks = set(indexed.pool_tasks()) | ({e.pool_task} if e.pool_task else set())
    if key is None:
        return question(Live())
    try:
        data = build(pool_tasks)
    except Exception:  # noqa: BLE001 - a plugin that fails: the live answer says how, as before
        return question(Live())
    try:
        return _ask_built(question, data)
    except Stale:  # not expected of data built here
        return question(Live())
    finally:  # also when the answer is a user error: the index holds it
        if not skipped_entry_points():  # else each call imports again, so warns again about the plugin
            metadata_index.write(key, data)


def _ask_built(question: Callable[[Any], R], data: dict[str, Any]) -> R:
    try:
        return question(Indexed(data))
    except Stale as e:  # pools for a task not asked before: add them
        if not e.pool_task or e.pool_task in data["pools"]:
            raise
        add_pools(data, e.pool_task)
        return question(Indexed(data))
