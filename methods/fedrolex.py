"""FedRolex (Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning with Rolling
Sub-Model Extraction", NeurIPS 2022).

HeteroFL's family with rolling slices: a client at rate r trains a window of ceil(r * C) channels of
every hidden layer whose start moves by one channel index each round, wrapping around, so every
global channel is trained by the small clients in turn. The family's code is
``hfl_bench.families.submodel``; every choice: ``docs/reference/method-notes/fedrolex.md``.
"""

from __future__ import annotations

from hfl_bench.families.submodel import SUBMODEL_NOTES, SubmodelParams, SubmodelRounds
from hfl_bench.method_api import Method, MethodCard, SmokeSettings, register_method


@register_method
class FedRolex(SubmodelRounds, Method):
    card = MethodCard(
        name="fedrolex", version="1.0", fidelity="reconstructed", topology="server",
        citation="Alam, Liu, Yan, Zhang, FedRolex: Model-Heterogeneous Federated Learning with Rolling Sub-Model "
                 "Extraction, NeurIPS 2022",
        summary="Each client trains a rolling width window of one global model (moving one channel a round); "
                "the server averages each entry over its holders.",
        submodels=True, pool="heterofl-cnn",
        why_single_modality="it slices one global image model, which has no encoder per modality",
        why_not_tokens="its global model is HeteroFL's CNN, which reads images or signals",
        smoke=SmokeSettings(),
        notes=SUBMODEL_NOTES + (
            "slices: rolling, round t's window of each hidden layer starts at channel (t - 1) mod C (the paper's "
            "r mod K, counted from round 1) and wraps around; a full-capacity client holds every channel in order "
            "(a rolled full window is a channel permutation: the same function)",
            "the model is HeteroFL's CNN with the scaler and static BN, as FedRolex's own code uses for its CNN",
            "a client's momentum moves with its window: entries it keeps keep their state, entries new to it start "
            "at zero",
        ),
    )
    Params = SubmodelParams

    def start(self, rnd: int, full: int, size: int) -> int:
        return (rnd - 1) % full
