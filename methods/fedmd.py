"""FedMD: heterogeneous federated learning via model distillation (Li & Wang, arXiv 1910.03581).

Every client owns a model of its own architecture and a labeled public data set is available to
all of them. Before the first round each client learns the public set (transfer learning, CE),
then its private data. Each round, every active client

1. computes its logits on the public set (the alignment set),
2. sends them to the other active clients (decentralized form: an all-to-all broadcast of the
   M x C logit matrix; each client averages, which gives the same consensus as a server would),
3. **Digest**: trains toward the consensus (mean of the active clients' logits, its own
   included) on the public set,
4. **Revisit**: trains on its private data with CE.

Fidelity: paper, with the choices of the authors' official code (github.com/diogenes0319/FedMD_clean):
the digest matches logits with an L1 loss (Keras ``mean_absolute_error``) under Adam, lr 1e-3;
``--set digest_loss=kl`` switches to KD_T on softened logits, a common variant. Choices where the
paper and code leave room (each also in ``notes``, so every record carries them):

- transfer learning and the private initialization run once, before round 1, for every client:
  ``transfer_epochs`` (default 5) CE epochs on the labeled public set, then ``private_init_epochs``
  (default 2) epochs on the private data, both with the client's own SGD optimizer (the suite's
  protocol; the official Keras code used Adam with early stopping and more epochs, too slow for a
  CPU suite). These epochs come on top of the R rounds' budget;
- the alignment set is the whole public set each round (``alignment_size`` = 0); the official code
  draws a fresh subset per round, which ``alignment_size`` = k reproduces (a seeded draw per round,
  shared by every client, so it costs no bytes);
- digest: ``digest_epochs`` (default 1) seeded shuffled epochs over the alignment set at the suite's
  batch size, unaugmented, in train mode, with one Adam optimizer per client created in setup and
  kept across rounds (as the official Keras model keeps its compiled optimizer); clipped to the
  suite's global gradient norm;
- revisit: ``revisit_epochs`` (default: the suite's local_epochs, so the private budget per round
  matches every other method) with the client's own SGD optimizer;
- logits are computed in eval mode (BatchNorm running statistics) like every teacher's, in float32;
- metering: each active client sends its M x C float32 logit matrix to every other active client,
  active * (active - 1) * M * C * 4 bytes per round; the public set itself is available to all
  beforehand and costs nothing.

The shared steps (consensus, digest, revisit) are functions of this module that ``fedgd`` reuses
on its synthetic transfer set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hfl_bench.config import ConfigError
from hfl_bench.method import Method, param, register_method, require_at_least
from hfl_bench.training import derive_seed, kd_loss, make_plan, soft_targets, train_on_plan
from hfl_bench.transfer import share_all_to_all, train_on_transfer, transfer_logits
from hfl_bench.metering import Phase

if TYPE_CHECKING:
    from hfl_bench.engine import Federation
    from hfl_bench.transfer import TransferLoss

DIGEST_LOSSES = ("l1", "kl")


@dataclass
class ExchangeParams:
    """The FedMD exchange's hyperparameters (shared with ``fedgd``)."""

    digest_loss: str = param("l1", "Digest loss: 'l1' (official code: mean absolute error on logits) or 'kl' "
                                   "(KD_T on softened logits).")
    digest_epochs: int = param(1, "Epochs over the transfer set per round in the digest step.")
    digest_lr: float = param(1e-3, "Adam learning rate of the digest step (official code: 1e-3).")
    revisit_epochs: int | None = param(None, "Private CE epochs per round after the digest; None = the suite's "
                                             "local_epochs.")
    temperature: float = param(2.0, "Temperature T of the 'kl' digest loss (unused by 'l1').")


@dataclass
class FedMDParams(ExchangeParams):
    transfer_epochs: int = param(5, "Transfer learning before round 1: CE epochs on the labeled public set.")
    private_init_epochs: int = param(2, "After transfer learning, before round 1: CE epochs on private data.")
    alignment_size: int = param(0, "Public samples used per round (a seeded draw per round); 0 = all of them.")


def check_exchange(name: str, p: ExchangeParams) -> None:
    """Reject bad exchange settings with one clear message."""
    if p.digest_loss not in DIGEST_LOSSES:
        raise ConfigError(f"{name}: digest_loss must be one of {', '.join(DIGEST_LOSSES)}, got {p.digest_loss!r}")
    if p.digest_epochs < 0:
        raise ConfigError(f"{name}: digest_epochs must be >= 0, got {p.digest_epochs}")
    if p.digest_lr <= 0:
        raise ConfigError(f"{name}: digest_lr must be > 0, got {p.digest_lr}")
    if p.temperature <= 0:
        raise ConfigError(f"{name}: temperature must be > 0, got {p.temperature}")
    r = p.revisit_epochs
    if r is not None and (r < 0 or int(r) != r):
        raise ConfigError(f"{name}: revisit_epochs must be a non-negative integer or none, got {r}")


def revisit_epochs(fed: "Federation", p: ExchangeParams) -> int:
    """Private epochs per round: the suite's local_epochs unless set."""
    return fed.cfg.local_epochs if p.revisit_epochs is None else int(p.revisit_epochs)


def make_digest_optimizers(fed: "Federation", lr: float) -> list[torch.optim.Optimizer]:
    """One Adam per client for the digest step (created once, kept across rounds)."""
    return [torch.optim.Adam(c.model.parameters(), lr=lr) for c in fed.clients]


