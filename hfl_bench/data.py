"""Task metadata, in-memory task data, the task base class and data fingerprints.

A task loads its whole dataset as tensors once; the engine moves them to the run's device,
so a batch is an index tensor, never a DataLoader worker.

Fingerprints. Every loaded ``TaskData`` carries ``fingerprint``: 16 hex characters of a sha256 that
identify exactly what the task loaded, so a record (or a resume) can tell a run on one data folder
from a run on another. The rule, in one place (``Task.fingerprint``):

- A task that reads files names them with ``Task.data_files(data_dir)``. Its fingerprint hashes the
  task's name and version and, per file, its path relative to the files' data folder (the deepest
  folder that holds them all), its size and the sha256 of its content. The content hashes are
  cached in ``<data folder>/.hfl-bench-fingerprints.json`` keyed by (relative path, size, mtime_ns,
  ctime_ns), so a second fingerprint costs only ``stat`` calls and never decodes the dataset. The
  change time is in the key because the kernel sets it on every write and nothing can set it back:
  a file rewritten with its old size and modification time (``cp -p``, a restore) is hashed again. The cache is
  best effort: an unreadable cache is ignored (one that is not a regular file, a FIFO say, with a
  warning; it is never waited on), and a folder that cannot be written (or has no write
  permission bits, even for root) just goes uncached. A data file is hashed only when it is a
  regular file (``regularfile``): a FIFO or a device at its path is refused, never read.
- A task that reads no files (``data_files`` is empty: generated or bundled data) hashes its
  loaded arrays instead (name, version, then dtype, shape and bytes of train_x, train_y, test_x
  and test_y as float32 / int64); computing it means loading the data.

``load`` also refuses what would only fail later: images that are not finite, labels that are not
integers in 0..num_classes-1, and image and label counts that disagree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from hfl_bench.errors import DatasetError  # noqa: F401  (re-exported: tasks raise it)
from hfl_bench.paths import write_atomic
from hfl_bench.registry import TASKS
from hfl_bench.regularfile import FileTooLarge, NotRegularFile, open_regular, read_regular

DATA_DIR_ENV = "HFL_BENCH_DATA"
FINGERPRINT_CACHE = ".hfl-bench-fingerprints.json"
FINGERPRINT_CACHE_MAX = 256 * 2**20  # about 1.5 million files' entries
FINGERPRINT_CHARS = 16
# A file modified less than this long ago is hashed but not cached: a same-size rewrite within
# the file system's timestamp granularity would otherwise keep a stale hash (git's "racy" case).
RACY_NS = 2_000_000_000
log = logging.getLogger(__name__)

# The CRAD paper's protocol (Sec. 4.1): the default of the tasks it ran.
PAPER_PROTOCOL = {"pool": "paper", "rounds": 300, "clients": 10, "partition": "dirichlet", "alpha": 0.3, "seed": 1024}




@dataclass(frozen=True)
class Modality:
    """One named input modality of a multimodal task and the shape of one sample of it."""

    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def modality_layout(modalities: "tuple[Modality, ...]") -> dict[str, tuple[slice, tuple[int, ...]]]:
    """Where each modality lies in a stored sample's flattened values (modalities one after the
    other, in order), with its shape."""
    layout, start = {}, 0
    for m in modalities:
        layout[m.name] = (slice(start, start + m.size), tuple(m.shape))
        start += m.size
    return layout


@dataclass(frozen=True)
class TaskInfo:
    """Declarative metadata of a task. Bump ``version`` whenever the data a task yields changes."""

    name: str
    version: str
    # None and () only in the registered info of a task that learns them from its folder when it
    # loads (imagefolder); the info of a loaded task (``task.info`` after ``task.load``) has them.
    num_classes: int | None
    input_shape: tuple[int, ...]  # (channels, height, width)
    source: str
    citation: str
    license: str
    main_score: str = "global_acc"
    description: str = ""
    augmentation: str = "none"  # a name in hfl_bench.augment.AUGMENTATIONS
    # Protocol defaults for this task (any RunConfig field); CLI flags and YAML override them.
    defaults: dict[str, Any] = field(default_factory=dict)
    # A multimodal task's modalities, in the order they are laid out: a sample is the
    # concatenation of each modality's flattened values, stored as a [1, 1, D] "image"
    # (``input_shape`` (1, 1, D), D the sum of the sizes). Empty for a single-modality task.
    # A value a client does not observe is NaN in the data it is handed (hfl_bench.modalities).
    modalities: tuple[Modality, ...] = ()
    # What a sample holds: "dense" (finite values, normalized per channel by ``Task.load``) or
    # "tokens" (int64 token ids in 0..vocabulary size - 1, never normalized: a text task). Methods
    # that make or perturb inputs cannot run on token ids (``MethodCard.why_not_tokens``).
    input_kind: str = "dense"

    def as_record(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_shape"] = list(self.input_shape)
        d.pop("defaults")
        if self.modalities:
            d["modalities"] = [{"name": m.name, "shape": list(m.shape)} for m in self.modalities]
        else:  # single-modality records stay as they always were
            d.pop("modalities")
        if self.input_kind == "dense":  # and so do those of the tasks of dense inputs
            d.pop("input_kind")
        return d


@dataclass
class TaskData:
    """A task's tensors: train (to be partitioned over clients) and the standard test set."""

    train_x: torch.Tensor  # float32 [N, C, H, W], normalized
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor
    test_y: torch.Tensor
    class_names: list[str] | None = None
    # A task with natural clients (users, movies, pfl-npz's files) sets one train index array per
    # client; partition "given" keeps them (or packs them into --clients of whole ones).
    client_indices: list[np.ndarray] | None = None
    # What was loaded (module docstring); set by Task.load, None for data built by hand.
    fingerprint: str | None = None

    def to(self, device: torch.device | str) -> "TaskData":
        return dataclasses.replace(
            self,
            train_x=self.train_x.to(device),
            train_y=self.train_y.to(device),
            test_x=self.test_x.to(device),
            test_y=self.test_y.to(device),
        )


