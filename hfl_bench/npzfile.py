"""Reading ``.npz`` archives from a data folder within a decompression budget.

A compressed member can expand a thousandfold (a 2 MB file to gigabytes), so no member is
decompressed before its declared sizes are checked against what the task expects of it:

- the zip entry's declared uncompressed size (``file_size``) must be within the member's budget.
  Python's ``zipfile`` stops a member's stream at that size whatever the compressed data holds, and
  inflates deflate data in small chunks, so at most the budget comes out of it;
- only stored and deflate members are read (what ``np.savez`` and ``np.savez_compressed`` write):
  ``zipfile`` inflates a bzip2 or LZMA chunk whole, without a limit;
- an array member's ``.npy`` header (read with numpy's header readers, before any data) must give
  the expected kind of values, shape and at most the expected number of rows; numpy then reads
  exactly the declared bytes, in chunks. Pickled (object) arrays are refused.

The file itself is opened only as a regular file (``hfl_bench.regularfile``: non-blocking, checked
on the open descriptor, so a FIFO or a link to ``/dev/zero`` at the path is refused, never waited
on or read) of at most ``file_limit`` bytes: twice its members' budgets and a margin.

A file over its budget is refused in one line (``DatasetError``) naming the file, the member, the
sizes and the budget. Other failures (a truncated or garbage file, a missing member) propagate as
they are, for the caller to word as its task words a bad file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import zipfile
from pathlib import Path
from typing import IO, Iterator

import numpy as np

from hfl_bench.errors import DatasetError
from hfl_bench.regularfile import FileTooLarge, NotRegularFile, open_regular

# What np.savez (stored) and np.savez_compressed (deflate) write; zipfile inflates only these in bounded chunks.
READABLE_COMPRESSION = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}
# A .npy member's magic, header length and header: numpy refuses headers over 10,000 bytes itself.
NPY_HEADER_BYTES = 10_240
# Beyond twice the members' budgets, what an .npz file may hold: the zip's own headers and directory.
ZIP_MARGIN = 1 << 20


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """What a task expects of one array member: value kinds (numpy dtype kinds, e.g. "u" or "fiu"),
    the shape of one row (``None``: a 0-d array; a ``None`` dimension: any size), at most
    ``max_rows`` rows, ``max_itemsize`` bytes a value and, when given, ``max_bytes`` in all. Its
    budget is the largest such array in bytes (``max_bytes`` is required when a dimension is free)."""

    kinds: str
    row_shape: tuple[int | None, ...] | None
    max_rows: int = 1
    max_itemsize: int = 8
    max_bytes: int | None = None

    @property
    def budget(self) -> int:
        if self.row_shape is None:
            return self.max_itemsize
        caps = [] if self.max_bytes is None else [self.max_bytes]
        if None not in self.row_shape:
            caps.append(self.max_rows * math.prod(self.row_shape) * self.max_itemsize)  # type: ignore[arg-type]
        return min(caps)


def open_member(archive: zipfile.ZipFile, name: str, limit: int, path: Path, task: str) -> IO[bytes]:
    """The stream of member ``name`` once its declared uncompressed size is at most ``limit`` bytes
    and its compression one zipfile inflates in bounded chunks (module docstring). KeyError when absent."""
    info = archive.getinfo(name)
    if info.compress_type not in READABLE_COMPRESSION:
        raise DatasetError(f"{task}: {path}: member {name} uses zip compression method {info.compress_type}; "
                           "only stored and deflate members (as numpy writes them) are read")
    if info.file_size > limit:
        raise DatasetError(f"{task}: {path}: member {name} declares {human_bytes(info.file_size)} uncompressed, over "
                           f"this task's budget of {human_bytes(limit)}; refused before decompressing it")
    return archive.open(info)


def file_limit(budget: int) -> int:
    """The largest .npz file a reader of ``budget`` bytes of members opens: twice the budget (a
    member it does not read may sit beside the others, as PathMNIST's val split does; deflate
    grows no member by much) and ``ZIP_MARGIN``."""
    return 2 * budget + ZIP_MARGIN


class UnusableFile(DatasetError):
    """What is at an npz path is no regular file of a bounded size (``open_npz``): a cache reader
    takes it as a miss and says so; a data reader lets the one line through."""


@contextlib.contextmanager
def open_npz(path: Path, max_bytes: int | None, task: str) -> Iterator[zipfile.ZipFile]:
    """The zip archive at ``path``, once it is a regular file of at most ``max_bytes`` (None: any
    size; ``regularfile.open_regular``): UnusableFile in one line naming the file otherwise. The
    open's own errors (FileNotFoundError, ...) and a bad zip propagate, for the caller to word."""
    try:
        f = open_regular(path, max_bytes)
    except NotRegularFile as e:
        raise UnusableFile(f"{task}: {path} is not a regular file (a {e.kind}); replace it with the data file") \
            from None
    except FileTooLarge as e:
        raise UnusableFile(f"{task}: {path} is {human_bytes(e.size)}, more than this task's data file may be "
                           f"({human_bytes(e.limit)}); refused before reading it") from None
    with f, zipfile.ZipFile(f) as archive:  # a ZipFile given a file leaves closing it to its owner
        yield archive


