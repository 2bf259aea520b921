"""The two families of model heterogeneity on the same clients (issue 66): per task, protocol and
**capacity profile**, every method's figures with its budget beside them, each against ``local`` (the
floor), and every sub-model method against every knowledge-exchange method, paired by seed, with a
generated reading of which family comes out ahead (``leaderboard families``).

**Capacity profile.** Which share of the clients runs at which capacity (HeteroFL's ``a1-e1``...).
A sub-model record (``method.submodels`` true: HeteroFL, FedRolex, FjORD, DepthFL) names it in its
method hyperparameter ``profile`` (``--set profile=P``; else ``method.run_details.capacity_profile``);
a knowledge-exchange record names it in its config's ``capacity_profile`` (``--capacity-profile P``
on a levels pool, ``heterofl-cnn-levels``: each client runs, as an architecture of its own, the
width the sub-model family gives that client under P and the seed). A record with neither is not
part of this view: it is counted and left out. DepthFL's profile letters name depths, not widths.

**Families.** A record's family is ``sub-model`` where ``method.submodels`` is true, else
``knowledge exchange``; ``local`` (no exchange at all) is the floor, shown in a row of its own and in
neither family.

**Protocol.** ``SettingGroup.protocol`` without the parts of the setting section that tell the two
families apart (transfer data, single architecture, sub-models, peer data): the same task and data,
partition, clients, rounds, epochs, faults, modalities, selection rule, budget class and optimizer.
Records of two protocols are never paired: each (task, protocol, profile) is a table of its own.

**Rows.** One per group (a method with several groups in one table, e.g. HeteroFL's fixed and
dynamic capacity, has a row per group, labelled by the method parameters that differ, as
``compare --variants`` labels them). Per row: its family, seeds, the headline global and local
accuracy (``headline``: mean of the last evaluated rounds, mean ± sample sd over seeds), the paired
difference against ``local`` of the same table (``paired.compare``: the same seeds and partitions;
its best group where it ran several, as ``compare --against`` takes it; Holm over the table's rows),
and the budget: training steps (``budget.steps_label``), bytes sent and training FLOPs per client
per round (``budget``), means over the seeds that recorded them, ``not recorded`` where none did.

**Which family wins.** Every sub-model row against every knowledge-exchange row (A - B, A the
sub-model one), paired by seed (the same seed and profile: the same clients and partitions), with
Holm's adjustment over all the pairs of one table and ``paired``'s verdicts (resolved: the 95%
interval excludes zero and the Holm-adjusted p is below 5%). No method of a family is picked before
testing (that would select on the outcome): every pair is tested. The reading counts the pairs each
family is ahead in (the sign of the mean paired difference) and how many are resolved.

**On both figures.** The pairs are tested twice, on the global test (the headline: each client's
model on the task's test set) and on each client's **local test** half (its final figure: mean of the
last evaluated rounds; ``LocalSide``), each with its own Holm family and its own reading line. A
sub-model method aggregates one global model, which a global test favours, while the
knowledge-exchange methods keep a model of each client's own, which its local test favours: the
family ahead on one figure need not be ahead on the other, and the view shows both rather than one.

Reads JSON only: no torch.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from hfl_bench.results.budget import (
    NOT_RECORDED,
    bytes_sent_per_client_round,
    human_flops,
    mean_bytes_sent,
    mean_steps,
    mean_training_flops,
    steps_label,
    steps_per_client_round,
    training_flops_per_client_round,
)
from hfl_bench.results.columns import human_bytes
from hfl_bench.results.figures import FINAL, final_figure
from hfl_bench.results.headline import group_basis, headline_stat, marked
from hfl_bench.results.loading import Loaded
from hfl_bench.results.paired import (
    ALPHA,
    MIN_RESOLVABLE,
    Comparison,
    Side,
    best_group,
    compare,
    holm_adjust,
    params_label,
)
from hfl_bench.results.ranking import protocol_label
from hfl_bench.results.setting import SettingGroup, Stat, canonical, submodels_setting

SUBMODEL, EXCHANGE, FLOOR = "sub-model", "knowledge exchange", "floor"
FLOOR_METHOD = "local"
PROFILE_PARAM = "profile"  # the sub-model methods' hyperparameter naming the capacity profile
LEFT_OUT_WHY = "neither a sub-model method's profile nor a config capacity_profile"
DEFINITIONS = {
    "profile": "the capacity profile: a sub-model record's method hyperparameter profile (--set profile=P), a "
               "knowledge-exchange record's config capacity_profile (--capacity-profile P on a levels pool); "
               "records with neither are left out",
    "family": "sub-model: method.submodels true (one global model, sub-models per client); knowledge exchange: "
              "every other method; local is the floor, in neither family",
    "global_acc": "headline global test accuracy (mean of the last 10 evaluated rounds), mean ± sample sd over seeds",
    "vs_local": "paired by seed against local of the same task, protocol and profile: mean difference (points) "
                "[two-sided 95% t-interval]; p: sign-flip test, Holm-adjusted over the table's rows",
    "pairs": "every sub-model row against every knowledge-exchange row (A - B, A the sub-model one), paired by "
             "seed (same seed and profile: the same clients and partitions); p Holm-adjusted over all pairs of "
             f"one table; resolved: the 95% interval excludes zero and the adjusted p is below {ALPHA:g}",
    "local_pairs": "the same pairs on each client's local test half: the final local accuracy (mean of the last "
                   "10 evaluated rounds), paired by seed, Holm over the pairs of one table on their own",
    "budget": "means over the seeds that recorded them: optimizer steps per client per round on private data "
              "((all T): with public or synthetic data; server S: the server's), bytes sent per client per round, "
              "training FLOPs per client per round; not recorded: no seed has it",
}


def record_profile(record: dict[str, Any]) -> Optional[str]:
    """The record's capacity profile (module doc), or None where it names none."""
    method = record.get("method") or {}
    if submodels_setting(record):
        profile = (method.get("hparams") or {}).get(PROFILE_PARAM)
        if profile is None:
            profile = (method.get("run_details") or {}).get("capacity_profile")
    else:
        profile = (record.get("config") or {}).get("capacity_profile")
    return profile if isinstance(profile, str) and profile else None


