"""The pfl-npz task: a PFLlib / HtFLlib client folder, loaded safely, its partition kept as it is."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hfl_bench import engine
from hfl_bench.cli import app
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.data import DatasetError, channel_stats, get_task, normalize
from hfl_bench.partition import PartitionError, given_partition, make_partition
from hfl_bench.tasks import pfl_npz
from hfl_bench.tasks.pfl_npz import read_client_file

# PFLlib's MNIST folder (20 clients) where README's HtFLlib comparison reads it, beside the
# checkout (../shared/data/mnist-htfl), or wherever $HFL_BENCH_MNIST_HTFL points; skipped without it.
REAL = Path(os.environ.get("HFL_BENCH_MNIST_HTFL")
            or Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist-htfl")
TRAIN_SIZES, TEST_SIZES = (30, 22, 40), (10, 8, 13)
CLASSES = ((0, 1, 2), (3, 4), (5, 6, 7, 8, 9))  # label skew, as a Dirichlet 0.1 split would give


def save_like_pfllib(path: Path, x: np.ndarray, y: np.ndarray, compressed: bool = True) -> None:
    """As PFLlib's generator writes a client file: a dict saved under the key ``data``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        (np.savez_compressed if compressed else np.savez)(f, data={"x": x, "y": y})


def make_folder(root: Path, seed: int = 0, shape: tuple[int, ...] = (1, 28, 28)) -> dict[str, list]:
    """A small folder in the real layout; returns the arrays it wrote, per split, in cid order."""
    rng = np.random.default_rng(seed)
    written: dict[str, list] = {"train": [], "test": []}
    counts = []
    for cid, classes in enumerate(CLASSES):
        ys = []
        for split, n in (("train", TRAIN_SIZES[cid]), ("test", TEST_SIZES[cid])):
            x = rng.uniform(-1, 1, size=(n, *shape)).astype(np.float32)
            y = rng.choice(classes, size=n).astype(np.int64)
            save_like_pfllib(root / split / f"{cid}.npz", x, y, compressed=cid != 1)  # client 1 uncompressed
            written[split].append((x, y))
            ys.append(y)
        labels, n_per = np.unique(np.concatenate(ys), return_counts=True)
        counts.append([[int(c), int(k)] for c, k in zip(labels, n_per)])
    config = {"num_clients": len(CLASSES), "num_classes": 10, "non_iid": True, "balance": False,
              "partition": "dir", "Size of samples for labels in clients": counts, "alpha": 0.1, "batch_size": 10}
    (root / "config.json").write_text(json.dumps(config))
    return written


@pytest.fixture
def folder(tmp_path) -> tuple[Path, dict[str, list]]:
    root = tmp_path / "mnist-pfl"
    return root, make_folder(root)


def build(folder: Path, **overrides):
    task, cfg = engine.load_task(RunConfig(task="pfl-npz", data_dir=str(folder), **overrides))
    data = task.load(cfg.data_dir)
    return cfg, data, engine.build_federation(cfg, task.info, data, torch.device("cpu"))


# --------------------------------------------------------------------------- loading


def test_loads_shapes_and_labels(folder):
    root, written = folder
    data = get_task("pfl-npz").load(root)
    assert data.train_x.shape == (sum(TRAIN_SIZES), 1, 28, 28) and data.train_x.dtype == torch.float32
    assert data.test_x.shape == (sum(TEST_SIZES), 1, 28, 28)
    assert data.train_y.tolist() == np.concatenate([y for _, y in written["train"]]).tolist()
    assert data.test_y.tolist() == np.concatenate([y for _, y in written["test"]]).tolist()
    raw = torch.as_tensor(np.concatenate([x for x, _ in written["train"]]))
    mean, std = channel_stats(raw)
    torch.testing.assert_close(data.train_x, normalize(raw, mean, std))
    torch.testing.assert_close(data.test_x, normalize(torch.as_tensor(np.concatenate([x for x, _ in written["test"]])),
                                                      mean, std))
    assert [idx.tolist() for idx in data.client_indices] == [[*range(0, 30)], [*range(30, 52)], [*range(52, 92)]]


def test_data_dir_may_be_the_parent_of_a_pfl_npz_folder(tmp_path):
    make_folder(tmp_path / "pfl-npz")
    assert len(get_task("pfl-npz").load(tmp_path).client_indices) == 3


def test_reads_the_real_pickle_layout(folder):
    """A file written by numpy's own savez is read back with the restricted unpickler."""
    root, written = folder
    x, y = read_client_file(root / "train" / "2.npz")
    np.testing.assert_array_equal(x, written["train"][2][0])
    np.testing.assert_array_equal(y, written["train"][2][1])


# --------------------------------------------------------------------------- partition


