"""A leaderboard group: one setting (what was run, read from its records) and its figures over
seeds: mean and sample standard deviation (ddof = 1; None, shown as '-', for a single seed) of
global and local accuracy and of every extra endpoint, over the group's ok seeds. Which records
form a group is ``grouping``'s rule.

The fault setting (``config.faults``, README Faults) is part of the setting and of the protocol
the rank compares within. The **headline** of a record run with faults (one with a ``faults``
section, schema 1.3) is its honest clients' figure (``metrics.honest``); of any other record, the
all-client figure. The all-client figures stay available (``SettingGroup.stat(..., clients="all")``).
The final figures (mean over the last evaluated rounds) beside a headline are the same clients'
(``SettingGroup.final_stat``; a client group's final figures exist from schema 1.5 on).

The modality setting of a multimodal run (the missing modality and the fraction of clients that
miss it, from the record's ``modalities`` section, schema 1.4) is part of the setting and of the
protocol too. The headline of such a record is its **recipients'** figure (``metrics.recipients``:
the clients that miss a modality, whom the methods' claims are about), for the model and for each
extra endpoint (``metrics.recipients.endpoints``); the donors' and all clients' figures stay
available (``clients="donors"`` / ``"all"``). A run with no recipients (recipient fraction 0:
every client observes every modality) has no recipients' figure, so its headline is all
clients'. A record with both sections (refused by the engine) keeps the honest clients' headline.

The **setting section** a group belongs to (``SettingGroup.section``) is part of the protocol
too: the transfer data its method reads (``transfer_setting``), whether its pool is a single
architecture (``single_architecture``) or sub-models of one global model (``submodels_setting``:
HeteroFL, FedRolex, DepthFL, "one global model, sub-models per client"), its budget class
(``budget_class``), the clients'
optimizer (``optimizer_setting``: a comparison run under ``--optimizer adam`` is its own section), the
fault and modality settings, and whether its client models are trained on other clients' data
(``peer_data_setting``: models that travel to peers and train on their shards, DFML; such a
section's label ends in ``PEER_DATA_LABEL`` and every view that shows it gives ``PEER_DATA_REASON``,
``section_reasons``). Groups of two sections are never ranked together, and every view shows one
section at a time (docs/guide/leaderboards.md lists the labels). Every one is read from the record:
a record written before it said (schema < 1.6; < 1.7 for the peer data) had it filled when it was
read (``hfl_bench.record.upgrade``, from the frozen table of built-in cards), never from the
registry, so what is installed changes no view.

The **evaluated predictor** (``predictor_setting``: the client's live model, a stored snapshot, a
prototype classifier ..., ``method_card.PREDICTORS``) is shown beside each group, not part of the
section: a method's own hyperparameter may change it (DFML ``eval=current``). A record older than
schema 1.7 has it filled by the upgrade (the frozen table's rule at the record's hyperparameters).

A published figure (``Published``) and its place beside a group (``Match``) are types of this
module too; ``published`` decides which figure goes where.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from hfl_bench.config import SELECTION_RULE
from hfl_bench.record.upgrade import pool_homogeneous
from hfl_bench.results.figures import (
    endpoint_figure,
    figure,
    final_figure,
    headline_of,
)
from hfl_bench.results.grouping import SeedGroup, copies_note
from hfl_bench.results.loading import Loaded

METRICS = ("global_acc", "local_acc")
NO_FAULTS = "none"  # the fault setting of a run without faults
NO_MODALITIES = "none"  # the modality setting of a single-modality run
UNKNOWN = "unknown"  # a transfer no record or registered card states
PROTOCOL_BUDGET = "protocol"  # the budget class of a run under the protocol's budget (no preset)
PROTOCOL_OPTIMIZER = "sgd"  # the optimizer setting of a run under the protocol's optimizer (``config.optimizer``)
# What a section label says of the transfer data (method_card.TRANSFERS), in the sections' order.
TRANSFER_LABELS = {"none": "data-free", "public-unlabelled": "unlabelled public set",
                   "public-labelled": "labelled public set", "synthetic": "synthetic data",
                   UNKNOWN: "unknown transfer"}
# The part of a section's label that says its client models are trained on other clients' data,
# and the one line every view that shows such a section gives as the reason it stands apart.
PEER_DATA_LABEL = "models trained on peers' data"
# The pool part of the label of a section whose clients train sub-models of one global model
# (``submodels_setting``: HeteroFL, FedRolex, DepthFL), and the line every view that shows it gives.
SUBMODELS_LABEL = "one global model, sub-models per client"
SUBMODELS_REASON = ("each client trains a slice of one global model (of its width: HeteroFL, FedRolex; of its depth: "
                    "DepthFL) and the server averages the slices: neither one architecture per client nor a pool "
                    "of different ones")
PEER_DATA_REASON = ("each client's model travels to other clients and is trained there with their labels (DFML), "
                    "which the knowledge-only methods never do")


def fault_setting(record: dict[str, Any]) -> str:
    """A record's fault setting: the canonical spec (``faults.spec``, else ``config.faults``), or
    ``none`` for a run without faults."""
    spec = (record.get("faults") or {}).get("spec")
    if spec in (None, ""):
        spec = (record.get("config") or {}).get("faults")
    if spec in (None, "", {}, []):
        return NO_FAULTS
    return spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True, default=str)


def modalities_section(record: dict[str, Any]) -> dict[str, Any]:
    """A multimodal record's ``modalities`` section; {} for any other record."""
    return record.get("modalities") or {}


