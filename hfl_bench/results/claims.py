"""The claims page: each headline claim of the seed papers, tested on the suite's records.

A claims file (``leaderboards/claims.yaml``) lists claims: an id, the paper, the claim, the
paper's figures, its **setting match** (``setting``: ``paper``, the paper's setting; ``proxy``, a
proxy of the same experiment, with ``differs``: what differs, task, scale, N, rounds, figure; or
``other``, another experiment family, with ``differs``: why), the statistic the paper reports
(``paper_figure``: ``selected``, the round of the best mean validation accuracy, or ``final``),
what a test needs where the records are not there yet (``needs``), and the test,
as data: a list of ``comparisons`` or a ``trend`` (one, or a list: one per task, say; Holm runs
over them as over comparisons), or neither (a claim the suite cannot test
yet). Every text is data, shown escaped; a records folder is a path relative to the claims file's
folder that stays inside it. A bad file (an unknown key, a missing field, an unknown method, a
folder outside) is one line (``ClaimsError``).

**A comparison** A - B reads two groups of one records folder, each selected by method and method
parameters (none: the method's defaults; ``paired.params_label`` labels them, as ``compare
--variants``) and, where given, the Dirichlet ``alpha``, the classes per client ``k``, ``clients``,
``clients_per_round``, the ``task`` and the clients' ``optimizer`` (as sections name it);
a side that matches two groups is an error (name more). The groups are paired by seed
(``paired.pair``: the same seed and partition hash) and read at the headline figure (the mean
global accuracy over the final window, ``figures.statistic_value``), of the model or of a side's
extra ``endpoint`` (its final window from schema 1.7; an older record holds an endpoint's selected
round only: such a row names ``figure: selected`` on both sides), or at a side's ``figure``:
``selected``, ``final``, or ``selected-minus-final`` (the selected round's figure less the final
window's: how far selection sits above typical accuracy). ``paired.compare``
gives the mean difference, its 95% t-interval and the sign-flip p; Holm runs over the comparisons
of one claim (``paired.holm``).

**A trend** (an advantage that widens with a setting, e.g. the pool size): at each value of the
setting (``over``: ``clients``, ``alpha`` or ``k``) the per-seed paired differences A - B as above;
the values in the order the claim runs (the pool growing, the skew getting more severe: ``k``
2 then 1). Where the levels are not one setting's values (Dirichlet 0.1, then two classes per
client), ``levels`` lists them instead, each a mapping of ``clients``, ``alpha`` or ``k``. The test
is the last level's differences against the first's, Welch's t-test
(``scipy.stats.ttest_ind``, ``equal_var=False``: the partitions differ between values, so nothing
pairs across them), its 95% interval and two-sided p; beside it the ratio mean A / mean B at
each value (the paper's "factor"), and ``mixed hosts`` where the records it reads ran on more than
one kind of processor, within a level or between levels, ``uncommitted`` where some ran from a tree
with uncommitted changes (a comparison's row says both through ``paired_view.notes``). A trend with
``statistic: ratio`` tests the per-seed ratios A / B instead of the differences (a paper's factor).

**The paper's figure.** Where ``paper_figure`` is not the headline's statistic (``selected``), each
test is run again at it, Holm over those alike (``Result.at_paper``), and shown beside the
headline's; the verdict stays the headline's, and a row whose verdict there differs says so.

**Verdicts.** A comparison (or trend) is *reproduced* when its 95% interval excludes 0 on the
claimed side (A - B > 0) and its Holm-adjusted p < 0.05; *contradicted* when the interval excludes
0 on the other side and the adjusted p < 0.05; *not resolved* otherwise; *not yet tested* where
the records hold no group for a side or no paired seed; *n cannot resolve* where a comparison has
fewer than ``paired.MIN_RESOLVABLE`` (6) paired seeds or a trend fewer at its first or last level
(no sign-flip p could reach 0.05; the same bar for both). A claim is contradicted when any of its
comparisons is; else not yet tested when any is; n cannot resolve when all are; reproduced when all
are; else not resolved; a claim with no test is not yet tested (its ``needs`` says what it takes).
A verdict is shown with its setting where that is not the paper's (``verdict_label``). A CPU-scale test checks
the direction and the mechanism of a claim, not the paper's absolute figure.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from hfl_bench.record.upgrade import BUILTIN_CARDS
from hfl_bench.registry import unknown_message
from hfl_bench.results.figures import FIGURES, HEADLINE, check_figure, statistic_value
from hfl_bench.results.paired import CONFIDENCE, MIN_RESOLVABLE, Comparison, Side, compare, holm, pair, params_label
from hfl_bench.results.setting import SettingGroup

LEVEL = 0.05  # the Holm-adjusted p below which a resolved interval counts
REPRODUCED, CONTRADICTED, NOT_RESOLVED, NOT_YET = "reproduced", "contradicted", "not resolved", "not yet tested"
CANNOT = "n cannot resolve"  # fewer than MIN_RESOLVABLE seeds (a trend: at a level): no outcome could resolve
VERDICTS = (REPRODUCED, CONTRADICTED, NOT_RESOLVED, CANNOT, NOT_YET)
# How a claim's test matches the paper's experiment: its setting; a proxy of the same experiment
# (``differs`` says what differs: task, scale, N, rounds, figure); another experiment family
# (``differs`` says why). A verdict off the paper's setting says so (``verdict_label``).
PAPER, PROXY, OTHER = "paper", "proxy", "other"
SETTINGS = (PAPER, PROXY, OTHER)
SETTING_SUFFIX = {PAPER: "", PROXY: " on a proxy", OTHER: ", other experiment"}
TREND_STATISTICS = ("difference", "ratio")
RULES = (f"A comparison A - B is {REPRODUCED} when its {CONFIDENCE:.0%} interval excludes 0 on the claimed side "
         f"(A above B) and its Holm-adjusted p < {LEVEL}; {CONTRADICTED} when the interval excludes 0 on the other "
         f"side and the adjusted p < {LEVEL}; {NOT_RESOLVED} otherwise; {NOT_YET} where the records hold no group "
         f"for a side or no paired seed. A claim is {CONTRADICTED} when any of its comparisons is, else {NOT_YET} "
         f"when any is, {REPRODUCED} when all are, else {NOT_RESOLVED}. Comparisons are paired by seed (same "
         "partition), figure: the mean global accuracy over the final window, of the model or of an extra "
         "endpoint, unless the row says otherwise (records before schema 1.7 hold an endpoint's selected round "
         "only); p: the exact sign-flip p, Holm over the comparisons of one claim. "
         "A trend compares the per-seed differences at the last setting it lists with those at the first "
         "(Welch's t-test: the partitions differ). The smallest sign-flip p is 2 / 2^n (0.25 at three seeds): a "
         f"comparison on fewer than {MIN_RESOLVABLE} paired seeds, or a trend with fewer than {MIN_RESOLVABLE} "
         f"at a level, reads {CANNOT} whatever its interval (counted as {NOT_RESOLVED} for its claim). Each claim "
         f"says how its test matches the paper's experiment: the paper's setting, a proxy of it (the verdict "
         f"reads e.g. '{CONTRADICTED}{SETTING_SUFFIX[PROXY]}', with what differs), or another experiment family "
         f"('{CONTRADICTED}{SETTING_SUFFIX[OTHER]}'). Where the paper reports its figures at the selected round "
         "(the round of the best mean validation accuracy), each comparison shows that figure's test beside the "
         "headline's; the verdict is the headline's, and a row whose verdict at the selected round differs says "
         "so. A CPU-scale test checks a claim's direction and mechanism, not the paper's absolute figure.")

GAP = "selected-minus-final"
SIDE_FIGURES = ("selected", "final", GAP)
# The settings a side may also be selected by: numbers (the Dirichlet alpha, the classes per client
# k, the pool) and texts (the task; the clients' optimizer as sections name it, "adam lr=0.001").
NUMBER_SELECT = ("alpha", "k", "clients", "clients_per_round")
TEXT_SELECT = ("task", "optimizer")
SELECT = NUMBER_SELECT + TEXT_SELECT
FILE_KEYS = ("claims",)
CLAIM_KEYS = ("id", "paper", "claim", "figures", "setting", "differs", "paper_figure", "needs", "test", "note",
              "comparisons", "trend")
CLAIM_REQUIRED = ("id", "paper", "claim", "figures", "setting", "paper_figure", "needs")
SIDE_KEYS = ("method", "params", "endpoint", "figure", *SELECT)
COMPARISON_KEYS = ("records", "a", "b", *SELECT)
TREND_KEYS = ("records", "a", "b", "over", "values", "levels", "statistic", *SELECT)
TREND_OVER = ("clients", "alpha", "k")


class ClaimsError(ValueError):
    """A claims file that cannot be used, or a side its records cannot answer unambiguously (one line)."""


# ----------------------------------------------------------------------------- the file


@dataclass(frozen=True)
class SideSpec:
    """One side of a comparison: which group of the records folder, read at which figure."""

    method: str
    params: dict[str, Any]
    where: dict[str, Any]  # SELECT fields -> value
    endpoint: Optional[str] = None
    figure: Optional[str] = None

    def matches(self, g: SettingGroup, extra: dict[str, Any]) -> bool:
        return (g.method == self.method and g.method_params == self.params
                and all(_same(setting_of(g, k), v) for k, v in {**self.where, **extra}.items()))

    def label(self, with_where: bool = True) -> str:
        """``crad [aggregator=crad-stage1] (selected) at alpha=0.3 clients=10``."""
        parts = [self.method] + ([f"[{params_label(self.params, {})}]"] if self.params else [])
        parts += ([f"[{self.endpoint}]"] if self.endpoint else []) + ([f"({self.figure})"] if self.figure else [])
        return " ".join(parts + ([f"at {where_label(self.where)}"] if with_where and self.where else []))


def where_label(where: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" if isinstance(v, str) else f"{k}={v:g}" for k, v in where.items())


def pair_label(a: SideSpec, b: SideSpec) -> str:
    """``A - B``, the selection both sides share said once: ``crad - uniform-kd at alpha=0.1 clients=10``."""
    if a.where != b.where:
        return f"{a.label()} - {b.label()}"
    return f"{a.label(False)} - {b.label(False)}" + (f" at {where_label(a.where)}" if a.where else "")


@dataclass(frozen=True)
class ComparisonSpec:
    records: str
    a: SideSpec
    b: SideSpec


@dataclass(frozen=True)
class TrendSpec:
    records: str
    a: SideSpec
    b: SideSpec
    levels: tuple  # of {setting: value}, in the order the claim runs; the test: the last against the first
    statistic: str = "difference"  # per seed at a level: A - B, or A / B (a paper's "factor")


@dataclass(frozen=True)
class ClaimSpec:
    id: str
    paper: str
    claim: str
    figures: str
    needs: str
    setting: str = PAPER  # SETTINGS: how the test matches the paper's experiment
    differs: str = ""  # what differs from the paper's setting (a proxy), or why it is another experiment
    paper_figure: str = HEADLINE  # the statistic the paper reports: selected (best validation round) or final
    test: str = ""  # what the test is, in words (a claim of several comparisons or none)
    note: str = ""  # what a reader must know beside the figures (a regime, a feature bank)
    comparisons: tuple = ()
    trends: tuple = ()  # TrendSpecs: one, or one per task (Holm over them, as over comparisons)


def read_claims(path: Path) -> list[ClaimSpec]:
    """The claims of a claims file, checked (module doc); ClaimsError, one line, otherwise."""
    from hfl_bench.yamlfile import YamlFileError, read_mapping

    try:
        data = read_mapping(path, "claims file", "with a list 'claims'")
    except YamlFileError as e:
        raise ClaimsError(str(e)) from None
    _keys(data, FILE_KEYS, FILE_KEYS, f"claims file {path}")
    if not isinstance(data["claims"], list) or not data["claims"]:
        raise ClaimsError(f"claims file {path}: 'claims' must be a non-empty list of claims")
    claims = [_claim(c, f"claims file {path}: claim {i + 1}") for i, c in enumerate(data["claims"])]
    ids = [c.id for c in claims]
    if twice := sorted({i for i in ids if ids.count(i) > 1}):
        raise ClaimsError(f"claims file {path}: claim id {twice[0]!r} is given twice")
    return claims


def _claim(raw: Any, where: str) -> ClaimSpec:
    _keys(raw, CLAIM_KEYS, CLAIM_REQUIRED, where)
    where = f"{where} ({_text(raw['id'], where + ': id')})"
    texts = {k: _text(raw[k], f"{where}: {k}")
             for k in ("id", "paper", "claim", "figures", "differs", "needs", "test", "note") if k in raw}
    setting, paper_figure = raw["setting"], raw["paper_figure"]
    if setting not in SETTINGS:
        raise ClaimsError(f"{where}: 'setting' must be one of {', '.join(SETTINGS)} (the paper's setting, a proxy "
                          f"of its experiment, another experiment family), not {setting!r}")
    if setting != PAPER and "differs" not in texts:
        raise ClaimsError(f"{where}: setting {setting} needs 'differs': "
                          + ("what differs from the paper's setting (task, scale, N, rounds, figure)"
                             if setting == PROXY else "why it is another experiment than the paper's"))
    if setting == PAPER and "differs" in texts:
        raise ClaimsError(f"{where}: 'differs' is for a proxy or another experiment; setting is paper")
    if paper_figure not in FIGURES:
        raise ClaimsError(f"{where}: 'paper_figure' must be one of {', '.join(FIGURES)} (the statistic the paper "
                          "reports: the selected round's, or the final rounds')")
    if "comparisons" in raw and "trend" in raw:
        raise ClaimsError(f"{where}: give 'comparisons' or 'trend', not both")
    comparisons = raw.get("comparisons", [])
    if not isinstance(comparisons, list):
        raise ClaimsError(f"{where}: 'comparisons' must be a list")
    specs = tuple(_comparison(c, f"{where}: comparison {i + 1}") for i, c in enumerate(comparisons))
    trends = raw.get("trend", [])
    trends = [trends] if isinstance(trends, dict) else trends
    if not isinstance(trends, list) or ("trend" in raw and not trends):
        raise ClaimsError(f"{where}: 'trend' must be a trend or a non-empty list of trends")
    many = len(trends) > 1
    return ClaimSpec(**texts, setting=setting, paper_figure=paper_figure, comparisons=specs, trends=tuple(
        _trend(t, f"{where}: trend" + (f" {i + 1}" if many else "")) for i, t in enumerate(trends)))


def _comparison(raw: Any, where: str) -> ComparisonSpec:
    _keys(raw, COMPARISON_KEYS, ("records", "a", "b"), where)
    shared = _select(raw, where)
    return ComparisonSpec(_records(raw["records"], where), _side(raw["a"], shared, f"{where}: a"),
                          _side(raw["b"], shared, f"{where}: b"))


def _trend(raw: Any, where: str) -> TrendSpec:
    _keys(raw, TREND_KEYS, ("records", "a", "b"), where)
    shared = _select(raw, where)
    levels = _levels(raw, where)
    clash = sorted({k for level in levels for k in level} & set(shared))
    if clash:
        raise ClaimsError(f"{where}: {clash[0]} is what the trend runs over; give it in its levels only")
    statistic = raw.get("statistic", TREND_STATISTICS[0])
    if statistic not in TREND_STATISTICS:
        raise ClaimsError(f"{where}: 'statistic' must be one of {', '.join(TREND_STATISTICS)}")
    return TrendSpec(_records(raw["records"], where), _side(raw["a"], shared, f"{where}: a"),
                     _side(raw["b"], shared, f"{where}: b"), levels, statistic)


def _levels(raw: dict[str, Any], where: str) -> tuple:
    """A trend's levels: ``over`` and its ``values`` (one setting), or ``levels`` (a mapping each)."""
    if ("levels" in raw) == ("over" in raw or "values" in raw):
        raise ClaimsError(f"{where}: give either 'over' and 'values' or 'levels'")
    if "levels" not in raw:
        over, values = raw.get("over"), raw.get("values")
        if over not in TREND_OVER:
            raise ClaimsError(f"{where}: 'over' must be one of {', '.join(TREND_OVER)}")
        if not (isinstance(values, list) and len(values) >= 2 and all(_number(v) for v in values)):
            raise ClaimsError(f"{where}: 'values' must be a list of two or more numbers")
        return tuple({over: v} for v in values)
    levels = raw["levels"]
    if not (isinstance(levels, list) and len(levels) >= 2 and all(
            isinstance(lv, dict) and lv and set(lv) <= set(TREND_OVER) and all(_number(v) for v in lv.values())
            for lv in levels)):
        raise ClaimsError(f"{where}: 'levels' must be a list of two or more mappings of "
                          f"{', '.join(TREND_OVER)} to numbers")
    if len({where_label(lv) for lv in levels}) < len(levels):
        raise ClaimsError(f"{where}: 'levels' lists a level twice")
    return tuple(dict(lv) for lv in levels)


