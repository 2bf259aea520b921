"""FedMD's exchange (Li & Wang, arXiv 1910.03581), shared by ``fedmd`` (on the public set) and
``fedgd`` (on a synthetic set): the consensus of the clients' logits on a transfer set, the
digest step toward it and the revisit step on private data. The choices behind each step are in
fedmd's card notes and ``docs/reference/method-notes/fedmd.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hfl_bench.config import ConfigError, param
from hfl_bench.families.transfer import TransferLoss, train_on_transfer
from hfl_bench.metering import Phase
from hfl_bench.training import kd_loss, make_plan, soft_targets, train_client

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView


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


def revisit_epochs(fed: "RoundView", p: ExchangeParams) -> int:
    """Private epochs per round: the suite's local_epochs unless set."""
    return fed.cfg.local_epochs if p.revisit_epochs is None else int(p.revisit_epochs)


def make_digest_optimizers(fed: "RoundView", lr: float) -> list[torch.optim.Optimizer]:
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


def digest(fed: "RoundView", cid: int, opt: torch.optim.Optimizer, x: torch.Tensor, target: torch.Tensor,
           p: ExchangeParams, rnd: int) -> float:
    """Digest: train client ``cid``'s model toward the consensus ``target`` on the transfer inputs ``x``."""
    loss_fn = digest_loss_fn(p.digest_loss, target, p.temperature)
    return train_on_transfer(fed, fed.clients[cid].model, opt, x, loss_fn, epochs=p.digest_epochs,
                             seed_parts=("digest", rnd, cid), who=f"client {cid} (digest)")


def revisit(fed: "RoundView", cid: int, rnd: int, epochs: int) -> float:
    """Revisit: CE on the client's private data with its own (SGD) optimizer."""
    if epochs <= 0:
        return 0.0
    return train_client(fed, fed.clients[cid], make_plan(fed, cid, rnd, epochs=epochs, purpose="revisit"))


def digest_and_revisit(fed: "RoundView", rnd: int, active: list[int], x: torch.Tensor, target: torch.Tensor,
                       opts: list[torch.optim.Optimizer], p: ExchangeParams) -> dict[str, float]:
    """Every active client digests the consensus on ``x``, then revisits its private data."""
    epochs = revisit_epochs(fed, p)
    with fed.timer(Phase.TRAINING):
        digested = [digest(fed, i, opts[i], x, target, p, rnd) for i in active]
        revisited = [revisit(fed, i, rnd, epochs) for i in active]
    return {"train_loss": sum(revisited) / len(revisited), "digest_loss": sum(digested) / len(digested)}
