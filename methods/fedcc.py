"""FedCC: an "unknown" class and calibrated pseudo-labels on unlabeled public data against label skew
in distillation-based FL (Ye, Ayan, An, Carle, arXiv 2608.23031; methods spec, Sec. 7).

Models have C + 1 outputs. Per round each active client syncs to last round's broadcast on the
public set, trains CE on its data, then CE plus entropy-weighted pseudo-labels (majority class vs
"unknown") on the public set, and uploads its softmax there; the server weights clients by 1 -
p_unk, zeroes "unknown" and broadcasts. Headline: each client's model without the unknown logit;
extra endpoints ``ensemble`` and ``open-set`` (the paper's rules).

Fidelity: reconstructed (w_l's probe image is ours). The algorithm, what the suite tested and the
reasons for every choice: ``docs/reference/method-notes/fedcc.md`` (the method's reference page).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.families.transfer import broadcast, train_on_transfer, transfer_logits, upload
from hfl_bench.method_api import (
    ConfigError,
    EpochPlan,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    Trainee,
    derive_seed,
    fit,
    kd_loss,
    make_plan,
    new_model,
    param,
    predict_logits,
    register_method,
    soft_targets,
    train_client,
)

OPTIMIZERS = ("run", "adam")
TINY = 1e-12


@dataclass
class FedCCParams:
    optimizer: str = param("run", "run: the run's optimizer (--optimizer: the protocol's SGD, or Adam at --lr for "
                                  "every method of a comparison); adam: Adam at adam_lr for FedCC alone (the paper "
                                  "preset's).")
    adam_lr: float = param(1e-3, "Adam learning rate (paper: 1e-3).")
    tau: float = param(1.0, "Temperature of the uploaded predictions softmax(f / tau) and of the sync KL.")
    lam: float = param(0.2, "Weight lambda of the soft-CE on the pseudo-labeled public set.")
    delta: float = param(1e-3, "Smoothing of the predictions whose entropies give the weights: "
                               "(1 - delta) p + delta / C.")
    majority_share: float = param(0.02, "A class is a majority class of a client when its share of the client's "
                                        "training labels is above this.")
    sync_epochs: int = param(1, "Epochs over the public set toward the broadcast soft targets per round.")
    pseudo_epochs: int = param(1, "Epochs over the private data (with pseudo-labeled public batches) per round.")
    pseudo_in_budget: bool = param(True, "The pseudo-label step's epochs are part of the run's local epochs (the CE "
                                         "step runs the rest); false: the CE step runs all of them and the "
                                         "pseudo-label step comes on top.")


# ----------------------------------------------------------------------------- pseudo-labels


def known_probs(logits: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The prediction over the C known classes: softmax of the known logits (unknown dropped)."""
    return torch.softmax(logits[..., :num_classes].float(), dim=-1)


def smoothed_entropy(p: torch.Tensor, delta: float) -> torch.Tensor:
    """H((1 - delta) p + delta / C) in nats, over the last dimension."""
    q = (1 - delta) * p + delta / p.shape[-1]
    return -torch.special.xlogy(q, q).sum(dim=-1)


def majority_classes(counts: np.ndarray, share: float) -> torch.Tensor:
    """C_J as a [C] mask: classes above ``share`` of the client's labels; if none, the held ones
    (all classes for a client without data)."""
    counts = torch.as_tensor(np.asarray(counts), dtype=torch.float64)
    mask = counts > share * counts.sum()
    if not mask.any():
        mask = counts > 0 if (counts > 0).any() else torch.ones_like(mask)
    return mask


class PseudoWeights(NamedTuple):
    w_l: torch.Tensor  # [] entropy on the probe
    w_u: float  # log(C - |C_J| + 1)
    w_x: torch.Tensor  # [M] min(w_l, H(x))
    alpha: torch.Tensor  # [M] weight of the majority class m; 1 - alpha goes to "unknown"
    m: torch.Tensor  # [M] argmax over C_J


def pseudo_label_weights(probe_logits: torch.Tensor, public_logits: torch.Tensor, majority: torch.Tensor,
                         delta: float) -> PseudoWeights:
    """FedCC's per-client and per-sample weights from [C + 1] probe logits, [M, C + 1] public
    logits and the [C] majority mask."""
    c = majority.numel()
    majority = majority.to(public_logits.device)
    w_l = smoothed_entropy(known_probs(probe_logits, c), delta)
    w_u = math.log(c - int(majority.sum()) + 1)
    p = known_probs(public_logits, c)
    w_x = torch.minimum(smoothed_entropy(p, delta), w_l)
    alpha = (w_l - w_x) / (w_l + w_u).clamp_min(TINY)
    m = p.masked_fill(~majority, -1.0).argmax(dim=-1)  # probabilities are >= 0: -1 never wins
    return PseudoWeights(w_l, w_u, w_x, alpha, m)


