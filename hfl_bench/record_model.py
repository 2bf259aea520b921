"""The run record as typed models (pydantic v2): schema 1.8, the shape of schema 1.7 written from this model.

One ``Record`` holds a reproduced run (ok, diverged or failed) or a published figure
(``source.kind``): the sections a published record lacks are optional, as in the 1.7 schema, and a
record-level validator applies the schema's if / then / else (a published record's citation,
setting and single figure; a reproduced record's headline figure and client groups). Every model
refuses fields it does not name; the open mappings (``config``, ``method.hparams``,
``method.run_details``, ``partition.params``) stay open, and a history row takes a method's own
per-round numbers beside its named fields. Beyond the schema the validators check what
``hfl_bench.results.validation.record_problems`` checks: every number finite, every accuracy null
or within [0, 100], an ok reproduced record's selected round and headline figures, the config's
seed and method_params, and a consistent ``modalities`` section.

``record_problems`` lists every problem as ``<json/path>: <message>``, ``parse`` returns the model
(``RecordInvalid`` otherwise), ``dump`` gives back exactly the dict parsed (the same keys in the
same order), and ``json_schema`` is the JSON Schema the schema file of version 1.8 is generated from.
Shared types: imports only pydantic and the standard library (reading records needs no torch).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema

CURRENT_VERSION = "1.8"
SEED_LIMIT = 2**63
GROUPS = ("honest", "faulty", "recipients", "donors")  # the client groups of metrics (and history rows)
ACCURACY_LISTS = ("per_class_global_acc", "per_arch_global_acc")


class RecordInvalid(ValueError):
    """A record that does not validate; ``problems``: each as ``<json/path>: <message>``."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"invalid record: {problems[0] if problems else '?'}{more}")


class _Found(ValueError):
    """Problems a validator found, each at a path below the value it checked (pydantic's error
    location gives the rest): ``record_problems`` reports each at its full path."""

    def __init__(self, problems: list[tuple[tuple, str]]):
        self.problems = problems
        super().__init__("; ".join(msg for _, msg in problems))


def _fail(message: str):
    raise _Found([((), message)])


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ----------------------------------------------------------------------------- value types
# JSON Schema's number and integer, kept as given (an int stays an int, so a record dumps back byte
# for byte); 2.0 is an integer, as in JSON Schema; NaN and infinity are refused.


def _number_check(ge: float | None = None, le: float | None = None, integer: bool = False, pct: bool = False):
    """The check of a number (an integer, an accuracy), returning the value as given, and its JSON Schema."""
    what = "an integer" if integer else "a number"

    def check(v: Any) -> Any:
        if not _is_number(v):
            _fail(f"accuracy {_short(v)} is not a number" if pct else f"must be {what}, got {_short(v)}")
        if not math.isfinite(v):
            _fail("not a finite number")
        if integer and not float(v).is_integer():
            _fail(f"must be an integer, got {_short(v)}")
        if pct and not 0 <= v <= 100:
            _fail(f"accuracy {v!r} is not within [0, 100]")
        if ge is not None and v < ge:
            _fail(f"{v!r} is less than the minimum of {ge!r}")
        if le is not None and v > le:
            _fail(f"{v!r} is greater than the maximum of {le!r}")
        return v

    schema: dict[str, Any] = {"type": "integer" if integer else "number"}
    if pct:
        schema.update(minimum=0, maximum=100)
    if ge is not None:
        schema["minimum"] = ge
    if le is not None:
        schema["maximum"] = le
    return check, schema


def _number(ge: float | None = None, le: float | None = None, integer: bool = False):
    check, schema = _number_check(ge, le, integer)
    return Annotated[Any, PlainValidator(check), WithJsonSchema(schema)]


def _nullable(check, schema: dict[str, Any]):
    """``check``'s type, or null (one JSON Schema type list, as the 1.7 schema writes it)."""
    return Annotated[Any, PlainValidator(lambda v: v if v is None else check(v)),
                     WithJsonSchema({**schema, "type": [schema["type"], "null"]})]


