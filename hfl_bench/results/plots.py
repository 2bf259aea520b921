"""Figures drawn from run records: one PNG per kind and task, with its sources sidecar.

Kinds: ``curves`` (global accuracy per round, the CRAD paper's Fig. 3), ``per-class`` (per-class
global accuracy, classes ordered from abundant to rare training support, Fig. 2), ``per-arch``
(global accuracy per architecture), ``bytes`` (accuracy against bytes sent per client per
round; curves and bytes draw each record's headline: the honest clients' under faults, the
recipients' in a multimodal run, said on the y axis; per-class and per-arch are over all
clients), ``seen-unseen`` (each client's global accuracy on the classes it holds in training and on
those it lacks, over all clients and per architecture, from ``metrics.seen_unseen``: record schema
1.6 on) and ``robustness`` (honest clients' global accuracy against fault strength, one panel per
fault kind, the fault-free baseline at x = 0; x per kind: ``robustness``; drawn by ``all`` only
when records run with faults are present). Seeds of one setting are grouped by the leaderboard's
rule (``grouping``: config hash on
the same data, the newest record of a seed run twice) and drawn as their mean with a min-max band
or error bar. One PNG per kind, task and setting section (``PlotSection``: the transfer data, one
architecture or a heterogeneous pool, the budget class; records of different tasks or sections are
never mixed; the data-free, heterogeneous, protocol-budget section keeps the plain name
``<kind>__<task>.png``, another gets its label appended), each with a caption naming the records it
drew and a ``<png>.sources.json`` sidecar listing them. Only valid
(``validation``) reproduced records with status ``ok`` are drawn; every other one is reported
with a reason. Record text is drawn as itself (``text.mpl_text``: no control characters, ``$``
is not math).

Matplotlib is imported only when drawing, so ``hfl-bench --help`` stays fast.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from hfl_bench.config import LEGACY_FIELDS, NON_SEMANTIC
from hfl_bench.paths import write_atomic
from hfl_bench.results import robustness
from hfl_bench.results.figures import FINAL, headline_basis, headline_value
from hfl_bench.results.grouping import SeedGroup, data_identity, group_seeds
from hfl_bench.results.headline import FALLBACK_MARK, basis_of
from hfl_bench.results.loading import SIDECAR_SUFFIX, Loaded, ResultsError, Skipped, read_records, record_files
from hfl_bench.results.setting import (
    PROTOCOL_BUDGET,
    Stat,
    budget_class,
    headline_of,
    optimizer_setting,
    peer_data_setting,
    section_label,
    section_order,
    section_reasons,
    single_architecture,
    submodels_setting,
    transfer_setting,
)
from hfl_bench.results.text import mpl_text, terminal
from hfl_bench.results.validation import valid_records

KINDS = ("curves", "per-class", "per-arch", "seen-unseen", "bytes", "robustness", "cd")
FAULT_KINDS_ONLY = ("robustness",)  # drawn by ``all`` only when some record ran with faults
ACROSS_TASKS = ("cd",)  # one figure per setting section across tasks (``cd``), never drawn by ``all``
# Record ids shown in a figure's caption; the sidecar always lists them all.
CAPTION_MAX_IDS = 8
BAND_NOTE = "mean over seeds; bands / error bars span min to max over seeds"
# Config fields that say nothing about the setting, left out of a series' label.
NOT_SETTING = {*NON_SEMANTIC, *LEGACY_FIELDS, "method", "method_params"}


class PlotError(ResultsError):
    """Bad plot input; the message is meant for the user."""


@dataclass
class DrawnSetting:
    """The drawn seeds of one setting: a seed group's ok records that have what a kind needs."""

    method: str
    config_hash: str
    group_id: str  # the seed group's: the config hash, "@<method version>", "/<partition hash>" if split by it
    records: list[Loaded]
    label: str = ""

    @property
    def seeds(self) -> list[Any]:
        return [r.seed for r in self.records]

    @property
    def short_id(self) -> str:
        """Hashes shortened to 8 characters, the method version kept (``1a2b3c4d@1.0/5e6f7a8b``)."""
        head, _, version = self.group_id.split("/")[0].partition("@")
        parts = [head[:8] + (f"@{version}" if version else "")] + [p[:8] for p in self.group_id.split("/")[1:]]
        return "/".join(parts)


@dataclass
class Written:
    """One figure written: its PNG, its sources sidecar and what it drew."""

    kind: str
    task: str
    png: Path
    sources: Path
    drawn: list[Loaded]
    groups: list[DrawnSetting]
    section: str = ""  # the setting section drawn (``PlotSection``)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "task": self.task, "section": self.section, "png": str(self.png),
                "sources": str(self.sources), "n_records": len(self.drawn), "n_groups": len(self.groups)}


def source_entry(r: Loaded) -> dict[str, Any]:
    return {"file": str(r.path), "record_id": r.record_id, "method": r.method,
            "config_hash": str(r.config_hash), "seed": r.seed, "partition_hash": r.partition_hash}


# ----------------------------------------------------------------------------- which records are drawn


