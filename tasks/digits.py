"""scikit-learn's 8x8 handwritten digits: the offline default task (ships with scikit-learn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hfl_bench.data import Task, TaskInfo, register_task, stratified_split

# A fixed split seed: the task's test set is part of the task, not of a run.
SPLIT_SEED = 20231
TEST_FRACTION = 0.2


@register_task("digits")
class Digits(Task):
    """1797 real 8x8 grey-scale digits (UCI optdigits test set); 20% held out as the test set."""

    info = TaskInfo(
        name="digits",
        version="1.0",
        num_classes=10,
        input_shape=(1, 8, 8),
        source="sklearn.datasets.load_digits (UCI ML hand-written digits, optdigits)",
        citation="Alpaydin & Kaynak, Optical Recognition of Handwritten Digits, UCI ML Repository, 1998",
        license="CC BY 4.0",
        description="Offline; a stratified 80/20 train/test split with a fixed seed.",
        augmentation="none",
        # Calibrated on `local` alone (benchmarks/calibrate.py, README Protocol): ~32 SGD steps per
        # client per round, a validation half of ~22 samples per client; local converges by round 14.
        defaults={"pool": "cpu", "rounds": 30, "clients": 10, "partition": "dirichlet", "alpha": 0.3,
                  "batch_size": 16, "lr": 0.05, "local_epochs": 5, "heldout_fraction": 0.3},
    )

    def load_arrays(self, data_dir: Path, download: bool):
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = bunch.images.astype(np.float32)[:, None] / 16.0
        y = bunch.target.astype(np.int64)
        train, test = stratified_split(y, TEST_FRACTION, SPLIT_SEED)
        return x[train], y[train], x[test], y[test]

    def class_names(self):
        return [str(i) for i in range(10)]
