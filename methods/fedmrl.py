"""FedMRL: federated model heterogeneous Matryoshka representation learning (Yi et al., NeurIPS 2024).

Each client holds its own model, a copy of a small shared model and a private projector fusing their
features; the local head reads the whole fused representation, the shared head its first d_s values
(Matryoshka), one CE each. Only the shared model travels, uniformly averaged. A client predicts with
its local head on the fused features.

Fidelity: paper (the projector is trained and kept, which HtFLlib's code never saves). Every choice:
``docs/reference/method-notes/fedmrl.md`` (the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.families.feature_head import FeatureHeadModel, native_width, resolve_feature_dim, split_client_models
from hfl_bench.families.shared_model import client_copies, resolve_meme_arch, split_shared_model, weighted_average
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    Trainee,
    fit,
    make_plan,
    param,
    register_method,
    seeded_init,
)

HTFLLIB_SUB_FEATURE_DIM = 128


@dataclass
class FedMRLParams:
    feature_dim: int = param(0, "Width d of each client's features and of the fused representation; 0 = the pool's "
                                "largest native feature size; HtFLlib uses 512.")
    sub_feature_dim: int = param(0, "Width d_s of the shared model's features, the prefix of the representation its "
                                    "head reads (at most d); 0 = HtFLlib's 128, lowered to d and to the shared "
                                    "model's native feature size where smaller.")
    shared_arch: str = param("auto", "Shared model architecture: a pool member's label or a timm model name; "
                                     "'auto' = the pool's smallest member by parameter count.")


def matryoshka_loss(local: FeatureHeadModel, shared: FeatureHeadModel, proj: nn.Module, x: torch.Tensor,
                    y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE of the local head on u, CE of the shared head on u's first d_s values); L is their sum."""
    u = proj(torch.cat([shared.forward_features(x), local.forward_features(x)], dim=1))
    return F.cross_entropy(local.head(u), y), F.cross_entropy(shared.head(u[:, : shared.num_features]), y)


class MatryoshkaPredictor(nn.Module):
    """A client's prediction: its head on ``P_k[phi_g(x); phi_k(x)]``."""

    def __init__(self, local: FeatureHeadModel, shared: FeatureHeadModel, proj: nn.Module):
        super().__init__()
        self.local, self.shared, self.proj = local, shared, proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.proj(torch.cat([self.shared.forward_features(x), self.local.forward_features(x)], dim=1))
        return self.local.head(u)


@register_method
class FedMRL(Method):
    card = MethodCard(
        name="fedmrl", version="1.0", fidelity="paper", topology="server",
        predictor="live + shared",  # the client's head on its own and the shared model's features, projected
        citation="Yi, Yu, Ren, Wang, Liu, Li, Federated Model Heterogeneous Matryoshka Representation Learning, "
                 "NeurIPS 2024",
        summary="Local and shared small model fused by a trained private projector (Matryoshka heads); "
                "a server averages the shared model.",
        # missing modalities: both models are pool models, which fuse the modalities a row has
        missing_modalities=True,
        notes=(
            "shared model: the pool's smallest member by parameter count unless shared_arch names one",
            "sub_feature_dim 0: HtFLlib's 128 lowered to d and to the shared model's native feature size; above d "
            "refused",
            "projector trained and kept across rounds (paper; HtFLlib never saves it: a fixed random projection)",
            "one joint loss steps the local model, the shared copy and the projector on each batch",
            "server: uniform mean of the uploads (as HtFLlib), floating buffers included (HtFLlib: parameters "
            "only), sent to every client",
            "evaluation: the local head on the projection of the aggregated shared model's and the local features",
            "shared copies start from one seeded initialization, projectors from another (no initial download "
            "metered)",
            "optimizer: the run's SGD per module; each keeps its momentum across rounds",
        ),
    )
    Params = FedMRLParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        self.shared_member = resolve_meme_arch(p.shared_arch, fed.pool, fed.info, "fedmrl", "shared_arch")
        shared_native = native_width(self.shared_member, fed.info)  # refuses a model without the split
        width = resolve_feature_dim(fed, p.feature_dim)
        if p.sub_feature_dim < 0 or p.sub_feature_dim > width:
            raise ConfigError(f"fedmrl: sub_feature_dim must be in [0, d] (0 = auto), got {p.sub_feature_dim} with "
                              f"feature width d = {width}: the shared head reads a prefix of the d-wide representation")
        self.sub_dim = p.sub_feature_dim or min(HTFLLIB_SUB_FEATURE_DIM, width, shared_native)

    def setup(self, fed: RoundView) -> None:
        if not hasattr(self, "sub_dim"):
            self.check(fed)
        width = split_client_models(fed, self.params.feature_dim, "fedmrl-head")
        self.shared = client_copies(split_shared_model(fed, self.shared_member, self.sub_dim, "fedmrl-shared"),
                                    fed.n_clients)
        with seeded_init(fed, "fedmrl-proj"):
            proj = nn.Linear(self.sub_dim + width, width).to(fed.device)
        self.proj = client_copies(proj, fed.n_clients)
        self.shared_opts = [fed.make_optimizer(m) for m in self.shared]
        self.proj_opts = [fed.make_optimizer(m) for m in self.proj]
        self.predictors = [MatryoshkaPredictor(c.model, g, pk) for c, g, pk in zip(fed.clients, self.shared, self.proj)]

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        with fed.timer(Phase.TRAINING):
            losses = [self.matryoshka_train(fed, i, rnd) for i in active]
        with fed.timer(Phase.AGGREGATION):
            states = [fed.channel.send(i, SERVER, self.shared[i].state_dict(), Payload.PARAMS) for i in active]
            avg = fed.channel.send(SERVER, list(range(fed.n_clients)), weighted_average(states, [1.0] * len(states)),
                                   Payload.PARAMS)
            for g in self.shared:
                g.load_state_dict(avg)
        return {"train_loss": sum(a + b for a, b, _ in losses) / len(losses),
                "shared_head_loss": sum(b for _, b, _ in losses) / len(losses)}

    def matryoshka_train(self, fed: RoundView, cid: int, rnd: int) -> list[float]:
        """The local model, the shared copy and the projector stepped on the joint loss over the
        client's plan. The loss is split for reporting (local head, shared head, nothing for the
        projector): ``fit`` back-propagates their sum, the joint loss."""
        local, shared, proj = fed.clients[cid].model, self.shared[cid], self.proj[cid]
        trainees = [Trainee(local, fed.clients[cid].optimizer, f"client {cid} (local)", cid),
                    Trainee(shared, self.shared_opts[cid], f"client {cid} (shared)", cid),
                    Trainee(proj, self.proj_opts[cid], f"client {cid} (projector)", cid)]
        nothing = torch.zeros((), device=fed.device)
        return fit(fed, make_plan(fed, cid, rnd), trainees,
                   lambda b: (*matryoshka_loss(local, shared, proj, b.x, b.y), nothing))

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        return list(range(fed.n_clients))  # every prediction reads the new shared model

    def eval_models(self, fed: RoundView) -> list[nn.Module]:
        return list(self.predictors)

    def state_dict(self, fed: RoundView) -> dict[str, Any]:
        # The predictors only wrap modules stored under their own names; setup rebuilds them.
        return {k: v for k, v in super().state_dict(fed).items() if k != "predictors"}

    def hparams(self) -> dict[str, Any]:
        out = super().hparams()
        member = getattr(self, "shared_member", None)
        if member is not None:
            out["shared_arch_used"] = member.model
            out["sub_feature_dim_used"] = self.sub_dim
        return out
