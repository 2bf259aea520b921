"""The leaderboard as a static HTML site (``hfl-bench leaderboard html OUT_DIR [RECORDS...]``).

One ``index.html`` (per task and protocol a sortable table of groups with the published figures
beside them, a filter by method, pool, fault and modality setting, the cross-task rank, the plots,
which records were drawn and which were left out and why; a multimodal group's recipients' headline
with its donors', all clients' and endpoints' figures under it), one page per record group under
``groups/`` (resolved config, provenance, per-class and per-architecture tables, links to the records), the
record files copied under ``records/`` and the plots (``plots.make_plots``) under ``plots/``.

Safe to open from ``file://`` or any static host, and safe with hostile records:

- no server, CDN or network: every asset is inline or a relative file, and each page carries a
  Content-Security-Policy that forbids fetching anything (``default-src 'none'``; images from the
  site itself; the one inline script allowed by its hash, so an injected script would not run
  even if escaping failed);
- every string from a record is HTML-escaped (Jinja2 autoescape; no ``|safe`` on record text);
- file names are built from safe components only: a group page is named by a hash of the group's
  key, a copied record by its file name reduced to ``[A-Za-z0-9_-]`` (never by record text).

The site is deterministic (no dates, paths relative to the working folder where they lie under
it), so regenerating it gives no diff. The rows come from the leaderboard (``board``,
``render.display_rows``, ``ranking``): the site and ``leaderboard show`` never disagree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from hfl_bench.results.board import Board, board_records, build_board
from hfl_bench.results.grouping import SeedGroup, group_seeds
from hfl_bench.results.loading import Loaded, ResultsError, Skipped, load_records
from hfl_bench.results.ranking import protocol_label, protocol_labels, rank_methods
from hfl_bench.results.render import KIND, UNMATCHED_COLUMNS, _num, _pm, display_rows, drop_label, rank_rows
from hfl_bench.results.setting import Group, Stat, canonical, modalities_section, partition_label

# Marks a folder this module wrote, so regenerating may clear its old pages, and nothing else.
MARKER = ".hfl-bench-site"
GENERATED = ("index.html", "groups", "records", "plots", "site.json")

# The one script of the index (sorting and filtering), allowed by its hash in the CSP. It reads
# record text only through the DOM (dataset, textContent), never as HTML.
SCRIPT = """
(function () {
  "use strict";
  function key(tbody, col, type) {
    var cell = tbody.rows[0].cells[col];
    var v = cell.getAttribute("data-v");
    if (v === null) v = cell.textContent.trim();
    if (type === "num") { var x = parseFloat(v); return isNaN(x) ? null : x; }
    return v.toLowerCase();
  }
  function sortBy(th) {
    var table = th.closest("table"), col = th.cellIndex, type = th.getAttribute("data-type");
    var asc = th.getAttribute("aria-sort") !== "ascending";
    var bodies = Array.prototype.slice.call(table.tBodies);
    bodies.sort(function (a, b) {
      var x = key(a, col, type), y = key(b, col, type);
      if (x === y) return 0;
      if (x === null) return 1;  // missing values last either way
      if (y === null) return -1;
      return (x < y ? -1 : 1) * (asc ? 1 : -1);
    });
    bodies.forEach(function (b) { table.appendChild(b); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th); });
  });
  var selects = document.querySelectorAll("select[data-filter]");
  function applyFilter() {
    var want = {};
    selects.forEach(function (s) { want[s.getAttribute("data-filter")] = s.value; });
    document.querySelectorAll("section.protocol").forEach(function (sec) {
      var shown = 0;
      sec.querySelectorAll("tbody.group").forEach(function (tb) {
        var ok = Object.keys(want).every(function (k) { return want[k] === "" || tb.dataset[k] === want[k]; });
        tb.hidden = !ok;
        shown += ok ? 1 : 0;
      });
      sec.hidden = shown === 0;
    });
  }
  selects.forEach(function (s) { s.addEventListener("change", applyFilter); });
})();
"""


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


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _text(v: Any) -> str:
    """A value as one text: strings as themselves, anything else as canonical JSON."""
    if v is None:
        return "-"
    return v if isinstance(v, str) else canonical(v)


def _values(records: Iterable[Loaded], *keys: str) -> str:
    """The distinct values of one field over records ("-" when none carries it)."""
    seen: list[str] = []
    for r in records:
        v = _get(r.record, *keys)
        if v is not None and _text(v) not in seen:
            seen.append(_text(v))
    return ", ".join(seen) or "-"


def _bytes(x: Optional[float]) -> str:
    if x is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:.0f} B"


# ----------------------------------------------------------------------------- the board's groups


def _seed_group_of(groups: list[Group], seed_groups: list[SeedGroup]) -> dict[int, SeedGroup]:
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


def _page_name(g: Group, members: list[Loaded]) -> str:
    """A group page's file name: a hash of the group's key (task, group id, its record files)."""
    key = json.dumps([g.task, g.group_id, sorted(str(shown_path(r.path)) for r in members)])
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16] + ".html"


def _row(g: Group) -> dict[str, Any]:
    """One group's row, a multimodal group's other figures and the published rows beside it
    (``render.display_rows``), with the figures the site adds (fidelity, version, faults and the
    drop, cost) and the numbers to sort by."""
    rows, _ = display_rows(Board([g], [], []))
    head = rows[0]
    clients = [r for r in rows[1:] if r[KIND] == "clients"]
    published = [r for r in rows[1:] if r[KIND] == "published"]
    gl, lo, final = g.stat("global_acc"), g.stat("local_acc"), g.final_stat("global_acc")
    sent = Stat.of(_get(r.record, "cost", "bytes_sent_per_client_per_round") for r in g.ok)
    wall = Stat.of((t / 60 if isinstance(t, (int, float)) else None)
                   for t in (_get(r.record, "cost", "wall_time_total_s") for r in g.ok))
    return {
        "cells": head, "clients": clients, "published": published, "group": g, "modalities": g.modalities,
        "fidelity": _values(g.ok, "method", "fidelity"), "version": head["version"],
        "faults": g.faults, "drop": drop_label(g) or "", "drop_v": g.drop.mean if g.drop is not None else None,
        "global_v": gl.mean, "local_v": lo.mean, "final_v": final.mean, "seeds_v": len(g.ok), "bytes_v": sent.mean, "minutes_v": wall.mean,
        "bytes": _bytes(sent.mean), "minutes": _num(wall.mean),
        "delta_v": next((m.delta for m in g.published if m.delta is not None), None),
    }


# ----------------------------------------------------------------------------- group pages


def _per_class(g: Group) -> list[dict[str, str]]:
    accs = [r.record["metrics"]["per_class_global_acc"] for r in g.ok
            if _get(r.record, "metrics", "per_class_global_acc")]
    if not accs:
        return []
    n = max(len(a) for a in accs)
    supports = []
    for r in g.ok:
        counts = _get(r.record, "partition", "train_counts")
        if counts and all(len(row) == n for row in counts):
            supports.append([sum(row[c] for row in counts) for c in range(n)])
    rows = []
    for c in range(n):
        s = Stat.of(a[c] if c < len(a) else None for a in accs)
        support = Stat.of(sp[c] for sp in supports)
        rows.append({"class": str(c), "support": _num(support.mean, 1), "acc": _pm(s.mean, s.sd), "n": str(s.n)})
    return rows


def _per_arch(g: Group) -> list[dict[str, str]]:
    archs: list[str] = []
    for r in g.ok:
        archs += [a for a in (_get(r.record, "metrics", "per_arch_global_acc") or {}) if a not in archs]
    rows = []
    for a in archs:
        s = Stat.of((_get(r.record, "metrics", "per_arch_global_acc") or {}).get(a) for r in g.ok)
        rows.append({"arch": a, "acc": _pm(s.mean, s.sd), "n": str(s.n)})
    return rows


def _endpoints(g: Group) -> list[dict[str, str]]:
    """Each extra endpoint's figures: over all clients, or for a multimodal group over the
    recipients, the donors and all clients (one row each)."""
    who = (("headline", ""),)
    if g.is_multimodal:
        who = (("recipients", "recipients"), ("donors", "donors"), ("all", "all clients"))
    out = []
    for e in g.endpoints():
        for clients, label in who:
            gl, lo = g.stat("global_acc", e, clients), g.stat("local_acc", e, clients)
            out.append({"endpoint": e, "clients": label, "global": _pm(gl.mean, gl.sd), "local": _pm(lo.mean, lo.sd),
                        "n": str(gl.n)})
    return out


def _members(sg: Optional[SeedGroup], g: Group, hrefs: dict[int, str]) -> list[dict[str, Any]]:
    records = sg.records if sg else g.ok
    ok = {id(r) for r in g.ok}
    dup = {id(r) for r in sg.duplicates} if sg else set()
    out = []
    for r in records:
        role = "seed" if id(r) in ok else "duplicate (not counted)" if id(r) in dup else f"status {_text(r.status)}"
        code = r.record.get("code") if isinstance(r.record.get("code"), dict) else {}
        env = r.record.get("environment") if isinstance(r.record.get("environment"), dict) else {}
        out.append({
            "path": str(shown_path(r.path)), "href": hrefs.get(id(r)), "record_id": r.record_id, "seed": _text(r.seed),
            "status": _text(r.status), "role": role, "date": _text(r.record.get("date")),
            "partition_hash": _text(r.partition_hash), "error": _text(r.record.get("error")),
            "code": [(k, _text(v)) for k, v in code.items()], "environment": [(k, _text(v)) for k, v in env.items()],
            "plugin_dist": {"method": _text(_get(r.record, "method", "plugin_dist")),
                            "task": _text(_get(r.record, "task", "plugin_dist")),
                            "pool": _text(_get(r.record, "arch_pool", "plugin_dist"))},
        })
    return out


def _fault_rows(g: Group) -> list[tuple[str, str]]:
    """A group run with faults: whose figure the headline is, the all-client figures, the drop and
    the seeds it paired."""
    if not g.has_faults:
        return []
    every, honest = g.stat("global_acc", clients="all"), g.stat("global_acc", clients="honest")
    faulty = g.stat("global_acc", clients="faulty")
    rows = [("headline", "honest clients (metrics.honest)"),
            ("global acc, honest clients", _pm(honest.mean, honest.sd)),
            ("global acc, faulty clients", _pm(faulty.mean, faulty.sd)),
            ("global acc, all clients", _pm(every.mean, every.sd))]
    rows += _final_rows(g, (("honest", "honest clients"), ("faulty", "faulty clients"), ("all", "all clients")))
    drop = g.drop
    if drop is None or drop.mean is None:
        rows.append(("drop against no faults", "- (no fault-free record of the same config and seed)"))
    else:
        pairs = ", ".join(f"seed {p.seed}: {p.drop:+.2f}" for p in drop.pairs if p.drop is not None)
        rows.append(("drop against no faults", f"{drop.mean:+.2f} over {drop.n_paired} paired seeds ({pairs}); "
                                               f"baseline config hash {_text(drop.baseline_config_hash)}"))
    return rows


def _final_rows(g: Group, groups: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """The final global accuracy (mean over the last evaluated rounds) over each client group; '-'
    where the records predate a group's final figures (schema 1.5)."""
    return [(f"final global acc, {who}", _pm(st.mean, st.sd))
            for clients, who in groups for st in [g.final_stat("global_acc", clients)]]


