"""DFML: Decentralized Federated Mutual Learning (Khalil et al., arXiv 2402.01863).

Serverless mutual learning: each round a drawn active client is the aggregator; every participant
sends it its model, each model trains K = ``--local-epochs`` epochs on the aggregator's data with a
weighted-softmax (class-prior) NLL plus KL to its peers, mixed by a cyclic alpha, and goes home.
Each client is evaluated with its peak model (stored when alpha peaks). Controls: ``eval=current``,
``wsm=false``, ``alpha_max=0``.

Fidelity: reconstructed (the alpha schedule, peak models and WSM clamp). The loss, the schedule and
the reasons for every choice: ``docs/reference/method-notes/dfml.md`` (the method's reference page).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.method_api import (
    LIVE_MODEL,
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    SmokeSettings,
    Trainee,
    derive_seed,
    fit,
    make_plan,
    param,
    register_method,
)

BETA_FLOOR = 1e-8  # smallest class proportion entering log beta (absent classes)
# The predictor a client is evaluated with (``eval``): its stored peak model (the paper's), or its
# live model.
EVAL_CHOICES = ("peak", "current")


# ----------------------------------------------------------------------------- pure pieces


def log_class_prior(class_counts, floor: float = BETA_FLOOR) -> torch.Tensor:
    """log beta_c from per-class counts, with proportions floored at ``floor`` (absent classes)."""
    counts = torch.as_tensor(np.asarray(class_counts), dtype=torch.float32)
    beta = counts / counts.sum().clamp_min(1.0)  # no data at all: every class gets the floor
    return beta.clamp_min(floor).log()


def weighted_log_softmax(logits: torch.Tensor, class_counts, floor: float = BETA_FLOOR) -> torch.Tensor:
    """WSM log-probabilities: log beta_c + z_c - logsumexp_k(log beta_k + z_k), beta from counts."""
    log_beta = log_class_prior(class_counts, floor).to(logits.device)
    return _wsm_log_probs(logits, log_beta)


def supervision_log_prior(class_counts, wsm: bool = True, floor: float = BETA_FLOOR) -> torch.Tensor | None:
    """What the supervised term's softmax is weighted by at an aggregator with ``class_counts``: its
    log class prior (WSM, ``wsm`` true) or None, the plain softmax (``wsm`` false)."""
    return log_class_prior(class_counts, floor) if wsm else None


def _wsm_log_probs(logits: torch.Tensor, log_beta: torch.Tensor | None) -> torch.Tensor:
    """WSM log-probabilities under ``log_beta``; the plain log-softmax when it is None."""
    z = logits.float()
    return torch.log_softmax(z if log_beta is None else z + log_beta, dim=-1)


def alpha_at(t: int, alpha_max: float, period: int) -> float:
    """Cyclic distillation weight: 0 at t = 0, alpha_max at t = period / 2."""
    return alpha_max * (1.0 - math.cos(2.0 * math.pi * t / period)) / 2.0


def is_peak(t: int, period: int) -> bool:
    return t % period == period // 2


def draw_aggregator(seed: int, rnd: int, active: list[int]) -> int:
    rng = np.random.default_rng(derive_seed(seed, "dfml-aggregator", rnd))
    return int(active[int(rng.integers(len(active)))])


def dfml_loss(logits: torch.Tensor, y: torch.Tensor, log_beta: torch.Tensor | None,
              peer_probs: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """(1 - alpha) NLL under WSM + alpha * mean over peers of KL(peer || student); ``log_beta`` None:
    the NLL under the plain softmax (``wsm=false``)."""
    nll = F.nll_loss(_wsm_log_probs(logits, log_beta), y)
    if not peer_probs:  # a lone participant has nothing to distill from
        return nll
    log_p = torch.log_softmax(logits.float(), dim=-1)
    kl = sum(F.kl_div(log_p, q, reduction="batchmean") for q in peer_probs) / len(peer_probs)
    return (1.0 - alpha) * nll + alpha * kl


# ----------------------------------------------------------------------------- the round


def mutual_learning(fed, plan, members: list[int], log_beta: torch.Tensor | None, alpha: float) -> list[float]:
    """Train every member's model over ``plan`` (the aggregator's data); mean loss per member."""
    models = [fed.clients[n].model for n in members]
    trainees = [Trainee(model, fed.clients[n].optimizer, f"client {n}", n) for n, model in zip(members, models)]

    def losses(b):
        logits = [model(b.x) for model in models]
        # Every prediction is taken before any model steps: no model teaches with an update
        # made on this very batch, and the update order does not matter.
        probs = [torch.softmax(z.detach().float(), dim=-1) for z in logits]
        return [dfml_loss(logits[i], b.y, log_beta, [q for j, q in enumerate(probs) if j != i], alpha)
                for i in range(len(models))]

    return fit(fed, plan, trainees, losses)


@dataclass
class DFMLParams:
    epochs: int | None = param(None, "Local epochs K at the aggregator per round; unset: the run's --local-epochs "
                                     "(the protocol's budget, as for every method).")
    alpha_max: float = param(0.8, "Peak distillation weight of the cyclic alpha schedule; 0: no distillation (the "
                                  "control for it).")
    period: int = param(10, "Period P of the alpha cycle in rounds (even; peaks at t mod P = P/2).")
    eval: str = param("peak", "Predictor each client is evaluated with (headline, validation, selected round): "
                              "peak, its model stored at its latest alpha peak (the paper's; its live model "
                              "until its first peak), or current, its live model as every other method's.")
    wsm: bool = param(True, "Supervise with the WSM (softmax weighted by the aggregator's class proportions); "
                            "false: the plain softmax (cross-entropy), the control for WSM.")


@register_method
class DFML(Method):
    card = MethodCard(
        name="dfml", fidelity="reconstructed", topology="p2p",
        peer_data=True,  # every model is trained with labels on the aggregator's shard
        predictor="stored snapshot",  # eval=peak (the default); eval=current: the live model (``predictor``)
        version="1.1",
        changelog=(("1.1", "K follows --local-epochs (1.0: K = 1 whatever the protocol)."),),
        citation="Khalil et al., DFML: Decentralized Federated Mutual Learning, arXiv 2402.01863, 2024",
        summary="Decentralized mutual learning at a random aggregator, WSM supervision, cyclic alpha, peak models.",
        smoke=SmokeSettings(method_params={"period": "2"}),
        notes=(
            "alpha_t = alpha_max (1 - cos(2 pi t / P)) / 2, t = rounds completed (reconstructed)",
            "peak model: a participant's model is copied at rounds with t mod P = P/2 and is what is evaluated "
            "(eval=peak, the default); current model until the first peak (reconstructed)",
            "WSM: class proportions floored at 1e-8 before the log, so absent classes get ~0 probability (spec: clamp)",
            "teachers: every model's train-mode prediction on the batch, taken before any model steps, detached; "
            "KL at temperature 1, mean over peers (reconstructed)",
            "aggregator drawn uniformly from the active clients, seeded; every active client participates "
            "(reconstructed)",
            "K = the run's local epochs over the aggregator's data per round (the protocol's budget) unless epochs is "
            "set; owner's optimizer state kept",
            "a lone participant trains with the WSM loss alone",
            "optimizer: the owner's SGD; lr, momentum, weight decay, batch size, grad-norm clip are the config's "
            "(the task's protocol defaults)",
            "every model is trained with labels on the aggregator's data: client models are trained on peers' "
            "data (model travel), beyond predictions",
            "controls: eval=peak (default, the paper's predictor) or eval=current (each client's live model, no "
            "peak stored); wsm=true (default) or wsm=false (plain softmax); alpha_max=0: no distillation",
        ),
    )
    Params = DFMLParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        if not 0 <= p.alpha_max <= 1:
            raise ConfigError(f"alpha_max must be in [0, 1], got {p.alpha_max}")
        if p.period < 2 or p.period % 2:
            raise ConfigError(f"period must be an even integer >= 2 (alpha peaks at P/2), got {p.period}")
        if p.epochs is not None and p.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {p.epochs}")
        if p.eval not in EVAL_CHOICES:
            raise ConfigError(f"eval must be {' or '.join(EVAL_CHOICES)}, got {p.eval!r}")

    def setup(self, fed: RoundView) -> None:
        self.peaks: dict[int, nn.Module] = {}
        self.changed: list[int] = []

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        p = self.params
        t = rnd - 1
        alpha = alpha_at(t, p.alpha_max, p.period)
        a = draw_aggregator(fed.cfg.seed, rnd, active)
        members = [a] + [n for n in active if n != a]
        for n in members[1:]:  # the aggregator trains what it received
            fed.clients[n].model.load_state_dict(fed.channel.send(n, a, fed.clients[n].model.state_dict(),
                                                                  Payload.PARAMS))
        log_beta = supervision_log_prior(fed.clients[a].train_counts, p.wsm)
        if log_beta is not None:
            log_beta = log_beta.to(fed.device)
        plan = make_plan(fed, a, rnd, epochs=p.epochs)
        with fed.timer(Phase.TRAINING):
            losses = mutual_learning(fed, plan, members, log_beta, alpha)
        for n in members[1:]:  # and each owner keeps what came back
            fed.clients[n].model.load_state_dict(fed.channel.send(a, n, fed.clients[n].model.state_dict(),
                                                                  Payload.PARAMS))
        if p.eval == "current":  # every participant's live model changed; no peak model is kept
            self.changed = sorted(members)
        else:
            peak = is_peak(t, p.period)
            if peak:
                for n in members:
                    self._store_peak(fed, n)
            # The evaluated model changes at a peak, or every round for a client without a peak yet.
            self.changed = sorted(n for n in members if peak or n not in self.peaks)
        return {"train_loss": sum(losses) / len(losses), "alpha": alpha, "aggregator": float(a)}

    def _store_peak(self, fed, n: int) -> None:
        model = fed.clients[n].model
        if n in self.peaks:
            self.peaks[n].load_state_dict(model.state_dict())
        else:
            self.peaks[n] = copy.deepcopy(model)
            for q in self.peaks[n].parameters():  # a stored predictor needs no gradients
                q.grad = None
                q.requires_grad_(False)

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        return self.changed

    def load_state_dict(self, state: dict[str, Any], fed: RoundView) -> None:
        # Peak models are created lazily (at a client's first peak): create the checkpoint's
        # ones first, so that the generic load fills them in place.
        for n in state.get("peaks", {}):
            self._store_peak(fed, n)
        super().load_state_dict(state, fed)

    def predictor(self) -> str:
        return LIVE_MODEL if self.params.eval == "current" else self.card.predictor

    def eval_models(self, fed: RoundView) -> list[nn.Module]:
        if self.params.eval == "current":
            return [c.model for c in fed.clients]
        return [self.peaks.get(i, c.model) for i, c in enumerate(fed.clients)]
