"""Decompression budgets (issue 47, row 7): every .npz a task reads has its members' declared sizes
checked against what the task expects before anything is inflated, and is refused in one line.
Real files in the real formats; the bombs are small compressed files that inflate far beyond the
task's budget, which a test lowers so that a bomb needs only a few MB."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from test_tasks import write_pathmnist

from hfl_bench.data import DatasetError, get_task
from hfl_bench.tasks import imagefolder, mnist1d, pathmnist, pfl_npz

from helpers import invoke_cli
from test_imagefolder import write_folder
from test_pfl_npz import make_folder, save_like_pfllib

BOMB_ROWS = 2_000  # zeros: 6 MB of float32 MNIST images in a ~10 KB compressed file


def one_line(call) -> str:
    with pytest.raises(DatasetError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message and len(message) < 500, message
    return message


def pfl_bomb(tmp_path: Path, monkeypatch) -> Path:
    """A PFLlib folder whose client 0 train file is a deflate bomb, with a budget of 1,000 images."""
    root = tmp_path / "pfl"
    make_folder(root)
    save_like_pfllib(root / "train" / "0.npz", np.zeros((BOMB_ROWS, 1, 28, 28), np.float32),
                     np.zeros(BOMB_ROWS, np.int64))
    assert (root / "train" / "0.npz").stat().st_size < 100_000  # small on disk
    monkeypatch.setattr(pfl_npz, "MAX_IMAGES", 1_000)
    return root


# --------------------------------------------------------------------------- pfl-npz


def test_pfl_npz_bomb_is_refused_before_it_is_inflated(tmp_path, monkeypatch):
    root = pfl_bomb(tmp_path, monkeypatch)
    inflated = []  # every member stream opened: none may be, the budget is checked on the directory
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, *a, **k: inflated.append(a[0]) or real_open(self, *a, **k))
    message = one_line(lambda: get_task("pfl-npz").load(root))
    assert "client files" in message and "budget" in message and "1,000 images" in message, message
    assert inflated == []


def test_pfl_npz_file_over_its_limit_is_refused_unread(tmp_path, monkeypatch):
    root = pfl_bomb(tmp_path, monkeypatch)
    path = root / "train" / "0.npz"
    message = one_line(lambda: pfl_npz.read_client_file(path, limit=1 << 20))
    assert str(path) in message and "declares 6.0 MiB uncompressed" in message and "budget of 1.0 MiB" in message


class _HugeEmpty:
    """What a pickle may ask numpy for in a few bytes: an empty array of a terabyte's shape."""

    def __reduce__(self):
        return pfl_npz._RECONSTRUCT, (np.ndarray, (10**9, 1, 28, 28), b"b")


def test_pfl_npz_pickle_asking_for_a_huge_array_is_refused(tmp_path):
    root = tmp_path / "pfl"
    make_folder(root)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": ()})
    buf.write(pickle.dumps({"x": _HugeEmpty(), "y": np.zeros(3, np.int64)}, protocol=3))
    with zipfile.ZipFile(root / "train" / "2.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("data.npy", buf.getvalue())
    message = one_line(lambda: get_task("pfl-npz").load(root))
    assert "2.npz" in message and "refused an array of shape (1000000000, 1, 28, 28)" in message, message


def test_pfl_npz_bomb_through_the_cli(tmp_path, monkeypatch):
    root = pfl_bomb(tmp_path, monkeypatch)
    out = tmp_path / "runs"
    result, stdout, stderr = invoke_cli("run", "--task", "pfl-npz", "--data-dir", str(root), "--method", "local",
                                        "--rounds", "1", "-q", "--out", str(out))
    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exception, lines)
    assert len(lines) == 1 and "budget" in lines[0] and "Traceback" not in stdout + stderr, lines
    assert not [p for p in out.rglob("*") if p.is_file()]


# --------------------------------------------------------------------------- pathmnist


def test_pathmnist_bomb_is_refused_on_its_header(tmp_path, monkeypatch):
    monkeypatch.setattr(pathmnist, "ROWS", {"train": 100, "test": 50})
    write_pathmnist(tmp_path, n=(30, 7, 12))
    assert get_task("pathmnist").load(tmp_path).train_x.shape[0] == 30  # within the budget
    arrays = dict(np.load(tmp_path / "pathmnist.npz"))
    arrays["train_images"] = np.zeros((1_000, 28, 28, 3), np.uint8)  # 2.3 MB of zeros, a few KB compressed
    arrays["train_labels"] = np.zeros((1_000, 1), np.uint8)
    np.savez_compressed(tmp_path / "pathmnist.npz", **arrays)
    message = one_line(lambda: get_task("pathmnist").load(tmp_path))
    # the zip entry's declared size is over the budget of 100 rows: refused before the header is read
    assert "pathmnist.npz: member train_images.npy declares 2.2 MiB uncompressed" in message, message
    assert "budget of 239.7 KiB" in message, message


