"""Build the ``uci-har`` task's cache from the published "UCI HAR Dataset" (UCI id 240, CC BY 4.0):
the zip ``UCI HAR Dataset.zip`` a user downloads, or the folder ``UCI HAR Dataset/`` it unpacks to.

What is read: for each split (``train``: 7,352 windows of 21 subjects, ``test``: 2,947 windows of
the 9 others), the nine ``Inertial Signals/{body_acc,body_gyro,total_acc}_{x,y,z}_<split>.txt`` (one
window of 128 samples per line, 2.56 s at 50 Hz, whitespace-separated numbers in scientific notation
such as ``1.8085150e-004``), ``y_<split>.txt`` (the activity 1-6, one a line) and
``subject_<split>.txt`` (the subject 1-30, one a line); and ``activity_labels.txt``, which must name
the six published activities in order (``1 WALKING`` ... ``6 LAYING``). The 561 precomputed
features (``X_*.txt``) are not read.

Strict reading. Every number is parsed: a line of another count than 128 numbers, a character that
cannot be part of a number, a number that does not parse or is not finite (as float32 too), a label
outside 1-6, a subject outside 1-30, files of one split disagreeing on their row count, a subject in
both splits: BuildError, one line, naming the file and the line. No pickle is involved anywhere.

Bounded reading. The zip is read as a regular file of at most ``MAX_SOURCE`` bytes; before any
member is inflated, every member's name is checked (no absolute path, no ``..``, no backslash or
drive letter), the number of members bounded, and each member that is read must be stored or deflate
and declare at most ``MAX_MEMBER`` uncompressed bytes at most ``MAX_RATIO`` times its compressed size
(a zip bomb's ratio); ``zipfile`` stops at the declared size and checks the CRC, and the bytes read
must be the bytes declared. A folder's files are read as regular files of at most ``MAX_MEMBER`` bytes.

Checksums. No SHA-256 of the published zip is pinned: it could not be fetched where this was written.
``prepare`` prints the zip's SHA-256 (for a folder: ``content_sha256``, the SHA-256 of a
``sha256sum``-style list of the files read, the same for a zip and the folder it unpacks to) and
records it in SOURCE.json with each file's SHA-256, as ``prepare ag-news`` does; ``--sha256 HEX``
makes it check that digest instead (refused in one line when it differs).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable

import numpy as np

from hfl_bench.preparing import BuildError, write_cache
from hfl_bench.regularfile import FileTooLarge, open_regular, read_regular

FOLDER = "uci-har"
CACHE = "uci-har.npz"
SOURCE_FILE = "SOURCE.json"
ROOT = "UCI HAR Dataset"
# The published zip (UCI id 240): about 58 MiB; its exact size and SHA-256 are not pinned (above).
MAX_SOURCE = 128 * 2**20
MAX_MEMBER = 32 * 2**20  # a training signal file is about 15 MB (7,352 lines of 128 16-character numbers)
MAX_LABELS = 1 * 2**20  # y_train.txt and subject_train.txt are under 25 kB
MAX_RATIO = 100  # a signal file deflates about 3:1; labels in long runs more, but they are small
RATIO_FLOOR = 1 * 2**20  # members under this size are bounded by their size alone
MAX_MEMBERS = 10_000  # the published zip holds under 100 entries
MAX_WINDOWS = 20_000  # per split: 7,352 and 2,947 are published
MAX_NUMBER = 32  # characters of one number: "-1.2345678e-001" is 15
SPLITS = ("train", "test")
SIGNALS = tuple(f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz")
ACTIVITIES = ("walking", "walking_upstairs", "walking_downstairs", "sitting", "standing", "laying")
PUBLISHED_LABELS = tuple(a.upper() for a in ACTIVITIES)
SUBJECTS = 30
WINDOW = 128
_NUMBER_CHARS = b"0123456789.eE+-"
_SPACE = b" \t\r\n"




def files(split: str) -> list[str]:
    """The files of ``split`` that are read, relative to ``UCI HAR Dataset/``, signals first."""
    return ([f"{split}/Inertial Signals/{s}_{split}.txt" for s in SIGNALS]
            + [f"{split}/y_{split}.txt", f"{split}/subject_{split}.txt"])


READ = ("activity_labels.txt", *files("train"), *files("test"))


def _limit(name: str) -> int:
    return MAX_MEMBER if "Inertial Signals/" in name else MAX_LABELS


# ------------------------------------------------------------------------------------------ sources


def _unsafe_name(name: str) -> bool:
    """An absolute path, a ``..`` part, a backslash, a NUL or a drive letter: no name the published zip has."""
    return (not name or "\\" in name or "\0" in name or name.startswith("/") or ".." in PurePosixPath(name).parts
            or (len(name) > 1 and name[1] == ":"))


def open_zip(path: Path, sha256: str | None) -> tuple[Callable[[str], bytes], str]:
    """A reader of the files of ``READ`` from the zip at ``path`` (module docstring: the checks),
    and the zip's SHA-256 (checked against ``sha256`` when given)."""
    try:
        with open_regular(path, MAX_SOURCE) as f:
            data = f.read(MAX_SOURCE + 1)
    except FileTooLarge:
        raise BuildError(f"{path} is larger than UCI HAR Dataset.zip can be ({MAX_SOURCE:,} bytes at most; the "
                         "published zip is about 58 MiB)") from None
    except OSError as e:
        raise BuildError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_SOURCE:
        raise BuildError(f"{path} is larger than UCI HAR Dataset.zip can be ({MAX_SOURCE:,} bytes at most)")
    digest = hashlib.sha256(data).hexdigest()
    _check_sha(path, digest, sha256, "the zip's")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise BuildError(f"{path}: not a readable zip file ({e})") from None
    if len(infos) > MAX_MEMBERS:
        raise BuildError(f"{path}: {len(infos):,} members, more than the {MAX_MEMBERS:,} UCI HAR Dataset.zip may hold")
    for info in infos:
        if _unsafe_name(info.filename):
            raise BuildError(f"{path}: member {info.filename!r} is not a relative path inside the archive; refused")
    names = {info.filename: info for info in infos}
    prefix = next((p for p in (f"{ROOT}/", "") if f"{p}{READ[1]}" in names), None)
    if prefix is None:
        raise BuildError(f"{path}: no '{ROOT}/{READ[1]}' in the zip: not UCI HAR Dataset.zip (UCI's download may "
                         f"wrap it in another zip: unzip that one first)")

    def read(name: str) -> bytes:
        info = names.get(prefix + name)
        where = f"{path}: member {prefix}{name}"
        if info is None:
            raise BuildError(f"{path}: no member {prefix}{name}")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise BuildError(f"{where} uses zip compression method {info.compress_type}; only stored and deflate "
                             "members are read")
        if info.file_size > _limit(name):
            raise BuildError(f"{where} declares {info.file_size:,} bytes, more than the {_limit(name):,} such a file "
                             "may hold; refused before inflating it")
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise BuildError(f"{where} declares {info.file_size:,} bytes from {info.compress_size:,} compressed, a "
                             f"ratio over {MAX_RATIO} (a zip bomb, not text); refused before inflating it")
        try:
            with archive.open(info) as member:  # zipfile stops at the declared size and checks the CRC
                raw = member.read(info.file_size + 1)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise BuildError(f"{where}: unreadable ({e})") from None
        if len(raw) != info.file_size:
            raise BuildError(f"{where}: {len(raw):,} bytes, not the {info.file_size:,} it declares")
        return raw

    return read, digest


