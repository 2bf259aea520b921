"""Paired comparisons (``paired``) as rows: ``leaderboard compare``'s table, plain lines and
json, the ``vs B`` column ``leaderboard show --against B`` adds, and the HTML group pages' table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from rich.table import Table as RichTable
from rich.text import Text

from hfl_bench.results.board import Board
from hfl_bench.results.headline import headline_stat
from hfl_bench.results.paired import CONFIDENCE, EXACT_UP_TO, MONTE_CARLO, Comparison, Table, against, by_protocol
from hfl_bench.results.render import reasons_markdown, section_title, to_markdown
from hfl_bench.results.setting import SettingGroup
from hfl_bench.results.text import markdown_cell, terminal

RESOLVED_MARK = "*"
COLUMNS = ("A", "B", "n", "A - B [95% CI]", "p sign-flip", "p Holm", "verdict", "notes")
NUMERIC = ("n", "A - B [95% CI]", "p sign-flip", "p Holm")
DEFINITIONS = {
    "pairing": "records paired by seed within one protocol; a pair must share its partition hash",
    "difference": "mean of the paired differences A - B of the figure (global accuracy, points)",
    "ci95": f"two-sided {CONFIDENCE:.0%} t-interval, n - 1 degrees of freedom (scipy.stats.ttest_rel)",
    "p_sign_flip": (f"two-sided paired sign-flip test (scipy.stats.permutation_test), exact up to "
                    f"{EXACT_UP_TO} pairs, {MONTE_CARLO} seeded random sign patterns beyond"),
    "p_holm": "Holm-adjusted over the comparisons of one table (statsmodels multipletests, method=holm)",
    "resolved": "the 95% interval excludes zero and the Holm-adjusted p is below 0.05",
}


def _p(p: Optional[float], exact: bool = True) -> str:
    return "-" if p is None else f"{p:.3f}" + ("" if exact else " (MC)")


def notes(c: Comparison) -> str:
    """What a reader must know beside the figures: seeds dropped and why, mixed hosts."""
    pg, out = c.pairing, []
    # seeds without the figure grouped by why (``Side.missing``: the clock's not recorded / not reached)
    missing: dict[str, list[Any]] = {}
    for seed in pg.no_figure:
        missing.setdefault(pg.no_figure_why.get(seed, "no figure"), []).append(seed)
    for seeds, why in ((pg.only_a, f"only {c.a.label} ran"), (pg.only_b, f"only {c.b.label} ran"),
                       (pg.partition_differs, "partitions differ"), *((s, w) for w, s in missing.items())):
        if seeds:
            out.append(f"dropped seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: {why}")
    if pg.mixed_hosts:
        out.append(f"mixed hosts: {len(pg.processors)} processors")
    if pg.uncommitted:
        out.append(f"uncommitted: {len(pg.uncommitted)} of {c.n} pairs ran from a tree with uncommitted changes")
    if c.equal_differences:
        out.append("every difference equal: a zero-width interval, the sign-flip p decides")
    return "; ".join(out)


def comparison_row(c: Comparison, nd: int = 2) -> dict[str, str]:
    return {"A": c.a.label, "B": c.b.label, "n": str(c.n), "A - B [95% CI]": c.interval_label(nd),
            "p sign-flip": _p(c.p, c.p_exact), "p Holm": _p(c.p_holm), "verdict": c.verdict, "notes": notes(c)}


def plain_lines(tables: Iterable[Table], nd: int = 2) -> str:
    """One self-contained line per comparison (for pipes and grep); figures to ``nd`` decimals."""
    lines = []
    for t in tables:
        for c in t.comparisons:
            r = comparison_row(c, nd)
            parts = [t.section, t.protocol, f"{r['A']} - {r['B']}", r["A - B [95% CI]"], f"n={r['n']}",
                     f"p={r['p sign-flip']}", f"p_holm={r['p Holm']}", r["verdict"]]
            parts += [r["notes"]] if r["notes"] else []
            lines.append(terminal(" | ".join(parts)))
    return "\n".join(lines) + ("\n" if lines else "")


def table_title(t: Table, figure: str) -> str:
    return f"{t.protocol}; paired by seed, figure: {figure}" + "".join(f"; {n}" for n in t.notes)


def markdown_tables(tables: Iterable[Table], figure: str, nd: int = 2) -> str:
    """One markdown table per protocol, under its setting section's label in bold (as ``leaderboard
    show --format markdown``, with the reason a section stands apart) and its protocol; every cell
    escaped (``render.to_markdown``)."""
    return "\n".join(f"**Setting: {markdown_cell(t.section)}**; {markdown_cell(table_title(t, figure))}\n\n"
                     + reasons_markdown(t.section)
                     + to_markdown([comparison_row(c, nd) for c in t.comparisons], COLUMNS) for t in tables)


def rich_tables(tables: Iterable[Table], figure: str, nd: int = 2) -> list[RichTable]:
    out = []
    for t in tables:
        title = f"setting: {section_title(t.section)}; {table_title(t, figure)}"
        table = RichTable(title=Text(terminal(title)))
        for col in COLUMNS:
            table.add_column(col, justify="right" if col in NUMERIC else "left", overflow="fold")
        for c in t.comparisons:
            row = comparison_row(c, nd)
            table.add_row(*[Text(terminal(row[col])) for col in COLUMNS], style="bold" if c.resolved else None)
        out.append(table)
    return out


def tables_json(tables: list[Table], figure: str) -> dict[str, Any]:
    return {"figure": figure, "definitions": DEFINITIONS, "tables": [t.as_dict() for t in tables]}


# ----------------------------------------------------------------------------- show --against


def vs_column(reference: str) -> str:
    return f"vs {reference}"


def vs_title(reference: str) -> str:
    return (f"vs {reference}: paired difference - {reference} over the shared seeds [95% t-interval], "
            f"{RESOLVED_MARK} resolved (the interval excludes 0 and the Holm-adjusted p < 0.05)")


def vs_comparisons(groups: list[SettingGroup], reference: str, figure: Optional[str] = None) -> dict[str, Comparison]:
    """Each group's comparison against ``reference`` in its protocol, by group id (``groups``:
    every group, so a filter never changes a comparison's Holm family)."""
    return {c.a.group.group_id: c for t in against(groups, reference, figure=figure) for c in t.comparisons}


