"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", 2020; arXiv 2001.01523).

Each client's feature extractor stays local; the head is global. Active clients train their whole
model with CE and upload their heads; the server averages them by training size and every client
takes the average. Evaluated with the local extractor and the global head. The family code is
``hfl_bench.families.shared_head``.

Fidelity: paper, as HtFLlib adapts it to heterogeneous models. Every choice:
``docs/reference/method-notes/lg_fedavg.md`` (the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass

from hfl_bench.families.feature_head import resolve_feature_dim, split_client_models
from hfl_bench.families.shared_head import (
    FEATURE_DIM_HELP,
    broadcast_head,
    sample_weighted_average,
    sample_weights,
    start_global_head,
    upload_heads,
)
from hfl_bench.method_api import (
    Method,
    MethodCard,
    Phase,
    RoundView,
    make_plan,
    param,
    register_method,
    train_students,
)


@dataclass
class LGFedAvgParams:
    feature_dim: int = param(0, FEATURE_DIM_HELP)


@register_method
class LGFedAvg(Method):
    card = MethodCard(
        name="lg-fedavg", version="1.0", fidelity="paper", topology="server",
        citation=("Liang et al., Think Locally, Act Globally: Federated Learning with Local and Global "
                  "Representations, arXiv 2001.01523, 2020"),
        summary="Local feature extractors, one global head: the server averages the heads (by training size).",
        # reads inputs only through the clients' own models (the split's features are the fused encoding)
        missing_modalities=True,
        notes=(
            "heterogeneous models share a head Linear(d, C) on features pooled without parameters to d (HtFLlib)",
            "global head starts as client 0's initial head (HtFLlib); no FedAvg warm start (needs one architecture)",
            "head averaged over the active clients weighted by training-set size, then downloaded by every client",
            "evaluated: each client's local base with the global head",
        ),
    )
    Params = LGFedAvgParams

    def check(self, fed: RoundView) -> None:
        resolve_feature_dim(fed, self.params.feature_dim)  # refuses a pool without the split in one line

    def setup(self, fed: RoundView) -> None:
        self.feature_width = split_client_models(fed, self.params.feature_dim)
        self.global_head = start_global_head(fed)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        with fed.timer(Phase.TRAINING):
            losses = train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})
        with fed.timer(Phase.AGGREGATION):
            states = upload_heads(fed, active)
            self.global_head.load_state_dict(sample_weighted_average(states, sample_weights(fed, active)))
            broadcast_head(fed, self.global_head)
        return {"train_loss": sum(losses) / len(losses)}

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        return list(range(fed.n_clients))  # every client downloads the new global head
