"""FedMD: heterogeneous federated learning via model distillation (Li & Wang, arXiv 1910.03581).

Before round 1 every client learns the labeled public set (transfer learning). Each round the active
clients exchange their logits on the public set all-to-all, each digests the consensus (L1 on
logits, Adam, as the official code) and revisits its private data with CE. ``--set
transfer_epochs=0`` never reads the public labels (FedMD as FedCC's paper ran it).

Fidelity: paper, with the official code's choices. The steps and every choice:
``docs/reference/method-notes/fedmd.md`` (the method's reference page). The shared steps live in
``hfl_bench.families.fedmd_exchange``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hfl_bench.families.fedmd_exchange import (
    ExchangeParams,
    check_exchange,
    consensus,
    digest_and_revisit,
    make_digest_optimizers,
)
from hfl_bench.families.transfer import share_all_to_all, transfer_logits
from hfl_bench.method_api import (
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    SmokeSettings,
    derive_seed,
    make_plan,
    param,
    register_method,
    require_at_least,
    train_client,
    transfer_plan,
)


@dataclass
class FedMDParams(ExchangeParams):
    transfer_epochs: int = param(5, "Transfer learning before round 1: CE epochs on the labeled public set.")
    private_init_epochs: int = param(0, "After transfer learning, before round 1: CE epochs on private data, on "
                                        "top of the rounds' budget.")
    alignment_size: int = param(0, "Public samples used per round (a seeded draw per round); 0 = all of them.")


@register_method
class FedMD(Method):
    card = MethodCard(
        name="fedmd", fidelity="paper", topology="p2p",
        version="1.1",
        changelog=(("1.1", "No private epochs before round 1 by default (the protocol's budget); 1.0's private "
                           "initialization is the \"paper\" preset."),),
        citation="Li & Wang, FedMD: Heterogenous Federated Learning via Model Distillation, arXiv 1910.03581, 2019",
        summary="Transfer learning on the public set, then per round: consensus logits, digest, revisit.",
        transfer="public-labelled",
        why_single_modality="it needs a public set, and a public sample would hand recipients the modality they miss",
        smoke=SmokeSettings(method_params={"transfer_epochs": "1"}),
        presets={"paper": {"private_init_epochs": 2}},
        notes=(
            "before round 1, every client: transfer_epochs of CE on the labeled public set, then "
            "private_init_epochs on its private data (none by default; the paper preset sets them), with its "
            "own SGD; extra budget beyond the R rounds",
            "public labels are used only in the transfer step; with transfer_epochs=0 never (FedCC's FedMD: the "
            "record's transfer is then public-unlabelled, a setting section of its own)",
            "alignment set: the whole public set each round (alignment_size = 0); the official code draws a subset",
            "consensus: mean of the active clients' eval-mode logits, own included; decentralized all-to-all "
            "broadcast of the M x C float32 logit matrix",
            "digest: L1 on logits (official code; digest_loss in hparams), a per-client Adam at digest_lr kept "
            "across rounds, digest_epochs at the config's batch size, unaugmented, clipped at the config's norm",
            "revisit: the config's local epochs of private CE with the client's SGD",
        ),
    )
    Params = FedMDParams

    def transfer(self) -> str:
        """Without the transfer step (``transfer_epochs=0``) the public labels are never read: the
        public set is used unlabelled, as FedCC's comparison ran FedMD, and the record says so."""
        return "public-unlabelled" if self.params.transfer_epochs == 0 else self.card.transfer

    def check(self, fed: RoundView) -> None:
        p = self.params
        check_exchange("fedmd", p)
        require_at_least("fedmd", p, ("transfer_epochs", "private_init_epochs", "alignment_size"), 0)

    def setup(self, fed: RoundView) -> None:
        self.digest_opts = make_digest_optimizers(fed, self.params.digest_lr)
        self.initialize(fed)

    def initialize(self, fed: RoundView) -> None:
        """Transfer learning on the labeled public set, then private training, for every client."""
        p = self.params
        x = fed.public_x
        with fed.timer(Phase.INITIALIZATION):
            for c in fed.clients:
                if p.transfer_epochs > 0:  # without it the public labels are never read
                    labeled = transfer_plan(fed, x, y=fed.public_y, epochs=p.transfer_epochs,
                                            seed_parts=("transfer", c.cid))
                    train_client(fed, c, labeled, who=f"client {c.cid} (transfer)")
                if p.private_init_epochs > 0:
                    train_client(fed, c, make_plan(fed, c.cid, 0, epochs=p.private_init_epochs, purpose="private-init"))

    def alignment_set(self, fed: RoundView, rnd: int) -> torch.Tensor:
        """The round's public inputs: all of them, or a seeded draw of ``alignment_size``."""
        public = fed.public_x
        k, m = self.params.alignment_size, len(public)
        if k == 0 or k >= m:
            return public
        gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "alignment", rnd))
        return public[torch.randperm(m, generator=gen)[:k].sort().values.to(public.device)]

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        x = self.alignment_set(fed, rnd)
        logits = transfer_logits(fed, {i: fed.clients[i].model for i in active}, x)
        with fed.timer(Phase.AGGREGATION):
            received = share_all_to_all(fed, logits, Payload.LOGITS)
            # every client computes the same mean, of what was sent (a byzantine client included)
            target = consensus(received)
        return digest_and_revisit(fed, rnd, active, x, target, self.digest_opts, self.params)
