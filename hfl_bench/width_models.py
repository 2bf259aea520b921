"""Width-scalable models: one global architecture whose hidden layers can be built at a width rate r
in (0, 1], the models of the sub-model family (``hfl_bench.families.submodel``: HeteroFL, FedRolex).

``heterofl_cnn`` is HeteroFL's CNN (Diao et al., ICLR 2021, their ``conv.py``): per hidden layer a
3x3 convolution with bias, the scaler module (activations divided by the rate while training, so a
sub-model's outputs match the full model's scale), static batch norm (``StaticBatchNorm2d``:
no running statistics, every forward normalizes with its own batch's statistics, evaluation
included; a batch of one value per channel gives the bias), ReLU and a 2x2 max-pool after every
layer but the last; then global average pooling and a linear classifier. The first layer's input
channels and the classifier's classes are never scaled.

``heterofl_resnet18`` is HeteroFL's pre-activation ResNet-18 (their ``resnet.py``): a 3x3 stem
convolution without bias, four stages of two pre-activation basic blocks (stage widths ``hidden``,
stride 1 then 2, 2, 2), then scaler, static batch norm, ReLU, global average pooling and a linear
classifier. A block is scaler, static BN, ReLU on its input; a 1x1 projection of that activation
(without bias, at the block's stride) is the shortcut where the stride or the width changes, else
the input itself; then a 3x3 convolution (at the stride), scaler, static BN, ReLU and a 3x3
convolution, added to the shortcut. Every convolution is without bias; a stride is 1 along a
dimension already 1 (signals as 1xL images). At rate r every stage keeps ceil(r * C) channels.

Each model states which hidden layer every parameter dimension belongs to (``width_axes``): the
slicing and aggregation code reads that, not the layer types. In the ResNet a stage is one hidden
layer: its blocks' outputs are added to one residual stream, so they must hold the same channels.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hfl_bench.modelhead import TimmHead, conv_stack, pool_kernel


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


class _WidthScaled:
    """What every width-scalable model keeps: its rate and its full-width hidden layers."""

    def _set_rate(self, hidden, rate: float) -> list[int]:
        """Check and keep ``rate`` and the full widths; return the hidden layers' widths at ``rate``."""
        if not 0 < rate <= 1:
            raise ValueError(f"width rate must be in (0, 1], got {rate}")
        self.rate = float(rate)
        self.full_hidden = tuple(hidden)
        return [scaled_width(c, rate) for c in hidden]


class HeteroCNN(_WidthScaled, TimmHead, nn.Module):
    """HeteroFL's CNN at width rate ``rate`` (module docstring)."""

    def __init__(self, hidden, num_classes, in_chans, img_size, rate=1.0):
        super().__init__()
        widths = self._set_rate(hidden, rate)

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), Scaler(rate), static_bn(cout), nn.ReLU(inplace=True)]

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


class StaticBatchNorm2d(nn.BatchNorm2d):
    """HeteroFL's static batch norm: no running statistics (every forward uses its batch's). A batch
    holding one value per channel (one sample at 1x1, as a client's local test half of one image
    meets at the last layer) normalizes to zero, so the output is the bias, as the formula gives;
    torch's ``BatchNorm2d`` refuses that batch. Any other batch: ``BatchNorm2d`` itself."""

    def __init__(self, channels: int):
        super().__init__(channels, momentum=None, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] * x[0, 0].numel() > 1:
            return super().forward(x)
        return torch.batch_norm(x, self.weight, self.bias, None, None, True, 0.0, self.eps, False)


def static_bn(channels: int) -> nn.BatchNorm2d:
    """HeteroFL's static batch norm (``StaticBatchNorm2d``)."""
    return StaticBatchNorm2d(channels)


class PreActBlock(nn.Module):
    """A pre-activation basic block of HeteroFL's ResNet at width rate ``rate`` (module docstring)."""

    def __init__(self, cin: int, cout: int, stride: tuple[int, ...], rate: float):
        super().__init__()
        self.scaler = Scaler(rate)
        self.n1 = static_bn(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.n2 = static_bn(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        projects = any(s != 1 for s in stride) or cin != cout
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if projects else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.n1(self.scaler(x)))
        skip = x if self.shortcut is None else self.shortcut(h)  # the projection reads the activation
        h = self.conv2(torch.relu(self.n2(self.scaler(self.conv1(h)))))
        return h + skip


class HeteroResNet(_WidthScaled, TimmHead, nn.Module):
    """HeteroFL's pre-activation ResNet (two blocks a stage: ResNet-18) at width rate ``rate``."""

    def __init__(self, hidden, num_classes, in_chans, img_size, rate=1.0, blocks=(2, 2, 2, 2)):
        super().__init__()
        widths = self._set_rate(hidden, rate)
        self.stem = nn.Conv2d(in_chans, widths[0], 3, padding=1, bias=False)
        size, cin = tuple(img_size), widths[0]
        stages = []
        for k, (cout, n) in enumerate(zip(widths, blocks)):
            stride = (1,) * len(size) if k == 0 else pool_kernel(size)
            size = tuple(-(-s // t) for s, t in zip(size, stride))  # padding 1, kernel 3: ceil(s / t)
            layers = []
            for b in range(n):
                layers.append(PreActBlock(cin, cout, stride if b == 0 else (1,) * len(size), rate))
                cin = cout
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.scaler = Scaler(rate)
        self.norm = static_bn(cin)
        self.num_features = cin
        self.fc = nn.Linear(cin, num_classes)
        nn.init.zeros_(self.fc.bias)  # the authors' init_param; batch norm's (1, 0) is torch's default

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.scaler(self.stages(self.stem(x)))))

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))

    def width_axes(self) -> dict[str, tuple[int | None, ...]]:
        """For each parameter name, the hidden layer (stage) of each dimension, or None (kernel
        taps, the input's channels, the classes); ``HeteroCNN.width_axes``."""
        axes: dict[str, tuple[int | None, ...]] = {"stem.weight": (0, None, None, None)}
        for k, stage in enumerate(self.stages):
            for b, block in enumerate(stage):
                into = k - 1 if k > 0 and b == 0 else k  # the residual stream the block reads
                name = f"stages.{k}.{b}"
                axes[f"{name}.n1.weight"] = axes[f"{name}.n1.bias"] = (into,)
                axes[f"{name}.conv1.weight"] = (k, into, None, None)
                axes[f"{name}.n2.weight"] = axes[f"{name}.n2.bias"] = (k,)
                axes[f"{name}.conv2.weight"] = (k, k, None, None)
                if block.shortcut is not None:
                    axes[f"{name}.shortcut.weight"] = (k, into, None, None)
        last = len(self.stages) - 1
        axes["norm.weight"] = axes["norm.bias"] = (last,)
        axes["fc.weight"] = (None, last)
        axes["fc.bias"] = (None,)
        return axes


def heterofl_resnet18(pretrained=False, num_classes=10, in_chans=1, img_size=(8, 8), hidden=CPU_HIDDEN, rate=1.0,
                      **kwargs):
    """HeteroFL's pre-activation ResNet-18 (stem, 4 stages of 2 blocks, scaler, sBN) at width rate ``rate``."""
    return HeteroResNet(tuple(hidden), num_classes, in_chans, img_size, rate)


WIDTH_MODELS = (heterofl_cnn, heterofl_resnet18)
