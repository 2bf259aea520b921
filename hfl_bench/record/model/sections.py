"""The record's sections other than its figures: source, method, task, arch_pool, partition,
federation, seeds, selection, faults, modalities, cost, setting (published records), plugins, code
and environment."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictStr, model_validator

from hfl_bench.record.model.values import (
    Count,
    Hash16,
    Int,
    NonNegative,
    NonNegativeOrNull,
    Number,
    OpenObject,
    Pct,
    Positive,
    _Found,
    _Model,
    _number,
)


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
    # null / "unknown": a record older than the field, of a method the frozen table of built-in cards
    # does not know (a plugin's), as the upgrade fills it (``record.upgrade``)
    single_architecture: StrictBool | None = None
    transfer: Literal["none", "public-unlabelled", "public-labelled", "synthetic", "unknown"] = None
    preset: StrictStr | None = None
    run_details: OpenObject = None
    peer_data: StrictBool = None
    submodels: StrictBool = None  # sub-models of one global model (HeteroFL, FedRolex); absent: no
    predictor: Literal["live model", "stored snapshot", "prototype classifier", "live + shared", "joint",
                       "ensemble", "unknown"] = None


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
    # What the inputs are where they are not dense numbers (``TaskInfo.input_kind``: "tokens" for a
    # text task's token ids); a dense task's record leaves it out.
    input_kind: Literal["tokens"] = None
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
    # test rounds outside the final window tested a seeded draw of this many clients (--eval-clients)
    eval_clients: Positive = None
    client_state: Literal["resident", "host", "disk"] = None  # where inactive clients' state waited
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


class FlopsPerSample(_Model):
    """Each client's FLOPs per sample of its architecture, in client order (``hfl_bench.flops``)."""

    forward: list[Count]
    training: list[Count]


class FlopsMean(_Model):
    private: NonNegative
    public: NonNegative
    synthetic: NonNegative


class FlopsTotals(_Model):
    private: Count
    public: Count
    synthetic: Count


class FlopsPerClient(_Model):
    private: list[Count]
    public: list[Count]
    synthetic: list[Count]


class FlopsTraining(_Model):
    """Training FLOPs by kind of data: samples trained (the budget's) x training FLOPs per sample of
    the client's whole model (a method that trains part of it, or passes synthetic features
    through its head only, is approximated by the whole model)."""

    per_client_round: FlopsMean
    totals: FlopsTotals
    per_client: FlopsPerClient


class InferenceMean(_Model):
    private: NonNegative
    public: NonNegative
    synthetic: NonNegative
    server: NonNegative
    evaluation: NonNegative


class InferenceTotals(_Model):
    private: Count
    public: Count
    synthetic: Count
    server: Count
    evaluation: Count


class InferencePerClient(_Model):
    private: list[Count]
    public: list[Count]
    synthetic: list[Count]
    server: list[Count]
    evaluation: list[Count]


class FlopsInference(_Model):
    """Inference FLOPs (1.10): the samples each client's model processed in forward-only passes
    (gradients off: teacher logits, prototypes, evaluation; a copy of the model run by a peer or the
    server counts as its owner's) x its forward FLOPs per sample, by what the pass ran for: private,
    public, synthetic data, a client model teaching inside the server's training (server), and the
    engine's evaluation; in the training figure's shape. Absent: not recorded."""

    per_client_round: InferenceMean
    totals: InferenceTotals
    per_client: InferencePerClient


class Flops(_Model):
    """The run's FLOPs (schema 1.9), counted with torch's FLOP counter (matrix products and
    convolutions, 2 per multiply-add; elementwise work not counted); absent: not recorded."""

    counter: StrictStr
    per_sample: FlopsPerSample
    training: FlopsTraining
    inference: FlopsInference = None  # 1.10 on; absent: not recorded


class ClockDevice(_Model):
    """One client's device (``hfl_bench.clock.Device``); ``availability``: whether it has a trace."""

    name: StrictStr
    flops_per_s: NonNegative  # > 0: the profile's loader checks it
    up_bytes_per_s: NonNegative
    down_bytes_per_s: NonNegative
    latency_s: NonNegative
    availability: StrictBool


class Reclocked(_Model):
    """Where a re-clocked clock came from (schema 1.11, ``hfl-bench reclock``): the record that trained (its
    ``record_id``, its file's name and SHA-256, its device setting) and the code that timed its
    rounds again on these devices, and when."""

    record_id: StrictStr
    file: StrictStr
    sha256: StrictStr
    profile: StrictStr
    assignment: Literal["random", "by-size"]
    git_sha: StrictStr | None
    git_dirty: StrictBool | None
    hfl_bench_version: StrictStr
    date: StrictStr


class Clock(_Model):
    """The simulated clock (schema 1.10, ``--devices``; ``hfl_bench.clock``): the profile, how its
    devices were assigned, each client's device, the deadline and its rule (null: none, the clock
    only observed), each round's simulated time and their total; absent: not recorded."""

    profile: StrictStr
    preset: StrictBool
    profile_sha256: StrictStr | None
    seed: Count
    assignment: Literal["random", "by-size"]
    deadline_s: NonNegativeOrNull
    rule: StrictStr | None
    server: StrictStr
    devices: list[ClockDevice]
    per_round_s: list[NonNegative]
    total_s: NonNegative
    reclocked: Reclocked = None  # 1.11 on; absent: timed as the run trained; else re-clocked from that record


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
    flops: Flops = None


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
