"""``hfl-bench prepare cifar10-jpg``: the cifar10-jpg folder built from CIFAR-10's python release,
written here in the release's real format (pickled dicts with ``data``, an N x 3072 uint8 array,
and ``labels``; ``batches.meta`` with ``label_names``), a few images per batch instead of 10,000."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from hfl_bench.cli import app

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
BATCHES = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]


def _release(root: Path, per_batch: int = 20) -> tuple[Path, dict[str, np.ndarray]]:
    """``root/cifar-10-batches-py`` as the release lays it out (protocol 2, as it was pickled);
    smooth images, so JPEG keeps them close."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for b, name in enumerate(BATCHES):
        base = rng.integers(40, 215, size=(per_batch, 3, 1, 1))
        data = np.broadcast_to(base, (per_batch, 3, 32, 32)).reshape(per_batch, 3072).astype(np.uint8)
        labels = [(i + b) % 10 for i in range(per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [f"{i}.png".encode() for i in range(per_batch)]}, f, protocol=2)
        arrays[name] = data
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"num_cases_per_batch": per_batch, b"label_names": [c.encode() for c in CLASSES],
                     b"num_vis": 3072}, f, protocol=2)
    return folder, arrays


def _prepare(*args: str):
    result = CliRunner().invoke(app, ["prepare", "cifar10-jpg", *args])
    return result, " ".join(result.output.split())


def test_builds_the_folder_the_task_reads_with_its_fingerprint(tmp_path):
    folder, arrays = _release(tmp_path / "src")
    result, text = _prepare("--from", str(folder), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 0, result.output
    built = tmp_path / "data" / "cifar10-jpg"
    assert f"wrote {built} (120 images" in text
    assert sorted(p.name for p in (built / "train").iterdir()) == CLASSES
    assert len(list((built / "train").rglob("*.jpg"))) == 100 and len(list((built / "test").rglob("*.jpg"))) == 20
    # the release's first training image (label 0) is airplane/0000.jpg, its pixels within JPEG's error
    first = np.asarray(Image.open(built / "train" / "airplane" / "0000.jpg").convert("RGB"), dtype=int)
    expected = arrays["data_batch_1"][0].reshape(3, 32, 32).transpose(1, 2, 0).astype(int)
    assert first.shape == (32, 32, 3) and np.abs(first - expected).max() <= 4
    source = json.loads((built / "SOURCE.json").read_text())
    for name in [*BATCHES, "batches.meta"]:
        assert source["source_sha256"][name] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
    assert source["images"]["train"]["airplane"] == 10 and source["jpeg"]["quality"] == 95
    assert not list((tmp_path / "data").glob(".*partial"))
    # torchvision's root (the folder above) works too; an existing folder is never overwritten
    result, text = _prepare("--from", str(tmp_path / "src"), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 2 and text == f"error: {built} exists; remove it, or give another --data-dir"


def test_reads_the_release_tar_gz_in_memory(tmp_path):
    folder, _ = _release(tmp_path / "src", per_batch=3)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    result, _ = _prepare("--from", str(archive), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "data" / "cifar10-jpg").rglob("*.jpg"))) == 18


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > PWNED",))


@pytest.mark.parametrize("case", ["missing-batch", "code-in-a-pickle", "not-a-pickle", "no-such-path"])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    folder, _ = _release(tmp_path / "src", per_batch=2)
    if case == "missing-batch":
        (folder / "data_batch_3").unlink()
    elif case == "code-in-a-pickle":
        (folder / "test_batch").write_bytes(pickle.dumps({b"data": _Boom(), b"labels": []}, protocol=2))
    elif case == "not-a-pickle":
        (folder / "data_batch_2").write_bytes(b"not a pickle at all")
    source = tmp_path / "nowhere" if case == "no-such-path" else folder
    result, text = _prepare("--from", str(source), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 2 and result.output.count("\n") == 1 and text.startswith("error: "), result.output
    expected = {"missing-batch": "lacks data_batch_3", "code-in-a-pickle": "refused: the pickle asks for",
                "not-a-pickle": "data_batch_2: not a CIFAR-10 python batch", "no-such-path": "no such file or folder"}
    assert expected[case] in text
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "data" / "cifar10-jpg").exists() and not list((tmp_path / "data").glob(".*partial"))


def test_the_task_names_the_command_when_the_folder_is_missing(tmp_path):
    from hfl_bench.data import get_task
    from hfl_bench.errors import DatasetError

    with pytest.raises(DatasetError, match="hfl-bench prepare cifar10-jpg --from PATH"):
        get_task("cifar10-jpg").load(str(tmp_path))


def test_the_protocol_2_pickles_here_are_the_release_format():
    """The release's batches are python-2 pickles of dicts with bytes keys; these are too."""
    buf = io.BytesIO()
    pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]}, buf, protocol=2)
    assert pickle.loads(buf.getvalue(), encoding="bytes")[b"data"].shape == (1, 3072)
