"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients", AAAI
2022).

Only class prototypes (mean features) cross the network. Clients train CE + lam MSE(features, global
prototype of the class) and upload per-class means; the server averages them per class and
broadcasts. The headline classifies by the nearest global prototype; the head is the extra endpoint
``head``.

Fidelity: paper, with HtFLlib's code where the paper is silent. Every choice:
``docs/reference/method-notes/fedproto.md`` (the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hfl_bench.families.feature_head import split_client_models
from hfl_bench.families.prototypes import (
    NearestPrototypeEvaluation,
    broadcast,
    mean_over_clients,
    prototype_step,
    train_collecting,
    upload,
)
from hfl_bench.method_api import (
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    SmokeSettings,
    make_plan,
    param,
    register_method,
)


@dataclass
class FedProtoParams:
    lam: float = param(10.0, "Weight of the prototype term: CE + lam * MSE(features, global prototype of the "
                             "class). HtFLlib's pre-tuned value (total.sh) is 10.")
    feature_dim: int = param(0, "Common feature size d of the feature / head split; 0 = the pool's largest "
                                "native feature size; HtFLlib uses 512.")


@register_method
class FedProto(NearestPrototypeEvaluation, Method):
    card = MethodCard(
        name="fedproto", version="1.0", fidelity="paper", topology="server", predictor="prototype classifier",
        citation="Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, FedProto: Federated Prototype Learning across "
                 "Heterogeneous Clients, AAAI 2022",
        summary="Clients share per-class mean features (prototypes); CE + lam MSE to the global prototype; "
                "nearest-prototype prediction.",
        # missing modalities: reads inputs only through the clients' own models (the split of the
        # late-fusion model: its features are the fused encoding)
        missing_modalities=True,
        smoke=SmokeSettings(),
        notes=(
            "feature / head split: pre-logit features pooled without parameters to feature_dim, a new linear head",
            "uploaded prototypes: per-class means of the train-mode features of every local batch (HtFLlib)",
            "global prototype: unweighted mean over the clients that sent the class; absent classes stay absent",
            "MSE averaged over all batch x feature entries; rows of classes without a global prototype add zero",
            "headline: nearest global prototype (mean squared distance); the client's head is the endpoint head",
            "before the first global prototypes the initial models are evaluated by their heads",
            "the table is broadcast to every client each round",
            "a free-rider uploads the eval-mode prototypes of its untrained model",
        ),
    )
    Params = FedProtoParams

    def check(self, fed: RoundView) -> None:
        if self.params.lam < 0:
            raise ConfigError(f"fedproto: lam must be >= 0, got {self.params.lam}")

    def setup(self, fed: RoundView) -> None:
        self.width = split_client_models(fed, self.params.feature_dim, "fedproto-head")
        self.prototypes = torch.zeros(fed.num_classes, self.width, device=fed.device)
        self.present = torch.zeros(fed.num_classes, dtype=torch.bool, device=fed.device)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        losses, received = [], []
        with fed.timer(Phase.TRAINING):
            for cid in active:
                loss, means, present = self.local_training(fed, rnd, cid)
                losses.append(loss)
                received.append(upload(fed, cid, means, present, Payload.FEATURES))
        with fed.timer(Phase.AGGREGATION):
            table, present = mean_over_clients(received, fed.num_classes, self.width, fed.device)
            self.prototypes, self.present = broadcast(fed, table, present, Payload.FEATURES)
        return {"train_loss": sum(losses) / len(losses)}

    def local_training(self, fed: RoundView, rnd: int, cid: int) -> tuple[float, torch.Tensor, torch.Tensor]:
        """One client's local training against the current global prototypes; its mean loss and
        the per-class means of its train-mode features."""
        client = fed.clients[cid]
        step = prototype_step(client.model, self.prototypes, self.present, self.params.lam)
        return train_collecting(fed, cid, make_plan(fed, cid, rnd), client.model, client.optimizer, self.width, step,
                                client.model.forward_features)