def family_of(g: SettingGroup) -> str:
    return FLOOR if g.method == FLOOR_METHOD else SUBMODEL if g.submodels else EXCHANGE


def shared_protocol(g: SettingGroup) -> tuple:
    """``SettingGroup.protocol`` without the section parts that tell the families apart (module doc)."""
    return (g.task, g.partition_scheme, canonical(g.partition_params), g.n_clients, g.clients_per_round, g.rounds,
            g.local_epochs, g.faults, g.modalities, g.data_fingerprint, g.num_classes, g.selection_rule, g.budget,
            g.optimizer)


# ----------------------------------------------------------------------------- budget


@dataclass
class Budget:
    """A group's budget: each figure's mean over the seeds that recorded it, and how many did."""

    steps: str  # the steps cell (``budget.steps_label``)
    steps_private: Optional[float]
    steps_seeds: int
    bytes_sent: Optional[float]
    bytes_seeds: int
    flops: Optional[float]
    flops_seeds: int
    seeds: int

    @classmethod
    def of(cls, g: SettingGroup) -> "Budget":
        records = [r.record for r in g.ok]
        steps = mean_steps(records, "private")
        return cls(NOT_RECORDED if steps is None else steps_label(records), steps,
                   sum(steps_per_client_round(r, "private") is not None for r in records),
                   mean_bytes_sent(records), sum(bytes_sent_per_client_round(r) is not None for r in records),
                   mean_training_flops(records),
                   sum(training_flops_per_client_round(r) is not None for r in records), len(records))

    def _partial(self, text: str, n: int) -> str:
        return text if n in (0, self.seeds) else f"{text} ({n}/{self.seeds} seeds)"

    def cells(self) -> dict[str, str]:
        return {STEPS: self._partial(self.steps, self.steps_seeds),
                BYTES: self._partial(NOT_RECORDED if self.bytes_sent is None else human_bytes(self.bytes_sent),
                                     self.bytes_seeds),
                FLOPS: self._partial(NOT_RECORDED if self.flops is None else human_flops(self.flops), self.flops_seeds)}

    def as_dict(self) -> dict[str, Any]:
        def figure(value: Optional[float], n: int) -> dict[str, Any]:
            return {"mean": value, "seeds": n, "state": NOT_RECORDED if value is None else None}
        return {"steps_per_client_round": {**figure(self.steps_private, self.steps_seeds),
                                           "label": self.steps},
                "bytes_sent_per_client_round": figure(self.bytes_sent, self.bytes_seeds),
                "train_flops_per_client_round": figure(self.flops, self.flops_seeds)}


