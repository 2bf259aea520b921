"""``example-prior``: each round, the clients send the server their label counts; the server sums
them into the federation's label prior and sends it back; each client then trains with
cross-entropy plus a term that pulls its mean prediction on a batch towards that prior.

A method written from scratch for the tutorial (fidelity "original"): a hyperparameter, a loss, a
``send`` to the server and back through the metered channel, and per-client statistics read
without touching any data (``client.train_counts``).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hfl_bench.method_api import (
    SERVER,
    Batch,
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    make_plan,
    param,
    register_method,
    train_client,
)


@dataclass
class PriorParams:
    lam: float = param(0.1, "Weight of the prior term: CE + lam * KL(prior || the batch's mean prediction).")


def prior_loss(logits: torch.Tensor, y: torch.Tensor, prior: torch.Tensor, lam: float) -> torch.Tensor:
    """CE(logits, y) + lam * KL(prior || mean softmax over the batch)."""
    loss = F.cross_entropy(logits, y)
    if lam == 0:
        return loss
    mean_prediction = torch.softmax(logits.float(), dim=-1).mean(dim=0).clamp_min(1e-8)
    kl = (prior * (prior.clamp_min(1e-8).log() - mean_prediction.log())).sum()
    return loss + lam * kl


@register_method
class Prior(Method):
    card = MethodCard(
        name="example-prior", version="1.0", fidelity="original", topology="server",
        citation="hfl-bench-prior-example (examples/plugin-method in the hfl-bench repository)",
        summary="Tutorial plugin: clients pull their mean prediction towards the federation's label prior.",
        notes=("the prior: the active clients' label counts, summed by the server, sent back each round",),
    )
    Params = PriorParams

    def check(self, fed: RoundView) -> None:
        if self.params.lam < 0:
            raise ConfigError(f"example-prior: lam must be >= 0, got {self.params.lam}")

    def setup(self, fed: RoundView) -> None:
        self.prior = torch.full((fed.num_classes,), 1 / fed.num_classes, device=fed.device)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        with fed.timer(Phase.AGGREGATION):
            # up: each active client's per-class training counts, a statistic no data is read for
            counts = [fed.channel.send(cid, SERVER, torch.as_tensor(fed.clients[cid].train_counts,
                                                                    dtype=torch.float32), Payload.COUNTS)
                      for cid in active]
            total = torch.stack(counts).sum(dim=0).to(fed.device)
            # down: the prior, to every client (what they receive is what the channel delivers)
            self.prior = fed.channel.send(SERVER, list(range(fed.n_clients)), total / total.sum(), Payload.PROBS)
        losses = []
        with fed.timer(Phase.TRAINING):
            for cid in active:
                def loss(batch: Batch, logits: torch.Tensor) -> torch.Tensor:
                    return prior_loss(logits, batch.y, self.prior, self.params.lam)

                losses.append(train_client(fed, fed.clients[cid], make_plan(fed, cid, rnd), loss))
        return {"train_loss": sum(losses) / len(losses)}
