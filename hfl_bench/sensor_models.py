"""Small models of multichannel time series (pool ``sensor``), after HtFLlib's HAR pools: a 1-D
CNN, a GRU, a temporal convolution network and a Transformer encoder, four inductive biases
(local patterns, recurrence, long causal receptive fields, attention).

Each reads a task's ``[B, C, H, W]`` input as C channels over H*W time steps (a sensor task stores a
window as C x 1 x L, as mnist1d stores its signal), so each also builds for an image task (rows read
one after the other). Each has timm's classifier interface (``modelhead.TimmHead``): ``forward_features``,
pooled to ``num_features`` pre-logit values, then the linear ``fc``: the feature / head split the
HtFLlib-family methods use (``hfl_bench.families.feature_head``). Registered into timm's registry by
``hfl_bench.pools``.
"""

from __future__ import annotations

import torch
from torch import nn

from hfl_bench.modelhead import TimmHead


def _series(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` (or ``[B, C, L]``) as ``[B, C, H*W]``."""
    return x.flatten(2)


def _length(img_size) -> int:
    n = 1
    for s in img_size:
        n *= int(s)
    return n


class SensorCNN(TimmHead, nn.Module):
    """Three Conv1d-BN-ReLU layers (kernels 5, 5, 3; 32, 64, 64 channels), max-pool by 2 after the
    first two, global average pool over time."""

    def __init__(self, num_classes, in_chans, widths=(32, 64, 64)):
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_chans
        for i, (cout, k) in enumerate(zip(widths, (5, 5, 3))):
            layers += [nn.Conv1d(cin, cout, k, padding=k // 2, bias=False), nn.BatchNorm1d(cout), nn.ReLU(inplace=True)]
            if i < 2:
                layers.append(nn.MaxPool1d(2, ceil_mode=True))  # ceil: a 1-sample series still pools
            cin = cout
        self.features = nn.Sequential(*layers)
        self.num_features = cin
        self.fc = nn.Linear(cin, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(_series(x))

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=2)


class SensorGRU(TimmHead, nn.Module):
    """A GRU (64 hidden units) over a strided convolution's steps (kernel and stride 4, 32 channels,
    BN, ReLU: 128 samples become 32 steps); the features are its last hidden state. The front cuts
    the sequential steps four-fold (a two-layer GRU over all 128 samples cost about six times the
    1-D CNN's step on a CPU core), as DeepConvLSTM-style HAR models do; the recurrence stays."""

    def __init__(self, num_classes, in_chans, hidden=64, front=32, stride=4):
        super().__init__()
        self.front = nn.Sequential(nn.Conv1d(in_chans, front, stride, stride=stride), nn.BatchNorm1d(front),
                                   nn.ReLU())
        self.gru = nn.GRU(front, hidden, batch_first=True)
        self.num_features = hidden
        self.fc = nn.Linear(hidden, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.front(_series(x)).transpose(1, 2))  # [B, L / stride, hidden]
        return out[:, -1]


class _CausalBlock(nn.Module):
    """Two dilated causal Conv1d layers (left padding only: an output never sees a later sample)
    with ReLU, and a residual connection (1x1 conv when the width changes)."""

    def __init__(self, cin, cout, dilation, kernel=3):
        super().__init__()
        self.pad = (kernel - 1) * dilation
        self.conv1 = nn.Conv1d(cin, cout, kernel, dilation=dilation)
        self.conv2 = nn.Conv1d(cout, cout, kernel, dilation=dilation)
        self.norm1, self.norm2 = nn.BatchNorm1d(cout), nn.BatchNorm1d(cout)
        self.skip = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(nn.functional.pad(x, (self.pad, 0)))))
        y = self.norm2(self.conv2(nn.functional.pad(y, (self.pad, 0))))
        return torch.relu(y + self.skip(x))


class SensorTCN(TimmHead, nn.Module):
    """A temporal convolution network (Bai et al., 2018): four residual blocks of dilated causal
    convolutions (dilations 1, 2, 4, 8; 32 channels; receptive field 61 samples), mean over time."""

    def __init__(self, num_classes, in_chans, width=32, dilations=(1, 2, 4, 8)):
        super().__init__()
        blocks, cin = [], in_chans
        for d in dilations:
            blocks.append(_CausalBlock(cin, width, d))
            cin = width
        self.blocks = nn.Sequential(*blocks)
        self.num_features = width
        self.fc = nn.Linear(width, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(_series(x))

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=2)


class _EncoderLayer(nn.Module):
    """A pre-norm Transformer encoder layer with attention written out (softmax(QK^T / sqrt(d)) V):
    torch's fused attention on a CPU has no second derivative, which methods that differentiate
    through a step (FedL2G) need."""

    def __init__(self, dim, heads, ff):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff), nn.GELU(), nn.Linear(ff, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.ff(self.norm2(x))


class SensorTransformer(TimmHead, nn.Module):
    """A small Transformer encoder: the series cut into patches of 8 samples, each embedded
    linearly (a strided Conv1d) to 64 values, plus a learned position embedding; two pre-norm
    encoder layers (4 heads, feed-forward 128, GELU); mean over the tokens."""

    def __init__(self, num_classes, in_chans, img_size, dim=64, patch=8, depth=2, heads=4):
        super().__init__()
        length = _length(img_size)
        self.patch = max(1, min(patch, length))
        tokens = length // self.patch
        self.embed = nn.Conv1d(in_chans, dim, self.patch, stride=self.patch)
        self.pos = nn.Parameter(torch.zeros(1, tokens, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.encoder = nn.Sequential(*(_EncoderLayer(dim, heads, 2 * dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.num_features = dim
        self.fc = nn.Linear(dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(_series(x)).transpose(1, 2)  # [B, tokens, dim]
        return self.norm(self.encoder(tokens + self.pos))

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def sensor_cnn1d(pretrained=False, num_classes=6, in_chans=6, img_size=(1, 128), **kwargs):
    """1-D CNN: Conv1d-BN-ReLU x3 (32, 64, 64 channels), max-pool by 2 twice, GAP over time."""
    return SensorCNN(num_classes, in_chans)


def sensor_gru(pretrained=False, num_classes=6, in_chans=6, img_size=(1, 128), **kwargs):
    """GRU (64 hidden units) over a stride-4 Conv1d front (32 channels); the last step's hidden state is the feature."""
    return SensorGRU(num_classes, in_chans)


def sensor_tcn(pretrained=False, num_classes=6, in_chans=6, img_size=(1, 128), **kwargs):
    """Temporal convolution network: 4 residual blocks of dilated causal Conv1d (dilation 1-8, 32 channels)."""
    return SensorTCN(num_classes, in_chans)


def sensor_transformer(pretrained=False, num_classes=6, in_chans=6, img_size=(1, 128), **kwargs):
    """Transformer encoder over 8-sample patches: 64-d tokens, 2 layers, 4 heads, mean over tokens."""
    return SensorTransformer(num_classes, in_chans, img_size)


SENSOR_MODELS = (sensor_cnn1d, sensor_gru, sensor_tcn, sensor_transformer)