def with_record_id(loaded: Iterable[Loaded]) -> tuple[list[Loaded], list[Skipped]]:
    """Records with a record id (a figure's caption names its records by it)."""
    keep, skipped = [], []
    for r in loaded:
        if "record_id" in r.record:
            keep.append(r)
        else:
            skipped.append(Skipped(str(r.path), "not an hfl-bench record"))
    return keep, skipped


def drawable_groups(records: list[Loaded]) -> tuple[list[SeedGroup], list[Skipped]]:
    """The seed groups with an ok seed (``grouping``'s rule, the leaderboard's), and every record
    that is not drawn, with why: a failed run's numbers would mislead, published figures are
    cited, never averaged in with runs, and a seed counts once."""
    groups = group_seeds(records)
    drawn = {id(r) for g in groups for r in g.ok}
    kept = {id(d): g.kept_for(d) for g in groups for d in g.duplicates}
    skipped = [Skipped(str(r.path), _why_not_drawn(r, kept.get(id(r))), task=r.task)
               for r in records if id(r) not in drawn]
    return [g for g in groups if g.ok], skipped


def _why_not_drawn(r: Loaded, kept: Optional[Loaded]) -> str:
    if r.status != "ok":
        return f"status {r.status!r}, not 'ok'"
    if r.kind != "reproduced":
        return f"source {r.kind!r}: plots draw reproduced runs only"
    if kept is not None and kept.record_id == r.record_id:  # the same run copied twice
        return f"duplicate record_id {r.record_id} (also {kept.path})"
    return f"seed {r.seed} run again: the newest record ({kept.path if kept else '?'}) is drawn"


# ----------------------------------------------------------------------------- what each kind needs


def _metrics(r: Loaded) -> dict[str, Any]:
    return r.record.get("metrics") or {}


def headline_curve(record: dict[str, Any]) -> dict[int, float]:
    """The headline's global accuracy per evaluated round: all clients' (``history[].global_acc``)
    or, for a record whose headline is a client group's (honest, recipients: ``headline_of``), that
    group's (``history[].<group>.global_acc``, schema 1.5)."""
    group = headline_of(record)
    curve = {}
    for h in record.get("history") or []:
        row = h if group == "all" else h.get(group) or {}
        if row.get("global_acc") is not None:
            curve[h["round"]] = row["global_acc"]
    return curve


def _curve_missing(r: Loaded) -> Optional[str]:
    if headline_curve(r.record):
        return None
    group = headline_of(r.record)
    if group == "all":
        return "no global accuracy in history"
    return f"no per-round {group} figures in history (the headline's; written from schema 1.5 on)"


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


def _seen_unseen_missing(r: Loaded) -> Optional[str]:
    if (_metrics(r).get("seen_unseen") or {}).get("seen_acc") is None:
        return "no metrics.seen_unseen (written from record schema 1.6 on)"
    return None


def _bytes_missing(r: Loaded) -> Optional[str]:
    if headline_value(r.record) is None:
        return f"no global accuracy of the headline ({headline_of(r.record)} clients)"
    if (r.record.get("cost") or {}).get("bytes_sent_per_client_per_round") is None:
        return "no cost.bytes_sent_per_client_per_round"
    return None


MISSING: dict[str, Callable[[Loaded], Optional[str]]] = {
    "curves": _curve_missing, "per-class": _per_class_missing, "per-arch": _per_arch_missing,
    "seen-unseen": _seen_unseen_missing, "bytes": _bytes_missing,
}


# ----------------------------------------------------------------------------- setting sections


@dataclass(frozen=True)
class PlotSection:
    """The setting section one figure draws (``setting.section_label``, peer data included, without
    the faults, which the curves tell apart by series and the robustness plot draws against each
    other, and without the modality setting, part of a multimodal task of its own)."""

    order: tuple
    label: str

    @property
    def default(self) -> bool:
        """The data-free, heterogeneous, protocol-budget section: its figures keep the plain file name."""
        return self.label == section_label("none", False, PROTOCOL_BUDGET)

    def file_suffix(self) -> str:
        """``""`` for the default section, else ``__<label as a file name>``."""
        return "" if self.default else "__" + _safe(self.label.replace(", ", "_").replace(" ", "-"))


def plot_section(record: dict[str, Any]) -> PlotSection:
    t, single, budget = transfer_setting(record), single_architecture(record), budget_class(record)
    peers, optimizer, sub = peer_data_setting(record), optimizer_setting(record), submodels_setting(record)
    return PlotSection(section_order(t, single, budget, peer_data=peers, optimizer=optimizer, submodels=sub),
                       section_label(t, single, budget, peer_data=peers, optimizer=optimizer, submodels=sub))


def setting_title(label: str) -> str:
    """A figure title's setting line, with the reason a section stands apart (``section_reasons``)
    on a line of its own."""
    return "\n".join([f"setting: {label}", *section_reasons(label)])


def plot_sections(seed_groups: list[SeedGroup]) -> list[tuple[PlotSection, list[SeedGroup]]]:
    """One task's seed groups split by setting section (``PlotSection``), in the sections' order:
    one figure per kind and section, so that a figure never sets methods of two settings side by side."""
    out: dict[PlotSection, list[SeedGroup]] = {}
    for sg in seed_groups:
        out.setdefault(plot_section(sg.ok[0].record), []).append(sg)
    return sorted(out.items(), key=lambda kv: kv[0].order)


