"""The leaderboard's columns: one list that every view of a group iterates.

``hfl-bench leaderboard show`` (terminal table, markdown, csv, json) and ``leaderboard html`` render
each group's row from this list, in its order: a column is declared once (``Column``) with its
name, how its value is computed from the group (``GroupRow``), its text (terminal and markdown),
its raw value (csv field and json key), its HTML cell (plain text: the site escapes it) and the
views that show it. Adding a column is one ``register_column`` call::

    from hfl_bench.results.columns import Column, register_column

    register_column(Column("rounds run", lambda row: row.group.rounds, numeric=True), after="seeds")

A plugin adds one through the ``hfl_bench.columns`` entry-point group (``ENTRY_POINT_GROUP``).
Each view takes the columns that name it (``columns(view)``). The rows beside a group (a published
figure, a multimodal group's other clients, a csv endpoint row) are the views' own; a column they
do not fill is empty there.

The committed views place a few figures differently from one another (csv and json order the
section and the group id, the drop and the selected figures differently; the site splits failed /
diverged in two): those are separate entries, each shown by its own views, so each view's output
is what it was.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterable, Optional

from hfl_bench.registry import RegistryError, unknown_message
from hfl_bench.results import seen_unseen
from hfl_bench.results.budget import (
    CLIENT_KINDS,
    budget_of,
    flops_label,
    group_steps,
    inference_label,
    mean_inference_flops,
    mean_steps,
    mean_training_flops,
    steps_label,
)
from hfl_bench.results.fairness import DEFINITIONS as FAIRNESS_DEFINITIONS
from hfl_bench.results.fairness import FIGURES as FAIRNESS_FIGURES
from hfl_bench.results.fairness import group_fairness
from hfl_bench.results.headline import group_basis, headline_stat, marked
from hfl_bench.results.loading import selection_mark
from hfl_bench.results.ranking import protocol_label, protocol_labels
from hfl_bench.results.setting import METRICS, SettingGroup, Stat, canonical, modalities_section, partition_label
from hfl_bench.results.timing import group_timing

VIEWS = ("terminal", "markdown", "csv", "json", "html")
ALL = frozenset(VIEWS)
TEXT = frozenset({"terminal", "markdown"})
DATA = frozenset({"csv", "json"})


# ----------------------------------------------------------------------------- formatting


def _num(x: Optional[float], nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _pm(mean: Optional[float], sd: Optional[float]) -> str:
    return "-" if mean is None else f"{mean:.2f} ± {_num(sd)}"


def _params_label(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items())) or "default"


def _setting_label(partition: str, n_clients: Any, clients_per_round: Any, rounds: Any) -> str:
    n = "?" if n_clients is None else str(n_clients)
    if clients_per_round not in (None, n_clients):
        n += f"/{clients_per_round}"
    return f"{partition} N={n} R={'?' if rounds is None else rounds}"


def drop_label(g: Any) -> str:
    """A group's drop against the same seeds and clients without faults, as the headline reads it
    (``robustness``: the final window's, marked when the selected rounds' stands in) with its 95%
    t-interval over the paired seeds: ``-2.10 [-4.02, -0.18] (n=3)``; ``-`` when no seed could be
    paired, empty for a group without faults."""
    if not g.has_faults:
        return ""
    drop = g.drop
    if drop is None or drop.headline_mean is None:
        return "-"
    ci = f" [{drop.interval[0]:+.2f}, {drop.interval[1]:+.2f}]" if drop.interval else ""
    return marked(f"{drop.headline_mean:+.2f}", drop.statistic) + f"{ci} (n={drop.n_paired})"


def human_bytes(x: Optional[float]) -> str:
    """``1.21 MB``: a byte count to three significant figures or so ('-' for None)."""
    if x is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:.0f} B"


def bytes_label(g: Any) -> str:
    """The seeds' mean bytes sent per client per round ('-' where no record says)."""
    sent = [x for x in (_bytes_sent(r.record) for r in g.ok) if x is not None]
    return human_bytes(sum(sent) / len(sent)) if sent else "-"


def version_label(g: Any) -> str:
    """The method version ("-": records from before versions), and what else differs between
    the seeds' code: several commits, uncommitted changes."""
    label = g.method_version or "-"
    return f"{label} ({g.provenance_note})" if g.provenance_note else label


def _bytes_sent(record: dict[str, Any]) -> Optional[float]:
    return (record.get("cost") or {}).get("bytes_sent_per_client_per_round")


def _plain(v: Any) -> str:
    """A value as one text: None as '', strings as themselves, anything else as ``str``."""
    return "" if v is None else v if isinstance(v, str) else str(v)


# ----------------------------------------------------------------------------- a group row