# ----------------------------------------------------------------------------- tables


@dataclass
class Row:
    """One group of one table: its family, figures, difference against local and budget."""

    side: Side
    family: str
    vs_local: Optional[Comparison] = None

    @property
    def group(self) -> SettingGroup:
        return self.side.group

    @property
    def label(self) -> str:
        return self.side.label

    def as_dict(self) -> dict[str, Any]:
        g = self.group
        return {"method": g.method, "label": self.label, "family": self.family, "group_id": g.group_id,
                "pool": g.pool, "method_params": g.method_params, "seeds": g.seeds, "n_seeds": len(g.ok),
                "global_acc": headline_stat(g, "global_acc").as_dict(),
                "local_acc": headline_stat(g, "local_acc").as_dict(),
                "headline_statistic": group_basis(g),
                "vs_local": self.vs_local.as_dict() if self.vs_local is not None else None,
                "budget": Budget.of(g).as_dict()}


@dataclass
class FamilyTable:
    """One task, protocol and capacity profile: its rows, the pairs of the two families, the reading."""

    task: str
    protocol: str
    profile: str
    rows: list[Row]
    pairs: list[Comparison]
    notes: list[str] = field(default_factory=list)
    local_pairs: list[Comparison] = field(default_factory=list)  # the same pairs on the local test

    def family_rows(self, family: str) -> list[Row]:
        return [r for r in self.rows if r.family == family]

    @property
    def reading(self) -> str:
        return reading(self)

    @property
    def local_reading(self) -> str:
        return reading(self, local=True)

    def counts(self, local: bool = False) -> dict[str, int]:
        pairs = self.local_pairs if local else self.pairs
        with_mean = [c for c in pairs if c.mean is not None]
        return {"pairs": len(pairs), "sub_model_ahead": sum(c.mean > 0 for c in with_mean),
                "knowledge_exchange_ahead": sum(c.mean < 0 for c in with_mean),
                "equal": sum(c.mean == 0 for c in with_mean), "not_paired": len(pairs) - len(with_mean),
                "resolved": sum(c.resolved for c in pairs),
                "resolved_sub_model": sum(c.resolved and c.mean > 0 for c in with_mean),
                "resolved_knowledge_exchange": sum(c.resolved and c.mean < 0 for c in with_mean)}

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "protocol": self.protocol, "profile": self.profile,
                "methods": [r.as_dict() for r in self.rows], "pairs": [c.as_dict() for c in self.pairs],
                "counts": self.counts(), "reading": self.reading,
                "local_pairs": [c.as_dict() for c in self.local_pairs], "local_counts": self.counts(local=True),
                "local_reading": self.local_reading, "notes": self.notes}


@dataclass
class Families:
    tables: list[FamilyTable]
    left_out: int  # reproduced records with no capacity profile (not part of this view)

    def as_dict(self) -> dict[str, Any]:
        return {"definitions": DEFINITIONS, "tables": [t.as_dict() for t in self.tables],
                "left_out": {"records": self.left_out, "why": LEFT_OUT_WHY}}

    @property
    def left_out_line(self) -> str:
        if not self.left_out:
            return ""
        s = "" if self.left_out == 1 else "s"
        return f"{self.left_out} record{s} without a capacity profile left out ({LEFT_OUT_WHY}): not part of this view"


