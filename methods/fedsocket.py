"""FedSocket style, single-task adaptation (Zhao, "FedSocket: Recipient-Executable Knowledge
Exchange for Heterogeneous Multimodal Federated Learning", arXiv 2609.37582; methods spec, Sec. 8).

Only a shared predictor Q, with each client's sample and class counts, crosses the network. Q
reads fixed features u = h(x) of a frozen extractor every client can compute. Each client keeps
its own Private model (its pool architecture) and, per round, a local copy of Q:

  (a) the frozen Q it holds teaches Private:
      CE_ls(Private) + lambda_KD * relKD(Q -> Private) + lambda_fus * CE(Joint score, y);
  (b) the updated Private teaches the local Q copy: CE_ls(Q) + lambda_rel * relKD(Private -> Q);

with reliability weight w_i = (1 - H(t_i) / log C) * (0.25 + 0.75 [argmax t_i == y_i]) for the
teacher's prediction t_i. The server averages the uploaded copies by ownership (head row c over
the clients holding class c; every other block sample-weighted), then stabilizes:
phi = 0.5 phi_old + 0.5 avg, and sends phi back. Each client reports three predictors: Private,
Q (on its features) and Joint, score = (1 - omega) p_Private + omega p_Q with
omega_{k,c} = rho med(c_k+) / (c_{k,c} + rho med(c_k+)) (= 1 for a class absent locally) and rho
picked on the client's validation half.

What comes from the paper (summary) or the spec [paper], and what is ours [ours]; every item is
also in ``notes`` and so in every record:

- [paper] exchange of Q parameters and counts only; bidirectional teaching with a frozen teacher
  Q and a trainable local Q copy; label-smoothed CE, reliability-weighted KD and label-supervised
  fusion; the reliability weight above; head rows over positive-count clients, other blocks
  sample-weighted, server stabilizer 0.5; the Joint omega formula with absent classes at 1 and
  rho selected on validation data; defaults lambda_KD 0.5, lambda_fus 0.25, lambda_rel 0.2,
  private lr 5e-2, Q lr 3e-4, 2 local epochs, 10 warm-up epochs.
- [ours] the single-task, single-modality adaptation: one task, so one adapter, one expert and
  one head; the paper's task and modality embeddings collapse into one learned 256-d vector
  added to the adapted input; there is no cross-task residual sharing and no PCGrad.
- [ours] extractor: the paper uses a frozen pretrained ResNet-18 plus a fixed projection to
  256-d. This suite is offline and downloads no weights, so the default (``extractor=
  random-conv``) is a frozen random conv net seeded by derive_seed(seed, "fedsocket-extractor"):
  conv3x3(C->32)-ReLU-conv3x3(32->64)-ReLU, adaptive average pool to min(H,4) x min(W,4), then a
  fixed Gaussian projection (std 1/sqrt(fan-in)) to 256-d; Kaiming-normal conv weights, zero
  biases, no normalization layers. ``random-projection`` is a fixed Gaussian projection of the
  flattened input. All clients compute the same function (one shared module in simulation).
  Features of every training-split and global-test sample are computed once in setup and
  cached; Q always reads the features of the un-augmented sample (augmentation, where a task
  has one, only feeds Private).
- [ours] Q's shapes: adapter Linear(256, 256) -> LayerNorm -> GELU, plus the embedding vector;
  expert Linear(256, 256) -> GELU; low-rank residual B A z with A: 256 -> 32, B: 32 -> 256
  (rank 32, linear, no bias); one scalar gate g (init 0, so sigma(g) = 0.5); hidden
  h = expert(z) + sigma(g) * B A z; head Linear(256, C). About 150k parameters with C = 10.
  The LayerNorm is there because random features have no calibrated scale.
- [ours] label smoothing 0.1 in both CE_ls terms. relKD = T^2 * mean_i w_i KL(t_i^T || s_i^T)
  at the suite's distillation temperature T = 2, with the weights not renormalized (an unreliable
  teacher just contributes less); w_i is computed from the teacher's T = 1 softmax.
- [ours] fusion CE = NLL of the Joint score (1 - omega) softmax(Private) + omega softmax(Q) with
  omega at rho = 1 (training fusion weight; the inference rho is selected separately); Q is
  frozen there, so only Private gets gradients. Plain CE (no smoothing) on the fusion score.
- [ours] optimizers: Private keeps its client's SGD (momentum 0.9, weight decay 5e-4) with the
  learning rate set to 5e-2; Q copies use Adam(3e-4), created fresh each round (the copy is
  re-initialized from the global Q every round and no optimizer state is exchanged).
  Gradient clipping at the suite's norm (10) for both.
- [ours] the Private teacher in stage (b) predicts on the un-augmented training samples (to
  match Q's features); stage (a) and stage (b) each run ``local_epochs`` (2) seeded epochs
  (make_plan, purposes "fedsocket-private" and "fedsocket-q"); this overrides the suite's
  --local-epochs, which the record's federation block still shows.
- [ours] warm-up (Stage I, "Private warm-up"): in setup every client trains its Private model
  alone with CE_ls for ``warmup_epochs`` (10) epochs, before round 1; no communication. Q starts
  from a seeded random init (derive_seed(seed, "fedsocket-q")) that the server sends to every
  client in setup (metered, in the record's total bytes).
- [ours] head rows: row c (weight and bias) is the sample-count-weighted mean over the uploading
  clients with a positive training count of c; a class no uploader holds keeps its previous row
  (and so, after the stabilizer, is unchanged). Stabilizer on every floating block.
- [ours] rounds: the server sends the current Q to each active client that does not hold it
  (catch-up, only under partial participation), and after aggregating sends the new Q to the
  round's active clients; a client evaluates Q and Joint with the last Q it received. Each
  active client uploads {Q state dict, sample count, class counts} every round.
- [ours] rho grid {0.25, 0.5, 1, 2, 4}; chosen per client after every round in which it was
  active, by validation accuracy of the Joint score, ties broken by validation NLL and then by
  the smaller rho; a client without validation data uses rho = 1.
- [ours] headline: the suite's evaluated model is Private unless ``endpoint=joint``; the record's
  ``metrics.extra_endpoints`` holds "private", "q" and "joint" either way (the hyperparameters
  say which one is the headline).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.method_api import (
    Payload,
    SERVER,
    ConfigError,
    Method,
    Phase,
    Trainee,
    derive_seed,
    fit,
    make_plan,
    predict_logits,
    register_method,
    require_at_least,
    seeded_init,
    train_client,
)

HEAD_KEYS = ("head.weight", "head.bias")
EXTRACTORS = ("random-conv", "random-projection")
ENDPOINTS = ("private", "joint")
EPS = 1e-12


@dataclass
class FedSocketParams:
    extractor: str = field(default="random-conv", metadata={
        "help": "Frozen feature extractor shared by all clients: random-conv or random-projection (seeded)."})
    feature_dim: int = field(default=256, metadata={"help": "Dimension of the fixed features u = h(x)."})
    hidden_dim: int = field(default=256, metadata={"help": "Q's hidden width."})
    rank: int = field(default=32, metadata={"help": "Rank of Q's gated low-rank residual."})
    lambda_kd: float = field(default=0.5, metadata={"help": "Weight of Q -> Private reliability-weighted KD."})
    lambda_fus: float = field(default=0.25, metadata={"help": "Weight of the fusion CE on the Joint score."})
    lambda_rel: float = field(default=0.2, metadata={"help": "Weight of Private -> Q reliability-weighted KD."})
    label_smoothing: float = field(default=0.1, metadata={"help": "Label smoothing of both CE_ls terms."})
    temperature: float = field(default=2.0, metadata={"help": "Distillation temperature of the KD terms."})
    private_lr: float = field(default=5e-2, metadata={"help": "SGD learning rate of the Private models."})
    q_lr: float = field(default=3e-4, metadata={"help": "Adam learning rate of the local Q copies."})
    local_epochs: int = field(default=2, metadata={
        "help": "Epochs of each stage (Q->Private, Private->Q) per round; overrides --local-epochs."})
    warmup_epochs: int = field(default=10, metadata={"help": "Private-only CE_ls epochs in setup (Stage I)."})
    server_keep: float = field(default=0.5, metadata={
        "help": "Server stabilizer: phi = keep * phi_old + (1 - keep) * average."})
    fusion_rho: float = field(default=1.0, metadata={"help": "rho of the Joint weights inside the fusion CE."})
    rho_grid: str = field(default="0.25,0.5,1,2,4", metadata={
        "help": "Comma-separated rho candidates for Joint inference, chosen per client on validation."})
    endpoint: str = field(default="private", metadata={
        "help": "Headline (evaluated) predictor: private or joint; all three are reported."})


# ----------------------------------------------------------------------------- pure pieces


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


def joint_weights(counts, rho: float) -> torch.Tensor:
    """omega_c = rho m / (c_c + rho m), m = median of the positive counts; 1 for absent classes."""
    counts = np.asarray(counts, dtype=np.float64)
    positive = counts[counts > 0]
    if positive.size == 0:  # a client without training data defers entirely to Q
        return torch.ones(len(counts), dtype=torch.float32)
    m = rho * float(np.median(positive))
    return torch.as_tensor(m / (counts + m), dtype=torch.float32)


def joint_score(private_probs: torch.Tensor, q_probs: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    return (1 - omega) * private_probs + omega * q_probs


def fusion_ce(private_logits: torch.Tensor, q_probs: torch.Tensor, omega: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CE of the Joint score; Q's part is a constant, so only Private learns to predict with Q."""
    score = joint_score(F.softmax(private_logits, dim=-1), q_probs, omega)
    return F.nll_loss(torch.log(score.clamp_min(EPS)), y)