Number = _number()
NonNegative = _number(ge=0)
Int = _number(integer=True)
Count = _number(ge=0, integer=True)  # an integer >= 0
Positive = _number(ge=1, integer=True)  # an integer >= 1
Pct = _nullable(*_number_check(pct=True))  # an accuracy in percent: null (no figure) or a number in [0, 100]
Scalar = _nullable(*_number_check())  # a method's own per-round number (``Method.run_round``'s scalars)


def _non_finite(node: Any, where: tuple = ()) -> list[tuple[tuple, str]]:
    if isinstance(node, float):
        return [] if math.isfinite(node) else [(where, "not a finite number")]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _non_finite(v, (*where, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _non_finite(v, (*where, i))]
    return []


def _open_object(v: Any) -> Any:
    if not isinstance(v, dict):
        _fail(f"must be an object, got {_short(v)}")
    if bad := _non_finite(v):
        raise _Found(bad)
    return v


# A mapping the record leaves open (a run's config, a method's hyperparameters): any JSON, finite numbers.
OpenObject = Annotated[Any, PlainValidator(_open_object), WithJsonSchema({"type": "object"})]
Hash16 = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{16}$")]


# ----------------------------------------------------------------------------- the base model


class _Model(BaseModel):
    """Refuses unknown fields; dumps its fields in the order they were given (``exclude_unset``
    then gives back exactly what was parsed)."""

    model_config = ConfigDict(extra="forbid")
    _keys: tuple = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler):
        model = handler(data)
        if isinstance(data, dict):
            model._keys = tuple(data)
        return model

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler):
        out = handler(self)
        if not self._keys or not isinstance(out, dict):
            return out
        ordered = {k: out[k] for k in self._keys if k in out}
        ordered.update((k, v) for k, v in out.items() if k not in ordered)
        return ordered


# ----------------------------------------------------------------------------- sections


class Citation(_Model):
    """Where a published figure comes from (required in full for a published record)."""

    key: StrictStr = None
    arxiv_or_doi: StrictStr = None
    locator: StrictStr = None
    setting_match: Literal["exact", "approximate"] = None
    deviations: list[StrictStr] = None
    title: StrictStr = None  # the paper's title (published records)


class Source(_Model):
    kind: Literal["reproduced", "published"]
    citation: Citation | None = None


class Method(_Model):
    """The method and its card's facts (a failed record of an unregistered method: fidelity and version null)."""

    name: StrictStr
    fidelity: Literal["paper", "reconstructed", "original", None]
    version: StrictStr | None
    citation: StrictStr = None
    notes: list[StrictStr] = None
    plugin_dist: StrictStr | None = None
    hparams: OpenObject = None
    published_name: StrictStr = None
    single_architecture: StrictBool = None
    transfer: Literal["none", "public-unlabelled", "public-labelled", "synthetic"] = None
    preset: StrictStr | None = None
    run_details: OpenObject = None
    peer_data: StrictBool = None
    predictor: Literal["live model", "stored snapshot", "prototype classifier", "live + shared", "joint",
                       "ensemble"] = None


class TaskModality(_Model):
    name: StrictStr
    shape: list[Positive]


class Task(_Model):
    """The task (``TaskInfo.as_record``) and the data the run loaded."""

    name: StrictStr
    version: StrictStr | None
    num_classes: _number(ge=2, integer=True) | None
    input_shape: list[Int] = None
    source: StrictStr = None
    citation: StrictStr = None
    license: StrictStr = None
    main_score: StrictStr = None
    description: StrictStr = None
    augmentation: StrictStr = None
    modalities: list[TaskModality] = None
    published_name: StrictStr = None
    n_train: Count = None
    n_test: Count = None
    data_fingerprint: Hash16 = None


class ArchPool(_Model):
    name: StrictStr
    assignment: list[StrictStr]
    n_params: list[Int] = None


class Partition(_Model):
    scheme: StrictStr
    params: OpenObject = None
    seed: Int
    hash: StrictStr
    heldout_fraction: Number
    public_size: Int = None
    pretrain_size: Positive = None
    train_counts: list[list[Count]] = None  # per client, per class
    val_counts: list[list[Count]] = None


