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
  "ce" weights by 1 / (-log a~), the cross-entropy of a teacher right with probability a~;
- a class whose surviving teachers all weigh 0 (accuracy-only weights when none of them got a
  validation sample of the class right, as every teacher of a class can in round 1) takes the
  uniform mean of its survivors instead of losing its target mass (the limit of weights a + d for
  d -> 0: equal weights among equally weighted teachers). Only the "accuracy" weighting, and
  "support" with ``min_support`` <= 0, can give such weights.

The filter ablations compose the same stages with one removed (``crad_aggregate``'s ``agreement``
and the "uniform" weighting): ``crad-stage1`` is the paper's Stage-1 ablation (both filters, equal
weights over the survivors; Sec. 4, Figs. 2-3), ``crad-no-agreement-filter`` keeps the support
filter and the precision weights, ``crad-support-filter-only`` keeps the support filter alone.

Every rule has a version (``register_aggregator(name, version=...)``, "1.0" when none is declared):
bump it whenever what the rule computes changes. A run whose ``aggregator`` hyperparameter names a
rule past "1.0" records it in its method version (``run_version``), so its
records never share a leaderboard group with the rule's earlier numerics.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Protocol

import torch

from hfl_bench.registry import AGGREGATORS, RegistryError


class Aggregator(Protocol):
    def __call__(self, probs: torch.Tensor, counts: torch.Tensor, accs: torch.Tensor) -> torch.Tensor: ...


# The version of a rule that declares none: every rule's version before rules had versions.
FIRST_VERSION = "1.0"
_VERSION_PATTERN = re.compile(r"[0-9]+(\.[0-9]+){0,3}")
_VERSIONS: dict[str, str] = {}  # name -> version declared by register_aggregator


def register_aggregator(name: str, *, version: str = FIRST_VERSION):
    """Register a factory ``(**hparams) -> Aggregator`` under ``name``, at ``version`` (digits and
    dots; bump it whenever what the rule computes changes)."""
    if not (isinstance(version, str) and _VERSION_PATTERN.fullmatch(version)):
        raise ValueError(f"aggregator {name!r}: version must be a string like \"1.0\" (digits and dots), "
                         f"got {version!r}")

    def add(factory):
        registered = AGGREGATORS.register(name)(factory)
        _VERSIONS[name] = version
        return registered

    return add


def aggregator_version(name: str) -> str:
    """The version of the rule registered as ``name``: the one ``register_aggregator`` declared, else
    the factory's ``version`` attribute (an entry point that names a function), else
    ``FIRST_VERSION``. RegistryError for an unknown name."""
    factory = AGGREGATORS.get(name)
    version = _VERSIONS.get(name, getattr(factory, "version", FIRST_VERSION))
    return version if isinstance(version, str) and _VERSION_PATTERN.fullmatch(version) else FIRST_VERSION


def run_version(card_version: str, hparams: Any) -> str:
    """The version of a run's numerics, recorded as ``method.version``: the method card's, or, when
    the method's ``aggregator`` hyperparameter names a rule past its first version
    (``aggregator_version``), ``<card version>+<rule>-<rule version>`` (e.g.
    ``1.0+crad-accuracy-1.1``). A rule's fix thus moves the records of the runs that use it, and only
    those, out of the groups, resumes and pins of its earlier numerics; a run of a rule still at
    "1.0" records the card's version, as every record did before rules had versions."""
    name = hparams.get("aggregator") if isinstance(hparams, dict) else None
    if not isinstance(name, str):
        return card_version
    try:
        version = aggregator_version(name)
    except RegistryError:  # not a registered rule: the method refuses it itself
        return card_version
    return card_version if version == FIRST_VERSION else f"{card_version}+{name}-{version}"


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


def _weights_uniform(a_s, var, counts, accs, eps):
    return torch.ones_like(a_s)  # no reliability weight: the filter ablations' equal weights


