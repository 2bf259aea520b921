"""FedL2G: learning to guide local training in heterogeneous federated learning (Zhang, Liu, Hua, Cao,
Yang; arXiv 2410.06490, 2024).

A server-held guiding vector per class pulls local features by MSE (``space=logit``: the outputs).
Each round every active client takes a differentiable SGD step on a study batch and sends the
gradient of its quiz loss on the guides; the server averages it per class and steps. Clients do not
train during a warm-up share of the rounds.

Fidelity: paper, with HtFLlib's and FedL2G's repository settings where the paper is silent. Every
choice: ``docs/reference/method-notes/fedl2g.md`` (the method's reference page).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from hfl_bench.families.feature_head import FeatureHeadModel, split_client_models
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Data,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    Trainee,
    fit,
    make_plan,
    param,
    register_method,
    require_at_least,
    seeded_init,
)

SERVER_LR = {"feat": 100.0, "logit": 0.1}  # FedL2G's run script (run_me.sh)
SERVER_CLIP = 100.0  # HtFLlib's clip of the averaged guide gradient
SPACES = tuple(SERVER_LR)


@dataclass
class FedL2GParams:
    feature_dim: int = param(0, "Feature width d of the client models' split (the feature guides are C x d); 0 = the "
                                "pool's largest native feature size; HtFLlib uses 512.")
    space: str = param("feat", "Where the guides act: feat (features, C x d; FedL2G's main variant) or logit "
                               "(outputs, C x C).")
    server_lr: float = param(0.0, "Server SGD learning rate of the guides; 0 = the variant's (feat 100, logit 0.1, "
                                  "FedL2G's run script).")
    warm_up: float = param(0.025, "Share of the run's rounds (rounded) in which clients do not train, only the guides "
                                  "are meta-learned; HtFLlib: 50 of 2000 rounds.")
    meta_study_batches: int = param(1, "Study batches of the differentiable meta step.")
    meta_quiz_batches: int = param(1, "Quiz batches the stepped copy is tested on (the quiz set is this many batches).")


def guided_outputs(model: nn.Module, x: torch.Tensor, space: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(what the guides pull: features or logits, the logits)."""
    f = model.forward_features(x)
    logits = model.head(f)
    return (f if space == "feat" else logits), logits


def guided_loss(guided: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, guides: torch.Tensor) -> torch.Tensor:
    """CE + MSE toward each sample's class guide (weight 1)."""
    return F.cross_entropy(logits, y) + F.mse_loss(guided, guides[y])


class Guided(nn.Module):
    """``model``'s guided outputs and logits as one forward, for ``functional_call``."""

    def __init__(self, model: FeatureHeadModel, space: str):
        super().__init__()
        self.model, self.space = model, space

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return guided_outputs(self.model, x, self.space)


def meta_gradient(model: FeatureHeadModel, guides: torch.Tensor, study: list[tuple[torch.Tensor, torch.Tensor]],
                  quiz: list[tuple[torch.Tensor, torch.Tensor]], lr: float, space: str) -> torch.Tensor:
    """d(quiz CE of the model after one differentiable SGD step of the guided loss on ``study``)
    / d(guides): ``[C, width]``. The model, its gradients and its buffers are left unchanged."""
    guides = guides.detach().requires_grad_(True)
    wrapper = Guided(model, space)
    params = {f"model.{n}": p for n, p in model.named_parameters()}
    buffers = {f"model.{n}": b.clone() for n, b in model.named_buffers()}  # BatchNorm statistics kept
    was_training = model.training
    model.train()
    try:
        study_loss = sum(guided_loss(*functional_call(wrapper, (params, buffers), (x,)), y, guides)
                         for x, y in study) / len(study)
        grads = torch.autograd.grad(study_loss, list(params.values()), create_graph=True, allow_unused=True)
        stepped = {n: p if g is None else p - lr * g for (n, p), g in zip(params.items(), grads)}
        quiz_loss = sum(F.cross_entropy(functional_call(wrapper, (stepped, buffers), (x,))[1], y)
                        for x, y in quiz) / len(quiz)
        (out,) = torch.autograd.grad(quiz_loss, [guides])
    finally:
        model.train(was_training)
    return out.detach()


def present_rows(grad: torch.Tensor) -> dict[int, torch.Tensor]:
    """The rows of a guide gradient that are not all zero, by class (what a client sends)."""
    return {c: grad[c].clone() for c in range(len(grad)) if bool(grad[c].abs().sum() > 0)}


