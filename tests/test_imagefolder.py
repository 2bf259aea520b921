"""The imagefolder tasks on tiny folders of real JPEG and PNG files (written here with PIL), the
decoded-array cache, the errors, the command line, and a few images of the real CIFAR-10 JPEG archive."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hfl_bench.data import DatasetError, get_task
from hfl_bench.tasks.imagefolder import CACHE_ENV, CACHE_FOLDER, CIFAR10JPG, ImageFolder, stratified_pick
from hfl_bench.testing import run_record

from helpers import invoke_cli

Image = pytest.importorskip("PIL.Image")

ARCHIVE = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpg.tar.gz"
CLASSES = ["cat", "dog", "owl"]


# --------------------------------------------------------------------------- helpers


def pixel(i: int) -> int:
    """A grey level that identifies image i (distinct for i < 64, far apart enough for JPEG)."""
    return 2 + 4 * i


def write_image(path: Path, value: int, size=(8, 8), mode="RGB") -> None:
    """A flat image of ``value`` (channel c holds value + c in RGB), saved in the format of the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w, h = size
    if mode == "L":
        a = np.full((h, w), value, np.uint8)
    else:
        a = (np.full((h, w, 3), value) + np.arange(3)).astype(np.uint8)
    Image.fromarray(a, mode).save(path)


def write_folder(root: Path, train=(4, 3, 5), test=(2, 2, 2), size=(8, 8)) -> dict[str, list[int]]:
    """train/<class>/ and test/<class>/ of flat PNG images (lossless: pixel values are exact); image
    number i of a split has grey level pixel(i). Returns each split's values in load order."""
    values: dict[str, list[int]] = {}
    for split, counts in (("train", train), ("test", test)):
        i, values[split] = 0, []
        for c, n in zip(CLASSES, counts):
            for k in range(n):
                write_image(root / split / c / f"{k:03d}.png", pixel(i), size)
                values[split].append(pixel(i))
                i += 1
    return values


def first_pixels(x: np.ndarray) -> list[int]:
    """The red value at (0, 0) of each image, back to 0..255."""
    return np.rint(np.asarray(x)[:, 0, 0, 0] * 255).astype(int).tolist()


@pytest.fixture
def opens(monkeypatch) -> list[str]:
    """Every image PIL opens from now on (the decoder's only way in)."""
    calls: list[str] = []
    real = Image.open

    def counting(fp, *args, **kwargs):
        calls.append(str(fp))
        return real(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting)
    return calls


def variant(base, **attrs):
    """A subclass of a registered task with other class attributes (as a plugin would make one)."""
    return type(f"Variant{base.__name__}", (base,), attrs)()


# --------------------------------------------------------------------------- metadata


def test_task_info():
    info = get_task("cifar10-jpg").info
    assert info.num_classes == 10 and info.input_shape == (3, 32, 32) and info.augmentation == "crop-flip"
    assert "Krizhevsky" in info.citation and "JPEG" in info.description and "10,000" in info.description
    # the calibrated CPU protocol (benchmarks/calibrate.py, README Protocol)
    assert info.defaults == {"pool": "cpu", "rounds": 50, "clients": 10, "partition": "dirichlet", "alpha": 0.3,
                             "batch_size": 32, "lr": 0.01, "local_epochs": 1, "heldout_fraction": 0.2}
    assert CIFAR10JPG.train_subsample == 10_000 and CIFAR10JPG.test_subsample == 2_000
    assert CIFAR10JPG.image_size == 32
    # every training image of the same folder, cifar10-jpg's test subsample; 20 clients, 10 a round
    full_task = get_task("cifar10-jpg-full")
    full = full_task.info
    assert full.num_classes == 10 and full.input_shape == (3, 32, 32) and full.augmentation == "crop-flip"
    assert "50,000 training images" in full.description and "2,000" in full.description
    # its rounds calibrated on `local` at that shape (benchmarks/results/calibration.json, rule 3b)
    assert full.defaults == {**info.defaults, "clients": 20, "clients_per_round": 10, "rounds": 120}
    assert isinstance(full_task, CIFAR10JPG) and full_task.train_subsample is None and full_task.test_subsample == 2_000
    assert full_task.folder_name == CIFAR10JPG.folder_name and full_task.image_size == 32
    # imagefolder learns classes and shape from its folder: unknown until loaded
    info = get_task("imagefolder").info
    assert info.num_classes is None and info.input_shape == ()
    assert info.as_record()["num_classes"] is None


