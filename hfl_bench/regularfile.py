"""Opening a file the suite reads without trusting what is at its path: a checkpoint, a cache (the
encoder cache, the data fingerprints, the metadata index, a decode cache), a data file, a settings
file, a dataset release.

Anything may sit at a path: a FIFO (an open for reading waits for a writer, for ever), a link to
``/dev/zero`` (a read never ends: memory runs out), a folder, a socket, a device. ``open_regular``
opens non-blocking (a FIFO's open returns at once), then checks on the open descriptor (``fstat``:
nothing swapped in between a check and the open is read) that it is a regular file, of at most
``max_bytes`` when given; only then are reads blocking again. ``read_regular`` reads one whole,
never more than its bound, even when the file grows meanwhile.

Every refusal is an OSError (``NotRegularFile``, ``FileTooLarge``, or the open's own), so a cache's
reader that takes any OSError as a miss needs nothing more, and a data reader words it as it words
any unreadable file. Standard library only: the metadata index reads through this before anything
heavy is imported.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


class NotRegularFile(OSError):
    """Something other than a regular file at a path that should hold one; ``kind`` says what."""

    def __init__(self, path: str | os.PathLike, kind: str):
        super().__init__(f"{os.fspath(path)} is not a regular file (a {kind})")
        self.path, self.kind = os.fspath(path), kind


class FileTooLarge(OSError):
    """A regular file larger than its reader's bound: no file of that kind is so large."""

    def __init__(self, path: str | os.PathLike, size: int, limit: int):
        super().__init__(f"{os.fspath(path)} is {size:,} bytes, more than the {limit:,} such a file may hold")
        self.path, self.size, self.limit = os.fspath(path), size, limit


def file_kind(mode: int) -> str:
    """What a non-regular ``st_mode`` is, in words ("FIFO", "folder", ...)."""
    for test, kind in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "folder"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def open_regular(path: str | os.PathLike, max_bytes: int | None = None) -> BinaryIO:
    """``path`` open for binary reading, once it is a regular file of at most ``max_bytes`` (None:
    any size); NotRegularFile, FileTooLarge or the open's OSError (FileNotFoundError, ...) else.
    Symbolic links are followed: what they lead to is what is checked."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, file_kind(st.st_mode))
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileTooLarge(path, st.st_size, max_bytes)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: plain reads from here
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path`` (``open_regular``), at most ``max_bytes`` of them:
    FileTooLarge when it holds more, even if it grew after the check."""
    with open_regular(path, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLarge(path, len(data), max_bytes)
    return data
