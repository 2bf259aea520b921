"""The leaderboard as rows: the terminal table (rich), markdown, csv and json, and the rank.

Every view shows one setting section at a time (``SettingGroup.section``: which rows compete):
the table and markdown one table per section under its label (``by_section``), csv and json a
``section`` field on each group, the rank one ranking per section. Where a label is shown, the
reason a section stands apart goes with it (``section_title``; json: ``section_reasons``).

Every view shows the predictor each group's headline evaluated (``SettingGroup.predictor``: the
``predictor`` column, field in csv and json).

Every view's headline (``global acc``, ``local acc``, ``global_*``, the rank) is ``headline``'s: the
final figure, the papers' selected-round figure beside it (``selected global``, ``selected_*``).

A multimodal group (``SettingGroup.is_multimodal``) shows its recipients' figures as the headline, and
beside them the donors', all clients' and each extra endpoint's: as ``↳`` rows under the group in
the table and markdown (whose note says whose the headline is), as columns and ``endpoint`` rows in
csv, as blocks in json. A single-modality group's rows are what they were.

A group's own row in every view is its columns' (``columns``: one list, each column declared once
for the terminal, markdown, csv, json and the HTML site); the rows beside it are built here.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable, Optional

from rich.table import Table
from rich.text import Text

from hfl_bench.results.board import Board
from hfl_bench.results.columns import (
    BYTES,
    STEPS,
    TEXT,
    GroupRow,
    _pm,
    _setting_label,
    columns,
    csv_fields,
    csv_figures,
    section_fields,
)
from hfl_bench.results.figures import HEADLINE_STATISTIC
from hfl_bench.results.headline import FALLBACK_NOTE, group_basis, headline_stat, marked
from hfl_bench.results.published import Match, Published
from hfl_bench.results.setting import SettingGroup, canonical, partition_label, section_reasons
from hfl_bench.results.text import csv_cell, markdown_cell, terminal


def _published_setting(p: Published) -> str:
    s = p.setting
    part = s.get("partition") or {}
    partition = partition_label(part["scheme"], part.get("params") or {}) if part.get("scheme") else "?"
    return _setting_label(partition, s.get("n_clients"), s.get("clients_per_round"), s.get("rounds"))


# Keys of a display row that are not columns: what the row is ("group", "clients": a multimodal
# group's other client groups and endpoints, "published") and a note the table's title and the
# markdown carry once (whose figure a multimodal headline is).
KIND, NOTE, SECTION = "_kind", "_note", "_section"
MODALITY_NOTE = ("multimodal groups (setting missing=MODALITY recipients=FRACTION): global and local acc and the "
                 "selected figures are over the recipients, the clients that miss a modality (all clients where none "
                 "does); the ↳ rows give the donors', all clients' and each extra endpoint's figures")
# The client groups a multimodal group shows besides its headline, and their labels.
OTHER_CLIENTS = (("donors", "donors"), ("all", "all clients"))


def display_rows(board: Board) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Rows for the table and markdown formats: each group's text cells (the terminal's and
    markdown's ``columns``) followed by a multimodal group's other figures (``clients_rows``) and
    the published figures beside it; then the published figures that match no group."""
    rows = []
    text = [c for c in columns() if c.views & TEXT]
    for row in GroupRow.of(board.groups):
        g, first = row.group, len(rows)
        basis = group_basis(g)
        notes = tuple(n for n, on in ((MODALITY_NOTE, g.is_multimodal), (FALLBACK_NOTE, basis != HEADLINE_STATISTIC),
                                      (g.copies_note, bool(g.copies_note))) if on)
        rows.append({**{c.name: c.text_cell(row) for c in text}, KIND: "group", **({NOTE: notes} if notes else {})})
        rows += clients_rows(g)
        rows += [_published_row(m.published, m) for m in g.published]
        for r in rows[first:]:
            r[SECTION] = g.section
    return rows, [_published_row(p, None) for p in board.unmatched]


def by_section(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Display rows (``display_rows``, ``rank_rows``) split by their setting section, in order:
    each section's label and its rows (a group's ↳ rows stay with it)."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for row in rows:
        label = row.get(SECTION, "")
        if not out or out[-1][0] != label:
            out.append((label, []))
        out[-1][1].append(row)
    return out