def pseudo_labels(alpha: torch.Tensor, m: torch.Tensor, num_classes: int) -> torch.Tensor:
    """alpha onehot(m) + (1 - alpha) onehot(unknown): [M, C + 1]."""
    y = torch.zeros((len(alpha), num_classes + 1), device=alpha.device)
    y[torch.arange(len(alpha), device=alpha.device), m] = alpha
    y[:, num_classes] += 1 - alpha
    return y


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -(target * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


# ----------------------------------------------------------------------------- server


def aggregate_predictions(soft: torch.Tensor) -> torch.Tensor:
    """The server's soft targets from K clients' [K, M, C + 1] predictions: confidence weights
    mu_k(x) = (1 - p_unk^k(x)) / sum_k' (1 - p_unk^k'(x)), weighted mean, unknown entry zeroed,
    renormalized over the known classes. Returns [M, C + 1] (last column 0)."""
    k, c = soft.shape[0], soft.shape[-1] - 1
    conf = (1 - soft[..., c]).clamp_min(0)  # [K, M]
    total = conf.sum(dim=0, keepdim=True)
    mu = torch.where(total > 0, conf / total.clamp_min(TINY), torch.full_like(conf, 1.0 / k))
    agg = torch.einsum("km,kmc->mc", mu, soft)
    agg[:, c] = 0
    mass = agg.sum(dim=-1, keepdim=True)
    uniform = torch.full_like(agg, 1.0 / c)
    uniform[:, c] = 0
    return torch.where(mass > 0, agg / mass.clamp_min(TINY), uniform)


# ----------------------------------------------------------------------------- local steps


def private_epochs(local_epochs: int, p: FedCCParams) -> tuple[int, int]:
    """(CE-step epochs, pseudo-label-step epochs) per round on the private data: within the run's
    ``local_epochs`` (the protocol's budget), or with ``pseudo_in_budget`` false all of them for
    the CE step and ``pseudo_epochs`` on top."""
    if not p.pseudo_in_budget:
        return local_epochs, p.pseudo_epochs
    pseudo = min(p.pseudo_epochs, local_epochs)
    return local_epochs - pseudo, pseudo


def train_with_pseudo_labels(fed, cid: int, plan: EpochPlan, epochs: int, public_x: torch.Tensor,
                             pseudo: torch.Tensor, lam: float, rnd: int) -> float:
    """Step 4: CE on the plan's private batches + lam * soft-CE on pseudo-labeled public rows.

    The public set is spread evenly over the plan's batches (one seeded permutation per epoch), and
    each step runs private and public rows through the model as one batch."""
    client = fed.clients[cid]
    steps = len(plan.bounds)
    if steps == 0:
        return 0.0
    gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "fedcc-public", rnd, cid))
    order = torch.cat([torch.randperm(len(public_x), generator=gen) for _ in range(epochs)]).to(public_x.device)
    shares = torch.tensor_split(order, steps)  # the public rows each step adds

    def loss(b):
        pos = shares[b.step]
        logits = client.model(torch.cat([b.x, public_x[pos]]))
        n = b.end - b.start
        ce = F.cross_entropy(logits[:n], b.y)
        return [ce + lam * soft_cross_entropy(logits[n:], pseudo[pos]) if len(pos) else ce]

    trainee = Trainee(client.model, client.optimizer, f"client {cid} pseudo-label step")
    return fit(fed, plan, [trainee], loss)[0]


# ----------------------------------------------------------------------------- predictors


class KnownClasses(nn.Module):
    """A C + 1-output model as a C-class predictor: the unknown logit is dropped.

    The model is held in a plain list, not as a submodule, so the evaluator switching this
    wrapper's train/eval mode never touches the client's model (predict_logits restores its mode)."""

    def __init__(self, model: nn.Module, num_classes: int):
        super().__init__()
        self._model = [model]
        self.num_classes = num_classes

    def forward(self, x):
        return predict_logits(self._model[0], x)[:, : self.num_classes]


