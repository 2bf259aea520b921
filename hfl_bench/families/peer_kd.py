"""The decentralized peer-KD backbone (CRAD paper, Sec. 3.2, Algorithm 1), shared by every
method that distills from its peers' round r-1 snapshots on its own data.

Two execution paths compute identical targets:
- ``reference``: Algorithm 1 as written. Per student, per batch, every peer snapshot runs on the
  batch, the targets are aggregated and the student takes one step. Needs a frozen copy of every
  active model (students train while their snapshots still teach).
- ``fast`` (teacher-major): every student's epoch is fixed first (batch order and augmented
  views); each teacher then runs once over all its students' views in large no-grad batches,
  before any student trains, so the live models are the round r-1 snapshots and no copy is made;
  targets are aggregated for each student's whole epoch in one vectorized call; students then
  train on the precomputed targets (``graphs.train_students``: one by one, their steps replayed
  as CUDA graphs on a GPU).

``peer_targets`` makes the choice (``--exec``) so that methods never branch on it: it returns
each student's targets in either form (``training.Targets``) and the phase their training is
timed under. A student may also be its own teacher (``memory``: FedMKD's previous-round model).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from hfl_bench.aggregation import Aggregator
from hfl_bench.federation import engine_side
from hfl_bench.graphs import train_students
from hfl_bench.metering import Payload, Phase
from hfl_bench.training import (
    EpochPlan,
    Targets,
    make_plan,
    predict_logits,
    soft_targets,
)

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView


def peers_of(cid: int, active: list[int]) -> list[int]:
    return [j for j in active if j != cid]


SNAPSHOT_KINDS = {"snapshot": Payload.MODEL, "counts": Payload.COUNTS, "accs": Payload.ACCURACIES}


def exchange_snapshots(fed: "RoundView", active: list[int], stats: torch.Tensor | None) -> dict[int, dict]:
    """Every active client sends its snapshot (and its 2C statistics ``stats[j]`` = [counts,
    accuracies], if any) to every active peer. Returns what the peers receive from each sender:
    ``{"snapshot": module, "counts": [C], "accs": [C]}`` (the live model and the very statistics,
    unless a fault corrupted them)."""
    received = {}
    for j in active:
        payload: dict = {"snapshot": fed.clients[j].model}
        if stats is not None:
            payload.update(counts=stats[j, 0], accs=stats[j, 1])
        kinds = {k: SNAPSHOT_KINDS[k] for k in payload}
        received[j] = fed.channel.send(j, peers_of(j, active), payload, kinds)
    return received


def received_stats(received: dict[int, dict], counts: torch.Tensor,
                   accs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``counts`` and ``accs`` [N, C] with each sender's rows replaced by what its peers received."""
    counts, accs = counts.clone(), accs.clone()
    for j, payload in received.items():
        if "counts" in payload:
            counts[j] = payload["counts"]
            accs[j] = payload["accs"]
    return counts, accs


def teacher_major_probs(
    fed: "RoundView", plans: dict[int, EpochPlan], teachers: dict[int, nn.Module], temperature: float,
    students_of: Callable[[int], list[int]],
) -> dict[int, dict[int, torch.Tensor]]:
    """probs[i][j]: teacher j's softened predictions on all of student i's epoch views [n_i, C].

    Each teacher runs once over the concatenation of its students' views, each distinct view once
    (``EpochPlan.distinct_view``: without augmentation a sample's view is the same in every local
    epoch, and a teacher predicted it ``local_epochs`` times over before).
    """
    # Each student's distinct inputs (its epochs' views without repeats) and where each position's
    # row is: teachers predict on these, and the rows are spread back over the positions.
    distinct = {i: plan.distinct_view(fed) for i, plan in plans.items()}
    views = {i: x for i, (x, _) in distinct.items()}
    probs: dict[int, dict[int, torch.Tensor]] = {i: {} for i in plans}
    bf16 = fed.device.type == "cuda"

    def spread(i: int, rows: torch.Tensor) -> torch.Tensor:
        where = distinct[i][1]
        return rows if where is None else rows[where]

    def scatter(j: int, students: list[int], p: torch.Tensor) -> None:
        for i, part in zip(students, p.split([len(views[i]) for i in students])):
            probs[i][j] = spread(i, part)

    for j in teachers:
        students = students_of(j)
        if students:
            x = torch.cat([views[i] for i in students])
            scatter(j, students, soft_targets(predict_logits(teachers[j], x, bf16=bf16), temperature))
    return probs


def aggregate_peer_targets(
    fed: "RoundView", probs: dict[int, dict[int, torch.Tensor]], active: list[int], aggregate: Aggregator,
    counts: torch.Tensor, accs: torch.Tensor,
) -> dict[int, torch.Tensor]:
    """Each student's peers' predictions (from ``teacher_major_probs``) aggregated into targets."""
    targets = {}
    with fed.timer(Phase.AGGREGATION):
        for i in probs:
            peers = peers_of(i, active)
            if peers:
                stacked = torch.stack([probs[i][j] for j in peers])
                targets[i] = aggregate(stacked, counts[peers], accs[peers])
    return targets


