"""Width-scalable models: one global architecture whose hidden layers can be built at a width rate r
in (0, 1], the models of the sub-model family (``hfl_bench.families.submodel``: HeteroFL, FedRolex).

``heterofl_cnn`` is HeteroFL's CNN (Diao et al., ICLR 2021, their ``conv.py``): per hidden layer a
3x3 convolution with bias, the scaler module (activations divided by the rate while training, so a
sub-model's outputs match the full model's scale), static batch norm (``track_running_stats=False``:
no running statistics, every forward normalizes with its own batch's statistics, evaluation
included), ReLU and a 2x2 max-pool after every layer but the last; then global average pooling and
a linear classifier. The first layer's input channels and the classifier's classes are never
scaled. The pre-activation ResNet-18 of the paper is not built here (yet).

Each model states which hidden layer every parameter dimension belongs to (``width_axes``): the
slicing and aggregation code reads that, not the layer types.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hfl_bench.modelhead import TimmHead, conv_stack


class Scaler(nn.Module):
    """HeteroFL's scaler: divides by the width rate in training mode, identity in evaluation."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training else x


def scaled_width(channels: int, rate: float) -> int:
    """A hidden layer's channels at ``rate``: ceil(rate * channels), at least 1 (HeteroFL's rule)."""
    return max(1, int(math.ceil(rate * channels - 1e-9)))


class HeteroCNN(TimmHead, nn.Module):
    """HeteroFL's CNN at width rate ``rate`` (module docstring)."""

    def __init__(self, hidden, num_classes, in_chans, img_size, rate=1.0):
        super().__init__()
        if not 0 < rate <= 1:
            raise ValueError(f"width rate must be in (0, 1], got {rate}")
        self.rate = float(rate)
        self.full_hidden = tuple(hidden)
        widths = [scaled_width(c, rate) for c in hidden]

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), Scaler(rate),
                    nn.BatchNorm2d(cout, momentum=None, track_running_stats=False), nn.ReLU(inplace=True)]

        # a max-pool after every layer but the last
        self.features, self.num_features = conv_stack(in_chans, widths, img_size, block, range(len(widths) - 1))
        self.fc = nn.Linear(self.num_features, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))

    def width_axes(self) -> dict[str, tuple[int | None, ...]]:
        """For each parameter (and buffer) name, which hidden layer each dimension's channels
        belong to (its index), or None for a dimension never sliced (kernel taps, the input
        channels of the first layer, the classes)."""
        axes: dict[str, tuple[int | None, ...]] = {}
        convs = [i for i, m in enumerate(self.features) if isinstance(m, nn.Conv2d)]
        norms = [i for i, m in enumerate(self.features) if isinstance(m, nn.BatchNorm2d)]
        for layer, (c, b) in enumerate(zip(convs, norms)):
            previous = layer - 1 if layer > 0 else None
            axes[f"features.{c}.weight"] = (layer, previous, None, None)
            axes[f"features.{c}.bias"] = (layer,)
            axes[f"features.{b}.weight"] = (layer,)
            axes[f"features.{b}.bias"] = (layer,)
        last = len(convs) - 1
        axes["fc.weight"] = (None, last)
        axes["fc.bias"] = (None,)
        return axes


# HeteroFL's CNN widths (64, 128, 256, 512) are sized for CIFAR-10 on a GPU; the CPU member keeps
# its four layers at a quarter of them, so level e (1/16) still has one channel in the first layer.
CPU_HIDDEN = (16, 32, 64, 128)
PAPER_HIDDEN = (64, 128, 256, 512)


def heterofl_cnn(pretrained=False, num_classes=10, in_chans=1, img_size=(8, 8), hidden=CPU_HIDDEN, rate=1.0,
                 **kwargs):
    """HeteroFL's CNN (four conv-scaler-sBN-ReLU layers, GAP, linear) at width rate ``rate``."""
    return HeteroCNN(tuple(hidden), num_classes, in_chans, img_size, rate)


WIDTH_MODELS = (heterofl_cnn,)
