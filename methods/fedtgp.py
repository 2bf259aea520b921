"""FedTGP (Zhang, Liu, Hua, Cao, "FedTGP: Trainable Global Prototypes with Adaptive-Margin-Enhanced
Contrastive Learning for Data and Model Heterogeneity in Federated Learning", AAAI 2024).

Clients train as in FedProto and upload their class prototypes after local training; the server
trains its trainable global prototypes (a class embedding and an MLP) with the adaptive-margin
contrastive loss and sends them back. A client classifies by the nearest global prototype.

Fidelity: paper (prototypes after local training, where HtFLlib's lag a round), with HtFLlib's
choices where the paper is silent. Every choice: ``docs/reference/method-notes/fedtgp.md`` (the
method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.families.feature_head import split_client_models
from hfl_bench.families.prototypes import (
    NearestPrototypeEvaluation,
    Table,
    broadcast,
    eval_class_means,
    mean_over_clients,
    prototype_step,
    upload,
)
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Data,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    SmokeSettings,
    Trainee,
    fit,
    make_plan,
    param,
    register_method,
    require_at_least,
    seeded_init,
    transfer_plan,
)

MIN_SQUARED_DISTANCE = 1e-12  # keeps sqrt's gradient finite where rounding would make the square <= 0


@dataclass
class FedTGPParams:
    lam: float = param(10.0, "Weight of the prototype term: CE + lam * MSE(features, global prototype of the "
                             "class). HtFLlib's total.sh and the FedTGP repository use 10.")
    server_epochs: int = param(100, "Epochs the server trains TGP over the uploaded prototypes each round.")
    margin_threshold: float = param(100.0, "Cap on the adaptive margin tau (HtFLlib's margin_threthold).")
    feature_dim: int = param(0, "Common feature size d of the feature / head split; 0 = the pool's largest "
                                "native feature size; HtFLlib uses 512.")


class TrainableGlobalPrototypes(nn.Module):
    """TGP: a class embedding [C, d] through Linear(d, d) - ReLU - Linear(d, d); ``forward()`` is
    every class's global prototype [C, d]."""

    def __init__(self, num_classes: int, width: int):
        super().__init__()
        self.embedding = nn.Embedding(num_classes, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self) -> torch.Tensor:
        return self.body(self.embedding.weight)