class Federation(_Model):
    n_clients: Positive
    clients_per_round: Positive = None
    rounds: Positive
    rounds_run: Count = None
    local_epochs: Positive
    topology: Literal["p2p", "server", "none"]
    exec: Literal["reference", "fast"] = None
    eval_every: Positive = None
    vmap: StrictBool = None
    lockstep: StrictBool = None
    cuda_graphs: StrictBool = None
    resumed_from_rounds: list[Positive] = None
    checkpoint_refused: StrictStr = None


class Seeds(_Model):
    python: Int = None
    numpy: Int = None
    torch: Int = None
    partition: Int = None


class Selection(_Model):
    rule: Literal["best_mean_local_val", "best_mean_pooled_val", "as_published"]
    round: Int | None
    score: Pct = None


class Faults(_Model):
    """A run with --faults: the fault, whom it hit, and the config hash of the run without it."""

    spec: StrictStr
    kind: Literal["label-noise", "byzantine", "free-rider", "straggler"]
    strength: Number | None = None
    mode: StrictStr | None = None
    fraction: Number | None = None
    faulty_clients: list[Count]
    honest_clients: list[Count]
    missed_rounds: dict[str, list[Positive]] = None
    flipped_labels: dict[str, Count] = None
    selection: Literal["honest", "all"]
    baseline_config_hash: StrictStr


class Modalities(_Model):
    """A multimodal run: the modality recipients miss, who is a recipient or a donor, what each observes."""

    names: list[StrictStr]
    missing: StrictStr
    recipient_fraction: _number(ge=0, le=1)
    recipients: list[Count]
    donors: list[Count]
    observed: list[list[StrictStr]]
    rule: StrictStr
    version: Annotated[StrictStr, Field(pattern=r"^[0-9]+(\.[0-9]+)*$")]
    hash: Hash16

    @model_validator(mode="after")
    def _consistent(self):
        names, missing, observed = self.names, self.missing, self.observed
        recipients, donors = self.recipients, self.donors
        found: list[tuple[tuple, str]] = []
        if missing not in names:
            found.append((("missing",), f"{missing!r} is not one of the modalities {names!r}"))
        if both := sorted(set(recipients) & set(donors)):
            found.append(((), f"clients {both} are both recipients and donors"))
        if sorted(recipients + donors) != list(range(len(observed))):
            found.append(((), f"recipients and donors are not each of the {len(observed)} clients "
                              f"(one list per client in observed) once"))
        for cid, seen in enumerate(observed):
            if unknown := [m for m in seen if m not in names]:
                found.append((("observed", cid), f"{unknown!r} not among the modalities {names!r}"))
            if cid in recipients and missing in seen:
                found.append((("observed", cid), f"recipient {cid} observes the missing modality {missing!r}"))
            if cid in donors and set(seen) != set(names):
                found.append((("observed", cid), f"donor {cid} does not observe every modality"))
        if found:
            raise _Found(found)
        return self


# ----------------------------------------------------------------------------- metrics


class Window(_Model):
    rounds: Positive
    first_round: Positive
    last_round: Positive


class Figures(_Model):
    """An extra endpoint's global and local accuracy."""

    global_acc: Pct = None
    local_acc: Pct = None


class EndpointFigures(_Model):
    """A client group's figures of an extra endpoint: both, each null where no client has it."""

    global_acc: Pct
    local_acc: Pct


class FinalClient(_Model):
    cid: Count
    global_acc: Pct
    local_acc: Pct = None


class Final(_Model):
    """The figures averaged over the final window (the last evaluated rounds)."""

    rounds: Positive
    first_round: Positive
    last_round: Positive
    global_acc: Pct
    local_acc: Pct
    per_client: list[FinalClient] = None
    endpoints: dict[str, Figures] = None


class SeenUnseenFinal(_Model):
    rounds: Positive
    first_round: Positive
    last_round: Positive
    seen_acc: Pct
    unseen_acc: Pct