def _side(raw: Any, shared: dict[str, Any], where: str) -> SideSpec:
    _keys(raw, SIDE_KEYS, ("method",), where)
    method = _text(raw["method"], f"{where}: method")
    params = raw.get("params", {})
    if not (isinstance(params, dict) and all(isinstance(k, str) for k in params)):
        raise ClaimsError(f"{where}: 'params' must be a mapping of method parameters")
    endpoint = _text(raw["endpoint"], f"{where}: endpoint") if "endpoint" in raw else None
    fig = raw.get("figure")
    if fig is not None and fig not in SIDE_FIGURES:
        raise ClaimsError(f"{where}: 'figure' must be one of {', '.join(SIDE_FIGURES)}")
    return SideSpec(method, dict(params), {**shared, **_select(raw, where)}, endpoint, fig)


def _select(raw: dict[str, Any], where: str) -> dict[str, Any]:
    out = {k: raw[k] for k in SELECT if k in raw}
    for k, v in out.items():
        if k in NUMBER_SELECT and not _number(v):
            raise ClaimsError(f"{where}: '{k}' must be a number")
        if k in TEXT_SELECT:
            out[k] = _text(v, f"{where}: {k}")
    return out


def _records(value: Any, where: str) -> str:
    """A records folder: a relative path with no '..' (resolved inside the claims file's folder by
    ``Evaluation``, which also refuses a link that leads outside)."""
    text = _text(value, f"{where}: records")
    parts = PurePosixPath(text).parts
    if PurePosixPath(text).is_absolute() or "\\" in text or ".." in parts or not parts:
        raise ClaimsError(f"{where}: 'records' must be a folder relative to the claims file, inside its folder")
    return text