WEIGHTINGS: dict[str, Callable] = {
    "precision": _weights_precision,
    "uniform": _weights_uniform,
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


def support_filter(counts: torch.Tensor, batch: int, min_support: float) -> torch.Tensor:
    """CRAD's support filter: [K, B, C], true where teacher k holds at least ``min_support``
    validation samples of class c (the same for every sample)."""
    k, c = counts.shape
    return (counts >= min_support).unsqueeze(1).expand(k, batch, c)


def agreement_filter(p: torch.Tensor, supported: torch.Tensor) -> torch.Tensor:
    """CRAD's agreement filter (paper Eq. 5): of the ``supported`` teachers, per sample and class,
    those whose probability deviates from the supported teachers' mean by at most the median
    deviation. [K, B, C]."""
    consensus = (p * supported).sum(dim=0) / supported.sum(dim=0).clamp_min(1)
    deviation = (p - consensus).abs()
    tau = masked_median(deviation, supported)
    return supported & (deviation <= tau)


def teacher_weights(weighting: str, counts: torch.Tensor, accs: torch.Tensor, eps: float) -> torch.Tensor:
    """Each teacher's per-class weight [K, C] (float64) under ``weighting`` (``WEIGHTINGS``), from the
    Agresti-Coull smoothed accuracy and its variance; for "softmax" these are logits."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown CRAD weighting {weighting!r}; choose from {sorted(WEIGHTINGS)}")
    a_s, var = agresti_coull(counts, accs)
    return WEIGHTINGS[weighting](a_s, var, counts, accs, eps)


def weighted_mean(p: torch.Tensor, keep: torch.Tensor, w: torch.Tensor, eps: float, *,
                  softmax: bool = False) -> torch.Tensor:
    """Per sample and class, the mean of the kept teachers' probabilities under the per-class
    weights ``w`` [K, C] (paper Eq. 8, before renormalizing): [B, C]; 0 where no teacher is kept.
    With ``softmax``, ``w`` are logits, normalized over the kept teachers."""
    k, b, c = p.shape
    w = w.unsqueeze(1).expand(k, b, c)
    if softmax:
        w = torch.softmax(torch.where(keep, w, torch.full_like(w, float("-inf"))), dim=0)
        w = torch.nan_to_num(w, nan=0.0)  # classes with no survivor: nothing kept, 0 below
    w = w * keep
    # Survivors that all weigh 0 (accuracy-only weights of teachers that got no validation sample of
    # the class right: every teacher of a class can in round 1) would give the class no target mass,
    # so it would be distilled towards 0 and stay unlearned: it takes the survivors' uniform mean
    # instead, the limit of weights w + d as d -> 0. Weights that are positive somewhere are untouched.
    w = torch.where(w.sum(dim=0) > 0, w, keep.to(w.dtype))
    return (w * p).sum(dim=0) / (w.sum(dim=0) + eps)


def crad_aggregate(
    probs: torch.Tensor,
    counts: torch.Tensor,
    accs: torch.Tensor,
    *,
    min_support: float = 2,
    eps: float = 1e-8,
    weighting: str = "precision",
    agreement: bool = True,
) -> torch.Tensor:
    """CRAD: support filter, per-sample per-class median agreement filter (unless ``agreement`` is
    false), weighted mean of the survivors, renormalize. A class no teacher supports takes the plain
    mean of all teachers."""
    b = probs.shape[1]
    p = probs.to(torch.float64)
    counts, accs = counts.to(probs.device), accs.to(probs.device)
    supported = support_filter(counts, b, min_support)  # [K, B, C]
    keep = agreement_filter(p, supported) if agreement else supported
    w = teacher_weights(weighting, counts, accs, eps)  # [K, C]
    q = weighted_mean(p, keep, w, eps, softmax=weighting == "softmax")
    q = torch.where(supported.any(dim=0), q, p.mean(dim=0))  # no supported teacher: plain mean for that class
    return _renormalize(q).to(probs.dtype)


def _crad_factory(weighting: str, doc: str, agreement: bool = True):
    def factory(min_support: float = 2, eps: float = 1e-8, weighting: str = weighting, agreement: bool = agreement,
                **_) -> Aggregator:
        return functools.partial(crad_aggregate, min_support=min_support, eps=eps, weighting=weighting,
                                 agreement=agreement)

    factory.__doc__ = doc
    return factory


register_aggregator("crad")(_crad_factory(
    "precision", "CRAD (paper): support + agreement filters, Agresti-Coull precision weights."))
# The paper's Table 4: the precision weight swapped for another, the rest of CRAD fixed.
# accuracy 1.1, support 1.1: a class whose survivors all weigh 0 keeps its target mass (weighted_mean);
# 1.0 gave it none (accuracy-only: every class in round 1 whose teachers all scored 0 on it).
for _name, _weighting, _version, _doc in [
    ("crad-accuracy", "accuracy", "1.1", "CRAD filters, then weights survivors by their raw per-class accuracy "
     "(paper Table 4 \"Acc.\"; survivors all at accuracy 0: their uniform mean)."),
    ("crad-support", "support", "1.1", "CRAD filters, then weights survivors by their per-class validation count "
     "(paper Table 4 \"Sup.\")."),
    ("crad-softmax", "softmax", FIRST_VERSION, "CRAD filters, then weights survivors by softmax(-sigma^2) "
     "(paper Table 4 \"SM\")."),
    ("crad-lcb", "lcb", FIRST_VERSION, "CRAD filters, then weights survivors by max(0, a~ - sigma) "
     "(paper Table 4 \"LCB\")."),
    ("crad-inv-sigma", "inv_sigma", FIRST_VERSION, "CRAD filters, then weights survivors by 1 / sigma "
     "(paper Table 4 \"1/sigma\")."),
    ("crad-ce", "ce", FIRST_VERSION, "CRAD filters, then weights survivors by 1 / (-log a~) "
     "(paper Table 4 \"CE\", reconstructed)."),
]:
    register_aggregator(_name, version=_version)(_crad_factory(_weighting, _doc))
# The filter ablations (paper Sec. 4, Figs. 2-3, and the suite's claims): CRAD with a stage removed.
register_aggregator("crad-stage1")(_crad_factory("uniform", """\
CRAD without the precision weights (the paper's Stage-1 ablation): both filters, equal weights.

The support and agreement filters as in ``crad``, then the plain mean of the surviving teachers per
sample and class. Against ``crad`` it measures what precision weighting adds; the paper reports
that it tracks the uniform average on rare classes (Sec. 4, Fig. 2) and trails CRAD (Fig. 3)."""))
register_aggregator("crad-no-agreement-filter")(_crad_factory("precision", """\
CRAD without the agreement filter: support filter, then precision weights.

Every teacher with ``min_support`` validation samples of a class is weighted by its Agresti-Coull
precision, including those far from the peer consensus that ``crad`` drops: against ``crad`` it
measures what the agreement filter adds.""", agreement=False))
register_aggregator("crad-support-filter-only")(_crad_factory("uniform", """\
CRAD without the agreement filter and the precision weights: the support filter alone.

The plain mean of the teachers with ``min_support`` validation samples of each class. Against
``uniform`` it measures what the support filter alone adds; against ``crad-no-agreement-filter``,
what precision weights add without the agreement filter.""", agreement=False))