class SeenUnseen(_Model):
    """The selected round's accuracy on the classes each client holds (seen) and lacks (unseen)."""

    n_clients: Count
    n_clients_seen: Count
    n_clients_unseen: Count
    seen_acc: Pct
    unseen_acc: Pct
    final: SeenUnseenFinal = None


class ArchSeenUnseen(_Model):
    seen_acc: Pct
    unseen_acc: Pct
    n_clients_unseen: Count


class ClientSeenUnseen(_Model):
    cid: Int
    n_seen_classes: Count
    seen_acc: Pct
    unseen_acc: Pct


class AllSeenUnseen(SeenUnseen):
    """All clients' seen / unseen figures, with the rule and each architecture's and client's."""

    min_train_count: Positive
    per_arch: dict[str, ArchSeenUnseen]
    per_client: list[ClientSeenUnseen]


class ClientGroup(_Model):
    """The selected round's figures over some clients: all of them (``Metrics``) or a group
    (``metrics.honest``, ``faulty``, ``recipients``, ``donors``), with its final window and seen /
    unseen figures. A group requires n_clients and the three figures (``Metrics`` checks)."""

    n_clients: Count = None
    global_acc: Pct = None
    local_acc: Pct = None
    mean_val_acc: Pct = None
    endpoints: dict[str, EndpointFigures] = None
    final: Final = None
    seen_unseen: SeenUnseen = None


class Headline(_Model):
    """The figure every view reads: the final (or, without a final window, the selected) global accuracy."""

    figure: Literal["global_acc"]
    statistic: Literal["final", "selected"]
    clients: Literal["all", "honest", "recipients"]
    value: Pct
    window: Window | None


class Selected(_Model):
    round: Positive
    global_acc: Pct
    local_acc: Pct
    mean_val_acc: Pct


class ClientFigures(_Model):
    cid: Int
    arch: StrictStr
    global_acc: Pct
    local_acc: Pct = None
    val_acc: Pct = None


GROUP_REQUIRED = ("n_clients", "global_acc", "local_acc", "mean_val_acc")
GROUP_REQUIRED_MORE = {"recipients": ("endpoints",), "donors": ("endpoints",)}


class Metrics(ClientGroup):
    """All clients' figures (a published record: one figure, its sd and seed count) and each group's."""

    headline: Headline = None
    selected: Selected = None
    unit: Literal["percent"]
    sd: NonNegative | None = None
    n_seeds: Positive | None = None
    endpoint: StrictStr = None
    per_client: list[ClientFigures] = None
    per_class_global_acc: list[Pct] = None
    per_arch_global_acc: dict[str, Pct] = None
    extra_endpoints: dict[str, Figures] = None
    seen_unseen: AllSeenUnseen = None
    honest: ClientGroup = None
    faulty: ClientGroup = None
    recipients: ClientGroup = None
    donors: ClientGroup = None

    @model_validator(mode="after")
    def _groups_complete(self):
        found = []
        for name in GROUPS:
            group = getattr(self, name)
            if group is None:
                continue
            for key in GROUP_REQUIRED + GROUP_REQUIRED_MORE.get(name, ()):
                if key not in group.model_fields_set:
                    found.append(((name, key), "required, but missing"))
        if found:
            raise _Found(found)
        return self


# ----------------------------------------------------------------------------- cost


class BudgetMean(_Model):
    steps: NonNegative
    samples: NonNegative


class BudgetCount(_Model):
    steps: Count
    samples: Count


class BudgetTotals(_Model):
    private: BudgetCount
    public: BudgetCount
    synthetic: BudgetCount
    server: BudgetCount


class PerClientRound(_Model):
    private: BudgetMean
    public: BudgetMean
    synthetic: BudgetMean


class ClientCounts(_Model):
    steps: list[Count]
    samples: list[Count]


class PerClientBudget(_Model):
    private: ClientCounts
    public: ClientCounts
    synthetic: ClientCounts