def _keys(raw: Any, known: tuple, required: tuple, where: str) -> None:
    if not isinstance(raw, dict):
        raise ClaimsError(f"{where} must be a mapping")
    if unknown := sorted(str(k) for k in raw if k not in known):
        raise ClaimsError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
    if missing := [k for k in required if k not in raw]:
        raise ClaimsError(f"{where}: missing {', '.join(map(repr, missing))}")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ClaimsError(f"{where} must be a non-empty text")
    return value.strip()


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return _number(a) and _number(b) and math.isclose(a, b)


def setting_of(g: SettingGroup, key: str) -> Any:
    """The value of a SELECT field in a group's setting (None where the group has no such setting:
    ``k`` of a Dirichlet partition)."""
    if key in ("alpha", "k"):
        return g.partition_params.get(key)
    return {"clients": g.n_clients, "clients_per_round": g.clients_per_round, "task": g.task,
            "optimizer": g.optimizer}[key]


# ----------------------------------------------------------------------------- the tests


@dataclass(frozen=True)
class FigureSide(Side):
    """A side read at a figure of its own (``SideSpec.figure``), whatever the comparison's."""

    fixed: Optional[str] = None

    @property
    def label(self) -> str:
        return Side.label.fget(self) + (f" ({self.fixed})" if self.fixed else "")

    def value(self, record: dict[str, Any], figure: str) -> Optional[float]:
        if self.fixed != GAP:
            return statistic_value(record, self.fixed or figure, self.endpoint)
        selected, final = statistic_value(record, "selected"), statistic_value(record, "final")
        return None if selected is None or final is None else selected - final