def open_folder(path: Path) -> Callable[[str], bytes]:
    """A reader of the files of ``READ`` from the extracted folder ``path`` (``UCI HAR Dataset/``
    or the folder that holds it), each a regular file of bounded size."""
    root = path / ROOT if not (path / READ[1]).exists() and (path / ROOT).is_dir() else path

    def read(name: str) -> bytes:
        try:
            return read_regular(root / name, _limit(name))
        except FileNotFoundError:
            raise BuildError(f"{root}: no {name} (expected the '{ROOT}' folder: train/, test/, "
                             "activity_labels.txt)") from None
        except FileTooLarge as e:
            raise BuildError(f"{root / name} is {e.size:,} bytes, more than the {e.limit:,} such a file may "
                             "hold") from None
        except OSError as e:
            raise BuildError(f"cannot read {root / name}: {e.strerror or e}") from None

    return read


def _check_sha(path: Path, digest: str, sha256: str | None, whose: str) -> None:
    if sha256 is not None and digest != sha256.lower():
        raise BuildError(f"{path}: {whose} SHA-256 is {digest}, not the {sha256} given by --sha256")


# ------------------------------------------------------------------------------------------ parsing


def _line_of(data: bytes, pos: int) -> int:
    return data.count(b"\n", 0, pos) + 1