def modality_setting(record: dict[str, Any]) -> str:
    """A record's modality setting, ``missing=<modality> recipients=<fraction>``, or ``none`` for
    a single-modality run (no ``modalities`` section)."""
    section = modalities_section(record)
    if not section:
        return NO_MODALITIES
    return f"missing={section['missing']} recipients={section['recipient_fraction']:g}"


def transfer_setting(record: dict[str, Any]) -> str:
    """The transfer data a record's method reads (``method_card.TRANSFERS``): its ``method.transfer``
    (filled for a record older than 1.6 by the upgrade, from the frozen table of built-in cards),
    else ``unknown``."""
    return record["method"].get("transfer") or UNKNOWN


def peer_data_setting(record: dict[str, Any]) -> bool:
    """Whether a record's client models were trained on other clients' data: its ``method.peer_data``
    (filled by the upgrade before 1.7), else False (nothing says its models travel)."""
    return record["method"].get("peer_data") is True


def submodels_setting(record: dict[str, Any]) -> bool:
    """Whether a record's clients trained sub-models of one global model: its ``method.submodels``
    (written only where true), else False."""
    return record["method"].get("submodels") is True


def predictor_setting(record: dict[str, Any]) -> str:
    """Which predictor a record's headline evaluated: its ``method.predictor`` (filled by the upgrade
    before 1.7; one of ``method_card.PREDICTORS``, shown as is), else ``unknown``."""
    return record["method"].get("predictor") or UNKNOWN


def single_architecture(record: dict[str, Any]) -> Optional[bool]:
    """Whether every client of the run had one architecture: from the record's pool assignment
    (``arch_pool.assignment``, one name per client); else a method that states that it needs one;
    else the frozen table of built-in pools (``upgrade.pool_homogeneous``: a failed run has no
    assignment); None when nothing says."""
    pool = record.get("arch_pool") or {}
    if pool.get("assignment"):
        return len(set(pool["assignment"])) == 1
    if record["method"].get("single_architecture") is True:
        return True
    return pool_homogeneous(pool.get("name") or (record.get("config") or {}).get("pool"))


def budget_class(record: dict[str, Any]) -> str:
    """A record's budget class: the name of the method preset it ran (``method.preset``), or
    ``protocol`` (the protocol's budget) when it ran none or the record predates presets."""
    return record["method"].get("preset") or PROTOCOL_BUDGET


def pool_label(single: Optional[bool], submodels: bool = False) -> str:
    if submodels:
        return SUBMODELS_LABEL
    return {True: "single architecture", False: "heterogeneous pool"}.get(single, "unknown pool")


def budget_label(budget: str) -> str:
    return "protocol budget" if budget == PROTOCOL_BUDGET else f"preset {budget}"


def optimizer_setting(record: dict[str, Any]) -> str:
    """The clients' optimizer a record ran (``config.optimizer``): ``sgd`` (the protocol's, also for
    a record that predates the setting), or the name with its learning rate, ``adam lr=0.001``:
    a comparison under one optimizer is one section, apart from the protocol's."""
    cfg = record.get("config") if isinstance(record.get("config"), dict) else {}
    name = cfg.get("optimizer")
    if name in (None, PROTOCOL_OPTIMIZER):
        return PROTOCOL_OPTIMIZER
    lr = cfg.get("lr")
    number = isinstance(lr, (int, float)) and not isinstance(lr, bool)
    return f"{name if isinstance(name, str) else canonical(name)} lr={f'{lr:g}' if number else canonical(lr)}"


