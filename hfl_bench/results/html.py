"""The leaderboard as a static HTML site (``hfl-bench leaderboard html [RECORDS...] --out OUT``).

One ``index.html`` (one setting section after another, ``SettingGroup.section``; in each, per task
and protocol a sortable table of groups with the published figures beside them; a filter by
setting, method, pool, fault and modality setting, the cross-task rank one table per setting, the plots,
which records were drawn and which were left out and why; a multimodal group's recipients' headline
with its donors', all clients' and endpoints' figures under it), one page per record group under
``groups/`` (resolved config, provenance, per-class and per-architecture tables, links to the records), the
record files copied under ``records/`` and the plots (``plots.make_plots``) under ``plots/``.

Safe to open from ``file://`` or any static host, and safe with hostile records:

- no server, CDN or network: every asset is inline or a relative file, and each page carries a
  Content-Security-Policy that forbids fetching anything (``default-src 'none'``; images from the
  site itself; the one inline script allowed by its hash, so an injected script would not run
  even if escaping failed);
- every string from a record is HTML-escaped (Jinja2 autoescape; no ``|safe`` on record text; the
  leaderboard tables' cells, built from ``columns``, by markupsafe's ``Markup.format``, which escapes
  every value it is given);
- file names are built from safe components only: a group page is named by a hash of the group's
  key, a copied record by its file name reduced to ``[A-Za-z0-9_-]`` (never by record text).

The site is deterministic (no dates, paths relative to the working folder where they lie under
it), so regenerating it gives no diff. The rows come from the leaderboard (``board``,
``render.display_rows``, ``ranking``) and their cells from the one column list every view
iterates (``columns``): the site and ``leaderboard show`` never disagree.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import json
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from markupsafe import Markup, escape

from hfl_bench.config import FINAL_ROUNDS, POOLED_SELECTION_RULE, SELECTION_RULE
from hfl_bench.results import seen_unseen
from hfl_bench.results.board import Board, board_records, build_board
from hfl_bench.results.columns import Column, GroupRow, _num, _pm, columns, drop_label, get_column
from hfl_bench.results.fairness import NOT_AVAILABLE, group_fairness
from hfl_bench.results.figures import FINAL
from hfl_bench.results.grouping import SeedGroup, group_seeds
from hfl_bench.results.headline import FALLBACK_MARK, FALLBACK_NOTE, group_basis, headline_stat, marked
from hfl_bench.results.loading import HONEST_SELECTION, Loaded, ResultsError, Skipped, load_records
from hfl_bench.results.paired_view import page_tables
from hfl_bench.results.rank_intervals import with_rank_intervals
from hfl_bench.results.ranking import protocol_label, protocol_labels, rank_methods, unranked_methods
from hfl_bench.results.render import KIND, UNMATCHED_COLUMNS, by_section, display_rows, rank_rows, unranked_lines
from hfl_bench.results.setting import (
    SettingGroup,
    Stat,
    canonical,
    modalities_section,
    partition_label,
    section_reasons,
)
from hfl_bench.results.timing import group_timing, reclocked_from

# Marks a folder this module wrote, so regenerating may clear its old pages, and nothing else.
MARKER = ".hfl-bench-site"
GENERATED = ("index.html", "groups", "records", "plots", "site.json")

# The site's templates, style sheet and script: package data (pyproject: [tool.setuptools.package-data]),
# read with importlib.resources, so an installed wheel finds them as a source checkout does.
RESOURCES = importlib.resources.files("hfl_bench.results")


def _resource(folder: str, name: str) -> str:
    return (RESOURCES / folder / name).read_text(encoding="utf-8")


# The one script of the index (sorting and filtering), inline and allowed by its hash in the CSP.
# It reads record text only through the DOM (dataset, textContent), never as HTML.
SCRIPT = _resource("static", "leaderboard.js")
# The style sheet, inline in every page (a page stays one file that opens alone).
STYLE = _resource("static", "leaderboard.css")


def csp(script: Optional[str]) -> str:
    """No network: nothing may be fetched but the site's own images; scripts only by hash."""
    scripts = "'none'"
    if script is not None:
        digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
        scripts = f"'sha256-{digest}'"
    return (f"default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; script-src {scripts}; "
            "base-uri 'none'; form-action 'none'")


class SiteError(ResultsError):
    """The site cannot be written (e.g. the folder holds other files); meant for the user."""


