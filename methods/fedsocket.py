"""FedSocket style (Zhao, "FedSocket: Recipient-Executable Knowledge Exchange for Heterogeneous
Multimodal Federated Learning", arXiv 2609.37582), on single-modality tasks and on one with missing
modalities.

Only a shared predictor Q on frozen, pretrained features (and counts) crosses the network. Q teaches
each client's Private model and Private teaches the local Q copy (reliability-weighted KD; donors
through every recipient interface: the conditional target); the server averages Q by ownership with
a 0.5 stabilizer. Endpoints Private, Q and Joint; the paper's controls are hyperparameters
(``CONTROLS``). Shared parts: ``hfl_bench.families.shared_predictor``.

Fidelity: reconstructed (small encoders pretrained here, not the paper's ResNet-18). The losses, the
controls and every [paper] / [ours] choice: ``docs/reference/method-notes/fedsocket.md`` (the
method's reference page).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
    client_present_rows,
    interface_mask,
    joint_score,
    joint_weights,
    new_shared_predictor,
    parse_grid,
    private_teacher_logits,
    recipient_interfaces,
    restrict,
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
    register_method,
    require_at_least,
    train_client,
)

EPS = 1e-12


# The paper's controls (docs/reference/method-notes/fedsocket.md) and the hyperparameters that make
# each (--set key=value).
CONTROLS = {"label-q": {"q_teacher": "none"}, "no-return": {"q_return": "off"},
            "matched-ensemble": {"share_q": "off"}}
ON_OFF = ("on", "off")
Q_TEACHERS = ("private", "none")


@dataclass
class FedSocketParams:
    extractor: str = field(default="pretrained", metadata={
        "help": "Frozen feature extractor shared by all clients: pretrained (an encoder pretrained on data no "
                "client holds: the task's generator, else --pretrain-size's split), or the ablations "
                "random-conv and random-projection (seeded, trained nowhere)."})
    pretrain_steps: int = field(default=PRETRAIN_STEPS, metadata={
        "help": "Adam steps (batch 64) of each pretrained encoder's supervised pretraining (extractor=pretrained)."})
    feature_dim: int = field(default=256, metadata={"help": "Dimension of the fixed features u = h(x)."})
    hidden_dim: int = field(default=256, metadata={"help": "Q's hidden width."})
    rank: int = field(default=32, metadata={"help": "Rank of Q's gated low-rank residual."})
    lambda_kd: float = field(default=0.5, metadata={"help": "Weight of Q -> Private reliability-weighted KD."})
    lambda_fus: float = field(default=0.25, metadata={"help": "Weight of the fusion CE on the Joint score."})
    lambda_rel: float = field(default=0.2, metadata={"help": "Weight of Private -> Q reliability-weighted KD."})
    label_smoothing: float = field(default=0.1, metadata={"help": "Label smoothing of both CE_ls terms."})
    temperature: float = field(default=2.0, metadata={"help": "Distillation temperature of the KD terms."})
    private_lr: float | None = field(default=None, metadata={
        "help": "SGD learning rate of the Private models; unset: the run's --lr (the protocol's budget)."})
    q_lr: float = field(default=3e-4, metadata={"help": "Adam learning rate of the local Q copies."})
    local_epochs: int | None = field(default=None, metadata={
        "help": "Epochs of each stage (Q->Private, Private->Q) per round; unset: the run's --local-epochs "
                "(the protocol's budget)."})
    warmup_epochs: int = field(default=0, metadata={
        "help": "Private-only CE_ls epochs in setup (Stage I), before round 1, on top of the rounds' budget."})
    server_keep: float = field(default=0.5, metadata={
        "help": "Server stabilizer: phi = keep * phi_old + (1 - keep) * average."})
    fusion_rho: float = field(default=1.0, metadata={"help": "rho of the Joint weights inside the fusion CE."})
    rho_grid: str = field(default="0.25,0.5,1,2,4", metadata={
        "help": "Comma-separated rho candidates for Joint inference, chosen per client on validation."})
    endpoint: str = field(default="private", metadata={
        "help": "Headline (evaluated) predictor: private or joint; all three are reported."})
    q_teacher: str = field(default="private", metadata={
        "help": "Who teaches the local Q copy besides the labels: private (FedSocket) or none (the Label Q "
                "control: CE only)."})
    q_return: str = field(default="on", metadata={
        "help": "Q teaches Private (KD and fusion CE): on (FedSocket) or off (the No return control: Private "
                "trains with CE alone)."})
    share_q: str = field(default="on", metadata={
        "help": "Q is uploaded and averaged: on (FedSocket) or off (each client keeps its own Q, never shared: the "
                "matched-capacity ensemble control)."})


# ----------------------------------------------------------------------------- FedSocket's losses


def reliability_weights(probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """w_i = (1 - H(t_i)/log C) * (0.25 + 0.75 [argmax t_i == y_i]) for teacher predictions t [B, C]."""
    c = probs.shape[-1]
    entropy = -torch.special.xlogy(probs, probs).sum(-1)
    confidence = (1 - entropy / math.log(c)).clamp(0, 1) if c > 1 else torch.ones_like(entropy)
    correct = (probs.argmax(-1) == y).to(probs.dtype)
    return confidence * (0.25 + 0.75 * correct)


def weighted_kd(student_logits: torch.Tensor, target_probs: torch.Tensor, weights: torch.Tensor,
                temperature: float) -> torch.Tensor:
    """T^2 * mean_i w_i KL(target_i || softmax(z_i / T)); weights not renormalized on purpose."""
    log_p = F.log_softmax(student_logits / temperature, dim=-1)
    kl = (torch.special.xlogy(target_probs, target_probs) - target_probs * log_p).sum(-1)
    return temperature**2 * (weights * kl).mean()


def fusion_ce(private_logits: torch.Tensor, q_probs: torch.Tensor, omega: torch.Tensor,
              y: torch.Tensor) -> torch.Tensor:
    """CE of the Joint score; Q's part is a constant, so only Private learns to predict with Q."""
    score = joint_score(F.softmax(private_logits, dim=-1), q_probs, omega)
    return F.nll_loss(torch.log(score.clamp_min(EPS)), y)


