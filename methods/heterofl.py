"""HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients", ICLR 2021).

One global model; each client trains a static width slice of it (the first ceil(r * C) channels of
every hidden layer at its capacity level's rate r) with the scaler module and static batch norm,
and the server averages each parameter entry over the clients that hold it. The family's code is
``hfl_bench.families.submodel``; every choice: ``docs/reference/method-notes/heterofl.md``.
"""

from __future__ import annotations

from hfl_bench.families.submodel import SUBMODEL_NOTES, SubmodelParams, SubmodelRounds
from hfl_bench.method_api import Method, MethodCard, SmokeSettings, register_method


@register_method
class HeteroFL(SubmodelRounds, Method):
    card = MethodCard(
        name="heterofl", version="1.0", fidelity="reconstructed", topology="server",
        citation="Diao, Ding, Tarokh, HeteroFL: Computation and Communication Efficient Federated Learning for "
                 "Heterogeneous Clients, ICLR 2021",
        summary="Each client trains a static width slice of one global model at its capacity level; the server "
                "averages each entry over its holders.",
        submodels=True, pool="heterofl-cnn",
        why_single_modality="it slices one global image model, which has no encoder per modality",
        why_not_tokens="its global model is HeteroFL's CNN, which reads images or signals",
        smoke=SmokeSettings(),
        notes=SUBMODEL_NOTES + ("slices: static, the first ceil(r * C) channels of every hidden layer",),
    )
    Params = SubmodelParams

    def start(self, rnd: int, full: int, size: int) -> int:
        return 0
