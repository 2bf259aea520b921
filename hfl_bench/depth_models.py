"""Depth-scalable models: one global architecture of K blocks, each followed by an exit classifier,
that can be built at a depth d <= K (its first d blocks and their d exits): the model of DepthFL
(``hfl_bench.families.depth``, ``methods/depthfl.py``).

``depthfl_cnn`` is DepthFL's design (Kim, Yu, Kim, Moon, ICLR 2023: a ResNet-18 split into its 4 stages,
an exit after each) at CPU scale: block k is a 3x3 convolution without bias, batch norm and ReLU, with
a 2x2 max-pool in front of every block but the first (the ResNet's stride-2 stage entrances). Exit k
of a block that is not the last is a bottleneck (a depthwise-separable 3x3 convolution of stride 2 to
the last block's channels, batch norm, ReLU: one of the paper's SepConv modules; stride 1 along a
dimension already 1) then global average pooling and a linear classifier; the last block's exit is
global average pooling and a linear classifier, as the ResNet's own head. Batch norm keeps running
statistics (DepthFL's code default, ``static_bn: false``).

A model at depth d holds exactly the parameters (and buffers) of the full model whose names start
with ``blocks.k.`` or ``exits.k.`` for k < d, with the same shapes: a sub-model is a subset of the
global model's entries by name, nothing is sliced inside a tensor. ``forward`` returns the mean of
the exits' logits (DepthFL's inference: the ensemble of the classifiers a model holds); a model of
one exit returns that exit's logits unchanged. ``exit_logits`` returns each exit's logits (training).
"""

from __future__ import annotations

import torch
from torch import nn

from hfl_bench.modelhead import pool_kernel


class Exit(nn.Module):
    """An exit classifier: an optional bottleneck, global average pooling, a linear layer."""

    def __init__(self, cin: int, cout: int, num_classes: int, bottleneck: bool, stride: tuple[int, ...] = (2, 2)):
        super().__init__()
        self.bottleneck = nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False),
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        ) if bottleneck else nn.Identity()
        self.fc = nn.Linear(cout if bottleneck else cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bottleneck(x).mean(dim=(2, 3)))


class DepthCNN(nn.Module):
    """DepthFL's CNN at depth ``depth`` of ``len(hidden)`` blocks (module docstring)."""

    def __init__(self, hidden, num_classes, in_chans, img_size, depth=None):
        super().__init__()
        self.full_depth = len(hidden)
        depth = self.full_depth if depth is None else int(depth)
        if not 1 <= depth <= self.full_depth:
            raise ValueError(f"depth must be in 1..{self.full_depth}, got {depth}")
        self.depth = depth
        self.full_hidden = tuple(hidden)
        self.blocks = nn.ModuleList()
        self.exits = nn.ModuleList()
        size, cin = tuple(img_size), in_chans
        # block and exit built in turn, so a shallower model's parameters are drawn first from the seed
        for k in range(depth):
            layers: list[nn.Module] = []
            if k > 0:
                kernel = pool_kernel(size)
                layers.append(nn.MaxPool2d(kernel))
                size = tuple(s // q for s, q in zip(size, kernel))
            layers += [nn.Conv2d(cin, hidden[k], 3, padding=1, bias=False), nn.BatchNorm2d(hidden[k]),
                       nn.ReLU(inplace=True)]
            self.blocks.append(nn.Sequential(*layers))
            self.exits.append(Exit(hidden[k], hidden[-1], num_classes, bottleneck=k < self.full_depth - 1,
                                   stride=pool_kernel(size)))
            cin = hidden[k]

    def exit_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each exit's logits, shallowest first."""
        out = []
        for block, head in zip(self.blocks, self.exits):
            x = block(x)
            out.append(head(x))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = self.exit_logits(x)
        return outs[0] if len(outs) == 1 else torch.stack(outs).mean(dim=0)


# Four blocks at a quarter of ResNet-18's stage widths (64-512), as heterofl-cnn's CPU widths.
CPU_HIDDEN = (16, 32, 64, 128)


def depthfl_cnn(pretrained=False, num_classes=10, in_chans=1, img_size=(8, 8), hidden=CPU_HIDDEN, depth=None,
                **kwargs):
    """DepthFL's CNN (K conv-BN-ReLU blocks, an exit after each) at depth ``depth`` (default: all K)."""
    return DepthCNN(tuple(hidden), num_classes, in_chans, img_size, depth)


DEPTH_MODELS = (depthfl_cnn,)