def aggregate_q(old: dict[str, torch.Tensor], states: list[dict[str, torch.Tensor]], n_samples,
                class_counts, keep: float = 0.5, head_keys=HEAD_KEYS) -> dict[str, torch.Tensor]:
    """Ownership-aware average of uploaded Q copies, then phi = keep * old + (1 - keep) * avg.

    Head entries (row c of every key in ``head_keys``) average only over the uploaders with a
    positive count of class c, weighted by their sample counts; a class nobody holds keeps its
    old row. Every other floating block is the sample-weighted mean of all uploads.
    """
    n = torch.as_tensor(np.asarray(n_samples, dtype=np.float64))
    holds = torch.as_tensor(np.asarray(class_counts, dtype=np.float64)) > 0  # [K, C]
    new = {}
    for key, ref in old.items():
        if not ref.is_floating_point():
            new[key] = ref.clone()
            continue
        stack = torch.stack([s[key].detach().to(ref.device, torch.float64) for s in states])  # [K, ...]
        if key in head_keys:
            avg = _owned_rows_mean(stack, n.to(ref.device)[:, None] * holds.to(ref.device), ref.double())
        elif n.sum() > 0:
            w = (n / n.sum()).to(ref.device)
            avg = (w.view(-1, *[1] * ref.dim()) * stack).sum(0)
        else:
            avg = ref.double()
        new[key] = (keep * ref.double() + (1 - keep) * avg).to(ref.dtype)
    return new


