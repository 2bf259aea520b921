"""The claims (``claims``) as rows: ``leaderboard claims``' markdown page block (one table per
paper, in the order the claims file first names each), plain lines and json. A claim of one test
is one row; a claim of several is its row (the claim's verdict) followed by one row per comparison.
Every text from the claims file or the records is escaped (``render.to_markdown``)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

from hfl_bench.results.claims import LEVEL, NOT_YET, RULES, VERDICTS, ClaimResult, ClaimSpec, Result, verdict_label
from hfl_bench.results.paired_view import notes as pairing_notes
from hfl_bench.results.render import to_markdown
from hfl_bench.results.text import markdown_cell, terminal

LEVELS = "A, B (means)"
SETTING = "setting match"
AT_PAPER = "at the paper's figure: A - B [95% CI], p Holm"
COLUMNS = ("claim id", "claim", "paper's figures", SETTING, "CPU-scale test: A - B", "records, task", "figure", "n",
           LEVELS, "A - B [95% CI]", "p Holm", "verdict", AT_PAPER)


def _p(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.3f}"


def interval(r: Result, nd: int = 2) -> str:
    """``+5.03 [0.58, 9.48]``, the mean alone where there is no interval, ``-`` where no mean."""
    if r.mean is None:
        return "-"
    return f"{r.mean:+.{nd}f}" + (f" [{r.low:.{nd}f}, {r.high:.{nd}f}]" if r.low is not None else "")


def levels(r: Result, nd: int = 2) -> str:
    """``91.23, 16.80``: each side's mean over the paired seeds (the suite's figures, beside the paper's)."""
    return "-" if r.levels is None else ", ".join(f"{v:.{nd}f}" for v in r.levels)


def setting_text(spec: ClaimSpec) -> str:
    """``proxy: digits, N = 10 / 15 / 20 ...``: how the test matches the paper's experiment."""
    return spec.setting + (f": {spec.differs}" if spec.differs else "")


def at_paper_text(r: Result, nd: int = 2) -> str:
    """The test at the paper's figure (where the paper reports another statistic than the headline):
    ``selected: +3.34 [0.50, 6.18], p 0.043, reproduced``; ``-`` where the row has none."""
    t = r.at_paper
    if t is None:
        return "-"
    return f"{t.figure}: {interval(t, nd)}, p {_p(t.p_holm)}, {t.verdict}"


def result_verdict(r: Result, setting: str) -> str:
    """A tested line's verdict with its setting, and the selected-round verdict where it differs."""
    out = verdict_label(r.verdict, setting)
    if r.paper_differs:
        out += f" (at the paper's {r.at_paper.figure} figure: {r.at_paper.verdict})"
    return out


def result_cells(r: Result, setting: str, nd: int = 2) -> dict[str, str]:
    said = r.notes + ([n] if r.comparison and (n := pairing_notes(r.comparison)) else [])
    return {"CPU-scale test: A - B": r.label + "".join(f"; {n}" for n in said),
            "records, task": r.records + (f", {r.task}" if r.task else ""), "figure": r.figure or "-", "n": r.n,
            LEVELS: levels(r, nd), "A - B [95% CI]": interval(r, nd), "p Holm": _p(r.p_holm),
            "verdict": result_verdict(r, setting), AT_PAPER: at_paper_text(r, nd)}


def verdict_text(c: ClaimResult) -> str:
    """A claim's verdict with the setting it was reached in, with what its test needs while it is
    not yet tested."""
    return verdict_label(c.verdict, c.spec.setting) + (f" (needs: {c.spec.needs})" if c.verdict == NOT_YET else "")


