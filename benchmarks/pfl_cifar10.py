"""A CIFAR-10 subsample over 20 clients in the PFLlib / HtFLlib folder layout (issue 31's harder setting).

MNIST under HtFLlib's metric saturates near 99% within a few rounds, so its curves hardly tell the
methods apart. This writes a harder folder both sides can read, the way PFLlib's data generator
builds one (our own code, its recipe):

- **Images**: the ``cifar10-jpg`` task's stratified seeded subsample of the shipped JPEGs (10,000
  training and 2,000 test images, 1,200 a class), merged as PFLlib merges CIFAR-10's train and test
  before partitioning, scaled to [-1, 1] (PFLlib's ``Normalize(0.5, 0.5)`` after ``ToTensor``).
- **Partition**: Dirichlet alpha 0.1 over 20 clients (hfl-bench's ``dirichlet`` partitioner,
  seed ``--seed``), at least 40 images a client (PFLlib's ``least_samples``: batch 10 over a 25%
  test share).
- **Per client**: a seeded 75 / 25 train / test split (PFLlib's ``train_ratio``), each file in a
  seeded random order as PFLlib's ``train_test_split(shuffle=True)`` leaves it (HtFLlib's loaders
  do not shuffle, so a class-sorted file would train on one class at a time), written as
  ``train/<cid>.npz`` and ``test/<cid>.npz``: ``np.savez_compressed(file, data={'x': float32
  [n, 3, 32, 32], 'y': int64 [n]})``, and ``config.json`` with PFLlib's fields and per-client
  label counts.

hfl-bench reads the folder as task ``pfl-npz-cifar10``, HtFLlib as its ``-data`` with
``FedAvgCNN(in_features=3, dim=1600)`` (its CIFAR-10 model):

    python benchmarks/pfl_cifar10.py [--data-dir DIR] --out FOLDER
    python benchmarks/htfllib_side_by_side.py --htfllib PATH --data FOLDER \\
        --out benchmarks/results/htfllib-side-by-side-cifar10.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

CLIENTS, ALPHA, TRAIN_RATIO, BATCH = 20, 0.1, 0.75, 10
LEAST_SAMPLES = int(BATCH / (1 - TRAIN_RATIO))  # PFLlib's minimum per client: 40


def client_splits(labels: np.ndarray, seed: int, clients: int = CLIENTS, alpha: float = ALPHA
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per client, (train indices, test indices) into ``labels``: a Dirichlet shard split 75 / 25."""
    from hfl_bench.partition import dirichlet

    rng = np.random.default_rng(seed)
    out = []
    for shard in dirichlet(labels, clients, rng, alpha=alpha, min_size=LEAST_SAMPLES):
        shard = rng.permutation(shard)
        cut = int(round(TRAIN_RATIO * len(shard)))
        out.append((shard[:cut], shard[cut:]))  # in the permuted order: HtFLlib's loaders do not shuffle
    return out


def write_folder(x: np.ndarray, y: np.ndarray, out: Path, seed: int, clients: int = CLIENTS,
                 alpha: float = ALPHA) -> dict:
    """Write ``out`` (config.json, train/, test/) from images in [0, 1]; returns the config."""
    x = (x.astype(np.float32) * 2 - 1).astype(np.float32)  # PFLlib's Normalize(0.5, 0.5)
    y = y.astype(np.int64)
    splits = client_splits(y, seed, clients, alpha)
    for split in ("train", "test"):
        (out / split).mkdir(parents=True, exist_ok=True)
    counts = []
    for cid, (tr, te) in enumerate(splits):
        for split, idx in (("train", tr), ("test", te)):
            _save(out / split / f"{cid}.npz", x[idx], y[idx])
        labels, n = np.unique(y[np.concatenate([tr, te])], return_counts=True)
        counts.append([[int(c), int(k)] for c, k in zip(labels, n)])
    config = {"num_clients": clients, "num_classes": int(y.max()) + 1, "non_iid": True, "balance": False,
              "partition": "dir", "Size of samples for labels in clients": counts, "alpha": alpha,
              "batch_size": BATCH, "written_by": "hfl-bench benchmarks/pfl_cifar10.py", "seed": seed}
    (out / "config.json").write_text(json.dumps(config))
    return config


def _save(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez_compressed(f, data={"x": x, "y": y})
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None, help="the folder holding cifar10-jpg/ (hfl-bench's --data-dir)")
    ap.add_argument("--out", required=True, help="the folder to write (config.json, train/, test/)")
    ap.add_argument("--seed", type=int, default=0, help="partition and split seed")
    args = ap.parse_args()
    from hfl_bench.data import get_task, resolve_data_dir

    train_x, train_y, test_x, test_y = get_task("cifar10-jpg").load_arrays(
        resolve_data_dir(args.data_dir), False)
    x, y = np.concatenate([train_x, test_x]), np.concatenate([train_y, test_y])
    config = write_folder(x, y, Path(args.out), args.seed)
    sizes = [sum(k for _, k in c) for c in config["Size of samples for labels in clients"]]
    print(f"wrote {args.out}: {len(y)} images over {config['num_clients']} clients "
          f"(smallest {min(sizes)}, largest {max(sizes)})")


if __name__ == "__main__":
    main()