def _owned_rows_mean(stack: torch.Tensor, weights: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Row-wise weighted mean over clients ([K, C, ...] with weights [K, C]); rows without weight keep ``old``."""
    total = weights.sum(0)  # [C]
    shape = (*weights.shape, *[1] * (stack.dim() - 2))
    mean = (weights.view(shape) * stack).sum(0) / total.clamp_min(EPS).view(shape[1:])
    owned = (total > 0).view(shape[1:])
    return torch.where(owned, mean, old)


def select_rho(private_logits: torch.Tensor, q_probs: torch.Tensor, y: torch.Tensor, counts,
               grid: list[float]) -> float:
    """The rho of the grid with the best validation accuracy of the Joint score (then NLL, then smaller)."""
    private_probs = F.softmax(private_logits, dim=-1)
    best, best_key = None, None
    for rho in sorted(grid):
        score = joint_score(private_probs, q_probs, joint_weights(counts, rho).to(q_probs.device))
        acc = float((score.argmax(-1) == y).float().mean())
        nll = float(-torch.log(score.gather(1, y[:, None]).clamp_min(EPS)).mean())
        key = (-acc, nll)
        if best_key is None or key < best_key:
            best, best_key = rho, key
    return best


def parse_grid(text: str) -> list[float]:
    try:
        grid = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"fedsocket: rho_grid={text!r} must be comma-separated numbers") from None
    if not grid or any(not (v > 0 and math.isfinite(v)) for v in grid):
        raise ConfigError(f"fedsocket: rho_grid={text!r} must hold positive numbers")
    return grid


# ----------------------------------------------------------------------------- modules


class RandomConvExtractor(nn.Module):
    """Frozen random conv features for any C x H x W input, projected to ``dim``."""

    def __init__(self, input_shape: tuple[int, ...], dim: int, width: int = 32):
        super().__init__()
        c, h, w = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(c, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d((min(h, 4), min(w, 4))), nn.Flatten(),
        )
        for m in self.body:
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
        fan_in = 2 * width * min(h, 4) * min(w, 4)
        self.project = nn.Linear(fan_in, dim, bias=False)
        nn.init.normal_(self.project.weight, std=fan_in**-0.5)

    def forward(self, x):
        return self.project(self.body(x))


class RandomProjectionExtractor(nn.Module):
    """A fixed Gaussian projection of the flattened input."""

    def __init__(self, input_shape: tuple[int, ...], dim: int):
        super().__init__()
        fan_in = int(np.prod(input_shape))
        self.project = nn.Linear(fan_in, dim, bias=False)
        nn.init.normal_(self.project.weight, std=fan_in**-0.5)

    def forward(self, x):
        return self.project(x.flatten(1))


def build_extractor(kind: str, input_shape: tuple[int, ...], dim: int, seed: int) -> nn.Module:
    """The frozen extractor every client can compute: the same seed gives the same function.
    Built under a forked RNG so the run's global torch RNG stream is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cls = RandomConvExtractor if kind == "random-conv" else RandomProjectionExtractor
        extractor = cls(tuple(input_shape), dim)
    return extractor.requires_grad_(False).eval()


class SharedPredictor(nn.Module):
    """Q: adapter (+ embedding) -> hidden -> expert + sigma(g) * low-rank residual -> linear head."""

    def __init__(self, in_dim: int, hidden: int, rank: int, num_classes: int):
        super().__init__()
        self.adapter = nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.GELU())
        self.embedding = nn.Parameter(torch.zeros(hidden))  # task + modality embedding (one task here)
        self.expert = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU())
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, hidden, bias=False)
        self.gate = nn.Parameter(torch.zeros(1))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, u):
        z = self.adapter(u) + self.embedding
        h = self.expert(z) + torch.sigmoid(self.gate) * self.up(self.down(z))
        return self.head(h)


