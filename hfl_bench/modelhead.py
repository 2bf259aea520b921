"""timm's classifier interface for our own models (``TimmHead``) and the convolution stack they
share (``conv_stack``), apart from ``hfl_bench.pools`` so that model modules the pools register
(``hfl_bench.sensor_models``, ``hfl_bench.width_models``, ``hfl_bench.depth_models``) can build on
them without an import cycle."""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

import torch
from torch import nn


def pool_kernel(size: tuple[int, ...]) -> tuple[int, ...]:
    """2x2 pooling, except along a dimension that is already 1 (1-D signals as 1xL images)."""
    return tuple(2 if s >= 2 else 1 for s in size)


def conv_stack(in_chans: int, widths: Sequence[int], img_size: Sequence[int],
               block: Callable[[int, int], list[nn.Module]], pool_after: Container[int]) -> tuple[nn.Sequential, int]:
    """Layer i's modules ``block(cin, widths[i])``, each followed by a ``pool_kernel`` max-pool when
    i is in ``pool_after``; returns the stack and its output channels. Modules are built in that
    order, so a seed draws the same parameters as a model that builds them inline."""
    layers: list[nn.Module] = []
    size = tuple(img_size)
    cin = in_chans
    for i, cout in enumerate(widths):
        layers += block(cin, cout)
        if i in pool_after:
            kernel = pool_kernel(size)
            layers.append(nn.MaxPool2d(kernel))
            size = tuple(s // k for s, k in zip(size, kernel))
        cin = cout
    return nn.Sequential(*layers), cin


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
