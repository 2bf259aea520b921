"""A dataset already partitioned over clients in the PFLlib / HtFLlib folder layout, kept as it is.

Layout (as written by those suites' data generators)::

    <folder>/config.json        num_clients, num_classes, per-client label counts, ...
    <folder>/train/<cid>.npz    cid = 0 .. num_clients-1
    <folder>/test/<cid>.npz

Each npz holds one member, ``data.npy``: a 0-d object array whose item is a pickled dict
``{'x': float [n, 1, 28, 28], 'y': int [n]}``. The folder is ``--data-dir`` itself when it holds a
``config.json``, else ``<data dir>/pfl-npz``. The shipped example is real MNIST over 20 clients
(the project's shared/data/mnist-htfl: Dirichlet 0.1, 70,000 images).

Safe loading: ``np.load(allow_pickle=True)`` would run whatever a pickle asks for. We never call it.
Each npz is opened with ``zipfile``, the ``.npy`` header is parsed with numpy's header readers
(``np.lib.format``, which use ``ast.literal_eval``), and the pickled payload is read by
``SafeUnpickler``, whose ``find_class`` admits only ``ndarray``, ``dtype`` and numpy's array
``_reconstruct`` (under its numpy 1 and numpy 2 module names) and raises ``UnpicklingError`` for any
other global; a rejected file is a ``DatasetError`` naming it. No other callable can be reached,
so a file cannot run code. The result must be the expected dict of numeric arrays.

Choices where the layout or the protocol leaves a gap:

- The client partition is exactly the files' membership: the training set is the concatenation of
  the clients' train files in cid order and client i's shard is the whole of train/i.npz
  (``TaskData.client_indices``; the engine builds partition ``given`` from it, the default; another
  partitioner draws over the pooled training files). Its hash covers the indices, the seed, the
  held-out fraction and the labels.
- Within a shard, the protocol's usual seeded per-class split applies: 80% train, 20% held out and
  halved into validation and local test (``--seed`` changes only this split, not the membership).
  So clients train on 80% of their PFLlib train file, not all of it.
- The global test set is the union of all clients' test files (the layout has no standard one: the
  generator merged MNIST's train and test before partitioning). It is disjoint from everything a
  method trains, validates or selects on; had the test files been the clients' validation halves,
  a method that trains with validation statistics (CRAD's reliability weights) would have seen
  global-test labels. Local accuracy is measured on the held-out test half of the train file, not
  on the client's PFLlib test file, so it is not PFLlib's own per-client test accuracy.
- Metadata is static: ``pfl-npz`` is registered with the shipped example's kind (10 classes,
  1x28x28) and ``pfl-npz-cifar10`` with CIFAR-10's (10 classes, 3x32x32; its default folder is
  ``<data dir>/pfl-npz-cifar10``); ``load`` checks the folder against its task's kind (num_classes,
  image shape, label range) with a clear error that names the other task when its shape fits. The
  number of clients comes from ``config.json`` (``folder_defaults``); a ``--clients`` that
  disagrees with the number of client files is an error. When ``config.json`` lists per-client
  label counts, the files must match them (train + test).
- Images are normalized per channel with the training statistics like every task, although PFLlib
  already scaled them to [-1, 1].

Untrusted folders are checked before anything large is built: the number of client files actually
in train/ and test/ is compared with config.json's num_clients first (a config claiming 20 million
clients fails at once, naming at most a few files), config.json is read only up to
``MAX_CONFIG_BYTES``, every ``x`` must be finite, and config.json, train/, test/ and each client
file must resolve (symlinks followed) inside the folder. Decompression budget (``hfl_bench.npzfile``): the
client files' declared uncompressed sizes together must fit ``MAX_IMAGES`` images of the task's shape
(float32) before any file is read; each file's stream stops at its declared size, and an array a
pickle asks for that is larger than its file is refused. ``data_files`` lists config.json and every
client file: the fingerprint of the data (``hfl_bench.data``) covers exactly those.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from hfl_bench.data import DatasetError, Task, TaskData, TaskInfo, register_task, resolve_data_dir
from hfl_bench.npzfile import declared_size, file_limit, human_bytes, open_member, open_npz, read_npy_header
from hfl_bench.regularfile import FileTooLarge, read_regular
from hfl_bench.tasks.cifar import CITATION as CIFAR_CITATION
from hfl_bench.tasks.cifar import LICENSE as CIFAR_LICENSE

NAME = "pfl-npz"
LAYOUT = "A PFLlib / HtFLlib folder (config.json, train/<cid>.npz, test/<cid>.npz)"
SUITES_CITATION = ("Zhang et al., PFLlib, JMLR 26(50), 2025 (arXiv 2312.04992); Zhang et al., HtFLlib, KDD 2025 "
                   "(arXiv 2506.03954)")
MEMBER = "data.npy"
# PFLlib's config.json is a few KB per hundred clients; anything far larger is not one.
MAX_CONFIG_BYTES = 64 << 20
SHOWN_NAMES = 5  # file names an error lists at most
# The decompression budget (hfl_bench.npzfile): images a folder may hold, train and test together.
# MNIST, Fashion-MNIST and KMNIST have 70,000, CIFAR-10 60,000, SVHN 99,289 (without "extra").
MAX_IMAGES = 100_000
# Bytes a value may take in the budget: PFLlib writes float32 images (torch tensors' numpy copies).
BYTES_PER_VALUE = 4
LABEL_BYTES = 8  # int64 labels
# Per file: the pickle's own framing (dict, keys, array reconstructors) around the raw array bytes.
PICKLE_OVERHEAD = 64 << 10

# numpy's array reconstructor, whatever module this numpy keeps it in.
_RECONSTRUCT = np.empty(0).__reduce__()[0]
# The only globals an array-of-dict pickle written by numpy 1.x or 2.x refers to.
ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class SafeUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, dtypes and plain containers, and nothing that could run code; an
    array larger than ``limit`` bytes is refused (numpy pickles an array's raw bytes, so a genuine
    one is never larger than the member that holds it)."""

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        super().__init__(stream)
        self.limit = limit

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused to load global {module}.{name}") from None
        return self._reconstruct if found is _RECONSTRUCT else found

    def _reconstruct(self, subtype: Any, shape: Any, dtype: Any) -> Any:
        """numpy's ``_reconstruct``, which allocates an empty array of any shape the pickle names:
        a few bytes could ask for terabytes, so the size is checked first."""
        size = math.prod(shape) * np.dtype(dtype).itemsize if isinstance(shape, tuple) else None
        if size is None or size > self.limit:
            raise pickle.UnpicklingError(f"refused an array of shape {shape} ({dtype}): larger than its file")
        return _RECONSTRUCT(subtype, shape, dtype)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id")