def vs_cell(g: SettingGroup, reference: str, comparisons: dict[str, Comparison]) -> str:
    c = comparisons.get(g.group_id)
    if c is None:
        return "reference" if g.method == reference else ""
    return c.interval_label() + (f" {RESOLVED_MARK}" if c.resolved else "")


def add_vs_cells(rows: list[dict[str, Any]], board: Board, reference: str, comparisons: dict[str, Comparison],
                 kind_key: str) -> None:
    """Fill the ``vs`` column of ``rows`` (``render.display_rows(board)``): one group row per group,
    in the board's order."""
    group_rows = [r for r in rows if r.get(kind_key) == "group"]
    for row, g in zip(group_rows, board.groups, strict=True):
        row[vs_column(reference)] = vs_cell(g, reference, comparisons)


def vs_json(g_id: str, reference: str, comparisons: dict[str, Comparison]) -> Optional[dict[str, Any]]:
    c = comparisons.get(g_id)
    return None if c is None else {"against": reference, **c.as_dict()}


VS_CSV = ("vs_against", "vs_n", "vs_mean", "vs_ci_low", "vs_ci_high", "vs_p", "vs_p_holm", "vs_resolved")


def vs_csv(g_id: str, reference: str, comparisons: dict[str, Comparison]) -> dict[str, Any]:
    c = comparisons.get(g_id)
    if c is None:
        return {k: "" for k in VS_CSV}
    return {"vs_against": reference, "vs_n": c.n, "vs_mean": c.mean, "vs_ci_low": c.low, "vs_ci_high": c.high,
            "vs_p": c.p, "vs_p_holm": c.p_holm, "vs_resolved": c.resolved}


# ----------------------------------------------------------------------------- the HTML group pages


def default_reference(members: list[SettingGroup]) -> str:
    """The method a protocol's groups are compared against on the HTML pages: ``local`` (no
    collaboration: what every method must beat) where it ran, else the method of the group with
    the highest mean headline."""
    methods = {g.method for g in members}
    if "local" in methods:
        return "local"
    return max(members, key=lambda g: headline_stat(g).mean if headline_stat(g).mean is not None
               else float("-inf")).method


def page_tables(groups: list[SettingGroup]) -> dict[str, Table]:
    """Per group id: the table of its protocol, every method against the protocol's default
    reference (``default_reference``)."""
    protocols = by_protocol(groups)
    refs = {key: default_reference(members) for key, members in protocols.items()}
    out: dict[str, Table] = {}
    for reference in sorted(set(refs.values())):
        for t in against(groups, reference):
            if refs[t.key] == reference:
                out |= {g.group_id: t for g in protocols[t.key]}
    return out


# ----------------------------------------------------------------------------- compare --fairness / --clock

FAIRNESS_COLUMNS = ("A", "A figure", "B", "B figure", "n", "A - B [95% CI]", "p sign-flip", "p Holm", "verdict",
                    "notes")
FAIRNESS_NUMERIC = (*NUMERIC, "A figure", "B figure")
# The header row of compare --fairness's and --clock's plain lines (piped output): each " | " field, in order.
FAIRNESS_HEADER = ("figure | section | protocol | A - B | A figure | B figure | A - B [95% CI] | n | p sign-flip | "
                   "p Holm | verdict | notes")


