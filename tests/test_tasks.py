"""The built-in dataset tasks, run through their real loaders on small fake files (offline)."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hfl_bench.data import DatasetError, Task, TaskInfo, get_task
from hfl_bench.tasks import cifar, mnist1d

torchvision = pytest.importorskip("torchvision")


# --------------------------------------------------------------------------- helpers


def _check_normalized(data, shape):
    assert data.train_x.dtype == torch.float32 and data.test_x.dtype == torch.float32
    assert data.train_y.dtype == torch.int64 and data.test_y.dtype == torch.int64
    assert tuple(data.train_x.shape[1:]) == shape and tuple(data.test_x.shape[1:]) == shape
    dims = [0] + list(range(2, data.train_x.dim()))
    # float32 means and stds over >= 1e4 values (ATen sums pairwise/cascaded: error ~ log2(n) x 6e-8 x
    # |x| <= ~10 ~ 1e-5) of data the loader normalized with statistics of its own: 1e-4 and 1e-3 hold
    assert torch.allclose(data.train_x.mean(dim=dims), torch.zeros(shape[0]), atol=1e-4)
    assert torch.allclose(data.train_x.std(dim=dims), torch.ones(shape[0]), atol=1e-3)


def _relaxed(cls):
    """The torchvision class without MD5 checks, so its real parsing code reads small fakes."""
    return type(
        "Relaxed" + cls.__name__,
        (cls,),
        {
            "train_list": [[f, None] for f, _ in cls.train_list],
            "test_list": [[f, None] for f, _ in cls.test_list],
            "meta": {**cls.meta, "md5": None},
        },
    )


def _dump(path: Path, obj) -> None:
    # The real files are Python 2 pickles with str keys, read back with encoding="latin1".
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _images(rng, n):
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def write_cifar10(root: Path, n_per_batch=6, n_test=8, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    train_x, train_y = [], []
    for i in range(1, 6):
        x, y = _images(rng, n_per_batch), rng.integers(0, 10, n_per_batch).tolist()
        _dump(folder / f"data_batch_{i}", {"batch_label": f"batch {i}", "data": x, "labels": y})
        train_x.append(x)
        train_y += y
    test_x, test_y = _images(rng, n_test), rng.integers(0, 10, n_test).tolist()
    _dump(folder / "test_batch", {"batch_label": "test", "data": test_x, "labels": test_y})
    names = [f"class{i}" for i in range(10)]
    _dump(folder / "batches.meta", {"label_names": names, "num_cases_per_batch": n_per_batch})
    return np.concatenate(train_x), np.array(train_y), test_x, np.array(test_y), names


def write_cifar100(root: Path, n_train=40, n_test=10, seed=1):
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = []
    for name, n in (("train", n_train), ("test", n_test)):
        x, fine = _images(rng, n), rng.integers(0, 100, n).tolist()
        coarse = [f // 5 for f in fine]  # differs from fine: the task must use fine labels
        _dump(folder / name, {"data": x, "fine_labels": fine, "coarse_labels": coarse})
        out += [x, np.array(fine)]
    fine_names = [f"fine{i}" for i in range(100)]
    coarse_names = [f"coarse{i}" for i in range(20)]
    _dump(folder / "meta", {"fine_label_names": fine_names, "coarse_label_names": coarse_names})
    return (*out, fine_names)


def write_pathmnist(root: Path, n=(30, 7, 12), seed=2, drop=()):
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, k in zip(("train", "val", "test"), n):
        arrays[f"{split}_images"] = rng.integers(0, 256, size=(k, 28, 28, 3), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 9, size=(k, 1)).astype(np.uint8)
    for key in drop:
        del arrays[key]
    root.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(root / "pathmnist.npz", **arrays)
    return arrays


def _nchw(flat):
    return torch.as_tensor(flat.reshape(-1, 3, 32, 32), dtype=torch.float32)


# --------------------------------------------------------------------------- metadata


@pytest.mark.parametrize(
    "name,classes,shape,aug",
    [
        ("mnist1d", 10, (1, 1, 40), "none"),
        ("cifar10", 10, (3, 32, 32), "crop-flip"),
        ("cifar100", 100, (3, 32, 32), "crop-flip"),
        ("pathmnist", 9, (3, 28, 28), "flips"),
    ],
)
def test_task_info(name, classes, shape, aug):
    info = get_task(name).info
    assert info.name == name and info.version == "1.0"
    assert info.num_classes == classes and tuple(info.input_shape) == shape
    assert info.augmentation == aug
    assert info.source and info.citation and info.license and info.description
    assert info.defaults["clients"] == 10 and info.defaults["partition"] == "dirichlet"
    assert info.defaults["alpha"] == 0.3
    if name == "mnist1d":  # the calibrated CPU protocol (benchmarks/calibrate.py)
        assert info.defaults["pool"] == "cpu" and info.defaults["rounds"] == 60
        assert (info.defaults["batch_size"], info.defaults["lr"], info.defaults["local_epochs"]) == (16, 0.05, 2)
    else:
        assert info.defaults["pool"] == "paper" and info.defaults["rounds"] == 300
        assert info.defaults["seed"] == 1024
    info.as_record()


# --------------------------------------------------------------------------- CIFAR


@pytest.fixture
def relaxed_cifar(monkeypatch):
    monkeypatch.setitem(cifar._DATASETS, "cifar10", _relaxed(torchvision.datasets.CIFAR10))
    monkeypatch.setitem(cifar._DATASETS, "cifar100", _relaxed(torchvision.datasets.CIFAR100))


def test_cifar10_loads_fake_files(tmp_path, relaxed_cifar):
    train_x, train_y, test_x, test_y, names = write_cifar10(tmp_path)
    data = get_task("cifar10").load(tmp_path)
    _check_normalized(data, (3, 32, 32))
    assert len(data.train_x) == 30 and len(data.test_x) == 8
    assert data.train_y.tolist() == train_y.tolist()
    assert data.test_y.tolist() == test_y.tolist()
    assert data.class_names == names
    # Same pixels up to the per-channel affine normalization (so NCHW order is right).
    raw = _nchw(train_x)
    mean = raw.mean(dim=(0, 2, 3)).view(1, 3, 1, 1)
    std = raw.std(dim=(0, 2, 3)).view(1, 3, 1, 1)
    # the loader's statistics against these float32 reductions (~1e-6 relative apart, see _check_normalized),
    # applied to |x| <= ~10: 1e-4
    assert torch.allclose(data.train_x, (raw - mean) / std, atol=1e-4)
    assert torch.allclose(data.test_x, (_nchw(test_x) - mean) / std, atol=1e-4)


def test_cifar100_uses_fine_labels(tmp_path, relaxed_cifar):
    _, train_y, _, test_y, names = write_cifar100(tmp_path)
    data = get_task("cifar100").load(tmp_path)
    _check_normalized(data, (3, 32, 32))
    assert data.train_y.tolist() == train_y.tolist()
    assert data.test_y.tolist() == test_y.tolist()
    assert data.class_names == names


@pytest.mark.parametrize(
    "name,folder", [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")]
)
def test_cifar_missing(tmp_path, name, folder):
    with pytest.raises(DatasetError) as e:
        get_task(name).load(tmp_path)
    assert str(tmp_path / folder) in str(e.value) and "--download" in str(e.value)


def test_cifar_md5_mismatch_is_a_dataset_error(tmp_path):
    write_cifar10(tmp_path)  # fake files fail torchvision's real MD5 check
    with pytest.raises(DatasetError) as e:
        get_task("cifar10").load(tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "cifar-10-batches-py") in msg
    assert "corrupt" in msg and "--download" in msg


def test_cifar_garbage_batch_is_a_dataset_error(tmp_path, relaxed_cifar):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"\x00garbage" * 50)
    with pytest.raises(DatasetError) as e:
        get_task("cifar10").load(tmp_path)
    assert str(tmp_path / "cifar-10-batches-py") in str(e.value) and "corrupt" in str(e.value)


def test_cifar_missing_batch_is_a_dataset_error(tmp_path, relaxed_cifar):
    write_cifar100(tmp_path)
    (tmp_path / "cifar-100-python" / "test").unlink()
    with pytest.raises(DatasetError, match="missing or corrupt"):
        get_task("cifar100").load(tmp_path)


def test_cifar_fingerprint_covers_its_files(tmp_path, relaxed_cifar):
    write_cifar10(tmp_path)
    task = get_task("cifar10")
    folder = tmp_path / "cifar-10-batches-py"
    names = [p.name for p in task.data_files(tmp_path)]
    assert names == [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"]
    data = task.load(tmp_path)
    assert data.fingerprint == task.fingerprint(tmp_path)
    (folder / "test_batch").write_bytes((folder / "test_batch").read_bytes() + b"\0")
    assert task.fingerprint(tmp_path) != data.fingerprint
    (folder / "batches.meta").unlink()
    with pytest.raises(DatasetError, match=r"batches\.meta.*--download"):
        task.fingerprint(tmp_path)


def test_cifar100_data_files(tmp_path):
    assert [p.relative_to(tmp_path).as_posix() for p in get_task("cifar100").data_files(tmp_path)] == [
        "cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"]


# --------------------------------------------------------------------------- PathMNIST


def test_pathmnist_loads_fake_file(tmp_path):
    arrays = write_pathmnist(tmp_path)
    data = get_task("pathmnist").load(tmp_path)
    _check_normalized(data, (3, 28, 28))
    assert len(data.train_x) == 30 and len(data.test_x) == 12  # val is not used
    assert data.train_y.tolist() == arrays["train_labels"].reshape(-1).tolist()
    assert data.test_y.tolist() == arrays["test_labels"].reshape(-1).tolist()
    assert data.class_names is not None and len(data.class_names) == 9
    assert data.class_names[0] == "adipose"
    raw = torch.as_tensor(arrays["train_images"].transpose(0, 3, 1, 2), dtype=torch.float32)
    mean = raw.mean(dim=(0, 2, 3)).view(1, 3, 1, 1)
    std = raw.std(dim=(0, 2, 3)).view(1, 3, 1, 1)
    assert torch.allclose(data.train_x, (raw - mean) / std, atol=1e-4)


def test_pathmnist_fingerprint_covers_its_file(tmp_path):
    write_pathmnist(tmp_path)
    task = get_task("pathmnist")
    assert task.data_files(tmp_path) == [tmp_path / "pathmnist.npz"]
    fp = task.load(tmp_path).fingerprint
    assert fp == task.fingerprint(tmp_path)
    other = tmp_path / "other"
    write_pathmnist(other, seed=3)
    assert task.fingerprint(other) != fp


def test_pathmnist_missing(tmp_path):
    root = tmp_path / "nowhere"  # does not exist: medmnist itself would assert
    with pytest.raises(DatasetError) as e:
        get_task("pathmnist").load(root)
    assert str(root / "pathmnist.npz") in str(e.value) and "--download" in str(e.value)


def test_pathmnist_truncated_file(tmp_path):
    write_pathmnist(tmp_path)
    path = tmp_path / "pathmnist.npz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DatasetError) as e:
        get_task("pathmnist").load(tmp_path)
    assert str(path) in str(e.value) and "--download" in str(e.value)


def test_pathmnist_garbage_file(tmp_path):
    path = tmp_path / "pathmnist.npz"
    path.write_bytes(b"not an npz file at all" * 20)
    with pytest.raises(DatasetError) as e:
        get_task("pathmnist").load(tmp_path)
    assert str(path) in str(e.value)


def test_pathmnist_missing_key(tmp_path):
    write_pathmnist(tmp_path, drop=("test_labels",))
    with pytest.raises(DatasetError) as e:
        get_task("pathmnist").load(tmp_path)
    assert str(tmp_path / "pathmnist.npz") in str(e.value)


# --------------------------------------------------------------------------- MNIST-1D


@pytest.fixture(scope="module")
def mnist1d_dir(tmp_path_factory):
    pytest.importorskip("mnist1d")
    return tmp_path_factory.mktemp("mnist1d-data")


def test_mnist1d_generates_and_caches(mnist1d_dir):
    np_state, py_state = np.random.get_state(), random.getstate()
    data = get_task("mnist1d").load(mnist1d_dir)
    # make_dataset reseeds the global generators; the task must leave them as they were.
    assert np.array_equal(np.random.get_state()[1], np_state[1]) and random.getstate() == py_state
    _check_normalized(data, (1, 1, 40))
    assert data.train_x.shape == (4000, 1, 1, 40) and data.test_x.shape == (1000, 1, 1, 40)
    assert set(data.train_y.tolist()) == set(range(10))
    assert data.class_names == [str(i) for i in range(10)]
    cache = mnist1d_dir / "mnist1d" / f"mnist1d-{mnist1d.SEED}.npz"
    assert cache.is_file()
    assert not [p for p in cache.parent.iterdir() if p != cache]  # no temp file left behind


def test_mnist1d_second_load_uses_cache(mnist1d_dir, monkeypatch):
    first = get_task("mnist1d").load(mnist1d_dir)  # cached by the previous test, or generated here

    def fail(*a, **k):
        raise AssertionError("regenerated despite the cache")

    monkeypatch.setattr(mnist1d, "_generate", fail)
    second = get_task("mnist1d").load(mnist1d_dir)
    for a in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, a), getattr(second, a))


def test_mnist1d_corrupt_cache_is_regenerated(mnist1d_dir, tmp_path):
    good = mnist1d_dir / "mnist1d" / f"mnist1d-{mnist1d.SEED}.npz"
    if not good.is_file():
        get_task("mnist1d").load(mnist1d_dir)
    reference = get_task("mnist1d").load(mnist1d_dir)
    bad = tmp_path / "mnist1d" / good.name
    bad.parent.mkdir()
    bad.write_bytes(good.read_bytes()[:1000])
    again = get_task("mnist1d").load(tmp_path)
    assert torch.equal(again.train_x, reference.train_x)
    assert torch.equal(again.test_y, reference.test_y)
    assert bad.stat().st_size == good.stat().st_size  # rewritten


def test_mnist1d_not_installed(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mnist1d", None)
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(DatasetError, match="pip install mnist1d"):
        get_task("mnist1d").load(tmp_path)


# --------------------------------------------------------------------------- generic checks in Task.load


class _Arrays(Task):
    """A task that returns whatever arrays a test gives it."""

    info = TaskInfo(name="fake", version="1.0", num_classes=3, input_shape=(1, 2, 2), source="test",
                    citation="none", license="none")

    def __init__(self, train_x, train_y, test_x=None, test_y=None):
        test_x, test_y = (train_x, train_y) if test_x is None else (test_x, test_y)
        self.arrays = (train_x, train_y, test_x, test_y)

    def load_arrays(self, data_dir, download):
        return self.arrays


def test_load_refuses_non_finite_images(tmp_path):
    x, y = np.zeros((4, 1, 2, 2), np.float64), np.array([0, 1, 2, 0])
    assert _Arrays(x, y).load(tmp_path).fingerprint == _Arrays(x, y).fingerprint(tmp_path)
    for bad in (np.nan, np.inf, 1e300):  # 1e300 is inf in float32
        broken = x.copy()
        broken[2, 0, 1, 1] = bad
        with pytest.raises(DatasetError, match="fake: test images .* hold NaN or infinite values"):
            _Arrays(x, y, broken, y).load(tmp_path)


def test_load_refuses_bad_labels(tmp_path):
    x = np.zeros((4, 1, 2, 2), np.float32)
    with pytest.raises(DatasetError, match="fake: train labels .* must be integers, found float64"):
        _Arrays(x, np.array([0, 1.5, 2, 0])).load(tmp_path)
    with pytest.raises(DatasetError, match="must be integers"):
        _Arrays(x, np.array([0, np.nan, 2, 0])).load(tmp_path)
    assert _Arrays(x, np.array([0.0, 1.0, 2.0, 0.0])).load(tmp_path).train_y.tolist() == [0, 1, 2, 0]
    with pytest.raises(DatasetError, match="fake: .* yields 4 train images and 3 labels"):
        _Arrays(x, np.array([0, 1, 2])).load(tmp_path)
    with pytest.raises(DatasetError, match=r"lie outside 0\.\.2"):
        _Arrays(x, np.array([0, 1, 3, 0])).load(tmp_path)