class FeatureBank(nn.Module):
    """The frozen extractor plus its cached features of the run's fixed tensors.

    A row slice of a cached tensor (same storage, same strides, as the evaluator's chunks of the
    global test set are) is answered from the cache; any other input is run through the
    extractor, so the answer is always h(x).
    """

    def __init__(self, extractor: nn.Module, sources: list[torch.Tensor]):
        super().__init__()
        self.extractor = extractor
        self._cache = [(x, predict_logits(extractor, x)) for x in sources]  # plain attributes, not state

    def cached(self, i: int) -> torch.Tensor:
        return self._cache[i][1]

    def forward(self, x):
        hit = self._lookup(x)
        return hit if hit is not None else self.extractor(x)

    def _lookup(self, x: torch.Tensor) -> torch.Tensor | None:
        for base, feats in self._cache:
            if (x.dim() == base.dim() and x.shape[1:] == base.shape[1:] and x.stride() == base.stride()
                    and x.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()):
                offset = x.storage_offset() - base.storage_offset()
                if offset >= 0 and offset % base.stride(0) == 0:
                    start = offset // base.stride(0)
                    if start + len(x) <= len(base):
                        return feats[start : start + len(x)]
        return None


class QPredictor(nn.Module):
    """Q on the shared features: raw input -> Q's logits (the "q" endpoint)."""

    def __init__(self, bank: FeatureBank, q: nn.Module):
        super().__init__()
        self.bank, self.q = bank, q

    def forward(self, x):
        return self.q(self.bank(x))


class JointPredictor(nn.Module):
    """log((1 - omega) p_Private + omega p_Q): argmax is the Joint decision (the "joint" endpoint)."""

    def __init__(self, private: nn.Module, q_predictor: QPredictor, omega: torch.Tensor):
        super().__init__()
        self.private, self.q_predictor = private, q_predictor
        self.register_buffer("omega", omega)

    def forward(self, x):
        score = joint_score(F.softmax(self.private(x), dim=-1), F.softmax(self.q_predictor(x), dim=-1), self.omega)
        return torch.log(score.clamp_min(EPS))