def claim_rows(c: ClaimResult, nd: int = 2) -> list[dict[str, str]]:
    """The claim's row, then (a claim of several tests) one row per test (module doc)."""
    spec = c.spec
    verdict = verdict_text(c)
    head = {"claim id": spec.id, "claim": spec.claim, "paper's figures": spec.figures, SETTING: setting_text(spec)}
    note = f"; {spec.note}" if spec.note else ""
    if len(c.results) == 1:
        row = head | result_cells(c.results[0], spec.setting, nd)
        row["CPU-scale test: A - B"] += note
        return [row | {"verdict": result_verdict(c.results[0], spec.setting) if c.verdict != NOT_YET else verdict}]
    test = spec.test or (f"{len(c.results)} comparisons below, Holm over them" if c.results else "none yet")
    head |= {"CPU-scale test: A - B": test + note, "verdict": verdict}
    return [head] + [result_cells(r, spec.setting, nd) for r in c.results]


BRIEF_COLUMNS = ("paper", "claim id", "claim", "paper's figures", SETTING, "verdict", "tested lines")


def brief_rows(claims: Iterable[ClaimResult]) -> list[dict[str, str]]:
    """One row per claim: its verdict and how its tested lines (comparisons, trend) came out."""
    rows = []
    for c in claims:
        counts = {v: sum(r.verdict == v for r in c.results) for v in VERDICTS}
        lines = ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "none yet"
        rows.append({"paper": c.spec.paper, "claim id": c.spec.id, "claim": c.spec.claim,
                     "paper's figures": c.spec.figures, SETTING: c.spec.setting, "verdict": verdict_text(c),
                     "tested lines": lines})
    return rows


def brief_markdown(claims: list[ClaimResult]) -> str:
    """``--brief``: one line per claim (its figures and comparisons are the full page's)."""
    return to_markdown(brief_rows(claims), BRIEF_COLUMNS)


def brief_lines(claims: list[ClaimResult]) -> str:
    rows = brief_rows(claims)
    return "".join(terminal(" | ".join(row[k] for k in BRIEF_COLUMNS)) + "\n" for row in rows)


def by_paper(claims: Iterable[ClaimResult]) -> list[tuple[str, list[ClaimResult]]]:
    """The claims of each paper, papers in the order the claims file first names them."""
    out: dict[str, list[ClaimResult]] = {}
    for c in claims:
        out.setdefault(c.spec.paper, []).append(c)
    return list(out.items())


def markdown(claims: list[ClaimResult], nd: int = 2) -> str:
    parts = [f"**Verdicts.** {markdown_cell(RULES)}\n"]
    for paper, mine in by_paper(claims):
        rows = [row for c in mine for row in claim_rows(c, nd)]
        parts.append(f"## {markdown_cell(paper)}\n\n" + to_markdown(rows, COLUMNS))
    return "\n".join(parts)


def plain_lines(claims: list[ClaimResult], nd: int = 2) -> str:
    """One self-contained line per row (for pipes and grep)."""
    lines = []
    for c in claims:
        for row in claim_rows(c, nd):
            cells = [c.spec.paper, row.get("claim id") or c.spec.id, row["CPU-scale test: A - B"]]
            if row.get("records, task"):
                cells += [row["records, task"], f"figure={row['figure']}", f"n={row['n']}", f"means {row[LEVELS]}",
                          row["A - B [95% CI]"],
                          f"p_holm={row['p Holm']}", f"paper's figure {row[AT_PAPER]}"]
            lines.append(terminal(" | ".join(cells + [row["verdict"]])))
    return "\n".join(lines) + ("\n" if lines else "")


def claims_json(claims: list[ClaimResult]) -> dict[str, Any]:
    return {"rules": RULES, "level": LEVEL,
            "claims": [{"id": c.spec.id, "paper": c.spec.paper, "claim": c.spec.claim, "figures": c.spec.figures,
                        "setting": c.spec.setting, "differs": c.spec.differs, "paper_figure": c.spec.paper_figure,
                        "test": c.spec.test, "note": c.spec.note, "needs": c.spec.needs, "verdict": c.verdict,
                        "verdict_label": verdict_text(c),
                        "results": [r.as_dict() for r in c.results]} for c in claims]}