# --------------------------------------------------------------------------- decoding


def test_layout_labels_and_pixels(tmp_path):
    values = write_folder(tmp_path)
    write_image(tmp_path / "train" / "owl" / "UPPER.JPG", 200)  # suffixes in any case; JPEG is lossy
    (tmp_path / "train" / "owl" / "notes.txt").write_text("not an image")
    (tmp_path / "train" / "owl" / "._000.png").write_bytes(b"macOS resource fork")  # hidden: skipped
    (tmp_path / "test" / ".ipynb_checkpoints").mkdir()  # hidden folder: not a class
    task = get_task("imagefolder")
    train_x, train_y, test_x, test_y = task.load_arrays(tmp_path, False)
    assert train_x.dtype == np.float32 and train_x.shape == (13, 3, 8, 8) and test_x.shape == (6, 3, 8, 8)
    assert 0 <= train_x.min() and train_x.max() <= 1
    assert train_y.tolist() == [0] * 4 + [1] * 3 + [2] * 6 and test_y.tolist() == [0, 0, 1, 1, 2, 2]
    # PNG is exact: class then file name order, channel c = value + c
    assert first_pixels(train_x[:12]) == values["train"] and first_pixels(test_x) == values["test"]
    assert np.allclose(train_x[0, :, 3, 3] * 255, [values["train"][0] + c for c in range(3)])
    assert abs(train_x[12, 0].mean() * 255 - 200) < 3  # UPPER.JPG sorts after the PNGs

    data = task.load(tmp_path)
    assert task.info.num_classes == 3 and task.info.input_shape == (3, 8, 8)  # set from the folder
    assert data.class_names == CLASSES and data.train_y.dtype == torch.int64
    assert data.train_x.shape == (13, 3, 8, 8)
    # float32 per-channel means of normalized pixels: as tests/test_tasks.py's _check_normalized
    assert torch.allclose(data.train_x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)  # normalized like every task
    assert data.fingerprint == task.fingerprint(tmp_path)
    assert get_task("imagefolder").info.num_classes is None  # the registered info is left alone


def test_grey_png_becomes_rgb(tmp_path):
    write_folder(tmp_path)
    write_image(tmp_path / "train" / "cat" / "grey.png", 100, mode="L")
    train_x, *_ = get_task("imagefolder").load_arrays(tmp_path, False)
    grey = train_x[4]  # after cat/000.png .. cat/003.png
    assert grey.shape == (3, 8, 8) and np.allclose(grey * 255, 100)


