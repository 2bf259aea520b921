"""Fashion-MNIST: 28x28 grey images of Zalando's articles in 10 classes, a CPU-sized subsample.

The data is the cache ``hfl-bench prepare fashion-mnist --from PATH`` writes (``hfl_bench/fashion_mnist.py``:
where the files come from and how they are checked) holding the whole release (60,000 training and
10,000 test images). The task keeps a stratified, seeded subsample of each split, as cifar10-jpg
does (``train_subsample``, ``test_subsample``, ``subsample_seed``: change them in a subclass); they
are in the data fingerprint, so another subsample is other data. Clients are drawn by the run's
partitioner (Dirichlet by default).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import ClassVar

import numpy as np

from hfl_bench.data import FINGERPRINT_CHARS, DatasetError, Task, TaskData, TaskInfo, register_task
from hfl_bench.fashion_mnist import CACHE, CLASSES, FOLDER, MAX_ITEMS, SIZE
from hfl_bench.npzfile import ArraySpec, read_arrays
from hfl_bench.tasks.imagefolder import stratified_pick

NAME = "fashion-mnist"
CACHE_SPECS = {
    f"{split}_{key}": spec
    for split, rows in MAX_ITEMS.items()
    for key, spec in (("x", ArraySpec("u", (1, SIZE, SIZE), rows, 1)), ("y", ArraySpec("iu", (), rows)))
}
PREPARE = ("build it offline with `hfl-bench prepare fashion-mnist --from PATH`, PATH the folder of the four "
           "{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz files (`apt-get install dataset-fashion-mnist`: "
           "/usr/share/datasets/fashion-mnist, or Zalando's download) or the .deb itself (`apt-get download "
           "dataset-fashion-mnist`); see the install guide")


@register_task(NAME)
class FashionMNIST(Task):
    """Fashion-MNIST's 28x28 grey images in 10 classes, a stratified CPU-sized subsample."""

    # CPU-sized training and test sets as cifar10-jpg's, stratified and seeded; bump info.version
    # whenever they change.
    train_subsample: ClassVar[int | None] = 10_000
    test_subsample: ClassVar[int | None] = 2_000
    subsample_seed: ClassVar[int] = 0

    info = TaskInfo(
        name=NAME,
        version="1.0",
        num_classes=len(CLASSES),
        input_shape=(1, SIZE, SIZE),
        source="Fashion-MNIST (https://github.com/zalandoresearch/fashion-mnist): the four gzipped IDX files, as "
               "Debian's package dataset-fashion-mnist 0.0~git20200523.55506a9-1 ships them, converted by "
               "`hfl-bench prepare fashion-mnist`",
        citation="Xiao, Rasul & Vollgraf, Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning "
                 "Algorithms, arXiv:1708.07747, 2017",
        license="MIT",
        description=(
            f"Offline after `hfl-bench prepare fashion-mnist`: 28x28 grey images of 10 kinds of article; a "
            f"stratified, seeded subsample of {train_subsample:,} of the 60,000 training images and of "
            f"{test_subsample:,} of the 10,000 test images. Defaults calibrated on `local` alone (docs: Protocol)."
        ),
        augmentation="crop-flip",
        # Calibrated by benchmarks/calibrate.py on `local` alone (docs/studies/calibration.md): 20 steps
        # a round (one epoch of a median client's batches), converged by round 68 of 150 study rounds.
        defaults={"pool": "cpu", "rounds": 110, "clients": 10, "partition": "dirichlet", "alpha": 0.3,
                  "batch_size": 32, "lr": 0.01, "local_epochs": 1, "heldout_fraction": 0.2},
    )

    def data_files(self, data_dir: Path) -> list[Path]:
        return [Path(data_dir) / FOLDER / CACHE]

    def fingerprint(self, data_dir: Path | str | None = None) -> str:
        """The cache's fingerprint and the subsample settings; a missing cache says how to build it."""
        from hfl_bench.data import resolve_data_dir

        _missing(resolve_data_dir(data_dir) / FOLDER / CACHE)
        return self._with_settings(super().fingerprint(data_dir))

    def load(self, data_dir: Path | str | None = None, download: bool = False) -> TaskData:
        data = super().load(data_dir, download)
        return dataclasses.replace(data, fingerprint=self._with_settings(data.fingerprint))

    def load_arrays(self, data_dir: Path, download: bool):
        path = Path(data_dir) / FOLDER / CACHE
        if download:
            raise DatasetError(f"{NAME} has no --download: {PREPARE}")
        _missing(path)
        try:
            a = read_arrays(path, CACHE_SPECS, NAME)
        except DatasetError:
            raise
        except Exception as e:  # noqa: BLE001 - truncated or foreign: one line
            raise DatasetError(f"{NAME}: {path} is not a cache prepare wrote ({type(e).__name__}: {e}); "
                               f"{PREPARE}") from None
        out = []
        for i, (split, keep) in enumerate((("train", self.train_subsample), ("test", self.test_subsample))):
            x, y = a[f"{split}_x"], a[f"{split}_y"].astype(np.int64)
            if len(x) != len(y):
                raise DatasetError(f"{NAME}: {path} holds {len(x):,} {split} images but {len(y):,} labels; {PREPARE}")
            if keep is not None and keep < len(y):
                picked = stratified_pick(y, keep, (self.subsample_seed, i))
                x, y = x[picked], y[picked]
            out += [x.astype(np.float32) / 255, y]  # Task.load then standardizes with the training statistics
        return tuple(out)

    def class_names(self) -> list[str]:
        return list(CLASSES)

    def _with_settings(self, files_fp: str | None) -> str:
        """The data fingerprint: the cache's and the subsample settings (other settings, other arrays)."""
        settings = {"train_subsample": self.train_subsample, "test_subsample": self.test_subsample,
                    "subsample_seed": self.subsample_seed}
        text = json.dumps([files_fp, settings], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def _missing(path: Path) -> None:
    if not path.exists():
        raise DatasetError(f"{NAME} data not found at {path}: {PREPARE}")