def q_student_terms(q: nn.Module, u: torch.Tensor, y: torch.Tensor, t_soft: torch.Tensor | None,
                    rel: torch.Tensor | None, interfaces: list[torch.Tensor], p: FedSocketParams) -> list[torch.Tensor]:
    """Stage (b)'s terms CE_ls(Q) + lambda_rel relKD(teacher -> Q): the first on the features ``u``
    as the client holds them, then one per interface in ``interfaces`` (bool masks over the
    modalities: a donor's recipient interfaces), Q computed on those modalities' features only.
    Without a teacher (``t_soft`` None: Label Q) each term is CE_ls alone."""
    views = [u] + [restrict(u, keep) for keep in interfaces]
    terms = []
    for logits in (q(v) for v in views):
        term = F.cross_entropy(logits, y, label_smoothing=p.label_smoothing)
        if t_soft is not None:
            term = term + p.lambda_rel * weighted_kd(logits, t_soft, rel, p.temperature)
        terms.append(term)
    return terms


def q_student_loss(q: nn.Module, u: torch.Tensor, y: torch.Tensor, t_soft: torch.Tensor | None,
                   rel: torch.Tensor | None, interfaces: list[torch.Tensor], p: FedSocketParams) -> torch.Tensor:
    """The mean of ``q_student_terms`` (just the one term without interfaces): a donor's
    conditional target weighs its full interface and each recipient interface equally."""
    terms = q_student_terms(q, u, y, t_soft, rel, interfaces, p)
    return terms[0] if len(terms) == 1 else sum(terms) / len(terms)


# ----------------------------------------------------------------------------- local stages


