"""UCI HAR: smartphone accelerometer and gyroscope windows, the 21 training subjects as clients and
the 9 other subjects as the global test set.

The data is the cache ``hfl-bench prepare uci-har --from "UCI HAR Dataset.zip"`` writes
(``hfl_bench/uci_har.py``: what is read, how strictly, how bounded). A window is the published
one: 9 channels (body acc xyz, body gyro xyz, total acc xyz) x 128 samples (2.56 s at 50 Hz,
50 % overlap, as UCI cut and filtered them), stored as a [9, 1, 128] "image" as ``hapt`` stores
its windows; the task standardizes each channel with the training windows' mean and sd.

The client partition is the published subjects' (``TaskData.client_indices``; partition ``given``,
the default and the only one accepted): client i holds every training window of the i-th training
subject in increasing id order, split by the usual seeded per-class rule into train / validation /
local test (overlapping windows, as in ``hapt``). The global test set is UCI's test split: other
people than any client, so the global score measures generalization to unseen users.
"""

from __future__ import annotations

from hfl_bench.data import TaskInfo, register_task
from hfl_bench.npzfile import ArraySpec
from hfl_bench.tasks.hapt import SensorWindowsTask
from hfl_bench.uci_har import ACTIVITIES, CACHE, FOLDER, MAX_WINDOWS, SIGNALS, WINDOW

NAME = "uci-har"
INPUT_SHAPE = (len(SIGNALS), 1, WINDOW)
CACHE_SPECS = {
    "train_x": ArraySpec("f", INPUT_SHAPE, MAX_WINDOWS, 4), "train_y": ArraySpec("i", (), MAX_WINDOWS),
    "train_client": ArraySpec("i", (), MAX_WINDOWS), "test_x": ArraySpec("f", INPUT_SHAPE, MAX_WINDOWS, 4),
    "test_y": ArraySpec("i", (), MAX_WINDOWS),
}
PREPARE = ("build it offline with `hfl-bench prepare uci-har --from \"UCI HAR Dataset.zip\"` (the zip of "
           "https://archive.ics.uci.edu/dataset/240, or the folder it unpacks to; see the install guide)")


@register_task(NAME)
class UCIHAR(SensorWindowsTask):
    """UCI HAR's published windows, 6 activities, the training subjects as clients."""

    folder, cache, specs, prepare = FOLDER, CACHE, CACHE_SPECS, PREPARE

    info = TaskInfo(
        name=NAME,
        version="1.0",
        num_classes=len(ACTIVITIES),
        input_shape=INPUT_SHAPE,
        source="UCI HAR Dataset (https://archive.ics.uci.edu/dataset/240), its Inertial Signals, converted by "
               "`hfl-bench prepare uci-har`",
        citation="Anguita, Ghio, Oneto, Parra & Reyes-Ortiz, A Public Domain Dataset for Human Activity "
                 "Recognition Using Smartphones, ESANN 2013",
        license="CC BY 4.0",
        description=(
            "Offline after `hfl-bench prepare uci-har`: UCI HAR's published 2.56 s windows (128 samples at 50 "
            "Hz, 50% overlap) of body acc, body gyro and total acc xyz, 6 activities, stored as 9x1x128; each of "
            "the 21 training subjects a client (partition given); global test set: UCI's test split, 9 other "
            "subjects, so it measures generalization to unseen users. Defaults: hapt's calibrated protocol, "
            "not calibrated on uci-har itself (its data is not on this machine)."
        ),
        augmentation="none",
        # hapt's calibrated protocol (the same signals, windows and pool); not calibrated on uci-har,
        # whose published files are not on this machine.
        defaults={"partition": "given", "pool": "sensor", "clients": 21, "rounds": 30, "batch_size": 32,
                  "lr": 0.01, "local_epochs": 2, "heldout_fraction": 0.2},
    )