def class_gaps(means: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """[C] each class's distance to its nearest other class among the ``present`` mean prototypes;
    a class without a partner (absent, or the only one present) takes the smallest gap found
    (HtFLlib's rule; with no pair at all every gap is +inf)."""
    dist = torch.cdist(means.double(), means.double())
    pair = present.unsqueeze(0) & present.unsqueeze(1) & ~torch.eye(len(means), dtype=torch.bool, device=means.device)
    gap = dist.masked_fill(~pair, float("inf")).min(dim=1).values
    has = torch.isfinite(gap)
    return gap.masked_fill(~has, gap[has].min()) if bool(has.any()) else gap


def adaptive_margin(means: torch.Tensor, present: torch.Tensor, threshold: float) -> float:
    """tau = min(the largest class gap, ``threshold``)."""
    return min(float(class_gaps(means, present).max()), threshold)


def margin_loss(q: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor, margin: float) -> torch.Tensor:
    """CE(-(D + margin * onehot(y)), y), D_ic = ||q_i - P_c|| (from the expanded square, as HtFLlib)."""
    square = q.pow(2).sum(1, keepdim=True) - 2 * q @ prototypes.T + prototypes.pow(2).sum(1).unsqueeze(0)
    dist = square.clamp_min(MIN_SQUARED_DISTANCE).sqrt()
    return F.cross_entropy(-(dist + margin * F.one_hot(y, len(prototypes)).to(dist.dtype)), y)


def pairs(received: list[Table], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The uploaded (prototype, class) pairs the server trains on, in upload order."""
    rows = [(v, c) for table in received for c, v in table.items()]
    if not rows:
        return torch.zeros(0, 0, device=device), torch.zeros(0, dtype=torch.long, device=device)
    return (torch.stack([v.to(device).float() for v, _ in rows]),
            torch.tensor([c for _, c in rows], dtype=torch.long, device=device))


@register_method
class FedTGP(NearestPrototypeEvaluation, Method):
    card = MethodCard(
        name="fedtgp", version="1.0", fidelity="paper", topology="server", predictor="prototype classifier",
        citation="Zhang, Liu, Hua, Cao, FedTGP: Trainable Global Prototypes with Adaptive-Margin-Enhanced "
                 "Contrastive Learning for Data and Model Heterogeneity in Federated Learning, AAAI 2024",
        summary="FedProto's client loss; the server trains global prototypes (TGP) on the uploaded ones with an "
                "adaptive-margin contrastive loss.",
        missing_modalities=True,  # reads inputs only through the clients' own (split) models
        smoke=SmokeSettings(method_params={"server_epochs": "2"}),
        notes=(
            "feature / head split: pre-logit features pooled without parameters to feature_dim, a new linear head",
            "prototypes computed after local training, eval mode, whole training set (paper; HtFLlib uploads the "
            "previous round's)",
            "a class no client sent, or without a partner, takes the smallest class gap (HtFLlib)",
            "server: plain SGD at the run's learning rate (as HtFLlib), re-created each round, batches of the run's "
            "batch size, seeded shuffles, no gradient clipping; counted on the work meter",
            "squared distances clamped at 1e-12 before the square root",
            "headline: nearest global prototype (mean squared distance); the client's head is the endpoint head",
            "before the first global prototypes the initial models are evaluated by their heads",
            "a free-rider uploads the eval-mode prototypes of its untrained model",
        ),
    )
    Params = FedTGPParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        if p.lam < 0:
            raise ConfigError(f"fedtgp: lam must be >= 0, got {p.lam}")
        require_at_least("fedtgp", p, ("server_epochs",), 0)
        if p.margin_threshold < 0:
            raise ConfigError(f"fedtgp: margin_threshold must be >= 0, got {p.margin_threshold}")

    def setup(self, fed: RoundView) -> None:
        self.width = split_client_models(fed, self.params.feature_dim, "fedtgp-head")
        with seeded_init(fed, "fedtgp-tgp"):
            self.tgp = TrainableGlobalPrototypes(fed.num_classes, self.width).to(fed.device)
        self.prototypes = torch.zeros(fed.num_classes, self.width, device=fed.device)
        self.present = torch.zeros(fed.num_classes, dtype=torch.bool, device=fed.device)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        losses, received = [], []
        with fed.timer(Phase.TRAINING):
            for cid in active:
                losses.append(self.local_training(fed, rnd, cid))
                model = fed.clients[cid].model
                means, present = eval_class_means(fed, cid, model, model.forward_features, self.width)
                received.append(upload(fed, cid, means, present, Payload.FEATURES))
        with fed.timer(Phase.AGGREGATION):
            server_loss = self.train_tgp(fed, rnd, received)
            with torch.no_grad():
                prototypes = self.tgp().detach()
            everyone = torch.ones(fed.num_classes, dtype=torch.bool, device=fed.device)
            self.prototypes, self.present = broadcast(fed, prototypes, everyone, Payload.FEATURES)
        return {"train_loss": sum(losses) / len(losses), "server_loss": server_loss}

    def local_training(self, fed: RoundView, rnd: int, cid: int) -> float:
        """FedProto's local loss against the current global prototypes; the mean loss."""
        client = fed.clients[cid]
        step = prototype_step(client.model, self.prototypes, self.present, self.params.lam)
        trainee = Trainee(client.model, client.optimizer, f"client {cid}", cid)
        return fit(fed, make_plan(fed, cid, rnd), [trainee], lambda b: [step(b)[0]])[0]

    def train_tgp(self, fed: RoundView, rnd: int, received: list[Table]) -> float:
        """The server's step: the adaptive margin from the class means, then ``server_epochs``
        epochs of the margin loss over the uploaded pairs; the mean loss (0 without pairs)."""
        q, y = pairs(received, fed.device)
        if len(y) == 0 or self.params.server_epochs == 0:
            return 0.0
        means, present = mean_over_clients(received, fed.num_classes, self.width, fed.device)
        margin = adaptive_margin(means, present, self.params.margin_threshold)
        plan = transfer_plan(fed, q, y=y, epochs=self.params.server_epochs, seed_parts=("fedtgp-server", rnd),
                             data=Data.SERVER)
        optimizer = torch.optim.SGD(self.tgp.parameters(), lr=fed.cfg.lr)
        tgp = self.tgp
        return fit(fed, plan, [Trainee(tgp, optimizer, "server TGP", SERVER)],
                   lambda b: [margin_loss(b.x, b.y, tgp(), margin)], clip=0.0)[0]