@dataclass
class Result:
    """One tested line of a claim: a comparison, or a trend's test."""

    label: str  # A - B
    records: str
    task: Optional[str] = None
    figure: str = ""
    n: str = "0"
    mean: Optional[float] = None
    levels: Optional[tuple[float, float]] = None  # a comparison's mean A and mean B over its paired seeds
    low: Optional[float] = None
    high: Optional[float] = None
    p: Optional[float] = None
    p_holm: Optional[float] = None
    verdict: str = NOT_YET
    notes: list[str] = field(default_factory=list)
    comparison: Optional[Comparison] = None  # a paired comparison's own figures (json)
    min_n: int = 0  # the fewest paired seeds the test reads (a trend: at its first or last level)
    at_paper: Optional["Result"] = None  # the same test at the paper's figure, where it is not the headline's

    @property
    def paper_differs(self) -> bool:
        """Whether the test at the paper's figure reaches another verdict than the headline's."""
        return self.at_paper is not None and self.at_paper.verdict != self.verdict

    def as_dict(self) -> dict[str, Any]:
        return {"test": self.label, "records": self.records, "task": self.task, "figure": self.figure, "n": self.n,
                "means": None if self.levels is None else list(self.levels),
                "mean_difference": self.mean, "ci95": None if self.low is None else [self.low, self.high],
                "p": self.p, "p_holm": self.p_holm, "verdict": self.verdict, "notes": self.notes,
                "pairing": self.comparison.pairing.as_dict() if self.comparison else None,
                "at_paper_figure": None if self.at_paper is None else {
                    k: v for k, v in self.at_paper.as_dict().items() if k not in ("test", "records", "task")}}