def _lines(data: bytes, where: str, allowed: bytes) -> list[bytes]:
    """The lines of a text file made only of ``allowed`` characters and whitespace (a final newline
    optional); BuildError naming the first other character's line."""
    stray = data.translate(None, allowed + _SPACE)
    if stray:
        pos = next(i for i, c in enumerate(data) if c not in allowed + _SPACE)
        raise BuildError(f"{where}: line {_line_of(data, pos)} holds {chr(data[pos])!r}, which is not part of a number")
    lines = data.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise BuildError(f"{where}: empty")
    return lines


def parse_signal(data: bytes, where: str) -> np.ndarray:
    """[n, 128] float32 from one inertial-signal file: each line exactly 128 finite numbers."""
    lines = _lines(data, where, _NUMBER_CHARS)
    if len(lines) > MAX_WINDOWS:
        raise BuildError(f"{where}: more than {MAX_WINDOWS:,} lines; UCI HAR has at most 7,352")
    tokens: list[bytes] = []
    for n, line in enumerate(lines, 1):
        row = line.split()
        if len(row) != WINDOW:
            raise BuildError(f"{where}: line {n} has {len(row)} numbers, not {WINDOW}")
        if max(map(len, row)) > MAX_NUMBER:
            raise BuildError(f"{where}: line {n} has a number of more than {MAX_NUMBER} characters")
        tokens += row
    try:
        values = np.array(tokens, dtype=f"S{MAX_NUMBER}").astype(np.float64)
    except ValueError:
        k = next(i for i, t in enumerate(tokens) if not _parses(t))
        raise BuildError(f"{where}: line {k // WINDOW + 1}: {tokens[k].decode()!r} is not a number") from None
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused just below
        values32 = values.astype(np.float32)
    if not (np.isfinite(values).all() and np.isfinite(values32).all()):
        k = int(np.flatnonzero(~np.isfinite(values32))[0])
        raise BuildError(f"{where}: line {k // WINDOW + 1}: {tokens[k].decode()!r} is not a finite float32")
    return values32.reshape(len(lines), WINDOW)


def _parses(token: bytes) -> bool:
    try:
        np.array([token]).astype(np.float64)
        return True
    except ValueError:
        return False


def parse_ints(data: bytes, where: str, lo: int, hi: int, what: str) -> np.ndarray:
    """int64 values, one a line, each in ``lo``..``hi`` (``what`` names them in a refusal)."""
    lines = _lines(data, where, b"0123456789")
    if len(lines) > MAX_WINDOWS:
        raise BuildError(f"{where}: more than {MAX_WINDOWS:,} lines; UCI HAR has at most 7,352")
    out = np.empty(len(lines), dtype=np.int64)
    for n, line in enumerate(lines, 1):
        row = line.split()
        if len(row) != 1 or len(row[0]) > 3 or not lo <= int(row[0]) <= hi:
            raise BuildError(f"{where}: line {n} is {line.strip().decode()[:40]!r}, not one {what} {lo}-{hi}")
        out[n - 1] = int(row[0])
    return out


def check_activity_labels(data: bytes, where: str) -> None:
    """``activity_labels.txt`` must map 1-6 to the published activities in order."""
    try:
        rows = [line.split() for line in data.decode("ascii").splitlines() if line.strip()]
    except UnicodeDecodeError:
        rows = []
    expected = [[str(i), name] for i, name in enumerate(PUBLISHED_LABELS, 1)]
    if rows != expected:
        raise BuildError(f"{where}: not the published activities ('1 WALKING' ... '6 LAYING', one a line)")