def reference_target_fn(
    snapshots: dict[int, nn.Module], peers: list[int], aggregate: Aggregator, temperature: float,
    counts: torch.Tensor, accs: torch.Tensor, bf16: bool = False,
) -> Callable[[int, int, torch.Tensor], torch.Tensor]:
    """Per-batch targets as Algorithm 1 computes them."""

    def targets(start: int, end: int, x: torch.Tensor) -> torch.Tensor:
        stacked = torch.stack([soft_targets(predict_logits(snapshots[j], x, bf16=bf16), temperature) for j in peers])
        return aggregate(stacked, counts[peers], accs[peers])

    return targets


def frozen_snapshots(fed: "RoundView", ids: list[int],
                     models: dict[int, nn.Module] | None = None) -> dict[int, nn.Module]:
    """Frozen eval-mode copies of ``models`` (what was received; default the clients' live models)."""
    snaps = {}
    for j in ids:
        snap = copy.deepcopy(fed.clients[j].model if models is None else models[j]).eval()
        snap.requires_grad_(False)
        snaps[j] = snap
    return snaps


def memory_target_fn(snapshot: nn.Module, temperature: float, bf16: bool = False) -> Callable:
    """Per-batch targets from a client's own frozen round r-1 model (reference path)."""

    def targets(start: int, end: int, x: torch.Tensor) -> torch.Tensor:
        return soft_targets(predict_logits(snapshot, x, bf16=bf16), temperature)

    return targets


@dataclass
class PeerTargets:
    """Every active student's targets: from its peers (aggregated), and from its own round r-1
    model where asked (``memory``); a student without peers has no ``peer`` entry. ``phase`` is
    what the students' training is timed under (the reference path computes targets while training)."""

    peer: dict[int, Targets]
    memory: dict[int, Targets]
    phase: Phase


def peer_targets(
    fed: "RoundView", plans: dict[int, EpochPlan], active: list[int], aggregate: Aggregator, *,
    temperature: float, counts: torch.Tensor, accs: torch.Tensor, memory: set[int] = frozenset(),
    teachers: dict[int, nn.Module] | None = None,
) -> PeerTargets:
    """The round's distillation targets on every active student's plan, by the run's execution
    path. ``teachers`` are the snapshots the peers received (``exchange_snapshots``; default the
    live models); a memory (``memory``) is always the student's own live model."""
    teachers = {j: fed.clients[j].model for j in active} if teachers is None else teachers
    if engine_side(fed).exec_path == "fast":
        return _fast_targets(fed, plans, active, aggregate, temperature, counts, accs, memory, teachers)
    bf16 = fed.device.type == "cuda"
    snapshots = frozen_snapshots(fed, active, teachers)  # students train while their snapshots still teach
    peer = {i: reference_target_fn(snapshots, peers_of(i, active), aggregate, temperature, counts, accs, bf16=bf16)
            for i in active if peers_of(i, active)}
    own = {i: memory_target_fn(snapshots[i] if teachers[i] is fed.clients[i].model
                               else frozen_snapshots(fed, [i])[i], temperature, bf16)
           for i in active if i in memory}
    return PeerTargets(peer, own, Phase.TRAINING_WITH_TEACHERS)


def _fast_targets(fed: "RoundView", plans: dict[int, EpochPlan], active: list[int], aggregate: Aggregator,
                  temperature: float, counts: torch.Tensor, accs: torch.Tensor, memory: set[int],
                  teachers: dict[int, nn.Module]) -> PeerTargets:
    """Teacher by teacher. A client with a memory is one more student of its own model, so every
    live model runs once over its peers' views and its own before anyone trains: the live models
    are still the round r-1 snapshots, and no copy is needed. A client whose sent snapshot is not
    its live model (a fault corrupted it) gets its memory targets from its live model apart."""
    own_teacher = {i for i in memory if teachers[i] is fed.clients[i].model}

    def students_of(j: int) -> list[int]:
        return peers_of(j, list(plans)) + ([j] if j in own_teacher else [])

    with fed.timer(Phase.TEACHER_INFERENCE):
        probs = teacher_major_probs(fed, plans, teachers, temperature, students_of)
        own = {i: probs[i].pop(i) for i in plans if i in own_teacher}
        bf16 = fed.device.type == "cuda"
        for i in sorted(set(memory) & set(plans) - own_teacher):
            x, where = plans[i].distinct_view(fed)
            own[i] = soft_targets(predict_logits(fed.clients[i].model, x, bf16=bf16), temperature)
            own[i] = own[i] if where is None else own[i][where]
    return PeerTargets(aggregate_peer_targets(fed, probs, active, aggregate, counts, accs), own, Phase.TRAINING)


def peer_kd_round(
    fed: "RoundView", rnd: int, active: list[int], aggregate: Aggregator, *, lam: float,
    temperature: float, counts: torch.Tensor, accs: torch.Tensor,
) -> dict[str, float]:
    """One round of the backbone: exchange, teacher inference, aggregation, student training."""
    stats = torch.stack([counts, accs], dim=1)  # [N, 2, C]: what a client shares besides its snapshot
    received = exchange_snapshots(fed, active, stats)
    counts, accs = received_stats(received, counts, accs)  # what the peers received, used from here on
    teachers = {j: received[j]["snapshot"] for j in active}
    plans = {i: make_plan(fed, i, rnd) for i in active}
    targets = peer_targets(fed, plans, active, aggregate, temperature=temperature, counts=counts, accs=accs,
                           teachers=teachers)
    with fed.timer(targets.phase):
        losses = train_students(fed, active, plans, targets=targets.peer, lam=lam, temperature=temperature)
    return {"train_loss": sum(losses) / len(losses)}