def average_rows(received: list[dict[int, torch.Tensor]], shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """Per class, the mean of the rows received for it; zero for a class nobody sent."""
    out = torch.zeros(shape, dtype=like.dtype, device=like.device)
    for c in range(shape[0]):
        rows = [r[c] for r in received if c in r]
        if rows:
            out[c] = torch.stack(rows).mean(0)
    return out


def warm_up_rounds(share: float, rounds: int) -> int:
    return int(share * rounds + 0.5)


@register_method
class FedL2G(Method):
    card = MethodCard(
        name="fedl2g", version="1.0", fidelity="paper", topology="server",
        citation="Zhang, Liu, Hua, Cao, Yang, FedL2G: Learning to Guide Local Training in Heterogeneous Federated "
                 "Learning, arXiv 2410.06490, 2024",
        summary="Server-held per-class guiding vectors pull local features; meta-learned from clients' quiz gradients.",
        # missing modalities: reads inputs only through the clients' own models
        missing_modalities=True,
        notes=(
            "guides in feature space by default (space), drawn from N(0, 1); guide weight 1 (as HtFLlib)",
            "warm-up a share of the run's rounds (HtFLlib: 50 of 2000 rounds, the same share)",
            "quiz set: a seeded draw fixed for the run, at most half a client's training samples; training and study "
            "batches walk the rest (HtFLlib: the first samples of the training list)",
            "meta step: one differentiable plain SGD step at the run's lr on the study batches; the model and its "
            "BatchNorm statistics unchanged",
            "server: per-class mean of the non-zero rows received, clipped at norm 100, one plain SGD step "
            "(as HtFLlib)",
            "guides sent to the round's active clients (HtFLlib reads them from disk, unmetered)",
            "meta step's study batches counted as private training steps; a free-rider still sends the "
            "meta-gradient of its untrained model",
            "local training: the run's optimizer and gradient clipping (HtFLlib clips at 100)",
        ),
    )
    Params = FedL2GParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        if p.space not in SPACES:
            raise ConfigError(f"fedl2g: space must be one of {', '.join(SPACES)}, got {p.space!r}")
        if not 0 <= p.warm_up < 1:
            raise ConfigError(f"fedl2g: warm_up is a share of the run's rounds in [0, 1), got {p.warm_up}")
        if p.server_lr < 0:
            raise ConfigError(f"fedl2g: server_lr must be >= 0 (0 = the variant's), got {p.server_lr}")
        require_at_least("fedl2g", p, ("meta_study_batches", "meta_quiz_batches"), 1)

    def setup(self, fed: RoundView) -> None:
        self.check(fed)
        p = self.params
        width = split_client_models(fed, p.feature_dim, "fedl2g-head")
        with seeded_init(fed, "fedl2g-guides"):
            self.guides = nn.Embedding(fed.num_classes, width if p.space == "feat" else fed.num_classes).to(fed.device)
        self.server_opt = torch.optim.SGD(self.guides.parameters(), lr=p.server_lr or SERVER_LR[p.space])
        self.quiz_sizes = [min(p.meta_quiz_batches * fed.cfg.batch_size, c.n_train // 2) for c in fed.clients]
        self.warm_up_rounds = warm_up_rounds(p.warm_up, fed.cfg.rounds)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        guide_kind = Payload.FEATURES if self.params.space == "feat" else Payload.LOGITS
        guides = fed.channel.send(SERVER, active, self.guides.weight.detach().clone(), guide_kind)
        losses, received = [], []
        self.trained = rnd > self.warm_up_rounds
        with fed.timer(Phase.TRAINING):
            for cid in active:
                if self.trained:
                    losses.append(self.guided_train(fed, cid, rnd, guides))
                grad = self.meta_step(fed, cid, rnd, guides)
                received.append(fed.channel.send(cid, SERVER, present_rows(grad), Payload.PARAMS))
        with fed.timer(Phase.AGGREGATION):
            self.server_step(fed, received)
        return {"train_loss": sum(losses) / len(losses)} if losses else {}

    def guided_train(self, fed: RoundView, cid: int, rnd: int, guides: torch.Tensor) -> float:
        client, space = fed.clients[cid], self.params.space
        plan = make_plan(fed, cid, rnd, hold_out=self.quiz_sizes[cid])
        trainee = Trainee(client.model, client.optimizer, f"client {cid}", cid)
        return fit(fed, plan, [trainee], lambda b: [guided_loss(*guided_outputs(client.model, b.x, space), b.y,
                                                                guides)])[0]

    def meta_step(self, fed: RoundView, cid: int, rnd: int, guides: torch.Tensor) -> torch.Tensor:
        """The client's quiz gradient on the guides (its meta work counted as private steps)."""
        p, q = self.params, self.quiz_sizes[cid]
        study_plan = make_plan(fed, cid, rnd, epochs=1, purpose="fedl2g-study", hold_out=q)
        quiz_plan = make_plan(fed, cid, rnd, epochs=1, purpose="fedl2g-quiz", hold_out=q, held=True)
        study = [(b.x, b.y) for b in islice(study_plan.batches(fed), p.meta_study_batches)]
        quiz = [(b.x, b.y) for b in islice(quiz_plan.batches(fed), p.meta_quiz_batches)]
        fed.budget.add(cid, Data.PRIVATE, len(study), sum(len(y) for _, y in study))
        return meta_gradient(fed.clients[cid].model, guides, study, quiz, fed.cfg.lr, p.space)

    def server_step(self, fed: RoundView, received: list[dict[int, torch.Tensor]]) -> None:
        """One SGD step of the guides on the per-class mean of the received rows."""
        weight = self.guides.weight
        self.server_opt.zero_grad(set_to_none=True)
        weight.grad = average_rows(received, weight.shape, weight)
        nn.utils.clip_grad_norm_(self.guides.parameters(), SERVER_CLIP)
        self.server_opt.step()
        fed.budget.add(SERVER, Data.SERVER, 1, 0)

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        return active if self.trained else []  # in the warm-up no model changes

    def hparams(self) -> dict[str, Any]:
        out = super().hparams()
        if hasattr(self, "warm_up_rounds"):
            out["warm_up_rounds_used"] = self.warm_up_rounds
        return out
