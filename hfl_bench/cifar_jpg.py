"""Build the ``cifar10-jpg`` folder from CIFAR-10's python release, the files a user can obtain:
``cifar-10-python.tar.gz`` from https://www.cs.toronto.edu/~kriz/cifar.html, or the
``cifar-10-batches-py`` folder torchvision's ``CIFAR10(download=True)`` unpacks.

The folder it writes has the layout the task reads, ``cifar10-jpg/{train,test}/<class>/<nnnn>.jpg``
(classes by their names in the release's ``batches.meta``, images numbered per class in the
release's order), and ``SOURCE.json``: what it was built from (each source file's SHA-256), how (the
JPEG quality, Pillow's version) and how many images. JPEG encoding changes pixels, and this build
is not byte for byte the project's mirror archive: the records of a run on it carry another data
fingerprint (``task.data_fingerprint``), so they never share a leaderboard group with records made
on the mirror, and ``SOURCE.json`` says which build a folder is.

The release is a set of pickles. They are read by an unpickler that builds only what the release
holds (dicts, lists, bytes, numpy arrays) and refuses any other object, so a tampered file cannot
run code.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

BATCHES = "cifar-10-batches-py"
TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST = ("test_batch",)
META = "batches.meta"
QUALITY = 95
FOLDER = "cifar10-jpg"
SOURCE_FILE = "SOURCE.json"
MAX_MEMBER = 64 * 2**20  # a batch file is about 30 MB; a larger member is read into memory by no build
# The objects a CIFAR-10 pickle may build (numpy arrays, in numpy 1 and 2 spellings); nothing else.
ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
           ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
           ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class BuildError(ValueError):
    """Input the build cannot use: one line for the user."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise BuildError(f"refused: the pickle asks for {module}.{name}, which a CIFAR-10 batch never holds")
        return super().find_class(module, name)


def _load(data: bytes, name: str) -> dict:
    try:
        obj = _Unpickler(io.BytesIO(data), encoding="bytes").load()
    except BuildError as e:
        raise BuildError(f"{name}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line
        raise BuildError(f"{name}: not a CIFAR-10 python batch ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise BuildError(f"{name}: not a CIFAR-10 python batch (a {type(obj).__name__}, not a dict)")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}


@dataclass
class Source:
    """The release's files by name (bytes), and what they were read from."""

    files: dict[str, bytes]
    origin: str


def read_source(path: Path) -> Source:
    """The release's batch and meta files from ``path``: the tar.gz, the ``cifar-10-batches-py``
    folder, or a folder that holds it (torchvision's root)."""
    path = Path(path)
    wanted = (*TRAIN, *TEST, META)
    if path.is_file():
        try:
            with tarfile.open(path, "r:gz") as tar:
                files = {}
                for member in tar.getmembers():
                    name = Path(member.name).name
                    if member.isfile() and Path(member.name).parent.name == BATCHES and name in wanted:
                        if member.size > MAX_MEMBER:
                            raise BuildError(f"{path}: {member.name} is {member.size:,} bytes, more than a CIFAR-10 "
                                             f"batch ({MAX_MEMBER:,} at most)")
                        files[name] = tar.extractfile(member).read()  # read in memory, never extracted
        except (tarfile.TarError, OSError, EOFError) as e:
            raise BuildError(f"{path}: not a readable tar.gz ({e})") from None
    elif path.is_dir():
        folder = path if (path / META).is_file() or path.name == BATCHES else path / BATCHES
        files = {n: (folder / n).read_bytes() for n in wanted if (folder / n).is_file()}
    else:
        raise BuildError(f"no such file or folder: {path}")
    missing = [n for n in wanted if n not in files]
    if missing:
        raise BuildError(f"{path}: CIFAR-10's python release lacks {', '.join(missing)} here (expected "
                         f"cifar-10-python.tar.gz or a {BATCHES} folder holding {', '.join(wanted)})")
    return Source(files, str(path))


def _batch(source: Source, name: str) -> tuple[np.ndarray, list[int]]:
    """One batch's images (N x 3072 uint8, channel-major rows) and labels (0-9), checked."""
    batch = _load(source.files[name], name)
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise BuildError(f"{name}: 'data' is not an N x 3072 array of uint8")
    if not isinstance(labels, list) or len(labels) != len(data):
        raise BuildError(f"{name}: 'labels' is not a list of one label per image")
    if not all(isinstance(y, int) and 0 <= y < 10 for y in labels):
        raise BuildError(f"{name}: a label outside 0-9")
    return data, labels


def _images(batches: list[tuple[np.ndarray, list[int]]]) -> Iterator[tuple[np.ndarray, int]]:
    for data, labels in batches:
        for row, label in zip(data, labels):
            yield row.reshape(3, 32, 32).transpose(1, 2, 0), label


def build(source_path: Path, data_dir: Path, quality: int = QUALITY,
          progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Write ``data_dir/cifar10-jpg`` from the release at ``source_path``; return what
    ``SOURCE.json`` says. BuildError (nothing left behind) for input it cannot use or a target
    that exists."""
    from PIL import Image
    from PIL import __version__ as pillow

    source = read_source(source_path)
    meta = _load(source.files[META], META)
    classes = [c.decode() if isinstance(c, bytes) else c for c in meta.get("label_names") or []]
    if len(classes) != 10 or not all(isinstance(c, str) and c.isidentifier() for c in classes):
        raise BuildError(f"{META}: 'label_names' is not the ten class names")
    splits = {split: [_batch(source, n) for n in names] for split, names in (("train", TRAIN), ("test", TEST))}
    target = Path(data_dir) / FOLDER  # every batch read and checked before anything is written
    if target.exists():
        raise BuildError(f"{target} exists; remove it, or give another --data-dir")
    partial = Path(data_dir) / f".{FOLDER}.partial"
    if partial.exists():
        import shutil

        shutil.rmtree(partial)
    counts: dict[str, dict[str, int]] = {}
    try:
        for split, batches in splits.items():
            seen = dict.fromkeys(classes, 0)
            for c in classes:
                (partial / split / c).mkdir(parents=True)
            for image, label in _images(batches):
                name = classes[label]
                Image.fromarray(image, "RGB").save(partial / split / name / f"{seen[name]:04d}.jpg", "JPEG",
                                                   quality=quality)
                seen[name] += 1
            counts[split] = seen
            if progress:
                progress(split, sum(seen.values()))
        info = {
            "built_by": "hfl-bench prepare cifar10-jpg",
            "source": "CIFAR-10 python release (https://www.cs.toronto.edu/~kriz/cifar.html)",
            "source_sha256": {n: hashlib.sha256(source.files[n]).hexdigest() for n in sorted(source.files)},
            "jpeg": {"quality": quality, "encoder": f"Pillow {pillow}"},
            "classes": classes, "images": counts,
        }
        (partial / SOURCE_FILE).write_text(json.dumps(info, indent=1) + "\n")
        partial.rename(target)  # all or nothing: a folder the task finds is a whole one
    except BaseException:
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
        raise
    return info