def find_folder(data_dir: Path | str | None, name: str = NAME) -> Path:
    """``data_dir`` itself when it holds a config.json, else ``<data_dir>/<name>`` (the task's name)."""
    root = resolve_data_dir(data_dir)
    for folder in (root, root / name):
        try:
            if (folder / "config.json").is_file():
                return folder
        except OSError as e:  # e.g. a folder we may not read
            raise DatasetError(f"{NAME}: cannot read {folder} ({type(e).__name__}: {e})") from None
    raise DatasetError(
        f"{NAME}: no PFLlib/HtFLlib folder at {root} or {root / name} (no config.json in either). Point "
        "--data-dir at the folder that holds config.json, train/<cid>.npz and test/<cid>.npz."
    )


def check_inside(path: Path, folder: Path) -> None:
    """Refuse a path that resolves (through symlinks) outside ``folder``: the folder is the data."""
    try:
        target, base = path.resolve(), folder.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise DatasetError(f"{NAME}: {path} cannot be resolved ({type(e).__name__}: {e})") from None
    if not target.is_relative_to(base):
        raise DatasetError(f"{NAME}: {path} resolves to {target}, outside the data folder {folder}; "
                           "copy the file into the folder instead of linking to it")


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    check_inside(path, folder)
    try:  # a regular file only (regularfile): a FIFO swapped in after the folder was found is never waited on
        config = json.loads(read_regular(path, MAX_CONFIG_BYTES))
    except FileTooLarge:
        raise DatasetError(f"{NAME}: {path} is larger than {MAX_CONFIG_BYTES >> 20} MB: not a PFLlib "
                           "config.json; point --data-dir at a PFLlib/HtFLlib folder") from None
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: absurdly nested JSON
        raise DatasetError(f"{NAME}: {path} is not readable JSON ({type(e).__name__}: {e})") from None
    n = config.get("num_clients") if isinstance(config, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DatasetError(f"{NAME}: {path} must give num_clients as a positive integer")
    return config


def _shown(names: list[str], total: int) -> str:
    """At most SHOWN_NAMES names and how many more: an error line stays one short line."""
    if not total:
        return "none"
    more = f" and {total - len(names)} more" if total > len(names) else ""
    return f"{names}{more}"


def client_files(folder: Path, split: str, n_clients: int) -> list[Path]:
    """``<split>/0.npz .. <split>/<n-1>.npz``, checked against the files present before anything
    proportional to ``n_clients`` is built (a config.json may claim any number of clients)."""
    where = folder / split
    if not where.is_dir():
        raise DatasetError(f"{NAME}: {where} is missing; a PFLlib/HtFLlib folder holds train/ and test/ "
                           "with one <cid>.npz per client")
    check_inside(where, folder)
    ids = {p.name: _client_id(p.name) for p in sorted(where.glob("*.npz"))}
    found = list(ids)
    # The first few gaps; the loop stops after SHOWN_NAMES of them, so it is bounded by the files present.
    missing, cid = [], 0
    while cid < n_clients and len(missing) < SHOWN_NAMES:
        if f"{cid}.npz" not in ids:
            missing.append(f"{cid}.npz")
        cid += 1
    unexpected = [name for name, i in ids.items() if i is None or i >= n_clients]
    n_expected = len(found) - len(unexpected)
    if len(found) != n_clients or unexpected:
        raise DatasetError(
            f"{NAME}: {where} holds {len(found)} .npz files, but config.json gives num_clients {n_clients} "
            f"(expected 0.npz .. {n_clients - 1}.npz); missing {_shown(missing, n_clients - n_expected)}, "
            f"unexpected {_shown(unexpected[:SHOWN_NAMES], len(unexpected))}. Fix num_clients in config.json "
            "or restore the client files."
        )
    paths = [where / f"{cid}.npz" for cid in range(n_clients)]
    for path in paths:
        check_inside(path, folder)
    return paths


def _client_id(name: str) -> int | None:
    """The cid of ``<cid>.npz`` written as PFLlib writes it (decimal, no leading zero), else None."""
    stem = name[: -len(".npz")]
    return int(stem) if stem.isdigit() and str(int(stem)) == stem else None


def read_client_file(path: Path, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of one client file, read without letting the file run code (module docstring)
    and without inflating more than ``limit`` bytes (``hfl_bench.npzfile``; default: the largest
    registered kind's budget)."""
    if limit is None:
        limit = max(kind().budget() for kind in FOLDER_TASKS) + PICKLE_OVERHEAD
    if not path.is_file():
        raise DatasetError(f"{NAME}: missing client file {path}")
    try:
        with open_npz(path, file_limit(limit), NAME) as archive:
            if archive.namelist() != [MEMBER]:
                raise DatasetError(f"{NAME}: {path} should hold only {MEMBER}, found {archive.namelist()}")
            with open_member(archive, MEMBER, limit, path, NAME) as member:
                obj = _read_pickled_npy(member, path, limit)
    except DatasetError:
        raise
    except Exception as e:  # untrusted bytes can fail anywhere in zip, header or pickle: all are bad files
        raise DatasetError(f"{NAME}: {path} is not a valid client file ({type(e).__name__}: {e})") from None
    return _client_arrays(obj, path)


def _read_pickled_npy(stream: BinaryIO, path: Path, limit: int) -> Any:
    shape, dtype = read_npy_header(stream)
    if dtype != np.dtype(object) or shape != ():
        raise DatasetError(f"{NAME}: {path}: expected a pickled dict (0-d object array), found {dtype} {shape}")
    return SafeUnpickler(stream, limit).load()


def _client_arrays(obj: Any, path: Path) -> tuple[np.ndarray, np.ndarray]:
    item = obj.item() if isinstance(obj, np.ndarray) and obj.dtype == object and obj.shape == () else None
    if not isinstance(item, dict) or not {"x", "y"} <= set(item):
        raise DatasetError(f"{NAME}: {path} should hold a dict with keys 'x' and 'y'")
    x, y = item["x"], item["y"]
    if not (isinstance(x, np.ndarray) and x.dtype.kind in "fiu" and x.ndim == 4):
        raise DatasetError(f"{NAME}: {path}: 'x' must be a numeric [n, C, H, W] array")
    if x.dtype.kind == "f" and not np.isfinite(x).all():  # NaN would only show up later as a diverged run
        raise DatasetError(f"{NAME}: {path}: 'x' holds NaN or infinite values; regenerate or fix this client file")
    if not (isinstance(y, np.ndarray) and y.dtype.kind in "iu" and y.ndim == 1 and len(y) == len(x)):
        raise DatasetError(f"{NAME}: {path}: 'y' must be an integer array with one label per image")
    return x, y.astype(np.int64)


def read_split(folder: Path, split: str, n_clients: int,
               limit: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every client's arrays of one split, in cid order; the files must be exactly 0..n-1."""
    return [read_client_file(path, limit) for path in client_files(folder, split, n_clients)]


def check_budget(paths: list[Path], budget: int, task: str) -> None:
    """The client files' declared uncompressed sizes (from their zip directories, nothing inflated)
    must fit ``budget`` together, before any file is read: each may be within it and all of them not."""
    total = 0
    for path in paths:
        try:
            total += declared_size(path, MEMBER)
        except Exception as e:  # a bad file: read_client_file says what is wrong with it
            raise DatasetError(f"{NAME}: {path} is not a valid client file ({type(e).__name__}: {e})") from None
    if total > budget:
        raise DatasetError(f"{task}: the {len(paths)} client files in {paths[0].parent.parent} declare "
                           f"{human_bytes(total)} uncompressed, over the task's budget of {human_bytes(budget)} "
                           f"({MAX_IMAGES:,} images); "
                           "refused before decompressing them")


def check_label_counts(config: dict[str, Any], labels: list[np.ndarray], folder: Path) -> None:
    """config.json's per-client [label, count] pairs (train + test) must match the files."""
    listed = config.get("Size of samples for labels in clients")
    if listed is None:
        return
    if not isinstance(listed, list):
        raise DatasetError(f"{NAME}: {folder}/config.json: 'Size of samples for labels in clients' "
                           "must be a list with one entry per client")
    if len(listed) != len(labels):
        raise DatasetError(f"{NAME}: {folder}/config.json lists {len(listed)} clients' label counts, "
                           f"but there are {len(labels)} clients")
    for cid, (pairs, y) in enumerate(zip(listed, labels)):
        try:
            expected = {int(c): int(k) for c, k in pairs if int(k)}
        except (TypeError, ValueError):
            raise DatasetError(f"{NAME}: {folder}/config.json: client {cid}'s label counts are not "
                               "[label, count] pairs of integers") from None
        classes, counts = np.unique(y, return_counts=True)
        if expected != dict(zip(classes.tolist(), counts.tolist())):
            raise DatasetError(f"{NAME}: client {cid}'s files in {folder} do not match the label counts "
                               "in its config.json: the folder is mixed up or incomplete")


@register_task(NAME)
class PflNpz(Task):
    """A PFLlib / HtFLlib client folder, its client partition kept as it is (see module docstring)."""

    info = TaskInfo(
        name=NAME,
        version="1.0",
        num_classes=10,
        input_shape=(1, 28, 28),
        source=f"{LAYOUT} from --data-dir; shipped example: MNIST over 20 clients, Dirichlet 0.1",
        citation=f"{SUITES_CITATION}; data: LeCun, Cortes & Burges, MNIST, 1998",
        license="MNIST: CC BY-SA 3.0",
        description="The folder's own client partition (one client per file); each client's train file is "
                    "split 80/10/10 into train/val/test; the union of the test files is the global test set.",
        augmentation="none",
        defaults={"partition": "given", "pool": "cpu", "rounds": 100, "clients": 20},
    )

    def __init__(self) -> None:
        self._client_indices: list[np.ndarray] | None = None

    def folder_defaults(self, data_dir: Path | str | None) -> dict[str, Any]:
        """The folder's number of clients as the default --clients; nothing if config.json is
        unreadable or disagrees with the number of train files (``load`` then says what is wrong).
        Reads config.json and lists train/ only: cheap, and it never raises."""
        try:
            folder = find_folder(data_dir, self.info.name)
            n = read_config(folder)["num_clients"]
            if n != sum(1 for _ in (folder / "train").glob("*.npz")):
                return {}
            return {"clients": n}
        except Exception:  # whatever is wrong, load reports it with a clear message
            return {}

    def budget(self) -> int:
        """Bytes of arrays the folder may declare: ``MAX_IMAGES`` images of the task's shape (float32) and labels."""
        return MAX_IMAGES * (math.prod(self.info.input_shape) * BYTES_PER_VALUE + LABEL_BYTES)

    def data_files(self, data_dir: Path) -> list[Path]:
        """config.json and every client file, train then test, checked as ``load`` checks them."""
        folder = find_folder(data_dir, self.info.name)
        n = read_config(folder)["num_clients"]
        return [folder / "config.json", *client_files(folder, "train", n), *client_files(folder, "test", n)]

    def load_arrays(self, data_dir: Path, download: bool):
        folder = find_folder(data_dir, self.info.name)
        config = read_config(folder)
        n = config["num_clients"]
        if config.get("num_classes", self.info.num_classes) != self.info.num_classes:
            raise DatasetError(f"{NAME}: {folder}/config.json has num_classes {config['num_classes']}, "
                               f"but task {self.info.name} is registered for {self.info.num_classes}")
        budget = self.budget()
        files = client_files(folder, "train", n) + client_files(folder, "test", n)
        check_budget(files, budget + len(files) * PICKLE_OVERHEAD, self.info.name)
        limit = budget + PICKLE_OVERHEAD  # one file may hold the whole folder's images
        train, test = read_split(folder, "train", n, limit), read_split(folder, "test", n, limit)
        check_label_counts(config, [np.concatenate([a[1], b[1]]) for a, b in zip(train, test)], folder)
        bounds = np.cumsum([0] + [len(y) for _, y in train])
        self._client_indices = [np.arange(lo, hi, dtype=np.int64) for lo, hi in zip(bounds[:-1], bounds[1:])]
        return (*self._join(train, folder / "train"), *self._join(test, folder / "test"))

    def _join(self, parts: list[tuple[np.ndarray, np.ndarray]], where: Path) -> tuple[np.ndarray, np.ndarray]:
        for cid, (x, _) in enumerate(parts):
            if tuple(x.shape[1:]) != self.info.input_shape:
                other = [t.info.name for t in FOLDER_TASKS if t.info.input_shape == tuple(x.shape[1:])]
                raise DatasetError(f"{NAME}: {where / f'{cid}.npz'} holds images of shape {tuple(x.shape[1:])}, "
                                   f"but task {self.info.name} is registered for {self.info.input_shape}"
                                   + (f"; use --task {other[0]}" if other else ""))
        # float32 per file: a float64 copy of 70k MNIST images would take ~440 MB
        x = np.concatenate([x.astype(np.float32, copy=False) for x, _ in parts])
        return x, np.concatenate([y for _, y in parts])

    def load(self, data_dir: Path | str | None = None, download: bool = False) -> TaskData:
        self._client_indices = None
        data = super().load(data_dir, download)
        return dataclasses.replace(data, client_indices=self._client_indices)

    def class_names(self) -> list[str]:
        return [str(i) for i in range(self.info.num_classes)]


@register_task(NAME + "-cifar10")
class PflNpzCifar10(PflNpz):
    """The same layout with CIFAR-10's kind of images (10 classes, 3x32x32), e.g. the subsample
    ``benchmarks/pfl_cifar10.py`` writes from the shipped JPEGs for the HtFLlib side-by-side."""

    info = dataclasses.replace(
        PflNpz.info,
        name=NAME + "-cifar10",
        input_shape=(3, 32, 32),
        source=f"{LAYOUT} of 32x32 RGB images in 10 classes from --data-dir; e.g. benchmarks/pfl_cifar10.py's "
               "CIFAR-10 subsample",
        citation=f"{SUITES_CITATION}; data: {CIFAR_CITATION}",
        license=f"CIFAR-10: {CIFAR_LICENSE}",
    )


FOLDER_TASKS = (PflNpz, PflNpzCifar10)  # the registered kinds of this layout, for the shape hint
