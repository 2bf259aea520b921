"""FedMKD, decentralized adaptation: peer KD plus distillation from the client's own memory.

Source: Tianjia Lin, Zhou Tan, Ximeng Liu, "FedMKD: Personalized federated learning with memory
knowledge distillation", IEEE ICC 2025, pp. 4945-4950, as the CRAD paper (arXiv 2609.00446,
Sec. 4.1) ran it as a baseline: "a recent multi-teacher method that reuses each client's own
previous-round model as an additional teacher. No implementation is public, so we adapt it to our
decentralized, architecture-heterogeneous setting."

Not to be confused with two other methods of the same name: FedMKD of Li et al. (NeurIPS 2024)
and the server-side multi-teacher FedMKD of Sun et al. (Cluster Computing 28:638, 2025) are
different algorithms. The original Lin et al. method is server-based with identical
architectures (the CRAD paper's related work describes its memory as a parameter-space blend of
the global and the previous-round local model); what runs here is the CRAD paper's adaptation.

Fidelity: reconstructed. Neither the original paper's text nor the CRAD authors' adaptation code
was available; the loss below is the suite's spec (specs/methods.md, Sec. 3). Per round r, for
every active client i and every batch x of its own data,

    L = CE(f_i(x), y) + lambda * KD_T(mean_j p_T(f_j^{r-1}(x)) || f_i(x))
                      + mu * KD_T(p_T(f_i^{r-1}(x)) || f_i(x)),

with KD_T(q || z) = T^2 KL(q || softmax(z / T)), j over the round's other active clients.
Choices where the sources are silent (each also in ``notes``, so every record carries them):

- lambda = mu = 0.5, T = 2; the weights add to CE (not the backbone's convex (1 - lambda) CE);
- the peer term is the uniform mean of the peers' round r-1 snapshots, exchanged and metered
  exactly as the peer-KD backbone exchanges them (``hfl_bench.peerkd.exchange_snapshots``), but
  without the 2C reliability statistics, which FedMKD does not use;
- the memory f_i^{r-1} is the client's own model as it stands when round r starts (its round
  r-1 snapshot); it stays on the client, so it costs no network bytes;
- no memory term until the client has finished one local round: in round 1 there is no
  previous-round model (only the random initialization), so the first round is peer KD only.
  Under partial participation this means a client's first active round, whatever its number;
- the memory teacher runs in eval mode (BatchNorm running statistics) like every teacher, on the
  same augmented view the student trains on;
- everything else (optimizer, batch size, clipping, local epochs) is the suite's shared protocol.

Both execution paths of the backbone are supported and compute the same targets: ``reference``
(per batch, from frozen copies of every active model, the client's own included) and ``fast``
(teacher-major: every teacher, each student itself included for its memory, runs once over its
students' epoch views before any student trains).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from hfl_bench.aggregation import Aggregator, get_aggregator
from hfl_bench.config import ConfigError
from hfl_bench.method import Method, param, register_method, require_at_least
from hfl_bench.peerkd import (
    aggregate_peer_targets,
    exchange_snapshots,
    frozen_snapshots,
    peers_of,
    reference_target_fn,
    teacher_major_probs,
)
from hfl_bench.training import EpochPlan, kd_loss, make_plan, predict_logits, soft_targets, train_on_plan
from hfl_bench.metering import Phase

if TYPE_CHECKING:
    from hfl_bench.engine import Federation

# A whole-epoch target tensor [n_i, C] (fast path) or a per-batch function (reference path).
Targets = torch.Tensor | Callable[[int, int, torch.Tensor], torch.Tensor] | None



@dataclass
class FedMKDParams:
    lam: float = param(0.5, "Weight lambda of the peer-distillation term (added to CE).")
    mu: float = param(0.5, "Weight mu of the memory term: distillation from the client's own previous-round model.")
    temperature: float = param(2.0, "Distillation temperature T of both terms.")


def fedmkd_extra_loss(peer: Targets, memory: Targets, lam: float, mu: float, temperature: float):
    """``extra_loss`` for ``train_on_plan`` (called with lam=0, so its own loss is plain CE):
    lambda * KD_T(peer mean || f_i) + mu * KD_T(memory || f_i), each term only when present."""

    def pick(targets, start, end, x):
        return targets[start:end] if isinstance(targets, torch.Tensor) else targets(start, end, x)

    def extra(start: int, end: int, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        loss = logits.new_zeros(())
        if peer is not None and lam > 0:
            loss = loss + lam * kd_loss(logits, pick(peer, start, end, x), temperature)
        if memory is not None and mu > 0:
            loss = loss + mu * kd_loss(logits, pick(memory, start, end, x), temperature)
        return loss

    return extra


def memory_target_fn(snapshot: torch.nn.Module, temperature: float, bf16: bool = False):
    """Per-batch memory targets from the client's own frozen round r-1 model (reference path)."""

    def targets(start: int, end: int, x: torch.Tensor) -> torch.Tensor:
        return soft_targets(predict_logits(snapshot, x, bf16=bf16), temperature)

    return targets


