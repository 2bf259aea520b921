"""The shared-predictor family (FedSocket and its Naive Shared control): a predictor Q on fixed
features every client can compute, held by each client beside its Private model, and reported
as three endpoints (Private, Q, Joint). Written once here; the methods differ only in how Q and
Private are trained and how the server averages Q.

- **Fixed features** (``build_feature_bank``): a frozen extractor per modality (``EXTRACTORS``):
  ``pretrained``, an encoder pretrained on data no client holds (``hfl_bench.families.pretrained``:
  the task's generator where it has one for the modality, else the run's pretraining split,
  ``pretraining_set``), or a seeded random conv net or random projection trained nowhere (the
  ablations). On a single-modality task one extractor reads the whole input (a random one seeded
  ``derive_seed(seed, "fedsocket-extractor")``); on a multimodal task (``TaskInfo.modalities``)
  one extractor per modality (random: ``derive_seed(seed, "fedsocket-extractor", name)``) reads
  that modality's slice of the flat sample, and only on the rows where it is finite: a row's
  features of a modality it lacks are NaN (absent), never computed from NaN. Features of the
  training split and the global test set are computed once (``FeatureBank``); any other input (a
  masked test copy, a gathered validation batch) is computed on the fly by the same rule. The
  bank's ``facts`` are the record's ``feature_bank`` (``SharedPredictorClients.describe_run``):
  per modality where its encoder comes from and a linear probe's test accuracy.
- **Q** (``SharedPredictor``): adapter(s) Linear-LayerNorm-GELU plus a learned embedding, then an
  expert, a gated low-rank residual and a linear head. On a multimodal task there is one adapter
  and one embedding per modality, and z is the mean over the modalities a row has of
  (adapter_m(u_m) + e_m), so Q runs on any subset of modalities per row.
- **Endpoints**: ``QPredictor`` (raw input -> features -> Q) and ``JointPredictor``
  ((1 - omega) p_Private + omega p_Q, ``joint_weights``), each reading the one input tensor the
  evaluator hands the client; ``select_rho`` picks the Joint's rho on a client's validation half.
- **Aggregation** (``aggregate_q``): ownership-aware (head rows over the clients holding the
  class, modality blocks over the clients observing the modality, the rest sample-weighted) or
  plain sample-weighted, then the server stabilizer.
- **Holding Q** (``SharedPredictorClients``): the mixin that keeps each client's last received Q,
  downloads (metered), calibrates rho and exposes the endpoints and checkpoint state.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.data import Modality, get_task, modality_layout
from hfl_bench.families import pretrained
from hfl_bench.federation import engine_side
from hfl_bench.metering import SERVER, Payload, Phase
from hfl_bench.training import derive_seed, make_plan, predict_logits, train_client

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

HEAD_KEYS = ("head.weight", "head.bias")
EXTRACTORS = ("pretrained", "random-conv", "random-projection")
# The single-modality bank's one "modality" in the record's feature_bank.
WHOLE_INPUT = "input"
ENDPOINTS = ("private", "joint")
EPS = 1e-12
# The seeded plan purposes of the three local stages: both methods of the family use them, so a
# FedSocket run and its Naive Shared control see the same batch orders.
WARMUP, PRIVATE, Q_STAGE = "fedsocket-warmup", "fedsocket-private", "fedsocket-q"
# The FedSocket paper's own budget (version 1.0's defaults): the ``paper`` preset of fedsocket and
# of its Naive Shared control, which trains as fedsocket does.
PAPER_BUDGET = {"local_epochs": 2, "warmup_epochs": 10, "private_lr": 5e-2}
EXTRACTOR_SEED, Q_SEED = "fedsocket-extractor", "fedsocket-q"
# extractor=pretrained: each encoder's pretraining steps (seconds on one CPU core), and the
# pretraining split of the family's smoke runs (digits has no generator: held out of its 1,438).
PRETRAIN_STEPS = 600
SMOKE_PRETRAIN_SIZE = 100
CHUNK_ELEMENTS = 2**18  # input values per extractor call when a multimodal bank computes features


# ----------------------------------------------------------------------------- Joint and rho


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


def parse_grid(text: str, method: str = "fedsocket") -> list[float]:
    try:
        grid = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{method}: rho_grid={text!r} must be comma-separated numbers") from None
    if not grid or any(not (v > 0 and math.isfinite(v)) for v in grid):
        raise ConfigError(f"{method}: rho_grid={text!r} must hold positive numbers")
    return grid


# ----------------------------------------------------------------------------- aggregation


def modality_of(key: str) -> str | None:
    """The modality a Q state key belongs to (``adapters.<m>.*``, ``embeddings.<m>``), else None."""
    for prefix in ("adapters.", "embeddings."):
        if key.startswith(prefix):
            return key[len(prefix):].split(".", 1)[0]
    return None


def aggregate_q(old: dict[str, torch.Tensor], states: list[dict[str, torch.Tensor]], n_samples,
                class_counts=None, keep: float = 0.5, head_keys=HEAD_KEYS,
                modality_counts: dict[str, Sequence[float]] | None = None) -> dict[str, torch.Tensor]:
    """Average uploaded Q copies, then phi = keep * old + (1 - keep) * avg.

    Ownership rules, each applied when its statistics are given:

    - ``class_counts`` [K, C]: head entries (row c of every key in ``head_keys``) average only over
      the uploaders with a positive count of class c, weighted by their sample counts; a class
      nobody holds keeps its old row;
    - ``modality_counts`` {modality: [K]} (each uploader's training rows that have the modality):
      a modality's adapter and embedding (``modality_of``) average over the uploaders that
      observe it, weighted by those counts (their sample counts); a modality nobody observes keeps
      its old block.

    Every other floating block (and every block when no statistics are given: plain FedAvg with
    ``keep=0``) is the sample-weighted mean of all uploads.
    """
    n = torch.as_tensor(np.asarray(n_samples, dtype=np.float64))
    holds = None if class_counts is None else torch.as_tensor(np.asarray(class_counts, dtype=np.float64)) > 0
    new = {}
    for key, ref in old.items():
        if not ref.is_floating_point():
            new[key] = ref.clone()
            continue
        stack = torch.stack([s[key].detach().to(ref.device, torch.float64) for s in states])  # [K, ...]
        modality = modality_of(key) if modality_counts is not None else None
        if holds is not None and key in head_keys:
            avg = _owned_rows_mean(stack, n.to(ref.device)[:, None] * holds.to(ref.device), ref.double())
        elif modality is not None:
            avg = _weighted_mean(stack, torch.as_tensor(np.asarray(modality_counts[modality], dtype=np.float64)),
                                 ref)
        else:
            avg = _weighted_mean(stack, n, ref)
        new[key] = (keep * ref.double() + (1 - keep) * avg).to(ref.dtype)
    return new


def _weighted_mean(stack: torch.Tensor, weights: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """sum_k w_k / sum(w) * stack[k]; ``old`` (as float64) when no upload has weight."""
    if weights.sum() > 0:
        w = (weights / weights.sum()).to(old.device)
        return (w.view(-1, *[1] * old.dim()) * stack).sum(0)
    return old.double()


def _owned_rows_mean(stack: torch.Tensor, weights: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Row-wise weighted mean over clients ([K, C, ...] with weights [K, C]); rows without weight keep ``old``."""
    total = weights.sum(0)  # [C]
    shape = (*weights.shape, *[1] * (stack.dim() - 2))
    mean = (weights.view(shape) * stack).sum(0) / total.clamp_min(EPS).view(shape[1:])
    owned = (total > 0).view(shape[1:])
    return torch.where(owned, mean, old)


# ----------------------------------------------------------------------------- fixed features


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


class FeatureBank(nn.Module):
    """The frozen extractor plus its cached features of the run's fixed tensors.

    A row slice of a cached tensor (same storage, same strides, as the evaluator's chunks of the
    global test set are) is answered from the cache; any other input is run through the
    extractor, so the answer is always h(x).
    """

    facts: dict[str, Any]  # what the record says of the bank (``build_feature_bank``)

    def __init__(self, extractor: nn.Module, sources: list[torch.Tensor]):
        super().__init__()
        self.extractor = extractor
        self._cache = [(x, self.compute_all(x)) for x in sources]  # plain attributes, not state

    def compute_all(self, x: torch.Tensor) -> torch.Tensor:
        """Features of a whole fixed tensor, in inference chunks (setup's cache)."""
        return predict_logits(self.extractor, x)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return self.extractor(x)

    def cached(self, i: int) -> torch.Tensor:
        return self._cache[i][1]

    def forward(self, x):
        hit = self._lookup(x)
        return hit if hit is not None else self.compute(x)

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


class ModalityFeatureBank(FeatureBank):
    """One frozen extractor per modality of a multimodal task: features [B, M, F], NaN where a row
    lacks the modality. Extractor ``m`` runs only on the rows whose modality-m values are all finite."""

    def __init__(self, extractors: dict[str, nn.Module], layout: dict[str, tuple[slice, tuple[int, ...]]],
                 dim: int, sources: list[torch.Tensor]):
        nn.Module.__init__(self)
        self.extractors = nn.ModuleDict(extractors)
        self.layout = {name: layout[name] for name in extractors}
        self.dim = dim
        self._cache = [(x, self.compute_all(x)) for x in sources]

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(self.extractors)

    def compute_all(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.compute(x)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(len(x), -1)
        out = flat.new_full((len(x), len(self.extractors), self.dim), float("nan"))
        for i, (name, extractor) in enumerate(self.extractors.items()):
            where, shape = self.layout[name]
            part = flat[:, where]
            rows = torch.isfinite(part).all(dim=1).nonzero().squeeze(1)
            if len(rows):
                chunk = max(1, CHUNK_ELEMENTS // max(1, part.shape[1]))
                for s in range(0, len(rows), chunk):
                    r = rows[s : s + chunk]
                    out[r, i] = extractor(part[r].reshape(-1, *shape)).to(out.dtype)
        return out



def check_extractor(kind: str, fed: "RoundView | None", method: str) -> None:
    """ConfigError for an unknown extractor, a conv extractor on a modality that is not C x H x W,
    or ``pretrained`` on a modality without pretraining data (no generator, no --pretrain-size)."""
    if kind not in EXTRACTORS:
        raise ConfigError(f"{method}: extractor={kind!r}; choose one of {', '.join(EXTRACTORS)}")
    if kind == "random-projection" or fed is None:
        return
    for m in bank_modalities(fed):
        if len(m.shape) != 3:
            raise ConfigError(f"{method}: extractor={kind} reads C x H x W inputs, but modality "
                              f"{m.name} has shape {tuple(m.shape)}: use extractor=random-projection")
        if kind == "pretrained" and not has_pretraining_set(fed, m):
            where = f"modality {m.name}" if fed.info.modalities else "its input"
            raise ConfigError(f"{method}: extractor=pretrained needs pretraining data, and task {fed.info.name} has "
                              f"no generator for {where}: use --pretrain-size N or --set extractor=random-conv")


def bank_modalities(fed: "RoundView") -> tuple[Modality, ...]:
    """The task's modalities, or the whole input as one (``WHOLE_INPUT``) on a single-modality task."""
    return fed.info.modalities or (Modality(WHOLE_INPUT, tuple(fed.info.input_shape)),)


def _generated(fed: "RoundView", m: Modality):
    """The task's own pretraining samples of ``m`` (``Task.pretraining_data``), or None."""
    return get_task(fed.info.name).pretraining_data(m.name if fed.info.modalities else None, fed.cfg.data_dir)


def has_pretraining_set(fed: "RoundView", m: Modality) -> bool:
    return len(engine_side(fed).partition.pretrain) > 0 or _generated(fed, m) is not None


def pretraining_set(fed: "RoundView", m: Modality) -> tuple[torch.Tensor, torch.Tensor, str] | None:
    """The labelled samples ``m``'s encoder pretrains on and its probe is fit on: the task's
    generator's where it has one, else the run's pretraining split (that modality's slice of the
    held-out training rows, which no client holds: complete, never masked), else None."""
    generated = _generated(fed, m)
    if generated is not None:
        x, y, source = generated
        return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64), source
    whole = engine_side(fed)
    if not len(whole.partition.pretrain):
        return None
    idx = torch.as_tensor(whole.partition.pretrain, dtype=torch.long, device=whole.data.train_x.device)
    x = modality_part(fed, whole.data.train_x[idx], m)
    return x, whole.data.train_y[idx], (f"pretraining split: {len(idx)} training samples held out, stratified, "
                                        f"before partitioning (--pretrain-size)")


def modality_part(fed: "RoundView", x: torch.Tensor, m: Modality) -> torch.Tensor:
    """``m``'s slice of flat samples, shaped as one sample of it (the whole input on a single-modality task)."""
    if not fed.info.modalities:
        return x
    where, shape = modality_layout(fed.info.modalities)[m.name]
    return x.reshape(len(x), -1)[:, where].reshape(-1, *shape)


def build_feature_bank(fed: "RoundView", kind: str, dim: int, pretrain_steps: int = 0) -> FeatureBank:
    """The fixed features of the run: one extractor (single-modality task) or one per modality,
    pretrained or seeded as the module docstring says, with the features of the training split
    (``cached(0)``, which every client's rows index) and of the global test set cached, and the
    bank's ``facts`` (the record's ``feature_bank``) set."""
    data = engine_side(fed).data
    sources = [data.train_x, data.test_x]
    seed = fed.cfg.seed
    extractors, facts = {}, {}
    for m in bank_modalities(fed):
        found = pretraining_set(fed, m)
        if kind == "pretrained":
            assert found is not None, "check_extractor refuses a modality without pretraining data"
            x, y, source = found
            trained = pretrained.pretrained_encoder(x, y, source, m.shape, dim, fed.num_classes, pretrain_steps)
            extractor, fact = trained.encoder, trained.facts
        else:
            parts = (seed, EXTRACTOR_SEED) + ((m.name,) if fed.info.modalities else ())
            extractor = build_extractor(kind, m.shape, dim, derive_seed(*parts))
            fact = {"source": None, "encoder": f"{kind}, seeded by the run seed, trained nowhere", "trained": False}
        extractor = extractor.to(fed.device)
        if found is not None and len(torch.unique(found[1])) > 1:
            x, y, source = found
            fact["probe"] = {"kind": pretrained.PROBE, "fit_on": source, "fit_samples": int(len(x)),
                             "test_samples": int(len(data.test_y)),
                             "test_acc": pretrained.linear_probe(extractor, x.to(fed.device), y,
                                                                 modality_part(fed, data.test_x, m), data.test_y)}
        else:
            fact["probe"] = None  # no labelled samples beyond the clients' to fit one on
        extractors[m.name], facts[m.name] = extractor, fact
    if not fed.info.modalities:
        bank: FeatureBank = FeatureBank(extractors[WHOLE_INPUT], sources)
    else:
        bank = ModalityFeatureBank(extractors, modality_layout(fed.info.modalities), dim, sources)
    bank.facts = {"extractor": kind, "feature_dim": dim, "modalities": facts}
    return bank


def restrict(u: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Multimodal features [B, M, F] seen through an interface: modalities outside ``keep`` (bool [M]) absent (NaN)."""
    return u.masked_fill(~keep.to(u.device).view(1, -1, 1), float("nan"))


def recipient_interfaces(fed: "RoundView") -> list[tuple[str, ...]]:
    """The distinct sets of modalities the recipients observe, in order of first recipient."""
    out: list[tuple[str, ...]] = []
    for k in fed.recipients:
        if fed.clients[k].modalities not in out:
            out.append(fed.clients[k].modalities)
    return out


def interface_mask(fed: "RoundView", observed: tuple[str, ...]) -> torch.Tensor:
    return torch.tensor([m.name in observed for m in fed.info.modalities], dtype=torch.bool, device=fed.device)


def present_rows(feats: torch.Tensor, idx: torch.Tensor, modalities: tuple[str, ...]) -> dict[str, int]:
    """How many of rows ``idx`` have each modality's features (a client's upload statistic)."""
    if not modalities:
        return {}
    present = torch.isfinite(feats[idx]).all(dim=-1)  # [B, M]
    return {name: int(present[:, i].sum()) for i, name in enumerate(modalities)}


def client_present_rows(fed: "RoundView", cid: int, feats: torch.Tensor, modalities: tuple[str, ...]) -> dict[str, int]:
    """``present_rows`` over client ``cid``'s training rows of the bank's training features."""
    return present_rows(feats, engine_side(fed).clients[cid].train_idx, modalities)


# ----------------------------------------------------------------------------- Q and the endpoints


class SharedPredictor(nn.Module):
    """Q: adapter (+ embedding) -> hidden -> expert + sigma(g) * low-rank residual -> linear head.

    ``modalities`` empty (a single-modality task): one adapter and one embedding read features
    [B, F]. Otherwise one adapter and one embedding per modality read features [B, M, F] (NaN
    where a row lacks the modality) and z is the mean over the modalities a row has of
    (adapter_m(u_m) + e_m); an adapter never sees a row without its modality (so a missing
    modality gets no gradient), and a row with no modality at all gives NaN logits.
    """

    def __init__(self, in_dim: int, hidden: int, rank: int, num_classes: int, modalities: tuple[str, ...] = ()):
        super().__init__()
        self.modalities = tuple(modalities)
        self.hidden = hidden
        if not self.modalities:
            self.adapter = self._adapter(in_dim, hidden)
            self.embedding = nn.Parameter(torch.zeros(hidden))  # task + modality embedding (one task here)
        else:
            self.adapters = nn.ModuleDict({m: self._adapter(in_dim, hidden) for m in self.modalities})
            self.embeddings = nn.ParameterDict({m: nn.Parameter(torch.zeros(hidden)) for m in self.modalities})
        self.expert = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU())
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, hidden, bias=False)
        self.gate = nn.Parameter(torch.zeros(1))
        self.head = nn.Linear(hidden, num_classes)

    @staticmethod
    def _adapter(in_dim: int, hidden: int) -> nn.Module:
        return nn.Sequential(nn.Linear(in_dim, hidden), nn.LayerNorm(hidden), nn.GELU())

    def embed(self, u: torch.Tensor) -> torch.Tensor:
        if not self.modalities:
            return self.adapter(u) + self.embedding
        total = u.new_zeros(len(u), self.hidden)
        count = u.new_zeros(len(u), 1)
        for i, name in enumerate(self.modalities):
            part = u[:, i]
            present = torch.isfinite(part).all(dim=1)
            if bool(present.all()):
                total = total + (self.adapters[name](part) + self.embeddings[name])
                count = count + 1
            elif bool(present.any()):
                rows = present.nonzero().squeeze(1)
                total = total.index_add(0, rows, self.adapters[name](part[rows]) + self.embeddings[name])
                count = count + present.unsqueeze(1).to(count.dtype)
        return total / count  # 0/0 = NaN for a row with none of the modalities

    def forward(self, u):
        z = self.embed(u)
        h = self.expert(z) + torch.sigmoid(self.gate) * self.up(self.down(z))
        return self.head(h)


def new_shared_predictor(fed: "RoundView", feature_dim: int, hidden: int, rank: int) -> SharedPredictor:
    """Q's seeded initialization (derive_seed(seed, "fedsocket-q")), on the run's device; the
    run's global torch RNG stream is left alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(fed.cfg.seed, Q_SEED))
        q = SharedPredictor(feature_dim, hidden, rank, fed.num_classes, tuple(m.name for m in fed.info.modalities))
    return q.to(fed.device)


class QPredictor(nn.Module):
    """Q on the shared features: raw input -> Q's logits (the "q" endpoint)."""

    def __init__(self, bank: FeatureBank, q: nn.Module):
        super().__init__()
        self.bank, self.q = bank, q

    def forward(self, x):
        return self.q(self.bank(x))


class JointPredictor(nn.Module):
    """log((1 - omega) p_Private + omega p_Q): argmax is the Joint decision (the "joint" endpoint).
    Private and Q read the same input ``x``."""

    def __init__(self, private: nn.Module, q_predictor: nn.Module, omega: torch.Tensor):
        super().__init__()
        self.private, self.q_predictor = private, q_predictor
        self.register_buffer("omega", omega)

    def forward(self, x):
        score = joint_score(F.softmax(self.private(x), dim=-1), F.softmax(self.q_predictor(x), dim=-1), self.omega)
        return torch.log(score.clamp_min(EPS))


# ----------------------------------------------------------------------------- local pieces


def warm_up_private(fed: "RoundView", cid: int, epochs: int, smoothing: float) -> float:
    """Stage I: Private alone with CE (label smoothing ``smoothing``), no communication."""
    plan = make_plan(fed, cid, 0, epochs=epochs, purpose=WARMUP)
    return train_client(fed, fed.clients[cid], plan,
                        lambda b, logits: F.cross_entropy(logits, b.y, label_smoothing=smoothing),
                        who=f"client {cid} warm-up")


def private_teacher_logits(fed: "RoundView", cid: int, plan_indices: torch.Tensor) -> torch.Tensor:
    """Private's logits on the un-augmented training samples of a plan (what Q's features describe),
    predicted once per sample: the client's inputs as it holds them (a recipient's without its
    missing modality, a donor's complete)."""
    whole = engine_side(fed)
    client, data = whole.clients[cid], whole.data
    lookup = torch.zeros((len(data.train_y), fed.num_classes), device=data.train_y.device)
    if len(client.train_idx):
        lookup[client.train_idx] = predict_logits(client.model, data.train_x[client.train_idx])
    return lookup[plan_indices]


# ----------------------------------------------------------------------------- holding Q


class SharedPredictorClients:
    """Mixin for a ``Method`` of this family: every client holds the last Q it received (a frozen
    teacher and predictor), its Joint weights and its rho. ``init_clients`` (in ``setup``) builds
    them and sends the initial Q; ``download`` sends the server's current Q; ``calibrate`` picks
    each client's rho on its validation half. Expects ``self.params.endpoint``."""

    bank: FeatureBank
    feats: torch.Tensor
    phi: dict[str, torch.Tensor]

    def init_clients(self, fed: "RoundView", q0: SharedPredictor, grid: list[float], fallback_rho: float,
                     send: bool = True) -> None:
        """``send``: the server sends Q's initialization to every client (metered); False for a Q
        that is never shared (each client builds the same seeded initialization itself)."""
        self.grid, self.fallback_rho = grid, fallback_rho
        self.phi = {k: v.detach().clone() for k, v in q0.state_dict().items()}
        self.predictor_version = 0
        # Each client's last received Q: a frozen teacher and predictor (copies train, not these),
        # kept with its client (under --client-state it waits where the client's model waits).
        self.held = [copy.deepcopy(q0).requires_grad_(False) for _ in fed.clients]
        for client, q in zip(fed.clients, self.held):
            client.hold(q)
        self.held_predictor_version = [-1] * fed.n_clients
        if send:
            self.download(fed, list(range(fed.n_clients)))
        else:
            self.held_predictor_version = [0] * fed.n_clients

    def init_endpoints(self, fed: "RoundView") -> None:
        self.q_predictors = [QPredictor(self.bank, q).eval() for q in self.held]
        self.joint = [JointPredictor(c.model, qp, torch.ones(fed.num_classes, device=fed.device)).eval()
                      for c, qp in zip(fed.clients, self.q_predictors)]
        self.rho = [self.fallback_rho] * fed.n_clients
        self.calibrate(fed, list(range(fed.n_clients)))

    def download(self, fed: "RoundView", clients: list[int]) -> None:
        """The server sends the current Q to ``clients``; each loads it as the Q it holds."""
        if not clients:
            return
        payload = fed.channel.send(SERVER, clients, self.phi, Payload.PARAMS)
        for k in clients:
            self.held[k].load_state_dict(payload)
            self.held_predictor_version[k] = self.predictor_version

    def catch_up(self, fed: "RoundView", active: list[int]) -> None:
        """Send the current Q to the active clients that do not hold it (partial participation)."""
        self.download(fed, [k for k in active if self.held_predictor_version[k] != self.predictor_version])

    def calibrate(self, fed: "RoundView", clients: list[int]) -> None:
        """Pick each client's inference rho on its validation half and set its Joint weights."""
        whole = engine_side(fed)  # each client's validation half
        with fed.timer(Phase.CALIBRATION):
            for k in clients:
                c = whole.clients[k]
                if len(c.val_idx):
                    with torch.no_grad():
                        q_probs = F.softmax(self.held[k](self.feats[c.val_idx]), dim=-1)
                    private_logits = predict_logits(c.model, whole.data.train_x[c.val_idx])
                    self.rho[k] = select_rho(private_logits, q_probs, whole.data.train_y[c.val_idx],
                                             c.train_counts, self.grid)
                else:  # nothing to select on
                    self.rho[k] = self.fallback_rho
                self.joint[k].omega.copy_(joint_weights(c.train_counts, self.rho[k]))

    def state_dict(self, fed: "RoundView") -> dict[str, Any]:
        # The frozen extractors and their cached features are rebuilt identically by setup: not stored.
        return {k: v for k, v in super().state_dict(fed).items() if k not in ("bank", "feats")}  # type: ignore[misc]

    def describe_run(self, fed: "RoundView") -> dict[str, Any]:
        """The record's ``method.run_details``: the feature bank Q reads (``build_feature_bank``)."""
        return {"feature_bank": self.bank.facts}

    def predictor(self) -> str:
        """The headline's predictor: Joint under ``endpoint=joint``, else the card's (Private: the live model)."""
        # "joint" is also method_card's name of that predictor (a layer above: not imported here)
        return "joint" if self.params.endpoint == "joint" else self.card.predictor  # type: ignore[attr-defined]

    def eval_models(self, fed: "RoundView") -> list[nn.Module]:
        if self.params.endpoint == "joint":  # type: ignore[attr-defined]
            return self.joint
        return [c.model for c in fed.clients]

    def endpoints(self, fed: "RoundView") -> dict[str, list[nn.Module]]:
        return {"private": [c.model for c in fed.clients], "q": self.q_predictors, "joint": self.joint}
