"""Naive Shared: the shared-model control of FedSocket (Zhao, arXiv 2609.37582, Sec. 5.3, 6.2 and App.
O).

FedSocket with every FedSocket part removed: the same Q on the same fixed features, trained with
plain CE on each client's observed interface and averaged by plain sample-weighted FedAvg; Private
trained with plain CE; the same Private, Q and Joint endpoints and rho rule, budget and ``paper``
preset. A comparison of the two isolates what FedSocket adds.

Fidelity: reconstructed (the paper names the control; its training is ours). What is kept, what is
removed and why: ``docs/reference/method-notes/naive_shared.md`` (the method's reference page).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hfl_bench.families.shared_predictor import (
    ENDPOINTS,
    PAPER_BUDGET,
    PRETRAIN_STEPS,
    PRIVATE,
    Q_STAGE,
    SMOKE_PRETRAIN_SIZE,
    SharedPredictorClients,
    aggregate_q,
    build_feature_bank,
    check_extractor,
    new_shared_predictor,
    parse_grid,
    warm_up_private,
)
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    SmokeSettings,
    Trainee,
    fit,
    make_plan,
    param,
    register_method,
    require_at_least,
    train_client,
)

FALLBACK_RHO = 1.0  # a client without validation data


@dataclass
class NaiveSharedParams:
    extractor: str = param("pretrained", "Frozen feature extractor shared by all clients, as fedsocket's: pretrained "
                                         "(pretrained on data no client holds), or the ablations random-conv and "
                                         "random-projection (seeded, trained nowhere).")
    pretrain_steps: int = param(PRETRAIN_STEPS, "Adam steps (batch 64) of each pretrained encoder's pretraining "
                                                "(extractor=pretrained; fedsocket's).")
    feature_dim: int = param(256, "Dimension of the fixed features u = h(x).")
    hidden_dim: int = param(256, "Q's hidden width.")
    rank: int = param(32, "Rank of Q's gated low-rank residual.")
    private_lr: float | None = param(None, "SGD learning rate of the Private models; unset: the run's --lr (the "
                                           "protocol's budget).")
    q_lr: float = param(3e-4, "Adam learning rate of the local Q copies.")
    local_epochs: int | None = param(None, "Epochs of Private and of the Q copy per round; unset: the run's "
                                           "--local-epochs (the protocol's budget).")
    warmup_epochs: int = param(0, "Private-only CE epochs in setup, before round 1, on top of the rounds' budget.")
    rho_grid: str = param("0.25,0.5,1,2,4", "Comma-separated rho candidates for Joint inference, chosen per "
                                            "client on validation.")
    endpoint: str = param("private", "Headline (evaluated) predictor: private or joint; all three are reported.")


def train_private(fed, cid: int, rnd: int, p: NaiveSharedParams) -> float:
    """Private with plain CE for ``local_epochs`` epochs (None: the run's)."""
    plan = make_plan(fed, cid, rnd, epochs=p.local_epochs, purpose=PRIVATE)
    return train_client(fed, fed.clients[cid], plan, who=f"client {cid} private")


def train_q(fed, cid: int, rnd: int, q_copy, feats: torch.Tensor, p: NaiveSharedParams) -> float:
    """The local Q copy with plain CE on the client's own features (its observed interface)."""
    plan = make_plan(fed, cid, rnd, epochs=p.local_epochs, purpose=Q_STAGE)
    opt = torch.optim.Adam(q_copy.parameters(), lr=p.q_lr)
    trainee = Trainee(q_copy, opt, f"client {cid} Q copy", cid)
    return fit(fed, plan, [trainee], lambda b: [F.cross_entropy(q_copy(feats[b.idx]), b.y)])[0]


UPLOAD_KINDS = {"q": Payload.PARAMS, "n": Payload.COUNTS}


@register_method
class NaiveShared(SharedPredictorClients, Method):
    card = MethodCard(
        name="naive-shared", fidelity="reconstructed", topology="server",
        version="1.2",
        changelog=(
            ("1.1", "Private trains on the protocol's budget by default, as fedsocket 1.1 (the run's lr and local "
                    "epochs, no warm-up); 1.0's epochs, warm-up and private lr are the \"paper\" preset."),
            ("1.2", "The pretrained feature bank by default, as fedsocket 1.2 (1.1's: extractor=random-conv)."),
        ),
        citation=("Zhao, FedSocket: Recipient-Executable Knowledge Exchange for Heterogeneous Multimodal "
                 "Federated Learning, arXiv 2609.37582 (Naive Shared control, Sec. 5.3, 6.2, App. O)"),
        summary="FedSocket's Q, features and endpoints with plain CE training and plain FedAvg (the paper's control).",
        missing_modalities=True,
        why_not_tokens="its shared frozen extractor (a conv encoder or a random projection) maps input values, "
                       "not token ids",
        presets={"paper": PAPER_BUDGET},
        smoke=SmokeSettings(method_params={"pretrain_steps": "50"}, pretrain_size=SMOKE_PRETRAIN_SIZE),
        notes=(
            "[paper] FedSocket's shared-model control: matched parameter count, same partitions, private models, "
            "recipient interfaces, rounds and Joint selection rules; its training is not given in the summary",
            "[ours] Q = fedsocket's Q (same shapes, init seed 'fedsocket-q') on fedsocket's fixed features (the "
            "same bank: by default the same encoders pretrained on data no client holds, else the same seeded "
            "random ablations; per modality on a multimodal task, absent where a row lacks the modality)",
            "[ours] per round: Private with plain CE (the client's SGD; private_lr, when set, replaces the "
            "config's lr), then a fresh copy of the held Q with plain CE on the client's own features (its "
            "observed interface), each for the config's local epochs or the method's local_epochs when set "
            "with a fresh Adam(q_lr); no KD either way, no fusion loss, no label smoothing, no reliability "
            "weights, no conditional target",
            "[ours] Private warm-up: warmup_epochs of plain CE in setup (fedsocket's; none by default, the paper "
            "preset sets fedsocket's)",
            "[ours] upload {Q, sample count}; server: plain sample-weighted FedAvg of every block (no ownership "
            "of head rows or modality blocks), no stabilizer; sent to the round's active clients, current Q to "
            "stale active clients at round start",
            "[ours] endpoints private, q, joint and the rho rule as fedsocket (grid {0.25,0.5,1,2,4}, validation "
            "accuracy, ties by NLL then smaller rho, rho = 1 without validation data); headline Private unless "
            "endpoint=joint",
            "[ours] same seeded batch orders as fedsocket (plan purposes fedsocket-warmup/-private/-q)",
        ),
    )
    Params = NaiveSharedParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        require_at_least("naive-shared", p, ("pretrain_steps",), 1)
        check_extractor(p.extractor, fed, "naive-shared")
        if p.endpoint not in ENDPOINTS:
            raise ConfigError(f"naive-shared: endpoint={p.endpoint!r}; choose one of {', '.join(ENDPOINTS)}")
        parse_grid(p.rho_grid, "naive-shared")
        require_at_least("naive-shared", p, ("feature_dim", "hidden_dim", "rank"), 1)
        if p.local_epochs is not None and p.local_epochs < 1:
            raise ConfigError(f"naive-shared: local_epochs must be >= 1 (or unset: the run's), got {p.local_epochs}")
        if p.warmup_epochs < 0:
            raise ConfigError(f"naive-shared: warmup_epochs must be >= 0, got {p.warmup_epochs}")
        if (p.private_lr is not None and p.private_lr <= 0) or p.q_lr <= 0:
            raise ConfigError("naive-shared: private_lr and q_lr must be > 0")

    def setup(self, fed: RoundView) -> None:
        p = self.params
        with fed.timer(Phase.FEATURE_EXTRACTION):
            self.bank = build_feature_bank(fed, p.extractor, p.feature_dim, p.pretrain_steps)
        self.feats = self.bank.cached(0)
        self.init_clients(fed, new_shared_predictor(fed, p.feature_dim, p.hidden_dim, p.rank),
                          parse_grid(p.rho_grid, "naive-shared"), FALLBACK_RHO)
        if p.private_lr is not None:
            for c in fed.clients:
                for group in c.optimizer.param_groups:
                    group["lr"] = p.private_lr
        if p.warmup_epochs:
            with fed.timer(Phase.TRAINING):
                for cid in range(fed.n_clients):
                    warm_up_private(fed, cid, p.warmup_epochs, smoothing=0.0)
        self.init_endpoints(fed)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        p = self.params
        self.catch_up(fed, active)
        uploads, private_losses, q_losses = [], [], []
        for k in active:
            with fed.timer(Phase.TRAINING):
                private_losses.append(train_private(fed, k, rnd, p))
                q_copy = copy.deepcopy(self.held[k]).requires_grad_(True)
                q_losses.append(train_q(fed, k, rnd, q_copy, self.feats, p))
            n = int(fed.clients[k].train_counts.sum())
            uploads.append(fed.channel.send(k, SERVER, {"q": q_copy.state_dict(), "n": n}, UPLOAD_KINDS))
        with fed.timer(Phase.AGGREGATION):  # plain FedAvg: no ownership statistics, no stabilizer
            self.phi = aggregate_q(self.phi, [u["q"] for u in uploads], [u["n"] for u in uploads], keep=0.0)
            self.predictor_version += 1
        self.download(fed, list(active))
        self.calibrate(fed, active)
        return {"private_loss": float(np.mean(private_losses)), "q_loss": float(np.mean(q_losses)),
                "rho_mean": float(np.mean(self.rho))}