@dataclass
class ClaimResult:
    spec: ClaimSpec
    results: list[Result]
    verdict: str


def verdict_of(low: Optional[float], high: Optional[float], p_holm: Optional[float]) -> str:
    """A tested line's verdict from its interval and adjusted p (module doc)."""
    if low is None or p_holm is None or p_holm >= LEVEL:
        return NOT_RESOLVED
    return REPRODUCED if low > 0 else CONTRADICTED if high < 0 else NOT_RESOLVED


def claim_verdict(results: list[Result]) -> str:
    """A claim's verdict from its lines' (module doc)."""
    verdicts = [r.verdict for r in results]
    if not verdicts:
        return NOT_YET
    for v in (CONTRADICTED, NOT_YET):
        if v in verdicts:
            return v
    if all(v == CANNOT for v in verdicts):
        return CANNOT
    return REPRODUCED if all(v == REPRODUCED for v in verdicts) else NOT_RESOLVED


def verdict_label(verdict: str, setting: str) -> str:
    """A verdict as the page reads it: with the setting it was reached in, where that is not the
    paper's (``contradicted on a proxy``, ``reproduced, other experiment``); not yet tested as it is."""
    return verdict if verdict == NOT_YET else verdict + SETTING_SUFFIX[setting]


def adjust(results: list[Result]) -> None:
    """Holm over the tested lines of one claim (at one figure), and each line's verdict; a line on
    fewer than ``MIN_RESOLVABLE`` seeds (a trend: at a level) reads ``CANNOT``."""
    tested = [r for r in results if r.p is not None]
    for r, adjusted in zip(tested, holm([r.p for r in tested])):
        r.p_holm = round(adjusted, 6)
        r.verdict = verdict_of(r.low, r.high, r.p_holm)
    for r in results:
        if r.verdict != NOT_YET and r.min_n < MIN_RESOLVABLE:
            r.verdict = CANNOT


