"""Frozen feature encoders pretrained on data no client holds: the shared-predictor family's
``extractor=pretrained`` (FedSocket's Q reads fixed features of pretrained encoders, a frozen
ResNet-18 in the paper; this suite is offline, so it pretrains small encoders itself).

- **Where the samples come from** (the family's ``pretraining_set``): a task's own generator when
  it has one for the modality (``Task.pretraining_data``: mnist1d's signals, drawn with a generator
  seed no split of the task uses), else the run's pretraining split (``--pretrain-size``: training
  samples held out, stratified, before partitioning, like the public set; no client holds them).
- **The encoder** (``ConvEncoder``, ``ENCODER_VERSION``): two convolutions, average pooling and a
  linear projection to the feature dimension; 1-D convolutions along W for a signal stored as
  C x 1 x W, 2-D ones otherwise. Trained supervised: cross-entropy through a linear head on the
  features, and the head is dropped.
- **Training** (``train_encoder``): on the CPU (a GPU run and a CPU run share one encoder), under a
  forked RNG with a fixed seed (``ENCODER_SEED``, not the run's: an encoder is a function of its
  pretraining data, as a downloaded one would be), Adam, a fixed number of steps over seeded epoch
  permutations: seconds on one core. Deterministic, so the cache below is only a speedup.
- **The cache** (``pretrained_encoder``): ``<cache>/encoders/<key>.pt`` under ``paths.cache_home()``
  ($XDG_CACHE_HOME/hfl-bench or ~/.cache/hfl-bench). The key hashes the encoder's version, input
  shape, feature dimension and class count, the training hyperparameters and the pretraining
  data's fingerprint (sha256 of the tensors' bytes). Written atomically; each file carries the
  sha256 of its payload. Read only as a regular file no larger than the encoder's tensors and a
  margin, opened non-blocking (``hfl_bench.regularfile``): a FIFO or a link to ``/dev/zero`` at
  the path is never waited on or read. One that is not such a file, fails its sha256, does not
  load or holds another key is named in one warning, trained again and replaced, never trusted.
- **The linear probe** (``linear_probe``): how much the frozen features say about the labels, for
  the record: a ridge classifier fit on the features of the pretraining samples (never a
  client's), only scored on the task's test set.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.config import canonical_json
from hfl_bench.paths import cache_home, unseal, write_sealed
from hfl_bench.regularfile import read_regular
from hfl_bench.training import predict_logits

# Bump when the encoder's architecture or training changes: it is part of the cache key and of
# the record, and a method's version moves with it.
ENCODER_VERSION = "conv-1.0"
ENCODER_SEED = 20260049
BATCH_SIZE, LR = 64, 1e-3
CACHE_MAGIC = b"hfl-bench encoder 1\n"
CACHE_MARGIN = 1 << 20  # beyond the tensors' bytes: the header, torch's archive, the key
log = logging.getLogger(__name__)


class ConvEncoder(nn.Module):
    """Two ReLU convolutions, average pooling and a linear projection to ``dim``: 1-D along W for a
    signal stored as C x 1 x W (mnist1d), 2-D for a C x H x W image."""

    def __init__(self, input_shape: tuple[int, ...], dim: int, width: int = 32):
        super().__init__()
        c, h, w = input_shape
        self.signal = h == 1
        if self.signal:
            pool = min(w, 8)
            self.body = nn.Sequential(nn.Conv1d(c, width, 5, padding=2), nn.ReLU(),
                                      nn.Conv1d(width, 2 * width, 5, padding=2), nn.ReLU(),
                                      nn.AdaptiveAvgPool1d(pool), nn.Flatten())
            fan_in = 2 * width * pool
        else:
            ph, pw = min(h, 4), min(w, 4)
            self.body = nn.Sequential(nn.Conv2d(c, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d((ph, pw)), nn.Flatten())
            fan_in = 2 * width * ph * pw
        self.project = nn.Linear(fan_in, dim)

    def forward(self, x):
        if self.signal:
            x = x.reshape(len(x), x.shape[1], x.shape[-1])
        return self.project(self.body(x))


def data_fingerprint(x: torch.Tensor, y: torch.Tensor) -> str:
    """16 hex characters of a sha256 over the samples (float32) and labels (int64), shapes included."""
    h = hashlib.sha256()
    for a in (x.detach().cpu().to(torch.float32), y.detach().cpu().to(torch.int64)):
        arr = np.ascontiguousarray(a.numpy())
        h.update(f"{arr.dtype.str}{list(arr.shape)}".encode())
        h.update(memoryview(arr).cast("B"))
    return h.hexdigest()[:16]


def train_encoder(x: torch.Tensor, y: torch.Tensor, input_shape: tuple[int, ...], dim: int, num_classes: int,
                  steps: int) -> ConvEncoder:
    """The encoder after ``steps`` Adam steps of cross-entropy through a linear head (dropped), on
    the CPU, from ``ENCODER_SEED``; the caller's global RNG streams are left alone."""
    x, y = x.detach().cpu().float(), y.detach().cpu().long()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ENCODER_SEED)
        encoder, head = ConvEncoder(input_shape, dim), nn.Linear(dim, num_classes)
        order = torch.Generator().manual_seed(ENCODER_SEED)
        opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=LR)
        perm, at = torch.randperm(len(x), generator=order), 0
        for _ in range(steps):
            if at >= len(perm):
                perm, at = torch.randperm(len(x), generator=order), 0
            idx = perm[at : at + BATCH_SIZE]
            at += BATCH_SIZE
            loss = F.cross_entropy(head(encoder(x[idx])), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return encoder.requires_grad_(False).eval()


def cache_path(key: str) -> Path:
    return cache_home() / "encoders" / f"{key}.pt"


def _read_cache(path: Path, key: str, limit: int) -> dict[str, torch.Tensor] | None:
    """The cached state dict, or None when the file is absent, or is not a regular file of at most
    ``limit`` bytes (a FIFO, a link to a device: ``regularfile``, never waited on or read past the
    limit), or is damaged (its payload's sha256 disagrees), unreadable or of another key: then the
    caller trains again, and a file that was there but unusable is named in one warning."""
    try:
        blob = read_regular(path, limit)
    except FileNotFoundError:
        return None
    except OSError as e:
        return _unusable(path, e.strerror or str(e))
    payload, problem = unseal(blob, CACHE_MAGIC)
    if payload is None:
        return _unusable(path, "damaged" if problem == "damaged" else "not an encoder cache file")
    try:
        obj = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception:
        return _unusable(path, "it does not load")
    if not isinstance(obj, dict) or obj.get("key") != key or not isinstance(obj.get("state"), dict):
        return _unusable(path, "it holds another encoder")
    return obj["state"]


def _unusable(path: Path, why: str) -> None:
    log.warning("warning: the encoder cache %s cannot be used (%s); the encoder is trained again and the "
                "file replaced", path, why)
    return None


def cache_limit(encoder: nn.Module) -> int:
    """The most bytes a cache file of ``encoder`` may hold: its state's tensors, and a margin for
    the header and torch's archive."""
    return sum(t.numel() * t.element_size() for t in encoder.state_dict().values()) + CACHE_MARGIN


def _write_cache(path: Path, key: str, encoder: nn.Module) -> None:
    """Best effort: a cache that cannot be written only costs the next run a retraining."""
    buf = io.BytesIO()
    torch.save({"key": key, "state": encoder.state_dict()}, buf)
    try:
        write_sealed(path, CACHE_MAGIC, buf.getvalue())
    except OSError:
        pass


@dataclass
class PretrainedEncoder:
    encoder: ConvEncoder
    facts: dict[str, Any]  # what the record says of it (``pretrained_encoder``)


def pretrained_encoder(x: torch.Tensor, y: torch.Tensor, source: str, input_shape: tuple[int, ...], dim: int,
                       num_classes: int, steps: int) -> PretrainedEncoder:
    """The frozen encoder pretrained on ``(x, y)``: loaded from the cache when it holds this key,
    else trained (``train_encoder``) and cached. ``facts``: the pretraining data (``source``, size,
    fingerprint), the encoder version, whether this call trained it or loaded it, and when trained
    its steps and wall seconds."""
    fingerprint = data_fingerprint(x, y)
    train = {"steps": steps, "batch_size": BATCH_SIZE, "lr": LR, "seed": ENCODER_SEED, "optimizer": "adam"}
    key = hashlib.sha256(canonical_json({
        "version": ENCODER_VERSION, "input_shape": list(input_shape), "dim": dim, "num_classes": num_classes,
        "train": train, "data": fingerprint}).encode()).hexdigest()[:32]
    facts: dict[str, Any] = {"source": source, "pretraining_samples": int(len(x)),
                             "pretraining_fingerprint": fingerprint, "encoder_version": ENCODER_VERSION,
                             "cache_key": key}
    path = cache_path(key)
    with torch.random.fork_rng(devices=[]):
        encoder = ConvEncoder(input_shape, dim)
    state = _read_cache(path, key, cache_limit(encoder))
    if state is not None:
        try:
            encoder.load_state_dict(state)
            return PretrainedEncoder(encoder.requires_grad_(False).eval(), {**facts, "trained": False})
        except (RuntimeError, KeyError):
            _unusable(path, "its tensors do not fit the encoder")  # another shape under this key
    start = time.perf_counter()
    encoder = train_encoder(x, y, input_shape, dim, num_classes, steps)
    seconds = time.perf_counter() - start
    _write_cache(path, key, encoder)
    return PretrainedEncoder(encoder, {**facts, "trained": True, "pretrain_steps": steps,
                                       "pretrain_seconds": round(seconds, 3)})


# The probe: a ridge classifier (least squares onto one-hot labels, L2 weight PROBE_L2, bias
# unpenalized) on standardized features; closed form, so deterministic and milliseconds, where an
# iterative logistic regression took tens of seconds on 4,000 samples on one core.
PROBE = "ridge classifier on standardized features (L2 1.0)"
PROBE_L2 = 1.0


def linear_probe(encoder: nn.Module, fit_x: torch.Tensor, fit_y: torch.Tensor, test_x: torch.Tensor,
                 test_y: torch.Tensor) -> float:
    """Test accuracy (percent) of a linear probe (``PROBE``) on the frozen features, fit on
    ``(fit_x, fit_y)`` (the pretraining samples) and only scored on ``(test_x, test_y)``."""
    with torch.no_grad():
        f_fit = predict_logits(encoder, fit_x).double().cpu()
        f_test = predict_logits(encoder, test_x).double().cpu()
    mean, std = f_fit.mean(0), f_fit.std(0).clamp_min(1e-8)
    z_fit, z_test = (f_fit - mean) / std, (f_test - mean) / std
    classes = int(max(fit_y.max(), test_y.max())) + 1
    targets = F.one_hot(fit_y.cpu().long(), classes).double()
    centred = targets - targets.mean(0)  # the bias absorbs the means (features are centred)
    gram = z_fit.T @ z_fit + PROBE_L2 * torch.eye(z_fit.shape[1], dtype=torch.float64)
    weights = torch.linalg.solve(gram, z_fit.T @ centred)
    scores = z_test @ weights + targets.mean(0)
    return round(100.0 * float((scores.argmax(1) == test_y.cpu()).double().mean()), 2)
