"""digits-mnist1d: a two-modality task from real offline data, the way AV-MNIST pairs MNIST
images with spoken digits. Each sample is an 8x8 ``digits`` image (modality ``image``) paired
with an MNIST-1D signal of the same class (modality ``signal``, length 40).

The pairing rule (fixed; bump the version if it changes): within each split (train with train,
test with test) and each class c, the digits samples of class c are taken in their order in the
``digits`` task's split; the MNIST-1D samples of class c in that split are shuffled once by
``numpy.random.default_rng([PAIRING_SEED, split, c])`` and the first ones are paired with them,
without replacement (MNIST-1D has about three times as many samples per class as digits in
either split, so every image gets its own signal; the unpaired signals are not used). The
``digits`` split (its fixed 80/20 split) decides the train and test sets: 1,438 + 359 pairs.

Each modality is standardized on its own (the training pairs' mean and standard deviation of
that modality), then a sample is stored flat: 64 image values, then 40 signal values, as a
1 x 1 x 104 "image" (``TaskInfo.modalities`` says where each modality lies). The missing-modality
partition (``recipient_fraction``, ``missing_modality``; hfl_bench.modalities) decides which
clients observe which modalities; a pool for it builds per-modality encoders (``cpu-mm``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hfl_bench.data import DatasetError, Modality, Task, TaskInfo, register_task
from hfl_bench.tasks.digits import Digits
from hfl_bench.tasks.mnist1d import MNIST1D, pretraining_arrays, pretraining_source

PAIRING_SEED = 20261130
IMAGE = Modality("image", (1, 8, 8))
SIGNAL = Modality("signal", (1, 1, 40))


def pair_by_class(labels_a: np.ndarray, labels_b: np.ndarray, split: int) -> np.ndarray:
    """For each sample of ``labels_a`` the index of its partner in ``labels_b`` (same class,
    without replacement; the rule in the module docstring)."""
    partner = np.empty(len(labels_a), dtype=np.int64)
    for c in np.unique(labels_a):
        mine = np.flatnonzero(labels_a == c)
        theirs = np.flatnonzero(labels_b == c)
        if len(theirs) < len(mine):
            raise DatasetError(f"digits-mnist1d: class {c} has {len(mine)} images but only {len(theirs)} "
                               f"signals in split {split}: cannot pair without replacement")
        partner[mine] = np.random.default_rng([PAIRING_SEED, split, int(c)]).permutation(theirs)[: len(mine)]
    return partner


def standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = train.mean(), max(float(train.std()), 1e-6)
    return (train - mean) / std, (test - mean) / std


@register_task("digits-mnist1d")
class DigitsMNIST1D(Task):
    """Real digits images paired with real MNIST-1D signals of the same class: two modalities."""

    info = TaskInfo(
        name="digits-mnist1d",
        version="1.0",
        num_classes=10,
        input_shape=(1, 1, IMAGE.size + SIGNAL.size),
        modalities=(IMAGE, SIGNAL),
        source="sklearn.datasets.load_digits (image) paired by class with mnist1d (signal), seeded rule",
        citation=("Alpaydin & Kaynak, UCI optdigits, 1998; Greydanus, Scaling down Deep Learning, "
                  "arXiv:2011.14439, 2020 (pairing after AV-MNIST, Vielzeuf et al., 2018)"),
        license="CC BY 4.0 (digits); Apache-2.0 (mnist1d)",
        description=("Offline, two modalities: each digits image (8x8) paired with an MNIST-1D signal "
                     "(length 40) of the same class by a fixed seeded rule; the digits task's 80/20 split. "
                     "Recipients (recipient_fraction of the clients, seeded) miss missing_modality."),
        augmentation="none",
        # The digits protocol (README, Protocol) with the missing-modality partition's defaults:
        # half the clients are recipients that miss the signal (the paper's recipients miss audio).
        # A pretraining split of 144 pairs (10 % of the training pairs, held out before partitioning
        # for every method) is what the shared-predictor family's image encoder pretrains on
        # (FedSocket's pretrained bank; the signal's pretrains on mnist1d's generator).
        defaults={"pool": "cpu-mm", "rounds": 30, "clients": 10, "partition": "dirichlet", "alpha": 0.3,
                  "batch_size": 16, "lr": 0.05, "local_epochs": 5, "heldout_fraction": 0.3,
                  "recipient_fraction": 0.5, "missing_modality": "signal", "pretrain_size": 144},
    )

    def load_arrays(self, data_dir: Path, download: bool):
        img_tr, y_tr, img_te, y_te = Digits().load_arrays(data_dir, download)
        sig_tr, sy_tr, sig_te, sy_te = MNIST1D().load_arrays(data_dir, download)
        sig_tr, sig_te = sig_tr[pair_by_class(y_tr, sy_tr, 0)], sig_te[pair_by_class(y_te, sy_te, 1)]
        img_tr, img_te = standardize(img_tr.reshape(len(img_tr), -1), img_te.reshape(len(img_te), -1))
        sig_tr, sig_te = standardize(sig_tr.reshape(len(sig_tr), -1), sig_te.reshape(len(sig_te), -1))
        flat = lambda a, b: np.concatenate([a, b], axis=1).astype(np.float32)[:, None, None, :]  # noqa: E731
        return flat(img_tr, sig_tr), y_tr, flat(img_te, sig_te), y_te

    def pretraining_data(self, modality, data_dir):
        """The signal modality: mnist1d's pretraining samples (a generator seed no split of either
        task uses, ``hfl_bench.tasks.mnist1d.pretraining_arrays``), standardized as the task's
        signals are. The images have no generator: a run holds a pretraining split out of the
        training pairs instead (``--pretrain-size``)."""
        if modality != SIGNAL.name:
            return None
        x, y = pretraining_arrays()
        return x.reshape(len(x), *SIGNAL.shape), y, pretraining_source()

    def class_names(self):
        return [str(i) for i in range(10)]