def reading(t: FamilyTable, local: bool = False) -> str:
    """The generated sentence of one table (module doc), on the global test or (``local``) on the local test."""
    where = f"{t.task}, profile {t.profile}, {'local' if local else 'global'} test"
    missing = [name for name, family in (("sub-model", SUBMODEL), ("knowledge-exchange", EXCHANGE))
               if not t.family_rows(family)]
    if missing:
        return f"{where}: no {' and no '.join(missing)} method ran here, so the families are not compared"
    c, pairs = t.counts(local), (t.local_pairs if local else t.pairs)
    n, sub, ke = c["pairs"], c["sub_model_ahead"], c["knowledge_exchange_ahead"]
    lead = ("the sub-model methods come out ahead" if sub > ke else
            "the knowledge-exchange methods come out ahead" if ke > sub else "neither family comes out ahead")
    tally = [f"sub-model ahead in {sub} of {n} pairs", f"knowledge exchange in {ke}"]
    tally += [f"equal in {c['equal']}"] if c["equal"] else []
    tally += [f"not paired in {c['not_paired']}"] if c["not_paired"] else []
    out = f"{where}: {lead} by the mean paired difference ({', '.join(tally)}); {c['resolved']} of {n} resolved"
    if c["resolved"]:
        out += (f" ({c['resolved_sub_model']} for sub-model, {c['resolved_knowledge_exchange']} for knowledge "
                "exchange)")
        if not (c["resolved_sub_model"] and c["resolved_knowledge_exchange"]):
            winner = "sub-model" if c["resolved_sub_model"] else "knowledge exchange"
            out += f", every resolved pair in favour of {winner}"
    else:
        verdicts = Counter(x.verdict for x in pairs)
        out += " (" + ", ".join(f"{v} pair{'s' if v > 1 else ''}: {k}" for k, v in sorted(verdicts.items())) + ")"
        if all(x.n < MIN_RESOLVABLE for x in pairs):
            out += f"; {MIN_RESOLVABLE} or more paired seeds are needed to resolve at {ALPHA:.0%}"
    return out


LOCAL_FIGURE = "final local"  # the name the local pairs' tables and json give their figure


class LocalSide(Side):
    """A side read at each seed's final local-test accuracy (``figures.final_figure``: the mean over
    the last evaluated rounds of every client's local test half)."""

    @classmethod
    def of(cls, side: Side) -> "LocalSide":
        return cls(side.group, side.endpoint, side.with_version, side.variant)

    def checked(self, figure: Optional[str], other_endpoint: Optional[str] = None) -> str:
        return LOCAL_FIGURE

    def seed_value(self, r: Loaded, figure: str) -> Optional[float]:
        return final_figure(r.record, "local_acc")


def _sides(groups: list[SettingGroup]) -> list[Side]:
    """A side per group, labelled by the parameters that tell a method's groups apart (not the profile,
    which every row of a table shares) and by the pool where its groups ran on several."""
    by_method: dict[str, list[SettingGroup]] = defaultdict(list)
    for g in groups:
        by_method[g.method].append(g)
    out = []
    for g in groups:
        mine = by_method[g.method]
        variant = ""
        if len(mine) > 1:
            params = {k: v for k, v in g.method_params.items() if k != PROFILE_PARAM}
            variant = params_label(params, {}) or "defaults"
            if len({x.pool for x in mine}) > 1:
                variant += f", pool={g.pool}"
        out.append(Side(g, None, len({x.method_version for x in mine}) > 1, variant))
    return out


