"""The feature / head split that methods exchanging features, prototypes or heads build on.

HtFLlib's methods (FedProto, FedTGP, LG-FedAvg, FedGH, FedGen, FedKD, FedMRL, FedL2G, FD) see every
client model as a feature extractor ("base") with a fixed output size ``d`` followed by a head
``Linear(d, C)``. Heterogeneous architectures have different native feature sizes, so HtFLlib puts a
parameter-free ``AdaptiveAvgPool1d(d)`` where the classifier was: a feature of ``D > d`` values is
averaged over adjacent windows, one of ``D < d`` values has each value repeated, and ``D == d`` is
left alone (spec: ``../shared/specs/htfllib-methods.md`` section 0).

We make the same choice, in timm's terms: a pool member's features are its pre-logit output
(``forward_head(forward_features(x), pre_logits=True)``, ``num_features`` values; our own models and
timm's all give it), the member's classifier is dropped (``reset_classifier(0)``), the features are
pooled without parameters to ``feature_dim`` and a new ``Linear(feature_dim, C)`` is the head. Why
not a learned projection: it would add parameters that only some methods train, and the
side-by-side check against HtFLlib needs its split. ``feature_dim = 0`` ("auto") takes the largest
native feature size in the pool, so no member's features are averaged away (smaller ones are
repeated); HtFLlib's 512 is one flag away. Every split head has the same shape, so head-sharing
methods run on any pool whose members all have the split; a member without it is refused in one line.

Used by methods through ``split_client_models(fed, feature_dim, seed_tag)`` in ``setup``: it replaces
each client's model (and optimizer) with its split. The split model's ``forward`` is
``head(features)``, so the engine evaluates it like any model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.pools import PoolMember, build_model
from hfl_bench.training import derive_seed

if TYPE_CHECKING:
    from hfl_bench.data import TaskInfo
    from hfl_bench.federation import RoundView

SPLIT_INTERFACE = ("forward_features", "forward_head", "reset_classifier")


def fit_width(features: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, D]`` features pooled to ``[B, width]`` without parameters (HtFLlib's
    ``AdaptiveAvgPool1d``): window means for ``D > width``, repeats for ``D < width``, identity at
    ``D == width``."""
    if features.shape[1] == width:
        return features
    return F.adaptive_avg_pool1d(features.unsqueeze(1), width).squeeze(1)


class FeatureHeadModel(nn.Module):
    """A pool model split into ``backbone`` (its pre-logit features pooled to ``num_features``) and
    ``head`` (a new ``Linear(num_features, num_classes)``), with timm's classifier interface."""

    def __init__(self, backbone: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        check_split(backbone, type(backbone).__name__)
        backbone.reset_classifier(0)
        self.backbone = backbone
        self.num_features = feature_dim
        self.head = nn.Linear(feature_dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, num_features]``: the backbone's pre-logit features, pooled to the common width."""
        native = self.backbone.forward_head(self.backbone.forward_features(x), pre_logits=True)
        return fit_width(native.flatten(1), self.num_features)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head


def check_split(model: nn.Module, name: str) -> None:
    """Refuse (one ConfigError) a model without timm's split interface."""
    missing = [a for a in SPLIT_INTERFACE if not callable(getattr(model, a, None))]
    if missing or not isinstance(getattr(model, "num_features", None), int):
        raise ConfigError(f"pool member {name} has no feature / head split (timm's forward_features, "
                          "forward_head(x, pre_logits=True), num_features, reset_classifier); methods that "
                          "exchange features, prototypes or heads need one")


def native_width(member: PoolMember, info: "TaskInfo") -> int:
    """The member's pre-logit feature size on this task (built on the meta device: no memory, no RNG)."""
    with torch.device("meta"):
        model = build_model(member, info)
    check_split(model, member.name)
    return int(model.num_features)


def resolve_feature_dim(fed: "RoundView", feature_dim: int, members: list[PoolMember] | None = None) -> int:
    """``feature_dim``, or (0) the largest native feature size among ``members`` (default: the pool)."""
    if feature_dim < 0:
        raise ConfigError(f"feature_dim must be >= 0 (0 = the pool's largest feature size), got {feature_dim}")
    widths = [native_width(m, fed.info) for m in (members or list(fed.pool.members))]
    return feature_dim or max(widths)


def split_model(fed: "RoundView", model: nn.Module, feature_dim: int, *seed_parts) -> FeatureHeadModel:
    """``model`` split, its new head initialized from ``derive_seed(fed.cfg.seed, *seed_parts)``
    (the run's global RNG stream is left alone), on the run's device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(fed.cfg.seed, *seed_parts))
        return FeatureHeadModel(model, feature_dim, fed.num_classes).to(fed.device)


def split_client_models(fed: "RoundView", feature_dim: int, tag: str = "head") -> int:
    """Replace every client's model by its split (heads seeded by ``(tag, cid)``) and its optimizer
    by the protocol's for the split model. Returns the common feature width used."""
    width = resolve_feature_dim(fed, feature_dim)
    for client in fed.clients:
        client.model = split_model(fed, client.model, width, tag, client.cid)
        client.optimizer = fed.make_optimizer(client.model)
    return width


class ClassMeans:
    """Accumulates per-class feature (or logit) sums over batches: ``add(features, y)``, then
    ``means()`` -> ``([C, d] float32 means, [C] bool present)``."""

    def __init__(self, num_classes: int, width: int, device: torch.device):
        self.sums = torch.zeros(num_classes, width, dtype=torch.float64, device=device)
        self.counts = torch.zeros(num_classes, dtype=torch.float64, device=device)

    def add(self, features: torch.Tensor, y: torch.Tensor) -> None:
        self.sums.index_add_(0, y, features.detach().double())
        self.counts += torch.bincount(y, minlength=len(self.counts)).to(torch.float64)

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        present = self.counts > 0
        return (self.sums / self.counts.clamp_min(1).unsqueeze(1)).float(), present


class NearestPrototype(nn.Module):
    """Classifies by the nearest global prototype (FedProto, FedTGP): logits are minus the mean
    squared distance of the split model's features to each class's prototype; classes without a
    prototype get the lowest finite value (never predicted unless a distance overflows, and not an
    infinity, which the evaluator reads as a diverged model). Prototypes exist from the end of round 1 on, before
    the engine first evaluates (HtFLlib logs accuracy 0 at its round 0, which evaluates first)."""

    def __init__(self, model: FeatureHeadModel, prototypes: torch.Tensor, present: torch.Tensor):
        super().__init__()
        self.model = model
        self.prototypes = prototypes
        self.present = present

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.model.forward_features(x)
        dist = ((f.unsqueeze(1) - self.prototypes.unsqueeze(0)) ** 2).mean(dim=2)
        return (-dist).masked_fill(~self.present.unsqueeze(0), torch.finfo(dist.dtype).min)