def section_order(transfer: str, single: Optional[bool], budget: str, faults: str = NO_FAULTS,
                  modalities: str = NO_MODALITIES, peer_data: bool = False,
                  optimizer: str = PROTOCOL_OPTIMIZER, submodels: bool = False) -> tuple:
    """Where a setting section goes among the others: the data-free, heterogeneous, protocol-budget,
    protocol-optimizer, fault-free, single-modality one first; then by transfer data, pool (a
    heterogeneous pool, a single architecture, unknown, sub-models of one global model), budget,
    optimizer, faults, modalities; a section of models trained on peers' data right after the same
    section without."""
    order = list(TRANSFER_LABELS)
    pool = 3 if submodels else {False: 0, True: 1}.get(single, 2)
    return (order.index(transfer) if transfer in order else len(order), pool,
            budget != PROTOCOL_BUDGET, budget, optimizer != PROTOCOL_OPTIMIZER, optimizer, faults != NO_FAULTS,
            faults, modalities != NO_MODALITIES, modalities, peer_data)


def section_label(transfer: str, single: Optional[bool], budget: str, faults: str = NO_FAULTS,
                  modalities: str = NO_MODALITIES, peer_data: bool = False,
                  optimizer: str = PROTOCOL_OPTIMIZER, submodels: bool = False) -> str:
    """A setting section's label: ``data-free, heterogeneous pool, protocol budget`` (the pool part
    ``SUBMODELS_LABEL`` for sub-models of one global model), with
    ``optimizer <name> lr=<lr>`` (a run under ``--optimizer``), ``faults=<spec>``, the modality
    setting and ``PEER_DATA_LABEL`` appended where they apply (docs/guide/leaderboards.md)."""
    parts = [TRANSFER_LABELS.get(transfer, TRANSFER_LABELS[UNKNOWN]), pool_label(single, submodels),
             budget_label(budget)]
    parts += [f"optimizer {optimizer}"] if optimizer != PROTOCOL_OPTIMIZER else []
    parts += [f"faults={faults}"] if faults != NO_FAULTS else []
    parts += [modalities] if modalities != NO_MODALITIES else []
    parts += [PEER_DATA_LABEL] if peer_data else []
    return ", ".join(parts)


def section_reasons(label: str) -> list[str]:
    """Why a setting section stands apart, for the views to print under its label: the sub-model
    reason (``SUBMODELS_REASON``) for a label with ``SUBMODELS_LABEL``, the peer-data reason
    (``PEER_DATA_REASON``) for one that ends in ``PEER_DATA_LABEL``; none otherwise."""
    return ([SUBMODELS_REASON] if SUBMODELS_LABEL in label else []) + \
        ([PEER_DATA_REASON] if label.endswith(PEER_DATA_LABEL) else [])


def processor(record: dict[str, Any]) -> Optional[str]:
    """What a run's arithmetic ran on, as far as its record says: the GPU's name for a CUDA run,
    else the CPU's model, vector-instruction flags and torch kernel set (None when it names none)."""
    env = record.get("environment") or {}
    if str(env.get("device", "")).startswith("cuda") and env.get("gpu_name"):
        return f"gpu {env['gpu_name']}"
    cpu = [env.get(k) for k in ("cpu", "cpu_isa", "torch_cpu_capability")]
    return "cpu " + " | ".join(str(x) for x in cpu) if any(cpu) else None


@dataclass
class Stat:
    """Mean and sample standard deviation (ddof = 1) of one figure over seeds; sd None for n < 2."""

    mean: Optional[float]
    sd: Optional[float]
    n: int

    @classmethod
    def of(cls, values: Iterable[Optional[float]]) -> "Stat":
        xs = [float(v) for v in values if v is not None]
        if not xs:
            return cls(None, None, 0)
        return cls(round(statistics.fmean(xs), 4), round(statistics.stdev(xs), 4) if len(xs) > 1 else None, len(xs))

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "sd": self.sd, "n": self.n}