def teach_private(fed, cid: int, rnd: int, q: nn.Module, feats: torch.Tensor, p: FedSocketParams,
                  omega_fus: torch.Tensor) -> float:
    """Stage (a): the frozen Q teaches Private (CE_ls + lambda_KD relKD + lambda_fus fusion CE);
    with ``q_return=off`` (No return) Private trains with CE_ls alone and Q is never run."""
    plan = make_plan(fed, cid, rnd, epochs=p.local_epochs, purpose=PRIVATE)  # None: the run's local epochs
    if p.q_return == "off":
        return train_client(fed, fed.clients[cid], plan,
                            lambda b, logits: F.cross_entropy(logits, b.y, label_smoothing=p.label_smoothing),
                            who=f"client {cid} private")
    with torch.no_grad():  # Q reads the cached features of the un-augmented samples (the observed ones)
        q_logits = q(feats[plan.indices]) if len(plan) else feats.new_zeros((0, fed.num_classes))
    q_probs = F.softmax(q_logits, dim=-1)
    q_soft = F.softmax(q_logits / p.temperature, dim=-1)
    rel = reliability_weights(q_probs, plan.labels(fed))

    def loss(b, logits):
        s, e = b.start, b.end
        return (F.cross_entropy(logits, b.y, label_smoothing=p.label_smoothing)
                + p.lambda_kd * weighted_kd(logits, q_soft[s:e], rel[s:e], p.temperature)
                + p.lambda_fus * fusion_ce(logits, q_probs[s:e], omega_fus, b.y))

    return train_client(fed, fed.clients[cid], plan, loss, who=f"client {cid} private")


def teach_q(fed, cid: int, rnd: int, q_copy: nn.Module, feats: torch.Tensor, p: FedSocketParams,
            interfaces: Sequence[torch.Tensor] = ()) -> float:
    """Stage (b): the updated Private teaches the local Q copy (CE_ls + lambda_rel relKD), on the
    client's own features and, for a donor, on each recipient interface (``interfaces``); with
    ``q_teacher=none`` (Label Q) the copy learns from the labels alone and Private is never run."""
    plan = make_plan(fed, cid, rnd, epochs=p.local_epochs, purpose=Q_STAGE)
    t_soft = rel = None
    if p.q_teacher == "private":
        t_logits = private_teacher_logits(fed, cid, plan.indices)
        t_soft = F.softmax(t_logits / p.temperature, dim=-1)
        rel = reliability_weights(F.softmax(t_logits, dim=-1), plan.labels(fed))
    opt = torch.optim.Adam(q_copy.parameters(), lr=p.q_lr)
    trainee = Trainee(q_copy, opt, f"client {cid} Q copy", cid)

    def loss(b):  # Q reads the features of the batch's samples, not their (augmented) views
        s, e = b.start, b.end
        teacher = (None, None) if t_soft is None else (t_soft[s:e], rel[s:e])
        return [q_student_loss(q_copy, feats[b.idx], b.y, *teacher, list(interfaces), p)]

    return fit(fed, plan, [trainee], loss)[0]


# ----------------------------------------------------------------------------- the method


# What a client uploads each round: Q's parameters, its sample count and its class counts, plus,
# on a multimodal task, how many of its training rows have each modality.
UPLOAD_KINDS = {"q": Payload.PARAMS, "n": Payload.COUNTS, "class_counts": Payload.COUNTS}
MULTIMODAL_UPLOAD_KINDS = {**UPLOAD_KINDS, "modality_counts": Payload.COUNTS}