@dataclass
class Site:
    """What was written: the index, the groups, the records drawn and left out, the plots."""

    index: Path
    n_records: int
    n_groups: int
    group_pages: list[Path]
    skipped: list[Skipped]
    plots: list[Path]
    plot_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"index": str(self.index), "n_records": self.n_records, "n_groups": self.n_groups,
                "group_pages": [str(p) for p in self.group_pages], "plots": [str(p) for p in self.plots],
                "skipped": [s.as_dict() for s in self.skipped], "plot_note": self.plot_note}


# ----------------------------------------------------------------------------- small helpers


def shown_path(p: Path | str) -> Path:
    """A path relative to the working folder when it lies under it (so the site does not name the
    machine's folders, and regenerating it elsewhere gives the same pages); else as given."""
    p = Path(p)
    try:
        return p.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return p


def _safe_stem(name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(name).stem).strip("_")[:80]
    return stem or "record"


def _text(v: Any) -> str:
    """A value as one text: strings as themselves, anything else as canonical JSON."""
    if v is None:
        return "-"
    return v if isinstance(v, str) else canonical(v)


def _values(records: Iterable[Loaded], section: str, key: str) -> str:
    """The distinct values of one field of a (required) section over records ("-" when none carries it)."""
    seen: list[str] = []
    for r in records:
        v = r.record[section].get(key)
        if v is not None and _text(v) not in seen:
            seen.append(_text(v))
    return ", ".join(seen) or "-"


# ----------------------------------------------------------------------------- the board's groups


def _seed_group_of(groups: list[SettingGroup], seed_groups: list[SeedGroup]) -> dict[int, SeedGroup]:
    """Each board group's seed group (every member, failed ones too, which the board's view
    keeps only as counts): the same ``grouping`` rule, matched on id, ok records and counts."""
    pool: dict[tuple, list[SeedGroup]] = defaultdict(list)
    for sg in seed_groups:
        pool[(sg.group_id, tuple(id(r) for r in sg.ok), sg.n_failed, sg.n_diverged, len(sg.duplicates))].append(sg)
    out = {}
    for g in groups:
        candidates = pool[(g.group_id, tuple(id(r) for r in g.ok), g.n_failed, g.n_diverged, g.n_duplicates)]
        if candidates:
            out[id(g)] = candidates.pop(0)
    return out


def _page_name(g: SettingGroup, row: dict[str, Any], taken: set[str]) -> str:
    """A group page's file name, from what the group is: task, method, pool, setting (partition,
    clients, rounds, method parameters) and faults, e.g.
    ``digits__crad__cpu__dirichlet_alpha_0.3_N_10_R_30.html``; only letters, digits, ``.``, ``_``
    and ``-``; ``-2``, ``-3`` ... appended, in the board's order, where two groups would share one."""
    parts = [g.task, g.method, g.pool, row["cells"]["setting"]] + ([g.faults] if g.has_faults else [])
    stem = "__".join(re.sub(r"[^A-Za-z0-9.-]+", "_", str(x)).strip("_.") or "x" for x in parts)[:100]
    name, n = stem, 1
    while name.lower() in taken:  # case-insensitive file systems: crad and CRAD are one file
        n += 1
        name = f"{stem}-{n}"
    taken.add(name.lower())
    return name + ".html"


def _row(g: SettingGroup) -> dict[str, Any]:
    """One group's row, a multimodal group's other figures and the published rows beside it
    (``render.display_rows``), and its site cells: each html column's text and sort value
    (``columns``; its protocol labelled as a board of this group alone labels it)."""
    rows, _ = display_rows(Board([g], [], []))
    head = rows[0]
    row = GroupRow.of([g])[0]
    return {
        "cells": head, "clients": [r for r in rows[1:] if r[KIND] == "clients"],
        "published": [r for r in rows[1:] if r[KIND] == "published"], "group": g, "modalities": g.modalities,
        "setting": g.section, "fidelity": get_column("fidelity").value(row), "version": head["version"],
        "faults": g.faults, "site": {c.name: c.html_cell(row) for c in columns("html")},
    }


def _shown(has_faults: bool, has_clock: bool = False) -> list[Column]:
    """The site's columns: those shown only under faults (``Column.faults_only``) where a group ran
    with any, the simulated time (``Column.clock_only``) where a group has a clock."""
    return [c for c in columns("html") if (has_faults or not c.faults_only) and (has_clock or not c.clock_only)]


