"""Task ``fashion-mnist`` and ``hfl-bench prepare fashion-mnist``: small files written here in the
real format (gzipped IDX, and a .deb: an ar archive of debian-binary, control.tar.xz and a
data.tar.xz holding them where Debian's package does) prepared through the real CLI; bad files
refused in one line; runs of local and crad on the result offline."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hfl_bench import fashion_mnist as build_module
from hfl_bench.cli import app
from hfl_bench.data import DatasetError, get_task
from hfl_bench.fashion_mnist import CLASSES, DEB_DIR, FILES

N_TRAIN, N_TEST = 400, 100


def idx_images(x: np.ndarray, magic: int = 2051) -> bytes:
    return struct.pack(">iiii", magic, len(x), 28, 28) + x.astype(np.uint8).tobytes()


def idx_labels(y: np.ndarray, magic: int = 2049) -> bytes:
    return struct.pack(">ii", magic, len(y)) + y.astype(np.uint8).tobytes()


def make_idx(seed: int = 0) -> dict[str, bytes]:
    """The four files' IDX bytes: every class equally often, each image random pixels over the
    whole 0-255 range with a class-dependent bright row (learnable, and any pixel mix-up shows)."""
    rng = np.random.default_rng(seed)
    out = {}
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        y = rng.permutation(np.arange(n) % 10)
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        x[np.arange(n), 2 * y + 3] = 255
        out[f"{prefix}-images-idx3-ubyte"], out[f"{prefix}-labels-idx1-ubyte"] = idx_images(x), idx_labels(y)
    return out


def write_folder(folder: Path, idx: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in idx.items():
        (folder / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
    return folder


def _tar_xz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        folders = sorted({str(Path(name).parent) for name in members if ".." not in Path(name).parts})
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _ar(members: dict[str, bytes]) -> bytes:
    out = [b"!<arch>\n"]
    for name, data in members.items():
        out.append(f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode())
        out.append(data + (b"\n" if len(data) % 2 else b""))
    return b"".join(out)


def write_deb(path: Path, idx: dict[str, bytes], extra: dict[str, bytes] | None = None) -> Path:
    """A .deb as dpkg-deb lays it out: debian-binary, control.tar.xz, data.tar.xz with the four
    files under ./usr/share/datasets/fashion-mnist/ and a doc file beside them."""
    data = {f"./{DEB_DIR}/{name}.gz": gzip.compress(raw, mtime=0) for name, raw in idx.items()}
    data["./usr/share/doc/dataset-fashion-mnist/copyright"] = b"Expat\n"
    data.update(extra or {})
    control = _tar_xz({"./control": b"Package: dataset-fashion-mnist\n"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": control, "data.tar.xz": _tar_xz(data)}))
    return path


def sha_args(idx: dict[str, bytes]) -> list[str]:
    return [a for name, data in idx.items() for a in ("--sha256", f"{name}={hashlib.sha256(data).hexdigest()}")]


def _prepare(*args: str):
    result = CliRunner().invoke(app, ["prepare", "fashion-mnist", *args])
    return result, " ".join(result.output.split())


def _refused(result) -> bool:
    return result.exit_code == 2 and len(result.output.strip().splitlines()) == 1


def _pixels(idx: dict[str, bytes], prefix: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.frombuffer(idx[f"{prefix}-images-idx3-ubyte"], np.uint8, offset=16).reshape(-1, 1, 28, 28)
    return x, np.frombuffer(idx[f"{prefix}-labels-idx1-ubyte"], np.uint8, offset=8)


def test_prepare_from_a_folder_keeps_every_pixel_and_label(tmp_path):
    idx = make_idx()
    assert list(idx) == ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                         "t10k-labels-idx1-ubyte"] == list(FILES)
    data_dir = tmp_path / "data"
    result, text = _prepare("--from", str(write_folder(tmp_path / "src", idx)), "--data-dir", str(data_dir),
                            *sha_args(idx))
    assert result.exit_code == 0, result.output
    assert f"wrote {data_dir / 'fashion-mnist' / 'fashion-mnist.npz'} ({N_TRAIN} training and {N_TEST} test" in text
    info = json.loads((data_dir / "fashion-mnist" / "SOURCE.json").read_text())
    assert info["images"] == {"train": N_TRAIN, "test": N_TEST}
    assert info["per_class"]["train"] == [N_TRAIN // 10] * 10
    assert info["idx_sha256"]["train-images-idx3-ubyte"] == hashlib.sha256(idx["train-images-idx3-ubyte"]).hexdigest()

    task = get_task("fashion-mnist")
    train_x, train_y, test_x, test_y = task.load_arrays(data_dir, False)  # fewer than the subsample: all kept
    for (x, y), prefix in (((train_x, train_y), "train"), ((test_x, test_y), "t10k")):
        want_x, want_y = _pixels(idx, prefix)
        assert x.shape == want_x.shape and np.array_equal(np.rint(x * 255).astype(np.uint8), want_x)
        assert np.array_equal(y, want_y)
    data = task.load(data_dir)
    assert tuple(data.train_x.shape) == (N_TRAIN, 1, 28, 28) and data.class_names == list(CLASSES)
    assert data.class_names[0] == "T-shirt/top" and data.fingerprint == task.fingerprint(data_dir)


def test_the_subsample_is_stratified_seeded_and_in_the_fingerprint(tmp_path):
    idx = make_idx()
    data_dir = tmp_path / "data"
    assert _prepare("--from", str(write_folder(tmp_path / "src", idx)), "--data-dir", str(data_dir),
                    *sha_args(idx))[0].exit_code == 0
    base = type(get_task("fashion-mnist"))

    class Smaller(base):
        train_subsample, test_subsample = 100, 50

    small, full = Smaller(), base()
    train_x, train_y, test_x, test_y = small.load_arrays(data_dir, False)
    assert np.bincount(train_y).tolist() == [10] * 10 and np.bincount(test_y).tolist() == [5] * 10
    again = small.load_arrays(data_dir, False)
    assert np.array_equal(train_x, again[0]) and np.array_equal(test_y, again[3])
    assert small.fingerprint(data_dir) != full.fingerprint(data_dir)


def test_prepare_from_the_deb_gives_the_same_cache(tmp_path):
    idx = make_idx()
    assert _prepare("--from", str(write_folder(tmp_path / "src", idx)), "--data-dir", str(tmp_path / "a"),
                    *sha_args(idx))[0].exit_code == 0
    deb = write_deb(tmp_path / "dataset-fashion-mnist_all.deb", idx)
    result, _ = _prepare("--from", str(deb), "--data-dir", str(tmp_path / "b"), *sha_args(idx))
    assert result.exit_code == 0, result.output
    a = np.load(tmp_path / "a" / "fashion-mnist" / "fashion-mnist.npz")
    b = np.load(tmp_path / "b" / "fashion-mnist" / "fashion-mnist.npz")
    assert all(np.array_equal(a[k], b[k]) for k in ("train_x", "train_y", "test_x", "test_y"))
    assert "of a .deb" in json.loads((tmp_path / "b" / "fashion-mnist" / "SOURCE.json").read_text())["source"]


def test_a_wrong_checksum_is_one_line_and_writes_nothing(tmp_path):
    idx = make_idx()
    src = write_folder(tmp_path / "src", idx)
    result, text = _prepare("--from", str(src), "--data-dir", str(tmp_path / "data"))
    assert _refused(result), result.output
    digest = hashlib.sha256(idx["train-images-idx3-ubyte"]).hexdigest()
    assert f"train-images-idx3-ubyte.gz decompresses to SHA-256 {digest}, not the expected " \
           f"{build_module.IDX_SHA256['train-images-idx3-ubyte']}" in text
    assert not (tmp_path / "data" / "fashion-mnist").exists()
    for bad, says in (("train-images-idx3-ubyte=abc", "is not 64 hexadecimal digits"),
                      ("nonsense=" + "0" * 64, "expected NAME=HEX with NAME one of")):
        result, text = _prepare("--from", str(src), "--sha256", bad)
        assert _refused(result) and says in text


def _bad(tmp_path, name: str, data: bytes) -> str:
    idx = make_idx()
    idx[name] = data
    result, text = _prepare("--from", str(write_folder(tmp_path / "src", idx)), "--data-dir", str(tmp_path / "data"),
                            *sha_args(idx))
    assert _refused(result), result.output
    assert not (tmp_path / "data" / "fashion-mnist").exists()
    return text


def test_bad_magic_is_refused(tmp_path):
    x = np.zeros((N_TRAIN, 28, 28), np.uint8)
    text = _bad(tmp_path, "train-images-idx3-ubyte", idx_images(x, magic=2049))
    assert "train-images-idx3-ubyte.gz: magic number 2049, not 2051" in text


def test_truncated_data_is_refused(tmp_path):
    data = make_idx()["t10k-images-idx3-ubyte"]
    text = _bad(tmp_path, "t10k-images-idx3-ubyte", data[:-28])
    assert f"but its header declares {N_TEST} images: {16 + N_TEST * 784:,} bytes" in text


def test_label_10_is_refused(tmp_path):
    y = np.arange(N_TRAIN) % 10
    y[7] = 10
    text = _bad(tmp_path, "train-labels-idx1-ubyte", idx_labels(y))
    assert "train-labels-idx1-ubyte.gz: label 10 at item 7; Fashion-MNIST's are 0-9" in text


def test_labels_and_images_of_different_counts_are_refused(tmp_path):
    text = _bad(tmp_path, "t10k-labels-idx1-ubyte", idx_labels(np.arange(N_TEST - 1) % 10))
    assert f"holds {N_TEST} images but t10k-labels-idx1-ubyte.gz {N_TEST - 1} labels" in text


def test_a_truncated_gzip_and_a_bomb_are_refused(tmp_path, monkeypatch):
    idx = make_idx()
    src = write_folder(tmp_path / "src", idx)
    gz = src / "t10k-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-12])
    result, text = _prepare("--from", str(src), *sha_args(idx))
    assert _refused(result) and "t10k-labels-idx1-ubyte.gz: not a readable gzip file" in text
    monkeypatch.setattr(build_module, "MAX_IDX", 1024)
    write_folder(src, idx)
    result, text = _prepare("--from", str(src), *sha_args(idx))
    assert _refused(result) and "decompresses to more than 1,024 bytes" in text


def test_a_traversal_member_in_the_debs_tar_is_refused(tmp_path):
    idx = make_idx()
    deb = write_deb(tmp_path / "x.deb", idx, extra={"./usr/share/../../../etc/evil": b"x"})
    result, text = _prepare("--from", str(deb), "--data-dir", str(tmp_path / "data"), *sha_args(idx))
    assert _refused(result), result.output
    assert "data.tar.xz member './usr/share/../../../etc/evil' leads outside the archive" in text
    assert not (tmp_path / "data").exists() and not (tmp_path.parent / "etc" / "evil").exists()


def test_a_deb_without_the_files_or_not_a_deb_is_one_line(tmp_path):
    idx = make_idx()
    deb = tmp_path / "short.deb"
    deb.write_bytes(_ar({"debian-binary": b"2.0\n", "data.tar.xz": _tar_xz({"./usr/x": b"1"})}))
    result, text = _prepare("--from", str(deb), *sha_args(idx))
    assert _refused(result) and "data.tar.xz has no usr/share/datasets/fashion-mnist/" in text
    other = tmp_path / "other.deb"
    other.write_bytes(b"PK\x03\x04 not an ar archive")
    result, text = _prepare("--from", str(other))
    assert _refused(result) and "not a .deb (no ar archive header)" in text
    cut = tmp_path / "cut.deb"
    cut.write_bytes(write_deb(tmp_path / "whole.deb", idx).read_bytes()[:5000])
    result, text = _prepare("--from", str(cut))
    assert _refused(result) and "past the end of the file" in text


def test_the_task_without_its_cache_says_how_to_build_it(tmp_path):
    with pytest.raises(DatasetError, match="hfl-bench prepare fashion-mnist --from PATH"):
        get_task("fashion-mnist").load(tmp_path)
    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):
        get_task("fashion-mnist").fingerprint(tmp_path)


@pytest.mark.parametrize("method", ["local", "crad"])
def test_a_method_runs_on_the_prepared_task(method, tmp_path):
    idx = make_idx()
    data_dir = tmp_path / "data"
    assert _prepare("--from", str(write_folder(tmp_path / "src", idx)), "--data-dir", str(data_dir),
                    *sha_args(idx))[0].exit_code == 0
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["run", "--method", method, "--task", "fashion-mnist", "--rounds", "1",
                                      "--clients", "4", "--data-dir", str(data_dir), "--out", str(out),
                                      "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    (record_path,) = out.glob(f"fashion-mnist__{method}__*.json")
    record = json.loads(record_path.read_text())
    assert record["task"]["name"] == "fashion-mnist" and record["config"]["partition"] == "dirichlet"
    assert record["arch_pool"]["assignment"] == ["mlp_small", "cnn_small", "resnet_tiny", "mlp_small"]


def test_a_prepare_while_another_holds_the_folder_is_refused_and_writes_nothing(tmp_path):
    from hfl_bench import locks

    idx = make_idx()
    data_dir = tmp_path / "data"
    target = data_dir / "fashion-mnist"
    with locks.hold(target, "the folder", lambda holder: "busy"):  # another build's lock (flock: per open file)
        result, text = _prepare("--from", str(write_folder(tmp_path / "src", idx)), "--data-dir", str(data_dir),
                                *sha_args(idx))
    assert _refused(result), result.output
    assert f"{target} is being built by another hfl-bench prepare (pid " in text
    assert not target.exists()