@register_method
class FedSocket(SharedPredictorClients, Method):
    card = MethodCard(
        name="fedsocket", fidelity="reconstructed", topology="server",
        version="1.2",
        changelog=(
            ("1.1", "Private trains on the protocol's budget by default (the run's lr and local epochs per "
                    "stage, no warm-up); 1.0's stage epochs, warm-up and private lr are the \"paper\" preset."),
            ("1.2", "Q reads an encoder pretrained on data no client holds (extractor=pretrained) by default; "
                    "1.1's random conv bank is extractor=random-conv."),
        ),
        citation=("Zhao, FedSocket: Recipient-Executable Knowledge Exchange for Heterogeneous Multimodal "
                 "Federated Learning, arXiv 2609.37582"),
        summary="Shared predictor Q on fixed features, Private <-> Q teaching, ownership-aware server averaging.",
        missing_modalities=True,
        why_not_tokens="its shared frozen extractor (a conv encoder or a random projection) maps input values, "
                       "not token ids",
        presets={"paper": PAPER_BUDGET},
        smoke=SmokeSettings(method_params={"pretrain_steps": "50"}, pretrain_size=SMOKE_PRETRAIN_SIZE),
        notes=(
            "[paper] only Q parameters plus sample and class counts are exchanged; frozen Q teaches Private "
            "(CE_ls + lambda_KD relKD + lambda_fus fusion CE), then Private teaches the local Q copy (CE_ls + "
            "lambda_rel relKD); w_i = (1 - H(t_i)/log C)(0.25 + 0.75[argmax t_i = y_i]); head rows over "
            "positive-count clients, other blocks sample-weighted, phi = 0.5 phi_old + 0.5 avg; Joint omega "
            "formula with omega = 1 for absent classes, rho chosen on validation; the paper's lambda_KD 0.5, "
            "lambda_fus 0.25, lambda_rel 0.2 and Q lr 3e-4 are the defaults; its private lr 5e-2, 2 local "
            "epochs per stage and 10 warm-up epochs are the paper preset",
            "[paper] missing modalities: fixed per-modality features into modality adapters and embeddings; "
            "complete-input donor predictions supervise Q through observed-modality features (conditional "
            "target, A.1) with a label anchor; modality embeddings averaged over the clients using the "
            "modality; recipients run Private, Q and Joint through the same observed inputs",
            "[ours] one task: one expert and one head, no task embeddings, no cross-task residual sharing, no "
            "PCGrad; single-modality task: task and modality embeddings collapsed into one learned 256-d vector",
            "[ours] multimodal Q: per modality an adapter Linear(256,256)-LayerNorm-GELU and an embedding e_m "
            "(init 0); z = mean over the modalities a row has of (adapter_m(u_m) + e_m), so Q runs on any "
            "subset of modalities; an adapter never sees a row without its modality",
            "[paper] Q reads fixed features of pretrained encoders no client trains (frozen ResNet-18 + fixed "
            "256-d projection)",
            "[ours] extractor=pretrained (default): offline, so a small conv encoder per modality pretrained here "
            "on labelled data no client holds: the task's generator where it has one (mnist1d signals, generator "
            "seed 20260049, the task's is 42), else the --pretrain-size split held out before partitioning "
            "(refused without either); conv(C->32)-ReLU-conv(32->64)-ReLU (1-D k5 along W for a C x 1 x W "
            "signal, else 2-D k3), avg pool, Linear to 256-d; supervised CE through a dropped linear head, Adam "
            "1e-3, batch 64, pretrain_steps steps, fixed seed, on the CPU; cached by content hash; the record's "
            "method.run_details.feature_bank states the data, version, trained or cached, and a linear probe",
            "[ours] ablations: extractor=random-conv, a frozen random conv net trained nowhere, seeded by "
            "derive_seed(seed, 'fedsocket-extractor') (multimodal: one per modality, derive_seed(seed, "
            "'fedsocket-extractor', modality)): conv3x3(C->32)-ReLU-conv3x3(32->64)-ReLU, avg pool to "
            "min(H,4)xmin(W,4), fixed Gaussian projection to 256-d (version 1.1's default); "
            "extractor=random-projection projects the flat input (modality)",
            "[ours] every extractor runs only on rows where the modality is finite (a missing modality's "
            "features are absent, never computed from NaN); train/test features cached once, other inputs "
            "computed on the fly; Q reads un-augmented samples' features",
            "[paper] controls: Label Q (Q on labels only), No return (no Q -> Private KD or fusion), "
            "matched-capacity independent ensembles",
            "[ours] controls as hyperparameters (variants of fedsocket, compared with its default by seed): Label "
            "Q = q_teacher=none (stage (b) CE_ls only, same views; Private's outputs never computed), No return = "
            "q_return=off (stage (a) CE_ls only), matched-capacity ensemble = share_q=off (each client's Q "
            "taught both ways as in FedSocket but never uploaded or averaged; "
            "Private + its own Q by the same Joint rule: matched capacity, only sharing differs)",
            "[ours] Q: adapter Linear(256,256)-LayerNorm-GELU + embedding; expert Linear(256,256)-GELU; "
            "residual B A z, rank 32, linear; scalar gate init 0; h = expert(z) + sigmoid(g) B A z; head "
            "Linear(256,C); Q init seeded by derive_seed(seed, 'fedsocket-q') and sent to every client in setup",
            "[ours] label smoothing 0.1; relKD = T^2 mean_i w_i KL(t_i^T || s_i^T) at T = 2, weights not "
            "renormalized, w_i from the teacher's T = 1 softmax",
            "[ours] conditional target: a donor's stage-(b) loss is the mean over its full interface and each "
            "distinct recipient interface of CE_ls(Q on it) + lambda_rel relKD(complete-input Private -> Q on "
            "it), same teacher and weights in every term, Q computed on the interface's modalities only; a "
            "recipient's (and every single-modality client's) loss is the one term on its own interface",
            "[ours] fusion CE = NLL of (1 - omega) softmax(Private) + omega softmax(Q) with omega at rho = 1 "
            "(fusion_rho), Q frozen; no label smoothing on it",
            "[ours] Private: the client's SGD (the config's lr, momentum and weight decay; private_lr, when set, "
            "replaces the lr); Q copy: a fresh Adam at q_lr each round; both clipped at the config's gradient norm",
            "[ours] stage (b) teacher = Private's predictions on un-augmented training samples as the client "
            "holds them; each stage runs the config's local epochs (seeded), or the method's local_epochs when "
            "set (the paper preset)",
            "[ours] warm-up (warmup_epochs, none by default; the paper preset sets one): Private-only CE_ls in "
            "setup for every client, before round 1; no out-of-fold cross-fitting",
            "[ours] head row c weighted by the holders' sample counts; a class no uploader holds keeps its row; "
            "modality blocks weighted by each uploader's training rows with that modality (0 for a client "
            "missing it; uploaded as counts), a modality no uploader observes keeps its block; stabilizer "
            "applied to every block",
            "[ours] server sends current Q to stale active clients at round start (partial participation only) "
            "and the aggregate to the round's active clients at round end; Q and Joint use the last Q received",
            "[ours] rho grid {0.25, 0.5, 1, 2, 4} (rho_grid), per client by validation accuracy, ties by NLL "
            "then smaller rho; rho = 1 without validation data",
            "[ours] headline metric = Private unless endpoint=joint (see hparams.endpoint); extra_endpoints "
            "private, q, joint always reported, a client's three on the same inputs (its observed modalities)",
        ),
    )
    Params = FedSocketParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        for name, value, allowed in (("q_teacher", p.q_teacher, Q_TEACHERS), ("q_return", p.q_return, ON_OFF),
                                     ("share_q", p.share_q, ON_OFF)):
            if value not in allowed:
                raise ConfigError(f"fedsocket: {name}={value!r}; choose one of {', '.join(allowed)}")
        require_at_least("fedsocket", p, ("pretrain_steps",), 1)
        check_extractor(p.extractor, fed, "fedsocket")
        if p.endpoint not in ENDPOINTS:
            raise ConfigError(f"fedsocket: endpoint={p.endpoint!r}; choose one of {', '.join(ENDPOINTS)}")
        parse_grid(p.rho_grid)
        require_at_least("fedsocket", p, ("feature_dim", "hidden_dim", "rank"), 1)
        if p.local_epochs is not None and p.local_epochs < 1:
            raise ConfigError(f"fedsocket: local_epochs must be >= 1 (or unset: the run's), got {p.local_epochs}")
        if p.warmup_epochs < 0:
            raise ConfigError(f"fedsocket: warmup_epochs must be >= 0, got {p.warmup_epochs}")
        if not 0 <= p.server_keep <= 1:
            raise ConfigError(f"fedsocket: server_keep must be in [0, 1], got {p.server_keep}")
        if not 0 <= p.label_smoothing < 1:
            raise ConfigError(f"fedsocket: label_smoothing must be in [0, 1), got {p.label_smoothing}")
        if p.temperature <= 0 or p.fusion_rho <= 0 or (p.private_lr is not None and p.private_lr <= 0) or p.q_lr <= 0:
            raise ConfigError("fedsocket: temperature, fusion_rho, private_lr and q_lr must be > 0")

    def setup(self, fed: RoundView) -> None:
        p = self.params
        with fed.timer(Phase.FEATURE_EXTRACTION):
            self.bank = build_feature_bank(fed, p.extractor, p.feature_dim, p.pretrain_steps)
        self.feats = self.bank.cached(0)  # every client's train/val/test rows index the training split
        self.modalities = tuple(m.name for m in fed.info.modalities)
        self.interfaces = recipient_interfaces(fed)  # what a donor's Q copy also learns through
        self.init_clients(fed, new_shared_predictor(fed, p.feature_dim, p.hidden_dim, p.rank),
                          parse_grid(p.rho_grid), p.fusion_rho, send=p.share_q == "on")
        self.omega_fus = [joint_weights(c.train_counts, p.fusion_rho).to(fed.device) for c in fed.clients]
        if p.private_lr is not None:  # the paper's private lr on the client's own SGD
            for c in fed.clients:
                for group in c.optimizer.param_groups:
                    group["lr"] = p.private_lr
        if p.warmup_epochs:
            with fed.timer(Phase.TRAINING):
                for cid in range(fed.n_clients):
                    warm_up_private(fed, cid, p.warmup_epochs, p.label_smoothing)
        self.init_endpoints(fed)

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        p = self.params
        if p.share_q == "off":
            return self.run_local_round(fed, rnd, active)
        self.catch_up(fed, active)
        recipients = set(fed.recipients)
        uploads, private_losses, q_losses = [], [], []
        for k in active:
            private_loss, q_copy, q_loss = self.teach(fed, k, rnd, recipients)
            private_losses.append(private_loss)
            q_losses.append(q_loss)
            counts = fed.clients[k].train_counts
            message = {"q": q_copy.state_dict(), "n": int(counts.sum()),
                       "class_counts": torch.as_tensor(counts, dtype=torch.int64)}
            kinds = UPLOAD_KINDS
            if self.modalities:
                rows = client_present_rows(fed, k, self.feats, self.modalities)
                message["modality_counts"] = torch.as_tensor([rows[m] for m in self.modalities], dtype=torch.int64)
                kinds = MULTIMODAL_UPLOAD_KINDS
            uploads.append(fed.channel.send(k, SERVER, message, kinds))
        with fed.timer(Phase.AGGREGATION):
            modality_counts = None
            if self.modalities:
                modality_counts = {m: [float(u["modality_counts"][i]) for u in uploads]
                                   for i, m in enumerate(self.modalities)}
            self.phi = aggregate_q(self.phi, [u["q"] for u in uploads], [u["n"] for u in uploads],
                                   np.stack([u["class_counts"].numpy() for u in uploads]), keep=p.server_keep,
                                   modality_counts=modality_counts)
            self.predictor_version += 1
        self.download(fed, list(active))
        return self.finish_round(fed, active, private_losses, q_losses)

    def run_local_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        """``share_q=off`` (the matched-capacity ensemble): the same two stages, and each client then
        holds the Q copy it trained as its own Q; nothing is uploaded, averaged or sent."""
        recipients = set(fed.recipients)
        private_losses, q_losses = [], []
        for k in active:
            private_loss, q_copy, q_loss = self.teach(fed, k, rnd, recipients)
            private_losses.append(private_loss)
            q_losses.append(q_loss)
            self.held[k].load_state_dict(q_copy.state_dict())
        return self.finish_round(fed, active, private_losses, q_losses)

    def teach(self, fed: RoundView, k: int, rnd: int, recipients: set[int]) -> tuple[float, nn.Module, float]:
        """Client k's two stages: Private taught by the Q it holds, then a copy of that Q taught (a
        donor's copy also through every recipient interface: the conditional target)."""
        p = self.params
        interfaces = [] if k in recipients else [interface_mask(fed, o) for o in self.interfaces]
        with fed.timer(Phase.TRAINING):
            private_loss = teach_private(fed, k, rnd, self.held[k], self.feats, p, self.omega_fus[k])
            q_copy = copy.deepcopy(self.held[k]).requires_grad_(True)
            q_loss = teach_q(fed, k, rnd, q_copy, self.feats, p, interfaces)
        return private_loss, q_copy, q_loss

    def finish_round(self, fed: RoundView, active: list[int], private_losses: list[float],
                     q_losses: list[float]) -> dict[str, float]:
        self.calibrate(fed, active)
        return {"private_loss": float(np.mean(private_losses)), "q_loss": float(np.mean(q_losses)),
                "rho_mean": float(np.mean(self.rho))}