def _lines(cells: list[tuple[Markup, bool, bool]]) -> Markup:
    """Cells (cell, joins, keeps open) one to a line: a cell that joins (``Column.th_joins`` /
    ``td_joins``) on the line before, as does the cell after one that keeps its line open (a
    column shown only under faults: the site's layout before these columns)."""
    lines: list[Markup] = []
    open_line = False
    for cell, joins, keeps_open in cells:
        if (joins or open_line) and lines:
            lines[-1] += cell
        else:
            lines.append(cell)
        open_line = keeps_open
    return Markup("\n").join(lines) + Markup("\n")


def _attribute(text: str) -> Markup:
    """Text for a double-quoted attribute: escaped, its apostrophes kept as they are (as the site wrote them)."""
    return Markup(str(escape(text)).replace("&#39;", "'"))


def header_cells(has_faults: bool, has_clock: bool = False) -> Markup:
    """The leaderboard tables' header: one ``th`` per site column (``columns``), escaped."""
    cells = []
    for c in _shown(has_faults, has_clock):
        title = Markup(' title="{}"').format(_attribute(c.title)) if c.title else ""
        cells.append((Markup('<th{} data-type="{}"{}>{}</th>').format(
            Markup(' class="num"') if c.numeric else "", "num" if c.numeric else "text", title, c.shown_header),
            c.th_joins, c.faults_only))
    return Markup("<thead><tr>\n") + _lines(cells) + Markup("</tr></thead>\n")


# The rows beside a group: a multimodal group's other clients, then the published figures; the
# span of columns they leave blank after the method says what the row is.
BESIDE = (("clients", "besides the recipients' headline"), ("published", "published figure"))


def group_cells(row: dict[str, Any], root: str, has_faults: bool, link: bool = True, has_clock: bool = False) -> Markup:
    """A group's ``tr`` (each site column's cell: its text escaped, a number's sort value in
    ``data-v``; the method linking to the group's page) and the rows beside it."""
    shown = _shown(has_faults, has_clock)
    cells = []
    for c in shown:
        text, sort = row["site"][c.name]
        attrs = Markup(' class="num" data-v="{}"').format("" if sort is None else sort) if c.numeric else ""
        body = Markup('<a href="{}groups/{}">{}</a>').format(root, row["page"], text) if c.link and link else text
        cells.append((Markup("<td{}>{}</td>").format(attrs, body), c.td_joins, c.faults_only))
    out = Markup('<tr class="reproduced">\n') + _lines(cells) + Markup("</tr>\n")
    for kind, label in BESIDE:
        for beside in row[kind]:
            out += Markup('<tr class="{}">\n').format(kind) + _beside(shown, kind, label, beside) + Markup("</tr>\n")
    return out


def _beside(shown: list[Column], kind: str, label: str, cells: dict[str, str]) -> Markup:
    """A row beside a group: the columns it fills (``Column.sub``) as cells, each run of the others
    as one blank span; the first span carries ``label``, on the line of the cell before it."""
    out: list[tuple[Markup, bool, bool]] = []
    blank, labelled = 0, False
    for c in [*shown, None]:  # None: the end, which closes the last span
        if c is not None and kind not in c.sub:
            blank += 1
            continue
        if blank:
            out.append((Markup('<td colspan="{}">{}</td>').format(blank, "" if labelled else Markup(label)),
                        not labelled, False))
            blank, labelled = 0, True
        if c is not None:
            cls = c.sub[kind]
            out.append((Markup("<td{}>{}</td>").format(Markup(' class="{}"').format(cls) if cls else "",
                                                        cells.get(c.name, "")), c.td_joins, c.faults_only))
    return _lines(out)


# ----------------------------------------------------------------------------- group pages


def _per_class(g: SettingGroup) -> list[dict[str, str]]:
    accs = [r.record["metrics"]["per_class_global_acc"] for r in g.ok
            if r.record["metrics"].get("per_class_global_acc")]
    if not accs:
        return []
    n = max(len(a) for a in accs)
    supports = []
    for r in g.ok:
        counts = (r.record.get("partition") or {}).get("train_counts")
        if counts and all(len(row) == n for row in counts):
            supports.append([sum(row[c] for row in counts) for c in range(n)])
    rows = []
    for c in range(n):
        s = Stat.of(a[c] if c < len(a) else None for a in accs)
        support = Stat.of(sp[c] for sp in supports)
        rows.append({"class": str(c), "support": _num(support.mean, 1), "acc": _pm(s.mean, s.sd), "n": str(s.n)})
    return rows