def _npz_with_member(path: Path, arrays: dict[str, np.ndarray], name: str, data: bytes, method: int) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for key, a in arrays.items():
            if f"{key}.npy" != name:
                buf = io.BytesIO()
                np.lib.format.write_array(buf, a)
                z.writestr(f"{key}.npy", buf.getvalue())
        z.writestr(name, data, compress_type=method)


def test_pathmnist_header_declaring_more_than_the_real_splits_is_refused(tmp_path):
    arrays = write_pathmnist(tmp_path)
    buf = io.BytesIO()  # a header claiming 10 million images, then a few bytes
    np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": (10**7, 28, 28, 3)})
    _npz_with_member(tmp_path / "pathmnist.npz", arrays, "train_images.npy", buf.getvalue() + bytes(100),
                     zipfile.ZIP_DEFLATED)
    message = one_line(lambda: get_task("pathmnist").load(tmp_path))
    assert "declares 10,000,000 rows" in message and "89,996 rows" in message, message


def test_pathmnist_bzip2_member_is_refused(tmp_path):
    # zipfile inflates a bzip2 chunk whole, without a limit; numpy never writes one
    arrays = write_pathmnist(tmp_path)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arrays["test_images"])
    _npz_with_member(tmp_path / "pathmnist.npz", arrays, "test_images.npy", buf.getvalue(), zipfile.ZIP_BZIP2)
    message = one_line(lambda: get_task("pathmnist").load(tmp_path))
    assert "test_images.npy uses zip compression method 12" in message, message


def test_pathmnist_pickled_member_is_refused(tmp_path):
    arrays = write_pathmnist(tmp_path)
    arrays["test_labels"] = np.array([[1]] * 12, dtype=object)
    np.savez_compressed(tmp_path / "pathmnist.npz", **arrays)
    assert "holds pickled objects" in one_line(lambda: get_task("pathmnist").load(tmp_path))


# --------------------------------------------------------------------------- the caches


def test_mnist1d_cache_over_its_known_size_is_regenerated_not_read(tmp_path):
    path = tmp_path / "cache.npz"
    sizes = {"train": 4000, "test": 1000}
    arrays = {f"{s}_x": np.zeros((n, 1, 1, 40), np.float32) for s, n in sizes.items()}
    arrays |= {f"{s}_y": np.zeros(n, np.int64) for s, n in sizes.items()}
    np.savez_compressed(path, **arrays)
    assert mnist1d._load_cache(path) is not None  # the real sizes read
    arrays["train_x"], arrays["train_y"] = np.zeros((5000, 1, 1, 40), np.float32), np.zeros(5000, np.int64)
    np.savez_compressed(path, **arrays)
    assert mnist1d._load_cache(path) is None


def test_imagefolder_cache_over_its_budget_is_decoded_again(tmp_path):
    write_folder(tmp_path)
    task = get_task("imagefolder")
    first = task.load_arrays(tmp_path, False)
    (cache,) = (tmp_path / imagefolder.CACHE_FOLDER).glob("*.npz")
    with np.load(cache) as z:
        arrays = dict(z)
    n = 1_000  # a cache claiming far more images than the folder holds
    arrays["train_x"], arrays["train_y"] = np.zeros((n, 3, 8, 8), np.uint8), np.zeros(n, np.int64)
    np.savez_compressed(cache, **arrays)
    again = get_task("imagefolder").load_arrays(tmp_path, False)
    assert again[0].shape == first[0].shape and np.array_equal(again[1], first[1])


def test_image_over_the_pixel_budget_is_refused_before_decoding(tmp_path, monkeypatch):
    write_folder(tmp_path)  # 8x8 images
    monkeypatch.setattr(imagefolder, "MAX_PIXELS", 63)
    decoded = []
    monkeypatch.setattr(imagefolder, "_eight_bit", lambda image: decoded.append(image) or image)
    message = one_line(lambda: get_task("imagefolder").load(tmp_path))
    assert "declares 8x8 pixels" in message and "63 pixels" in message and decoded == [], message