class ConfidenceEnsemble(nn.Module):
    """The paper's predictor: all clients' softmax(f / tau) aggregated like the server does
    (confidence-weighted, unknown zeroed, renormalized), as log-probabilities of the C known classes.

    One module shared by every client: ``FedCC.endpoints`` puts this same object in every client's
    place, so the evaluator runs it once per set of test inputs, not once per client. The models
    are held in a plain list, not as submodules (see KnownClasses)."""

    def __init__(self, models: list[nn.Module], num_classes: int, tau: float):
        super().__init__()
        self._models, self.num_classes, self.tau = list(models), num_classes, tau

    @torch.no_grad()
    def forward(self, x):
        soft = torch.stack([soft_targets(predict_logits(m, x), self.tau) for m in self._models])
        return torch.log(aggregate_predictions(soft)[:, : self.num_classes].clamp_min(TINY))


class OpenSetRule(nn.Module):
    """The paper's evaluation rule for a client's own model: argmax over all C + 1 outputs; a row is
    correct when the prediction is its class, or "unknown" while its class is outside the client's
    majority classes ``majority`` ([C] mask). Scored through ``hits`` (the evaluator's hook for an
    endpoint with a rule of its own); the model is held outside the module, as in KnownClasses."""

    def __init__(self, model: nn.Module, majority: torch.Tensor):
        super().__init__()
        self._model, self._majority = [model], [majority]

    def forward(self, x):
        return predict_logits(self._model[0], x)

    def hits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pred, unknown = logits.argmax(dim=-1), logits.shape[-1] - 1
        return (pred == y) | ((pred == unknown) & ~self._majority[0].to(y.device)[y])


# ----------------------------------------------------------------------------- the method