@dataclass
class Published:
    """One published figure (one record of source.kind = published)."""

    record: dict[str, Any]

    @property
    def method(self) -> str:
        return self.record["method"]["name"]

    @property
    def task(self) -> str:
        return self.record["task"]["name"]

    @property
    def metric(self) -> str:
        return next((m for m in METRICS if (self.record.get("metrics") or {}).get(m) is not None), "global_acc")

    @property
    def value(self) -> Optional[float]:
        return (self.record.get("metrics") or {}).get(self.metric)

    @property
    def sd(self) -> Optional[float]:
        return (self.record.get("metrics") or {}).get("sd")

    @property
    def n_seeds(self) -> Optional[int]:
        return (self.record.get("metrics") or {}).get("n_seeds")

    @property
    def endpoint(self) -> Optional[str]:
        return (self.record.get("metrics") or {}).get("endpoint")

    @property
    def citation(self) -> dict[str, Any]:
        return self.record["source"].get("citation") or {}

    @property
    def setting(self) -> dict[str, Any]:
        return self.record.get("setting") or {}

    @property
    def pool(self) -> Optional[str]:
        return (self.setting.get("pool") or {}).get("suite_name")

    def as_dict(self) -> dict[str, Any]:
        c = self.citation
        return {
            "record_id": self.record.get("record_id"), "method": self.method, "task": self.task,
            "published_method": self.record["method"].get("published_name"), "metric": self.metric,
            "endpoint": self.endpoint, "value": self.value, "sd": self.sd, "n_seeds": self.n_seeds,
            "citation_key": c.get("key"), "arxiv_or_doi": c.get("arxiv_or_doi"), "locator": c.get("locator"),
            "setting_match": c.get("setting_match"), "deviations": c.get("deviations", []), "setting": self.setting,
        }


@dataclass
class Match:
    """A published figure beside a group: the reproduced figure it compares to and the delta."""

    published: Published
    setting_match: str  # the record's own, downgraded to approximate where the group differs
    differences: list[str]
    reproduced: Stat

    @property
    def delta(self) -> Optional[float]:
        if self.reproduced.mean is None or self.published.value is None:
            return None
        return round(self.reproduced.mean - self.published.value, 4)

    def as_dict(self) -> dict[str, Any]:
        return self.published.as_dict() | {
            "setting_match": self.setting_match, "differences": self.differences,
            "reproduced": self.reproduced.as_dict(), "delta": self.delta,
        }