@dataclass
class GroupRow:
    """One group as the views see it: the group and the board's protocol labels (a protocol's
    label names its data where one task's protocols differ only in it). Figures several columns
    read are computed once."""

    group: SettingGroup
    labels: dict[tuple, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, groups: list[SettingGroup]) -> list["GroupRow"]:
        labels = protocol_labels(groups)
        return [cls(g, labels) for g in groups]

    @cached_property
    def records(self) -> list[dict[str, Any]]:
        return [r.record for r in self.group.ok]

    @cached_property
    def figures(self) -> dict[str, Any]:
        """The csv's headline, all clients' and donors' figures (``csv_figures``)."""
        return csv_figures(self.group)

    @cached_property
    def setting(self) -> str:
        g = self.group
        setting = _setting_label(partition_label(g.partition_scheme, g.partition_params), g.n_clients,
                                 g.clients_per_round, g.rounds)
        if g.eval_clients is not None:  # sampled evaluation outside the final window (--eval-clients)
            setting += f" eval={g.eval_clients}"
        if g.capacity_profile:  # a levels pool's members picked by a capacity profile (--capacity-profile)
            setting += f" profile={g.capacity_profile}"
        if self.labels.get(g.protocol(), protocol_label(g)) != protocol_label(g):  # differ only in their data
            setting += " " + g.data_label
        if g.is_multimodal:
            setting += " " + g.modalities
        if mark := selection_mark(g.selection_rule):  # records selected by an old rule (honest-val): kept apart
            setting += f" selection={mark}"
        if g.method_params:
            setting += " " + _params_label(g.method_params)
        return setting


# ----------------------------------------------------------------------------- a column


@dataclass(frozen=True)
class Column:
    """One column of the leaderboard, declared once for every view.

    ``value(row)`` computes it from a ``GroupRow``; ``text(value)`` is its terminal and markdown
    cell, ``raw(value)`` its csv field and json value (under ``field``: the name with ``_`` for
    spaces), ``html(value)`` its HTML cell as plain text (escaped by the site; default: the text).
    ``views``: which of ``VIEWS`` show it. ``numeric``: right-aligned in the terminal, sorted as a
    number on the site (by ``sort(value)``, default the raw value). ``figure``: never moved into a
    section's title when every row has one value (``render.readable``).

    The rest describes the committed layouts: ``csv`` / ``json`` give several fields at once
    (``csv_fields`` names them, in order), ``stacked`` is the terminal's header on several lines,
    ``title`` the site's header tooltip, ``sub`` the site's cell class in the rows beside a group
    (by row kind; a column without one is merged into a blank span), ``faults_only`` shows it on
    the site only where a group ran with faults (``clock_only``: where a group has a simulated clock,
    ``--devices``), ``link`` makes its cell the group page's link, and
    ``th_joins`` / ``td_joins`` put its header / cell on the line of the one before.

    ``opt_in`` names the column set it belongs to (``FAIRNESS``): the terminal, markdown, csv and
    json show it only when asked for that set (``columns(view, opt_in=...)``: ``leaderboard show
    --fairness``, or ``--columns`` naming it), so their default views stay as they were; the
    site, whose table a reader sorts and filters, shows it always.
    """

    name: str
    value: Callable[[GroupRow], Any]
    text: Callable[[Any], str] = _plain
    raw: Callable[[Any], Any] = lambda v: v
    html: Optional[Callable[[Any], str]] = None
    views: frozenset[str] = ALL
    header: str = ""
    field: str = ""
    numeric: bool = False
    figure: bool = False
    sort: Optional[Callable[[Any], Any]] = None
    csv: Optional[Callable[[GroupRow], dict[str, Any]]] = None
    csv_fields: tuple[str, ...] = ()
    json: Optional[Callable[[GroupRow], dict[str, Any]]] = None
    stacked: str = ""
    title: str = ""
    sub: dict[str, str] = dataclasses.field(default_factory=dict)
    faults_only: bool = False
    clock_only: bool = False
    link: bool = False
    th_joins: bool = False
    td_joins: bool = False
    opt_in: str = ""

    def __post_init__(self):
        unknown = set(self.views) - ALL
        if not self.name.strip() or unknown:
            raise RegistryError(f"column {self.name!r}: " + (f"unknown views {sorted(unknown)}; known: "
                                                             f"{', '.join(VIEWS)}" if unknown else "empty name"))
        object.__setattr__(self, "views", frozenset(self.views))

    @property
    def shown_header(self) -> str:
        return self.header or self.name

    @property
    def key(self) -> str:
        """Its csv field and json key."""
        return self.field or self.name.replace(" ", "_")

    def fields(self) -> tuple[str, ...]:
        """The csv fields it fills, in order."""
        return self.csv_fields if self.csv else (self.key,)

    def csv_values(self, row: GroupRow) -> dict[str, Any]:
        return self.csv(row) if self.csv else {self.key: self.raw(self.value(row))}

    def json_values(self, row: GroupRow) -> dict[str, Any]:
        return self.json(row) if self.json else {self.key: self.raw(self.value(row))}

    def text_cell(self, row: GroupRow) -> str:
        return self.text(self.value(row))

    def html_cell(self, row: GroupRow) -> tuple[str, Any]:
        """The site's cell: its plain text and its sort value (None for a text column)."""
        v = self.value(row)
        text = (self.html or self.text)(v)
        return text, ((self.sort or self.raw)(v) if self.numeric else None)