def test_resize_to_image_size(tmp_path):
    write_folder(tmp_path, size=(8, 8))
    odd = np.arange(12 * 10 * 3, dtype=np.uint8).reshape(10, 12, 3)
    Image.fromarray(odd).save(tmp_path / "test" / "dog" / "wide.png")  # 12 x 10: another size
    task = variant(ImageFolder, image_size=4)
    train_x, _, test_x, _ = task.load_arrays(tmp_path, False)
    assert train_x.shape[1:] == (3, 4, 4) and test_x.shape[1:] == (3, 4, 4)
    expected = np.asarray(Image.fromarray(odd).resize((4, 4), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    assert np.array_equal(np.rint(test_x[4] * 255), expected)  # dog/000, dog/001, then wide.png
    assert task.load(tmp_path).train_x.shape == (12, 3, 4, 4) and task.info.input_shape == (3, 4, 4)


def test_mixed_sizes_need_an_image_size(tmp_path):
    write_folder(tmp_path)
    write_image(tmp_path / "test" / "owl" / "big.jpg", 50, size=(12, 12))
    with pytest.raises(DatasetError) as e:
        get_task("imagefolder").load(tmp_path)
    msg = str(e.value)
    assert "differ in size" in msg and "8x8" in msg and "12x12" in msg and "big.jpg" in msg
    assert "image_size" in msg and "\n" not in msg


# --------------------------------------------------------------------------- subsampling


def test_stratified_pick_is_exact_proportional_and_seeded():
    labels = np.repeat([0, 1, 2], [10, 6, 4])
    for total, per_class in ((10, [5, 3, 2]), (7, [4, 2, 1]), (20, [10, 6, 4]), (1, [1, 0, 0])):
        picked = stratified_pick(labels, total, 0)
        assert len(picked) == total and len(set(picked.tolist())) == total
        assert np.bincount(labels[picked], minlength=3).tolist() == per_class
        assert (np.diff(picked) > 0).all()  # sorted: images stay in class order
    assert np.array_equal(stratified_pick(labels, 7, 3), stratified_pick(labels, 7, 3))
    assert not np.array_equal(stratified_pick(labels, 7, 3), stratified_pick(labels, 7, 4))


def test_subsample_through_the_task(tmp_path):
    values = write_folder(tmp_path, train=(10, 6, 4), test=(5, 5, 5))
    task = variant(ImageFolder, train_subsample=7, test_subsample=6, subsample_seed=11)
    train_x, train_y, _, test_y = task.load_arrays(tmp_path, False)
    assert np.bincount(train_y).tolist() == [4, 2, 1] and np.bincount(test_y).tolist() == [2, 2, 2]
    kept = first_pixels(train_x)
    assert set(kept) <= set(values["train"]) and len(set(kept)) == 7
    again = variant(ImageFolder, train_subsample=7, test_subsample=6, subsample_seed=11)
    assert np.array_equal(again.load_arrays(tmp_path, False)[0], train_x)  # same seed, same pick
    other = variant(ImageFolder, train_subsample=7, test_subsample=6, subsample_seed=12)
    assert first_pixels(other.load_arrays(tmp_path, False)[0]) != kept
    # other settings are other data: another fingerprint from the same files
    assert len({t.fingerprint(tmp_path) for t in (task, other, get_task("imagefolder"))}) == 3
    assert again.fingerprint(tmp_path) == task.fingerprint(tmp_path)


def write_cifar_folder(root: Path, train: int, test: int) -> None:
    """cifar10-jpg's layout at its size: 10 class folders, ``train`` and ``test`` flat 32x32 PNGs a class."""
    for split, n in (("train", train), ("test", test)):
        for c in range(10):
            for k in range(n):
                write_image(root / "cifar10-jpg" / split / f"class{c}" / f"{k:03d}.png", pixel(c * n + k), (32, 32))


def test_full_task_keeps_every_training_image(tmp_path, monkeypatch, opens):
    # The subsample sizes scaled to a tiny folder (50 training, 30 test images): cifar10-jpg keeps
    # 20 and 10 of them; cifar10-jpg-full, its subclass, inherits the test subsample only.
    write_cifar_folder(tmp_path, train=5, test=3)
    monkeypatch.setattr(CIFAR10JPG, "train_subsample", 20)
    monkeypatch.setattr(CIFAR10JPG, "test_subsample", 10)
    sub, full = get_task("cifar10-jpg").load(tmp_path), get_task("cifar10-jpg-full").load(tmp_path)
    assert full.train_x.shape == (50, 3, 32, 32) and np.bincount(full.train_y.numpy()).tolist() == [5] * 10
    assert sub.train_x.shape == (20, 3, 32, 32) and np.bincount(sub.train_y.numpy()).tolist() == [2] * 10
    # the same stratified test images (the same seed): one global test set for both tasks
    assert full.test_x.shape == (10, 3, 32, 32) and torch.equal(full.test_y, sub.test_y)
    raw_sub, raw_full = (get_task(t).load_arrays(tmp_path, False) for t in ("cifar10-jpg", "cifar10-jpg-full"))
    assert np.array_equal(raw_sub[2], raw_full[2])
    assert sorted(first_pixels(raw_full[0])) == sorted(pixel(i) for i in range(50))  # every image, once
    assert set(first_pixels(raw_sub[0])) < set(first_pixels(raw_full[0]))
    # one folder, two tasks: two fingerprints and two cache files, neither read for the other
    assert full.fingerprint != sub.fingerprint
    assert cache_files(tmp_path / "cifar10-jpg" / CACHE_FOLDER) == sorted(
        [f"cifar10-jpg-{sub.fingerprint}.npz", f"cifar10-jpg-full-{full.fingerprint}.npz"])
    opens.clear()
    again_sub, again_full = get_task("cifar10-jpg").load(tmp_path), get_task("cifar10-jpg-full").load(tmp_path)
    assert opens == []  # both from their own cache file
    assert torch.equal(again_full.train_x, full.train_x) and torch.equal(again_sub.train_x, sub.train_x)


# --------------------------------------------------------------------------- the decoded-array cache


def cache_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_second_load_decodes_nothing(tmp_path, opens):
    write_folder(tmp_path)
    first = get_task("imagefolder").load(tmp_path)
    assert len(opens) == 18  # every image, once
    names = cache_files(tmp_path / CACHE_FOLDER)
    assert names == [f"imagefolder-{first.fingerprint}.npz"]  # no temporary file left behind
    opens.clear()
    task = get_task("imagefolder")
    second = task.load(tmp_path)
    assert opens == []
    for key in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, key), getattr(second, key))
    assert second.fingerprint == first.fingerprint and second.class_names == CLASSES
    assert task.info.num_classes == 3 and task.info.input_shape == (3, 8, 8)  # from the cached arrays too