def _modality_rows(g: Group) -> list[tuple[str, str]]:
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
            rows.append((f"{label}, {who}", _pm(st.mean, st.sd)))
    rows += _final_rows(g, (("recipients", "recipients"), ("donors", "donors"), ("all", "all clients")))
    drawn = "; ".join(f"seed {_text(seed)}: {_text(s.get('recipients'))}" for seed, s in sections)
    rows.append(("recipients by seed", drawn or "-"))
    return rows


def _group_page(g: Group, sg: Optional[SeedGroup], row: dict[str, Any], hrefs: dict[int, str]) -> dict[str, Any]:
    first = (sg.describing() if sg else g.ok[0]).record
    task = first.get("task") if isinstance(first.get("task"), dict) else {}
    cfg = first.get("config") if isinstance(first.get("config"), dict) else {}
    setting = [
        ("method", g.method), ("task", g.task), ("pool", g.pool), ("protocol", protocol_label(g)), ("data", g.data_label),
        ("partition", partition_label(g.partition_scheme, g.partition_params)),
        ("clients (active per round)", f"{_text(g.n_clients)} ({_text(g.clients_per_round)})"),
        ("rounds", _text(g.rounds)), ("local epochs", _text(g.local_epochs)),
        ("method params", _text(g.method_params)), ("method hparams", _text(g.hparams)),
        ("fidelity", row["fidelity"]), ("method version", row["version"]), ("faults", row["faults"]),
        *_fault_rows(g), *_modality_rows(g),
        ("config hash", g.config_hash), ("group id", g.group_id),
        ("split by partition hash", "yes" if g.split_by_partition else "no"),
        ("data", f"task version {_text(task.get('version'))}, train {_text(task.get('n_train'))}, "
                 f"test {_text(task.get('n_test'))}, fingerprint {_text(task.get('data_fingerprint'))}"),
        ("selection", _values(g.ok, "selection", "rule")),
    ]
    return {
        "title": f"{g.method} on {g.task} ({g.pool})", "row": row, "setting": setting,
        "config": [(k, _text(v)) for k, v in cfg.items()],
        "matches": [{"cells": p, "differences": m.differences} for p, m in zip(row["published"], g.published)],
        "per_class": _per_class(g), "per_arch": _per_arch(g), "endpoints": _endpoints(g),
        "multimodal": g.is_multimodal,
        "members": _members(sg, g, hrefs),
        "citation": _values(g.ok, "method", "citation"),
        "notes": list(dict.fromkeys(n for r in g.ok for n in (_get(r.record, "method", "notes") or [])
                                    if isinstance(n, str))),
    }


