"""PathMNIST (MedMNIST v2): 28x28 colon pathology tissue patches in 9 classes, via medmnist."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hfl_bench.data import PAPER_PROTOCOL, Task, TaskInfo, missing_dataset, register_task, unreadable_dataset

FILE_NAME = "pathmnist.npz"
SIZE = 28


@register_task("pathmnist")
class PathMNIST(Task):
    """89996 train / 7180 test 28x28 RGB tissue patches (NCT-CRC-HE-100K / CRC-VAL-HE-7K)."""

    info = TaskInfo(
        name="pathmnist",
        version="1.0",
        num_classes=9,
        input_shape=(3, SIZE, SIZE),
        source="medmnist.PathMNIST, size 28 (https://medmnist.com)",
        citation=(
            "Yang et al., MedMNIST v2: A large-scale lightweight benchmark for 2D and 3D biomedical "
            "image classification, Scientific Data, 2023; Kather et al., Predicting survival from "
            "colorectal cancer histology slides using deep learning, PLOS Medicine, 2019 "
            "(NCT-CRC-HE-100K)"
        ),
        license="CC BY 4.0",
        description=(
            "The official MedMNIST train (89996) and test (7180) splits; the official val split "
            "(10004) is not used. Expects <data-dir>/pathmnist.npz."
        ),
        augmentation="flips",
        defaults=dict(PAPER_PROTOCOL),
    )

    def load_arrays(self, data_dir: Path, download: bool):
        path = data_dir / FILE_NAME
        if download:
            data_dir.mkdir(parents=True, exist_ok=True)  # medmnist requires an existing root
        elif not path.is_file():
            raise missing_dataset(self.info.name, path)
        import medmnist

        try:
            splits = [
                _arrays(medmnist.PathMNIST(split=s, root=str(data_dir), download=d, size=SIZE))
                for s, d in (("train", download), ("test", False))
            ]
        except Exception as e:  # a truncated / garbage npz, missing keys, a failed download
            raise unreadable_dataset(self.info.name, path, e, download) from e
        (train_x, train_y), (test_x, test_y) = splits
        return train_x, train_y, test_x, test_y

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / FILE_NAME]  # medmnist reads size 28 from <root>/pathmnist.npz

    def class_names(self):
        import medmnist

        labels = medmnist.INFO["pathmnist"]["label"]
        return [labels[str(i)] for i in range(len(labels))]


def _arrays(dataset) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(dataset.imgs)  # [N, H, W, C] uint8
    y = np.asarray(dataset.labels).reshape(-1).astype(np.int64)  # [N, 1] -> [N]
    if x.ndim != 4 or x.shape[-1] != 3 or len(y) != len(x):
        raise ValueError(f"{len(x)} images of shape {x.shape[1:]} but {len(y)} labels")
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)), y