def _per_arch(g: SettingGroup) -> list[dict[str, str]]:
    archs: list[str] = []
    for r in g.ok:
        archs += [a for a in (r.record["metrics"].get("per_arch_global_acc") or {}) if a not in archs]
    rows = []
    for a in archs:
        s = Stat.of((r.record["metrics"].get("per_arch_global_acc") or {}).get(a) for r in g.ok)
        seen, unseen = (Stat.of(seen_unseen.arch_value(r.record, a, m) for r in g.ok) for m in seen_unseen.SEEN_UNSEEN)
        rows.append({"arch": a, "acc": _pm(s.mean, s.sd), "seen": _pm(seen.mean, seen.sd),
                     "unseen": _pm(unseen.mean, unseen.sd), "n": str(s.n)})
    return rows


def _seen_unseen(g: SettingGroup) -> list[dict[str, str]]:
    """The seen / unseen-class accuracy over the headline's clients, all clients and each client
    group the records have, at the selected round and over the final window (mean ± sd over
    seeds); [] when no seed's record has it (before schema 1.6)."""
    if not any(seen_unseen.block(r.record, "all") for r in g.ok):
        return []
    who = [("headline", f"headline ({g.headline_clients} clients)")] if g.headline_clients != "all" else []
    who.append(("all", "all clients"))
    if g.has_faults:
        who.append(("faulty", "faulty clients"))
    if g.is_multimodal:
        who.append(("donors", "donors"))
    rows = []
    for clients, label in who:
        figures = {f"{'final_' if final else ''}{m}": seen_unseen.stat(g, m, clients, final)
                   for m in seen_unseen.SEEN_UNSEEN for final in (False, True)}
        rows.append({"clients": label, **{k: _pm(st.mean, st.sd) for k, st in figures.items()},
                     "lacking": seen_unseen.n_clients_unseen(g, clients), "n": str(figures["seen_acc"].n)})
    return rows


def _endpoints(g: SettingGroup) -> list[dict[str, str]]:
    """Each extra endpoint's headline figures (final from schema 1.7; the selected round's marked
    where records fell back): over all clients, or for a multimodal group over the recipients, the
    donors and all clients (one row each)."""
    who = (("headline", ""),)
    if g.is_multimodal:
        who = (("recipients", "recipients"), ("donors", "donors"), ("all", "all clients"))
    out = []
    for e in g.endpoints():
        for clients, label in who:
            gl, lo = headline_stat(g, "global_acc", clients, e), headline_stat(g, "local_acc", clients, e)
            out.append({"endpoint": e, "clients": label,
                        "global": marked(_pm(gl.mean, gl.sd), group_basis(g, "global_acc", clients, e)),
                        "local": marked(_pm(lo.mean, lo.sd), group_basis(g, "local_acc", clients, e)), "n": str(gl.n)})
    return out


def _reclocked(record: dict[str, Any]) -> Optional[str]:
    """Where a re-clocked record's clock came from (``hfl-bench reclock``), in words; None: timed as it trained."""
    source = reclocked_from(record)
    if source is None:
        return None
    f = {k: _text(source.get(k)) for k in ("file", "record_id", "sha256", "profile", "assignment", "git_sha", "date")}
    dirty = " (dirty)" if source.get("git_dirty") else ""
    return (f"{f['file']} (record {f['record_id']}, sha256 {f['sha256']}; devices {f['profile']}, {f['assignment']}) "
            f"by commit {f['git_sha']}{dirty}, {f['date']}")