# ----------------------------------------------------------------------------- writing


def _environment():
    from jinja2 import DictLoader, Environment, StrictUndefined

    env = Environment(loader=DictLoader(TEMPLATES), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
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
        figures.append({"task": w.task, "kind": w.kind, "src": f"plots/{Path(w.png).name}",
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
    for g in board.groups:
        sg = seed_groups.get(id(g))
        row = _row(g)
        row["page"] = _page_name(g, sg.records if sg else g.ok)
        pages.append((g, sg, row))
        label = labels[g.protocol()]  # the data appended where one task's protocols differ only in it
        sections.setdefault((g.task, label), {"task": g.task, "protocol": label, "rows": []})["rows"].append(row)
    ordered = [sections[k] for k in sorted(sections)]
    rows = [row for s in ordered for row in s["rows"]]
    has_faults = any(row["faults"] != "none" for row in rows)
    has_modalities = any(row["group"].is_multimodal for row in rows)
    ranked = rank_methods(board.groups)
    _, unmatched = display_rows(board)
    reproduced = [r for r in records if r.kind == "reproduced"]
    published = [r for r in records if r.kind != "reproduced"]
    drawn = [{"path": str(shown_path(r.path)), "href": hrefs[id(r)], "kind": r.kind, "method": r.method,
              "task": r.task, "status": _text(r.status)} for r in sorted(records, key=lambda r: str(shown_path(r.path)))]

    index = env.get_template("index.html").render(
        csp=csp(SCRIPT), script=SCRIPT, root="", sections=ordered, has_faults=has_faults,
        has_modalities=has_modalities, modalities=sorted({row["modalities"] for row in rows}),
        methods=sorted({row["group"].method for row in rows}), pools=sorted({row["group"].pool for row in rows}),
        faults=sorted({row["faults"] for row in rows}), rank=rank_rows(ranked), unmatched=unmatched,
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
        page.write_text(group_template.render(csp=csp(None), root="../", has_faults=has_faults,
                                              has_modalities=has_modalities,
                                              **_group_page(g, sg, row, hrefs)), encoding="utf-8")
        written.append(page)
    return Site(out_dir / "index.html", len(records), len(board.groups), written, skipped,
                [out_dir / f["src"] for f in figures], plot_note)


# ----------------------------------------------------------------------------- templates

# Jinja2 templates (autoescape on: every value is HTML-escaped unless marked |safe, which only
# the CSP, built from constants, and SCRIPT are). Kept here, not as package data, so an installed
# package needs no data files.
TEMPLATES = {
    "base.html": r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp|safe }}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}{% endblock %}</title>
<style>
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #1b1b1b; }
h1 { font-size: 1.5em; margin: 0 0 .3em; } h2 { font-size: 1.2em; margin-top: 1.6em; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; }
th, td { border: 1px solid #d0d0d0; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f2f5; }
table.sortable th { cursor: pointer; user-select: none; white-space: nowrap; }
table.sortable th[aria-sort="ascending"]::after { content: " \25B2"; }
table.sortable th[aria-sort="descending"]::after { content: " \25BC"; }
td.num, th.num { text-align: right; white-space: nowrap; }
tr.published td, tr.clients td { color: #555; background: #fafafa; font-size: 12px; }
tbody.group { border-top: 2px solid #bbb; }
.note { color: #555; } .mono, code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
.filters label { margin-right: 1em; }
figure { display: inline-block; margin: .5em; max-width: 48%; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 11px; color: #555; }
details { margin: .5em 0; }
</style>
</head>
<body>
{% block body %}{% endblock %}
</body>
</html>
""",
    "_row.html": r"""{# One group (tbody): its row, then the published figures beside it. #}
{% macro group_rows(row, root, has_faults, has_modalities=False, link=True) %}
{% set g = row.group %}
<tbody class="group" data-method="{{ g.method }}" data-pool="{{ g.pool }}" data-faults="{{ row.faults }}"{% if has_modalities %} data-modalities="{{ row.modalities }}"{% endif %}>
<tr class="reproduced">
<td>{% if link %}<a href="{{ root }}groups/{{ row.page }}">{{ row.cells["method"] }}</a>{% else %}{{ row.cells["method"] }}{% endif %}</td>
<td>{{ row.fidelity }}</td>
<td>{{ row.version }}</td>
<td>{{ row.cells["pool"] }}</td>
{% if has_faults %}<td>{{ row.faults }}</td>{% endif %}
<td>{{ row.cells["setting"] }}</td>
<td class="num" data-v="{{ row.seeds_v }}">{{ row.cells["seeds"] }}</td>
<td class="num" data-v="{{ row.global_v if row.global_v is not none else '' }}">{{ row.cells["global acc"] }}</td>
{% if has_faults %}<td class="num" data-v="{{ row.drop_v if row.drop_v is not none else '' }}">{{ row.drop }}</td>{% endif %}
<td class="num" data-v="{{ row.local_v if row.local_v is not none else '' }}">{{ row.cells["local acc"] }}</td>
<td class="num" data-v="{{ row.final_v if row.final_v is not none else '' }}">{{ row.cells["final global"] }}</td>
<td class="num" data-v="{{ g.n_failed }}">{{ g.n_failed }}</td>
<td class="num" data-v="{{ g.n_diverged }}">{{ g.n_diverged }}</td>
<td class="num" data-v="{{ row.bytes_v if row.bytes_v is not none else '' }}">{{ row.bytes }}</td>
<td class="num" data-v="{{ row.minutes_v if row.minutes_v is not none else '' }}">{{ row.minutes }}</td>
<td></td><td></td><td></td>
<td class="num" data-v="{{ row.delta_v if row.delta_v is not none else '' }}"></td>
</tr>
{% for c in row.clients %}
<tr class="clients">
<td>{{ c["method"] }}</td><td colspan="{{ 4 if has_faults else 3 }}">besides the recipients' headline</td>
<td></td>
<td class="num">{{ c["seeds"] }}</td>
<td class="num">{{ c["global acc"] }}</td>
{% if has_faults %}<td></td>{% endif %}
<td class="num">{{ c["local acc"] }}</td>
<td colspan="9"></td>
</tr>
{% endfor %}
{% for p in row.published %}
<tr class="published">
<td>{{ p["method"] }}</td><td colspan="{{ 4 if has_faults else 3 }}">published figure</td>
<td>{{ p["setting"] }}</td>
<td class="num">{{ p["seeds"] }}</td>
<td class="num">{{ p["global acc"] }}</td>
{% if has_faults %}<td></td>{% endif %}
<td class="num">{{ p["local acc"] }}</td>
<td colspan="5"></td>
<td>{{ p["source"] }}</td><td>{{ p["locator"] }}</td><td>{{ p["match"] }}</td>
<td class="num">{{ p["delta"] }}</td>
</tr>
{% endfor %}
</tbody>
{% endmacro %}

{% macro header(has_faults) %}
<thead><tr>
<th data-type="text">method</th><th data-type="text">fidelity</th><th data-type="text">version</th>
<th data-type="text">pool</th>{% if has_faults %}<th data-type="text">faults</th>{% endif %}
<th data-type="text">setting</th><th class="num" data-type="num">seeds</th>
<th class="num" data-type="num">global acc</th>{% if has_faults %}<th class="num" data-type="num">drop</th>{% endif %}
<th class="num" data-type="num">local acc</th>
<th class="num" data-type="num">final global</th>
<th class="num" data-type="num">failed</th><th class="num" data-type="num">diverged</th>
<th class="num" data-type="num">bytes / client / round</th><th class="num" data-type="num">min / run</th>
<th data-type="text">source</th><th data-type="text">locator</th><th data-type="text">match</th>
<th class="num" data-type="num">delta</th>
</tr></thead>
{% endmacro %}
""",
    "index.html": r"""{% extends "base.html" %}
{% from "_row.html" import group_rows, header %}
{% block title %}hfl-bench leaderboard{% endblock %}
{% block body %}
<h1>hfl-bench leaderboard</h1>
<p class="note">Generated from {{ n_records }} records ({{ n_reproduced }} reproduced in {{ n_groups }} groups,
{{ n_published }} published){% if skipped %}; {{ skipped|length }} left out{% endif %}.
Reproduced runs are grouped over seeds (and method versions: never averaged across): mean ± sample sd (ddof = 1;
"-" for one seed) of global and local accuracy at the selected round (best mean validation accuracy), and of the
final global accuracy (each run's mean over its last 10 evaluated rounds, over the headline's clients: "-" where
records of a run with faults or of a multimodal run are older than schema 1.5 and hold only all clients' final figures);
failed and diverged runs are counted, never averaged in.{% if has_faults %} Under faults the headline is the honest
clients' accuracy, and drop = honest global accuracy with faults − the same seed's global accuracy without faults,
mean over the paired seeds (n), "-" when no fault-free record of the same config and seed is here.{% endif %}{% if has_modalities %} 
For a multimodal task (setting missing=MODALITY recipients=FRACTION, a protocol of its own) the headline global and local
accuracy is the recipients' (the clients that miss a modality; all clients' where none does); the ↳ rows under such a
group give the donors', all clients' and each extra endpoint's figures.{% endif %} Published figures sit beside the groups whose setting they
do not contradict; delta = reproduced − published. Click a column header to sort; a method opens its group's page.</p>

<div class="filters">
<label>method <select data-filter="method" id="filter-method"><option value="">all</option>
{% for m in methods %}<option value="{{ m }}">{{ m }}</option>{% endfor %}</select></label>
<label>pool <select data-filter="pool" id="filter-pool"><option value="">all</option>
{% for p in pools %}<option value="{{ p }}">{{ p }}</option>{% endfor %}</select></label>
{% if has_faults %}
<label>faults <select data-filter="faults" id="filter-faults"><option value="">all</option>
{% for f in faults %}<option value="{{ f }}">{{ f }}</option>{% endfor %}</select></label>
{% endif %}
{% if has_modalities %}
<label>modalities <select data-filter="modalities" id="filter-modalities"><option value="">all</option>
{% for m in modalities %}<option value="{{ m }}">{{ m }}</option>{% endfor %}</select></label>
{% endif %}
</div>

{% for s in sections %}
<section class="protocol">
<h2>{{ s.task }} <span class="note">— {{ s.protocol }}</span></h2>
<table class="sortable leaderboard">
{{ header(has_faults) }}
{% for row in s.rows %}{{ group_rows(row, root, has_faults, has_modalities) }}{% endfor %}
</table>
</section>
{% else %}
<p>No reproduced records.</p>
{% endfor %}

<h2 id="rank">Rank across tasks</h2>
<p class="note">Within each protocol (task, partition and public hold-out, N, active clients, rounds) run by two or more
methods, methods are ranked by their best group's mean global accuracy; ties share the average rank. A method's score
is its mean rank over its protocols.{% if has_modalities %} A multimodal group's protocol includes its modality setting,
and its accuracy there is the recipients'.{% endif %}</p>
{% if rank %}
<table class="rank">
<thead><tr><th>#</th><th>method</th><th class="num">mean rank</th><th class="num">protocols</th><th>ranks</th></tr></thead>
<tbody>
{% for r in rank %}<tr><td>{{ r["#"] }}</td><td>{{ r["method"] }}</td><td class="num">{{ r["mean rank"] }}</td><td class="num">{{ r["protocols"] }}</td><td>{{ r["ranks"] }}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}
<p>No protocol was run by two or more methods.</p>
{% endif %}

{% if unmatched %}
<h2 id="unmatched">Published figures with no reproduced group</h2>
<table class="unmatched">
<thead><tr>{% for c in unmatched_columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>
{% for r in unmatched %}<tr>{% for c in unmatched_columns %}<td>{{ r[c] }}</td>{% endfor %}</tr>
{% endfor %}
</tbody>
</table>
{% endif %}

<h2 id="plots">Plots</h2>
{% if figures %}
<p class="note">Seeds of one setting drawn as their mean with a min–max band or error bar; each figure's
<code>.sources.json</code> lists the records it drew and the ones it left out.</p>
{% for f in figures %}
<figure><a href="{{ f.src }}"><img src="{{ f.src }}" alt="{{ f.kind }} plot for {{ f.task }}"></a>
<figcaption>{{ f.kind }} — {{ f.task }} (<a href="{{ f.sources }}">sources</a>)</figcaption></figure>
{% endfor %}
{% else %}
<p>{{ plot_note }}</p>
{% endif %}

<h2 id="records">Records</h2>
<p>Read from: {% for p in inputs %}<code>{{ p }}</code>{% if not loop.last %}, {% endif %}{% endfor %}.</p>
<details><summary>Drawn: {{ drawn|length }} records</summary>
<table class="drawn">
<thead><tr><th>file</th><th>kind</th><th>task</th><th>method</th><th>status</th></tr></thead>
<tbody>
{% for r in drawn %}<tr><td><a href="{{ r.href }}">{{ r.path }}</a></td><td>{{ r.kind }}</td><td>{{ r.task }}</td><td>{{ r.method }}</td><td>{{ r.status }}</td></tr>
{% endfor %}
</tbody>
</table>
</details>
<h3 id="skipped">Left out: {{ skipped|length }}</h3>
{% if skipped %}
<table class="skipped">
<thead><tr><th>file</th><th>why</th></tr></thead>
<tbody>
{% for s in skipped %}<tr><td>{{ s.path }}</td><td>{{ s.reason }}</td></tr>
{% endfor %}
</tbody>
</table>
{% else %}
<p>None: every file read is a valid record.</p>
{% endif %}
<script>{{ script|safe }}</script>
{% endblock %}
""",
    "group.html": r"""{% extends "base.html" %}
{% from "_row.html" import group_rows, header %}
{% block title %}{{ title }} — hfl-bench leaderboard{% endblock %}
{% block body %}
<p><a href="{{ root }}index.html">← leaderboard</a></p>
<h1>{{ title }}</h1>
<table class="summary">
{{ header(has_faults) }}
{{ group_rows(row, root, has_faults, has_modalities, link=False) }}
</table>

{% if matches %}
<h2>Published figures beside this group</h2>
<table class="matches">
<thead><tr><th>published as</th><th>figure</th><th>source</th><th>locator</th><th>match</th><th>delta</th><th>differences</th></tr></thead>
<tbody>
{% for m in matches %}<tr><td>{{ m.cells["method"] }}</td><td>{{ m.cells["global acc"] or m.cells["local acc"] }}</td><td>{{ m.cells["source"] }}</td><td>{{ m.cells["locator"] }}</td><td>{{ m.cells["match"] }}</td><td class="num">{{ m.cells["delta"] }}</td><td>{{ m.differences|join("; ") or "-" }}</td></tr>
{% endfor %}
</tbody>
</table>
{% endif %}

<h2>Setting</h2>
<table class="setting"><tbody>
{% for k, v in setting %}<tr><th>{{ k }}</th><td class="mono">{{ v }}</td></tr>
{% endfor %}
</tbody></table>
<p>Method citation: {{ citation }}</p>
{% if notes %}<ul class="notes">{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}

<h2>Resolved config</h2>
<table class="config"><tbody>
{% for k, v in config %}<tr><th>{{ k }}</th><td class="mono">{{ v }}</td></tr>
{% else %}<tr><td>The records carry no config.</td></tr>
{% endfor %}
</tbody></table>

<h2>Per class</h2>
{% if per_class %}
<p class="note">Global accuracy per class, mean ± sd over seeds; support: training samples summed over clients (mean over seeds).</p>
<table class="per-class">
<thead><tr><th>class</th><th class="num">support</th><th class="num">global acc</th><th class="num">seeds</th></tr></thead>
<tbody>
{% for r in per_class %}<tr><td>{{ r.class }}</td><td class="num">{{ r.support }}</td><td class="num">{{ r.acc }}</td><td class="num">{{ r.n }}</td></tr>
{% endfor %}
</tbody></table>
{% else %}<p>The records carry no per-class accuracy.</p>{% endif %}

<h2>Per architecture</h2>
{% if per_arch %}
<table class="per-arch">
<thead><tr><th>architecture</th><th class="num">global acc</th><th class="num">seeds</th></tr></thead>
<tbody>
{% for r in per_arch %}<tr><td>{{ r.arch }}</td><td class="num">{{ r.acc }}</td><td class="num">{{ r.n }}</td></tr>
{% endfor %}
</tbody></table>
{% else %}<p>The records carry no per-architecture accuracy.</p>{% endif %}

{% if endpoints %}
<h2>Extra endpoints</h2>
<table class="endpoints">
<thead><tr><th>endpoint</th>{% if multimodal %}<th>clients</th>{% endif %}<th class="num">global acc</th><th class="num">local acc</th><th class="num">seeds</th></tr></thead>
<tbody>
{% for e in endpoints %}<tr><td>{{ e.endpoint }}</td>{% if multimodal %}<td>{{ e.clients }}</td>{% endif %}<td class="num">{{ e.global }}</td><td class="num">{{ e.local }}</td><td class="num">{{ e.n }}</td></tr>
{% endfor %}
</tbody></table>
{% endif %}

<h2>Records and provenance</h2>
{% for m in members %}
<h3>{% if m.href %}<a href="{{ root }}{{ m.href }}">{{ m.path }}</a>{% else %}{{ m.path }}{% endif %}</h3>
<table class="provenance"><tbody>
<tr><th>record id</th><td class="mono">{{ m.record_id }}</td></tr>
<tr><th>seed</th><td>{{ m.seed }}</td></tr>
<tr><th>status</th><td>{{ m.status }} ({{ m.role }}){% if m.error != "-" %}: {{ m.error }}{% endif %}</td></tr>
<tr><th>date</th><td>{{ m.date }}</td></tr>
<tr><th>partition hash</th><td class="mono">{{ m.partition_hash }}</td></tr>
<tr><th>code</th><td class="mono">{% for k, v in m.code %}{{ k }}={{ v }}{% if not loop.last %}<br>{% endif %}{% else %}-{% endfor %}</td></tr>
<tr><th>plugin distributions</th><td class="mono">method={{ m.plugin_dist.method }}<br>task={{ m.plugin_dist.task }}<br>pool={{ m.plugin_dist.pool }}</td></tr>
<tr><th>environment</th><td class="mono">{% for k, v in m.environment %}{{ k }}={{ v }}{% if not loop.last %}<br>{% endif %}{% else %}-{% endfor %}</td></tr>
</tbody></table>
{% endfor %}
{% endblock %}
""",
}