def test_partition_is_the_files_membership(folder):
    root, written = folder
    cfg, data, fed = build(root)
    assert cfg.partition == "given" and cfg.clients == 3  # the number of clients comes from config.json
    assert fed.partition.scheme == "given" and fed.partition.params == {}
    start = 0
    for cid, client in enumerate(fed.clients):
        n = TRAIN_SIZES[cid]
        parts = [client.train_idx, client.val_idx, client.test_idx]
        members = torch.cat(parts).sort().values
        assert members.tolist() == list(range(start, start + n)), f"client {cid}"
        assert sum(len(p) for p in parts) == n  # no sample in two parts
        assert set(data.train_y[members].tolist()) <= set(CLASSES[cid])
        assert len(client.val_idx) > 0 and len(client.test_idx) > 0
        assert 0.1 * n <= len(client.val_idx) + len(client.test_idx) <= 0.3 * n  # ~20% held out
        start += n
    assert len(fed.data.test_y) == sum(TEST_SIZES)  # the global test set: every client's test file


def test_partition_hash_is_stable(folder):
    root, _ = folder
    _, data, a = build(root)
    _, _, b = build(root)
    _, _, other_seed = build(root, seed=1)
    assert a.partition.hash == b.partition.hash
    # The seed redraws the per-client train/val/test split, never the membership.
    assert other_seed.partition.hash != a.partition.hash
    for ca, cb in zip(a.partition.clients, other_seed.partition.clients):
        assert np.array_equal(np.sort(np.concatenate([ca.train, ca.val, ca.test])),
                              np.sort(np.concatenate([cb.train, cb.val, cb.test])))
    labels = data.train_y.numpy()
    again = given_partition(data.client_indices, labels, seed=0, heldout_fraction=0.2)
    assert again.hash == a.partition.hash
    # Same shard sizes over other labels is other data: the hash says so.
    assert given_partition(data.client_indices, (labels + 1) % 10, seed=0).hash != a.partition.hash


def test_given_partition_rejects_bad_indices():
    labels = np.zeros(10, dtype=np.int64)
    with pytest.raises(PartitionError, match="overlap"):
        given_partition([np.arange(0, 6), np.arange(5, 10)], labels)
    with pytest.raises(PartitionError, match="outside"):
        given_partition([np.arange(0, 11)], labels)
    with pytest.raises(PartitionError, match="no training samples"):
        given_partition([np.arange(0, 10), np.zeros(0, dtype=np.int64)], labels)


def test_other_partitions_draw_and_more_clients_than_files_are_refused(folder):
    root, _ = folder
    # another partitioner draws over the files' pooled samples; --clients past the files: one line
    _, _, fed = build(root, partition="iid", clients=2, heldout_fraction=0.5)
    assert fed.partition.scheme == "iid" and fed.partition.n_clients == 2
    with pytest.raises(ConfigError, match=r"--clients 5, but its data holds 3 natural clients"):
        build(root, clients=5)


def test_given_partition_needs_a_task_that_ships_one():
    """Another task's labels go through make_partition, where 'given' can only explain itself."""
    with pytest.raises(PartitionError, match="cannot be drawn from labels"):
        make_partition(np.arange(40) % 4, 2, "given")


# --------------------------------------------------------------------------- malicious and broken files


class _Eval:
    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return eval, (self.code,)