@dataclass
class SettingGroup:
    """The reproduced records of one setting, described for the leaderboard."""

    group_id: str
    method: str
    method_version: Optional[str]  # None: records written before methods had versions
    task: str
    pool: str
    partition_scheme: str
    partition_params: dict[str, Any]
    n_clients: Optional[int]
    clients_per_round: Optional[int]
    rounds: Optional[int]
    local_epochs: Optional[int]
    method_params: dict[str, Any]
    hparams: dict[str, Any]
    config_hash: str
    ok: list[Loaded] = field(default_factory=list)
    n_failed: int = 0
    n_diverged: int = 0
    n_duplicates: int = 0
    copies_note: str = ""  # which copy of a seed recorded twice counted, and where the others are (grouping)
    split_by_partition: bool = False
    published: list[Match] = field(default_factory=list)
    faults: str = NO_FAULTS  # the fault setting (canonical spec), part of the setting and protocol
    drop: Optional[Any] = None  # robustness.Drop: against the same seeds without faults (faulty groups)
    fairness: Optional[Any] = None  # fairness.Fairness: its figures per seed, against local's (``attach_fairness``)
    timing: Optional[Any] = None  # timing.Timing: its simulated time per seed (``attach_timing``; --devices)
    modalities: str = NO_MODALITIES  # the modality setting (``modality_setting``), part of setting and protocol
    # what selected the reported round (``Loaded.selection_rule``): part of the protocol
    selection_rule: str = SELECTION_RULE
    data_fingerprint: Optional[str] = None  # the data the seeds ran on (None: a record that cannot say)
    num_classes: Optional[int] = None  # the task's class count in the records: part of the data identity
    transfer: str = UNKNOWN  # the transfer data the method reads (``transfer_setting``): part of the section
    single_architecture: Optional[bool] = None  # one architecture for every client (None: nothing says)
    budget: str = PROTOCOL_BUDGET  # the budget class (``budget_class``): part of the section
    peer_data: bool = False  # client models trained on peers' data (``peer_data_setting``): part of the section
    optimizer: str = PROTOCOL_OPTIMIZER  # the clients' optimizer (``optimizer_setting``): part of the section
    submodels: bool = False  # sub-models of one global model (``submodels_setting``): part of the section
    predictor: str = UNKNOWN  # what the headline evaluated (``predictor_setting``): shown, not part of the section
    # test rounds outside the final window tested a seeded draw of this many clients (--eval-clients):
    # shown in the setting; not part of the protocol (the final window, which the headline reads, tests all)
    eval_clients: Optional[int] = None
    # each client's member of a levels pool picked by this capacity profile (--capacity-profile): shown in the
    # setting, as the pool is; not part of the protocol (nor is the pool)
    capacity_profile: Optional[str] = None

    @property
    def seeds(self) -> list[Any]:
        return [r.seed for r in self.ok]

    @property
    def has_faults(self) -> bool:
        return self.faults != NO_FAULTS

    @property
    def is_multimodal(self) -> bool:
        return self.modalities != NO_MODALITIES

    @property
    def headline_clients(self) -> str:
        """Whose figure the headline is: ``honest`` when the group's records ran with faults,
        ``recipients`` when they have a ``modalities`` section with recipients, else ``all``."""
        kinds = {headline_of(r.record) for r in self.ok}
        return next((kind for kind in ("honest", "recipients") if kind in kinds), "all")

    def stat(self, metric: str = "global_acc", endpoint: Optional[str] = None, clients: str = "headline") -> Stat:
        """One figure over the group's ok seeds, of the model or of a named extra endpoint: the
        headline (module doc), or over all clients, the honest or faulty ones (the model only) or
        the recipients or donors of a multimodal run."""
        def value(r: Loaded):
            if endpoint:
                return endpoint_figure(r.record, endpoint, metric, clients)
            return figure(r.record, metric, clients)
        return Stat.of(value(r) for r in self.ok)

    def final_stat(self, metric: str = "global_acc", clients: str = "headline") -> Stat:
        """The mean over the last evaluated rounds over the ok seeds: all clients' (``metrics.final``,
        schema 1.2) or a client group's (``metrics.<group>.final``, schema 1.5), the headline's by
        default; n counts the seeds whose records have it (a 1.3 / 1.4 record has no group's)."""
        return Stat.of(final_figure(r.record, metric, clients) for r in self.ok)

    @property
    def commits(self) -> list[str]:
        """The distinct code commits of the ok seeds ("unknown" for a run outside a checkout)."""
        return sorted({r.commit or "unknown" for r in self.ok})

    @property
    def processors(self) -> list[str]:
        """The distinct processors of the ok seeds that name theirs (two kinds can round
        differently, README: Reproducibility across hosts)."""
        return sorted({p for p in (processor(r.record) for r in self.ok) if p})

    @property
    def provenance_note(self) -> str:
        """Empty when every seed ran the same commit with a clean tree on one kind of processor;
        else what differs."""
        notes = []
        commits, processors = len(self.commits), len(self.processors)  # each a pass over the seeds
        if commits > 1:
            notes.append(f"{commits} commits")
        if processors > 1:
            notes.append(f"{processors} processors")
        if any((r.record.get("code") or {}).get("git_dirty") for r in self.ok):
            notes.append("uncommitted changes")
        return ", ".join(notes)

    def endpoints(self) -> list[str]:
        """The extra endpoints any seed reports, over all clients or (multimodal) over a client group."""
        names = set()
        for r in self.ok:
            m = r.record.get("metrics") or {}
            names |= set(m.get("extra_endpoints") or {})
            for who in ("recipients", "donors"):
                names |= set((m.get(who) or {}).get("endpoints") or {})
        return sorted(names)

    def section_key(self) -> tuple:
        """The setting section's place among the sections (``section_order``)."""
        return section_order(self.transfer, self.single_architecture, self.budget, self.faults, self.modalities,
                             self.peer_data, self.optimizer, self.submodels)

    @property
    def section(self) -> str:
        """The setting section's label (``section_label``)."""
        return section_label(self.transfer, self.single_architecture, self.budget, self.faults, self.modalities,
                             self.peer_data, self.optimizer, self.submodels)

    def protocol(self) -> tuple:
        """What the rank compares methods within: task, partition, clients, rounds, epochs, the
        fault setting (a group with faults is never ranked against fault-free ones), the selection
        rule (records selected on the honest clients' validation, before issue 30, never ranked
        against records selected on every client's), the setting section (``section_key``: transfer
        data, single architecture, budget class, optimizer, fault setting, modality setting, peer data: groups of two
        sections are never ranked together) and the data (the data fingerprint and class count: one
        task name on two image folders is two protocols; a record without a fingerprint is "unknown
        data", its own)."""
        return (self.task, self.partition_scheme, canonical(self.partition_params), self.n_clients,
                self.clients_per_round, self.rounds, self.local_epochs, self.faults, self.modalities,
                self.data_fingerprint, self.num_classes, self.selection_rule, self.transfer,
                self.single_architecture, self.budget, self.peer_data, self.optimizer, self.submodels)

    @property
    def data_label(self) -> str:
        """The data, short: ``data=0f92890c`` (the fingerprint's first 8 characters), or
        ``data=unknown``, and the class count: what tells two protocols of one task apart."""
        fingerprint = self.data_fingerprint[:8] if self.data_fingerprint else "unknown"
        classes = f" classes={self.num_classes}" if self.num_classes is not None else ""
        return f"data={fingerprint}{classes}"


