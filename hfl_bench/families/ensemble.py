"""The plain ensemble of every client's evaluated model, as an extra endpoint (``--ensemble``): the
predictor FedCC's paper reports for its baselines (FedMD, MSFKD, local training), so that
"ensemble against ensemble" can be compared with FedCC's own confidence-weighted ensemble
(``methods/fedcc.py``), for every method alike.

The ensemble averages the clients' softmax outputs, p(x) = mean_k softmax(f_k(x)), and is scored
by argmax like any predictor (it returns log p, so argmax and finiteness read as for logits). It
is an *evaluation* endpoint: a server would need every client's model, which most methods never
send; nothing is metered and training is unchanged. A multimodal run, whose recipients see inputs
that other clients' models were not built for, reports none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hfl_bench.training import predict_logits

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

ENSEMBLE = "ensemble"  # the endpoint's name, as FedCC's
TINY = 1e-12


class MeanEnsemble(nn.Module):
    """log of the mean softmax of ``models`` (eval mode, each model's mode restored).

    The models are held in a plain list, not as submodules: the evaluator switching this wrapper's
    mode never touches the clients' models, and one wrapper serves every client (the evaluator runs
    a predictor shared by every client once per set of test inputs)."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        self._models = list(models)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([torch.softmax(predict_logits(m, x), dim=-1) for m in self._models]).mean(dim=0)
        return torch.log(probs.clamp_min(TINY))


def with_mean_ensemble(endpoints: dict[str, list[nn.Module]], models: list[nn.Module],
                       fed: "RoundView") -> dict[str, list[nn.Module]]:
    """``endpoints`` with ``"ensemble": [MeanEnsemble(models)] * N`` added (one predictor shared by
    every client), unless the method reports an ensemble of its own or the run's clients miss a
    modality."""
    if ENSEMBLE in endpoints or fed.recipients:
        return endpoints
    return {**endpoints, ENSEMBLE: [MeanEnsemble(models)] * len(models)}