def declared_size(path: Path, name: str) -> int:
    """Member ``name``'s declared uncompressed size, from the zip's directory (nothing is inflated)."""
    with open_npz(path, None, "npz") as archive:
        return archive.getinfo(name).file_size


def read_arrays(path: Path, specs: dict[str, ArraySpec], task: str) -> dict[str, np.ndarray]:
    """The arrays ``specs`` names (keys without ``.npy``) from the npz at ``path``, each checked
    against its spec before any of its data is read (module docstring)."""
    budget = sum(spec.budget + NPY_HEADER_BYTES for spec in specs.values())
    with open_npz(path, file_limit(budget), task) as archive:
        return {key: _read_array(archive, key, spec, path, task) for key, spec in specs.items()}


def _read_array(archive: zipfile.ZipFile, key: str, spec: ArraySpec, path: Path, task: str) -> np.ndarray:
    name = f"{key}.npy"
    with open_member(archive, name, spec.budget + NPY_HEADER_BYTES, path, task) as member:
        shape, dtype = read_npy_header(member)
    _check_header(shape, dtype, spec, f"{task}: {path}: member {name}")
    with archive.open(name) as member:  # again from the start: numpy's reader parses the header itself
        return np.lib.format.read_array(member, allow_pickle=False)


def read_npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a ``.npy`` stream's header, with numpy's readers; no data is read."""
    version = np.lib.format.read_magic(stream)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"unsupported .npy format version {version}")
    shape, _, dtype = readers[version](stream)
    return shape, dtype


def _check_header(shape: tuple[int, ...], dtype: np.dtype, spec: ArraySpec, where: str) -> None:
    if dtype.hasobject:  # a pickle: it could run code, and its size is not in the header
        raise DatasetError(f"{where} holds pickled objects; only numeric arrays are read")
    if dtype.kind not in spec.kinds or dtype.itemsize > spec.max_itemsize:
        raise DatasetError(f"{where} holds {dtype} values, expected kind {spec.kinds!r} of at most "
                           f"{spec.max_itemsize} bytes")
    if spec.row_shape is None:
        fits, expected = shape == (), "a single value"
    else:
        fits = len(shape) == 1 + len(spec.row_shape) and all(
            want is None or got == want for got, want in zip(shape[1:], spec.row_shape))
        expected = f"shape [n{''.join(f', {d}' for d in spec.row_shape)}]".replace("None", "any")
    if not fits:
        raise DatasetError(f"{where} has shape {list(shape)}, expected {expected}")
    size = math.prod(shape) * dtype.itemsize
    if spec.row_shape is not None and (shape[0] > spec.max_rows or size > spec.budget):
        raise DatasetError(f"{where} declares {shape[0]:,} rows ({human_bytes(size)}), over this task's budget "
                           f"of {spec.max_rows:,} rows and {human_bytes(spec.budget)}; refused before decompressing it")


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:,} bytes"