# ----------------------------------------------------------------------------- the registry

_COLUMNS: dict[str, Column] = {}
# Plugins add columns through this entry-point group: an entry point names a module (importing it
# calls register_column) or a Column (registered at the end). Loaded the first time a view asks.
ENTRY_POINT_GROUP = "hfl_bench.columns"
_discovered = False  # every entry point loaded
_discovering = False  # loading now, in the thread that holds the registries' discovery lock


def _discover() -> None:
    """Load the ``hfl_bench.columns`` entry points once; one that fails is taken back and skipped
    with one warning line (``registry.skip_plugin``), as a faulty method plugin is. Under the
    registries' discovery lock: another thread's view waits for every column (issue 63)."""
    global _discovered, _discovering
    if _discovered:
        return
    from hfl_bench.registry import DISCOVERY_LOCK, plugin_entry_points, skip_plugin

    with DISCOVERY_LOCK:
        if _discovered or _discovering:  # another thread's, done; or this thread's (a plugin asking for a column)
            return
        _discovering = True
        try:
            for ep in plugin_entry_points(ENTRY_POINT_GROUP):
                before = set(_COLUMNS)
                try:
                    loaded = ep.load()
                    if isinstance(loaded, Column):
                        register_column(loaded)
                    elif not isinstance(loaded, types.ModuleType):
                        raise RegistryError(f"entry point {ep.value} is neither a module nor a Column")
                except Exception as e:
                    for name in set(_COLUMNS) - before:
                        _COLUMNS.pop(name)
                    skip_plugin(ep, e)
        finally:
            _discovering = False
        _discovered = True


def register_column(column: Column, *, after: Optional[str] = None) -> Column:
    """Add ``column`` to every view that names it: at the end, or right ``after`` the named one.
    A taken name or an unknown ``after`` raises RegistryError."""
    if column.name in _COLUMNS:
        raise RegistryError(f"leaderboard column {column.name!r} is already registered")
    if after is not None and after not in _COLUMNS:
        raise RegistryError(unknown_message("leaderboard column", after, sorted(_COLUMNS)))
    items = list(_COLUMNS.items())
    at = len(items) if after is None else [n for n, _ in items].index(after) + 1
    items.insert(at, (column.name, column))
    _COLUMNS.clear()
    _COLUMNS.update(items)
    return column


def unregister_column(name: str) -> Column:
    """Take a column out of every view (RegistryError for an unknown name)."""
    get_column(name)
    return _COLUMNS.pop(name)


def get_column(name: str) -> Column:
    _discover()
    try:
        return _COLUMNS[name]
    except KeyError:
        raise RegistryError(unknown_message("leaderboard column", name, sorted(_COLUMNS))) from None


def columns(view: Optional[str] = None, opt_in: Iterable[str] = ()) -> list[Column]:
    """The columns a view shows (every one for None), in the list's order: an opt-in column
    (``Column.opt_in``) only where its set is in ``opt_in`` (the site and None: always)."""
    if view is not None and view not in ALL:
        raise RegistryError(unknown_message("leaderboard view", view, list(VIEWS)))
    _discover()
    asked = set(opt_in)
    return [c for c in _COLUMNS.values() if (view is None or view in c.views)
            and (not c.opt_in or view in (None, "html") or c.opt_in in asked)]


def opt_in_sets() -> tuple[str, ...]:
    """Every opt-in column set a registered column names."""
    return tuple(dict.fromkeys(c.opt_in for c in columns() if c.opt_in))


def names(view: str, opt_in: Iterable[str] = ()) -> tuple[str, ...]:
    return tuple(c.name for c in columns(view, opt_in))


def csv_fields(opt_in: Iterable[str] = ()) -> tuple[str, ...]:
    """The csv header: every csv column's fields, in order (the opt-in sets' columns where asked)."""
    return tuple(f for c in columns("csv", opt_in) for f in c.fields())


# ----------------------------------------------------------------------------- the figures of the
# committed layouts (several fields per column in csv and json)


def section_fields(g: SettingGroup) -> dict[str, Any]:
    """A group's setting section and its parts (csv and json; ``single_architecture`` null where
    nothing says)."""
    return {"section": g.section, "transfer": g.transfer, "single_architecture": g.single_architecture,
            "budget": g.budget, "peer_data": g.peer_data, "optimizer": g.optimizer}


SECTION_FIELDS = ("section", "transfer", "single_architecture", "budget", "peer_data", "optimizer")


