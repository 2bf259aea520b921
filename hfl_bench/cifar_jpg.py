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

from hfl_bench.preparing import BuildError, claim
from hfl_bench.regularfile import open_regular, read_regular

BATCHES = "cifar-10-batches-py"
TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST = ("test_batch",)
META = "batches.meta"
QUALITY = 95
FOLDER = "cifar10-jpg"
SOURCE_FILE = "SOURCE.json"
MAX_MEMBER = 64 * 2**20  # a batch file is about 30 MB; a larger member is read into memory by no build
MAX_ARCHIVE = 2**30  # cifar-10-python.tar.gz is about 170 MB
MAX_CLASS_NAME = 64
# The objects a CIFAR-10 pickle may build (numpy arrays, in numpy 1 and 2 spellings); nothing else.
ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
           ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
           ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}




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
    folder: Path | None = None  # the batches' folder when read from one; None: from the tar.gz

    def where(self, name: str) -> str:
        """Where the file ``name`` of the release is, for a message: its path, or the archive and it."""
        return str(self.folder / name) if self.folder is not None else f"{self.origin}: {BATCHES}/{name}"


def read_source(path: Path) -> Source:
    """The release's batch and meta files from ``path``: the tar.gz, the ``cifar-10-batches-py``
    folder, or a folder that holds it (torchvision's root). Each is read only as a regular file of
    a bounded size (``regularfile``: a FIFO or a link to a device is refused, never waited on)."""
    path = Path(path)
    wanted = (*TRAIN, *TEST, META)
    folder = None
    if path.is_dir():
        folder = path if (path / META).exists() or path.name == BATCHES else path / BATCHES
        files = {}
        for n in wanted:
            try:
                files[n] = read_regular(folder / n, MAX_MEMBER)
            except FileNotFoundError:
                continue
            except OSError as e:  # not a regular file, too large, unreadable: the input's fault, named
                raise BuildError(f"cannot read {folder / n}: {e.strerror or e}") from None
    else:
        try:
            archive = open_regular(path, MAX_ARCHIVE)
        except FileNotFoundError:
            raise BuildError(f"no such file or folder: {path}") from None
        except OSError as e:
            raise BuildError(f"cannot read {path}: {e.strerror or e}") from None
        try:
            with archive, tarfile.open(fileobj=archive, mode="r:gz") as tar:
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
    missing = [n for n in wanted if n not in files]
    if missing:
        raise BuildError(f"{path}: CIFAR-10's python release lacks {', '.join(missing)} here (expected "
                         f"cifar-10-python.tar.gz or a {BATCHES} folder holding {', '.join(wanted)})")
    return Source(files, str(path), folder)


def _batch(source: Source, name: str) -> tuple[np.ndarray, list[int]]:
    """One batch's images (N x 3072 uint8, channel-major rows) and labels (0-9), checked."""
    where = source.where(name)
    batch = _load(source.files[name], where)
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise BuildError(f"{where}: 'data' is not an N x 3072 array of uint8")
    if not isinstance(labels, list) or len(labels) != len(data):
        raise BuildError(f"{where}: 'labels' is not a list of one label per image")
    if not all(type(y) is int and 0 <= y < 10 for y in labels):
        raise BuildError(f"{where}: a label outside 0-9")
    return data, labels


def class_names(source: Source) -> list[str]:
    """The ten class names of ``batches.meta``, each a folder name the build can make, distinct
    (also ignoring case: a case-insensitive file system would merge two), checked before anything is
    written; BuildError naming the file otherwise."""
    where = source.where(META)
    names = _load(source.files[META], where).get("label_names")
    if not isinstance(names, list) or len(names) != 10:
        raise BuildError(f"{where}: 'label_names' is not a list of the ten class names")
    classes = []
    for c in names:
        try:
            c = c.decode("utf-8") if isinstance(c, bytes) else c
        except UnicodeDecodeError:
            raise BuildError(f"{where}: class name {c!r} is not UTF-8 text") from None
        if not isinstance(c, str) or not c.isidentifier() or len(c) > MAX_CLASS_NAME:
            raise BuildError(f"{where}: class name {c!r} cannot name a folder (letters, digits and '_', not "
                             f"starting with a digit, at most {MAX_CLASS_NAME} characters)")
        classes.append(c)
    folded = [c.casefold() for c in classes]
    twice = sorted({c for c in classes if folded.count(c.casefold()) > 1})
    if twice:
        raise BuildError(f"{where}: 'label_names' names {', '.join(twice)} more than once; the ten classes must "
                         "be distinct")
    return classes


def _images(batches: list[tuple[np.ndarray, list[int]]]) -> Iterator[tuple[np.ndarray, int]]:
    for data, labels in batches:
        for row, label in zip(data, labels):
            yield row.reshape(3, 32, 32).transpose(1, 2, 0), label


def build(source_path: Path, data_dir: Path, quality: int = QUALITY,
          progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Write ``data_dir/cifar10-jpg`` from the release at ``source_path``; return what
    ``SOURCE.json`` says. The whole input is read and checked first (the class names, each batch's
    shape and labels); then the target folder is claimed (``locks.hold``: a second build of it at
    the same time is refused). BuildError, one line, with nothing left behind, for input it cannot
    use, a target that exists or one being built."""
    from PIL import __version__ as pillow

    source = read_source(source_path)
    classes = class_names(source)
    splits = {split: [_batch(source, n) for n in names] for split, names in (("train", TRAIN), ("test", TEST))}
    target = Path(data_dir) / FOLDER  # the whole input read and checked before anything is written
    # one build of a folder at a time: a second would remove the first's partial folder
    with claim(target):
        return _write(source, classes, splits, target, quality, progress, pillow)


def _write(source: Source, classes: list[str], splits: dict[str, list[tuple[np.ndarray, list[int]]]],
           target: Path, quality: int, progress: Callable[[str, int], None] | None, pillow: str) -> dict[str, Any]:
    """Write the checked release to ``target`` through a partial folder; the caller holds the claim."""
    from PIL import Image

    if target.exists():
        raise BuildError(f"{target} exists; remove it, or give another --data-dir")
    partial = target.parent / f".{FOLDER}.partial"
    if partial.exists():  # a build killed before its rename (no build holds the claim): start over
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