class Budget(_Model):
    """The work a run did: optimizer steps and samples by kind of data (``metering.Budget.record``)."""

    rounds: Count
    per_client_round: PerClientRound
    server_per_round: BudgetMean
    totals: BudgetTotals
    setup: BudgetTotals
    per_client: PerClientBudget


class PeakMemory(_Model):
    cpu_rss_bytes: Count = None
    cuda_bytes: Count | None = None


class Cost(_Model):
    bytes_sent_per_client_per_round: NonNegative = None
    bytes_total: Count = None
    wall_time_per_round_s: NonNegative = None
    wall_time_total_s: NonNegative = None
    peak_memory: PeakMemory = None
    budget: Budget = None


# ----------------------------------------------------------------------------- history


class GroupRound(_Model):
    """A round's mean test accuracy over a client group (null: no test this round, or no client)."""

    global_acc: Pct
    local_acc: Pct
    seen_acc: Pct = None
    unseen_acc: Pct = None
    endpoints: dict[str, Figures] = None


class HistoryEntry(_Model):
    """One round: its figures over all clients and each group, its cost, and the method's own numbers
    (extra fields, each a number or null; one named ``*_acc`` an accuracy)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Scalar] = Field(init=False)

    round: Count
    mean_val_acc: Pct
    pooled_val_acc: Pct = None
    local_acc: Pct = None
    global_acc: Pct = None
    seen_acc: Pct = None
    unseen_acc: Pct = None
    client_global_acc: list[Pct] = None
    client_local_acc: list[Pct] = None
    endpoints: dict[str, Figures] = None
    honest: GroupRound = None
    faulty: GroupRound = None
    recipients: GroupRound = None
    donors: GroupRound = None
    bytes: Count = None
    seconds: Number = None
    phases: dict[str, Number] = None

    @model_validator(mode="after")
    def _method_accuracies(self):
        found = []
        for key, value in (self.__pydantic_extra__ or {}).items():
            if key.endswith("_acc") and value is not None and not 0 <= value <= 100:
                found.append(((key,), f"accuracy {value!r} is not within [0, 100]"))
        if found:
            raise _Found(found)
        return self


# ----------------------------------------------------------------------------- the rest


class SettingPartition(_Model):
    scheme: StrictStr | None
    params: OpenObject


class SettingPool(_Model):
    suite_name: StrictStr | None
    description: StrictStr


class Setting(_Model):
    """A published figure's setting, as far as the paper states it (null: not stated)."""

    n_clients: Positive | None
    clients_per_round: Positive | None = None
    rounds: Positive | None
    local_epochs: Positive | None = None
    partition: SettingPartition
    pool: SettingPool
    seeds: list[Int] | None = None
    public_data: StrictStr | None = None
    notes: list[StrictStr] = None


class Plugin(_Model):
    kind: Literal["method", "task", "pool", "partitioner", "aggregator"]
    name: StrictStr
    module: StrictStr
    dist: StrictStr | None
    version: StrictStr | None
    git_sha: StrictStr | None
    git_dirty: StrictBool | None


class Code(_Model):
    hfl_bench_version: StrictStr = None
    git_sha: StrictStr | None = None
    git_dirty: StrictBool | None = None


class Environment(_Model):
    """Versions and hardware (``provenance.environment``)."""

    python: StrictStr = None
    torch: StrictStr = None
    timm: StrictStr = None
    numpy: StrictStr = None
    device: StrictStr = None
    gpu_name: StrictStr | None = None
    platform: StrictStr = None
    torch_threads: Int = None
    cpu: StrictStr | None = None
    cpu_isa: StrictStr | None = None
    torch_cpu_capability: StrictStr | None = None


