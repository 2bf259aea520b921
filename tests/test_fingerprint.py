"""Data fingerprints: what a task loaded, recomputed from stat calls once content hashes are cached."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from hfl_bench import data as data_mod
from hfl_bench.data import FINGERPRINT_CACHE, RACY_NS, get_task
from hfl_bench.tasks.pfl_npz import read_client_file

from test_pfl_npz import make_folder, save_like_pfllib


def age(root: Path, seconds: float = 3600) -> None:
    """Move every file's mtime into the past: only files older than RACY_NS are cached."""
    t = time.time_ns() - int(seconds * 1e9)
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(t, t))


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """The files whose content a fingerprint reads, in order (file_sha256 is the only reader)."""
    calls: list[Path] = []
    real = data_mod.file_sha256

    def counting(path):
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(data_mod, "file_sha256", counting)
    return calls


@pytest.fixture
def folder(tmp_path) -> Path:
    root = tmp_path / "mnist-pfl"
    make_folder(root)
    age(root)
    return root


def rewrite_one_sample(path: Path) -> None:
    """Same shape, same (uncompressed) size, one value changed."""
    x, y = read_client_file(path)
    x = x.copy()
    x[0, 0, 0, 0] += 0.5
    save_like_pfllib(path, x, y, compressed=False)


def test_one_changed_file_changes_the_fingerprint(tmp_path):
    task = get_task("pfl-npz")
    a, b = tmp_path / "a", tmp_path / "b"
    make_folder(a)
    make_folder(b)
    fp = task.fingerprint(a)
    assert len(fp) == 16 and int(fp, 16) >= 0
    # Paths are relative to the folder: the same files elsewhere are the same data.
    assert task.fingerprint(b) == fp
    rewrite_one_sample(b / "train" / "1.npz")
    assert task.fingerprint(b) != fp
    assert task.fingerprint(a) == fp


def test_second_call_reads_no_content(folder, hashed):
    task = get_task("pfl-npz")
    first = task.fingerprint(folder)
    assert len(hashed) == 7  # config.json and 3 + 3 client files
    assert (folder / FINGERPRINT_CACHE).is_file()
    hashed.clear()
    assert task.fingerprint(folder) == first
    assert hashed == []
    # The parent of a pfl-npz folder names the same data.
    (folder.parent / "pfl-npz").symlink_to(folder)
    assert task.fingerprint(folder.parent) == first


def test_touched_identical_file_keeps_the_fingerprint(folder, hashed):
    task = get_task("pfl-npz")
    first = task.fingerprint(folder)
    target = folder / "test" / "2.npz"
    os.utime(target)  # touch: new mtime, same bytes
    hashed.clear()
    assert task.fingerprint(folder) == first
    assert hashed == [target]  # only the touched file is read again


def test_fresh_file_is_not_trusted_from_the_cache(folder, hashed):
    """A same-size rewrite within the timestamp granularity keeps size and mtime: a file modified
    less than RACY_NS ago is therefore never cached, and such a rewrite is still seen."""
    task = get_task("pfl-npz")
    target = folder / "train" / "1.npz"  # written uncompressed: a rewrite keeps its size
    os.utime(target)
    first = task.fingerprint(folder)
    st = target.stat()
    assert time.time_ns() - st.st_mtime_ns < RACY_NS
    rewrite_one_sample(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # as if in the same clock tick
    assert target.stat().st_size == st.st_size
    assert task.fingerprint(folder) != first


def test_load_sets_the_same_fingerprint(folder):
    task = get_task("pfl-npz")
    data = task.load(folder)
    assert data.fingerprint == task.fingerprint(folder)
    assert data.to("cpu").fingerprint == data.fingerprint


def test_digits_fingerprints_its_arrays():
    task = get_task("digits")
    assert task.data_files(Path("anywhere")) == []
    data = task.load()
    assert data.fingerprint == task.fingerprint() and len(data.fingerprint) == 16


def test_name_and_version_are_hashed(folder, monkeypatch):
    task = get_task("pfl-npz")
    first = task.fingerprint(folder)
    monkeypatch.setattr(type(task), "info", dataclasses.replace(task.info, version="9.9"))
    assert task.fingerprint(folder) != first


def test_unwritable_cache_is_silent(folder, hashed, monkeypatch):
    task = get_task("pfl-npz")
    reference = task.fingerprint(folder)
    (folder / FINGERPRINT_CACHE).unlink()

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    with monkeypatch.context() as m:  # a read-only data folder (the tests may run as root)
        m.setattr(data_mod, "write_atomic", refuse)
        assert task.fingerprint(folder) == reference
        assert task.load(folder).fingerprint == reference
    assert not (folder / FINGERPRINT_CACHE).exists()
    # Something in the cache's way: it can be neither read nor replaced.
    (folder / FINGERPRINT_CACHE).mkdir()
    hashed.clear()
    assert task.fingerprint(folder) == reference
    assert len(hashed) == 7 and (folder / FINGERPRINT_CACHE).is_dir()
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # no temp file left behind


def test_read_only_folder_is_left_alone(folder, hashed):
    """A folder without write permission gets no cache file, even for root (who could write it)."""
    task = get_task("pfl-npz")
    folder.chmod(0o555)
    try:
        assert task.fingerprint(folder) == task.fingerprint(folder)
        assert len(hashed) == 14  # nothing cached: each call reads every file
        assert not (folder / FINGERPRINT_CACHE).exists()
    finally:
        folder.chmod(0o755)
    assert task.load(folder).fingerprint == task.fingerprint(folder)


def test_corrupt_cache_is_ignored_and_replaced(folder, hashed):
    task = get_task("pfl-npz")
    reference = task.fingerprint(folder)
    cache = folder / FINGERPRINT_CACHE
    entries = json.loads(cache.read_text())["files"]
    assert set(entries) == {"config.json", *(f"{s}/{c}.npz" for s in ("train", "test") for c in range(3))}
    for garbage in ("{not json", "[1, 2]", json.dumps({"files": {"config.json": "x"}})):
        cache.write_text(garbage)
        hashed.clear()
        assert task.fingerprint(folder) == reference
        assert hashed  # re-read, then cached again
        assert json.loads(cache.read_text())["files"] == entries


def test_missing_file_is_a_dataset_error(folder):
    (folder / "test" / "0.npz").unlink()
    with pytest.raises(data_mod.DatasetError, match="missing"):
        get_task("pfl-npz").fingerprint(folder)


def test_arrays_fingerprint_sees_every_array():
    info = get_task("digits").info
    x = np.zeros((4, 1, 8, 8), np.float32)
    y = np.arange(4)
    base = data_mod.arrays_fingerprint(info, (x, y, x, y))
    assert data_mod.arrays_fingerprint(info, (x, y, x, y)) == base
    assert data_mod.arrays_fingerprint(info, (x, y, x, y[::-1].copy())) != base
    assert data_mod.arrays_fingerprint(info, (x.reshape(4, 1, 1, 64), y, x, y)) != base  # same bytes
