"""Build the ``fashion-mnist`` task's cache from Fashion-MNIST's four gzipped IDX files, as Debian's
package ``dataset-fashion-mnist`` (0.0~git20200523.55506a9-1) installs them in
``/usr/share/datasets/fashion-mnist/`` and Zalando's own download names them:
``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``. The source is the folder that holds them or
the ``.deb`` itself (an ``ar`` archive whose ``data.tar.xz`` holds them; read here with the
standard library, nothing unpacked to disk).

What is checked. Each file is read as a regular file of at most ``MAX_GZ`` bytes and decompressed
up to the exact size its IDX header can give (``MAX_IDX``). The SHA-256 of the decompressed IDX
bytes must be the one measured on the .deb's files (``IDX_SHA256``; ``--sha256 NAME=HEX`` names
another, for files written in the same format). The pins are of the IDX bytes, not of the .gz files,
because the .deb's .gz files are not Zalando's bytes: the MD5s in Zalando's README (shipped in the
.deb as README.md.gz) do not match them; Debian's build rewrote the gzip headers (no file name,
mtime 2020-06-05), and each .deb file is shorter than Zalando's published size by exactly its
file-name field. Zalando's files are expected to decompress to the same IDX bytes (not checked
here: no copy of them was at hand). The .gz files' own SHA-256s go into SOURCE.json.

IDX is parsed strictly: magic 2051 (images: uint8, 3 dimensions, 28 x 28) or 2049 (labels:
uint8, 1 dimension), big-endian counts, exactly the bytes the header declares, labels 0-9, as
many labels as images, at most 60,000 training and 10,000 test items.

A .deb is read bounded: at most ``MAX_DEB`` bytes, its ``ar`` members' sizes checked against the
file, ``data.tar.xz`` read as a stream of at most ``MAX_TAR_MEMBERS`` members declaring at most
``MAX_TAR_BYTES`` together; a member whose name (or link target) is absolute or climbs out with
``..`` is refused, and so is the archive; the four files must be regular members, once each.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import struct
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from hfl_bench.preparing import BuildError, write_cache
from hfl_bench.regularfile import FileTooLarge, open_regular

FOLDER = "fashion-mnist"
CACHE = "fashion-mnist.npz"
SOURCE_FILE = "SOURCE.json"
SIZE = 28
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
SPLITS = {"train": "train", "test": "t10k"}  # our split name: the files' prefix
MAX_ITEMS = {"train": 60_000, "test": 10_000}
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
# The four files, by the name the user gives to --sha256 (the .gz name without .gz).
FILES = tuple(f"{prefix}-{kind}-ubyte" for prefix in SPLITS.values() for kind in ("images-idx3", "labels-idx1"))
# SHA-256 of each file's decompressed IDX bytes, measured on the files of Debian's
# dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb (2026-12-06; module docstring: why not the .gz's).
IDX_SHA256 = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
# The same .deb's .gz files (what SOURCE.json records of a build from it).
DEB_GZ_SHA256 = {
    "train-images-idx3-ubyte": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
DEB_DIR = "usr/share/datasets/fashion-mnist"
MAX_GZ = 64 * 2**20  # the largest, train-images, is 26.4 MB
MAX_IDX = 16 + MAX_ITEMS["train"] * SIZE * SIZE  # train-images decompressed: 47,040,016 bytes
MAX_DEB = 128 * 2**20  # the package is 30.9 MB
MAX_TAR_MEMBERS = 1_000  # the package's data.tar.xz holds 22
MAX_TAR_BYTES = 256 * 2**20  # its members declare 31 MB together




def _bounded_read(path: Path, limit: int, what: str) -> bytes:
    try:
        with open_regular(path, limit) as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise BuildError(f"no such file: {path}") from None
    except FileTooLarge as e:
        raise BuildError(f"{path} is {e.size:,} bytes, more than {what} can be ({limit:,} at most)") from None
    except OSError as e:
        raise BuildError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > limit:
        raise BuildError(f"{path} grew past {limit:,} bytes while it was read")
    return raw


# --------------------------------------------------------------------------- the .deb


def _ar_members(raw: bytes, where: str) -> dict[str, bytes]:
    """The members of an ``ar`` archive (a .deb) by name, each header and size checked."""
    if not raw.startswith(b"!<arch>\n"):
        raise BuildError(f"{where}: not a .deb (no ar archive header); --from takes the .deb or the folder of the "
                         "four .gz files")
    members: dict[str, bytes] = {}
    pos = 8
    while pos < len(raw):
        header = raw[pos:pos + 60]
        if len(header) < 60 or header[58:60] != b"`\n":
            raise BuildError(f"{where}: a truncated or damaged ar member header at byte {pos}")
        try:
            name = header[:16].decode("ascii").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise BuildError(f"{where}: an unreadable ar member header at byte {pos}") from None
        start = pos + 60
        if size < 0 or start + size > len(raw):
            raise BuildError(f"{where}: ar member {name!r} declares {size:,} bytes, past the end of the file")
        if name in members:
            raise BuildError(f"{where}: ar member {name!r} appears twice")
        members[name] = raw[start:start + size]
        pos = start + size + (size & 1)  # members start on even offsets
    return members


def _unsafe(name: str) -> bool:
    return name.startswith("/") or ".." in PurePosixPath(name).parts


def read_deb(path: Path) -> dict[str, bytes]:
    """The four .gz files' bytes from the .deb at ``path`` (module docstring: the bounds)."""
    raw = _bounded_read(path, MAX_DEB, "the dataset-fashion-mnist package")
    members = _ar_members(raw, str(path))
    if "data.tar.xz" not in members:
        raise BuildError(f"{path}: no data.tar.xz member (members: {', '.join(sorted(members)) or 'none'})")
    wanted = {f"{DEB_DIR}/{name}.gz": name for name in FILES}
    found: dict[str, bytes] = {}
    count = declared = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(members["data.tar.xz"]), mode="r|xz") as tar:
            for member in tar:
                count += 1
                declared += max(member.size, 0)
                if count > MAX_TAR_MEMBERS or declared > MAX_TAR_BYTES:
                    raise BuildError(f"{path}: data.tar.xz holds more than {MAX_TAR_MEMBERS:,} members or "
                                     f"{MAX_TAR_BYTES:,} bytes: not the dataset-fashion-mnist package")
                if _unsafe(member.name) or (member.issym() or member.islnk()) and _unsafe(member.linkname):
                    raise BuildError(f"{path}: data.tar.xz member {member.name!r} leads outside the archive; "
                                     "refused")
                name = member.name[2:] if member.name.startswith("./") else member.name
                if name not in wanted:
                    continue
                if not member.isfile():
                    raise BuildError(f"{path}: data.tar.xz member {member.name!r} is not a regular file")
                if wanted[name] in found:
                    raise BuildError(f"{path}: data.tar.xz holds {member.name!r} twice")
                if member.size > MAX_GZ:
                    raise BuildError(f"{path}: data.tar.xz member {member.name!r} declares {member.size:,} bytes, "
                                     f"more than such a file can be ({MAX_GZ:,} at most)")
                f = tar.extractfile(member)
                assert f is not None  # a regular member
                found[wanted[name]] = f.read(member.size)
    except BuildError:
        raise
    except (tarfile.TarError, lzma.LZMAError, OSError, EOFError) as e:
        raise BuildError(f"{path}: data.tar.xz is not a readable tar.xz ({type(e).__name__}: {e})") from None
    missing = [f"{DEB_DIR}/{name}.gz" for name in FILES if name not in found]
    if missing:
        raise BuildError(f"{path}: data.tar.xz has no {', '.join(missing)}: not the dataset-fashion-mnist package")
    return found


