"""FML: Federated Mutual Learning (Shen, Zhang, Jin, Ke, Wang, Wu; arXiv 2006.16765, 2020).

Each client keeps a private model and a "meme" model of one architecture for every client; both see
the same batches and teach each other (deep mutual learning, alpha / beta CE-KL mixes). A server
averages the memes by training size and broadcasts the average. The private model is evaluated; the
meme is the extra endpoint ``meme``.

The broadcast is metered to every client each round, but written into a client's meme when the
client is next drawn; until then that meme would equal the server's, which is what the ``meme``
endpoint evaluates for every client (as ``fedavg`` does). Each meme and its optimizer are kept with
their client (``Client.hold``), so ``--client-state`` offloads them too. The same numbers.

Fidelity: paper. The losses and every choice: ``docs/reference/method-notes/fml.md`` (the method's
reference page).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.families.shared_model import resolve_meme_arch, weighted_average
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    Trainee,
    fit,
    kd_loss,
    make_plan,
    new_model,
    param,
    register_method,
)


@dataclass
class FMLParams:
    alpha: float = param(0.5, "Private model's loss: alpha * CE + (1 - alpha) * KL(p_meme || p_private).")
    beta: float = param(0.5, "Meme model's loss: beta * CE + (1 - beta) * KL(p_private || p_meme).")
    meme_arch: str = param("auto", "Meme architecture shared by all clients: a pool member's label or a timm "
                                   "model name; 'auto' = the pool's smallest member by parameter count.")


def mutual_losses(private_logits: torch.Tensor, meme_logits: torch.Tensor, y: torch.Tensor,
                  alpha: float, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_private, L_meme): CE plus KL toward the other model's detached prediction at T = 1."""
    p_meme = torch.softmax(meme_logits.detach().float(), dim=-1)
    p_private = torch.softmax(private_logits.detach().float(), dim=-1)
    # kd_loss at T = 1 is exactly KL(target || softmax(z)) with reduction 'batchmean'.
    l_private = alpha * F.cross_entropy(private_logits, y) + (1 - alpha) * kd_loss(private_logits, p_meme, 1.0)
    l_meme = beta * F.cross_entropy(meme_logits, y) + (1 - beta) * kd_loss(meme_logits, p_private, 1.0)
    return l_private, l_meme


@register_method
class FML(Method):
    card = MethodCard(
        name="fml", version="1.0", fidelity="paper", topology="server",
        citation="Shen et al., Federated Mutual Learning, arXiv 2006.16765, 2020",
        summary="Private model plus a shared-architecture meme per client (mutual KL); a server averages memes.",
        # missing modalities: reads inputs only through the clients' own models, which fuse the
        # modalities a row has
        missing_modalities=True,
        notes=(
            "meme architecture: the pool's smallest member by parameter count unless meme_arch names one",
            "mutual KL at temperature 1, reduction batchmean, the other model's prediction detached",
            "private and meme trained on the same batches and augmented views, one step each per batch",
            "memes start from one shared seeded initialization (no initial download metered)",
            "server averages active memes weighted by training-set size and broadcasts to every client",
            "each client keeps its meme optimizer's momentum across rounds",
            "optimizer: the run's SGD; lr, momentum, weight decay, batch size, grad-norm clip are the config's (the "
            "task's protocol defaults)",
        ),
    )
    Params = FMLParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        for name in ("alpha", "beta"):
            if not 0 <= getattr(p, name) <= 1:
                raise ConfigError(f"fml: {name} must be in [0, 1], got {getattr(p, name)}")
        self.meme_member = resolve_meme_arch(p.meme_arch, fed.pool, fed.info)

    def setup(self, fed: RoundView) -> None:
        if not hasattr(self, "meme_member"):
            self.check(fed)
        base = new_model(fed, self.meme_member, "meme-init")  # one shared initialization
        self.memes = [copy.deepcopy(base) for _ in fed.clients]
        self.meme_opts = [fed.make_optimizer(m) for m in self.memes]
        for client, meme, opt in zip(fed.clients, self.memes, self.meme_opts):
            client.hold(meme, opt)
        self.server = base  # the meme every client holds after a broadcast

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        broadcast = self.server.state_dict()
        for i in active:  # the last broadcast, written now into the memes that use it (module docstring)
            self.memes[i].load_state_dict(broadcast)
        with fed.timer(Phase.TRAINING):
            losses = [self.mutual_train(fed, i, make_plan(fed, i, rnd)) for i in active]
        with fed.timer(Phase.AGGREGATION):
            states = [fed.channel.send(i, SERVER, self.memes[i].state_dict(), Payload.PARAMS) for i in active]
            avg = weighted_average(states, [float(fed.clients[i].n_train) for i in active])
            self.server.load_state_dict(fed.channel.send(SERVER, list(range(fed.n_clients)), avg, Payload.PARAMS))
        return {"train_loss": sum(private for private, _ in losses) / len(losses),
                "meme_loss": sum(m for _, m in losses) / len(losses)}

    def mutual_train(self, fed, cid: int, plan) -> list[float]:
        """The private model and the meme, trained together over the client's plan: mean losses."""
        client, meme, p = fed.clients[cid], self.memes[cid], self.params
        trainees = [Trainee(client.model, client.optimizer, f"client {cid} (private)", cid),
                    Trainee(meme, self.meme_opts[cid], f"client {cid} (meme)", cid)]
        return fit(fed, plan, trainees, lambda b: mutual_losses(client.model(b.x), meme(b.x), b.y, p.alpha, p.beta))

    def endpoints(self, fed: RoundView) -> dict[str, list[nn.Module]]:
        return {"meme": [self.server] * fed.n_clients}

    def hparams(self) -> dict[str, Any]:
        out = super().hparams()
        member = getattr(self, "meme_member", None)
        if member is not None:
            out["meme_arch_used"] = member.model
        return out
