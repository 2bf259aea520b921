"""Task metadata, in-memory task data and the task base class.

A task loads its whole dataset as tensors once; the engine moves them to the run's device,
so a batch is an index tensor, never a DataLoader worker.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from hfl_bench.registry import TASKS

DATA_DIR_ENV = "HFL_BENCH_DATA"

# The CRAD paper's protocol (Sec. 4.1): the default of the tasks it ran.
PAPER_PROTOCOL = {"pool": "paper", "rounds": 300, "clients": 10, "partition": "dirichlet", "alpha": 0.3, "seed": 1024}


class DatasetError(RuntimeError):
    """A dataset is missing or unreadable; the message names the path and what to do."""


@dataclass(frozen=True)
class TaskInfo:
    """Declarative metadata of a task. Bump ``version`` whenever the data a task yields changes."""

    name: str
    version: str
    num_classes: int
    input_shape: tuple[int, ...]  # (channels, height, width)
    source: str
    citation: str
    license: str
    main_score: str = "global_acc"
    description: str = ""
    augmentation: str = "none"  # a name in hfl_bench.augment.AUGMENTATIONS
    # Protocol defaults for this task (any RunConfig field); CLI flags and YAML override them.
    defaults: dict[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_shape"] = list(self.input_shape)
        d.pop("defaults")
        return d


@dataclass
class TaskData:
    """A task's tensors: train (to be partitioned over clients) and the standard test set."""

    train_x: torch.Tensor  # float32 [N, C, H, W], normalized
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor
    test_y: torch.Tensor
    class_names: list[str] | None = None
    # A task that ships its own client partition (pfl-npz) sets one train index array per client;
    # the engine then keeps it (partition "given") instead of drawing one.
    client_indices: list[np.ndarray] | None = None

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
    as ``[N, C, H, W]`` (any numeric dtype) and labels as integers. ``load`` normalizes the
    images per channel with the mean and std of the training split.
    """

    info: ClassVar[TaskInfo]

    def load_arrays(
        self, data_dir: Path, download: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def class_names(self) -> list[str] | None:
        return None

    def folder_defaults(self, data_dir: Path | str | None) -> dict[str, Any]:
        """Protocol defaults that depend on the data folder (pfl-npz: its number of clients);
        they override ``info.defaults``. Most tasks have none."""
        return {}

    def load(self, data_dir: Path | str | None = None, download: bool = False) -> TaskData:
        root = resolve_data_dir(data_dir)
        train_x, train_y, test_x, test_y = self.load_arrays(root, download)
        train_x = torch.as_tensor(np.asarray(train_x), dtype=torch.float32)
        test_x = torch.as_tensor(np.asarray(test_x), dtype=torch.float32)
        expected = tuple(self.info.input_shape)
        for split, x in (("train", train_x), ("test", test_x)):
            if tuple(x.shape[1:]) != expected:
                raise DatasetError(
                    f"{self.info.name}: {split} images have shape {tuple(x.shape[1:])}, "
                    f"expected {expected}"
                )
        c = self.info.num_classes
        for split, y in (("train", train_y), ("test", test_y)):
            y = np.asarray(y)
            if len(y) and (y.min() < 0 or y.max() >= c):
                raise DatasetError(f"{self.info.name}: {split} labels in {root} lie outside 0..{c - 1}")
        mean, std = channel_stats(train_x)
        return TaskData(
            train_x=normalize(train_x, mean, std),
            train_y=torch.as_tensor(np.asarray(train_y).reshape(-1), dtype=torch.int64),
            test_x=normalize(test_x, mean, std),
            test_y=torch.as_tensor(np.asarray(test_y).reshape(-1), dtype=torch.int64),
            class_names=self.class_names(),
        )


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
    return DatasetError(
        f"{task}: the data at {path} {what} ({type(error).__name__}: {detail}). "
        "Pass --download to fetch it again (needs internet)."
    )


def register_task(name: str):
    """Class decorator: register a ``Task`` subclass under ``name`` (must equal ``info.name``)."""

    def add(cls):
        if cls.info.name != name:
            raise ValueError(f"task registered as {name!r} but info.name is {cls.info.name!r}")
        return TASKS.register(name, cls)

    return add


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
