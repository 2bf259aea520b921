"""Task ``uci-har`` and ``hfl-bench prepare uci-har``: a small "UCI HAR Dataset" written here in the
published format (``Inertial Signals/*_{train,test}.txt`` of 128 numbers a line, right-aligned in
16 columns with three-digit exponents such as ``1.8085150e-004``; ``y_*.txt``, ``subject_*.txt``,
``activity_labels.txt``), a few subjects and windows instead of 30 subjects, as a folder and as a
zip; prepared through the CLI, its windows and client split checked against what was written; runs
of local and fedproto on it; malformed, oversize and hostile input refused in one line."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hfl_bench import uci_har
from hfl_bench.cli import app
from hfl_bench.data import DatasetError, get_task
from hfl_bench.uci_har import ROOT, SIGNALS, WINDOW

TRAIN_SUBJECTS = (5, 1, 3)  # written interleaved and out of order: the clients come out 1, 3, 5
TEST_SUBJECTS = (2, 9)
PER_CLASS = {"train": 10, "test": 3}


def number(v: float) -> str:
    """``v`` as the published files write it: 7 decimals, a signed three-digit exponent, 16 columns."""
    mantissa, exponent = f"{v:.7e}".split("e")
    return f"{mantissa}e{int(exponent):+04d}".rjust(16)


def write_dataset(parent: Path, seed: int = 0) -> Path:
    """``parent/UCI HAR Dataset`` in the published layout; each activity offsets every channel."""
    rng = np.random.default_rng(seed)
    root = parent / ROOT
    (root / "activity_labels.txt").parent.mkdir(parents=True)
    (root / "activity_labels.txt").write_text("".join(f"{i} {a}\n" for i, a in enumerate(uci_har.PUBLISHED_LABELS, 1)))
    for split, subjects in (("train", TRAIN_SUBJECTS), ("test", TEST_SUBJECTS)):
        rows = [(s, y) for k in range(PER_CLASS[split]) for y in range(1, 7) for s in subjects]
        order = rng.permutation(len(rows))
        rows = [rows[i] for i in order]
        signals = {name: [] for name in SIGNALS}
        for s, y in rows:
            for c, name in enumerate(SIGNALS):
                values = rng.normal(size=WINDOW) * 0.1 + (y - 3.5) * 0.2 * (1 + c % 3) + s * 1e-3
                signals[name].append("".join(number(v) for v in values))
        folder = root / split / "Inertial Signals"
        folder.mkdir(parents=True)
        for name in SIGNALS:
            (folder / f"{name}_{split}.txt").write_text("\n".join(signals[name]) + "\n")
        (root / split / f"y_{split}.txt").write_text("".join(f"{y}\n" for _, y in rows))
        (root / split / f"subject_{split}.txt").write_text("".join(f"{s}\n" for s, _ in rows))
        (root / split / f"X_{split}.txt").write_text("not read\n")  # the 561 features: never read
    return root


def zip_dataset(root: Path, path: Path, extra: dict[str, bytes] | None = None) -> Path:
    """The folder as the published zip holds it (members under ``UCI HAR Dataset/``), plus ``extra``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                z.write(f, f"{ROOT}/{f.relative_to(root).as_posix()}")
        z.writestr(f"__MACOSX/{ROOT}/._activity_labels.txt", b"\0\5\26\7")
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return path