@register_method
class FedCC(Method):
    card = MethodCard(
        name="fedcc", fidelity="reconstructed", topology="server",
        version="1.2",
        changelog=(
            ("1.1", "The protocol's budget by default: the run's SGD, and the pseudo-label step's private epoch "
                    "inside the run's local epochs; 1.0's Adam and extra epoch are the \"paper\" preset."),
            ("1.2", "The extra endpoint \"open-set\" (the paper's local-model rule); optimizer=run follows the "
                    "run's --optimizer (training under the defaults unchanged)."),
        ),
        citation=("Ye, Ayan, An, Carle, FedCC: Towards Addressing Label Distribution Skews in Distillation-Based "
                 "Federated Learning, arXiv 2608.23031"),
        summary="C + 1 outputs, calibrated pseudo-labels on the unlabeled public set, confidence-weighted server.",
        transfer="public-unlabelled",
        why_single_modality="it needs a public set, and a public sample would hand recipients the modality they miss",
        presets={"paper": {"optimizer": "adam", "pseudo_in_budget": False}},
        notes=(
            "public set used unlabeled (its labels are never read)",
            "optimizer: the run's (--optimizer: the protocol's SGD, or Adam at --lr for every method of a suite), or "
            "with optimizer=adam (the paper preset's) Adam at adam_lr without weight decay for FedCC alone; kept "
            "across rounds; gradients clipped at the config's norm",
            "models rebuilt in setup with C + 1 outputs from each client's pool member, seeded derive_seed(seed, "
            "'init', cid)",
            "entropies in nats; H(x) like w_l: entropy of the delta-smoothed prediction over the C known classes "
            "(softmax of the known logits); the unknown entry plays no part in the weights",
            "w_l's probe image (our reconstruction; the summary does not give it): all zeros in normalized space "
            "(the per-channel training mean); w_l, H(x) and m from the model after the CE step, eval mode",
            "C_J: classes above 2% of the client's labels; if none, the classes it holds",
            "budget: the paper's 15 rounds x 20 local epochs replaced by the config's rounds and local epochs; per "
            "round, sync_epochs over the public set, then the private data's local epochs: the CE step, then "
            "pseudo_epochs (at most the local epochs) of the pseudo-label step over D_k; with pseudo_in_budget "
            "false, the CE step runs all the local epochs and the pseudo-label step comes on top",
            "with a single local epoch in budget, no separate CE step: w_l, H(x) and m from the model after sync",
            "pseudo-label step: each private batch joined by an equal share of a seeded permutation of the public "
            "set (one pass per epoch), one forward (BatchNorm sees both); CE mean + lambda soft-CE mean",
            "sync loss tau^2 KL(target || softmax(z / tau)), seeded epochs at the config's batch size; no "
            "augmentation of public inputs",
            "server broadcasts to every client (inactive ones keep the latest); uploads and pseudo-label "
            "predictions in eval mode",
            "fallbacks: uniform server weights where sum(1 - p_unk) = 0, uniform known target where no known mass "
            "is left; alpha = 0 when w_l + w_u = 0",
            "headline: each client's own model, argmax over the C known classes; extra endpoint 'ensemble' = the "
            "paper's confidence-weighted ensemble of all clients (the same predictor reported for each client)",
            "extra endpoint 'open-set' = the paper's local-model rule: argmax over C + 1 outputs, 'unknown' correct "
            "when the true class is outside the client's C_J (lenient; never the headline)",
        ),
    )
    Params = FedCCParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        if p.optimizer not in OPTIMIZERS:
            raise ConfigError(f"fedcc: optimizer={p.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if p.adam_lr <= 0 or p.tau <= 0:
            raise ConfigError("fedcc: adam_lr and tau must be > 0")
        if p.lam < 0:
            raise ConfigError(f"fedcc: lam must be >= 0, got {p.lam}")
        if not 0 <= p.delta < 1 or not 0 <= p.majority_share < 1:
            raise ConfigError("fedcc: delta and majority_share must be in [0, 1)")
        if p.sync_epochs < 0 or p.pseudo_epochs < 0:
            raise ConfigError("fedcc: sync_epochs and pseudo_epochs must be >= 0")

    def setup(self, fed: RoundView) -> None:
        p = self.params
        c = fed.num_classes
        for client in fed.clients:  # seeded like the engine's models, with the extra "unknown" output
            model = new_model(fed, client.arch, "init", client.cid, num_classes=c + 1)
            client.model = model
            client.optimizer = (torch.optim.Adam(model.parameters(), lr=p.adam_lr) if p.optimizer == "adam"
                                else fed.make_optimizer(model))
        self.majority = [majority_classes(client.train_counts, p.majority_share).to(fed.device)
                         for client in fed.clients]
        self.probe = torch.zeros((1, *fed.info.input_shape), device=fed.device)
        self.targets = torch.zeros((0, c + 1), device=fed.device)  # last broadcast; none before round 1

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        p = self.params
        c, x = fed.num_classes, fed.public_x
        ce_epochs, pseudo_epochs = private_epochs(fed.cfg.local_epochs, p)
        sync, ce, refine, alpha = [], [], [], []
        for cid in active:
            client = fed.clients[cid]
            with fed.timer(Phase.TRAINING):
                if len(self.targets) and p.sync_epochs:
                    sync.append(train_on_transfer(
                        fed, client.model, client.optimizer, x,
                        lambda z, pos: kd_loss(z, self.targets[pos], p.tau),
                        epochs=p.sync_epochs, seed_parts=("fedcc-sync", rnd, cid),
                        who=f"client {cid} sync"))
                if ce_epochs:
                    ce.append(train_client(fed, client, make_plan(fed, cid, rnd, epochs=ce_epochs)))
            if pseudo_epochs:
                with fed.timer(Phase.PSEUDO_LABELS):
                    w = pseudo_label_weights(predict_logits(client.model, self.probe)[0],
                                             predict_logits(client.model, x), self.majority[cid], p.delta)
                    alpha.append(float(w.alpha.mean()))
                with fed.timer(Phase.TRAINING):
                    plan = make_plan(fed, cid, rnd, epochs=pseudo_epochs, purpose="fedcc-pseudo")
                    refine.append(train_with_pseudo_labels(fed, cid, plan, pseudo_epochs, x,
                                                           pseudo_labels(w.alpha, w.m, c), p.lam, rnd))
        logits = transfer_logits(fed, {cid: fed.clients[cid].model for cid in active}, x)
        uploads = {cid: soft_targets(z, p.tau) for cid, z in logits.items()}  # float32 [M, C + 1]
        uploads = upload(fed, uploads, Payload.PROBS)  # what the server received
        with fed.timer(Phase.AGGREGATION):
            targets = aggregate_predictions(torch.stack([uploads[cid] for cid in active]))
        self.targets = broadcast(fed, targets, list(range(fed.n_clients)), Payload.PROBS)
        out = {}
        for name, values in (("train_loss", ce), ("sync_loss", sync), ("pseudo_loss", refine), ("alpha_mean", alpha)):
            if values:
                out[name] = float(np.mean(values))
        return out

    def eval_models(self, fed: RoundView) -> list[nn.Module]:
        return [KnownClasses(client.model, fed.num_classes) for client in fed.clients]

    def endpoints(self, fed: RoundView) -> dict[str, list[nn.Module]]:
        ensemble = ConfidenceEnsemble([c.model for c in fed.clients], fed.num_classes, self.params.tau)
        open_set = [OpenSetRule(c.model, self.majority[c.cid]) for c in fed.clients]
        return {"ensemble": [ensemble] * fed.n_clients,  # one predictor, shared by every client
                "open-set": open_set}