# ----------------------------------------------------------------------------- grouping and labels


def kind_groups(kind: str, task: str, seed_groups: list[SeedGroup]) -> tuple[list[DrawnSetting], list[Skipped]]:
    """The series of one figure: each seed group's ok records that have what ``kind`` needs (a
    group left with none is not drawn), labeled; and the records left out for this kind."""
    groups, lacking = [], []
    for sg in seed_groups:
        usable = []
        for r in sg.ok:
            reason = MISSING[kind](r)
            if reason:
                lacking.append(Skipped(str(r.path), f"{kind}: {reason}", task=task))
            else:
                usable.append(r)
        if usable:
            groups.append(DrawnSetting(usable[0].method, str(sg.config_hash), sg.group_id, usable))
    if kind == "per-class":
        groups = _one_class_count(groups, task, lacking)
    groups.sort(key=lambda g: (g.method, g.config_hash))  # stable: split groups keep their order
    _label(groups)
    return groups, lacking


def _one_class_count(groups: list, task: str, lacking: list[Skipped]) -> list:
    """One per-class figure has one class axis: the records of the class count most records of
    ``task`` have (ties: the larger count) are drawn; each other one is listed in ``lacking``
    (records of one task name with other classes: e.g. image folders of other class sets)."""
    import dataclasses
    from collections import Counter

    counts = Counter(len(r.record["metrics"]["per_class_global_acc"]) for g in groups for r in g.records)
    if len(counts) <= 1:
        return groups
    drawn = max(counts, key=lambda n: (counts[n], n))
    kept = []
    for g in groups:
        usable = []
        for r in g.records:
            n = len(r.record["metrics"]["per_class_global_acc"])
            if n == drawn:
                usable.append(r)
            else:
                lacking.append(Skipped(str(r.path), f"per-class: {n} classes; this figure of {task} shows the "
                                                    f"{drawn}-class records", task=task))
        if usable:
            kept.append(dataclasses.replace(g, records=usable))
    return kept


def _setting(r: Loaded) -> dict[str, Any]:
    cfg = {k: v for k, v in (r.record.get("config") or {}).items() if k not in NOT_SETTING}
    hparams = r.record["method"].get("hparams") or {}
    return cfg | {f"{k}": v for k, v in hparams.items() if k not in cfg}


def _label(groups: list[DrawnSetting]) -> None:
    """Method name; where one method has several settings, add the settings that differ."""
    by_method: dict[str, list[DrawnSetting]] = {}
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
            what = ", ".join(f"{k}={s.get(k)}" for k in differing[:3]) or f"#{g.short_id}"
            g.label = f"{method} {what} (n={len(g.records)})"
    for g in groups:
        g.label = terminal(g.label)  # record text: one line, no control characters


def setting_summary(groups: list[DrawnSetting]) -> str:
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


def caption(task: str, groups: list[DrawnSetting], sources_name: str, band_note: str = BAND_NOTE) -> str:
    """The footnote every figure carries: how many records, which task, which runs."""
    drawn = [r for g in groups for r in g.records]
    settings = "; ".join(f"{g.method}#{g.config_hash[:8]} seeds {','.join(map(str, g.seeds))}" for g in groups)
    ids = [r.record_id for r in drawn]
    shown = ", ".join(ids[:CAPTION_MAX_IDS])
    if len(ids) > CAPTION_MAX_IDS:
        shown += f", ... +{len(ids) - CAPTION_MAX_IDS} more"
    text = (f"Drawn from {len(drawn)} records (status ok) of task {task}: {settings}. "
            f"Record ids: {shown}. All files: {sources_name}. {band_note[0].upper() + band_note[1:]}.")
    return textwrap.fill(terminal(text), width=170)  # record text: no control characters


# ----------------------------------------------------------------------------- drawing


def _colors(groups: list[DrawnSetting]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(groups) <= 10 else "tab20"]
    return {g.label: cmap(i % cmap.N) for i, g in enumerate(groups)}


