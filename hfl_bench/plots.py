"""Figures drawn from run records: ``hfl-bench plot KIND RECORDS... --out DIR``.

Kinds: ``curves`` (global accuracy per round, the CRAD paper's Fig. 3), ``per-class`` (per-class
global accuracy, classes ordered from abundant to rare training support, Fig. 2), ``per-arch``
(global accuracy per architecture) and ``bytes`` (accuracy against bytes sent per client per
round). Seeds of one setting are grouped by (method, config hash) and drawn as their mean with a
min-max band or error bar. One PNG per kind and task (records of different tasks are never mixed),
each with a caption naming the records it drew and a ``<png>.sources.json`` sidecar listing them.
Only reproduced records with status ``ok`` are drawn; every other one is reported with a reason.

Matplotlib is imported only when drawing, so ``hfl-bench --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import typer

KINDS = ("curves", "per-class", "per-arch", "bytes")
# Record ids shown in a figure's caption; the sidecar always lists them all.
CAPTION_MAX_IDS = 8
BAND_NOTE = "mean over seeds; bands / error bars span min to max over seeds"


class PlotError(ValueError):
    """Bad plot input; the message is meant for the user."""


@dataclass
class Loaded:
    """One record file that was read, with the fields the plots group and label by."""

    path: Path
    record: dict[str, Any] = field(repr=False)

    @property
    def record_id(self) -> str:
        return str(self.record.get("record_id"))

    @property
    def task(self) -> str:
        return str((self.record.get("task") or {}).get("name"))

    @property
    def method(self) -> str:
        return str((self.record.get("method") or {}).get("name"))

    @property
    def config_hash(self) -> str:
        return str(self.record.get("config_hash"))

    @property
    def seed(self) -> Any:
        return (self.record.get("config") or {}).get("seed")

    @property
    def partition_hash(self) -> Any:
        return (self.record.get("partition") or {}).get("hash")

    def source_entry(self) -> dict[str, Any]:
        return {"file": str(self.path), "record_id": self.record_id, "method": self.method,
                "config_hash": self.config_hash, "seed": self.seed, "partition_hash": self.partition_hash}


@dataclass
class Skipped:
    """A file or record left out of a plot, and why."""

    path: str
    reason: str
    task: Optional[str] = None  # None: not a record, so it belongs to no task's plot

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "reason": self.reason}


@dataclass
class Group:
    """The seeds of one setting of one method: records sharing (method, config hash)."""

    method: str
    config_hash: str
    records: list[Loaded]
    label: str = ""

    @property
    def seeds(self) -> list[Any]:
        return sorted((r.seed for r in self.records), key=_seed_order)


def _seed_order(seed: Any) -> tuple:
    return (0, seed, "") if isinstance(seed, (int, float)) else (1, 0, str(seed))


@dataclass
class Written:
    """One figure written: its PNG, its sources sidecar and what it drew."""

    kind: str
    task: str
    png: Path
    sources: Path
    drawn: list[Loaded]
    groups: list[Group]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "task": self.task, "png": str(self.png), "sources": str(self.sources),
                "n_records": len(self.drawn), "n_groups": len(self.groups)}


# ----------------------------------------------------------------------------- finding and reading records


def find_record_files(inputs: list[Path]) -> list[Path]:
    """The JSON files named or found (recursively) under the inputs, each once, in a stable order."""
    files: list[Path] = []
    for p in inputs:
        if p.is_dir():
            files += sorted(q for q in p.rglob("*.json") if q.is_file())
        elif p.is_file():
            files.append(p)
        else:
            raise PlotError(f"no such file or folder: {p}")
    seen: set[Path] = set()
    unique = []
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append(f)
    return unique


def read_records(files: list[Path]) -> tuple[list[Loaded], list[Skipped]]:
    """Read every file; keep hfl-bench records, report the rest (non-records, duplicates)."""
    loaded: list[Loaded] = []
    skipped: list[Skipped] = []
    ids: dict[str, Path] = {}
    for f in files:
        try:
            record = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            skipped.append(Skipped(str(f), f"not readable JSON ({type(e).__name__})"))
            continue
        if not isinstance(record, dict) or "schema_version" not in record or "record_id" not in record:
            skipped.append(Skipped(str(f), "not an hfl-bench record"))
            continue
        rec = Loaded(f, record)
        if rec.record_id in ids:  # the same run copied twice would count one seed twice
            skipped.append(Skipped(str(f), f"duplicate record_id {rec.record_id} (also {ids[rec.record_id]})", rec.task))
            continue
        ids[rec.record_id] = f
        loaded.append(rec)
    return loaded, skipped


def drawable(records: list[Loaded]) -> tuple[list[Loaded], list[Skipped]]:
    """Only reproduced runs that finished: a failed run's numbers would mislead, and published
    figures are cited, never averaged in with runs."""
    keep, skipped = [], []
    for r in records:
        status = r.record.get("status")
        kind = (r.record.get("source") or {}).get("kind")
        if status != "ok":
            skipped.append(Skipped(str(r.path), f"status {status!r}, not 'ok'", r.task))
        elif kind != "reproduced":
            skipped.append(Skipped(str(r.path), f"source {kind!r}: plots draw reproduced runs only", r.task))
        else:
            keep.append(r)
    return keep, skipped


# ----------------------------------------------------------------------------- what each kind needs


def _metrics(r: Loaded) -> dict[str, Any]:
    return r.record.get("metrics") or {}


def _curve_missing(r: Loaded) -> Optional[str]:
    history = r.record.get("history") or []
    if not any(isinstance(h, dict) and h.get("global_acc") is not None for h in history):
        return "no global accuracy in history"
    return None


def _per_class_missing(r: Loaded) -> Optional[str]:
    accs = _metrics(r).get("per_class_global_acc")
    counts = (r.record.get("partition") or {}).get("train_counts")
    if not accs or not counts:
        return "no per_class_global_acc or partition.train_counts"
    if any(len(row) != len(accs) for row in counts):
        return "train_counts and per_class_global_acc disagree on the number of classes"
    return None


def _per_arch_missing(r: Loaded) -> Optional[str]:
    return None if _metrics(r).get("per_arch_global_acc") else "no per_arch_global_acc"


def _bytes_missing(r: Loaded) -> Optional[str]:
    if _metrics(r).get("global_acc") is None:
        return "no metrics.global_acc"
    if (r.record.get("cost") or {}).get("bytes_sent_per_client_per_round") is None:
        return "no cost.bytes_sent_per_client_per_round"
    return None


MISSING: dict[str, Callable[[Loaded], Optional[str]]] = {
    "curves": _curve_missing, "per-class": _per_class_missing, "per-arch": _per_arch_missing, "bytes": _bytes_missing,
}


# ----------------------------------------------------------------------------- grouping and labels

# Config fields that say nothing about the setting (the same as the config hash leaves out).
_NOT_SETTING = {"seed", "device", "data_dir", "download", "out", "exec", "eval_every", "vmap", "lockstep", "method", "method_params"}


def group_seeds(records: list[Loaded]) -> list[Group]:
    """Group seeds of one setting. The config hash already excludes the seed; the partition hash
    is not part of the key because the partition is drawn from the seed, so it differs per seed."""
    groups: dict[tuple[str, str], Group] = {}
    for r in records:
        key = (r.method, r.config_hash)
        groups.setdefault(key, Group(r.method, r.config_hash, []))
        groups[key].records.append(r)
    ordered = sorted(groups.values(), key=lambda g: (g.method, g.config_hash))
    for g in ordered:
        g.records.sort(key=lambda r: _seed_order(r.seed))
    _label(ordered)
    return ordered


def _setting(r: Loaded) -> dict[str, Any]:
    cfg = {k: v for k, v in (r.record.get("config") or {}).items() if k not in _NOT_SETTING}
    hparams = (r.record.get("method") or {}).get("hparams") or {}
    return cfg | {f"{k}": v for k, v in hparams.items() if k not in cfg}


def _label(groups: list[Group]) -> None:
    """Method name; where one method has several settings, add the settings that differ."""
    by_method: dict[str, list[Group]] = {}
    for g in groups:
        by_method.setdefault(g.method, []).append(g)
    for method, gs in by_method.items():
        for g in gs:
            g.label = f"{method} (n={len(g.records)})"
        if len(gs) < 2:
            continue
        settings = [_setting(g.records[0]) for g in gs]
        keys = sorted({k for s in settings for k in s})
        differing = [k for k in keys if len({json.dumps(s.get(k), sort_keys=True, default=str) for s in settings}) > 1]
        for g, s in zip(gs, settings):
            what = ", ".join(f"{k}={s.get(k)}" for k in differing[:3]) or f"#{g.config_hash[:8]}"
            g.label = f"{method} {what} (n={len(g.records)})"


def setting_summary(groups: list[Group]) -> str:
    """The protocol settings all drawn runs share, for the title; 'mixed' where they differ."""
    def common(key: str) -> Any:
        values = {json.dumps((r.record.get("config") or {}).get(key), default=str) for g in groups for r in g.records}
        return json.loads(values.pop()) if len(values) == 1 else "mixed"

    parts = [f"pool {common('pool')}"]
    scheme = common("partition")
    if scheme == "dirichlet":
        parts.append(f"dirichlet alpha={common('alpha')}")
    elif scheme == "classes":
        parts.append(f"classes k={common('classes_per_client')}")
    else:
        parts.append(f"partition {scheme}")
    parts += [f"N={common('clients')}", f"R={common('rounds')}"]
    return ", ".join(str(p) for p in parts)


def caption(task: str, groups: list[Group], sources_name: str) -> str:
    """The footnote every figure carries: how many records, which task, which runs."""
    drawn = [r for g in groups for r in g.records]
    settings = "; ".join(f"{g.method}#{g.config_hash[:8]} seeds {','.join(map(str, g.seeds))}" for g in groups)
    ids = [r.record_id for r in drawn]
    shown = ", ".join(ids[:CAPTION_MAX_IDS])
    if len(ids) > CAPTION_MAX_IDS:
        shown += f", ... +{len(ids) - CAPTION_MAX_IDS} more"
    text = (f"Drawn from {len(drawn)} records (status ok) of task {task}: {settings}. "
            f"Record ids: {shown}. All files: {sources_name}. {BAND_NOTE.capitalize()}.")
    return textwrap.fill(text, width=170)


# ----------------------------------------------------------------------------- drawing


def _colors(groups: list[Group]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(groups) <= 10 else "tab20"]
    return {g.label: cmap(i % cmap.N) for i, g in enumerate(groups)}


def _stats(rows: list[list[float]]):
    """Mean, min and max over seeds (rows), ignoring NaN; an all-NaN column (an architecture a
    method's pool lacks) stays NaN, which matplotlib leaves out, without a warning."""
    import warnings

    import numpy as np

    a = np.asarray(rows, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(a, axis=0), np.nanmin(a, axis=0), np.nanmax(a, axis=0)


def draw_curves(ax, groups: list[Group], colors) -> dict[str, Any]:
    """Global accuracy per round. A group is drawn at the rounds where all its seeds measured the
    global test (with --eval-every k the extra best-validation rounds differ between seeds)."""
    for g in groups:
        series = [{h["round"]: h["global_acc"] for h in r.record["history"] if h.get("global_acc") is not None}
                  for r in g.records]
        rounds = sorted(set.intersection(*(set(s) for s in series))) or sorted(set().union(*series))
        rows = [[s.get(rnd, float("nan")) for rnd in rounds] for s in series]
        mean, lo, hi = _stats(rows)
        ax.plot(rounds, mean, color=colors[g.label], label=g.label, linewidth=1.2)
        if len(g.records) > 1:
            ax.fill_between(rounds, lo, hi, color=colors[g.label], alpha=0.15, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel("global accuracy (%)")
    return {}


def class_support(records: list[Loaded]):
    """Training samples of each class summed over all clients, averaged over the drawn records
    (each seed draws its own partition, so the totals may differ slightly)."""
    import numpy as np

    totals = [np.asarray(r.record["partition"]["train_counts"], dtype=float).sum(axis=0) for r in records]
    return np.mean(totals, axis=0)


def draw_per_class(ax, groups: list[Group], colors) -> dict[str, Any]:
    import numpy as np

    drawn = [r for g in groups for r in g.records]
    support = class_support(drawn)
    order = np.argsort(-support, kind="stable")  # abundant to rare, ties by class index
    x = np.arange(len(order))
    for g in groups:
        mean, lo, hi = _stats([r.record["metrics"]["per_class_global_acc"] for r in g.records])
        ax.plot(x, mean[order], marker="o", markersize=3, color=colors[g.label], label=g.label, linewidth=1.2)
        if len(g.records) > 1:
            ax.fill_between(x, lo[order], hi[order], color=colors[g.label], alpha=0.12, linewidth=0)
    many = len(order) > 40  # e.g. CIFAR-100: label every 5th class
    ticks = x[::5] if many else x
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{order[i]} ({support[order[i]]:.0f})" for i in ticks],
                       rotation=90 if len(order) > 12 else 0, fontsize=7 if len(order) > 12 else 8)
    ax.set_xlabel("class (training samples over all clients), abundant to rare")
    ax.set_ylabel("global accuracy (%)")
    return {"class_order": [int(c) for c in order], "class_support": [round(float(v), 2) for v in support]}


def draw_per_arch(ax, groups: list[Group], colors) -> dict[str, Any]:
    import numpy as np

    archs: list[str] = []  # in the order the metrics list them (the pool's order)
    for r in (r for g in groups for r in g.records):
        archs += [a for a in r.record["metrics"]["per_arch_global_acc"] if a not in archs]
    width = 0.8 / len(groups)
    x = np.arange(len(archs))
    for i, g in enumerate(groups):
        mean, lo, hi = _stats([[r.record["metrics"]["per_arch_global_acc"].get(a, np.nan) for a in archs]
                               for r in g.records])
        pos = x - 0.4 + width * (i + 0.5)
        ax.bar(pos, mean, width, color=colors[g.label], label=g.label)
        if len(g.records) > 1:
            ax.errorbar(pos, mean, yerr=[mean - lo, hi - mean], fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
    ax.set_xticks(x)
    ax.set_xticklabels(archs)
    ax.set_xlabel("architecture")
    ax.set_ylabel("global accuracy (%)")
    return {"architectures": archs}


def draw_bytes(ax, groups: list[Group], colors) -> dict[str, Any]:
    """Selected-round global accuracy against bytes sent per client per round (log x). A method
    that sends nothing (local training) cannot sit on a log axis: it is a dashed reference line."""
    any_point = False
    reference_lines = []
    for g in groups:
        xs, xlo, xhi = _stats([[r.record["cost"]["bytes_sent_per_client_per_round"]] for r in g.records])
        ys, ylo, yhi = _stats([[r.record["metrics"]["global_acc"]] for r in g.records])
        if xs[0] <= 0:
            ax.axhline(ys[0], color=colors[g.label], linestyle="--", linewidth=1, label=f"{g.label}, 0 bytes")
            reference_lines.append(g.label)
            continue
        any_point = True
        ax.errorbar(xs, ys, xerr=[xs - xlo, xhi - xs], yerr=[ys - ylo, yhi - ys], fmt="o", color=colors[g.label],
                    capsize=3, label=g.label)
        ax.annotate(g.method, (xs[0], ys[0]), textcoords="offset points", xytext=(5, 4), fontsize=7)
    ax.set_xscale("log")
    if not any_point:
        ax.set_xlim(1, 10)
    ax.set_xlabel("bytes sent per client per round (log scale)")
    ax.set_ylabel("selected-round global accuracy (%)")
    ax.grid(True, which="both", alpha=0.2)
    return {"zero_bytes_reference_lines": reference_lines}


DRAW = {"curves": draw_curves, "per-class": draw_per_class, "per-arch": draw_per_arch, "bytes": draw_bytes}
TITLES = {
    "curves": "Global accuracy per round",
    "per-class": "Per-class global accuracy (selected round)",
    "per-arch": "Global accuracy per architecture (selected round)",
    "bytes": "Accuracy against communication",
}


def render(kind: str, task: str, groups: list[Group], png: Path) -> tuple[str, dict[str, Any]]:
    """Draw one figure and write it atomically; returns its caption and the kind's details
    (class order, architectures, ...) for the sidecar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6.5), layout="constrained")
    FigureCanvasAgg(fig)  # Agg, no pyplot: nothing global, nothing to close
    ax = fig.add_subplot()
    colors = _colors(groups)
    details = DRAW[kind](ax, groups, colors)
    if kind != "bytes":
        ax.grid(True, alpha=0.2)
    ax.set_title(f"{TITLES[kind]}: {task} ({setting_summary(groups)})", fontsize=11)
    fig.legend(loc="outside right upper", fontsize=8, title="method (n seeds)", title_fontsize=8)
    text = caption(task, groups, f"{png.name}.sources.json")
    fig.supxlabel(text, fontsize=6.5, x=0.005, ha="left", multialignment="left")
    save_png_atomic(fig, png)
    return text, details


def save_png_atomic(fig, path: Path) -> None:
    """Save to a temporary file in the same folder, then rename: never a half-written PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=110)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- one kind, one task


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def plot_task(kind: str, task: str, records: list[Loaded], skipped: list[Skipped], out_dir: Path
              ) -> tuple[Optional[Written], list[Skipped]]:
    """One figure of one kind for one task's drawable records, with its sources sidecar.
    Returns (None, reasons) when no record has what this kind needs."""
    from hfl_bench.records import write_atomic

    usable, lacking = [], []
    for r in records:
        reason = MISSING[kind](r)
        if reason:
            lacking.append(Skipped(str(r.path), f"{kind}: {reason}", task))
        else:
            usable.append(r)
    if not usable:
        return None, lacking
    groups = group_seeds(usable)
    png = out_dir / f"{kind}__{_safe(task)}.png"
    text, details = render(kind, task, groups, png)
    drawn = [r for g in groups for r in g.records]
    task_skipped = [s for s in skipped if s.task == task] + lacking
    sources = png.with_name(png.name + ".sources.json")
    write_atomic(sources, json.dumps({
        "png": png.name,
        "kind": kind,
        "task": task,
        "n_records": len(drawn),
        "records": [r.source_entry() for r in drawn],
        "groups": [{"label": g.label, "method": g.method, "config_hash": g.config_hash, "seeds": g.seeds,
                    "record_ids": [r.record_id for r in g.records]} for g in groups],
        "skipped": [s.as_dict() for s in task_skipped],
        "statistics": BAND_NOTE,
        "caption": text,
        "details": details,
    }, indent=1, default=str) + "\n")
    return Written(kind, task, png, sources, drawn, groups), lacking


def make_plots(kind: str, inputs: list[Path], out_dir: Path, tasks: list[str] = (), methods: list[str] = ()
               ) -> tuple[list[Written], list[Skipped]]:
    """The library entry point behind ``hfl-bench plot``: one PNG (+ sidecar) per kind and task.
    Raises PlotError for bad input: an unknown kind, no records found, nothing to draw."""
    if kind != "all" and kind not in KINDS:
        raise PlotError(f"unknown plot kind {kind!r}; choose one of: {', '.join(KINDS)}, all")
    kinds = list(KINDS) if kind == "all" else [kind]
    files = find_record_files(list(inputs))
    found, skipped = read_records(files)
    if not found:
        raise PlotError(f"no hfl-bench records found in {', '.join(map(str, inputs))} ({len(files)} JSON file(s) read)")
    selected = [r for r in found if (not tasks or r.task in tasks) and (not methods or r.method in methods)]
    if not selected:
        raise PlotError(f"none of the {len(found)} records match the filters"
                        f"{' --task ' + ','.join(tasks) if tasks else ''}{' --method ' + ','.join(methods) if methods else ''}")
    ok, not_ok = drawable(selected)
    skipped += not_ok
    written: list[Written] = []
    for task in sorted({r.task for r in ok}):
        task_records = [r for r in ok if r.task == task]
        for k in kinds:
            fig, lacking = plot_task(k, task, task_records, skipped, out_dir)
            skipped += lacking
            if fig:
                written.append(fig)
    if not written:
        reasons = "; ".join(sorted({s.reason for s in skipped if s.task is not None})) or "no drawable records"
        raise PlotError(f"nothing to draw from {len(selected)} record(s): {reasons}")
    return written, skipped


# ----------------------------------------------------------------------------- CLI (registered in cli.py)


def plot_command(
    kind: str = typer.Argument(..., help="curves, per-class, per-arch, bytes or all."),
    inputs: list[Path] = typer.Argument(..., metavar="RECORDS...",
                                        help="Record files or folders (searched recursively for *.json)."),
    out_dir: Path = typer.Option(Path("plots"), "--out", help="Folder for the PNGs and their sidecars."),
    tasks: list[str] = typer.Option([], "--task", "-t", help="Only records of this task (repeatable)."),
    methods: list[str] = typer.Option([], "--method", "-m", help="Only records of this method (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written files (and skipped records) as JSON."),
):
    """Draw figures from records: one PNG per kind and task, named KIND__TASK.png, each with a
    caption naming its records and a KIND__TASK.png.sources.json sidecar listing them."""
    from rich.table import Table

    from hfl_bench.cli import emit_json, fail, out

    try:
        written, skipped = make_plots(kind, inputs, out_dir, tasks, methods)
    except PlotError as e:
        fail(str(e))
    if as_json:
        emit_json({"written": [w.as_dict() for w in written], "skipped": [s.as_dict() for s in skipped]})
        return
    t = Table(title="plots written")
    for col in ("kind", "task", "png", "records", "settings"):
        t.add_column(col, overflow="fold")  # paths whole, not cut with an ellipsis
    for w in written:
        t.add_row(w.kind, w.task, str(w.png), str(len(w.drawn)), str(len(w.groups)))
    out.print(t)
    if skipped:
        s = Table(title="skipped")
        s.add_column("file", overflow="fold")
        s.add_column("reason", overflow="fold")
        for item in skipped:
            s.add_row(item.path, item.reason)
        out.print(s)
