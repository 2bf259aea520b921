"""CIFAR-10 and CIFAR-100 (fine labels) through torchvision's loaders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hfl_bench.data import (
    PAPER_PROTOCOL,
    DatasetError,
    Task,
    TaskInfo,
    missing_dataset,
    register_task,
    unreadable_dataset,
)

# Dataset class per task name, overriding torchvision's CIFAR10 / CIFAR100 (tests put
# subclasses without MD5 checks here to run the real parsing code on small fake files).
_DATASETS: dict[str, Any] = {}

CITATION = (
    "Krizhevsky, Learning Multiple Layers of Features from Tiny Images, "
    "Tech. Report, University of Toronto, 2009"
)
LICENSE = "no explicit license; see https://www.cs.toronto.edu/~kriz/cifar.html"


def _dataset_class(name: str):
    if name in _DATASETS:
        return _DATASETS[name]
    import torchvision.datasets as tvd

    return {"cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100}[name]


class _CIFAR(Task):
    _class_names: list[str] | None = None

    def load_arrays(self, data_dir: Path, download: bool):
        name = self.info.name
        cls = _dataset_class(name)
        folder = data_dir / cls.base_folder
        if download:
            data_dir.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            raise missing_dataset(name, folder)
        try:
            train = cls(root=str(data_dir), train=True, download=download)
            test = cls(root=str(data_dir), train=False, download=False)
            classes = [str(c) for c in train.classes]
            splits = [_arrays(d) for d in (train, test)]
        except Exception as e:  # torchvision: RuntimeError on a missing file or an MD5 mismatch
            raise unreadable_dataset(name, folder, e, download) from e
        if len(classes) != self.info.num_classes:
            raise DatasetError(
                f"{name}: {folder} names {len(classes)} classes, expected {self.info.num_classes}"
            )
        self._class_names = classes
        (train_x, train_y), (test_x, test_y) = splits
        return train_x, train_y, test_x, test_y

    def data_files(self, data_dir: Path) -> list[Path]:
        """The batch and meta files torchvision reads from ``<data_dir>/<base folder>`` (not the
        downloaded archive, which it only extracts)."""
        cls = _dataset_class(self.info.name)
        folder = data_dir / cls.base_folder
        names = [f for f, _ in cls.train_list] + [f for f, _ in cls.test_list] + [cls.meta["filename"]]
        return [folder / name for name in names]

    def class_names(self):
        return self._class_names


def _arrays(dataset) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(dataset.data, dtype=np.uint8)  # [N, H, W, C]
    y = np.asarray(dataset.targets, dtype=np.int64)
    if x.ndim != 4 or len(y) != len(x):
        raise ValueError(f"{len(x)} images of shape {x.shape[1:]} but {len(y)} labels")
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)), y


@register_task("cifar10")
class CIFAR10(_CIFAR):
    """50000 train / 10000 test 32x32 colour images in 10 classes."""

    info = TaskInfo(
        name="cifar10",
        version="1.0",
        num_classes=10,
        input_shape=(3, 32, 32),
        source="torchvision.datasets.CIFAR10 (https://www.cs.toronto.edu/~kriz/cifar.html)",
        citation=CITATION,
        license=LICENSE,
        description="The official 50000/10000 train/test split; expects <data-dir>/cifar-10-batches-py.",
        augmentation="crop-flip",
        defaults=dict(PAPER_PROTOCOL),
    )


@register_task("cifar100")
class CIFAR100(_CIFAR):
    """50000 train / 10000 test 32x32 colour images in 100 fine classes."""

    info = TaskInfo(
        name="cifar100",
        version="1.0",
        num_classes=100,
        input_shape=(3, 32, 32),
        source="torchvision.datasets.CIFAR100 (https://www.cs.toronto.edu/~kriz/cifar.html)",
        citation=CITATION,
        license=LICENSE,
        description=(
            "The official 50000/10000 train/test split with the 100 fine labels; "
            "expects <data-dir>/cifar-100-python."
        ),
        augmentation="crop-flip",
        defaults=dict(PAPER_PROTOCOL),
    )
