"""Head sharing: what LG-FedAvg, FedGH and FedGen have in common.

Every client model is split (``feature_head.split_client_models``) into a local feature extractor
and a head ``Linear(d, C)`` of one shape for every client. The head is global: a server holds it,
every client's head is overwritten by it, and the base never leaves its client. The family's steps:

- ``start_global_head``: the server's head starts as client 0's initial head (HtFLlib), sent to
  every other client, so all clients start from the same head;
- ``upload_heads`` / ``sample_weighted_average``: the active clients' trained heads, averaged with
  weights n_k / sum n (LG-FedAvg's and FedGen's aggregation; FedGH trains its head instead);
- ``broadcast_head``: after the round's server step, every client's head (active or not) is
  overwritten by the global head. HtFLlib downloads at the start of the next round, before it
  evaluates; downloading at the end of the round is the same thing, and the engine's evaluation
  after the round then sees each client's local base with the global head, as the papers evaluate;
- ``class_prototypes``: a client's per-class mean features (FedGH's upload), computed with the
  trained model in eval mode over its whole training shard, without augmentation (HtFLlib).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from hfl_bench.families.feature_head import FeatureHeadModel
from hfl_bench.families.prototypes import eval_class_means
from hfl_bench.metering import SERVER, Payload

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

FEATURE_DIM_HELP = "Common feature width d of the split; 0 = the pool's largest native feature size; HtFLlib uses 512."


def client_head(fed: "RoundView", cid: int) -> nn.Module:
    """Client ``cid``'s head (its model is a ``FeatureHeadModel`` after the split)."""
    model = fed.clients[cid].model
    if not isinstance(model, FeatureHeadModel):
        raise TypeError(f"client {cid}'s model is not split into features and a head (split_client_models)")
    return model.head


def start_global_head(fed: "RoundView") -> nn.Module:
    """The server's global head: a copy of client 0's initial head, sent to (and loaded by) every
    other client."""
    head = copy.deepcopy(client_head(fed, 0))
    broadcast_head(fed, head, list(range(1, fed.n_clients)))
    return head


def broadcast_head(fed: "RoundView", head: nn.Module, clients: Sequence[int] | None = None) -> None:
    """Send the global head to ``clients`` (default: every client); each overwrites its own head."""
    dsts = list(range(fed.n_clients)) if clients is None else list(clients)
    if not dsts:
        return
    received = fed.channel.send(SERVER, dsts, head.state_dict(), Payload.PARAMS)
    for cid in dsts:
        client_head(fed, cid).load_state_dict(received)


def upload_heads(fed: "RoundView", active: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    """What the server receives of each active client's head (copies: the live heads change later)."""
    def snapshot(cid: int) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in client_head(fed, cid).state_dict().items()}

    return [fed.channel.send(cid, SERVER, snapshot(cid), Payload.PARAMS) for cid in active]


def sample_weights(fed: "RoundView", active: Sequence[int]) -> list[float]:
    """n_k / sum over the active clients of n (their training-set sizes)."""
    sizes = [float(fed.clients[cid].n_train) for cid in active]
    total = sum(sizes)
    return [s / total for s in sizes] if total > 0 else [1.0 / len(sizes)] * len(sizes)


def sample_weighted_average(states: Sequence[dict[str, torch.Tensor]],
                            weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """sum_k w_k state_k per entry, computed in float64 (``weights`` already sum to 1)."""
    return {key: sum(w * s[key].double() for w, s in zip(weights, states)).to(ref.dtype)
            for key, ref in states[0].items()}


@torch.no_grad()
def class_prototypes(fed: "RoundView", cid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid``'s per-class mean features ``([C, d], present [C])``: its model in eval mode
    over its whole training shard, not augmented (``prototypes.eval_class_means`` of its features)."""
    model = fed.clients[cid].model
    return eval_class_means(fed, cid, model, model.forward_features, model.num_features)