def fast_fedmkd_targets(
    fed: "Federation", plans: dict[int, EpochPlan], active: list[int], aggregate: Aggregator,
    temperature: float, with_memory: set[int],
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Whole-epoch (peer, memory) targets for every active student, teacher by teacher.

    A client with a memory is one more student of its own model, so every live model runs once
    over its peers' views and its own before anyone trains: the live models are still the
    round r-1 snapshots, and no copy is needed.
    """
    teachers = {j: fed.clients[j].model for j in active}

    def students_of(j: int) -> list[int]:
        return peers_of(j, list(plans)) + ([j] if j in with_memory else [])

    with fed.timer(Phase.TEACHER_INFERENCE):
        probs = teacher_major_probs(fed, plans, teachers, temperature, students_of)
    memory_targets = {i: probs[i].pop(i) for i in plans if i in with_memory}
    # counts and accuracies are unused by the uniform mean; the Aggregator API takes them
    peer_targets = aggregate_peer_targets(fed, probs, active, aggregate, fed.val_counts, fed.val_accs())
    return peer_targets, memory_targets


@register_method("fedmkd")
class FedMKD(Method):
    """Peer KD from the peers' round r-1 snapshots plus KD from the client's own round r-1 model."""

    fidelity = "reconstructed"
    topology = "p2p"
    citation = ("Lin, Tan, Liu, FedMKD: Personalized federated learning with memory knowledge distillation, "
                "IEEE ICC 2025 (decentralized adaptation of the CRAD paper, arXiv 2609.00446)")
    notes = (
        "decentralized adaptation as run by the CRAD paper; original algorithm not available (reconstructed)",
        "loss CE + lambda KD_T(uniform peer mean) + mu KD_T(own previous-round model), lambda = mu = 0.5, T = 2",
        "memory = the client's own model at the start of the round (its round r-1 snapshot), eval mode, not sent",
        "no memory term in a client's first local round (round 1 under full participation): no previous model yet",
        "peers' snapshots exchanged as in the peer-KD backbone, without the 2C statistics (unused)",
        "optimizer SGD lr 0.01 momentum 0.9 weight decay 5e-4, batch 64, grad-norm clip 10 (paper silent)",
    )
    Params = FedMKDParams

    def check(self, fed):
        p = self.params
        require_at_least("fedmkd", p, ("lam", "mu"), 0)
        if p.temperature <= 0:
            raise ConfigError(f"fedmkd: temperature must be > 0, got {p.temperature}")

    def setup(self, fed):
        self.aggregate = get_aggregator("uniform")
        self.trained: set[int] = set()  # clients that finished a local round, hence have a memory

    def run_round(self, fed, rnd, active):
        p = self.params
        exchange_snapshots(fed, active, None)  # the memory never leaves its client
        plans = {i: make_plan(fed, i, rnd) for i in active}
        with_memory = {i for i in active if i in self.trained} if p.mu > 0 else set()
        losses = []
        if fed.exec_path == "fast":
            peer, memory = fast_fedmkd_targets(fed, plans, active, self.aggregate, p.temperature, with_memory)
            with fed.timer(Phase.TRAINING):
                for i in active:
                    extra = fedmkd_extra_loss(peer.get(i), memory.get(i), p.lam, p.mu, p.temperature)
                    losses.append(train_on_plan(fed, fed.clients[i], plans[i], extra_loss=extra))
        else:
            losses = self._reference_round(fed, plans, active, with_memory)
        self.trained.update(active)
        return {"train_loss": sum(losses) / len(losses)}

    def _reference_round(self, fed, plans, active, with_memory) -> list[float]:
        """Per batch, from frozen copies of every active model (the client's own included)."""
        p = self.params
        bf16 = fed.device.type == "cuda"
        snapshots = frozen_snapshots(fed, active)
        counts, accs = fed.val_counts, fed.val_accs()
        losses = []
        with fed.timer(Phase.TRAINING_WITH_TEACHERS):
            for i in active:
                peers = peers_of(i, active)
                peer = reference_target_fn(snapshots, peers, self.aggregate, p.temperature, counts, accs,
                                           bf16=bf16) if peers else None
                memory = memory_target_fn(snapshots[i], p.temperature, bf16) if i in with_memory else None
                extra = fedmkd_extra_loss(peer, memory, p.lam, p.mu, p.temperature)
                losses.append(train_on_plan(fed, fed.clients[i], plans[i], extra_loss=extra))
        return losses
