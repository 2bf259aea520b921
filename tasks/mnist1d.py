"""MNIST-1D: 1-D signals of the ten digits, generated offline by the ``mnist1d`` package."""

from __future__ import annotations

import functools
import logging
import os
import random
import tempfile
from pathlib import Path

import numpy as np

from hfl_bench.data import DatasetError, Task, TaskInfo, register_task
from hfl_bench.npzfile import ArraySpec, UnusableFile, read_arrays
from hfl_bench.paths import shared_mode

log = logging.getLogger(__name__)

# The package's default generation seed; fixed here so a package update cannot change the data.
SEED = 42
# The generation seed of the pretraining samples (``pretraining_arrays``): any seed but SEED.
PRETRAIN_SEED = 20260049
PRETRAIN_SAMPLES = 4000
SIGNAL_LENGTH = 40
_KEYS = ("train_x", "train_y", "test_x", "test_y")
# The cache's arrays as _generate makes them (the package's 4000/1000 split): its decompression budget.
CACHE_SPECS = {
    "train_x": ArraySpec("f", (1, 1, SIGNAL_LENGTH), 4000, 4), "train_y": ArraySpec("i", (), 4000),
    "test_x": ArraySpec("f", (1, 1, SIGNAL_LENGTH), 1000, 4), "test_y": ArraySpec("i", (), 1000),
}


@register_task("mnist1d")
class MNIST1D(Task):
    """4000 train / 1000 test signals of length 40, stored as 1x1x40 images."""

    info = TaskInfo(
        name="mnist1d",
        version="1.0",
        num_classes=10,
        input_shape=(1, 1, SIGNAL_LENGTH),
        source="mnist1d.data.make_dataset(get_dataset_args()) (https://github.com/greydanus/mnist1d)",
        citation="Greydanus, Scaling down Deep Learning, arXiv:2011.14439, 2020",
        license="Apache-2.0",
        description=(
            f"Offline: generated from templates with the package's default arguments and seed "
            f"{SEED}; the package's own 4000/1000 train/test split. Each signal is a 1x1x40 image. "
            f"Cached as <data-dir>/mnist1d/mnist1d-{SEED}.npz."
        ),
        augmentation="none",
        # Calibrated on `local` alone (benchmarks/calibrate.py, README Protocol): ~37 SGD steps per
        # client per round, a validation half of ~40 samples per client; local converges by round 37.
        defaults={"pool": "cpu", "rounds": 60, "clients": 10, "partition": "dirichlet", "alpha": 0.3,
                  "batch_size": 16, "lr": 0.05, "local_epochs": 2, "heldout_fraction": 0.2},
    )

    def load_arrays(self, data_dir: Path, download: bool):
        cache = data_dir / "mnist1d" / f"mnist1d-{SEED}.npz"
        arrays = _load_cache(cache)
        if arrays is None:
            arrays = _generate()
            _save_cache(cache, arrays)
        return tuple(arrays[k] for k in _KEYS)

    def class_names(self):
        return [str(i) for i in range(10)]

    def pretraining_data(self, modality, data_dir):
        """The whole input is the signal: ``pretraining_arrays`` (why no client sample can be one)."""
        if modality is not None:
            return None
        x, y = pretraining_arrays()
        return x, y, pretraining_source()


def pretraining_source() -> str:
    return (f"mnist1d generator, seed {PRETRAIN_SEED} (the task's is {SEED}), {PRETRAIN_SAMPLES} samples, "
            f"standardized")


@functools.lru_cache(maxsize=1)
def pretraining_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``PRETRAIN_SAMPLES`` MNIST-1D signals ([N, 1, 1, 40], standardized: mean 0, sd 1 over the
    set, as the task's own) and labels, for pretraining a frozen encoder that no client trains.

    They cannot overlap the task's data (train and test, hence every client's, public and test
    sample, and digits-mnist1d's signals, drawn from the same arrays): the generator makes each
    sample from a class template by continuous random draws (scale, shear, translation, correlated
    and i.i.d. noise) from numpy's global generator seeded with ``args.seed``. The task's samples
    are the draws of seed SEED; these are those of PRETRAIN_SEED, another stream, so a sample
    would coincide only if every one of its continuous draws did (probability zero;
    tests/test_pretrained.py checks that no row equals a task row). Generated (under a second)
    each time a process first asks, as the arrays' bytes are what the encoder cache is keyed by."""
    d = _make(PRETRAIN_SEED, num_samples=PRETRAIN_SAMPLES, train_split=1.0)
    x = np.asarray(d["x"], dtype=np.float32)
    x = (x - x.mean()) / max(float(x.std()), 1e-6)  # make_dataset standardizes already; exactly so here
    return x.reshape(-1, 1, 1, SIGNAL_LENGTH), np.asarray(d["y"], dtype=np.int64)


def _make(seed: int, **overrides) -> dict:
    """``mnist1d.data.make_dataset`` with the package's default arguments, ``seed`` and
    ``overrides``, leaving the global random and numpy generators as they were."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as e:
        raise DatasetError(
            f"mnist1d: the 'mnist1d' package is not installed ({e}). "
            "Run `pip install mnist1d` (or install hfl-bench[mnist1d])."
        ) from None
    args = get_dataset_args()
    args.seed = seed
    for key, value in overrides.items():
        setattr(args, key, value)
    # make_dataset reseeds the global random and numpy generators: restore them afterwards.
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        return make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


def _generate() -> dict[str, np.ndarray]:
    d = _make(SEED)
    arrays = {
        "train_x": np.asarray(d["x"], dtype=np.float32).reshape(-1, 1, 1, SIGNAL_LENGTH),
        "train_y": np.asarray(d["y"], dtype=np.int64),
        "test_x": np.asarray(d["x_test"], dtype=np.float32).reshape(-1, 1, 1, SIGNAL_LENGTH),
        "test_y": np.asarray(d["y_test"], dtype=np.int64),
    }
    return arrays


def _valid(arrays: dict[str, np.ndarray]) -> bool:
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if x.ndim != 4 or x.shape[1:] != (1, 1, SIGNAL_LENGTH) or y.shape != (len(x),):
            return False
    return True


def _load_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the cache is absent or unreadable (then regenerate); one that
    is not a regular file (a FIFO, a link to a device: never waited on or read) with one warning."""
    try:  # within a budget of the arrays' known sizes (hfl_bench.npzfile): a bomb is regenerated over
        arrays = read_arrays(path, CACHE_SPECS, "mnist1d")
    except UnusableFile as e:
        log.warning("warning: the mnist1d cache cannot be used (%s); the signals are generated again", e)
        return None
    except Exception:  # absent, truncated, garbage or over budget
        return None
    return arrays if _valid(arrays) else None


def _save_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (temp file + rename); a read-only data dir just skips the cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.chmod(tmp, shared_mode())  # mkstemp creates 0600; the umask decides, as for open()
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if not isinstance(e, OSError):
            raise