def csv_figures(g: SettingGroup, endpoint: Optional[str] = None) -> dict[str, Any]:
    """The seed count and the headline, all clients' and (multimodal) donors' means and sds of the
    model or of one extra endpoint (the headline statistic, ``headline``: an endpoint's final figure
    from schema 1.7, its selected round's before)."""
    out: dict[str, Any] = {}
    for prefix, clients in (("", "headline"), ("all_", "all"), ("donors_", "donors")):
        if clients == "donors" and not g.is_multimodal:
            continue
        for name, metric in (("global", "global_acc"), ("local", "local_acc")):
            st = headline_stat(g, metric, clients, endpoint)
            out |= {f"{prefix}{name}_mean": st.mean, f"{prefix}{name}_sd": st.sd}
            if not prefix and name == "global":  # the group's ok seeds, as in JSON (every client faulty: no figure)
                out["n_seeds"] = st.n if endpoint else len(g.ok)
    return out


OTHER_CLIENTS_CSV = ("all_global_mean", "all_global_sd", "all_local_mean", "all_local_sd", "donors_global_mean",
                     "donors_global_sd", "donors_local_mean", "donors_local_sd")
DROP_CSV = ("drop_mean", "drop_statistic", "drop_ci_low", "drop_ci_high", "drop_selected_mean", "drop_n_paired",
            "drop_seeds")
FINAL_CSV = ("final_global_mean", "final_global_sd", "final_local_mean", "final_local_sd", "all_final_global_mean",
             "all_final_global_sd")
# The seen / unseen-class accuracy (schema 1.6; empty for older records): the headline's at the
# selected round and over the final window, all clients' at the selected round.
SEEN_UNSEEN_CSV = ("seen_mean", "seen_sd", "unseen_mean", "unseen_sd", "final_seen_mean", "final_seen_sd",
                   "final_unseen_mean", "final_unseen_sd", "all_seen_mean", "all_unseen_mean")
STEPS_CSV = ("private_steps_per_client_round", "public_steps_per_client_round", "synthetic_steps_per_client_round",
             "server_steps_per_round")


def _csv_drop(row: GroupRow) -> dict[str, Any]:
    drop = row.group.drop
    return {"drop_mean": drop.headline_mean if drop else None, "drop_statistic": drop.statistic if drop else None,
            "drop_ci_low": drop.interval[0] if drop and drop.interval else None,
            "drop_ci_high": drop.interval[1] if drop and drop.interval else None,
            "drop_selected_mean": drop.mean if drop else None, "drop_n_paired": drop.n_paired if drop else None,
            "drop_seeds": " ".join(map(str, drop.seeds)) if drop else None}


def _csv_final(row: GroupRow) -> dict[str, Any]:
    g = row.group
    fg, fl, fa = g.final_stat("global_acc"), g.final_stat("local_acc"), g.final_stat("global_acc", "all")
    return {"final_global_mean": fg.mean, "final_global_sd": fg.sd, "final_local_mean": fl.mean,
            "final_local_sd": fl.sd, "all_final_global_mean": fa.mean, "all_final_global_sd": fa.sd}


def _csv_seen_unseen(row: GroupRow) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, metric in (("seen", "seen_acc"), ("unseen", "unseen_acc")):
        now, final = seen_unseen.stat(row.group, metric), seen_unseen.stat(row.group, metric, final=True)
        out |= {f"{name}_mean": now.mean, f"{name}_sd": now.sd, f"final_{name}_mean": final.mean,
                f"final_{name}_sd": final.sd, f"all_{name}_mean": seen_unseen.stat(row.group, metric, "all").mean}
    return out


def _csv_steps(row: GroupRow) -> dict[str, Any]:
    """The seeds' mean optimizer steps per client per round by kind of data, the server's per
    round (empty for records before schema 1.6)."""
    steps = group_steps(row.records)
    out = {f"{kind}_steps_per_client_round": steps[kind] for kind in CLIENT_KINDS}
    return out | {"server_steps_per_round": steps["server"]}


def json_clients(g: SettingGroup) -> list[tuple[str, str]]:
    """The client blocks of a group's JSON (key, clients): all clients'; the honest and faulty
    clients' under faults; a multimodal group's recipients' and donors'."""
    return ([("all_clients", "all")] + ([("honest", "honest"), ("faulty", "faulty")] if g.has_faults else [])
            + ([("recipients", "recipients"), ("donors", "donors")] if g.is_multimodal else []))


def _json_steps(row: GroupRow) -> dict[str, Any]:
    """The seeds' mean steps per client per round on private, public and synthetic data and all of
    them, the server's per round (``server``), and how many seeds have a budget (``n``; 0: records
    before schema 1.6, every figure null)."""
    return {**group_steps(row.records), "n": sum(1 for r in row.records if budget_of(r) is not None)}


def _json_modalities(g: SettingGroup) -> dict[str, Any]:
    """A multimodal group's modality setting and its parts (from a seed's ``modalities``
    section); nothing for any other group."""
    if not g.is_multimodal:
        return {}
    section = next((modalities_section(r.record) for r in g.ok if modalities_section(r.record)), {})
    return {"modalities": {"setting": g.modalities, "names": section.get("names"), "missing": section.get("missing"),
                           "recipient_fraction": section.get("recipient_fraction")}}


