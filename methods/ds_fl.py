"""DS-FL: distillation-based semi-supervised FL with entropy-reduction aggregation (Itahara et al.,
IEEE TMC 2023, arXiv 2008.06180), a baseline of FedCC's paper under label skew.

Per round each active client trains CE on its private data, uploads softmax predictions on the
unlabeled public set; the server sharpens their mean, q = softmax(mean / T) (ERA;
``aggregation=mean``: the simple-averaging ablation), and the clients distill toward q on the public
set. No server model: the suite scores the clients' models (``--ensemble`` scores ERA's).

Fidelity: reconstructed (the paper's text is not among the suite's sources). The algorithm and every
choice: ``docs/reference/method-notes/ds_fl.md`` (the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hfl_bench.families.transfer import broadcast, train_on_transfer, transfer_logits, upload
from hfl_bench.method_api import (
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    kd_loss,
    make_plan,
    param,
    register_method,
    train_client,
)

AGGREGATIONS = ("era", "mean")


@dataclass
class DSFLParams:
    aggregation: str = param("era", "era: entropy-reduction averaging, softmax(mean of the uploads / era_temperature); "
                                    "mean: the plain mean (the paper's SA ablation).")
    era_temperature: float = param(0.1, "ERA's temperature T (paper: 0.1); below 1 sharpens the mean.")
    distill_epochs: int = param(1, "Epochs over the public set toward the broadcast targets per round.")


def era(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy-reduction averaging of the uploads ``probs`` [K, M, C]: softmax(mean_k p_k / T) [M, C]."""
    return torch.softmax(probs.mean(dim=0) / temperature, dim=-1)


@register_method
class DSFL(Method):
    card = MethodCard(
        name="ds-fl", version="1.0", fidelity="reconstructed", topology="server",
        citation=("Itahara, Nishio, Koda, Morikura, Yamamoto, Distillation-Based Semi-Supervised Federated Learning "
                 "for Communication-Efficient Collaborative Training with Non-IID Private Data, IEEE TMC 22(1), "
                 "2023 (arXiv 2008.06180)"),
        summary="Private CE, then softmax uploads on the public set, entropy-reduction averaging, distillation.",
        transfer="public-unlabelled",
        why_single_modality="it needs a public set, and a public sample would hand recipients the modality they miss",
        notes=(
            "public set used unlabeled (its labels are never read)",
            "order per round as published: private CE (the config's local epochs), prediction on the public set "
            "(eval mode), upload, ERA, broadcast, distillation",
            "the whole public set every round (the paper draws a subset of a large open set per round)",
            "uploads softmax(f(x)) at T = 1, M x C float32 per active client; the server broadcasts the ERA target "
            "to the round's active clients",
            "distillation loss KL(q || softmax(f(x))) (the soft cross-entropy's gradient), seeded epochs at the "
            "config's batch size, no augmentation of public inputs",
            "no server model (the paper also distills one; the suite scores the clients' models)",
            "both steps use the client's own optimizer (the run's --optimizer, lr, clipping); one public-set epoch "
            "per round on top of the protocol's private budget",
            "a round with one active client distills toward its own sharpened prediction (ERA of one upload)",
        ),
    )
    Params = DSFLParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        if p.aggregation not in AGGREGATIONS:
            raise ConfigError(f"ds-fl: aggregation must be one of {', '.join(AGGREGATIONS)}, got {p.aggregation!r}")
        if p.era_temperature <= 0:
            raise ConfigError(f"ds-fl: era_temperature must be > 0, got {p.era_temperature}")
        if p.distill_epochs < 0:
            raise ConfigError(f"ds-fl: distill_epochs must be >= 0, got {p.distill_epochs}")

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        p = self.params
        train_losses = []
        for cid in active:
            with fed.timer(Phase.TRAINING):
                train_losses.append(train_client(fed, fed.clients[cid], make_plan(fed, cid, rnd)))
        x = fed.public_x
        logits = transfer_logits(fed, {cid: fed.clients[cid].model for cid in active}, x)
        got = upload(fed, {cid: torch.softmax(z.float(), dim=-1) for cid, z in logits.items()}, Payload.PROBS)
        with fed.timer(Phase.AGGREGATION):
            probs = torch.stack([got[cid] for cid in active])
            target = era(probs, p.era_temperature) if p.aggregation == "era" else probs.mean(dim=0)
        target = broadcast(fed, target, active, Payload.PROBS)
        distill_losses = []
        for cid in active:
            client = fed.clients[cid]
            with fed.timer(Phase.TRAINING):
                distill_losses.append(train_on_transfer(
                    fed, client.model, client.optimizer, x, lambda z, pos: kd_loss(z, target[pos], 1.0),
                    epochs=p.distill_epochs, seed_parts=("ds-fl", rnd, cid), who=f"client {cid} distillation"))
        entropy = -torch.xlogy(target, target).sum(dim=-1).mean()
        return {"train_loss": sum(train_losses) / len(train_losses),
                "distill_loss": sum(distill_losses) / len(distill_losses), "target_entropy": float(entropy)}