def clients_rows(g: SettingGroup) -> list[dict[str, str]]:
    """A multimodal group's figures besides its headline (the recipients'): the donors' and all
    clients', then each extra endpoint's over the recipients, the donors and all clients. None for
    any other group."""
    if not g.is_multimodal:
        return []
    wanted = [(None, who, label) for who, label in OTHER_CLIENTS]
    wanted += [(e, who, label) for e in g.endpoints() for who, label in (("recipients", "recipients"), *OTHER_CLIENTS)]
    rows = []
    for endpoint, who, label in wanted:
        sg, sl = g.stat("global_acc", endpoint, who), g.stat("local_acc", endpoint, who)
        name = f"[{endpoint}] {label}" if endpoint else label
        row = {**{c: "" for c in text_columns()}, "method": f"  ↳ {name}", "seeds": str(sg.n),
               "selected global": _pm(sg.mean, sg.sd), "selected local": _pm(sl.mean, sl.sd), KIND: "clients"}
        # the model's or the endpoint's headline over the same clients (an endpoint's final figure
        # from schema 1.7; before, its selected round's stands in, marked)
        gl, lo = headline_stat(g, "global_acc", who, endpoint), headline_stat(g, "local_acc", who, endpoint)
        basis = group_basis(g, "global_acc", who, endpoint)
        row.update({"global acc": marked(_pm(gl.mean, gl.sd), basis),
                    "local acc": marked(_pm(lo.mean, lo.sd), group_basis(g, "local_acc", who, endpoint))})
        if basis not in (None, HEADLINE_STATISTIC):
            row[NOTE] = (FALLBACK_NOTE,)
        rows.append(row)
    return rows


def _published_row(p: Published, m: Optional[Match]) -> dict[str, str]:
    """A published figure's row: beside a group (``m``) under ``selected global`` / ``selected
    local`` (a paper reports the figure at its selected or best round; the delta is against the
    group's selected figure), in ``global acc`` / ``local acc`` in the table of unmatched figures."""
    value = _pm(p.value, p.sd)
    column = "selected {}" if m else "{} acc"
    c = p.citation
    endpoint = f" [{p.endpoint}]" if p.endpoint else ""
    published_as = p.record["method"].get("published_name") or p.method
    return {
        KIND: "published",
        "method": f"  ↳ {published_as}{endpoint}" if m else f"{p.method}{endpoint}", "task": "" if m else p.task,
        "published as": published_as,
        "pool": p.pool or "(other)", "faults": "none", "setting": _published_setting(p), "seeds": str(p.n_seeds or "?"),
        column.format("global"): value if p.metric == "global_acc" else "",
        column.format("local"): value if p.metric == "local_acc" else "",
        "failed/diverged": "", "source": str(c.get("key")), "locator": str(c.get("locator")),
        "match": m.setting_match if m else str(c.get("setting_match", "")),
        "delta": ("-" if m.delta is None else f"{m.delta:+.2f}") if m else "",
    }


def text_columns() -> tuple[str, ...]:
    """The markdown's default columns (``columns.names("markdown")`` but those shown only when chosen)."""
    return tuple(c.name for c in columns("markdown") if not c.chosen_only)


def chosen_columns() -> tuple[str, ...]:
    """The text columns shown only where ``--columns`` names them (beside ``text_columns``, what it may name)."""
    return tuple(c.name for c in columns("markdown") if c.chosen_only)


def table_columns() -> tuple[str, ...]:
    """The terminal table's columns (it leaves out the locator, long, and the selected local
    accuracy, for width; markdown, csv and json keep them)."""
    return tuple(c.name for c in columns("terminal") if not c.chosen_only)


def csv_columns() -> tuple[str, ...]:
    return csv_fields()


# The published figures that match no group: a table of their own.
UNMATCHED_COLUMNS = ("method", "published as", "task", "pool", "setting", "seeds", "global acc", "local acc",
                     "source", "locator", "match")


def csv_rows(board: Board) -> list[dict[str, Any]]:
    """Flat rows: one per group (row_type reproduced), for a multimodal group one per extra
    endpoint (row_type endpoint, same group_id), one per published figure beside it (row_type
    published, same group_id), one per unmatched published figure (empty group_id).
    global_* / local_* / selected_* / final_* are over the headline's clients (honest clients under
    faults, the recipients of a multimodal group: ``headline_clients``), all_* every client's, donors_*
    a multimodal group's donors'; global_* / local_* / all_* / donors_* are the headline statistic
    (``headline``; ``headline_statistic``: final, or selected / mixed where records fell back; an
    endpoint row's are at the selected round), selected_* at the selected round, final_* the final
    figures where the records have them."""
    rows = []
    data = columns("csv")
    for row in GroupRow.of(board.groups):
        g = row.group
        rows.append({k: v for c in data for k, v in c.csv_values(row).items()})
        if g.is_multimodal:
            rows += [{"row_type": "endpoint", **section_fields(g), "group_id": g.group_id, "method": g.method,
                      "method_version": g.method_version, "task": g.task, "pool": g.pool, "faults": g.faults,
                      "modalities": g.modalities, "headline_clients": g.headline_clients, "endpoint": e,
                      "headline_statistic": group_basis(g, endpoint=e),
                      "seeds": " ".join(map(str, g.seeds)), **csv_figures(g, e)} for e in g.endpoints()]
        rows += [{**_published_csv(m.published, m, g.group_id), "section": g.section} for m in g.published]
    rows += [_published_csv(p, None, "") for p in board.unmatched]
    return [{c: ("" if r.get(c) is None else r.get(c)) for c in csv_fields()} for r in rows]