class Evaluation:
    """Reads each records folder once (``groups``) and tests claims on it."""

    def __init__(self, base: Path):
        self.base = base.resolve()
        self.cache: dict[str, list[SettingGroup]] = {}
        self.skipped: list[str] = []

    def groups(self, records: str) -> list[SettingGroup]:
        if records not in self.cache:
            try:
                folder = (self.base / records).resolve()
            except (OSError, RuntimeError) as e:  # a link loop (RuntimeError before Python 3.13)
                raise ClaimsError(f"records folder {records!r} cannot be followed: {e}") from None
            if not folder.is_relative_to(self.base):
                raise ClaimsError(f"records folder {records!r} leads outside the claims file's folder")
            groups, skipped = folder_groups(folder) if folder.is_dir() else ([], [])
            self.cache[records], self.skipped = groups, self.skipped + skipped
        return self.cache[records]

    def select(self, records: str, side: SideSpec, extra: Optional[dict[str, Any]] = None) -> Optional[SettingGroup]:
        self.check_method(records, side.method)
        found = [g for g in self.groups(records) if side.matches(g, extra or {})]
        if len(found) > 1:
            raise ClaimsError(f"{side.label()} matches {len(found)} groups in {records} (versions or settings "
                              f"differ); name {', '.join(SELECT)}")
        return found[0] if found else None

    def check_method(self, records: str, name: str) -> None:
        """A side's method must be a built-in (the frozen table of cards) or have records in its
        folder; never looked up in the registry, so what is installed changes nothing."""
        known = set(BUILTIN_CARDS) | {g.method for g in self.groups(records)}
        if name not in known:
            raise ClaimsError(f"{records}: {unknown_message('method', name, sorted(known))}")

    def claim(self, spec: ClaimSpec) -> ClaimResult:
        results = [self.comparison(c) for c in spec.comparisons] + [self.trend(t) for t in spec.trends]
        adjust(results)
        if spec.paper_figure != HEADLINE:  # the same tests at the paper's figure, Holm over them alike
            tests = [self.comparison(c, spec.paper_figure) if not (c.a.figure or c.b.figure) else None
                     for c in spec.comparisons] + [self.trend(t, spec.paper_figure) for t in spec.trends]
            adjust([t for t in tests if t is not None])
            for r, at_paper in zip(results, tests):
                r.at_paper = at_paper
        return ClaimResult(spec, results, claim_verdict(results))

    def comparison(self, spec: ComparisonSpec, figure: Optional[str] = None) -> Result:
        out = Result(pair_label(spec.a, spec.b), spec.records)
        ga, gb = self.select(spec.records, spec.a), self.select(spec.records, spec.b)
        if ga is None or gb is None:
            out.notes.append(f"no records of {(spec.a if ga is None else spec.b).label()} yet")
            return out
        a, b = _paired_side(ga, spec.a), _paired_side(gb, spec.b)
        c = compare(a, b, figure)
        out.task, out.figure, out.n, out.comparison = ga.task, _figure(a, b, c.figure), str(c.n), c
        out.min_n = c.n
        if c.n == 0:
            out.notes.append("no seed paired")
            return out
        for side, values in ((spec.a, c.pairing.a), (spec.b, c.pairing.b)):
            if side.figure == GAP:  # the difference of two gaps says little without the gaps themselves
                out.notes.append(f"{side.method}'s own gap: {statistics.fmean(values):+.2f}")
        out.mean, out.low, out.high, out.p = c.mean, c.low, c.high, c.p
        out.levels = (round(statistics.fmean(c.pairing.a), 4), round(statistics.fmean(c.pairing.b), 4))
        out.verdict = NOT_RESOLVED
        return out

    def trend(self, spec: TrendSpec, figure: Optional[str] = None) -> Result:
        figure = check_figure(figure)
        first, last = spec.levels[0], spec.levels[-1]
        ratio = spec.statistic == "ratio"
        pair_text = pair_label(spec.a, spec.b).replace(" - ", " / ", 1) if ratio else pair_label(spec.a, spec.b)
        out = Result(f"({pair_text}){' ratio' if ratio else ''} at {where_label(last)} - at {where_label(first)}",
                     spec.records, figure=figure)
        diffs: list[list[float]] = []
        processors: set[str] = set()
        dirty = 0
        for level in spec.levels:
            ga = self.select(spec.records, spec.a, level)
            gb = self.select(spec.records, spec.b, level)
            diffs.append([])
            if ga is None or gb is None:
                out.notes.append(f"{where_label(level)}: no records")
                continue
            pg = pair(_paired_side(ga, spec.a), _paired_side(gb, spec.b), figure)  # each side's endpoint
            # the paper's "factor" A / B per seed (a seed whose B is 0 has none), or the difference A - B
            diffs[-1] = [x / y for x, y in zip(pg.a, pg.b) if y > 0] if ratio else [x - y for x, y in zip(pg.a, pg.b)]
            processors.update(pg.processors)
            dirty += len(pg.uncommitted)
            out.task = ga.task
            if pg.seeds and ratio:
                out.notes.append(f"{where_label(level)}: mean ratio {statistics.fmean(diffs[-1]):.3f} "
                                 f"(n={len(diffs[-1])})")
            elif pg.seeds:
                out.notes.append(f"{where_label(level)}: {statistics.fmean(diffs[-1]):+.2f} "
                                 f"(ratio {statistics.fmean(pg.a) / statistics.fmean(pg.b):.2f}, n={len(pg.seeds)})")
        if len(processors) > 1:  # within a level's pairs or between levels: as compare marks it
            out.notes.append(f"mixed hosts: {len(processors)} processors")
        if dirty:
            out.notes.append(f"uncommitted: {dirty} pairs ran from a tree with uncommitted changes")
        small, large = diffs[0], diffs[-1]
        out.n = f"{len(large)} vs {len(small)}"
        out.min_n = min(len(large), len(small))
        if not small or not large:
            return out
        out.mean = round(statistics.fmean(large) - statistics.fmean(small), 4)
        out.verdict = NOT_RESOLVED
        if len(small) > 1 and len(large) > 1:
            out.low, out.high, out.p = welch(large, small)
        return out