class Record(_Model):
    """One run (reproduced) or one published figure, schema 1.8."""

    schema_version: Literal["1.8"]
    record_id: StrictStr
    source: Source
    status: Literal["ok", "diverged", "failed"]
    error: StrictStr | None = None
    method: Method
    task: Task
    arch_pool: ArchPool = None
    partition: Partition = None
    federation: Federation = None
    seeds: Seeds = None
    selection: Selection = None
    faults: Faults = None
    modalities: Modalities = None
    metrics: Metrics | None
    cost: Cost = None
    history: list[HistoryEntry] = None
    setting: Setting = None
    plugins: list[Plugin] = None
    config: OpenObject = None
    config_hash: StrictStr = None
    code: Code = None
    environment: Environment = None
    date: StrictStr = None

    @model_validator(mode="wrap")
    @classmethod
    def _cross_checks(cls, data: Any, handler, info: ValidationInfo):
        # On the raw mapping, so they are found also where a section is ill-typed (record_problems
        # collects them through the context then; the field errors are raised first).
        found = _record_checks(data) if isinstance(data, dict) else []
        if isinstance(info.context, dict) and isinstance(info.context.get("record_checks"), list):
            info.context["record_checks"].extend(found)
        record = handler(data)
        if found:
            raise _Found(found)
        return record


# ----------------------------------------------------------------------------- record-level checks


