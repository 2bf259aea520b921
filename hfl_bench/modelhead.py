"""timm's classifier interface for our own models (``TimmHead``), apart from ``hfl_bench.pools`` so
that model modules the pools register (``hfl_bench.sensor_models``) can build on it without an
import cycle."""

from __future__ import annotations

import torch
from torch import nn


class TimmHead:
    """timm's classifier interface for our own models (``forward_features``, ``forward_head(x,
    pre_logits=True)``, ``num_features``, ``get_classifier``, ``reset_classifier``), so every pool
    member splits into a feature extractor and a head the way timm's own models do (the methods
    that exchange features, prototypes or heads build on it: ``hfl_bench.families.feature_head``).
    ``forward`` is ``forward_head(forward_features(x))``: the same operations as before the split."""

    num_features: int
    classifier_attr = "fc"

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        """The features ``forward_features`` returns, pooled to ``[B, num_features]``."""
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.pool_features(x)
        return x if pre_logits else self.get_classifier()(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return getattr(self, self.classifier_attr)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new linear classifier for ``num_classes`` (0: none, the model returns its pre-logit features)."""
        head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        setattr(self, self.classifier_attr, head)
