"""HtFLlib's ``FedAvgCNN`` as an hfl-bench pool, the way a third-party plugin adds one.

HtFLlib (https://github.com/TsingZ0/HtFLlib, ``system/flcore/trainmodel/models.py``) builds its
MNIST model as conv(1->32, 5x5) -> ReLU -> max-pool 2 -> conv(32->64, 5x5) -> ReLU -> max-pool 2
-> flatten (1024 on 1x28x28) -> linear 512 -> ReLU -> linear classes. This is our own code for
that layer stack, registered in timm's registry and as the one-member pool ``htfl-fedavgcnn``
(importing this module registers both), so ``benchmarks/bench_htfllib.py`` runs the same model
on both sides of the comparison.
"""

from __future__ import annotations

from torch import nn

from hfl_bench.pools import ArchPool, PoolMember, TimmHead, register_pool

MODEL = "htfl_fedavgcnn"
POOL = "htfl-fedavgcnn"


class FedAvgCNN(TimmHead, nn.Module):
    """HtFLlib's base is everything up to the 512-wide ReLU; its head the last linear layer."""

    def __init__(self, num_classes: int = 10, in_chans: int = 1, img_size=(28, 28), **_):
        super().__init__()
        h, w = img_size
        side = lambda n: ((n - 4) // 2 - 4) // 2  # noqa: E731  two valid 5x5 convs, two 2x2 pools
        flat = 64 * side(h) * side(w)
        self.features = nn.Sequential(
            nn.Conv2d(in_chans, 32, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(),
        )
        self.fc1 = nn.Sequential(nn.Linear(flat, 512), nn.ReLU(inplace=True))
        self.fc = nn.Linear(512, num_classes)
        self.num_classes = num_classes
        self.num_features = 512

    def forward_features(self, x):
        return self.fc1(self.features(x))


def _register_timm() -> None:
    from timm.models import is_model, register_model

    if is_model(MODEL):
        return

    def htfl_fedavgcnn(pretrained: bool = False, **kwargs):
        return FedAvgCNN(**{k: v for k, v in kwargs.items() if k in ("num_classes", "in_chans", "img_size")})

    register_model(htfl_fedavgcnn)


_register_timm()
register_pool(ArchPool(POOL, (PoolMember(MODEL, label="fedavgcnn"),),
                       "HtFLlib's FedAvgCNN (conv 32-64, fc 512) for every client (benchmarks only)"))
