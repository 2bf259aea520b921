"""Per-class means exchanged through a server: the prototype family (FedProto, FedTGP) and its
per-class-logit relative (FD).

Each client sends the server, for every class it holds, the mean of some vectors its model
produces for that class's training samples: features (a prototype, ``Payload.FEATURES``) or
logits (``Payload.LOGITS``). The message is a dict ``{class: vector}`` as in HtFLlib, so its
bytes are those of the classes the client holds. The server's table is, per class, the
unweighted mean over the clients that sent that class (HtFLlib's ``proto_aggregation``; sample
counts are not sent); a class nobody sent has no entry. The server broadcasts the table to every
client: all of them train against it next round and FedProto / FedTGP evaluate with it.

Two ways to collect a client's means: during its local training, from the train-mode outputs of
every batch of every epoch (FedProto, FD: ``train_collecting``), or after training, in eval mode
over its whole training set (FedTGP: ``eval_class_means``).

The prototype-regularized loss (FedProto, FedTGP) is ``prototype_loss``:
CE(logits, y) + lam * MSE(features, P[y]), the MSE a mean over all B * d entries, where the rows
whose class has no global prototype contribute zero (HtFLlib uses the row's own detached feature
as its target: the same zero, still counted in the mean).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.families.feature_head import ClassMeans, NearestPrototype
from hfl_bench.federation import engine_side
from hfl_bench.metering import SERVER, Payload
from hfl_bench.training import Batch, EpochPlan, Trainee, fit, free_riders, inference_chunk

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

Table = dict[int, torch.Tensor]  # class -> vector: what crosses the network
# (batch) -> (the batch's loss, the [B, w] outputs whose per-class means the client uploads)
CollectingLoss = Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]


def as_table(means: torch.Tensor, present: torch.Tensor) -> Table:
    """The rows of ``means`` [C, w] of the classes marked ``present``, keyed by class."""
    return {int(c): means[c] for c in present.nonzero().flatten().tolist()}


def from_table(table: Table, num_classes: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A table as ``([C, w] rows, zero where absent; [C] bool present)``."""
    rows = torch.zeros(num_classes, width, device=device)
    present = torch.zeros(num_classes, dtype=torch.bool, device=device)
    for c, v in table.items():
        rows[c] = v.to(device=device, dtype=rows.dtype)
        present[c] = True
    return rows, present


def kinds(table: Table, kind: Payload) -> dict[int, Payload]:
    return {c: kind for c in table}


def upload(fed: "RoundView", cid: int, means: torch.Tensor, present: torch.Tensor, kind: Payload) -> Table:
    """Client ``cid`` sends the server its means of the classes it holds; what the server gets."""
    table = as_table(means, present)
    return fed.channel.send(cid, SERVER, table, kinds(table, kind))


