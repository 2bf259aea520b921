"""FedKD: communication-efficient federated learning via knowledge distillation (Wu, Wu, Lyu, Huang,
Xie; Nature Communications 13, 2022).

Each client holds a private mentor, a copy of a shared mentee and a private W_h mapping mentee to
mentor features; both models learn from the labels and from each other (KL and hidden MSE scaled by
1 / (CE_mentor + CE_mentee)). Only the mentee travels, SVD-compressed at a growing energy share,
uniformly averaged. The mentor is evaluated; the mentee is the extra endpoint ``mentee``.

Fidelity: paper, where HtFLlib departs from it in four places. The losses and every choice:
``docs/reference/method-notes/fedkd.md`` (the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.families.feature_head import native_width, split_client_models
from hfl_bench.families.shared_model import client_copies, resolve_meme_arch, split_shared_model, weighted_average
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
    param,
    register_method,
    seeded_init,
)

Compressed = torch.Tensor | dict[str, torch.Tensor]  # a raw tensor, or its factors {"u", "s", "vh"}


@dataclass
class FedKDParams:
    feature_dim: int = param(0, "Feature width of the mentor / mentee split (W_h is feature_dim x feature_dim); "
                                "0 = the pool's largest native feature size; HtFLlib uses 512.")
    mentee_lr: float = param(0.0, "The mentee's SGD learning rate; 0 = the run's lr (HtFLlib's default equals its lr).")
    t_start: float = param(0.95, "Energy share the SVD keeps in the first round (HtFLlib -Ts).")
    t_end: float = param(0.98, "Energy share the SVD keeps in the last round, reached linearly (HtFLlib -Te).")
    shared_arch: str = param("auto", "Mentee architecture shared by all clients: a pool member's label or a timm "
                                     "model name; 'auto' = the pool's smallest member by parameter count.")


# ----------------------------------------------------------------------------- the losses


def mutual_losses(r: torch.Tensor, z: torch.Tensor, r_g: torch.Tensor, z_g: torch.Tensor, w_h: nn.Module,
                  y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(L_mentor, the mentee's task and KL terms, the mentee's hidden term): the last two sum to
    L_mentee; the hidden term is W_h's loss too. The other model's outputs and the scale S are
    constants in each loss, so each module gets exactly its own loss's gradient."""
    ce, ce_g = F.cross_entropy(z, y), F.cross_entropy(z_g, y)
    scale = (ce + ce_g).detach()
    mapped = w_h(r_g)
    l_mentor = (ce + kd_loss(z, torch.softmax(z_g.detach().float(), -1), 1.0) / scale
                + F.mse_loss(r, mapped.detach()) / scale)
    l_mentee = ce_g + kd_loss(z_g, torch.softmax(z.detach().float(), -1), 1.0) / scale
    l_hidden = F.mse_loss(r.detach(), mapped) / scale
    return l_mentor, l_mentee, l_hidden


# ----------------------------------------------------------------------------- SVD compression


def energy_rank(energies: torch.Tensor, share: float) -> int:
    """The smallest rank k whose first k energies sum to more than ``share`` of the total; the full
    rank when only it does (HtFLlib returns 0 there, zeroing the tensor)."""
    cum = energies.cumsum(0)
    above = torch.nonzero(cum > share * cum[-1])
    return int(above[0]) + 1 if len(above) else len(energies)


def compress(t: torch.Tensor, share: float) -> Compressed:
    """``t`` as SVD factors keeping ``share`` of its energy: a matrix by one SVD, a higher-order
    tensor (a conv kernel) by one SVD per slice of its last two axes with one rank for all slices;
    raw: a vector, a tensor whose first axis is 1, an all-zero tensor, and a tensor whose factors
    would hold as many values as it does."""
    if t.dim() < 2 or t.shape[0] <= 1:
        return t.detach().clone()
    u, s, vh = torch.linalg.svd(t.detach(), full_matrices=False)
    energies = (s**2).reshape(-1, s.shape[-1]).sum(0)
    if float(energies.sum()) == 0:
        return t.detach().clone()
    k = energy_rank(energies, share)
    factors = {"u": u[..., :k].contiguous(), "s": s[..., :k].contiguous(), "vh": vh[..., :k, :].contiguous()}
    if sum(f.numel() for f in factors.values()) >= t.numel():  # no smaller than the tensor: not a compression
        return t.detach().clone()
    return factors


def reconstruct(c: Compressed) -> torch.Tensor:
    if isinstance(c, torch.Tensor):
        return c
    return (c["u"] * c["s"].unsqueeze(-2)) @ c["vh"]


def compress_state(state: dict[str, torch.Tensor], share: float) -> dict[str, Compressed]:
    return {name: compress(t, share) for name, t in state.items()}


def reconstruct_state(compressed: dict[str, Compressed]) -> dict[str, torch.Tensor]:
    return {name: reconstruct(c) for name, c in compressed.items()}


def energy_share(rnd: int, rounds: int, t_start: float, t_end: float) -> float:
    """The energy share of round ``rnd`` (1-based): linear from t_start (round 1) to t_end (the last)."""
    if rounds <= 1:
        return t_start
    return t_start + (rnd - 1) / (rounds - 1) * (t_end - t_start)


def mentee_params(mentee: nn.Module) -> dict[str, torch.Tensor]:
    """What is shared of a mentee: its parameters (its buffers stay with the client)."""
    return {name: p.detach() for name, p in mentee.named_parameters()}


# ----------------------------------------------------------------------------- the method