def json_endpoint(g: SettingGroup, endpoint: str) -> dict[str, Any]:
    """One extra endpoint's headline figures (``headline``: final, else the selected round's, which
    ``headline_statistic`` names) and its selected round's; a multimodal group's also over the
    recipients, the donors and all clients."""
    out: dict[str, Any] = {m: headline_stat(g, m, endpoint=endpoint).as_dict() for m in METRICS}
    out |= {"headline_statistic": group_basis(g, endpoint=endpoint),
            "selected": {m: g.stat(m, endpoint).as_dict() for m in METRICS}}
    if g.is_multimodal:
        out |= {key: {m: headline_stat(g, m, who, endpoint).as_dict() for m in METRICS}
                for key, who in (("recipients", "recipients"), ("donors", "donors"), ("all_clients", "all"))}
    return out


def _fidelity(g: SettingGroup) -> str:
    """The distinct ``method.fidelity`` of the seeds' records ("-" when none carries it)."""
    seen: list[str] = []
    for r in g.ok:
        v = r.record["method"].get("fidelity")
        if v is not None and v not in seen:
            seen.append(v)
    return ", ".join(seen) or "-"


def _wall_minutes(row: GroupRow) -> Stat:
    return Stat.of((t / 60 if t is not None else None)
                   for t in ((r.get("cost") or {}).get("wall_time_total_s") for r in row.records))


def _figure(metric: str) -> Callable[[GroupRow], tuple[Stat, Optional[str]]]:
    """The headline ``metric`` over the headline's clients and what it is (``headline``)."""
    return lambda row: (headline_stat(row.group, metric), group_basis(row.group, metric))


def _marked_pm(v: tuple[Stat, Optional[str]]) -> str:
    return marked(_pm(v[0].mean, v[0].sd), v[1])


def _stat_pm(st: Stat) -> str:
    return _pm(st.mean, st.sd)


FAIRNESS = "fairness"  # the opt-in column set of the fairness figures
COST = "cost"  # the opt-in column set of measured compute (FLOPs): shown where --columns names it
FAIRNESS_COLUMNS = (
    ("client sd", "client_sd", "client\nsd",
     "population sd over the clients of their final local-test accuracy, per seed; mean ± sample sd over seeds"),
    ("worst 10%", "worst10", "worst\n10%",
     "mean final local-test accuracy of the worst max(1, ceil(n/10)) of the n clients, per seed; mean ± sample sd "
     "over seeds"),
    ("below local", "below_local", "below\nlocal",
     "% of clients below their own final local-test accuracy under local (same seed, protocol, pool, partition), "
     "per seed; mean ± sample sd over seeds; not available without such a local record"),
)


def _fairness(name: str, key: str, stacked: str, title: str) -> Column:
    """One fairness figure's column: its text (``Fairness.label``: mean ± sd, or not recorded / not
    available), csv fields KEY_mean, KEY_sd, KEY_n, json KEY: mean, sd, n and the state."""
    def stat(row: GroupRow) -> Stat:
        return group_fairness(row.group).stat(key)

    return Column(name, lambda row: row.group, text=lambda g: group_fairness(g).label(key, len(g.ok)),
                  numeric=True, figure=True, stacked=stacked, title=title, field=key, opt_in=FAIRNESS,
                  sort=lambda g: group_fairness(g).stat(key).mean,
                  csv=lambda row: {f"{key}_mean": stat(row).mean, f"{key}_sd": stat(row).sd, f"{key}_n": stat(row).n},
                  csv_fields=(f"{key}_mean", f"{key}_sd", f"{key}_n"),
                  json=lambda row: {key: group_fairness(row.group).as_dict()[key]})


CLOCK = "clock"  # the opt-in column set of the simulated clock (--devices; show --clock)
CLOCK_COLUMNS = (
    ("sim time (s)", "sim_time", "sim\ntime (s)",
     "total simulated time of the run on its devices (--devices), per seed; mean ± sample sd over seeds"),
    ("time to local (s)", "time_to_local", "time to\nlocal (s)",
     "simulated time at which the global test accuracy first reaches local's final global accuracy on the same "
     "seed and protocol, per seed; not reached: never; not available: no such local record"),
    ("acc @ time budget", "acc_at_budget", "acc @\ntime budget",
     "global test accuracy of the last tested round that ended within the time budget (show --time-budget S)"),
)


def _timing(name: str, key: str, stacked: str, title: str) -> Column:
    """One time figure's column (``timing``): text ``Timing.label``, csv KEY_mean, KEY_sd, KEY_n, json KEY;
    on the site where a group has a clock (not acc @ time budget: the site has no budget)."""
    def stat(row: GroupRow) -> Stat:
        return group_timing(row.group).stat(key)

    site = frozenset() if key == "acc_at_budget" else frozenset({"html"})
    return Column(name, lambda row: row.group, text=lambda g: group_timing(g).label(key, len(g.ok)),
                  numeric=True, figure=True, stacked=stacked, title=title, field=key, opt_in=CLOCK,
                  views=TEXT | DATA | site, clock_only=True, sort=lambda g: group_timing(g).stat(key).mean,
                  csv=lambda row: {f"{key}_mean": stat(row).mean, f"{key}_sd": stat(row).sd, f"{key}_n": stat(row).n},
                  csv_fields=(f"{key}_mean", f"{key}_sd", f"{key}_n"),
                  json=lambda row: {key: group_timing(row.group).as_dict()[key]})


