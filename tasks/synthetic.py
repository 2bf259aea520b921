"""CIFAR-shaped random data for speed and memory benchmarks (accuracy stays at chance)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hfl_bench.data import PAPER_PROTOCOL, Task, TaskInfo, register_task

SEED = 7


@register_task("synthetic-cifar10")
class SyntheticCIFAR10(Task):
    """Random 3x32x32 tensors with random labels, CIFAR-10 sized: for benchmarks, not accuracy."""

    info = TaskInfo(
        name="synthetic-cifar10",
        version="1.0",
        num_classes=10,
        input_shape=(3, 32, 32),
        source="generated: standard normal pixels, uniform labels, seed 7",
        citation="none (benchmark data)",
        license="public domain",
        description="50,000 train / 10,000 test random images; CIFAR's shapes, augmentation and protocol.",
        augmentation="crop-flip",
        defaults=dict(PAPER_PROTOCOL),
    )
    n_train, n_test = 50_000, 10_000

    def load_arrays(self, data_dir: Path, download: bool):
        rng = np.random.default_rng(SEED)
        shape = self.info.input_shape
        x_train = rng.standard_normal((self.n_train, *shape), dtype=np.float32)
        x_test = rng.standard_normal((self.n_test, *shape), dtype=np.float32)
        c = self.info.num_classes
        return x_train, rng.integers(0, c, self.n_train), x_test, rng.integers(0, c, self.n_test)