def _obj(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _record_checks(record: dict[str, Any]) -> list[tuple[tuple, str]]:
    """The schema's if / then / else and what the schema cannot say across sections, each skipped
    where the sections it reads are of other types (their own errors say so)."""
    source, metrics, status = _obj(record.get("source")), record.get("metrics"), record.get("status")
    found: list[tuple[tuple, str]] = []
    if source.get("kind") == "published":
        found += [((key,), "required in a published record, but missing") for key in ("setting", "selection")
                  if key not in record]
        citation = source.get("citation")
        if "citation" not in source:
            found.append((("source", "citation"), "required in a published record, but missing"))
        elif not isinstance(citation, dict):
            found.append((("source", "citation"), "a published record's citation must be an object"))
        else:
            found += [(("source", "citation", key), "required in a published record, but missing")
                      for key in ("key", "arxiv_or_doi", "locator", "setting_match", "deviations")
                      if key not in citation]
        if not isinstance(metrics, dict):
            found.append((("metrics",), "a published record's metrics must be an object"))
        elif sum(_is_number(metrics.get(k)) for k in ("global_acc", "local_acc")) != 1:
            found.append((("metrics",), "a published record carries exactly one figure: global_acc or local_acc"))
        return found
    if isinstance(metrics, dict):
        required = ["global_acc"]
        required += ["honest", "faulty"] if "faults" in record else []
        required += ["recipients", "donors"] if "modalities" in record else []
        found += [(("metrics", key), "required, but missing") for key in required if key not in metrics]
    if source.get("kind") != "reproduced":
        return found
    if status == "ok":  # an ok run reports its selected round and headline figures
        if not isinstance(metrics, dict):
            found.append((("metrics",), "status ok, but the record has no metrics"))
        else:
            found += [(("metrics", k), "status ok, but it is null or missing")
                      for k in ("global_acc", "local_acc", "mean_val_acc") if metrics.get(k) is None]
            selection = record.get("selection")
            if not isinstance(selection, dict) or selection.get("round", None) is None:
                found.append((("selection", "round"), "status ok, but it is null"))
    config = record.get("config")
    if isinstance(config, dict):
        seed = config.get("seed")
        integer = _is_number(seed) and isinstance(seed, int) and 0 <= seed < SEED_LIMIT
        if not integer and not (seed is None and status == "failed"):
            found.append((("config", "seed"), f"must be an integer in [0, 2^63), got {_short(seed)}"))
        if "method_params" in config and not isinstance(config["method_params"], (dict, type(None))):
            found.append((("config", "method_params"), f"must be a mapping, got {_short(config['method_params'])}"))
    modalities = record.get("modalities")
    if isinstance(modalities, dict) and isinstance(metrics, dict):
        for who in ("recipients", "donors"):
            ids, n = modalities.get(who), _obj(metrics.get(who)).get("n_clients")
            if isinstance(ids, list) and isinstance(n, int) and not isinstance(n, bool) and n != len(ids):
                found.append((("metrics", who, "n_clients"), f"{n}, but modalities lists {len(ids)} {who}"))
    return found


# ----------------------------------------------------------------------------- the functions


def _path(loc: tuple) -> str:
    return "/".join(map(str, loc)) or "(record)"


def _messages(error: ValidationError) -> list[str]:
    out = []
    for e in error.errors():
        found = (e.get("ctx") or {}).get("error")
        if isinstance(found, _Found):
            out += [f"{_path((*e['loc'], *sub))}: {msg}" for sub, msg in found.problems]
        elif e["type"] == "missing":
            out.append(f"{_path(e['loc'])}: required, but missing")
        elif e["type"] == "extra_forbidden":
            out.append(f"{_path(e['loc'])}: not a field of this section")
        else:
            out.append(f"{_path(e['loc'])}: {e['msg']}")
    return out


def record_problems(raw: dict) -> list[str]:
    """Every problem of a schema-1.8 record as ``<json/path>: <message>`` ("(record)" for the top
    level); [] for a valid record."""
    if not isinstance(raw, dict):
        return [f"(record): must be an object, got {_short(raw)}"]
    context: dict[str, Any] = {"record_checks": []}
    try:
        Record.model_validate(raw, context=context)
    except ValidationError as e:
        problems = _messages(e)
    else:
        return []
    problems += [f"{_path(loc)}: {msg}" for loc, msg in context["record_checks"]]
    return list(dict.fromkeys(problems))


def parse(raw: dict) -> Record:
    """The record as a ``Record``; ``RecordInvalid`` (a ValueError, ``.problems``) when it is not valid."""
    try:
        return Record.model_validate(raw)
    except ValidationError:
        raise RecordInvalid(record_problems(raw)) from None


def dump(record: Record) -> dict:
    """The record as JSON data: exactly the mapping it was parsed from (same keys, same order)."""
    return record.model_dump(mode="json", exclude_unset=True)


class _Schema(GenerateJsonSchema):
    """Pydantic's JSON Schema without the ``default: null`` of optional fields (absent, not null)."""

    def default_schema(self, schema):
        return self.generate_inner(schema["schema"])


# The schema's if / then / else (of 1.7): a published record's citation, setting and one figure; a
# reproduced record's headline figure and client groups.
_CONDITIONS = [{
    "if": {"required": ["source"], "properties": {"source": {"required": ["kind"],
                                                             "properties": {"kind": {"const": "published"}}}}},
    "then": {
        "required": ["setting", "selection"],
        "properties": {
            "source": {"required": ["citation"], "properties": {"citation": {
                "type": "object", "required": ["key", "arxiv_or_doi", "locator", "setting_match", "deviations"]}}},
            "metrics": {"type": "object", "oneOf": [
                {"required": ["global_acc"], "properties": {"global_acc": {"type": "number"}}},
                {"required": ["local_acc"], "properties": {"local_acc": {"type": "number"}}}]},
        },
    },
    "else": {
        "properties": {"metrics": {"required": ["global_acc"]}},
        "allOf": [
            {"if": {"required": ["faults"]}, "then": {"properties": {"metrics": {"required": ["honest", "faulty"]}}}},
            {"if": {"required": ["modalities"]},
             "then": {"properties": {"metrics": {"required": ["recipients", "donors"]}}}},
        ],
    },
}]


def json_schema() -> dict:
    """The record's JSON Schema (draft 2020-12) of version 1.8, generated from the models; the same
    mapping, in the same key order, on every call."""
    body = Record.model_json_schema(schema_generator=_Schema)
    defs = body.pop("$defs", {})
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"hfl-bench/record-{CURRENT_VERSION}",
        "title": f"hfl-bench leaderboard record, schema {CURRENT_VERSION}",
        "description": (f"One run (reproduced) or one published figure, schema {CURRENT_VERSION}: the shape of 1.7, "
                        "generated from hfl_bench/record_model.py. Accuracies are percentages (0-100)."),
        "type": body["type"],
        "required": body["required"],
        "properties": body["properties"],
        "additionalProperties": body["additionalProperties"],
        "allOf": _CONDITIONS,
        "$defs": dict(sorted(defs.items())),
    }
    return schema
