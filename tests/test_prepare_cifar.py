"""``hfl-bench prepare cifar10-jpg``: the cifar10-jpg folder built from CIFAR-10's python release,
written here in the release's real format (pickled dicts with ``data``, an N x 3072 uint8 array,
and ``labels``; ``batches.meta`` with ``label_names``), a few images per batch instead of 10,000;
the release checked whole before anything is written, and one build of a folder at a time."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import time
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


# ----------------------------------------------------------------------------- checked before writing (row 10)


def _rewrite_meta(folder: Path, label_names) -> None:
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"num_cases_per_batch": 2, b"label_names": label_names, b"num_vis": 3072}, f, protocol=2)


@pytest.mark.parametrize("names, says", [
    ([b"cat"] * 10, "names cat more than once"),
    ([c.encode() for c in CLASSES[:9]] + [b"Cat"], "names Cat, cat more than once"),  # one folder where case is ignored
    ([c.encode() for c in CLASSES[:9]] + [b"../up"], "class name '../up' cannot name a folder"),
    ([c.encode() for c in CLASSES[:9]] + [""], "class name '' cannot name a folder"),
    ([c.encode() for c in CLASSES[:9]] + [b"\xff"], "is not UTF-8 text"),
    ([c.encode() for c in CLASSES[:9]], "is not a list of the ten class names"),
    (10, "is not a list of the ten class names"),
])
def test_class_names_are_checked_before_anything_is_written(tmp_path, names, says):
    folder, _ = _release(tmp_path / "src", per_batch=2)
    _rewrite_meta(folder, names)
    result, text = _prepare("--from", str(folder), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert text.startswith(f"error: {folder / 'batches.meta'}: ") and says in text, text  # the input, not the target
    assert not (tmp_path / "data").exists()  # nothing written, not even the lock


def test_a_bad_batch_names_its_file(tmp_path):
    folder, _ = _release(tmp_path / "src", per_batch=2)
    with open(folder / "data_batch_4", "wb") as f:
        pickle.dump({b"labels": [0, 10], b"data": np.zeros((2, 3072), np.uint8)}, f, protocol=2)
    result, text = _prepare("--from", str(folder), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 2 and text == f"error: {folder / 'data_batch_4'}: a label outside 0-9"
    assert not (tmp_path / "data").exists()


# ----------------------------------------------------------------------------- one build at a time (row 11)

# The first build holds before its first JPEG until the test lets it go (the file named by
# HFL_TEST_GO appears), so the second always starts while it writes, however loaded the machine:
# the build itself is the real command's (a release of a few images is otherwise written in a blink).
SLOW_BUILD = """
import os, sys, time
from pathlib import Path
from PIL import Image
save = Image.Image.save
go = Path(os.environ["HFL_TEST_GO"])
def held(self, *args, **kwargs):
    deadline = time.monotonic() + 200
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return save(self, *args, **kwargs)
Image.Image.save = held
from hfl_bench.cli import main
sys.argv = ["hfl-bench", *sys.argv[1:]]
main()
"""


@pytest.mark.slow  # two processes
@pytest.mark.timeout(300)
def test_a_second_prepare_into_the_same_folder_is_refused_while_the_first_builds(tmp_path):
    folder, _ = _release(tmp_path / "src", per_batch=20)
    data = tmp_path / "data"
    args = ["prepare", "cifar10-jpg", "--from", str(folder), "--data-dir", str(data)]
    go = tmp_path / "go"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HFL_TEST_GO": str(go)}
    first = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (data / ".cifar10-jpg.partial").exists():  # the first is writing
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], capture_output=True, text=True,
                                env=env, timeout=120)
        go.touch()  # the first goes on
        out, err = first.communicate(timeout=240)
    finally:
        first.kill()
    text = " ".join((second.stdout + second.stderr).split())
    assert second.returncode == 2 and (second.stdout + second.stderr).count("\n") == 1, text
    assert f"{data / 'cifar10-jpg'} is being built by another hfl-bench prepare (pid {first.pid}" in text
    assert first.returncode == 0, out + err
    built = data / "cifar10-jpg"
    assert len(list((built / "train").rglob("*.jpg"))) == 100 and len(list((built / "test").rglob("*.jpg"))) == 20
    assert json.loads((built / "SOURCE.json").read_text())["images"]["test"]["cat"] == 2
    assert sorted(p.name for p in data.iterdir()) == ["cifar10-jpg"]  # no partial folder, no lock left