def families(records: Iterable[Loaded], tasks: Iterable[str] = ()) -> Families:
    """Every (task, protocol, profile) table (``tasks``: only these)."""
    from hfl_bench.results.board import build_groups

    tasks = set(tasks)
    reproduced = [r for r in records if r.kind == "reproduced"]
    profiled = [r for r in reproduced if record_profile(r.record) is not None]
    keyed: dict[tuple, list[SettingGroup]] = defaultdict(list)
    for g in build_groups(profiled):
        if not g.ok or (tasks and g.task not in tasks):
            continue
        keyed[(shared_protocol(g), record_profile(g.ok[0].record))].append(g)
    labels: dict[tuple, str] = {}
    by_label: dict[tuple, set] = defaultdict(set)
    for (protocol, _), members in keyed.items():
        by_label[(members[0].task, protocol_label(members[0]))].add(protocol)
    for (protocol, _), members in keyed.items():
        g = members[0]
        label = protocol_label(g)
        labels[protocol] = f"{label} {g.data_label}" if len(by_label[(g.task, label)]) > 1 else label
    tables = []
    for (protocol, profile), members in keyed.items():
        members.sort(key=lambda g: (-(headline_stat(g).mean or 0.0), g.method, g.group_id))
        rows = [Row(s, family_of(s.group)) for s in _sides(members)]
        notes = []
        floor = best_group([r.group for r in rows], FLOOR_METHOD)
        if floor is not None:
            floor_side = next(r.side for r in rows if r.group is floor)
            if sum(r.group.method == FLOOR_METHOD for r in rows) > 1:
                notes.append(f"{FLOOR_METHOD} ran several groups here: the rows are compared with the one with the "
                             "highest mean")
            for r in rows:
                if r.group is not floor:
                    r.vs_local = compare(r.side, floor_side)
            holm_adjust(r.vs_local for r in rows if r.vs_local is not None)
        else:
            notes.append(f"no {FLOOR_METHOD} ran here: no difference against the floor")
        both = [(a.side, b.side) for a in rows if a.family == SUBMODEL for b in rows if b.family == EXCHANGE]
        pairs = [compare(a, b) for a, b in both]
        local_pairs = [compare(LocalSide.of(a), LocalSide.of(b)) for a, b in both]
        holm_adjust(pairs)
        holm_adjust(local_pairs)  # a Holm family of its own: another figure
        tables.append(FamilyTable(members[0].task, labels[protocol], profile, rows, pairs, notes, local_pairs))
    tables.sort(key=lambda t: (t.task, t.protocol, t.profile))
    return Families(tables, len(reproduced) - len(profiled))


# ----------------------------------------------------------------------------- rows for the views


STEPS, BYTES, FLOPS = "steps / client / round", "bytes / client / round", "train FLOPs / client / round"
COLUMNS = ("method", "family", "seeds", "global acc", "local acc", "vs local [95% CI]", "p Holm", "verdict",
           STEPS, BYTES, FLOPS)
PAIR_COLUMNS = ("sub-model", "knowledge exchange", "n", "A - B [95% CI]", "p sign-flip", "p Holm", "verdict", "notes")


def _pm(st: Stat, basis: Optional[str]) -> str:
    if st.mean is None:
        return NOT_RECORDED
    return marked(f"{st.mean:.2f} ± {'-' if st.sd is None else f'{st.sd:.2f}'}", basis)


def _p(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.3f}"


def rows(t: FamilyTable) -> list[dict[str, str]]:
    out = []
    for r in t.rows:
        g, c = r.group, r.vs_local
        out.append({"method": r.label, "family": r.family, "seeds": str(len(g.ok)),
                    "global acc": _pm(headline_stat(g, "global_acc"), group_basis(g, "global_acc")),
                    "local acc": _pm(headline_stat(g, "local_acc"), group_basis(g, "local_acc")),
                    "vs local [95% CI]": "-" if c is None else c.interval_label(),
                    "p Holm": "-" if c is None else _p(c.p_holm),
                    "verdict": "-" if c is None else c.verdict, **Budget.of(g).cells()})
    return out


def pair_rows(t: FamilyTable, local: bool = False) -> list[dict[str, str]]:
    from hfl_bench.results.paired_view import comparison_row

    out = []
    for c in t.local_pairs if local else t.pairs:
        row = comparison_row(c)
        out.append({"sub-model": row["A"], "knowledge exchange": row["B"],
                    **{k: row[k] for k in PAIR_COLUMNS[2:]}})
    return out


def title(t: FamilyTable) -> str:
    return f"capacity profile {t.profile}; {t.protocol}"


def any_fallback(t: FamilyTable) -> bool:
    """Whether a row's headline is not (only) the final figure (``headline.FALLBACK_NOTE`` applies)."""
    return any(group_basis(r.group, m) not in (None, FINAL) for r in t.rows for m in ("global_acc", "local_acc"))