# ----------------------------------------------------------------------------- local stages


def warm_up_private(fed, cid: int, epochs: int, smoothing: float) -> float:
    """Stage I: Private alone with CE_ls (no communication)."""
    plan = make_plan(fed, cid, 0, epochs=epochs, purpose="fedsocket-warmup")
    return train_client(fed, fed.clients[cid], plan,
                        lambda b, logits: F.cross_entropy(logits, b.y, label_smoothing=smoothing),
                        who=f"client {cid} warm-up")


def teach_private(fed, cid: int, rnd: int, q: nn.Module, feats: torch.Tensor, p: FedSocketParams,
                  omega_fus: torch.Tensor) -> float:
    """Stage (a): the frozen Q teaches Private (CE_ls + lambda_KD relKD + lambda_fus fusion CE)."""
    plan = make_plan(fed, cid, rnd, epochs=p.local_epochs, purpose="fedsocket-private")
    with torch.no_grad():  # Q reads the cached features of the un-augmented samples
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


def teach_q(fed, cid: int, rnd: int, q_copy: nn.Module, feats: torch.Tensor, p: FedSocketParams) -> float:
    """Stage (b): the updated Private teaches the local Q copy (CE_ls + lambda_rel relKD)."""
    client = fed.clients[cid]
    plan = make_plan(fed, cid, rnd, epochs=p.local_epochs, purpose="fedsocket-q")
    # Private predicts once per training sample, on the un-augmented input Q's features describe.
    lookup = feats.new_zeros((len(fed.data.train_y), fed.num_classes))
    if len(client.train_idx):
        lookup[client.train_idx] = predict_logits(client.model, fed.data.train_x[client.train_idx])
    t_logits = lookup[plan.indices]
    t_soft = F.softmax(t_logits / p.temperature, dim=-1)
    rel = reliability_weights(F.softmax(t_logits, dim=-1), plan.labels(fed))
    opt = torch.optim.Adam(q_copy.parameters(), lr=p.q_lr)
    trainee = Trainee(q_copy, opt, f"client {cid} Q copy", cid)

    def loss(b):  # Q reads the features of the batch's samples, not their (augmented) views
        logits = q_copy(feats[b.idx])
        return [F.cross_entropy(logits, b.y, label_smoothing=p.label_smoothing)
                + p.lambda_rel * weighted_kd(logits, t_soft[b.start:b.end], rel[b.start:b.end], p.temperature)]

    return fit(fed, plan, [trainee], loss)[0]


# ----------------------------------------------------------------------------- the method


# What a client uploads each round: Q's parameters, its sample count and its class counts.
UPLOAD_KINDS = {"q": Payload.PARAMS, "n": Payload.COUNTS, "class_counts": Payload.COUNTS}


