"""The record's figures: ``metrics`` (all clients' and each client group's, one ``ClientGroup`` type)
and the per-round ``history``."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, StrictStr, model_validator

from hfl_bench.record.model.values import (
    Count,
    Int,
    NonNegative,
    NonNegativeOrNull,
    Number,
    Pct,
    Positive,
    Scalar,
    _Found,
    _Model,
)

GROUPS = ("honest", "faulty", "recipients", "donors")  # the client groups of metrics (and history rows)


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



# ----------------------------------------------------------------------------- history


class GroupRound(_Model):
    """A round's mean test accuracy over a client group (null: no test this round, or no client)."""

    global_acc: Pct
    local_acc: Pct
    seen_acc: Pct = None
    unseen_acc: Pct = None
    endpoints: dict[str, Figures] = None


class ClockRound(_Model):
    """A round's simulated time (schema 1.10, ``hfl_bench.clock``): when it started, how long it
    took, each client's time (null: it did not run) and the clients the deadline dropped; and what
    each time was computed from (1.11, optional): the client's training FLOPs, bytes sent and bytes
    received that round (null: it did not run; absent in records written before they were recorded,
    which ``hfl-bench reclock`` then refuses)."""

    start_s: NonNegative
    seconds: NonNegative
    clients: list[NonNegativeOrNull]
    dropped: list[Count]
    flops: list[NonNegativeOrNull] = None
    up_bytes: list[NonNegativeOrNull] = None
    down_bytes: list[NonNegativeOrNull] = None


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
    clock: ClockRound = None

    @model_validator(mode="after")
    def _method_accuracies(self):
        found = []
        for key, value in (self.__pydantic_extra__ or {}).items():
            if key.endswith("_acc") and value is not None and not 0 <= value <= 100:
                found.append(((key,), f"accuracy {value!r} is not within [0, 100]"))
        if found:
            raise _Found(found)
        return self