def _published_csv(p: Published, m: Optional[Match], group_id: str) -> dict[str, Any]:
    s, c = p.setting, p.citation
    part = s.get("partition") or {}
    return {
        "row_type": "published", "group_id": group_id, "method": p.method, "task": p.task, "pool": p.pool,
        "faults": "none",
        "partition_scheme": part.get("scheme"), "partition_params": canonical(part.get("params") or {}),
        "n_clients": s.get("n_clients"), "clients_per_round": s.get("clients_per_round"), "rounds": s.get("rounds"),
        "local_epochs": s.get("local_epochs"), "n_seeds": p.n_seeds, "endpoint": p.endpoint,
        "citation_key": c.get("key"), "arxiv_or_doi": c.get("arxiv_or_doi"), "locator": c.get("locator"),
        "setting_match": m.setting_match if m else c.get("setting_match"), "published_metric": p.metric,
        "published_value": p.value, "published_sd": p.sd,
        "reproduced_mean": m.reproduced.mean if m else None, "delta": m.delta if m else None,
    }


def board_json(board: Board) -> dict[str, Any]:
    """The board as json: each group the json ``columns``' keys, in order."""
    data = columns("json")
    groups = [{k: v for c in data for k, v in c.json_values(row).items()} for row in GroupRow.of(board.groups)]
    multimodal = ("over the recipients (the clients that miss a modality: metrics.recipients; also each "
                  "endpoint's) for a multimodal group (modalities), "
                  if any(g.is_multimodal for g in board.groups) else "")
    headline = (f"global_acc and local_acc are the headline statistic ({HEADLINE_STATISTIC}: the mean over the last "
                "evaluated rounds; headline_statistic says where records fell back to the selected round), over "
                f"the honest clients for a group run with faults (metrics.honest), {multimodal}over all clients "
                "otherwise (all_clients); selected holds the figures at the selected round (the papers' rule), "
                "which published deltas use; each endpoint's figures are its headline statistic too (final from schema "
                "1.7; its headline_statistic says where records fell back), its selected round's under selected")
    sections = list(dict.fromkeys(g.section for g in board.groups))
    return {"sd": "sample standard deviation (ddof=1); null for a single seed", "headline": headline,
            "sections": sections, "section_reasons": reasons_json(sections), "groups": groups,
            "unmatched_published": [p.as_dict() for p in board.unmatched],
            "skipped": board.skipped}


def reasons_json(sections: Iterable[str]) -> dict[str, list[str]]:
    """Why each section that stands apart does (``section_reasons``), by label; {} when none does."""
    return {label: reasons for label in sections if (reasons := section_reasons(label))}


def section_title(label: str) -> str:
    """A section's label as a table's title shows it: with the reason it stands apart, if any."""
    return "; ".join([label, *section_reasons(label)])