class _System:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _raw_npz(path: Path, payload: object) -> None:
    """An npz whose data.npy is an object-array header followed by an arbitrary pickle."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": ()})
    buf.write(pickle.dumps(payload, protocol=3))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data.npy", buf.getvalue())


@pytest.mark.parametrize("kind", ["eval-in-dict", "system-at-top"])
def test_malicious_pickle_is_rejected_and_not_run(folder, tmp_path, kind):
    root, _ = folder
    marker = tmp_path / "pwned"
    target = root / "train" / "1.npz"
    if kind == "eval-in-dict":  # what np.savez writes for a dict holding a hostile object
        payload = _Eval(f"open({str(marker)!r}, 'w').close()")
        save_like_pfllib(target, payload, np.zeros(3, dtype=np.int64))  # type: ignore[arg-type]
        refused = "builtins.eval"
    else:
        _raw_npz(target, _System(f"touch {marker}"))
        refused = f"{os.system.__module__}.system"
    # The payload is live: numpy's own pickle loading runs it.
    np.load(target, allow_pickle=True)["data"]
    assert marker.exists()
    marker.unlink()

    with pytest.raises(DatasetError, match=rf"1\.npz is not a valid client file.*refused to load global {refused}"):
        get_task("pfl-npz").load(root)
    assert not marker.exists()


def test_malicious_file_fails_the_cli_cleanly(folder, tmp_path):
    root, _ = folder
    marker = tmp_path / "pwned"
    _raw_npz(root / "test" / "0.npz", _Eval(f"open({str(marker)!r}, 'w').close()"))
    result = CliRunner().invoke(app, ["run", "--task", "pfl-npz", "--data-dir", str(root), "--method", "local",
                                      "--rounds", "1", "-q", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert "refused to load global builtins.eval" in result.output
    assert not marker.exists()
    # No record (the CLI may create --out itself before it loads anything, to check it is writable).
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]


def test_missing_folder_names_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as info:
        get_task("pfl-npz").load(missing)
    assert f"no PFLlib/HtFLlib folder at {missing} or {missing / 'pfl-npz'}" in str(info.value)


def test_missing_client_file(folder):
    root, _ = folder
    (root / "test" / "2.npz").unlink()
    with pytest.raises(DatasetError, match=r"missing \['2.npz'\]"):
        get_task("pfl-npz").load(root)


def test_label_counts_must_match_config(folder):
    root, written = folder
    x, y = written["train"][0]
    save_like_pfllib(root / "train" / "0.npz", x, np.where(y == 0, 1, y))
    with pytest.raises(DatasetError, match="client 0's files .* do not match the label counts"):
        get_task("pfl-npz").load(root)


def test_other_class_count_or_shape_is_refused(folder):
    root, written = folder
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps(dict(config, num_classes=100)))
    with pytest.raises(DatasetError, match="num_classes 100"):
        get_task("pfl-npz").load(root)
    (root / "config.json").write_text(json.dumps(config))
    x, y = written["test"][1]
    save_like_pfllib(root / "test" / "1.npz", np.zeros((len(y), 3, 32, 32), np.float32), y)
    with pytest.raises(DatasetError, match=r"1\.npz holds images of shape \(3, 32, 32\)"):
        get_task("pfl-npz").load(root)


def test_cifar10_kind_reads_the_same_layout_with_rgb_images(tmp_path):
    root = tmp_path / "pfl-npz-cifar10"  # the task's default folder under --data-dir
    written = make_folder(root, shape=(3, 32, 32))
    data = get_task("pfl-npz-cifar10").load(tmp_path)
    assert tuple(data.train_x.shape) == (sum(TRAIN_SIZES), 3, 32, 32)
    assert [len(i) for i in data.client_indices] == list(TRAIN_SIZES)
    assert torch.equal(data.test_y, torch.from_numpy(np.concatenate([y for _, y in written["test"]])))
    with pytest.raises(DatasetError, match=r"registered for \(1, 28, 28\); use --task pfl-npz-cifar10"):
        get_task("pfl-npz").load(root)


def test_garbage_file(folder):
    root, _ = folder
    (root / "train" / "0.npz").write_bytes(b"not a zip at all")
    with pytest.raises(DatasetError, match=r"0\.npz is not a valid client file \(BadZipFile"):
        get_task("pfl-npz").load(root)
    _raw_npz(root / "train" / "0.npz", [1, 2, 3])  # a harmless pickle of the wrong thing
    with pytest.raises(DatasetError, match=r"0\.npz should hold a dict with keys 'x' and 'y'"):
        get_task("pfl-npz").load(root)


# --------------------------------------------------------------------------- untrusted folders


def _set_config(root: Path, **changes) -> None:
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps(dict(config, **changes)))


def test_huge_num_clients_fails_fast_and_short(folder):
    """config.json is checked against the files present before anything proportional to num_clients
    is built (this once took minutes, 4.5 GB and printed a 300 MB error line)."""
    root, _ = folder
    _set_config(root, num_clients=20_000_000)
    task = get_task("pfl-npz")
    t0 = time.perf_counter()
    with pytest.raises(DatasetError) as info:
        task.load(root)
    assert task.folder_defaults(root) == {}  # not a default of 20 million clients
    with pytest.raises(DatasetError):
        task.fingerprint(root)
    assert time.perf_counter() - t0 < 0.5
    msg = str(info.value)
    assert len(msg) < 400 and "\n" not in msg
    assert f"{root / 'train'} holds 3 .npz files, but config.json gives num_clients 20000000" in msg
    assert "missing ['3.npz', '4.npz', '5.npz', '6.npz', '7.npz'] and 19999992 more" in msg
    assert "Fix num_clients in config.json" in msg


def test_unexpected_files_are_listed_briefly(folder):
    root, written = folder
    for i in range(8):
        save_like_pfllib(root / "train" / f"extra{i}.npz", *written["train"][0])
    save_like_pfllib(root / "train" / "03.npz", *written["train"][0])  # not how PFLlib names client 3
    with pytest.raises(DatasetError) as info:
        get_task("pfl-npz").load(root)
    msg = str(info.value)
    assert "holds 12 .npz files" in msg and "missing none" in msg
    assert "unexpected ['03.npz', 'extra0.npz', 'extra1.npz', 'extra2.npz', 'extra3.npz'] and 4 more" in msg


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_are_refused(folder, bad):
    root, written = folder
    x, y = written["test"][2]
    x = x.copy()
    x[3, 0, 5, 5] = bad
    save_like_pfllib(root / "test" / "2.npz", x, y)
    expected = f"{root / 'test' / '2.npz'}: 'x' holds NaN or infinite values"
    with pytest.raises(DatasetError, match=re.escape(expected)):
        get_task("pfl-npz").load(root)


@pytest.mark.parametrize("what", ["train/1.npz", "config.json", "train", "test"])
def test_links_out_of_the_folder_are_refused(folder, tmp_path, what):
    root, _ = folder
    inside = root / what
    outside = tmp_path / "elsewhere" / what
    outside.parent.mkdir(parents=True)
    inside.rename(outside)
    inside.symlink_to(outside)
    task = get_task("pfl-npz")
    match = re.escape(f"{inside} resolves to {outside}, outside the data folder {root}")
    with pytest.raises(DatasetError, match=match):
        task.load(root)
    with pytest.raises(DatasetError, match=match):
        task.fingerprint(root)
    task.folder_defaults(root)  # a default only (load refuses the folder): it must not raise


def test_links_within_the_folder_are_fine(folder, tmp_path):
    root, _ = folder
    spare = root / "spare"
    spare.mkdir()
    (root / "train" / "1.npz").rename(spare / "1.npz")
    (root / "train" / "1.npz").symlink_to(Path("..") / "spare" / "1.npz")
    (tmp_path / "link").symlink_to(root)  # the folder itself may be reached through a link
    data = get_task("pfl-npz").load(tmp_path / "link")
    assert len(data.client_indices) == 3


def test_folder_defaults_never_raises(folder, monkeypatch):
    root, _ = folder
    task = get_task("pfl-npz")
    assert task.folder_defaults(root) == {"clients": 3}
    for text in ("{not json", "[" * 100_000 + "]" * 100_000, "[]", '{"num_clients": "3"}'):
        (root / "config.json").write_text(text)
        assert task.folder_defaults(root) == {}
        with pytest.raises(DatasetError, match="config.json"):
            task.load(root)
    (root / "config.json").unlink()
    (root / "config.json").mkdir()  # not a file: no folder here at all
    assert task.folder_defaults(root) == {}
    assert task.folder_defaults(root / "nowhere") == {}


def test_oversized_config_is_not_read(folder, monkeypatch):
    root, _ = folder
    monkeypatch.setattr(pfl_npz, "MAX_CONFIG_BYTES", 100)
    with pytest.raises(DatasetError, match=r"config\.json is larger than"):
        get_task("pfl-npz").load(root)
    assert get_task("pfl-npz").folder_defaults(root) == {}


def test_malformed_label_counts(folder):
    root, _ = folder
    _set_config(root, **{"Size of samples for labels in clients": [[["a", 1]], [], []]})
    with pytest.raises(DatasetError, match="client 0's label counts are not"):
        get_task("pfl-npz").load(root)
    _set_config(root, **{"Size of samples for labels in clients": 7})
    with pytest.raises(DatasetError, match="must be a list"):
        get_task("pfl-npz").load(root)


# --------------------------------------------------------------------------- end to end


def test_cli_run_end_to_end(folder, run_record):
    root, _ = folder
    record = run_record("--task", "pfl-npz", "--data-dir", str(root), "--method", "crad", "--rounds", "2")
    assert record["status"] == "ok" and record["method"]["name"] == "crad"
    assert 0 <= record["metrics"]["global_acc"] <= 100
    assert record["task"]["name"] == "pfl-npz"
    assert record["task"]["n_train"] == sum(TRAIN_SIZES) and record["task"]["n_test"] == sum(TEST_SIZES)
    assert record["partition"]["scheme"] == "given" and record["federation"]["n_clients"] == 3
    _, _, fed = build(root)
    assert record["partition"]["hash"] == fed.partition.hash


@pytest.mark.skipif(not (REAL / "config.json").is_file(), reason=f"{REAL} is not on this machine")
def test_real_mnist_folder():
    data = get_task("pfl-npz").load(REAL)  # a few seconds: 70k images
    assert len(data.client_indices) == 20
    assert len(data.train_y) + len(data.test_y) == 70000
    assert sum(len(i) for i in data.client_indices) == len(data.train_y)
    assert set(data.train_y.unique().tolist()) == set(range(10))
    part = given_partition(data.client_indices, data.train_y.numpy(), seed=0)
    for idx, split in zip(data.client_indices, part.clients):
        assert np.array_equal(np.sort(np.concatenate([split.train, split.val, split.test])), idx)