def _members(sg: Optional[SeedGroup], g: SettingGroup, hrefs: dict[int, str]) -> list[dict[str, Any]]:
    records = sg.records if sg else g.ok
    ok = {id(r) for r in g.ok}
    dup = {id(r) for r in sg.duplicates} if sg else set()
    out = []
    for r in records:
        role = "seed" if id(r) in ok else "duplicate (not counted)" if id(r) in dup else f"status {_text(r.status)}"
        code = r.record.get("code") or {}
        env = r.record.get("environment") or {}
        out.append({
            "path": str(shown_path(r.path)), "href": hrefs.get(id(r)), "record_id": r.record_id, "seed": _text(r.seed),
            "status": _text(r.status), "role": role, "date": _text(r.record.get("date")),
            "partition_hash": _text(r.partition_hash), "error": _text(r.record.get("error")),
            "code": [(k, _text(v)) for k, v in code.items()], "environment": [(k, _text(v)) for k, v in env.items()],
            "reclocked": _reclocked(r.record),
            "plugin_dist": {"method": _text(r.record["method"].get("plugin_dist")),
                            "task": _text(r.record["task"].get("plugin_dist")),
                            "pool": _text((r.record.get("arch_pool") or {}).get("plugin_dist"))},
        })
    return out


def _fault_rows(g: SettingGroup) -> list[tuple[str, str]]:
    """A group run with faults: whose figure the headline is, the all-client figures, the drop and
    the seeds it paired."""
    if not g.has_faults:
        return []
    every, honest = g.stat("global_acc", clients="all"), g.stat("global_acc", clients="honest")
    faulty = g.stat("global_acc", clients="faulty")
    rows = [("headline", "honest clients (metrics.honest)"),
            ("selected global acc, honest clients", _pm(honest.mean, honest.sd)),
            ("selected global acc, faulty clients", _pm(faulty.mean, faulty.sd)),
            ("selected global acc, all clients", _pm(every.mean, every.sd))]
    rows += _final_rows(g, (("honest", "honest clients"), ("faulty", "faulty clients"), ("all", "all clients")))
    drop = g.drop
    if g.selection_rule == HONEST_SELECTION:
        rows.append(("drop against no faults", "- (selected on the honest clients' validation: no drop against "
                                               "a run selected on every client's)"))
    elif drop is None or drop.mean is None:
        rows.append(("drop against no faults", "- (no fault-free record of the same config and seed with "
                                               "every honest client's figure)"))
    else:
        def seeds(attr: str) -> str:
            return ", ".join(f"seed {p.seed}: {getattr(p, attr):+.2f}" for p in drop.pairs
                             if getattr(p, attr) is not None)

        final = (f"final window {drop.final_mean:+.2f} ({seeds('final_drop')}); " if drop.final_mean is not None
                 else "final window: - (records before schema 1.6); ")
        rows.append(("drop against no faults", f"{drop_label(g)} (the {drop.statistic} drop, 95% t-interval over "
                                               f"the paired seeds): {final}selected rounds {drop.mean:+.2f} "
                                               f"({seeds('drop')}), "
                                               "the honest clients against the same clients without faults; "
                                               f"baseline config hash {_text(drop.baseline_config_hash)}"))
    return rows


def _headline_label(g: SettingGroup) -> str:
    """What the group's headline figure is (``headline``), and whether its records fell back."""
    basis = group_basis(g)
    if basis == FINAL:
        return f"final: each run's mean over its last {FINAL_ROUNDS} evaluated rounds (the selected round's beside it)"
    return (f"{_text(basis)}: " + FALLBACK_NOTE.removeprefix(FALLBACK_MARK + " ")) if basis else "-"


def _selection_label(g: SettingGroup) -> str:
    """The rule that selected the reported round (``Loaded.selection_rule``), and what it reads."""
    if g.selection_rule == HONEST_SELECTION:
        return (f"{g.selection_rule}: the honest clients' validation, which no server can know "
                "(written before issue 30; kept apart from records selected on every client's validation)")
    if g.selection_rule == POOLED_SELECTION_RULE:
        return (f"{g.selection_rule}: every client's model on every client's validation half, pooled "
                "(each client's own half holds one class)")
    return _text(g.selection_rule) + (": every client's validation" if g.selection_rule == SELECTION_RULE else "")