def _paired_side(g: SettingGroup, spec: SideSpec) -> FigureSide:
    return FigureSide(g, spec.endpoint, variant=params_label(g.method_params, {}), fixed=spec.figure)


def _figure(a: FigureSide, b: FigureSide, default: str) -> str:
    fa, fb = a.fixed or default, b.fixed or default
    return fa if fa == fb else f"{fa} vs {fb}"


def welch(x: list[float], y: list[float]) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """Welch's 95% interval of mean(x) - mean(y) and its two-sided p (module doc); Nones where
    both samples are constant (no spread to test against)."""
    from scipy.stats import ttest_ind

    if len(set(x)) == 1 and len(set(y)) == 1:
        return None, None, None
    res = ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(CONFIDENCE)
    return round(float(ci.low), 4), round(float(ci.high), 4), float(res.pvalue)


def folder_groups(folder: Path) -> tuple[list[SettingGroup], list[str]]:
    """A records folder's groups, from the records ``leaderboard validate`` accepts (as ``compare``
    reads them), and a line for each file skipped."""
    from hfl_bench.results.board import board_records, build_groups
    from hfl_bench.results.loading import load_records

    loaded, not_records = load_records([folder])
    records, excluded = board_records(loaded)
    return build_groups(records), [s.line() for s in not_records + excluded]


def evaluate(path: Path, paper: Optional[str] = None) -> tuple[list[ClaimResult], list[str]]:
    """Every claim of the claims file at ``path`` (``paper``: that paper's alone, any case) tested
    on its records; the lines of the record files skipped. An unknown paper is a ``ClaimsError``."""
    claims = read_claims(path)
    if paper is not None:
        papers = list(dict.fromkeys(c.paper for c in claims))
        if paper.casefold() not in {p.casefold() for p in papers}:
            raise ClaimsError(f"--paper: unknown paper {paper!r}; the claims file names "
                              + "; ".join(repr(p) for p in papers))
        claims = [c for c in claims if c.paper.casefold() == paper.casefold()]
    ev = Evaluation(path.parent)
    return [ev.claim(c) for c in claims], ev.skipped