def expected_windows(root: Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What was written, read back independently: windows [n, 9, 128] float32, labels 1-6, subjects."""
    x = np.stack([np.loadtxt(root / split / "Inertial Signals" / f"{s}_{split}.txt", dtype=np.float64)
                  for s in SIGNALS], axis=1).astype(np.float32)
    return x, np.loadtxt(root / split / f"y_{split}.txt", dtype=np.int64), \
        np.loadtxt(root / split / f"subject_{split}.txt", dtype=np.int64)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _prepare(*args: str):
    result = CliRunner().invoke(app, ["prepare", "uci-har", *args])
    return result, " ".join(result.output.split())


@pytest.fixture
def dataset(tmp_path) -> Path:
    return write_dataset(tmp_path / "src")


def test_the_written_files_have_the_published_layout(dataset):
    line = (dataset / "train" / "Inertial Signals" / "body_acc_x_train.txt").read_text().splitlines()[0]
    assert len(line) == 16 * WINDOW and line.startswith(("  ", " -"))
    assert line[11:13] in ("e-", "e+") and line[13:16].isdigit()  # "  1.8085150e-004"
    assert len(line.split()) == WINDOW


def test_prepare_from_the_zip_and_from_the_folder_gives_the_windows_written(dataset, tmp_path):
    archive = zip_dataset(dataset, tmp_path / "UCI HAR Dataset.zip")
    result, text = _prepare("--from", str(archive), "--data-dir", str(tmp_path / "a"))
    assert result.exit_code == 0, result.output
    assert (f"wrote {tmp_path / 'a' / 'uci-har' / 'uci-har.npz'} (3 training subjects as clients, 180 training and 36 "
            f"test windows of 2 other subjects; the zip's SHA-256 {_sha(archive)}, not checked") in text
    result, text = _prepare("--from", str(dataset.parent), "--data-dir", str(tmp_path / "b"))  # the folder holding it
    assert result.exit_code == 0, result.output
    a, b = (json.loads((tmp_path / d / "uci-har" / "SOURCE.json").read_text()) for d in "ab")
    assert f"the folder's content SHA-256 {b['content_sha256']}, not checked" in text
    assert a["zip_sha256"] == _sha(archive) and b["zip_sha256"] is None and not a["sha256_checked"]
    assert a["content_sha256"] == b["content_sha256"] and a["files_sha256"] == b["files_sha256"]
    assert a["files_sha256"]["train/y_train.txt"] == _sha(dataset / "train" / "y_train.txt")
    assert len(a["files_sha256"]) == 1 + 2 * 11 and not any(n.startswith(("X_", "train/X")) for n in a["files_sha256"])
    assert a["users"] == [1, 3, 5] and a["test_subjects"] == [2, 9] and a["windows"]["per_client"] == [60, 60, 60]

    for d in "ab":
        with np.load(tmp_path / d / "uci-har" / "uci-har.npz", allow_pickle=False) as z:
            cache = {k: z[k] for k in z.files}
        x, y, subject = expected_windows(dataset, "train")
        order = np.argsort(subject, kind="stable")  # by subject, the published order within one
        np.testing.assert_array_equal(cache["train_x"], x[order][:, :, None, :])
        np.testing.assert_array_equal(cache["train_y"], y[order] - 1)
        np.testing.assert_array_equal(cache["train_subject"], subject[order])
        np.testing.assert_array_equal(cache["train_client"], np.searchsorted([1, 3, 5], subject[order]))
        x, y, subject = expected_windows(dataset, "test")
        np.testing.assert_array_equal(cache["test_x"], x[:, :, None, :])
        np.testing.assert_array_equal(cache["test_y"], y - 1)
        np.testing.assert_array_equal(cache["test_subject"], subject)

    task = get_task("uci-har")
    assert task.folder_defaults(tmp_path / "a") == {"clients": 3}
    data = task.load(tmp_path / "a")
    assert tuple(data.train_x.shape) == (180, 9, 1, 128) and tuple(data.test_x.shape) == (36, 9, 1, 128)
    assert data.class_names == list(uci_har.ACTIVITIES) and data.fingerprint == task.fingerprint(tmp_path / "a")
    # the client split round-trips: client i holds exactly the i-th training subject's windows
    assert [len(c) for c in data.client_indices] == [60, 60, 60]
    assert [sorted(set(cache["train_subject"][c].tolist())) for c in data.client_indices] == [[1], [3], [5]]
    assert torch.allclose(data.train_x.mean(dim=(0, 2, 3)), torch.zeros(9), atol=1e-4)  # training statistics only


def test_sha256_checks_the_zip_or_the_folders_content(dataset, tmp_path):
    archive = zip_dataset(dataset, tmp_path / "UCI HAR Dataset.zip")
    result, text = _prepare("--from", str(archive), "--data-dir", str(tmp_path / "a"),
                            "--sha256", _sha(archive).upper())
    assert result.exit_code == 0 and "checked against --sha256" in text, result.output
    content = json.loads((tmp_path / "a" / "uci-har" / "SOURCE.json").read_text())["content_sha256"]
    result, text = _prepare("--from", str(dataset), "--data-dir", str(tmp_path / "b"), "--sha256", content)
    assert result.exit_code == 0 and "checked against --sha256" in text, result.output
    assert json.loads((tmp_path / "b" / "uci-har" / "SOURCE.json").read_text())["sha256_checked"] is True


def _refused(result, text, message, data_dir: Path):
    assert result.exit_code == 2, result.output
    assert message in text, text
    assert len(result.output.strip().splitlines()) == 1
    assert not (data_dir / "uci-har").exists()


def test_a_wrong_checksum_is_one_line(dataset, tmp_path):
    archive = zip_dataset(dataset, tmp_path / "UCI HAR Dataset.zip")
    data = tmp_path / "data"
    _refused(*_prepare("--from", str(archive), "--data-dir", str(data), "--sha256", "0" * 64),
             f"the zip's SHA-256 is {_sha(archive)}, not the {'0' * 64} given by --sha256", data)
    _refused(*_prepare("--from", str(dataset), "--data-dir", str(data), "--sha256", "0" * 64),
             "the folder's content SHA-256 is", data)
    _refused(*_prepare("--from", str(archive), "--data-dir", str(data), "--sha256", "xyz"),
             "--sha256 'xyz' is not 64 hexadecimal digits", data)


def _edit(root: Path, name: str, edit) -> None:
    path = root / name
    path.write_text(edit(path.read_text()))


SIGNAL = "train/Inertial Signals/body_gyro_y_train.txt"


@pytest.mark.parametrize("name, edit, message", [
    (SIGNAL, lambda t: " ".join(t.split("\n")[0].split()[:127]) + "\n" + t.split("\n", 1)[1],
     f"{SIGNAL}: line 1 has 127 numbers, not 128"),
    ("train/y_train.txt", lambda t: "7\n" + t.split("\n", 1)[1], "y_train.txt: line 1 is '7', not one activity 1-6"),
    ("test/subject_test.txt", lambda t: t.rsplit("\n", 2)[0] + "\n31\n", "not one subject 1-30"),
    ("train/y_train.txt", lambda t: "\n".join(t.split("\n")[:-6]) + "\n",
     "train/Inertial Signals/body_acc_x_train.txt has 180 rows but train/y_train.txt has 175"),
    (SIGNAL, lambda t: t[:len(t) // 2 + 100], f"{SIGNAL}: line 91 has 7 numbers"),  # cut mid-line: a truncated file
    (SIGNAL, lambda t: t.replace("e+000", "e+039", 1), "is not a finite float32"),  # finite as a float64
    (SIGNAL, lambda t: "nan" + t[3:], "line 1 holds 'n', which is not part of a number"),
    (SIGNAL, lambda t: t.replace("e", "e-", 1), "line 1: "),
    ("activity_labels.txt", lambda t: t.replace("LAYING", "LYING"), "not the published activities"),
    ("test/subject_test.txt", lambda t: t.replace("9\n", "5\n"), "subjects [5] are in both train/ and test/"),
])
def test_a_malformed_file_is_one_line(dataset, tmp_path, name, edit, message):
    _edit(dataset, name, edit)
    data = tmp_path / "data"
    _refused(*_prepare("--from", str(dataset), "--data-dir", str(data)), message, data)
    archive = zip_dataset(dataset, tmp_path / "UCI HAR Dataset.zip")  # the zip says the same of its member
    _refused(*_prepare("--from", str(archive), "--data-dir", str(data)), message, data)


def test_hostile_and_oversize_zips_are_refused_before_inflating(dataset, tmp_path):
    data = tmp_path / "data"
    archive = zip_dataset(dataset, tmp_path / "escape.zip", {"../x": b"outside"})
    _refused(*_prepare("--from", str(archive), "--data-dir", str(data)),
             "member '../x' is not a relative path inside the archive; refused", data)
    archive = zip_dataset(dataset, tmp_path / "abs.zip", {"/etc/x": b"outside"})
    _refused(*_prepare("--from", str(archive), "--data-dir", str(data)), "member '/etc/x' is not a relative path", data)

    big = write_dataset(tmp_path / "big")
    member = big / "train" / "Inertial Signals" / "total_acc_z_train.txt"
    member.write_bytes(member.read_bytes() + b" " * (uci_har.MAX_MEMBER + 1))
    archive = zip_dataset(big, tmp_path / "big.zip")
    _refused(*_prepare("--from", str(archive), "--data-dir", str(data)),
             f"member {ROOT}/train/Inertial Signals/total_acc_z_train.txt declares", data)
    assert "more than the 33,554,432 such a file may hold; refused before inflating it" in _prepare(
        "--from", str(archive), "--data-dir", str(data))[1]
    _refused(*_prepare("--from", str(big), "--data-dir", str(data)), "total_acc_z_train.txt is", data)  # the folder

    bomb = write_dataset(tmp_path / "bomb")
    (bomb / "train" / "Inertial Signals" / "body_acc_y_train.txt").write_bytes(b" " * (4 * 2**20))
    archive = zip_dataset(bomb, tmp_path / "bomb.zip")
    _refused(*_prepare("--from", str(archive), "--data-dir", str(data)), f"a ratio over {uci_har.MAX_RATIO}", data)

    whole = zip_dataset(dataset, tmp_path / "whole.zip").read_bytes()
    cut = tmp_path / "cut.zip"
    cut.write_bytes(whole[: len(whole) // 2])
    _refused(*_prepare("--from", str(cut), "--data-dir", str(data)), "not a readable zip file", data)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("readme.txt", "hello")
    _refused(*_prepare("--from", str(other), "--data-dir", str(data)), f"no '{ROOT}/train/", data)
    _refused(*_prepare("--from", str(tmp_path / "absent.zip"), "--data-dir", str(data)), "no such file or folder", data)


def test_the_task_without_its_cache_says_how_to_build_it(tmp_path):
    with pytest.raises(DatasetError, match='hfl-bench prepare uci-har --from "UCI HAR Dataset.zip"'):
        get_task("uci-har").load(tmp_path)
    with pytest.raises(DatasetError, match="hfl-bench prepare uci-har"):
        get_task("uci-har").fingerprint(tmp_path)


def test_every_sensor_member_builds_for_nine_channels():
    from hfl_bench.pools import build_model, get_pool

    info = get_task("uci-har").info
    assert info.input_shape == (9, 1, 128)
    for member in get_pool("sensor").members:
        model = build_model(member, info)
        assert tuple(model(torch.randn(2, *info.input_shape)).shape) == (2, 6)


@pytest.mark.parametrize("method", ["local", "fedproto"])
def test_a_run_on_the_prepared_cache(method, dataset, tmp_path):
    data_dir = tmp_path / "data"
    assert _prepare("--from", str(dataset), "--data-dir", str(data_dir))[0].exit_code == 0
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["run", "--method", method, "--task", "uci-har", "--rounds", "1",
                                      "--data-dir", str(data_dir), "--out", str(out), "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    (record_path,) = out.glob(f"uci-har__{method}__*.json")
    record = json.loads(record_path.read_text())
    assert record["task"]["name"] == "uci-har" and record["config"]["partition"] == "given"
    assert record["federation"]["n_clients"] == 3
    assert record["arch_pool"]["assignment"] == ["cnn1d", "gru", "tcn"]


def test_a_second_prepare_while_one_builds_is_refused(dataset, tmp_path):
    from hfl_bench import locks

    data = tmp_path / "data"
    with locks.hold(data / "uci-har", "the folder", lambda holder: f"busy: {holder}"):  # as a running build holds it
        result, text = _prepare("--from", str(dataset), "--data-dir", str(data))
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
        assert f"{data / 'uci-har'} is being built by another hfl-bench prepare (pid" in text
        assert not (data / "uci-har" / "uci-har.npz").exists()
    assert _prepare("--from", str(dataset), "--data-dir", str(data))[0].exit_code == 0  # released: it builds