def read_folder(folder: Path) -> dict[str, bytes]:
    """The four .gz files' bytes from ``folder``."""
    return {name: _bounded_read(folder / f"{name}.gz", MAX_GZ, f"{name}.gz") for name in FILES}


# --------------------------------------------------------------------------- IDX


def decompress(gz: bytes, where: str) -> bytes:
    """The IDX bytes of one .gz file, at most MAX_IDX of them (more: refused, nothing more inflated)."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(gz)) as g:
            data = g.read(MAX_IDX + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise BuildError(f"{where}: not a readable gzip file ({e})") from None
    if len(data) > MAX_IDX:
        raise BuildError(f"{where} decompresses to more than {MAX_IDX:,} bytes, more than a Fashion-MNIST file holds")
    return data


def parse_images(data: bytes, where: str, max_items: int) -> np.ndarray:
    """uint8 [n, 1, 28, 28] from IDX image bytes (magic 2051, dims n x 28 x 28, exactly n*784 bytes after)."""
    if len(data) < 16:
        raise BuildError(f"{where}: {len(data)} bytes, shorter than an IDX image header (16)")
    magic, n, rows, cols = struct.unpack(">iiii", data[:16])
    if magic != IMAGES_MAGIC:
        raise BuildError(f"{where}: magic number {magic}, not {IMAGES_MAGIC} (IDX unsigned-byte images)")
    if (rows, cols) != (SIZE, SIZE) or not 0 < n <= max_items:
        raise BuildError(f"{where}: declares {n:,} images of {rows}x{cols}; Fashion-MNIST has at most {max_items:,} "
                         f"of {SIZE}x{SIZE}")
    expected = 16 + n * SIZE * SIZE
    if len(data) != expected:
        raise BuildError(f"{where}: {len(data):,} bytes, but its header declares {n:,} images: {expected:,} bytes")
    return np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, SIZE, SIZE).copy()


def parse_labels(data: bytes, where: str, max_items: int) -> np.ndarray:
    """uint8 [n] from IDX label bytes (magic 2049, exactly n bytes after, each 0-9)."""
    if len(data) < 8:
        raise BuildError(f"{where}: {len(data)} bytes, shorter than an IDX label header (8)")
    magic, n = struct.unpack(">ii", data[:8])
    if magic != LABELS_MAGIC:
        raise BuildError(f"{where}: magic number {magic}, not {LABELS_MAGIC} (IDX unsigned-byte labels)")
    if not 0 < n <= max_items:
        raise BuildError(f"{where}: declares {n:,} labels; Fashion-MNIST has at most {max_items:,}")
    if len(data) != 8 + n:
        raise BuildError(f"{where}: {len(data):,} bytes, but its header declares {n:,} labels: {8 + n:,} bytes")
    labels = np.frombuffer(data, np.uint8, offset=8).copy()
    if labels.max() >= len(CLASSES):
        bad = int(np.argmax(labels >= len(CLASSES)))
        raise BuildError(f"{where}: label {int(labels[bad])} at item {bad:,}; Fashion-MNIST's are 0-9")
    return labels


def parse_sha256_overrides(values: list[str]) -> dict[str, str]:
    """``NAME=HEX`` items (--sha256) as {file: digest}; BuildError naming a bad one."""
    out: dict[str, str] = {}
    for item in values:
        name, sep, digest = item.partition("=")
        name = name.strip().removesuffix(".gz")
        if not sep or name not in FILES:
            raise BuildError(f"--sha256 {item!r}: expected NAME=HEX with NAME one of {', '.join(FILES)}")
        if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise BuildError(f"--sha256 {item!r}: {digest!r} is not 64 hexadecimal digits")
        out[name] = digest.lower()
    return out


def convert(gz_files: dict[str, bytes], where: str, expected: dict[str, str]) -> dict[str, np.ndarray]:
    """The cache's arrays from the four .gz files' bytes, each checked (module docstring)."""
    idx: dict[str, bytes] = {}
    for name in FILES:
        data = decompress(gz_files[name], f"{where}: {name}.gz")
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected[name]:
            raise BuildError(f"{where}: {name}.gz decompresses to SHA-256 {digest}, not the expected {expected[name]} "
                             "(Fashion-MNIST as Debian's dataset-fashion-mnist 0.0~git20200523.55506a9-1 ships it)")
        idx[name] = data
    out: dict[str, np.ndarray] = {}
    for split, prefix in SPLITS.items():
        images, labels = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
        x = parse_images(idx.pop(images), f"{where}: {images}.gz", MAX_ITEMS[split])
        y = parse_labels(idx.pop(labels), f"{where}: {labels}.gz", MAX_ITEMS[split])
        if len(x) != len(y):
            raise BuildError(f"{where}: {images}.gz holds {len(x):,} images but {labels}.gz {len(y):,} labels")
        out[f"{split}_x"], out[f"{split}_y"] = x, y
    return out


# --------------------------------------------------------------------------- the build


def build(source: Path, data_dir: Path, sha256: dict[str, str] | None = None) -> dict[str, Any]:
    """Write ``data_dir/fashion-mnist/fashion-mnist.npz`` and ``SOURCE.json`` from ``source`` (the
    folder of the four files, or the .deb); return what SOURCE.json says. Everything is read and
    checked before the folder is claimed (``locks.hold``: a second build at the same time is
    refused); both files are written atomically (an existing cache is replaced)."""
    source = Path(source)
    expected = {**IDX_SHA256, **(sha256 or {})}
    if source.is_dir():
        gz_files, kind = read_folder(source), "folder"
    elif source.exists():
        gz_files, kind = read_deb(source), "deb"
    else:
        raise BuildError(f"no such file or folder: {source}")
    arrays = convert(gz_files, str(source), expected)
    target = Path(data_dir) / FOLDER
    info = {
        "built_by": "hfl-bench prepare fashion-mnist",
        "source": ("Fashion-MNIST (Zalando Research, MIT), the four gzipped IDX files"
                   + (" of a .deb (Debian's dataset-fashion-mnist)" if kind == "deb" else " of a folder")),
        "gz_sha256": {name: hashlib.sha256(gz_files[name]).hexdigest() for name in FILES},
        "idx_sha256": {name: expected[name] for name in FILES},
        "images": {split: len(arrays[f"{split}_y"]) for split in SPLITS},
        "per_class": {split: np.bincount(arrays[f"{split}_y"], minlength=len(CLASSES)).tolist() for split in SPLITS},
    }
    write_cache(target, CACHE, arrays, SOURCE_FILE, info)
    return info