def NONE(row: GroupRow) -> Any:
    """A column the group's own row leaves empty (the rows beside it fill it)."""
    return None


BESIDE = {"clients": "", "published": ""}  # the site's rows beside a group fill this column, as text
BESIDE_NUM = {"clients": "num", "published": "num"}
SELECTED_TITLE = ("global accuracy at the selected round (best mean validation accuracy): the papers' rule; "
                  "published figures and their delta use it")
STEPS_TITLE = ("optimizer steps per client per round on private data; (all T): with public or synthetic data; "
               "server S: the server's own steps per round")
STEPS = "steps / client / round"
FLOPS = "train FLOPs / client / round"
INFERENCE_FLOPS = "inference FLOPs / client / round"
EVAL_FLOPS = "eval FLOPs / client / round"
BYTES = "bytes / client / round"

# The built-in columns, in the order every view shows them. "global acc" and "local acc" are the
# headline (``headline``: the mean over the last evaluated rounds over the headline's clients: the
# honest ones under faults, a multimodal group's recipients; marked where the selected round's
# stands in); "selected" ones at the selected round (the papers' rule; a published figure sits
# there and its delta is against it). "drop" is a faulty group's drop against the same seeds and
# clients without faults (``robustness``). "steps / client / round" is the work the runs did
# (``budget``), "bytes / client / round" what each client sent per round (the seeds' mean). The
# terminal leaves out the locator (long) and the selected local accuracy (width).
BUILTIN = (
    Column("row type", lambda row: "reproduced", views=frozenset({"csv"})),
    Column("section", NONE, views=frozenset({"csv"}), csv=lambda row: section_fields(row.group),
           csv_fields=SECTION_FIELDS),
    Column("group id", lambda row: row.group.group_id, views=DATA),
    Column("section parts", NONE, views=frozenset({"json"}), json=lambda row: section_fields(row.group)),
    Column("config hash", lambda row: row.group.config_hash, views=frozenset({"json"})),
    Column("method", lambda row: row.group.method, link=True, sub=BESIDE),
    Column("fidelity", lambda row: _fidelity(row.group), views=frozenset({"html"}), th_joins=True),
    Column("version", lambda row: row.group, text=version_label, raw=lambda g: g.method_version,
           field="method_version", views=ALL, th_joins=True),
    Column("predictor", lambda row: row.group.predictor, title="the predictor the headline evaluates"),
    Column("commits", lambda row: row.group.commits, views=DATA,
           csv=lambda row: {"commits": " ".join(row.group.commits)}, csv_fields=("commits",)),
    Column("git dirty", lambda row: "uncommitted" in row.group.provenance_note, views=frozenset({"json"})),
    Column("processors", lambda row: row.group.processors, views=frozenset({"json"})),
    Column("task", lambda row: row.group.task, views=TEXT | DATA),
    Column("data", lambda row: {"fingerprint": row.group.data_fingerprint, "num_classes": row.group.num_classes},
           views=frozenset({"json"})),
    Column("pool", lambda row: row.group.pool),
    Column("partition", NONE, views=DATA,
           csv=lambda row: {"partition_scheme": row.group.partition_scheme,
                            "partition_params": canonical(row.group.partition_params)},
           csv_fields=("partition_scheme", "partition_params"),
           json=lambda row: {"partition": {"scheme": row.group.partition_scheme, "params": row.group.partition_params},
                             "partition_hashes": sorted({r.partition_hash for r in row.group.ok}, key=str),
                             "split_by_partition": row.group.split_by_partition}),
    Column("n clients", lambda row: row.group.n_clients, views=DATA),
    Column("clients per round", lambda row: row.group.clients_per_round, views=DATA),
    Column("rounds", lambda row: row.group.rounds, views=DATA),
    Column("local epochs", lambda row: row.group.local_epochs, views=DATA),
    Column("method params", lambda row: row.group.method_params, views=DATA,
           csv=lambda row: {"method_params": canonical(row.group.method_params)}, csv_fields=("method_params",)),
    Column("faults", lambda row: row.group.faults, faults_only=True, th_joins=True),
    Column("selection rule", lambda row: row.group.selection_rule, views=frozenset({"json"})),
    Column("modalities", lambda row: row.group.modalities, views=DATA, json=lambda row: _json_modalities(row.group)),
    Column("headline clients", lambda row: row.group.headline_clients, views=DATA),
    Column("headline statistic", lambda row: group_basis(row.group), views=DATA),
    Column("setting", lambda row: row.setting, views=TEXT | {"html"}, sub=BESIDE),
    Column("seeds", lambda row: row.group, text=lambda g: str(len(g.ok)), sort=lambda g: len(g.ok), numeric=True,
           csv=lambda row: {"seeds": " ".join(map(str, row.group.seeds)), "n_seeds": len(row.group.ok)},
           csv_fields=("seeds", "n_seeds"),
           json=lambda row: {"seeds": row.group.seeds, "n_seeds": len(row.group.ok)}, sub=BESIDE_NUM, th_joins=True),
    Column("global acc", _figure("global_acc"), text=_marked_pm, sort=lambda v: v[0].mean, numeric=True,
           figure=True, stacked="global\nacc", sub=BESIDE_NUM,
           csv=lambda row: {k: row.figures[k] for k in ("global_mean", "global_sd")},
           csv_fields=("global_mean", "global_sd"),
           json=lambda row: {"global_acc": headline_stat(row.group, "global_acc").as_dict()}),
    Column("drop", lambda row: row.group, text=drop_label, numeric=True, figure=True, views=TEXT | {"html"},
           sort=lambda g: g.drop.headline_mean if g.drop is not None else None, faults_only=True, sub=BESIDE,
           th_joins=True),
    Column("local acc", _figure("local_acc"), text=_marked_pm, sort=lambda v: v[0].mean, numeric=True, figure=True,
           stacked="local\nacc", sub=BESIDE_NUM,
           csv=lambda row: {k: row.figures[k] for k in ("local_mean", "local_sd")},
           csv_fields=("local_mean", "local_sd"),
           json=lambda row: {"local_acc": headline_stat(row.group, "local_acc").as_dict()}),
    Column("other clients", NONE, views=DATA,
           csv=lambda row: {k: v for k, v in row.figures.items() if k in OTHER_CLIENTS_CSV},
           csv_fields=OTHER_CLIENTS_CSV,
           json=lambda row: {key: {m: headline_stat(row.group, m, who).as_dict() for m in METRICS}
                             for key, who in json_clients(row.group)}),
    Column("drop figures", NONE, views=frozenset({"csv"}), csv=_csv_drop, csv_fields=DROP_CSV),
    # the papers' rule: the figures at the selected round (json: both metrics under "selected")
    Column("selected global", lambda row: row.group.stat("global_acc"), text=_stat_pm, sort=lambda st: st.mean,
           numeric=True, figure=True, stacked="selected\nglobal", title=SELECTED_TITLE, sub=BESIDE_NUM,
           csv=lambda row: {"selected_global_mean": row.group.stat("global_acc").mean,
                            "selected_global_sd": row.group.stat("global_acc").sd},
           csv_fields=("selected_global_mean", "selected_global_sd"),
           json=lambda row: {"selected": {m: row.group.stat(m).as_dict() for m in METRICS}}),
    Column("selected local", lambda row: row.group.stat("local_acc"), text=_stat_pm, numeric=True, figure=True,
           stacked="selected\nlocal", views=frozenset({"markdown", "csv"}),
           csv=lambda row: {"selected_local_mean": row.group.stat("local_acc").mean,
                            "selected_local_sd": row.group.stat("local_acc").sd},
           csv_fields=("selected_local_mean", "selected_local_sd")),
    Column("selected clients", NONE, views=frozenset({"json"}),
           json=lambda row: {"selected_clients": {key: {m: row.group.stat(m, clients=who).as_dict() for m in METRICS}
                                                  for key, who in json_clients(row.group)}}),
    Column("drop (json)", lambda row: row.group.drop.as_dict() if row.group.drop is not None else None,
           field="drop", views=frozenset({"json"})),
    Column("final", NONE, views=DATA, csv=_csv_final, csv_fields=FINAL_CSV,  # over the headline's clients
           json=lambda row: {"final": {m: row.group.final_stat(m).as_dict() for m in METRICS},
                             "final_all_clients": {m: row.group.final_stat(m, "all").as_dict() for m in METRICS}}),
    # seen / unseen-class accuracy (schema 1.6; n 0 for older records): the headline's, all clients'
    Column("seen unseen", NONE, views=DATA, csv=_csv_seen_unseen, csv_fields=SEEN_UNSEEN_CSV,
           json=lambda row: {"seen_unseen": seen_unseen.as_json(row.group),
                             "seen_unseen_all_clients": seen_unseen.as_json(row.group, "all")}),
    Column("endpoints", lambda row: {e: json_endpoint(row.group, e) for e in row.group.endpoints()},
           views=frozenset({"json"})),
    Column("failed", lambda row: row.group.n_failed, numeric=True, views=frozenset({"html"})),
    Column("diverged", lambda row: row.group.n_diverged, numeric=True, views=frozenset({"html"}), th_joins=True),
    Column(STEPS, lambda row: row.records, text=steps_label, sort=lambda records: mean_steps(records, "private"),
           numeric=True, figure=True, stacked="steps /\nclient /\nround", title=STEPS_TITLE,
           csv=_csv_steps, csv_fields=STEPS_CSV, json=lambda row: {"steps_per_client_round": _json_steps(row)}),
    # schema 1.9's FLOPs (hfl_bench.flops): shown where --columns names it
    Column(FLOPS, lambda row: row.records, text=flops_label, sort=mean_training_flops, numeric=True, figure=True,
           stacked="train FLOPs /\nclient /\nround", views=TEXT, opt_in=COST),
    # 1.10's inference FLOPs (forward-only passes): a method's, and the engine's evaluation apart
    Column(INFERENCE_FLOPS, lambda row: row.records, text=inference_label, sort=mean_inference_flops, numeric=True,
           figure=True, stacked="inference FLOPs /\nclient /\nround", views=TEXT, opt_in=COST),
    Column(EVAL_FLOPS, lambda row: row.records, text=lambda records: inference_label(records, evaluation=True),
           sort=lambda records: mean_inference_flops(records, evaluation=True), numeric=True, figure=True,
           stacked="eval FLOPs /\nclient /\nround", views=TEXT, opt_in=COST),
    # the site's figure is Stat's (rounded) mean of every number, the tables' the plain mean of the ints and floats
    Column(BYTES, lambda row: row.group, text=bytes_label, views=TEXT | {"html"}, numeric=True, figure=True,
           stacked="bytes /\nclient /\nround", html=lambda g: human_bytes(_bytes_stat(g).mean),
           sort=lambda g: _bytes_stat(g).mean),
    # whom a method serves (``fairness``): opt-in in the tables, csv and json (show --fairness)
    *(_fairness(name, key, stacked, title) for name, key, stacked, title in FAIRNESS_COLUMNS),
    Column("fairness seeds", lambda row: row.group, views=frozenset({"json"}), opt_in=FAIRNESS,
           json=lambda row: {"fairness": {k: v for k, v in group_fairness(row.group).as_dict().items()
                                          if k not in FAIRNESS_FIGURES} | {"definitions": FAIRNESS_DEFINITIONS}}),
    # time on devices (``timing``, schema 1.10's clock): opt-in in the tables, csv and json (show --clock)
    *(_timing(name, key, stacked, title) for name, key, stacked, title in CLOCK_COLUMNS),
    Column("clock seeds", lambda row: row.group, views=frozenset({"json"}), opt_in=CLOCK,
           json=lambda row: {"clock": {k: v for k, v in group_timing(row.group).as_dict().items()
                                       if k in ("time_budget_s", "per_seed", "not_recorded_seeds")}}),
    Column("failed/diverged", lambda row: row.group, text=lambda g: f"{g.n_failed}/{g.n_diverged}",
           stacked="failed/\ndiverged", views=TEXT | DATA,
           csv=lambda row: {"n_failed": row.group.n_failed, "n_diverged": row.group.n_diverged},
           csv_fields=("n_failed", "n_diverged"),
           json=lambda row: {"n_failed": row.group.n_failed, "n_diverged": row.group.n_diverged}),
    Column("duplicates", lambda row: row.group.n_duplicates, field="n_duplicates", views=DATA),
    Column("copies", lambda row: row.group.copies_note, field="copies_note", views=frozenset({"json"})),
    Column("min / run", _wall_minutes, html=lambda st: _num(st.mean), sort=lambda st: st.mean, numeric=True,
           views=frozenset({"html"}), th_joins=True),
    Column("records", lambda row: [str(r.path) for r in row.group.ok], views=frozenset({"json"})),
    Column("published", lambda row: [m.as_dict() for m in row.group.published], views=frozenset({"json"})),
    # the fields of the published rows beside a group (``render``): empty on a group's own row
    Column("endpoint", NONE, views=frozenset({"csv"})),
    Column("citation key", NONE, views=frozenset({"csv"})),
    Column("arxiv or doi", NONE, views=frozenset({"csv"})),
    Column("source", NONE, views=TEXT | {"html"}, sub={"published": ""}),
    Column("locator", NONE, views=frozenset({"markdown", "csv", "html"}), sub={"published": ""}, th_joins=True,
           td_joins=True),
    Column("match", NONE, field="setting_match", views=TEXT | {"csv", "html"}, sub={"published": ""},
           th_joins=True, td_joins=True),
    Column("published metric", NONE, views=frozenset({"csv"})),
    Column("published value", NONE, views=frozenset({"csv"})),
    Column("published sd", NONE, views=frozenset({"csv"})),
    Column("reproduced mean", NONE, views=frozenset({"csv"})),
    # a group row's delta cell is empty; the site sorts it by the first published figure's delta
    Column("delta", lambda row: next((m.delta for m in row.group.published if m.delta is not None), None),
           text=lambda v: "", raw=lambda v: None, numeric=True, figure=True, views=TEXT | {"csv", "html"},
           sub={"published": "num"}, sort=lambda v: v),
)


def _bytes_stat(g: SettingGroup) -> Stat:
    return Stat.of(_bytes_sent(r.record) for r in g.ok)


for _column in BUILTIN:
    register_column(_column)