@register_method
class FedKD(Method):
    card = MethodCard(
        name="fedkd", version="1.0", fidelity="paper", topology="server",
        citation="Wu, Wu, Lyu, Huang, Xie, Communication-efficient federated learning via knowledge distillation, "
                 "Nature Communications 13, 2022",
        summary="Private mentor plus a shared mentee (adaptive mutual distillation); SVD-compressed mentee averaging.",
        # missing modalities: mentor and mentee are pool models, which fuse the modalities a row has
        missing_modalities=True,
        notes=(
            "mentee architecture: the pool's smallest member by parameter count unless shared_arch names one; "
            "mentor and mentee split to one feature width (W_h square)",
            "task-loss scale S a constant in the gradient (paper; HtFLlib back-propagates through it)",
            "KL summed over classes, averaged over the batch (paper; HtFLlib also divides by the class count)",
            "each model steps on its own loss with the other's outputs constant, W_h on the mentee's hidden loss "
            "(paper; HtFLlib back-propagates both losses into all three modules)",
            "SVD rank: the smallest holding the energy share; the full rank when only it does (HtFLlib: zeros)",
            "energy share linear from t_start at round 1 to t_end at this run's last round (HtFLlib: over 2000 rounds)",
            "conv kernels: one SVD per kh x kw slice with a shared rank, as HtFLlib (paper silent)",
            "vectors sent raw; buffers (BatchNorm statistics) stay with each client, as HtFLlib",
            "a tensor whose factors hold as many values as it does is sent raw (HtFLlib sends the factors)",
            "server: uniform mean of the reconstructed uploads, compressed again, sent to every client (as HtFLlib)",
            "mentees start from one seeded initialization, W_h from another (no initial download metered)",
            "optimizer: the run's SGD per module (the mentee at mentee_lr); each keeps its momentum across rounds",
        ),
    )
    Params = FedKDParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        if not 0 < p.t_start <= 1 or not 0 < p.t_end <= 1:
            raise ConfigError(f"fedkd: t_start and t_end must be in (0, 1], got {p.t_start} and {p.t_end}")
        if p.mentee_lr < 0:
            raise ConfigError(f"fedkd: mentee_lr must be >= 0 (0 = the run's lr), got {p.mentee_lr}")
        self.mentee_member = resolve_meme_arch(p.shared_arch, fed.pool, fed.info, "fedkd", "shared_arch")
        native_width(self.mentee_member, fed.info)  # refuses a mentee without a feature / head split

    def setup(self, fed: RoundView) -> None:
        if not hasattr(self, "mentee_member"):
            self.check(fed)
        width = split_client_models(fed, self.params.feature_dim, "fedkd-head")
        self.mentees = client_copies(split_shared_model(fed, self.mentee_member, width, "fedkd-mentee"), fed.n_clients)
        with seeded_init(fed, "fedkd-w_h"):
            w_h = nn.Linear(width, width, bias=False).to(fed.device)
        self.w_h = client_copies(w_h, fed.n_clients)
        self.mentee_opts = [fed.make_optimizer(m) for m in self.mentees]
        if self.params.mentee_lr > 0:
            for opt in self.mentee_opts:
                for group in opt.param_groups:
                    group["lr"] = self.params.mentee_lr
        self.w_opts = [fed.make_optimizer(w) for w in self.w_h]

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        share = energy_share(rnd, fed.cfg.rounds, self.params.t_start, self.params.t_end)
        with fed.timer(Phase.TRAINING):
            losses = [self.mutual_train(fed, i, rnd) for i in active]
        with fed.timer(Phase.AGGREGATION):
            uploads = [fed.channel.send(i, SERVER, compress_state(mentee_params(self.mentees[i]), share),
                                        Payload.PARAMS) for i in active]
            avg = weighted_average([reconstruct_state(u) for u in uploads], [1.0] * len(uploads))
            sent = fed.channel.send(SERVER, list(range(fed.n_clients)), compress_state(avg, share), Payload.PARAMS)
            received = reconstruct_state(sent)
            with torch.no_grad():
                for mentee in self.mentees:
                    for name, q in mentee.named_parameters():
                        q.copy_(received[name])
        return {"train_loss": sum(m for m, _, _ in losses) / len(losses),
                "mentee_loss": sum(g + h for _, g, h in losses) / len(losses),
                "energy_share": share}

    def mutual_train(self, fed: RoundView, cid: int, rnd: int) -> list[float]:
        """Mentor, mentee and W_h stepped together over the client's plan: their mean losses."""
        mentor, mentee, w_h = fed.clients[cid].model, self.mentees[cid], self.w_h[cid]
        trainees = [Trainee(mentor, fed.clients[cid].optimizer, f"client {cid} (mentor)", cid),
                    Trainee(mentee, self.mentee_opts[cid], f"client {cid} (mentee)", cid),
                    Trainee(w_h, self.w_opts[cid], f"client {cid} (W_h)", cid)]

        def losses(b):
            r, r_g = mentor.forward_features(b.x), mentee.forward_features(b.x)
            return mutual_losses(r, mentor.head(r), r_g, mentee.head(r_g), w_h, b.y)

        return fit(fed, make_plan(fed, cid, rnd), trainees, losses)

    def endpoints(self, fed: RoundView) -> dict[str, list[nn.Module]]:
        return {"mentee": list(self.mentees)}

    def hparams(self) -> dict[str, Any]:
        out = super().hparams()
        member = getattr(self, "mentee_member", None)
        if member is not None:
            out["shared_arch_used"] = member.model
        return out
