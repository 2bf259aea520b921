"""FedGH (Yi, Wang, Liu, Shi, Yu, "FedGH: Heterogeneous Federated Learning with Generalized Global
Header", ACM MM 2023).

Clients train their whole model with CE, then upload one mean feature per class they hold; the
server trains the global header on those pairs with SGD and every client replaces its header with
it. A client is evaluated with its local extractor and the global header.

Fidelity: paper, with HtFLlib's batching and initialization where the paper gives no detail. Every
choice: ``docs/reference/method-notes/fedgh.md`` (the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.families.feature_head import resolve_feature_dim, split_client_models
from hfl_bench.families.shared_head import FEATURE_DIM_HELP, broadcast_head, class_prototypes, start_global_head
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Data,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    derive_seed,
    finite_mean,
    make_plan,
    param,
    register_method,
    require_at_least,
    train_students,
)

PROTOTYPE_KINDS = {"prototypes": Payload.FEATURES, "classes": Payload.COUNTS}


@dataclass
class FedGHParams:
    feature_dim: int = param(0, FEATURE_DIM_HELP)
    server_epochs: int = param(1, "Epochs of the server's header training over the uploaded class means per "
                                  "round (HtFLlib's total.sh: 1).")
    server_lr: float = param(0.01, "Learning rate of the server's SGD on the global header.")


def received_pairs(received: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's training set: every client's class means ``[k, d]`` with their classes, read
    from its class mask (``classes > 0``, in class order)."""
    feats, labels = [], []
    for msg in received:
        classes = torch.nonzero(msg["classes"] > 0).flatten()
        if len(classes) != len(msg["prototypes"]):
            raise ConfigError(f"fedgh: {len(msg['prototypes'])} class means arrived for {len(classes)} classes")
        feats.append(msg["prototypes"].float())
        labels.append(classes.to(msg["prototypes"].device))
    return torch.cat(feats), torch.cat(labels)


def train_header(head: nn.Module, feats: torch.Tensor, labels: torch.Tensor, *, epochs: int, lr: float,
                 batch_size: int, seed: int) -> tuple[int, float]:
    """``epochs`` epochs of plain SGD with cross-entropy on ``(feats, labels)``, seeded shuffled batches
    of ``batch_size`` (the last one whatever remains). Returns (steps, mean loss)."""
    opt = torch.optim.SGD(head.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    total, steps = torch.zeros((), device=feats.device), 0
    head.train()
    for _ in range(epochs):
        order = torch.randperm(len(feats), generator=gen).to(feats.device)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(head(feats[idx]), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
            steps += 1
    return steps, finite_mean(total, steps, "fedgh server header")


@register_method
class FedGH(Method):
    card = MethodCard(
        name="fedgh", version="1.0", fidelity="paper", topology="server",
        citation="Yi et al., FedGH: Heterogeneous Federated Learning with Generalized Global Header, ACM MM 2023",
        summary="Clients upload class-mean features; the server trains one global head on them and sends it to all.",
        # reads inputs only through the clients' own models (the split's features are the fused encoding)
        missing_modalities=True,
        notes=(
            "heterogeneous models share a head Linear(d, C) on features pooled without parameters to d (HtFLlib)",
            "global header starts as client 0's initial head and persists across rounds (HtFLlib)",
            "class means: trained model in eval mode over the whole training shard, not augmented (HtFLlib)",
            "server: plain SGD over the uploaded class means in shuffled batches of the run's batch size (HtFLlib)",
            "locally trained headers are replaced by the global one; every client downloads it after each round",
            "evaluated: each client's local extractor with the global header",
        ),
    )
    Params = FedGHParams

    def check(self, fed: RoundView) -> None:
        require_at_least("fedgh", self.params, ("server_epochs",), 0)
        if self.params.server_lr <= 0:
            raise ConfigError(f"fedgh: server_lr must be > 0, got {self.params.server_lr}")
        resolve_feature_dim(fed, self.params.feature_dim)  # refuses a pool without the split in one line

    def setup(self, fed: RoundView) -> None:
        self.feature_width = split_client_models(fed, self.params.feature_dim)
        self.global_head = start_global_head(fed)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        with fed.timer(Phase.TRAINING):
            losses = train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})
        with fed.timer(Phase.AGGREGATION):
            received = [self.upload_class_means(fed, i) for i in active]
            feats, labels = received_pairs(received)
            server_loss = self.train_global_head(fed, feats, labels, rnd)
            broadcast_head(fed, self.global_head)
        return {"train_loss": sum(losses) / len(losses), "server_loss": server_loss}

    def upload_class_means(self, fed: RoundView, cid: int) -> dict[str, torch.Tensor]:
        means, present = class_prototypes(fed, cid)
        return fed.channel.send(cid, SERVER, {"prototypes": means[present], "classes": present}, PROTOTYPE_KINDS)

    def train_global_head(self, fed: RoundView, feats: torch.Tensor, labels: torch.Tensor, rnd: int) -> float:
        """The server's step: the global header trained on the pairs; counted as server work."""
        p = self.params
        if not len(feats) or p.server_epochs == 0:
            return 0.0
        steps, loss = train_header(self.global_head, feats, labels, epochs=p.server_epochs, lr=p.server_lr,
                                   batch_size=fed.cfg.batch_size, seed=derive_seed(fed.cfg.seed, "fedgh-server", rnd))
        fed.budget.add(SERVER, Data.SERVER, steps, p.server_epochs * len(feats))
        return loss

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        return list(range(fed.n_clients))  # every client downloads the new global header