class Task:
    """Base class of a task plugin: set ``info`` and implement ``load_arrays``.

    ``load_arrays`` returns ``(train_x, train_y, test_x, test_y)`` as numpy arrays, images
    as ``[N, C, H, W]`` (any numeric dtype, finite) and labels as integers. ``load`` checks them,
    normalizes the images per channel with the mean and std of the training split and sets the
    data's fingerprint.

    Override ``data_files`` if your task reads files: its fingerprint then covers exactly those
    files (cheap to recompute, see the module docstring). A task that reads none is fingerprinted
    by its loaded arrays.
    """

    info: ClassVar[TaskInfo]

    def load_arrays(
        self, data_dir: Path, download: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def data_files(self, data_dir: Path) -> list[Path]:
        """Every file ``load_arrays`` reads under ``data_dir`` once the data is there (after any
        download), whether or not they exist yet; empty for a task that reads no files."""
        return []

    def class_names(self) -> list[str] | None:
        return None

    def pretraining_data(self, modality: str | None, data_dir: Path | str | None,
                         ) -> "tuple[np.ndarray, np.ndarray, str] | None":
        """Labelled samples for pretraining a frozen feature encoder of ``modality`` (None: the
        whole input of a single-modality task), drawn where no client, public or test sample can
        come from (a generator with a seed of its own): ``(x, y, source)``, x shaped as one sample
        of that modality ([N, *shape]) in the task's standardized coordinates, ``source`` one line
        saying where the samples come from. None (the default): the task has no such source, and a
        run holds a pretraining split out of its training data instead (``--pretrain-size``)."""
        return None

    def folder_defaults(self, data_dir: Path | str | None) -> dict[str, Any]:
        """Protocol defaults that depend on the data folder (pfl-npz: its number of clients);
        they override ``info.defaults``. Most tasks have none. Must be cheap and never raise."""
        return {}

    def fingerprint(self, data_dir: Path | str | None = None) -> str:
        """``load(data_dir).fingerprint`` without loading when the task reads files (stat calls
        once the content hashes are cached). DatasetError if one of its files is missing."""
        root = resolve_data_dir(data_dir)
        files = self.data_files(root)
        if files:
            return files_fingerprint(self.info, files)
        return arrays_fingerprint(self.info, self._checked(self.load_arrays(root, False), root))

    def load(self, data_dir: Path | str | None = None, download: bool = False) -> TaskData:
        root = resolve_data_dir(data_dir)
        train_x, train_y, test_x, test_y = arrays = self._checked(self.load_arrays(root, download), root)
        files = self.data_files(root)  # asked after load_arrays: a download has put them in place
        fingerprint = files_fingerprint(self.info, files) if files else arrays_fingerprint(self.info, arrays)
        mean, std = channel_stats(train_x)
        return TaskData(
            train_x=normalize(train_x, mean, std),
            train_y=train_y,
            test_x=normalize(test_x, mean, std),
            test_y=test_y,
            class_names=self.class_names(),
            fingerprint=fingerprint,
        )

    def _checked(self, arrays, root: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``load_arrays``'s result as float32 images and int64 labels, or a DatasetError naming
        the task: a bad value here would otherwise surface rounds later as a "diverged" run."""
        name, c = self.info.name, self.info.num_classes
        out = []
        for split, x, y in (("train", arrays[0], arrays[1]), ("test", arrays[2], arrays[3])):
            x = torch.as_tensor(np.asarray(x), dtype=torch.float32)
            y = _integer_labels(np.asarray(y).reshape(-1), f"{name}: {split} labels in {root}")
            if tuple(x.shape[1:]) != tuple(self.info.input_shape):
                raise DatasetError(
                    f"{name}: {split} images have shape {tuple(x.shape[1:])}, expected {tuple(self.info.input_shape)}"
                )
            if len(x) == 0 or len(y) != len(x):
                raise DatasetError(f"{name}: {root} yields {len(x)} {split} images and {len(y)} labels")
            if not _all_finite(x):  # NaN or inf, or a float64 value beyond float32's range
                raise DatasetError(f"{name}: {split} images in {root} hold NaN or infinite values")
            if y.min() < 0 or y.max() >= c:
                raise DatasetError(f"{name}: {split} labels in {root} lie outside 0..{c - 1}")
            out += [x, torch.as_tensor(y, dtype=torch.int64)]
        return tuple(out)  # type: ignore[return-value]


def _all_finite(x: torch.Tensor) -> bool:
    """Whether a float32 CPU tensor holds no NaN or inf. A float64 sum of float32 values cannot
    overflow, so it is finite exactly when every value is; ~10x faster than torch.isfinite(x).all(),
    which allocates a mask as large as the data."""
    return bool(np.isfinite(x.numpy().sum(dtype=np.float64)))


def _integer_labels(y: np.ndarray, what: str) -> np.ndarray:
    """int64 labels; floats only when every value is a finite whole number (no silent truncation)."""
    if y.dtype.kind in "iu":
        return y.astype(np.int64, copy=False)
    if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
        return y.astype(np.int64)
    raise DatasetError(f"{what} must be integers, found {y.dtype} values")


# --------------------------------------------------------------------------- fingerprints


def _digest(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:FINGERPRINT_CHARS]


def arrays_fingerprint(info: TaskInfo, arrays) -> str:
    """Fingerprint of a task that reads no files: its float32 images and int64 labels."""
    parts: list[Any] = [info.name, info.version]
    for key, a in zip(("train_x", "train_y", "test_x", "test_y"), arrays):
        a = np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a)
        parts.append([key, a.dtype.str, list(a.shape), hashlib.sha256(memoryview(a).cast("B")).hexdigest()])
    return _digest(parts)


def file_sha256(path: Path) -> str:
    """sha256 of a file's content, read in chunks (the one place a fingerprint reads content); only
    a regular file (``regularfile``: a FIFO or a device at a data path is an OSError, never read)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def files_fingerprint(info: TaskInfo, files: list[Path]) -> str:
    """Fingerprint of a task that reads ``files``: relative path, size and content hash of each,
    the content hashes cached in the files' data folder (module docstring)."""
    # Plain strings, not pathlib: an image folder lists tens of thousands of files, and pathlib's
    # per-file parsing would cost seconds where the stat calls cost a fraction of one.
    paths = [os.fspath(p if isinstance(p, Path) else Path(p)) for p in files]  # normalized, as pathlib writes them
    folder = os.path.commonpath(list({os.path.dirname(p) or os.curdir for p in paths}))
    prefix = folder.rstrip(os.sep) + os.sep
    cache_path = Path(folder) / FINGERPRINT_CACHE
    cache = _read_cache(cache_path)
    parts: list[Any] = [info.name, info.version]
    changed = False
    for path in paths:
        rel = (path[len(prefix):].replace(os.sep, "/") if path.startswith(prefix)
               else Path(path).relative_to(folder).as_posix())  # e.g. "./x": the same as pathlib would say
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise missing_dataset(info.name, Path(path)) from None
        except OSError as e:
            raise unreadable_dataset(info.name, Path(path), e, download=False) from None
        entry = cache.get(rel)
        if not (isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns
                and entry.get("ctime_ns") == st.st_ctime_ns and isinstance(entry.get("sha256"), str)):
            try:
                entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
                         "sha256": file_sha256(path)}
            except NotRegularFile as e:  # a FIFO, a link to a device: no data file, and never read
                raise DatasetError(f"{info.name}: {path} is not a regular file (a {e.kind}); put the data file "
                                   "there") from None
            except OSError as e:
                raise unreadable_dataset(info.name, Path(path), e, download=False) from None
            if time.time_ns() - st.st_mtime_ns >= RACY_NS:
                cache[rel], changed = entry, True
        parts.append([rel, st.st_size, entry["sha256"]])
    if changed:
        _write_cache(cache_path, cache)
    return _digest(parts)


def _read_cache(path: Path) -> dict[str, Any]:
    """The cached content hashes, or none when the cache is absent or unreadable; one that is not a
    regular file of at most ``FINGERPRINT_CACHE_MAX`` bytes (``regularfile``) is never waited on
    or read, and is named in one warning (it is rewritten when this call caches a hash)."""
    try:
        cache = json.loads(read_regular(path, FINGERPRINT_CACHE_MAX))
        files = cache.get("files") if isinstance(cache, dict) else None
    except (NotRegularFile, FileTooLarge) as e:
        log.warning("warning: the fingerprint cache cannot be used (%s); the data files are hashed again", e)
        return {}
    except (OSError, ValueError, RecursionError):
        return {}
    return files if isinstance(files, dict) else {}


def _write_cache(path: Path, files: dict[str, Any]) -> None:
    # Best effort: a read-only or odd data folder only costs the next call a re-hash.
    try:
        if not path.parent.stat().st_mode & 0o222:  # marked read-only: respected even by root
            return
        write_atomic(path, json.dumps({"format": 1, "files": files}, indent=0, sort_keys=True))
    except OSError:
        pass


def channel_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [0] + list(range(2, x.dim()))
    return x.mean(dim=dims), x.std(dim=dims).clamp_min(1e-6)


def normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return (x - mean.view(shape)) / std.view(shape)


def resolve_data_dir(data_dir: Path | str | None) -> Path:
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hfl-bench" / "data"


def missing_dataset(task: str, path: Path, extra: str = "") -> DatasetError:
    return DatasetError(
        f"{task} data not found at {path}. Pass --download to fetch it (needs internet), "
        f"or point --data-dir / ${DATA_DIR_ENV} at a folder that holds it.{extra}"
    )


def unreadable_dataset(task: str, path: Path, error: Exception, download: bool) -> DatasetError:
    """A dataset file that exists but cannot be read (or fetched): one line naming the path."""
    what = "could not be downloaded or read" if download else "is missing or corrupt"
    detail = " ".join(str(error).split())
    advice = ("Check the internet connection, or copy the dataset into --data-dir by hand" if download
              else "Pass --download to fetch it again (needs internet)")
    return DatasetError(f"{task}: the data at {path} {what} ({type(error).__name__}: {detail}). {advice}.")


def register_task(name: str):
    """Class decorator: register a ``Task`` subclass under ``name`` (must equal ``info.name``)."""

    def add(cls):
        if cls.info.name != name:
            raise ValueError(f"task registered as {name!r} but info.name is {cls.info.name!r}")
        return TASKS.register(name, cls)

    return add


def task_defaults(task: str, data_dir: Path | str | None) -> dict[str, Any]:
    """A task's protocol defaults, with those its data folder sets (``Task.folder_defaults``): what
    ``config.resolve_settings`` fills a run's unset settings from."""
    found = get_task(task)
    return {**found.info.defaults, **found.folder_defaults(data_dir)}


def get_task(name: str) -> Task:
    return TASKS.get(name)()


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic per-class split of indices into (train, test) for tasks without a test set."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        k = int(round(len(idx) * test_fraction))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
