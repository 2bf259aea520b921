"""Teacher-aggregation rules of the peer-KD backbone (registered, vectorized).

Public API for plugin authors::

    from hfl_bench.aggregation import get_aggregator
    agg = get_aggregator("crad", **hparams)
    targets = agg(probs, counts, accs)

``probs`` is [K, B, C] (K teachers' temperature-softened probabilities on B samples),
``counts`` and ``accs`` are [K, C] (each teacher's per-class validation count and accuracy).
The result is [B, C] on the probability simplex. Every rule works on a whole batch (or a whole
epoch) at once; none loops over samples or classes in Python.

CRAD follows the paper (arXiv 2609.00446, Sec. 3.3, Algorithm 1). Where the paper is silent we
chose, and every record says so:
- support filter: a teacher counts for class c only with at least ``min_support`` (2) validation
  samples of c;
- if no teacher is supported for a class, that class falls back to the plain mean of all teachers;
- the agreement filter's median is the usual one (mean of the two middle values for an even count),
  taken per sample and per class over the supported teachers;
- the Table 4 weightings other than precision are reconstructed from their names only;
  "ce" weights by 1 / (-log a~), the cross-entropy of a teacher right with probability a~.
"""

from __future__ import annotations

import functools
from typing import Callable, Protocol

import torch

from hfl_bench.registry import AGGREGATORS


class Aggregator(Protocol):
    def __call__(self, probs: torch.Tensor, counts: torch.Tensor, accs: torch.Tensor) -> torch.Tensor: ...


def register_aggregator(name: str):
    """Register a factory ``(**hparams) -> Aggregator`` under ``name``."""
    return AGGREGATORS.register(name)


def get_aggregator(name: str, **hparams) -> Aggregator:
    factory = AGGREGATORS.get(name)
    return factory(**hparams)


def _renormalize(q: torch.Tensor) -> torch.Tensor:
    return q / q.sum(dim=-1, keepdim=True).clamp_min(1e-12)


@register_aggregator("uniform")
def uniform(**_) -> Aggregator:
    """Plain mean of the teachers' probabilities (Uniform KD)."""

    def agg(probs, counts=None, accs=None):
        return probs.mean(dim=0)

    return agg


def entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * p.clamp_min(1e-12).log()).sum(dim=-1)


@register_aggregator("entropy")
def entropy_weighted(**_) -> Aggregator:
    """Per sample, teachers weighted by softmax over teachers of minus their entropy (Uncertainty KD)."""

    def agg(probs, counts=None, accs=None):
        w = torch.softmax(-entropy(probs), dim=0)  # [K, B]
        return _renormalize((w.unsqueeze(-1) * probs).sum(dim=0))

    return agg


def agresti_coull(counts: torch.Tensor, accs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Smoothed accuracy a~ = (a n + 2) / (n + 4) and its variance a~ (1 - a~) / (n + 4)."""
    n = counts.to(torch.float64)
    a_s = (accs.to(torch.float64) * n + 2.0) / (n + 4.0)
    var = a_s * (1.0 - a_s) / (n + 4.0)
    return a_s, var


def _weights_precision(a_s, var, counts, accs, eps):
    return 1.0 / (var + eps)


def _weights_accuracy(a_s, var, counts, accs, eps):
    return accs.to(torch.float64)


def _weights_support(a_s, var, counts, accs, eps):
    return counts.to(torch.float64)


def _weights_softmax(a_s, var, counts, accs, eps):
    return -var  # logits; softmax over the surviving teachers is taken in crad()


def _weights_lcb(a_s, var, counts, accs, eps):
    return (a_s - var.sqrt()).clamp_min(0.0)


def _weights_inv_sigma(a_s, var, counts, accs, eps):
    return 1.0 / (var.sqrt() + eps)


def _weights_ce(a_s, var, counts, accs, eps):
    return 1.0 / (-a_s.log() + eps)


WEIGHTINGS: dict[str, Callable] = {
    "precision": _weights_precision,
    "accuracy": _weights_accuracy,
    "support": _weights_support,
    "softmax": _weights_softmax,
    "lcb": _weights_lcb,
    "inv_sigma": _weights_inv_sigma,
    "ce": _weights_ce,
}


def masked_median(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Median over dim 0 of ``values`` where ``mask`` holds (mean of the middle two if even).

    Entries with no valid value get +inf (callers handle that case separately).
    """
    filled = torch.where(mask, values, torch.full_like(values, float("inf")))
    ordered = filled.sort(dim=0).values
    m = mask.sum(dim=0)
    lo = ((m - 1).clamp_min(0) // 2).unsqueeze(0)
    hi = (m // 2).clamp_max(values.shape[0] - 1).unsqueeze(0)
    med = 0.5 * (ordered.gather(0, lo) + ordered.gather(0, hi)).squeeze(0)
    return torch.where(m > 0, med, torch.full_like(med, float("inf")))


def crad_aggregate(
    probs: torch.Tensor,
    counts: torch.Tensor,
    accs: torch.Tensor,
    *,
    min_support: float = 2,
    eps: float = 1e-8,
    weighting: str = "precision",
) -> torch.Tensor:
    """CRAD: support filter, per-sample per-class median agreement filter, weighted mean, renormalize."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown CRAD weighting {weighting!r}; choose from {sorted(WEIGHTINGS)}")
    k, b, c = probs.shape
    p = probs.to(torch.float64)
    supported = (counts.to(probs.device) >= min_support).unsqueeze(1).expand(k, b, c)  # [K, B, C]
    n_sup = supported.sum(dim=0)  # [B, C]
    consensus = (p * supported).sum(dim=0) / n_sup.clamp_min(1)
    deviation = (p - consensus).abs()
    tau = masked_median(deviation, supported)
    keep = supported & (deviation <= tau)

    a_s, var = agresti_coull(counts.to(probs.device), accs.to(probs.device))
    w = WEIGHTINGS[weighting](a_s, var, counts.to(probs.device), accs.to(probs.device), eps)
    w = w.unsqueeze(1).expand(k, b, c)
    if weighting == "softmax":
        w = torch.softmax(torch.where(keep, w, torch.full_like(w, float("-inf"))), dim=0)
        w = torch.nan_to_num(w, nan=0.0)  # classes with no survivor: replaced by the fallback below
    w = w * keep
    q = (w * p).sum(dim=0) / (w.sum(dim=0) + eps)
    q = torch.where(n_sup > 0, q, p.mean(dim=0))  # no supported teacher: plain mean for that class
    return _renormalize(q).to(probs.dtype)


def _crad_factory(weighting: str):
    def factory(min_support: float = 2, eps: float = 1e-8, weighting: str = weighting, **_) -> Aggregator:
        return functools.partial(crad_aggregate, min_support=min_support, eps=eps, weighting=weighting)

    factory.__doc__ = f"CRAD filters, then weights survivors by {weighting} (paper Table 4 variant)."
    return factory


_crad = _crad_factory("precision")
_crad.__doc__ = "CRAD (paper): support + agreement filters, Agresti-Coull precision weights."
register_aggregator("crad")(_crad)
for _name, _weighting in [
    ("crad-accuracy", "accuracy"),
    ("crad-support", "support"),
    ("crad-softmax", "softmax"),
    ("crad-lcb", "lcb"),
    ("crad-inv-sigma", "inv_sigma"),
    ("crad-ce", "ce"),
]:
    register_aggregator(_name)(_crad_factory(_weighting))
