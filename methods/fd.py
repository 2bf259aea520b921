"""FD, federated distillation (Jeong et al., NeurIPS 2018 workshop, arXiv 1811.11479; HtFLlib's
FedDistill).

Whole client models; only per-class mean logits cross the network. The server averages them per
class and broadcasts the table; a client trains with CE + lam softCE(z, softmax(global mean logit of
its class)) and predicts with its own model.

Fidelity: paper, with the paper's softmax target where HtFLlib's current code departs, HtFLlib's
choices where the paper is silent. The loss and every choice: ``docs/reference/method-notes/fd.md``
(the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hfl_bench.families.prototypes import broadcast, mean_over_clients, train_collecting, upload
from hfl_bench.method_api import (
    Batch,
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    make_plan,
    param,
    register_method,
)


@dataclass
class FDParams:
    lam: float = param(1.0, "Weight of the distillation term: CE + lam * soft-label CE to softmax(global mean "
                            "logit of the sample's class). HtFLlib's default and total.sh: 1.")


def fd_loss(logits: torch.Tensor, y: torch.Tensor, global_logits: torch.Tensor, present: torch.Tensor,
            lam: float) -> torch.Tensor:
    """CE(z, y) + lam * mean over the batch of -sum_c softmax(Z[y])_c log softmax(z)_c, rows of
    classes without a global logit contributing zero."""
    loss = F.cross_entropy(logits, y)
    if lam == 0:
        return loss
    target = torch.softmax(global_logits[y].float(), dim=-1)
    soft = -(target * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)
    return loss + lam * (soft * present[y].to(soft.dtype)).mean()


@register_method
class FD(Method):
    card = MethodCard(
        name="fd", version="1.0", fidelity="paper", topology="server",
        citation="Jeong, Oh, Kim, Park, Bennis, Kim, Communication-Efficient On-Device Machine Learning: "
                 "Federated Distillation and Augmentation under Non-IID Private Data, NeurIPS 2018 workshop "
                 "(MLPCD), arXiv 1811.11479",
        summary="Federated distillation: clients share per-class mean logits; CE + lam soft-label CE to the "
                "global mean logit of the class.",
        missing_modalities=True,  # reads inputs only through the clients' own models
        notes=(
            "target softmax(global mean logit) at temperature 1 (paper; HtFLlib before ca3e29a; its HEAD feeds raw "
            "logits)",
            "uploaded logits: per-class means of the train-mode logits of every local batch (HtFLlib)",
            "global logit: unweighted mean over the clients that sent the class; absent classes stay absent",
            "soft term averaged over the batch; rows of classes without a global logit add zero",
            "models kept whole (no feature / head split: only logits are exchanged)",
            "the table is broadcast to every client each round",
            "a free-rider uploads the eval-mode mean logits of its untrained model",
        ),
    )
    Params = FDParams

    def check(self, fed: RoundView) -> None:
        if self.params.lam < 0:
            raise ConfigError(f"fd: lam must be >= 0, got {self.params.lam}")

    def setup(self, fed: RoundView) -> None:
        c = fed.num_classes
        self.global_logits = torch.zeros(c, c, device=fed.device)
        self.present = torch.zeros(c, dtype=torch.bool, device=fed.device)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        losses, received = [], []
        with fed.timer(Phase.TRAINING):
            for cid in active:
                loss, means, present = self.local_training(fed, rnd, cid)
                losses.append(loss)
                received.append(upload(fed, cid, means, present, Payload.LOGITS))
        with fed.timer(Phase.AGGREGATION):
            table, present = mean_over_clients(received, fed.num_classes, fed.num_classes, fed.device)
            self.global_logits, self.present = broadcast(fed, table, present, Payload.LOGITS)
        return {"train_loss": sum(losses) / len(losses)}

    def local_training(self, fed: RoundView, rnd: int, cid: int) -> tuple[float, torch.Tensor, torch.Tensor]:
        """One client's training against the current global logits; its mean loss and the
        per-class means of its train-mode logits."""
        client = fed.clients[cid]
        model, global_logits, present, lam = client.model, self.global_logits, self.present, self.params.lam

        def step(b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
            logits = model(b.x)
            return fd_loss(logits, b.y, global_logits, present, lam), logits

        return train_collecting(fed, cid, make_plan(fed, cid, rnd), model, client.optimizer, fed.num_classes,
                                step, model)