def mean_over_clients(received: list[Table], num_classes: int, width: int,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class, the unweighted mean of the vectors received for it (one per client that sent
    the class); ``([C, w] means, [C] present)``, absent classes zero and not present."""
    acc = ClassMeans(num_classes, width, device)
    for table in received:
        if table:
            classes = torch.tensor(list(table), dtype=torch.long, device=device)
            acc.add(torch.stack([v.to(device) for v in table.values()]), classes)
    return acc.means()


def broadcast(fed: "RoundView", rows: torch.Tensor, present: torch.Tensor,
              kind: Payload) -> tuple[torch.Tensor, torch.Tensor]:
    """The server sends its table (the present classes' rows) to every client; what they get."""
    table = as_table(rows, present)
    got = fed.channel.send(SERVER, list(range(fed.n_clients)), table, kinds(table, kind))
    return from_table(got, len(rows), rows.shape[1], rows.device)


def prototype_loss(logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor,
                   present: torch.Tensor, lam: float) -> torch.Tensor:
    """CE(logits, y) + lam * MSE(features, prototypes[y]), the MSE averaged over all B * d
    entries with the rows of classes without a global prototype contributing zero."""
    loss = F.cross_entropy(logits, y)
    if lam == 0:
        return loss
    has = present[y].unsqueeze(1).to(features.dtype)
    gap = (features - prototypes[y].to(features.dtype)) * has
    return loss + lam * gap.pow(2).mean()


def prototype_step(model: nn.Module, prototypes: torch.Tensor, present: torch.Tensor, lam: float) -> CollectingLoss:
    """The loss of one batch for a split model (``forward_features``, ``head``) under
    ``prototype_loss``, with the batch's train-mode features (what FedProto collects)."""

    def step(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        features = model.forward_features(batch.x)
        return prototype_loss(model.head(features), features, batch.y, prototypes, present, lam), features

    return step


def train_collecting(fed: "RoundView", cid: int, plan: EpochPlan, model: nn.Module, optimizer: torch.optim.Optimizer,
                     width: int, step_loss: CollectingLoss,
                     outputs: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Train client ``cid``'s ``model`` over ``plan`` with ``step_loss`` while collecting, per
    class, the mean of the train-mode outputs it returns (every batch of every epoch, the model
    evolving). Returns ``(mean loss, [C, width] means, [C] present)``.

    A free-rider never trains (``fit`` leaves it alone), yet it sends: its means are then those
    of its untrained model, in eval mode over its training set (``outputs``: inputs -> [B, width]).
    """
    if cid in free_riders(fed):
        return (0.0, *eval_class_means(fed, cid, model, outputs, width))
    acc = ClassMeans(fed.num_classes, width, fed.device)

    def losses(batch: Batch) -> list[torch.Tensor]:
        loss, collected = step_loss(batch)
        acc.add(collected, batch.y)
        return [loss]

    mean_loss = fit(fed, plan, [Trainee(model, optimizer, f"client {cid}", cid)], losses)[0]
    return (mean_loss, *acc.means())


@torch.no_grad()
def eval_class_means(fed: "RoundView", cid: int, model: nn.Module, outputs: Callable[[torch.Tensor], torch.Tensor],
                     width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class, the mean of ``outputs(x)`` over client ``cid``'s training inputs (as stored:
    not augmented), ``model`` in eval mode; ``([C, width] means, [C] present)``. Inference only:
    no optimizer step, nothing on the work meter."""
    whole = engine_side(fed)  # the client's training rows, read here on the method's behalf
    rows = whole.clients[cid].train_idx
    x, y = whole.data.train_x[rows], whole.data.train_y[rows]
    acc = ClassMeans(fed.num_classes, width, fed.device)
    was_training = model.training
    model.eval()
    try:
        chunk = inference_chunk(x)
        for i in range(0, len(x), chunk):
            acc.add(outputs(x[i : i + chunk]).float(), y[i : i + chunk])
    finally:
        model.train(was_training)
    return acc.means()


class NearestPrototypeEvaluation:
    """The evaluation of the nearest-prototype methods (FedProto, FedTGP), for a ``Method`` holding
    ``prototypes`` ``[C, d]`` and ``present`` ``[C]``: the headline classifies by the nearest global
    prototype (the clients' heads before the first prototypes exist), the client's own head is the
    extra endpoint ``head``, and new prototypes change every client's predictor."""

    prototypes: torch.Tensor
    present: torch.Tensor

    def changed_clients(self, fed: "RoundView", active: list[int]) -> list[int]:
        return list(range(fed.n_clients))  # new global prototypes change every client's predictor

    def eval_models(self, fed: "RoundView") -> list[nn.Module]:
        if not bool(self.present.any()):
            return [c.model for c in fed.clients]
        # a new wrapper per evaluation over this round's tensors: a snapshot of a best round keeps them
        return [NearestPrototype(c.model, self.prototypes, self.present) for c in fed.clients]

    def endpoints(self, fed: "RoundView") -> dict[str, list[nn.Module]]:
        return {"head": [c.model for c in fed.clients]}