def rank_rows(ranked: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The rank's display rows, numbered from 1 within each setting section (``by_section``)."""
    rows, place, section = [], 0, None
    for r in ranked:
        place = 1 if r["section"] != section else place + 1
        section = r["section"]
        rows.append({"#": str(place), "method": r["method"], "mean rank": f"{r['mean_rank']:.2f}",
                     "rank interval": rank_interval_label(r.get("rank_interval"), ".2f"),
                     "protocols": str(r["n_protocols"]),
                     "ranks": "; ".join(f"{x['protocol']}: {x['rank']:g}/{x['n_methods']}"
                                        + (f" {rank_interval_label(x['rank_interval'], 'g')}" if "rank_interval" in x
                                           else "") for x in r["ranks"]),
                     SECTION: r["section"]})
    return rows


def unranked_lines(unranked: list[dict[str, Any]]) -> list[str]:
    """One line per method alone in a section (``ranking.unranked_methods``): its section, with
    the reason the section stands apart (``section_title``)."""
    return [f"not ranked: {u['method']}, alone in setting: {section_title(u['section'])}"
            for u in unranked]


def rank_interval_label(interval: Optional[list[float]], spec: str) -> str:
    """``[1, 3]``: the ranks consistent with the resolved paired comparisons (``rank_intervals``);
    whole ranks are printed as integers, ``spec`` formats the others (``[1.5, 3]``)."""
    if not interval:
        return "-"
    return "[" + ", ".join(f"{x:.0f}" if float(x).is_integer() else f"{x:{spec}}" for x in interval[:2]) + "]"


def row_notes(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The distinct notes the rows carry (``NOTE``: a note or a tuple of them), in order: what a
    table's title adds."""
    notes = [n for r in rows if r.get(NOTE) for n in ((r[NOTE],) if isinstance(r[NOTE], str) else r[NOTE])]
    return list(dict.fromkeys(notes))


# ----------------------------------------------------------------------------- readable tables
# The terminal and markdown tables show, per section, the columns a reader compares: a column empty
# in every row is left out, and a column with one value in every row of the section goes into the
# section's title ("same in every row: task digits, pool cpu, ..."). The figures and the method are
# never moved (one row's figure is still a figure). csv, json and the HTML site keep every column.
# The board's figures are its columns' (``Column.figure``); the rank's are named here.
RANK_FIGURES = frozenset({"method", "#", "mean rank", "rank interval", "ranks"})


def never_lifted() -> frozenset[str]:
    return RANK_FIGURES | {c.name for c in columns() if c.figure}

EMPTY = ("", None, "-")


def _main_row(r: dict[str, Any]) -> bool:
    """A group's own row (or a rank row), not a ↳ row beside it."""
    return r.get(KIND, "group") == "group"


def readable(rows: list[dict[str, Any]], columns: Iterable[str],
             protected: Iterable[str] = ("method", "global acc")) -> tuple[list[str], list[tuple[str, str]]]:
    """The columns of ``rows`` worth a column, and the (column, value) pairs the same in every row
    (for the title). A column is the same in every row when every group row has that one value
    and every other row has it or nothing; it is empty when no row has more than '-' in it. The
    ``protected`` columns stay whatever they hold."""
    protected, lifted_never = set(protected), never_lifted()
    shown, same = [], []
    main = [r for r in rows if _main_row(r)]
    for c in columns:
        values = [r.get(c) for r in rows]
        if c not in protected and all(v in EMPTY for v in values):
            continue
        mains = {r.get(c) for r in main}
        others = {r.get(c) for r in rows if not _main_row(r)} - {"", None}
        if (c not in lifted_never and not c.startswith("vs ") and c not in protected and len(mains) == 1
                and next(iter(mains)) not in EMPTY and others <= mains):
            same.append((c, str(next(iter(mains)))))
            continue
        shown.append(c)
    return shown, same


def same_label(same: list[tuple[str, str]]) -> str:
    """``same in every row: task digits, pool cpu, seeds 10``; "" for none."""
    return "same in every row: " + ", ".join(f"{c} {v}" for c, v in same) if same else ""


def to_markdown(rows: list[dict[str, str]], columns: Iterable[str],
                headers: Optional[dict[str, str]] = None) -> str:
    """A markdown table; every cell one line with its markdown and HTML escaped (``text``), so a
    value can neither add a row or a column nor inject a link, code or HTML. The rows' notes
    (``row_notes``) follow it, one paragraph each. ``headers``: a column's header, where not its name."""
    columns, headers = list(columns), headers or {}
    lines = ["| " + " | ".join(markdown_cell(headers.get(c, c)) for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(markdown_cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    notes = [f"\nNote: {markdown_cell(n)}" for n in row_notes(rows)]
    return "\n".join(lines + notes) + "\n"


def sections_markdown(rows: list[dict[str, str]], columns: Iterable[str], chosen: bool = False) -> str:
    """One markdown table per setting section (``by_section``), each under its label in bold and,
    for a section that stands apart, the reason why (``section_reasons``) in a paragraph. Each
    table keeps the columns a reader compares (``readable``; the others' one value in a line above
    it), unless the columns were ``chosen`` (``--columns``): then exactly those."""
    columns, headers = list(columns), _text_headers()
    parts = []
    for label, part in by_section(rows):
        shown, same = (columns, []) if chosen else readable(part, columns)
        line = f"{markdown_cell(same_label(same)[:1].upper() + same_label(same)[1:])}.\n\n" if same else ""
        parts.append(f"**Setting: {markdown_cell(label)}**\n\n" + reasons_markdown(label) + line
                     + to_markdown(part, shown, headers))
    return "\n".join(parts)


def reasons_markdown(label: str) -> str:
    """The reasons a section stands apart (``section_reasons``), one paragraph each ("" for none)."""
    return "".join(f"Why apart: {markdown_cell(reason)}\n\n" for reason in section_reasons(label))


def to_csv(rows: list[dict[str, Any]], columns: Iterable[str]) -> str:
    """CSV by the csv module; text cells on one line, formula starts defused (``text.csv_cell``)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: csv_cell(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


# Headers the terminal table stacks on lines of their own, so a column is as wide as its figures.
# The board's columns say theirs (``Column.stacked``); the rank's are named here.
RANK_HEADERS = {"rank interval": "rank\ninterval", "mean rank": "mean\nrank"}
# Right-aligned: the board's numeric columns (``Column.numeric``) and the rank's figures.
RANK_NUMERIC = frozenset({"mean rank", "rank interval", "protocols", "#"})


def terminal_header(name: str) -> str:
    """A column's header in the terminal: a board column's (stacked, else its header), else the name."""
    c = _text_column(name)
    return RANK_HEADERS.get(name, name) if c is None else c.stacked or c.shown_header


def _right(name: str) -> bool:
    c = _text_column(name)
    return name in RANK_NUMERIC if c is None else c.numeric


def _text_headers() -> dict[str, str]:
    return {c.name: c.shown_header for c in columns() if c.views & TEXT}


def _text_column(name: str) -> Any:
    """The board's column of that name shown as text (--columns may choose one the terminal leaves out)."""
    return next((c for c in columns() if c.name == name and c.views & TEXT), None)

# The order in which the terminal table leaves columns out when it is wider than the terminal:
# first the first. A column not named here goes before all of these; method and the headline never go.
# What tells two rows of a section apart (task, setting, pool, faults) goes after the secondary
# figures: a row whose method repeats is read by them (a column with one value in every row is in
# the title already).
FIT_ORDER = ("locator", "source", "match", "selected local", "failed/diverged", "ranks", "version", "selected global",
             "published as", "predictor", "seeds", "protocols", "local acc", "delta", BYTES, STEPS, "setting", "pool",
             "faults", "task", "drop", "rank interval", "mean rank", "#")
KEPT = ("method", "global acc")


# Columns whose long cells may wrap onto several lines (at spaces: ``dirichlet alpha=0.3`` / ``N=10
# R=30 ...``) rather than be left out: the width they are counted at.
FOLDS = {"setting": 22}


def table_width(rows: list[dict[str, Any]], columns: Iterable[str]) -> int:
    """The width of ``to_rich``'s table of ``rows`` in ``columns``: each column as wide as its
    widest cell or header line (a ``FOLDS`` column at most its width there), plus rich's borders
    and padding."""
    from rich.cells import cell_len

    widths = [min(max([cell_len(terminal(r.get(c, ""))) for r in rows]
                      + [cell_len(x) for x in terminal_header(c).split("\n")]), FOLDS.get(c, 10**6))
              for c in columns]
    return sum(widths) + 3 * len(widths) + 1


def fit_columns(rows: list[dict[str, Any]], columns: Iterable[str], width: int) -> tuple[list[str], list[str]]:
    """The columns of ``rows`` that fit ``width`` characters unfolded, and the ones left out (in
    ``FIT_ORDER``, never ``KEPT``) to get there."""
    columns, left_out = list(columns), []
    order = [c for c in columns if c not in FIT_ORDER and c not in KEPT and not c.startswith("vs ")]
    order += [c for c in FIT_ORDER if c in columns] + [c for c in columns if c.startswith("vs ")]
    for c in order:
        if table_width(rows, columns) <= width:
            break
        columns.remove(c)
        left_out.append(c)
    return columns, left_out


def to_rich(rows: list[dict[str, str]], columns: Iterable[str], title: str, caption: str = "") -> Table:
    """The terminal table; its title also carries the rows' notes (``row_notes``). The method and
    headline columns never wrap; the others fold (every character shown) when the terminal is too
    narrow even for them."""
    t = Table(title=Text(terminal("; ".join([title, *row_notes(rows)]))), title_justify="left",
              caption=Text(terminal(caption)) if caption else None, caption_justify="left")
    columns = list(columns)
    for c in columns:
        # fold, not ellipsis: a narrow terminal still shows every character
        t.add_column(terminal_header(c), justify="right" if _right(c) else "left", overflow="fold",
                     no_wrap=c in KEPT)
    for r in rows:
        published = bool(r.get("source"))
        # Text, not str: never read as markup; terminal(): no escape sequences or control characters
        t.add_row(*[Text(terminal(r.get(c, ""))) for c in columns], style="dim" if published else None)
    return t