def _final_rows(g: SettingGroup, groups: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """The final global accuracy (mean over the last evaluated rounds) over each client group; '-'
    where the records predate a group's final figures (schema 1.5)."""
    return [(f"final global acc, {who}", _pm(st.mean, st.sd))
            for clients, who in groups for st in [g.final_stat("global_acc", clients)]]


def _modality_rows(g: SettingGroup) -> list[tuple[str, str]]:
    """A multimodal group: its modalities, whose figure the headline is, the recipients', donors'
    and all clients' accuracy, and which clients each seed drew as recipients."""
    if not g.is_multimodal:
        return []
    sections = [(r.seed, modalities_section(r.record)) for r in g.ok]
    names = next((s.get("names") for _, s in sections if s.get("names")), None)
    rows = [("modalities", f"{g.modalities} (modalities: {_text(names)})"),
            ("headline", "recipients (metrics.recipients): the clients that miss a modality"
                         if g.headline_clients == "recipients" else "all clients (no client misses a modality)")]
    for metric, label in (("global_acc", "global acc"), ("local_acc", "local acc")):
        for clients, who in (("recipients", "recipients"), ("donors", "donors"), ("all", "all clients")):
            st = g.stat(metric, clients=clients)
            rows.append((f"selected {label}, {who}", _pm(st.mean, st.sd)))
    rows += _final_rows(g, (("recipients", "recipients"), ("donors", "donors"), ("all", "all clients")))
    drawn = "; ".join(f"seed {_text(seed)}: {_text(s.get('recipients'))}" for seed, s in sections)
    rows.append(("recipients by seed", drawn or "-"))
    return rows


def _paired(g: SettingGroup, table: Optional[Any]) -> Optional[dict[str, Any]]:
    """The group page's paired comparisons: every method of its protocol against the protocol's
    reference (``paired_view.default_reference``), this group's row marked; None where there is no
    other method to compare."""
    from hfl_bench.results.paired_view import comparison_row

    if table is None:
        return None
    why = ("no collaboration: the baseline every method must beat" if table.reference.group.method == "local"
           else "the protocol's best group: local did not run here")
    return {"reference": table.reference.label, "why": why, "notes": table.notes,
            "rows": [comparison_row(c) | {"this": c.a.group is g, "resolved": c.resolved} for c in table.comparisons],
            "this_is_reference": table.reference.group is g}


def _fairness_rows(g: SettingGroup) -> list[dict[str, str]]:
    """Each seed's fairness figures (``fairness``), its local twin's record by its shown path; []
    where no seed has per-client figures."""
    def num(x: Optional[float]) -> str:
        return NOT_AVAILABLE if x is None else f"{x:.2f}"

    return [{"seed": _text(s.seed), "n_clients": str(s.n_clients), "client_sd": num(s.client_sd),
             "worst10": num(s.worst10), "below_local": num(s.below_local),
             "local_record": str(shown_path(s.local_record)) if s.local_record else "-"}
            for s in group_fairness(g).seeds]


def _clock_rows(g: SettingGroup) -> list[dict[str, str]]:
    """Each seed's simulated time (``timing``): total, the local twin's target and the time to reach
    it (or why not); [] where no seed has a clock."""
    timing = group_timing(g)

    def num(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"

    return [{"seed": _text(s.seed), "sim_time": num(s.sim_time), "target": num(s.target),
             "time_to_local": num(s.time_to_local) if s.time_to_local is not None
             else timing.why_missing(s.seed, "time_to_local")}
            for s in timing.seeds]


def _group_page(g: SettingGroup, sg: Optional[SeedGroup], row: dict[str, Any], hrefs: dict[int, str],
                table: Optional[Any] = None) -> dict[str, Any]:
    first = (sg.describing() if sg else g.ok[0]).record
    task = first["task"]
    cfg = first.get("config") or {}
    setting = [
        ("method", g.method), ("task", g.task), ("pool", g.pool), ("setting section", g.section),
        *[("why apart", reason) for reason in section_reasons(g.section)],
        ("evaluated predictor", g.predictor),
        ("protocol", protocol_label(g)), ("data", g.data_label),
        ("partition", partition_label(g.partition_scheme, g.partition_params)),
        ("clients (active per round)", f"{_text(g.n_clients)} ({_text(g.clients_per_round)})"),
        ("rounds", _text(g.rounds)), ("local epochs", _text(g.local_epochs)),
        ("method params", _text(g.method_params)), ("method hparams", _text(g.hparams)),
        ("fidelity", row["fidelity"]), ("method version", row["version"]), ("faults", row["faults"]),
        *_fault_rows(g), *_modality_rows(g),
        ("config hash", g.config_hash), ("group id", g.group_id),
        ("split by partition hash", "yes" if g.split_by_partition else "no"),
        ("seeds recorded twice", g.copies_note or "none"),
        ("data", f"task version {_text(task.get('version'))}, train {_text(task.get('n_train'))}, "
                 f"test {_text(task.get('n_test'))}, fingerprint {_text(task.get('data_fingerprint'))}"),
        ("selection", _selection_label(g)),
        ("headline statistic", _headline_label(g)),
    ]
    return {
        "title": f"{g.method} on {g.task} ({g.pool})", "row": row, "setting": setting,
        "config": [(k, _text(v)) for k, v in cfg.items()],
        "matches": [{"cells": p, "differences": m.differences} for p, m in zip(row["published"], g.published)],
        "per_class": _per_class(g), "per_arch": _per_arch(g), "seen_unseen": _seen_unseen(g),
        "endpoints": _endpoints(g),
        "paired": _paired(g, table),
        "fairness": _fairness_rows(g),
        "clock": _clock_rows(g), "clock_not_recorded": [_text(seed) for seed in group_timing(g).not_recorded],
        "multimodal": g.is_multimodal,
        "members": _members(sg, g, hrefs),
        "citation": _values(g.ok, "method", "citation"),
        "notes": list(dict.fromkeys(n for r in g.ok for n in (r.record["method"].get("notes") or []))),
    }


# ----------------------------------------------------------------------------- writing


def templates() -> dict[str, str]:
    """Every Jinja2 template of the site (``templates/*.html``, package data), by name."""
    folder = RESOURCES / "templates"
    return {t.name: t.read_text(encoding="utf-8") for t in folder.iterdir() if t.name.endswith(".html")}


def _environment():
    # Autoescape on: every value is HTML-escaped unless marked |safe, which only the CSP (built
    # from constants), SCRIPT and STYLE (package files) are.
    from jinja2 import DictLoader, Environment, StrictUndefined

    env = Environment(loader=DictLoader(templates()), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.globals["style"] = STYLE
    env.globals["section_reasons"] = section_reasons  # why a section stands apart, under its heading
    env.globals["header_cells"] = header_cells  # the leaderboard tables' cells, from the columns (escaped)
    env.globals["group_cells"] = group_cells
    return env


def check_inputs_outside(out_dir: Path, paths: list[Path]) -> None:
    """SiteError (one line) when an input path is the output folder or lies inside it: writing
    the site there would clear or overwrite the records it reads."""
    target = Path(out_dir).resolve()
    for p in paths:
        source = Path(p).resolve()
        if source == target or target in source.parents:
            raise SiteError(f"the input {p} is inside the output folder {out_dir}, which writing the site clears: "
                            "write the site to a folder outside the records")


def _inside(path: Path, folder: Path) -> bool:
    return Path(folder).resolve() in Path(path).resolve().parents


def _prepare(out_dir: Path) -> None:
    """An empty folder, or one this module wrote (its old pages cleared); never anything else."""
    if out_dir.exists() and not out_dir.is_dir():
        raise SiteError(f"{out_dir} is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not (out_dir / MARKER).exists():
            raise SiteError(f"{out_dir} holds files this command did not write (no {MARKER}); "
                            "give an empty or new folder")
        for name in GENERATED:
            p = out_dir / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text("Written by `hfl-bench leaderboard html`; regenerating clears this folder's pages.\n")


def _copy_records(records: list[Loaded], out_dir: Path) -> dict[int, str]:
    """Copy each record file to records/ under a safe, unique name; its href from the site root."""
    hrefs, used = {}, set()
    for r in sorted(records, key=lambda r: str(shown_path(r.path))):
        name = _safe_stem(Path(r.path).name) + ".json"
        if name in used:
            digest = hashlib.sha256(str(shown_path(r.path)).encode("utf-8")).hexdigest()[:10]
            name = f"{_safe_stem(Path(r.path).name)[:69]}-{digest}.json"
        used.add(name)
        shutil.copyfile(r.path, out_dir / "records" / name)
        hrefs[id(r)] = f"records/{name}"
    return hrefs


def _plots(paths: list[Path], out_dir: Path) -> tuple[list[dict[str, Any]], str]:
    from hfl_bench.results.plots import PlotError, make_plots

    try:
        written, _ = make_plots("all", paths, out_dir / "plots")
    except PlotError as e:
        return [], f"no plots: {e}"
    figures = []
    for w in written:
        sidecar = json.loads(Path(w.sources).read_text())
        figures.append({"task": w.task, "kind": w.kind, "section": w.section, "src": f"plots/{Path(w.png).name}",
                        "sources": f"plots/{Path(w.sources).name}", "caption": sidecar.get("caption", "")})
    return figures, ""


def build_site(out_dir: Path, paths: list[Path]) -> Site:
    """Write the site for the records under ``paths`` into ``out_dir`` (see the module doc).
    Raises ResultsError for a path that does not exist, SiteError for a folder it may not clear."""
    out_dir = Path(out_dir)
    paths = [shown_path(p) for p in paths]
    check_inputs_outside(out_dir, paths)  # regenerating clears the folder: never the records it reads
    loaded, not_records = load_records(paths)  # ResultsError before anything is written
    loaded = [r for r in loaded if not _inside(r.path, out_dir)]  # an earlier site's copies: not inputs
    records, excluded = board_records(loaded)
    skipped = not_records + excluded
    board = build_board(records, skipped=[s.line() for s in skipped])
    _prepare(out_dir)
    (out_dir / "records").mkdir()
    (out_dir / "groups").mkdir()
    hrefs = _copy_records(records, out_dir)
    figures, plot_note = _plots(paths, out_dir)

    seed_groups = _seed_group_of(board.groups, group_seeds(records))
    env = _environment()
    sections: dict[tuple, dict[str, Any]] = {}
    pages = []
    labels = protocol_labels(board.groups)
    taken: set[str] = set()
    for g in board.groups:
        sg = seed_groups.get(id(g))
        row = _row(g)
        row["page"] = _page_name(g, row, taken)
        pages.append((g, sg, row))
        label = labels[g.protocol()]  # the data appended where one task's protocols differ only in it
        key = (g.section_key(), g.section, g.task, label)  # one setting section after another
        section = sections.setdefault(key, {"setting": g.section, "task": g.task, "protocol": label, "rows": []})
        section["rows"].append(row)
    ordered = [sections[k] for k in sorted(sections)]
    rows = [row for s in ordered for row in s["rows"]]
    has_faults = any(row["faults"] != "none" for row in rows)
    has_modalities = any(row["group"].is_multimodal for row in rows)
    has_clock = any(group_timing(row["group"]).seeds for row in rows)  # a clock's columns only where one ran
    ranked = with_rank_intervals(rank_methods(board.groups), board.groups)
    paired_tables = page_tables(board.groups)
    _, unmatched = display_rows(board)
    reproduced = [r for r in records if r.kind == "reproduced"]
    published = [r for r in records if r.kind != "reproduced"]
    drawn = [{"path": str(shown_path(r.path)), "href": hrefs[id(r)], "kind": r.kind, "method": r.method,
              "task": r.task, "status": _text(r.status)}
             for r in sorted(records, key=lambda r: str(shown_path(r.path)))]

    index = env.get_template("index.html").render(
        csp=csp(SCRIPT), script=SCRIPT, root="", sections=ordered, has_faults=has_faults, has_clock=has_clock,
        has_modalities=has_modalities, modalities=sorted({row["modalities"] for row in rows}),
        methods=sorted({row["group"].method for row in rows}), pools=sorted({row["group"].pool for row in rows}),
        faults=sorted({row["faults"] for row in rows}), settings=list(dict.fromkeys(s["setting"] for s in ordered)),
        rank=by_section(rank_rows(ranked)), unranked=unranked_lines(unranked_methods(board.groups, ranked)),
        unmatched=unmatched,
        unmatched_columns=UNMATCHED_COLUMNS, figures=figures, plot_note=plot_note, drawn=drawn,
        skipped=[{"path": str(shown_path(s.path)) if s.path else "", "reason": s.reason, "line": s.line()}
                 for s in skipped],
        n_records=len(records), n_reproduced=len(reproduced), n_published=len(published),
        n_groups=len(board.groups), inputs=[str(p) for p in paths],
    )
    (out_dir / "index.html").write_text(index, encoding="utf-8")
    written = []
    group_template = env.get_template("group.html")
    for g, sg, row in pages:
        page = out_dir / "groups" / row["page"]
        page.write_text(group_template.render(csp=csp(None), root="../", has_faults=has_faults, has_clock=has_clock,
                                              has_modalities=has_modalities,
                                              **_group_page(g, sg, row, hrefs, paired_tables.get(g.group_id))),
                        encoding="utf-8")
        written.append(page)
    return Site(out_dir / "index.html", len(records), len(board.groups), written, skipped,
                [out_dir / f["src"] for f in figures], plot_note)