@dataclass(frozen=True)
class FigureSet:
    """Figures a group takes per seed and ``compare`` pairs by seed, one table per figure
    (``fairness``: ``compare --fairness``; ``timing``: ``compare --clock``)."""

    figures: tuple[str, ...]
    of: Callable[[SettingGroup], Any]  # the group's figures: ``label(name, n_seeds)``, ``as_dict()[name]``
    definitions: dict[str, str]
    difference: str  # what a difference is, in its units


def fairness_set() -> FigureSet:
    from hfl_bench.results.fairness import DEFINITIONS as FAIRNESS_DEFINITIONS
    from hfl_bench.results.fairness import FIGURES, group_fairness

    return FigureSet(FIGURES, group_fairness, FAIRNESS_DEFINITIONS,
                     "mean of the paired differences A - B of the figure, per seed (points; below_local: "
                     "percentage points)")


def clock_set(budget: Optional[float] = None) -> FigureSet:
    """The time figures ``compare --clock`` pairs: acc_at_budget only with a ``--time-budget``."""
    from hfl_bench.results.timing import DEFINITIONS as CLOCK_DEFINITIONS
    from hfl_bench.results.timing import compared_figures, group_timing

    return FigureSet(compared_figures(budget), group_timing, CLOCK_DEFINITIONS,
                     "mean of the paired differences A - B of the figure, per seed (sim_time, time_to_local: "
                     "simulated seconds, negative: A is faster; acc_at_budget: points)")


def _figure_of(t: Table, figure: str) -> str:
    """A table's figure: its comparisons' (a fairness table is one figure's), else ``figure``."""
    return t.comparisons[0].figure if t.comparisons else figure


def fairness_row(c: Comparison, nd: int = 2, figures: Optional[FigureSet] = None) -> dict[str, str]:
    """A comparison's row with each side's own figure over its seeds (``Fairness.label`` /
    ``Timing.label``: mean ± sd, n where fewer seeds have it, or not recorded / not available)."""
    of = (figures or fairness_set()).of

    def own(side: Any) -> str:
        return of(side.group).label(c.figure, len(side.group.ok))

    return {**comparison_row(c, nd), "A figure": own(c.a), "B figure": own(c.b)}


def fairness_lines(tables: Iterable[Table], nd: int = 2, figures: Optional[FigureSet] = None) -> str:
    """compare --fairness's (--clock's) plain lines: one per comparison, its figure first (``FAIRNESS_HEADER``)."""
    lines = []
    for t in tables:
        for c in t.comparisons:
            r = fairness_row(c, nd, figures)
            parts = [c.figure, t.section, t.protocol, f"{r['A']} - {r['B']}", r["A figure"], r["B figure"],
                     r["A - B [95% CI]"], f"n={r['n']}", f"p={r['p sign-flip']}", f"p_holm={r['p Holm']}",
                     r["verdict"]]
            parts += [r["notes"]] if r["notes"] else []
            lines.append(terminal(" | ".join(parts)))
    return "\n".join(lines) + ("\n" if lines else "")


def fairness_markdown(tables: Iterable[Table], nd: int = 2, figures: Optional[FigureSet] = None) -> str:
    return "\n".join(f"**Setting: {markdown_cell(t.section)}**; {markdown_cell(table_title(t, _figure_of(t, '')))}\n\n"
                     + reasons_markdown(t.section)
                     + to_markdown([fairness_row(c, nd, figures) for c in t.comparisons], FAIRNESS_COLUMNS)
                     for t in tables)


def fairness_rich(tables: Iterable[Table], nd: int = 2, figures: Optional[FigureSet] = None) -> list[RichTable]:
    out = []
    for t in tables:
        table = RichTable(title=Text(terminal(f"setting: {section_title(t.section)}; "
                                              f"{table_title(t, _figure_of(t, ''))}")))
        for col in FAIRNESS_COLUMNS:
            table.add_column(col, justify="right" if col in FAIRNESS_NUMERIC else "left", overflow="fold")
        for c in t.comparisons:
            row = fairness_row(c, nd, figures)
            table.add_row(*[Text(terminal(row[col])) for col in FAIRNESS_COLUMNS], style="bold" if c.resolved else None)
        out.append(table)
    return out


def fairness_json(tables: list[Table], figures: Optional[FigureSet] = None) -> dict[str, Any]:
    """compare --fairness (--clock) as json: each table one figure's; each comparison with both
    sides' own figures over their seeds (``a_figure`` / ``b_figure``: mean, sd, n, state)."""
    figures = figures or fairness_set()
    out = []
    for t in tables:
        d = t.as_dict()
        d["figure"] = _figure_of(t, "")
        for c, cd in zip(t.comparisons, d["comparisons"]):
            cd["a_figure"] = figures.of(c.a.group).as_dict()[c.figure]
            cd["b_figure"] = figures.of(c.b.group).as_dict()[c.figure]
        out.append(d)
    return {"figures": list(figures.figures),
            "definitions": {**DEFINITIONS, **figures.definitions, "difference": figures.difference},
            "tables": out}