def _stats(rows: list[list[float]]):
    """Mean, min and max over seeds (rows), ignoring NaN; an all-NaN column (an architecture a
    method's pool lacks) stays NaN, which matplotlib leaves out, without a warning. The mean is
    clamped into [min, max]: the float mean of equal values can fall a rounding error outside them
    (ten copies of 12305901.6 average 1.9e-9 below it), and a negative error bar is refused."""
    import warnings

    import numpy as np

    a = np.asarray(rows, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanmin(a, axis=0), np.nanmax(a, axis=0)
        return np.clip(np.nanmean(a, axis=0), lo, hi), lo, hi


def draw_curves(ax, groups: list[DrawnSetting], colors) -> dict[str, Any]:
    """Global accuracy per round. A group is drawn at the rounds where all its seeds measured the
    global test (with --eval-every k the extra best-validation rounds differ between seeds)."""
    for g in groups:
        series = [headline_curve(r.record) for r in g.records]
        rounds = sorted(set.intersection(*(set(s) for s in series))) or sorted(set().union(*series))
        rows = [[s.get(rnd, float("nan")) for rnd in rounds] for s in series]
        mean, lo, hi = _stats(rows)
        ax.plot(rounds, mean, color=colors[g.label], label=mpl_text(g.label), linewidth=1.2)
        if len(g.records) > 1:
            ax.fill_between(rounds, lo, hi, color=colors[g.label], alpha=0.15, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel(y := f"global accuracy (%){_whose(groups)}")
    return {"y_axis": y}


def headline_axis(records: Iterable[Loaded]) -> str:
    """The y axis of a figure of headline figures (``headline``): the final figure, and where a
    drawn record has none, that its selected round's stands in."""
    basis = basis_of(headline_basis(r.record) for r in records)
    fallback = "" if basis in (None, FINAL) else f" ({FALLBACK_MARK} selected round where a record has no final)"
    return f"global accuracy (%), mean of the last rounds{fallback}"


def _whose(groups: list[DrawnSetting]) -> str:
    """Whose accuracy a curves or bytes figure draws where some record's headline is a client
    group's (honest clients under faults, recipients in a multimodal run): said on the y axis."""
    kinds = sorted({headline_of(r.record) for g in groups for r in g.records} - {"all"})
    return f", {' / '.join(kinds)} clients (the headline)" if kinds else ""


def class_support(records: list[Loaded]):
    """Training samples of each class summed over all clients, averaged over the drawn records
    (each seed draws its own partition, so the totals may differ slightly)."""
    import numpy as np

    totals = [np.asarray(r.record["partition"]["train_counts"], dtype=float).sum(axis=0) for r in records]
    return np.mean(totals, axis=0)


def draw_per_class(ax, groups: list[DrawnSetting], colors) -> dict[str, Any]:
    import numpy as np

    drawn = [r for g in groups for r in g.records]
    support = class_support(drawn)
    order = np.argsort(-support, kind="stable")  # abundant to rare, ties by class index
    x = np.arange(len(order))
    for g in groups:
        mean, lo, hi = _stats([r.record["metrics"]["per_class_global_acc"] for r in g.records])
        ax.plot(x, mean[order], marker="o", markersize=3, color=colors[g.label], label=mpl_text(g.label), linewidth=1.2)
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


def draw_per_arch(ax, groups: list[DrawnSetting], colors) -> dict[str, Any]:
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
        ax.bar(pos, mean, width, color=colors[g.label], label=mpl_text(g.label))
        if len(g.records) > 1:
            ax.errorbar(pos, mean, yerr=[mean - lo, hi - mean], fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
    ax.set_xticks(x)
    ax.set_xticklabels([mpl_text(a) for a in archs])
    ax.set_xlabel("architecture")
    ax.set_ylabel("global accuracy (%)")
    return {"architectures": archs}


def _seen_unseen_at(record: dict[str, Any], place: str, metric: str) -> float:
    """``metrics.seen_unseen``'s ``metric`` over all clients (``place`` "all") or one architecture's; nan if none."""
    block = record["metrics"]["seen_unseen"]
    figures = block if place == SEEN_UNSEEN_ALL else (block.get("per_arch") or {}).get(place) or {}
    x = figures.get(metric)
    return float("nan") if x is None else float(x)


SEEN_UNSEEN_ALL = "all clients"


def draw_seen_unseen(ax, groups: list[DrawnSetting], colors) -> dict[str, Any]:
    """Selected-round accuracy on the classes each client holds (solid) and lacks (hatched), over
    all clients and per architecture: where a method's gain over local training comes from."""
    import numpy as np

    places = [SEEN_UNSEEN_ALL]
    for r in (r for g in groups for r in g.records):
        places += [a for a in r.record["metrics"]["seen_unseen"].get("per_arch") or {} if a not in places]
    width = 0.8 / (2 * len(groups))
    x = np.arange(len(places))
    for i, g in enumerate(groups):
        for j, (metric, hatch) in enumerate((("seen_acc", None), ("unseen_acc", "//"))):
            mean, lo, hi = _stats([[_seen_unseen_at(r.record, p, metric) for p in places] for r in g.records])
            pos = x - 0.4 + width * (2 * i + j + 0.5)
            ax.bar(pos, mean, width, color=colors[g.label], alpha=1.0 if hatch is None else 0.45, hatch=hatch,
                   edgecolor="black" if hatch else colors[g.label], linewidth=0.4,
                   label=mpl_text(g.label) if hatch is None else None)
            if len(g.records) > 1:
                ax.errorbar(pos, mean, yerr=[mean - lo, hi - mean], fmt="none", ecolor="black", elinewidth=0.8,
                            capsize=2)
    ax.set_xticks(x)
    ax.set_xticklabels([mpl_text(p) for p in places])
    ax.set_xlabel("clients (solid: classes a client holds in training; hatched: classes it lacks)")
    ax.set_ylabel("global accuracy (%), seen / unseen classes")
    return {"places": places, "bars": "per group: seen_acc (solid), unseen_acc (hatched)"}


def draw_bytes(ax, groups: list[DrawnSetting], colors) -> dict[str, Any]:
    """The headline global accuracy (``headline``) against bytes sent per client per round (log x).
    A method that sends nothing (local training) cannot sit on a log axis: it is a dashed reference line."""
    any_point = False
    reference_lines = []
    for g in groups:
        xs, xlo, xhi = _stats([[r.record["cost"]["bytes_sent_per_client_per_round"]] for r in g.records])
        ys, ylo, yhi = _stats([[headline_value(r.record)] for r in g.records])
        if xs[0] <= 0:
            ax.axhline(ys[0], color=colors[g.label], linestyle="--", linewidth=1, label=mpl_text(f"{g.label}, 0 bytes"))
            reference_lines.append(g.label)
            continue
        any_point = True
        ax.errorbar(xs, ys, xerr=[xs - xlo, xhi - xs], yerr=[ys - ylo, yhi - ys], fmt="o", color=colors[g.label],
                    capsize=3, label=mpl_text(g.label))
        ax.annotate(mpl_text(g.method), (xs[0], ys[0]), textcoords="offset points", xytext=(5, 4), fontsize=7)
    ax.set_xscale("log")
    if not any_point:
        ax.set_xlim(1, 10)
    ax.set_xlabel("bytes sent per client per round (log scale)")
    ax.set_ylabel(y := f"{headline_axis(r for g in groups for r in g.records)}{_whose(groups)}")
    ax.grid(True, which="both", alpha=0.2)
    return {"zero_bytes_reference_lines": reference_lines, "y_axis": y}


DRAW = {"curves": draw_curves, "per-class": draw_per_class, "per-arch": draw_per_arch,
        "seen-unseen": draw_seen_unseen, "bytes": draw_bytes}
TITLES = {
    "curves": "Global accuracy per round",
    "per-class": "Per-class global accuracy (selected round)",
    "per-arch": "Global accuracy per architecture (selected round)",
    "seen-unseen": "Accuracy on seen and unseen classes (selected round)",
    "bytes": "Accuracy against communication",
}


def render(kind: str, task: str, groups: list[DrawnSetting], png: Path, section: str = ""
           ) -> tuple[str, dict[str, Any]]:
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
    setting = f"\n{setting_title(str(section))}" if section else ""
    ax.set_title(mpl_text(f"{TITLES[kind]}: {task} ({setting_summary(groups)}){setting}", one_line=False), fontsize=11)
    fig.legend(loc="outside right upper", fontsize=8, title="method (n seeds)", title_fontsize=8)
    text = caption(task, groups, f"{png.name}{SIDECAR_SUFFIX}")
    fig.supxlabel(mpl_text(text, one_line=False), fontsize=6.5, x=0.005, ha="left", multialignment="left")
    write_atomic(png, lambda f: fig.savefig(f, format="png", dpi=110))
    return text, details


# ----------------------------------------------------------------------------- one kind, one task


SAFE_MAX = 80  # characters of a name in a file name; a longer one is cut and told apart by a digest


def _safe(name: str) -> str:
    """A task name as part of a file name: other characters replaced, at most ``SAFE_MAX``
    characters (a 300-character name would exceed the file system's limit)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    if len(safe) <= SAFE_MAX:
        return safe
    import hashlib

    return f"{safe[:SAFE_MAX - 11]}-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:10]}"


def plot_task(kind: str, task: str, seed_groups: list[SeedGroup], skipped: list[Skipped], out_dir: Path,
              section: Optional[PlotSection] = None) -> tuple[Optional[Written], list[Skipped]]:
    """One figure of one kind for one task's seed groups of one setting section, with its sources
    sidecar. Returns (None, reasons) when no record has what this kind needs."""
    groups, lacking = kind_groups(kind, task, seed_groups)
    if not groups:
        return None, lacking
    section = section or plot_section(groups[0].records[0].record)
    png = out_dir / f"{kind}__{_safe(task)}{section.file_suffix()}.png"
    text, details = render(kind, task, groups, png, section.label)
    drawn = [r for g in groups for r in g.records]
    task_skipped = [s for s in skipped if s.task == task] + lacking
    sources = png.with_name(png.name + SIDECAR_SUFFIX)
    write_atomic(sources, json.dumps({
        "png": png.name,
        "kind": kind,
        "task": task,
        "section": section.label,
        "n_records": len(drawn),
        "records": [source_entry(r) for r in drawn],
        "groups": [{"label": g.label, "method": g.method, "config_hash": g.config_hash, "seeds": g.seeds,
                    "record_ids": [r.record_id for r in g.records]} for g in groups],
        "skipped": [s.as_dict() for s in task_skipped],
        "statistics": BAND_NOTE,
        "caption": text,
        "details": details,
    }, indent=1, default=str) + "\n")
    return Written(kind, task, png, sources, drawn, groups, section.label), lacking


def make_plots(kind: str, inputs: list[Path], out_dir: Path, tasks: list[str] = (), methods: list[str] = ()
               ) -> tuple[list[Written], list[Skipped]]:
    """The library entry point behind ``hfl-bench plot``: one PNG (+ sidecar) per kind and task.
    Raises PlotError for bad input: an unknown kind, a missing path, no records found, nothing to
    draw."""
    if kind != "all" and kind not in KINDS:
        raise PlotError(f"unknown plot kind {kind!r}; choose one of: {', '.join(KINDS)}, all")
    kinds = [k for k in KINDS if k not in FAULT_KINDS_ONLY + ACROSS_TASKS] if kind == "all" else [kind]
    try:
        files = record_files(inputs)
    except ResultsError as e:
        raise PlotError(str(e)) from None
    loaded, skipped = read_records(files)
    found, no_id = with_record_id(loaded)
    skipped += no_id
    if not found:
        raise PlotError(f"no hfl-bench records found in {', '.join(map(str, inputs))} ({len(files)} JSON file(s) read)")
    found, invalid = valid_records(found)  # an invalid record is listed, never drawn
    skipped += invalid
    if not found:
        raise PlotError(f"no valid records in {', '.join(map(str, inputs))}: {len(invalid)} invalid "
                        f"(hfl-bench leaderboard validate lists why)")
    selected = [r for r in found if (not tasks or r.task in tasks) and (not methods or r.method in methods)]
    if not selected:
        raise PlotError(f"none of the {len(found)} records match the filters"
                        f"{' --task ' + ','.join(tasks) if tasks else ''}"
                        f"{' --method ' + ','.join(methods) if methods else ''}")
    if kind == "cd":
        return plot_cd(selected, skipped, out_dir)
    faulty = any(robustness.faults_section(r) for r in selected)
    if kind == "all" and faulty:
        kinds.append("robustness")
    if kind == "robustness" and not faulty:
        raise PlotError(f"no records run with --faults among the {len(selected)} record(s): the robustness plot "
                        "draws the honest clients' accuracy against fault strength (hfl-bench matrix "
                        "suites/robustness.yaml writes such records)")
    seed_groups, not_drawn = drawable_groups(selected)
    skipped += not_drawn
    written: list[Written] = []
    for task in sorted({g.ok[0].task for g in seed_groups}):
        for section, task_groups in plot_sections([g for g in seed_groups if g.ok[0].task == task]):
            for k in kinds:
                if k == "robustness":
                    if kind == "all" and not any(robustness.faults_section(r) for g in task_groups for r in g.ok):
                        continue  # a task without faulty runs has no robustness figure under ``all``
                    fig, lacking = plot_robustness(task, task_groups, skipped, out_dir, section)
                else:
                    fig, lacking = plot_task(k, task, task_groups, skipped, out_dir, section)
                skipped += lacking
                if fig:
                    written.append(fig)
    if not written:
        reasons = "; ".join(sorted({s.reason for s in skipped if s.task is not None})) or "no drawable records"
        raise PlotError(f"nothing to draw from {len(selected)} record(s): {reasons}")
    return written, skipped


# ----------------------------------------------------------------------------- robustness

ROBUSTNESS_NOTE = ("each point: mean ± sample sd over seeds of the headline global accuracy (the mean over the "
                   "last evaluated rounds; the selected round's where a record has no final figure) over the "
                   "honest clients (all clients at x = 0, the run without faults)")


@dataclass
class Point:
    """One setting on the robustness plot: a seed group at its x."""

    x: float
    group: DrawnSetting
    faults: str  # the canonical spec, "none" at the baseline

    def stat(self) -> Stat:
        return Stat.of(headline_value(r.record) for r in self.group.records)


@dataclass
class Series:
    """One method's line in one fault kind's panel: the baseline and its fault settings."""

    key: tuple
    method: str
    version: Optional[str]
    params: str  # what else sets the line apart (mode; who, where x is the strength)
    points: list[Point]
    label: str = ""


def robustness_series(seed_groups: list[SeedGroup], task: str) -> tuple[dict[str, list[Series]], list[Skipped]]:
    """Per fault kind, the lines to draw (``robustness`` says which x each kind uses), and the
    records left out. A line joins the groups of one method, version and baseline config that
    differ only in the fault's x; its x = 0 point is the fault-free group of the baseline config on
    the same data."""
    lacking: list[Skipped] = []
    clean = [sg for sg in seed_groups if not any(robustness.faults_section(r) for r in sg.ok)]
    clean_ids = {id(sg) for sg in clean}
    panels: dict[str, dict[tuple, Series]] = {}
    used: set[int] = set()
    for sg in seed_groups:
        if id(sg) in clean_ids:
            continue
        usable = []
        for r in sg.ok:
            if robustness.fault_x(r) is None:
                lacking.append(Skipped(str(r.path),
                                       "robustness: no fault kind, strength or fraction in the faults section",
                                       task=task))
            elif headline_value(r.record, clients="honest") is None:
                lacking.append(Skipped(str(r.path), "robustness: no metrics.honest.global_acc (every client faulty?)",
                                       task=task))
            else:
                usable.append(r)
        if not usable:
            continue
        first = usable[0]
        kind = robustness.fault_kind(first)
        base = robustness.baseline_hash(first)
        key = (first.method, first.method_version, base, robustness.series_params(first), data_identity(first))
        series = panels.setdefault(kind, {}).setdefault(key, Series(key, first.method, first.method_version,
                                                                    robustness.series_params(first), []))
        spec = str(robustness.faults_section(first).get("spec") or "?")
        drawn = DrawnSetting(first.method, str(sg.config_hash), sg.group_id, usable)
        series.points.append(Point(robustness.fault_x(first), drawn, spec))
    for kind, by_key in panels.items():
        for series in by_key.values():
            _, version, base, _, identity = series.key
            for sg in clean:
                r0 = sg.ok[0]
                if sg.config_hash == base and sg.method_version == version and data_identity(r0) == identity:
                    drawn = DrawnSetting(r0.method, str(sg.config_hash), sg.group_id, list(sg.ok))
                    series.points.append(Point(0.0, drawn, "none"))
                    used.add(id(sg))
            series.points.sort(key=lambda p: (p.x, p.group.group_id))
    for sg in clean:
        if id(sg) not in used:
            lacking += [Skipped(str(r.path), "robustness: run without faults, and no run with faults of its config "
                                             "to compare with", task=task) for r in sg.ok]
    out = {}
    for kind in sorted(panels):
        lines = sorted(panels[kind].values(), key=lambda s: (s.method, str(s.version), s.params, str(s.key[2])))
        _label_series(lines)
        out[kind] = lines
    return out, lacking


def _label_series(lines: list[Series]) -> None:
    """The method, and what sets two of its lines apart (version, mode / who, baseline config)."""
    by_method: dict[str, list[Series]] = {}
    for s in lines:
        by_method.setdefault(s.method, []).append(s)
    for method, ss in by_method.items():
        for s in ss:
            parts = [method]
            if len({x.version for x in ss}) > 1:
                parts.append(f"@{s.version or 'unversioned'}")
            if len({x.params for x in ss}) > 1 and s.params:
                parts.append(s.params)
            s.label = " ".join(parts)
        labels = [s.label for s in ss]
        for s in ss:
            if labels.count(s.label) > 1:
                s.label += f" #{str(s.key[2])[:8]}"
    for s in lines:
        ns = sorted({len(p.group.records) for p in s.points})
        s.label = terminal(f"{s.label} (n={ns[0]}{'-' + str(ns[-1]) if len(ns) > 1 else ''})")


def draw_robustness(fig, panels: dict[str, list[Series]]) -> dict[str, Any]:
    """One panel per fault kind: each line's points at their x, mean ± sd over seeds."""
    from matplotlib import colormaps

    methods = sorted({s.method for lines in panels.values() for s in lines})
    cmap = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    colors = {m: cmap(i % cmap.N) for i, m in enumerate(methods)}
    styles = ("-", "--", ":", "-.")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    details = []
    for ax, (kind, lines) in zip(axes, panels.items()):
        by_method: dict[str, int] = {}
        drawn = []
        for s in lines:
            stats = [p.stat() for p in s.points]
            xs = [p.x for p in s.points]
            ys = [st.mean for st in stats]
            err = [st.sd or 0.0 for st in stats]
            style = styles[by_method.setdefault(s.method, 0) % len(styles)]
            by_method[s.method] += 1
            ax.errorbar(xs, ys, yerr=err, fmt="o", linestyle=style, color=colors[s.method], capsize=3, markersize=4,
                        linewidth=1.2, label=mpl_text(s.label))
            drawn.append({"label": s.label, "method": s.method, "method_version": s.version, "params": s.params,
                          "baseline_config_hash": s.key[2],
                          "points": [{"x": p.x, "faults": p.faults, "mean": st.mean, "sd": st.sd, "n": st.n,
                                      "seeds": p.group.seeds, "config_hash": p.group.config_hash,
                                      "record_ids": [r.record_id for r in p.group.records]}
                                     for p, st in zip(s.points, stats)]})
        ax.set_title(mpl_text(kind), fontsize=10)
        # wrapped to the panel's width (kept as lines: one long line ran past a narrow panel)
        x_label = textwrap.fill(robustness.X_LABELS.get(kind, "fraction of faulty clients") + "; 0 = no faults", 40,
                                break_on_hyphens=False)
        ax.set_xlabel(mpl_text(x_label, one_line=False), fontsize=8)
        ax.grid(True, alpha=0.2)
        ax.legend(fontsize=7, loc="best")
        details.append({"fault_kind": kind, "x": robustness.X_LABELS.get(kind, "fraction of faulty clients"),
                        "series": drawn})
    axes[0].set_ylabel("global accuracy, honest clients (%), mean of the last rounds")
    return {"statistics": ROBUSTNESS_NOTE, "panels": details}


def plot_robustness(task: str, seed_groups: list[SeedGroup], skipped: list[Skipped], out_dir: Path,
                    section: Optional[PlotSection] = None) -> tuple[Optional[Written], list[Skipped]]:
    """The robustness figure of one task (one panel per fault kind), with its sources sidecar;
    (None, reasons) when no record of the task ran with faults."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels, lacking = robustness_series(seed_groups, task)
    if not panels:
        return None, lacking
    groups: list[DrawnSetting] = []
    seen: set[str] = set()
    for lines in panels.values():
        for s in lines:
            for p in s.points:
                if p.group.group_id + str(id(p.group.records[0])) not in seen:
                    seen.add(p.group.group_id + str(id(p.group.records[0])))
                    groups.append(p.group)
    groups.sort(key=lambda g: (g.method, g.config_hash, g.group_id))
    section = section or plot_section(groups[0].records[0].record)
    png = out_dir / f"robustness__{_safe(task)}{section.file_suffix()}.png"
    fig = Figure(figsize=(11, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    details = draw_robustness(fig, panels)
    fig.suptitle(mpl_text(f"Robustness: honest clients' global accuracy against fault strength: {task} "
                          f"({setting_summary(groups)})\n{setting_title(section.label)}", one_line=False), fontsize=11)
    text = caption(task, groups, f"{png.name}{SIDECAR_SUFFIX}", ROBUSTNESS_NOTE)
    fig.supxlabel(mpl_text(text, one_line=False), fontsize=6.5, x=0.005, ha="left", multialignment="left")
    write_atomic(png, lambda f: fig.savefig(f, format="png", dpi=110))
    drawn = [r for g in groups for r in g.records]
    task_skipped = [s for s in skipped if s.task == task] + lacking
    sources = png.with_name(png.name + SIDECAR_SUFFIX)
    write_atomic(sources, json.dumps({
        "png": png.name, "kind": "robustness", "task": task, "section": section.label, "n_records": len(drawn),
        "records": [source_entry(r) for r in drawn],
        "groups": [{"label": g.method, "method": g.method, "config_hash": g.config_hash, "seeds": g.seeds,
                    "faults": robustness.faults_section(g.records[0]).get("spec") or "none",
                    "record_ids": [r.record_id for r in g.records]} for g in groups],
        "skipped": [s.as_dict() for s in task_skipped],
        "statistics": ROBUSTNESS_NOTE,
        "caption": text,
        "details": details,
    }, indent=1, default=str) + "\n")
    return Written("robustness", task, png, sources, drawn, groups, section.label), lacking


# ----------------------------------------------------------------------------- critical difference


def plot_cd(records: list[Loaded], skipped: list[Skipped], out_dir: Path) -> tuple[list[Written], list[Skipped]]:
    """One critical-difference diagram (``cd``) per setting section with 2+ blocks and 3+ methods run
    in all of them, with its sidecar (average ranks, Friedman test, Nemenyi p-values, the blocks and
    their scores). PlotError when no section has enough, or scikit-posthocs is missing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from hfl_bench.results import cd
    from hfl_bench.results.board import build_groups

    tables = cd.cd_tables(build_groups(records))
    drawable = [t for t in tables if t.drawable]
    if not drawable:
        shapes = "; ".join(f"{t.section}: {t.shape()}" for t in tables) or "no protocol with a figure"
        raise PlotError(f"cd: a critical-difference diagram needs {cd.MIN_BLOCKS} or more blocks (protocols of one "
                        f"setting) and {cd.MIN_METHODS} or more methods run in all of them; found {shapes}")
    try:
        import scikit_posthocs  # noqa: F401 - the drawing and the post-hoc test
    except ImportError:
        raise PlotError("cd: needs scikit-posthocs (pip install 'hfl-bench[stats]')") from None
    written = []
    for t in drawable:
        stats = cd.cd_statistics(t)
        groups = [DrawnSetting(g.method, str(g.config_hash), g.group_id, list(g.ok)) for g in t.members]
        png = out_dir / f"cd__{_safe(t.section.replace(', ', '_').replace(' ', '-'))}.png"
        fig = Figure(figsize=(9, 2.6 + 0.3 * len(t.methods)))
        FigureCanvasAgg(fig)
        cd.draw_cd(fig, t, stats)
        fig.suptitle(mpl_text(f"Critical difference: {len(t.methods)} methods over {len(t.blocks)} blocks\n"
                              f"{setting_title(t.section)}", one_line=False), fontsize=10)
        write_atomic(png, lambda f, fig=fig: fig.savefig(f, format="png", dpi=110))
        drawn = [r for g in groups for r in g.records]
        sources = png.with_name(png.name + SIDECAR_SUFFIX)
        write_atomic(sources, json.dumps({
            "png": png.name, "kind": "cd", "section": t.section, "n_records": len(drawn),
            "records": [source_entry(r) for r in drawn],
            "statistics": ("score: mean headline global accuracy of each method's best group in a block "
                           "(a protocol of this setting); rank 1 = best; Friedman test over the blocks, "
                           "Nemenyi post-hoc test (Demsar 2006)"),
            "methods": t.methods, "left_out": t.left_out,
            "blocks": [{"protocol": b, "scores": dict(zip(t.methods, row))} for b, row in zip(t.blocks, t.scores)],
            **stats,
        }, indent=1, default=str) + "\n")
        written.append(Written("cd", "across tasks", png, sources, drawn, groups, t.section))
    skipped += [Skipped(f"setting: {t.section}", f"cd: {t.shape()}") for t in tables if not t.drawable]
    return written, skipped
