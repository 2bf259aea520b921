"""PathMNIST (MedMNIST v2): 28x28 colon pathology tissue patches in 9 classes, via medmnist."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hfl_bench.data import PAPER_PROTOCOL, Task, TaskInfo, missing_dataset, register_task, unreadable_dataset
from hfl_bench.errors import DatasetError
from hfl_bench.npzfile import ArraySpec, read_arrays

FILE_NAME = "pathmnist.npz"
SIZE = 28
# The official splits' sizes: the decompression budget (hfl_bench.npzfile). A file with more rows is
# not PathMNIST at size 28, and is refused before anything is inflated.
ROWS = {"train": 89_996, "test": 7_180}
# Where the file comes from and what it holds: said by the missing-file error and the tasks guide.
URL = "https://zenodo.org/records/10519652/files/pathmnist.npz"  # MedMNIST's Zenodo record, as medmnist fetches it
MD5 = "a8b06965200029087d5bd730944a56c1"
ABOUT = (f" pathmnist.npz is MedMNIST v2's PathMNIST at 28x28 ({URL}, MD5 {MD5}; what --download fetches): "
         "train_, val_ and test_images (uint8, N x 28 x 28 x 3) and _labels (N x 1, classes 0-8).")


def array_specs() -> dict[str, ArraySpec]:
    """What the task reads of pathmnist.npz: uint8 [n, 28, 28, 3] images, [n, 1] integer labels."""
    specs = {}
    for split, rows in ROWS.items():
        specs[f"{split}_images"] = ArraySpec("u", (SIZE, SIZE, 3), rows, max_itemsize=1)
        specs[f"{split}_labels"] = ArraySpec("iu", (1,), rows)
    return specs


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
            _download(data_dir)
        elif not path.is_file():
            raise missing_dataset(self.info.name, path, ABOUT)
        try:  # our own reader, not medmnist's np.load: it checks the budget before inflating anything
            arrays = read_arrays(path, array_specs(), self.info.name)
            splits = [_arrays(arrays[f"{s}_images"], arrays[f"{s}_labels"]) for s in ROWS]
        except DatasetError:
            raise
        except Exception as e:  # a truncated / garbage npz, missing keys
            raise unreadable_dataset(self.info.name, path, e, download) from e
        (train_x, train_y), (test_x, test_y) = splits
        return train_x, train_y, test_x, test_y

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / FILE_NAME]  # medmnist reads size 28 from <root>/pathmnist.npz

    def class_names(self):
        import medmnist

        labels = medmnist.INFO["pathmnist"]["label"]
        return [labels[str(i)] for i in range(len(labels))]


def _download(data_dir: Path) -> None:
    """Fetch pathmnist.npz with medmnist (which checks the file's MD5 and fetches it again on a
    mismatch); medmnist then reads the small test split of that verified file, which we discard."""
    import medmnist

    data_dir.mkdir(parents=True, exist_ok=True)  # medmnist requires an existing root
    try:
        medmnist.PathMNIST(split="test", root=str(data_dir), download=True, size=SIZE)
    except Exception as e:  # a failed download
        raise unreadable_dataset("pathmnist", data_dir / FILE_NAME, e, True) from e


def _arrays(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[N, H, W, C] uint8 images to [N, C, H, W]; [N, 1] labels to [N] int64."""
    y = labels.reshape(-1).astype(np.int64)
    if len(y) != len(images):
        raise ValueError(f"{len(images)} images but {len(y)} labels")
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)), y