def read_split(read: Callable[[str], bytes], split: str, where: str, digests: dict[str, str]) -> dict[str, np.ndarray]:
    """One split's windows [n, 9, 1, 128] float32, labels 0-5 and subjects, every file checked;
    each file's SHA-256 goes into ``digests``."""

    def get(name: str) -> bytes:
        raw = read(name)
        digests[name] = hashlib.sha256(raw).hexdigest()
        return raw

    names = files(split)
    signals = [parse_signal(get(n), f"{where}/{n}") for n in names[:len(SIGNALS)]]
    y = parse_ints(get(names[-2]), f"{where}/{names[-2]}", 1, len(ACTIVITIES), "activity")
    subject = parse_ints(get(names[-1]), f"{where}/{names[-1]}", 1, SUBJECTS, "subject")
    for name, rows in zip(names, [len(s) for s in signals] + [len(y), len(subject)]):
        if rows != len(y):
            raise BuildError(f"{where}/{name} has {rows:,} rows but {names[-2]} has {len(y):,}: the files of "
                             f"{split}/ must agree (a truncated file?)")
    return {"x": np.stack(signals, axis=1)[:, :, None, :], "y": y - 1, "subject": subject}


def convert(read: Callable[[str], bytes], where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The cache's arrays and each file's SHA-256: training windows sorted (stably) by subject, each
    with its client (the training subjects in increasing id order, 0-based); test windows as published."""
    digests: dict[str, str] = {}
    raw = read(READ[0])
    digests[READ[0]] = hashlib.sha256(raw).hexdigest()
    check_activity_labels(raw, f"{where}/{READ[0]}")
    train, test = (read_split(read, s, where, digests) for s in SPLITS)
    shared = sorted(set(train["subject"].tolist()) & set(test["subject"].tolist()))
    if shared:
        raise BuildError(f"{where}: subjects {shared} are in both train/ and test/; UCI HAR's test subjects are "
                         "other people")
    order = np.argsort(train["subject"], kind="stable")
    subjects, client = np.unique(train["subject"][order], return_inverse=True)
    arrays = {"train_x": train["x"][order], "train_y": train["y"][order], "train_subject": train["subject"][order],
              "train_client": client.astype(np.int64), "test_x": test["x"], "test_y": test["y"],
              "test_subject": test["subject"]}
    return arrays, digests


def content_sha256(digests: dict[str, str]) -> str:
    """The SHA-256 of the files read, listed as ``sha256sum`` prints them (sorted by name): the same
    for the zip and for the folder it unpacks to."""
    listing = "".join(f"{digests[n]}  {n}\n" for n in sorted(digests))
    return hashlib.sha256(listing.encode()).hexdigest()


def build(source: Path, data_dir: Path, sha256: str | None = None) -> dict[str, Any]:
    """Write ``data_dir/uci-har/uci-har.npz`` and ``SOURCE.json`` from ``source`` (the zip or the
    folder); return what SOURCE.json says. Everything is read and checked before the folder is
    claimed (``locks.hold``: a second build at the same time is refused); both files are written
    atomically."""
    source = Path(source)
    if source.is_dir():
        read, zip_digest = open_folder(source), None
    elif source.exists():
        read, zip_digest = open_zip(source, sha256)
    else:
        raise BuildError(f"no such file or folder: {source}")
    arrays, digests = convert(read, str(source))
    content = content_sha256(digests)
    if zip_digest is None:
        _check_sha(source, content, sha256, "the folder's content")
    target = Path(data_dir) / FOLDER
    info = {
        "built_by": "hfl-bench prepare uci-har",
        "source": "UCI HAR Dataset (https://archive.ics.uci.edu/dataset/240, CC BY 4.0), the "
                  + ("zip" if zip_digest else "extracted folder"),
        "zip_sha256": zip_digest,
        "content_sha256": content,
        "sha256_checked": sha256 is not None,
        "files_sha256": dict(sorted(digests.items())),
        "users": [int(s) for s in np.unique(arrays["train_subject"])],
        "test_subjects": [int(s) for s in np.unique(arrays["test_subject"])],
        "windows": {"train": len(arrays["train_y"]), "test": len(arrays["test_y"]),
                    "per_client": [int(n) for n in np.bincount(arrays["train_client"])]},
    }
    write_cache(target, CACHE, arrays, SOURCE_FILE, info)
    return info