def consensus(logits: dict[int, torch.Tensor]) -> torch.Tensor:
    """FedMD's consensus: the plain mean of the clients' logit matrices."""
    return torch.stack(list(logits.values())).mean(dim=0)


def digest_loss_fn(kind: str, target: torch.Tensor, temperature: float) -> "TransferLoss":
    """Loss toward the consensus logits ``target`` [M, C] for ``train_on_transfer``."""
    if kind == "l1":
        return lambda logits, pos: (logits - target[pos]).abs().mean()
    probs = soft_targets(target, temperature)
    return lambda logits, pos: kd_loss(logits, probs[pos], temperature)


def digest(fed: "Federation", cid: int, opt: torch.optim.Optimizer, x: torch.Tensor, target: torch.Tensor,
           p: ExchangeParams, rnd: int) -> float:
    """Digest: train client ``cid``'s model toward the consensus ``target`` on the transfer inputs ``x``."""
    loss_fn = digest_loss_fn(p.digest_loss, target, p.temperature)
    return train_on_transfer(fed, fed.clients[cid].model, opt, x, loss_fn, epochs=p.digest_epochs,
                             batch_size=fed.cfg.batch_size, seed_parts=("digest", rnd, cid),
                             who=f"client {cid} (digest)")


def revisit(fed: "Federation", cid: int, rnd: int, epochs: int) -> float:
    """Revisit: CE on the client's private data with its own (SGD) optimizer."""
    if epochs <= 0:
        return 0.0
    return train_on_plan(fed, fed.clients[cid], make_plan(fed, cid, rnd, epochs=epochs, purpose="revisit"))


def digest_and_revisit(fed: "Federation", rnd: int, active: list[int], x: torch.Tensor, target: torch.Tensor,
                       opts: list[torch.optim.Optimizer], p: ExchangeParams) -> dict[str, float]:
    """Every active client digests the consensus on ``x``, then revisits its private data."""
    epochs = revisit_epochs(fed, p)
    with fed.timer(Phase.TRAINING):
        digested = [digest(fed, i, opts[i], x, target, p, rnd) for i in active]
        revisited = [revisit(fed, i, rnd, epochs) for i in active]
    return {"train_loss": sum(revisited) / len(revisited), "digest_loss": sum(digested) / len(digested)}


def public_ce(y: torch.Tensor) -> "TransferLoss":
    return lambda logits, pos: F.cross_entropy(logits, y[pos])


@register_method("fedmd")
class FedMD(Method):
    """Transfer learning on the public set, then per round: consensus logits, digest, revisit."""

    fidelity = "paper"
    topology = "p2p"
    citation = "Li & Wang, FedMD: Heterogenous Federated Learning via Model Distillation, arXiv 1910.03581, 2019"
    needs_public = True
    notes = (
        "before round 1, every client: transfer_epochs (5) CE epochs on the labeled public set, then "
        "private_init_epochs (2) on its private data, with its own SGD; extra budget beyond the R rounds",
        "public labels are used only in the transfer step",
        "alignment set: the whole public set each round (alignment_size = 0); the official code draws a subset",
        "consensus: mean of the active clients' eval-mode logits, own included; decentralized all-to-all "
        "broadcast of the M x C float32 logit matrix",
        "digest: L1 on logits (official code; digest_loss in hparams), Adam lr 1e-3 per client kept across "
        "rounds, digest_epochs (1) at the suite batch size, unaugmented, grad-norm clip 10",
        "revisit: the suite's local_epochs of private CE with the client's SGD (lr 0.01, momentum 0.9, wd 5e-4)",
    )
    Params = FedMDParams

    def check(self, fed):
        p = self.params
        check_exchange("fedmd", p)
        require_at_least("fedmd", p, ("transfer_epochs", "private_init_epochs", "alignment_size"), 0)

    def setup(self, fed):
        self.digest_opts = make_digest_optimizers(fed, self.params.digest_lr)
        self.initialize(fed)

    def initialize(self, fed: "Federation") -> None:
        """Transfer learning on the labeled public set, then private training, for every client."""
        p = self.params
        x, y = fed.public_x, fed.public_y
        with fed.timer(Phase.INITIALIZATION):
            for c in fed.clients:
                train_on_transfer(fed, c.model, c.optimizer, x, public_ce(y), epochs=p.transfer_epochs,
                                  batch_size=fed.cfg.batch_size, seed_parts=("transfer", c.cid),
                                  who=f"client {c.cid} (transfer)")
                if p.private_init_epochs > 0:
                    plan = make_plan(fed, c.cid, 0, epochs=p.private_init_epochs, purpose="private-init")
                    train_on_plan(fed, c, plan)

    def alignment_set(self, fed: "Federation", rnd: int) -> torch.Tensor:
        """The round's public inputs: all of them, or a seeded draw of ``alignment_size``."""
        k, m = self.params.alignment_size, len(fed.public_idx)
        if k == 0 or k >= m:
            return fed.public_x
        gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "alignment", rnd))
        pick = torch.randperm(m, generator=gen)[:k].sort().values.to(fed.public_idx.device)
        return fed.data.train_x[fed.public_idx[pick]]

    def run_round(self, fed, rnd, active):
        x = self.alignment_set(fed, rnd)
        logits = transfer_logits(fed, {i: fed.clients[i].model for i in active}, x)
        with fed.timer(Phase.AGGREGATION):
            share_all_to_all(fed, logits)
            target = consensus(logits)  # every client computes the same mean
        return digest_and_revisit(fed, rnd, active, x, target, self.digest_opts, self.params)