def describe(seeds: SeedGroup) -> SettingGroup:
    """The leaderboard's view of one seed group: its setting, read from a record that ran."""
    first = seeds.describing().record
    part, fed, cfg = first.get("partition") or {}, first.get("federation") or {}, first.get("config") or {}
    n_clients = fed.get("n_clients", cfg.get("clients"))
    return SettingGroup(
        group_id=seeds.group_id, method=first["method"]["name"], method_version=seeds.method_version,
        task=first["task"]["name"],
        pool=(first.get("arch_pool") or {}).get("name") or cfg.get("pool") or "?",
        partition_scheme=part.get("scheme", cfg.get("partition") or "?"),
        partition_params=_with_pretrain(_with_public(dict(part.get("params") or _config_partition_params(cfg)),
                                                     part.get("public_size", cfg.get("public_size"))),
                                        part.get("pretrain_size", cfg.get("pretrain_size"))),
        n_clients=n_clients, clients_per_round=fed.get("clients_per_round", cfg.get("clients_per_round") or n_clients),
        rounds=fed.get("rounds", cfg.get("rounds")), local_epochs=fed.get("local_epochs", cfg.get("local_epochs")),
        method_params=dict(cfg.get("method_params") or {}), hparams=dict(first["method"].get("hparams") or {}),
        config_hash=first.get("config_hash") or "?", ok=list(seeds.ok), n_failed=seeds.n_failed,
        n_diverged=seeds.n_diverged, n_duplicates=len(seeds.duplicates), split_by_partition=seeds.split_by_partition,
        copies_note=copies_note(first["method"]["name"], seeds.ok, seeds.duplicates),
        faults=fault_setting(first), modalities=modality_setting(first), selection_rule=seeds.selection_rule,
        **_data_of(first), transfer=transfer_setting(first), single_architecture=single_architecture(first),
        budget=budget_class(first), peer_data=peer_data_setting(first), predictor=predictor_setting(first),
        optimizer=optimizer_setting(first), eval_clients=fed.get("eval_clients"),
        submodels=submodels_setting(first), capacity_profile=cfg.get("capacity_profile"),
    )


def _data_of(record: dict[str, Any]) -> dict[str, Any]:
    """The data identity fields of ``SettingGroup`` from a record's ``task`` block (a class count written as
    a float, 10.0, which the record check takes for an integer, reads as none)."""
    classes = record["task"].get("num_classes")
    return {"data_fingerprint": record["task"].get("data_fingerprint"),
            "num_classes": classes if isinstance(classes, int) else None}


def _with_public(params: dict[str, Any], public_size: Optional[int]) -> dict[str, Any]:
    """A public hold-out changes every client's shard, so it is part of the setting (shown and
    ranked on); published settings never name it, so it does not block a match."""
    return {**params, "public": public_size} if public_size else params


def _with_pretrain(params: dict[str, Any], pretrain_size: Optional[int]) -> dict[str, Any]:
    """A pretraining split is held out of the clients' data as the public set is: part of the
    setting likewise (``_with_public``)."""
    return {**params, "pretrain": pretrain_size} if pretrain_size else params


def _config_partition_params(cfg: dict[str, Any]) -> dict[str, Any]:
    scheme = cfg.get("partition")
    if scheme == "dirichlet" and cfg.get("alpha") is not None:
        return {"alpha": cfg["alpha"]}
    if scheme == "classes" and cfg.get("classes_per_client") is not None:
        return {"k": cfg["classes_per_client"]}
    return {}


def canonical(obj: Any) -> str:
    """One text per value (sorted keys): for comparing and for the csv cells."""
    return json.dumps(obj, sort_keys=True, default=str)


def partition_label(scheme: str, params: dict[str, Any]) -> str:
    # min_size is a repair detail of the Dirichlet draw, not the setting people compare on.
    shown = [f"{k}={v}" for k, v in params.items() if k != "min_size"]
    return " ".join([scheme or "?", *shown])