def test_cache_is_keyed_by_content(tmp_path, opens):
    write_folder(tmp_path)
    first = get_task("imagefolder").load(tmp_path)
    write_image(tmp_path / "test" / "dog" / "000.png", 250)  # same name, other pixels
    opens.clear()
    second = get_task("imagefolder").load(tmp_path)
    assert len(opens) == 18 and second.fingerprint != first.fingerprint
    assert not torch.equal(second.test_x, first.test_x)
    assert len(cache_files(tmp_path / CACHE_FOLDER)) == 2


def test_corrupt_cache_is_ignored_and_rebuilt(tmp_path, opens):
    write_folder(tmp_path)
    first = get_task("imagefolder").load(tmp_path)
    (cache,) = (tmp_path / CACHE_FOLDER).iterdir()
    size = cache.stat().st_size
    cache.write_bytes(cache.read_bytes()[: size // 2])
    opens.clear()
    second = get_task("imagefolder").load(tmp_path)
    assert len(opens) == 18 and torch.equal(second.train_x, first.train_x)
    assert cache.stat().st_size == size  # rewritten
    cache.write_bytes(b"garbage")
    assert torch.equal(get_task("imagefolder").load(tmp_path).test_x, first.test_x)


def test_read_only_folder_caches_elsewhere(tmp_path, monkeypatch, opens):
    root, elsewhere = tmp_path / "images", tmp_path / "cache"
    write_folder(root)
    monkeypatch.setenv(CACHE_ENV, str(elsewhere))
    root.chmod(0o555)  # respected even when the tests run as root
    try:
        data = get_task("imagefolder").load(root)
        opens.clear()
        get_task("imagefolder").load(root)
    finally:
        root.chmod(0o755)
    assert opens == []
    assert cache_files(elsewhere) == [f"imagefolder-{data.fingerprint}.npz"]
    assert not (root / CACHE_FOLDER).exists()


# --------------------------------------------------------------------------- errors


def error_of(task, data_dir, download=False) -> str:
    with pytest.raises(DatasetError) as e:
        task.load(data_dir, download)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_folder(tmp_path):
    msg = error_of(get_task("imagefolder"), tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in msg and "--data-dir" in msg and "train/<class>/" in msg
    msg = error_of(get_task("cifar10-jpg"), tmp_path)
    assert str(tmp_path / "cifar10-jpg") in msg and f"tar -xzf cifar10-jpg.tar.gz -C {tmp_path}" in msg
    with pytest.raises(DatasetError, match="no image folder"):
        get_task("cifar10-jpg").fingerprint(tmp_path)  # the pre-run fingerprint says the same


def test_download_is_refused(tmp_path):
    write_folder(tmp_path)
    msg = error_of(get_task("imagefolder"), tmp_path, download=True)
    assert "local folder only" in msg and "--download" in msg


def test_class_folders_must_match(tmp_path):
    write_folder(tmp_path)
    (tmp_path / "test" / "owl").rename(tmp_path / "test" / "owls")
    msg = error_of(get_task("imagefolder"), tmp_path)
    assert str(tmp_path / "test") in msg and "missing ['owl']" in msg and "extra ['owls']" in msg


def test_corrupt_image_is_named(tmp_path):
    write_folder(tmp_path)
    bad = tmp_path / "train" / "dog" / "001.png"
    bad.write_bytes(bad.read_bytes()[:40])  # truncated
    (tmp_path / "test" / "cat" / "x.jpg").write_bytes(b"not a jpeg at all")
    msg = error_of(get_task("imagefolder"), tmp_path)
    assert f"cannot read image {bad}" in msg and "replace" in msg


def test_empty_class_folder_and_no_images(tmp_path):
    write_folder(tmp_path)
    for p in (tmp_path / "train" / "dog").iterdir():
        p.unlink()
    msg = error_of(get_task("imagefolder"), tmp_path)
    assert f"class folder {tmp_path / 'train' / 'dog'} holds no" in msg
    for c in CLASSES:
        for p in (tmp_path / "train" / c).iterdir():
            p.unlink()
    assert "no .jpg, .jpeg or .png images under" in error_of(get_task("imagefolder"), tmp_path)
    for c in CLASSES[1:]:
        (tmp_path / "train" / c).rmdir()
    assert "holds 1 class folders" in error_of(get_task("imagefolder"), tmp_path)


def test_fixed_task_checks_its_class_count(tmp_path):
    write_folder(tmp_path / "cifar10-jpg", size=(32, 32))
    assert "holds 3 class folders, expected 10" in error_of(get_task("cifar10-jpg"), tmp_path)


# --------------------------------------------------------------------------- the command line


def test_cli_runs_on_a_folder(tmp_path):
    data = tmp_path / "images"
    write_folder(data, train=(12, 12, 12), test=(4, 4, 4))
    record = run_record("--method", "local", "--task", "imagefolder", "--data-dir", str(data),
                        "--rounds", "1", "--clients", "2", out=tmp_path / "out")
    assert record["status"] == "ok"
    assert record["task"]["name"] == "imagefolder" and record["task"]["num_classes"] == 3
    assert record["task"]["input_shape"] == [3, 8, 8]
    assert record["task"]["data_fingerprint"] == get_task("imagefolder").fingerprint(data)


def test_cli_refuses_a_missing_folder_in_one_line(tmp_path):
    out = tmp_path / "out"
    result, stdout, stderr = invoke_cli("run", "--method", "local", "--task", "imagefolder", "--data-dir",
                                        str(tmp_path / "nowhere"), "--rounds", "1", "--clients", "2", "-q",
                                        "--out", str(out))
    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    assert result.exit_code == 2, lines
    assert "Traceback" not in stdout + stderr
    assert len(lines) == 1 and str(tmp_path / "nowhere") in lines[0] and "--data-dir" in lines[0], lines
    assert not out.exists() or not any(out.iterdir())  # nothing written


# --------------------------------------------------------------------------- the real archive


def extract_some(archive: Path, dest: Path, per_folder: int) -> None:
    """The first ``per_folder`` images of every class folder of both splits, streamed (no full
    extraction; the archive must still be read to its last class folder)."""
    counts: dict[str, int] = {}
    with tarfile.open(archive, "r|gz") as tar:
        for member in tar:
            parent = member.name.rsplit("/", 1)[0]
            if not member.isfile() or counts.get(parent, 0) >= per_folder:
                continue
            counts[parent] = counts.get(parent, 0) + 1
            target = dest / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            if len(counts) == 20 and min(counts.values()) >= per_folder:
                return


@pytest.mark.skipif(not ARCHIVE.is_file(), reason=f"{ARCHIVE} is not there")
def test_real_cifar10_jpg_archive(tmp_path):
    extract_some(ARCHIVE, tmp_path, per_folder=20)
    task = variant(CIFAR10JPG, train_subsample=50)
    data = task.load(tmp_path)
    assert data.train_x.shape == (50, 3, 32, 32) and data.test_x.shape == (200, 3, 32, 32)
    assert data.class_names == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                "ship", "truck"]
    assert np.bincount(data.train_y.numpy()).tolist() == [5] * 10
    assert np.bincount(data.test_y.numpy()).tolist() == [20] * 10
    train_x, *_ = task.load_arrays(tmp_path, False)  # from the cache now
    assert train_x.min() >= 0 and train_x.max() <= 1 and train_x.std() > 0.1  # real photos, not flat
    assert json.loads(json.dumps(task.info.as_record()))["num_classes"] == 10