@register_method("fedsocket")
class FedSocket(Method):
    """Shared predictor Q on fixed features, Private <-> Q teaching, ownership-aware server averaging."""

    fidelity = "reconstructed"
    version = "1.0"
    topology = "server"
    citation = ("Zhao, FedSocket: Recipient-Executable Knowledge Exchange for Heterogeneous Multimodal "
                "Federated Learning, arXiv 2609.37582")
    notes = (
        "[paper] only Q parameters plus sample and class counts are exchanged; frozen Q teaches Private "
        "(CE_ls + lambda_KD relKD + lambda_fus fusion CE), then Private teaches the local Q copy (CE_ls + "
        "lambda_rel relKD); w_i = (1 - H(t_i)/log C)(0.25 + 0.75[argmax t_i = y_i]); head rows over "
        "positive-count clients, other blocks sample-weighted, phi = 0.5 phi_old + 0.5 avg; Joint omega "
        "formula with omega = 1 for absent classes, rho chosen on validation; defaults lambda_KD 0.5, "
        "lambda_fus 0.25, lambda_rel 0.2, private lr 5e-2, Q lr 3e-4, 2 local epochs, 10 warm-up epochs",
        "[ours] single-task, single-modality adaptation: one adapter/expert/head, task and modality "
        "embeddings collapsed into one learned 256-d vector, no cross-task residual sharing, no PCGrad",
        "[ours] extractor (extractor=random-conv): the paper's frozen pretrained ResNet-18 + fixed 256-d "
        "projection needs downloaded weights, so a frozen random conv net seeded by derive_seed(seed, "
        "'fedsocket-extractor'): conv3x3(C->32)-ReLU-conv3x3(32->64)-ReLU, avg pool to min(H,4)xmin(W,4), "
        "fixed Gaussian projection to 256-d; extractor=random-projection projects the flat input; features "
        "cached once; Q reads un-augmented samples' features",
        "[ours] Q: adapter Linear(256,256)-LayerNorm-GELU + embedding; expert Linear(256,256)-GELU; "
        "residual B A z, rank 32, linear; scalar gate init 0; h = expert(z) + sigmoid(g) B A z; head "
        "Linear(256,C); Q init seeded by derive_seed(seed, 'fedsocket-q') and sent to every client in setup",
        "[ours] label smoothing 0.1; relKD = T^2 mean_i w_i KL(t_i^T || s_i^T) at T = 2, weights not "
        "renormalized, w_i from the teacher's T = 1 softmax",
        "[ours] fusion CE = NLL of (1 - omega) softmax(Private) + omega softmax(Q) with omega at rho = 1 "
        "(fusion_rho), Q frozen; no label smoothing on it",
        "[ours] Private: the client's SGD (momentum 0.9, wd 5e-4) at lr 5e-2; Q copy: fresh Adam(3e-4) "
        "each round; clipping at norm 10 for both",
        "[ours] stage (b) teacher = Private's predictions on un-augmented training samples; each stage runs "
        "local_epochs = 2 seeded epochs (overrides --local-epochs; federation.local_epochs shows the flag)",
        "[ours] warm-up: warmup_epochs of Private-only CE_ls in setup for every client, before round 1",
        "[ours] head row c weighted by the holders' sample counts; a class no uploader holds keeps its row; "
        "stabilizer applied to every block",
        "[ours] server sends current Q to stale active clients at round start (partial participation only) "
        "and the aggregate to the round's active clients at round end; Q and Joint use the last Q received",
        "[ours] rho grid {0.25, 0.5, 1, 2, 4} (rho_grid), per client by validation accuracy, ties by NLL "
        "then smaller rho; rho = 1 without validation data",
        "[ours] headline metric = Private unless endpoint=joint (see hparams.endpoint); extra_endpoints "
        "private, q, joint always reported",
    )
    Params = FedSocketParams

    def check(self, fed):
        p = self.params
        if p.extractor not in EXTRACTORS:
            raise ConfigError(f"fedsocket: extractor={p.extractor!r}; choose one of {', '.join(EXTRACTORS)}")
        if p.endpoint not in ENDPOINTS:
            raise ConfigError(f"fedsocket: endpoint={p.endpoint!r}; choose one of {', '.join(ENDPOINTS)}")
        parse_grid(p.rho_grid)
        require_at_least("fedsocket", p, ("feature_dim", "hidden_dim", "rank", "local_epochs"), 1)
        if p.warmup_epochs < 0:
            raise ConfigError(f"fedsocket: warmup_epochs must be >= 0, got {p.warmup_epochs}")
        if not 0 <= p.server_keep <= 1:
            raise ConfigError(f"fedsocket: server_keep must be in [0, 1], got {p.server_keep}")
        if not 0 <= p.label_smoothing < 1:
            raise ConfigError(f"fedsocket: label_smoothing must be in [0, 1), got {p.label_smoothing}")
        if p.temperature <= 0 or p.fusion_rho <= 0 or p.private_lr <= 0 or p.q_lr <= 0:
            raise ConfigError("fedsocket: temperature, fusion_rho, private_lr and q_lr must be > 0")

    def setup(self, fed):
        p = self.params
        self.grid = parse_grid(p.rho_grid)
        extractor = build_extractor(p.extractor, fed.info.input_shape, p.feature_dim,
                                    derive_seed(fed.cfg.seed, "fedsocket-extractor")).to(fed.device)
        with fed.timer(Phase.FEATURE_EXTRACTION):
            self.bank = FeatureBank(extractor, [fed.data.train_x, fed.data.test_x])
        self.feats = self.bank.cached(0)  # every client's train/val/test rows index the training split
        with seeded_init(fed, "fedsocket-q"):
            q0 = SharedPredictor(p.feature_dim, p.hidden_dim, p.rank, fed.num_classes)
        self.phi = {k: v.detach().clone() for k, v in q0.to(fed.device).state_dict().items()}
        self.predictor_version = 0
        # Each client's last received Q: a frozen teacher and predictor (copies train, not these).
        self.held = [copy.deepcopy(q0).to(fed.device).requires_grad_(False) for _ in fed.clients]
        self.held_predictor_version = [-1] * fed.n_clients
        self.download(fed, list(range(fed.n_clients)))
        self.omega_fus = [joint_weights(c.train_counts, p.fusion_rho).to(fed.device) for c in fed.clients]
        for c in fed.clients:  # the spec's private lr on the client's own SGD
            for group in c.optimizer.param_groups:
                group["lr"] = p.private_lr
        if p.warmup_epochs:
            with fed.timer(Phase.TRAINING):
                for cid in range(fed.n_clients):
                    warm_up_private(fed, cid, p.warmup_epochs, p.label_smoothing)
        self.q_predictors = [QPredictor(self.bank, q).eval() for q in self.held]
        self.joint = [JointPredictor(c.model, qp, torch.ones(fed.num_classes, device=fed.device)).eval()
                      for c, qp in zip(fed.clients, self.q_predictors)]
        self.rho = [p.fusion_rho] * fed.n_clients
        self.calibrate(fed, list(range(fed.n_clients)))

    def download(self, fed, clients: list[int]) -> None:
        """The server sends the current Q to ``clients``; each loads it as the Q it holds."""
        if not clients:
            return
        payload = fed.channel.send(SERVER, clients, self.phi, Payload.PARAMS)
        for k in clients:
            self.held[k].load_state_dict(payload)
            self.held_predictor_version[k] = self.predictor_version

    def run_round(self, fed, rnd, active):
        p = self.params
        self.download(fed, [k for k in active if self.held_predictor_version[k] != self.predictor_version])  # catch-up
        uploads, private_losses, q_losses = [], [], []
        for k in active:
            with fed.timer(Phase.TRAINING):
                private_losses.append(teach_private(fed, k, rnd, self.held[k], self.feats, p, self.omega_fus[k]))
                q_copy = copy.deepcopy(self.held[k]).requires_grad_(True)
                q_losses.append(teach_q(fed, k, rnd, q_copy, self.feats, p))
            counts = fed.clients[k].train_counts
            uploads.append(fed.channel.send(k, SERVER, {
                "q": q_copy.state_dict(), "n": int(counts.sum()),
                "class_counts": torch.as_tensor(counts, dtype=torch.int64),
            }, UPLOAD_KINDS))
        with fed.timer(Phase.AGGREGATION):
            self.phi = aggregate_q(self.phi, [u["q"] for u in uploads], [u["n"] for u in uploads],
                                   np.stack([u["class_counts"].numpy() for u in uploads]), keep=p.server_keep)
            self.predictor_version += 1
        self.download(fed, list(active))
        self.calibrate(fed, active)
        return {"private_loss": float(np.mean(private_losses)), "q_loss": float(np.mean(q_losses)),
                "rho_mean": float(np.mean(self.rho))}

    def calibrate(self, fed, clients: list[int]) -> None:
        """Pick each client's inference rho on its validation half and set its Joint weights."""
        with fed.timer(Phase.CALIBRATION):
            for k in clients:
                c = fed.clients[k]
                if len(c.val_idx):
                    with torch.no_grad():
                        q_probs = F.softmax(self.held[k](self.feats[c.val_idx]), dim=-1)
                    private_logits = predict_logits(c.model, fed.data.train_x[c.val_idx])
                    self.rho[k] = select_rho(private_logits, q_probs, fed.data.train_y[c.val_idx],
                                             c.train_counts, self.grid)
                else:  # nothing to select on: the training fusion rho
                    self.rho[k] = self.params.fusion_rho
                self.joint[k].omega.copy_(joint_weights(c.train_counts, self.rho[k]))

    def state_dict(self, fed):
        # The frozen extractor and its cached features are rebuilt identically by setup: not stored.
        return {k: v for k, v in super().state_dict(fed).items() if k not in ("bank", "feats")}

    def eval_models(self, fed):
        if self.params.endpoint == "joint":
            return self.joint
        return [c.model for c in fed.clients]

    def endpoints(self, fed):
        return {"private": [c.model for c in fed.clients], "q": self.q_predictors, "joint": self.joint}
