"""Locks on record files: one writer per record path at a time (``leaderboard claims`` is the
claims page of the seed papers, in ``results/claims.py``: another thing).

A run (``hfl-bench run``, or a matrix driver for each cell it runs) claims its record path before
training and holds the claim until the record is written: an exclusive, non-blocking ``flock`` on
``<out>/.claims/<record stem>.lock``. A second run of the same identity into the same folder (the
same config run twice at once, or the same config on other data: its record file name is the
same) cannot take it and is refused in one line, before any training; it never writes over the
first one's record. The kernel drops a lock when its process ends, however it ends (SIGKILL, the
out-of-memory killer), so a killed run leaves no claim that blocks the next one: the lock file
may stay behind, but it is free. The file holds the holder's pid, host and start time, for the
message only.

The same lock (``hold``) keeps two ``hfl-bench prepare`` builds of one data folder apart
(``<data-dir>/.claims/<folder>.lock``): the second is refused in one line while the first builds.

Locks are per host: on a network file system whose ``flock`` is not shared between machines,
runs on two hosts into one folder are not kept apart (give each host its own ``--out``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import stat
from pathlib import Path
from typing import Callable, Optional

from hfl_bench.config import ConfigError
from hfl_bench.regularfile import read_regular

try:
    import fcntl
except ImportError:  # not POSIX: no claims (documented in the guide)
    fcntl = None  # type: ignore[assignment]


class ClaimError(ConfigError):
    """The record path is claimed by a running process; the message is meant for the user."""


def claim_file(record: Path) -> Path:
    """The lock file of the record file ``record``."""
    return record.parent / ".claims" / f"{record.stem}.lock"


class Claim:
    """A held claim on one record path; ``release`` (or the process ending) frees it."""

    def __init__(self, record: Path, fd: Optional[int], path: Path):
        self.record, self.fd, self.path = record, fd, path

    def release(self) -> None:
        if self.fd is None:
            return
        try:  # unlink while still holding it: a waiter that opened it re-checks the inode
            if _same_file(self.path, self.fd):
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        try:  # leave no empty .claims folder behind (a taker that loses this race retries)
            self.path.parent.rmdir()
        except OSError:
            pass

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(path: Path, fd: int) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _holder(path: Path) -> str:
    try:
        info = json.loads(read_regular(path, 4096))  # the holder's few fields; never a FIFO swapped in
        return f"pid {int(info['pid'])} on {str(info['host'])[:64]} since {str(info['date'])[:32]}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _wrong_kind(path: Path, should: str, but: str, what: str = "the record") -> str:
    return (f"cannot claim {what}: {path} should be {should} (or absent) but is {but}; "
            "remove it (no process holds it) and rerun")


def take(record: Path) -> Claim:
    """Claim ``record`` (a record file path) for this process: ClaimError, one line, when a
    running process holds it. Call before training; release after the record is written."""
    return hold(record, "the record", lambda holder: (
        f"{record} is being written by another run of this configuration ({holder}): wait for it to "
        "finish, or use another --out"))


def hold(target: Path, what: str, busy: Callable[[str], str]) -> Claim:
    """Claim ``target`` (a path one process at a time may write: a record file, a data folder
    ``hfl-bench prepare`` builds) for this process, by the lock file ``claim_file(target)``:
    ClaimError, one line, when a running process holds it (``busy(holder)``: the message, given
    the holder's pid, host and start) or something else is at the lock's path (``what``: what the
    message says could not be claimed)."""
    if fcntl is None:
        return Claim(target, None, claim_file(target))
    path = claim_file(target)
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where the .claims folder goes
            raise ClaimError(_wrong_kind(path.parent, "a folder", "a file", what)) from None
        try:
            # non-blocking: the open itself must never wait (on a FIFO put there, say)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)
        except FileNotFoundError:  # the folder was removed by a releasing holder: again
            continue
        except IsADirectoryError:
            raise ClaimError(_wrong_kind(path, "a lock file", "a folder", what)) from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # a FIFO or a device: no place for the holder's details
            os.close(fd)
            raise ClaimError(_wrong_kind(path, "a lock file", "not a regular file", what))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ClaimError(busy(_holder(path))) from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(path, fd):  # else the holder released (and unlinked) it between open and lock
            break
        os.close(fd)
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    return Claim(target, fd, path)
