"""Where things are written: record and checkpoint names, the output folder check, the folder a
record goes to when its own folder cannot take it, and the one atomic writer.

Record file names are built only from checked parts: task and method names matching
``NAME_PATTERN`` (letters, digits, ``.``, ``_``, ``-``; starting with a letter or digit), a hex
config hash and an integer seed, and the final path must resolve inside the output folder, so no
name (a suite's ``x/../../elsewhere``, a plugin's) can place a file anywhere else.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.confighash import config_hash

# A task or method name that may be part of a file name.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
NAME_MAX = 100
_NAME = re.compile(NAME_PATTERN)
_HASH = re.compile(r"[0-9a-f]{1,64}")
log = logging.getLogger(__name__)


class UnsafePathError(ConfigError):
    """A name that cannot be part of a file name, or a path that would land outside its folder;
    the message is meant for the user."""


class OutDirError(ConfigError):
    """An output folder that cannot take records (a file, or not writable); the message is meant
    for the user."""


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a name a file may be called by (``NAME_PATTERN``), else UnsafePathError."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > NAME_MAX:
        raise UnsafePathError(
            f"{what} name {value!r} cannot name a record file: use letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit (at most {NAME_MAX} characters)")
    return value


# Config fields that name a folder of the machine that ran. A record stores them without that
# machine's layout (they are not part of the config hash: config.NON_SEMANTIC): a path inside the
# working folder relative to it, any other absolute path by its role (the data's identity is the
# record's ``task.data_fingerprint``).
PATH_ROLES = {"out": "<out folder>", "data_dir": "<data folder>", "client_state_dir": "<client state folder>"}


def portable_path(value: Any, role: str, cwd: str | Path | None = None) -> Any:
    """``value`` as a record stores it: None and relative paths as given, an absolute path inside
    ``cwd`` (default: the working folder) relative to it, any other absolute path as ``role``."""
    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    root = Path(cwd if cwd is not None else Path.cwd()).resolve()
    try:
        return Path(value).resolve().relative_to(root).as_posix()
    except ValueError:
        return role


def portable_config(cfg_dict: dict[str, Any], cwd: str | Path | None = None) -> dict[str, Any]:
    """A config dict with its path fields (``PATH_ROLES``) as a record stores them."""
    return {k: portable_path(v, PATH_ROLES[k], cwd) if k in PATH_ROLES else v for k, v in cfg_dict.items()}


def record_stem(task: str, method: str, chash: str, seed: int | None) -> str:
    """``<task>__<method>__<config hash>__seed<S>``, from checked parts (UnsafePathError otherwise).
    The seed is None only for a cell that failed before its task's default seed was known."""
    check_name(task, "task")
    check_name(method, "method")
    if not isinstance(chash, str) or not _HASH.fullmatch(chash):
        raise UnsafePathError(f"config hash {chash!r} is not a hex string")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise UnsafePathError(f"seed {seed!r} is not an integer")
    return f"{task}__{method}__{chash}__seed{seed}"


def inside(folder: str | Path, name: str) -> Path:
    """``folder / name``, checked to resolve inside ``folder`` (symbolic links followed)."""
    folder = Path(folder)
    path = folder / name
    root = folder.resolve()
    if path.resolve().parent != root or Path(name).name != name:
        raise UnsafePathError(f"{path} would resolve outside the output folder {folder}")
    return path


def record_filename(record: dict[str, Any]) -> str:
    """``<task>__<method>__<config hash>__seed<S>.json`` of a record."""
    cfg = record.get("config") or {}
    return f"{record_stem(cfg.get('task'), cfg.get('method'), record.get('config_hash'), cfg.get('seed'))}.json"


def record_path(cfg: RunConfig, chash: str | None = None) -> Path:
    """Where the record of a (resolved) config is written: ``<out>/<task>__<method>__<hash>__seed<S>.json``
    (``chash``: the config's hash when the caller has it)."""
    chash = chash if chash is not None else config_hash(dataclasses.asdict(cfg))
    stem = record_stem(cfg.task, cfg.method, chash, cfg.seed)
    return inside(cfg.out, f"{stem}.json")


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """What a resolved config is named by (``run_files``): its hash, its record and checkpoint
    files, and the config as its record stores it (``portable_config``)."""

    config_hash: str
    record: Path
    checkpoint: Path
    portable_config: dict[str, Any]


def run_files(cfg: RunConfig) -> RunFiles:
    """The ``RunFiles`` of a resolved config (UnsafePathError for a name that cannot name a file)."""
    cfg_dict = dataclasses.asdict(cfg)
    chash = config_hash(cfg_dict)
    record = record_path(cfg, chash)
    return RunFiles(chash, record, checkpoint_for(record), portable_config(cfg_dict))


def checkpoint_path(cfg: RunConfig) -> Path:
    """Where a run's checkpoint is kept: ``<out>/.checkpoints/<record file stem>.pt``."""
    record = record_path(cfg)
    return checkpoint_for(record)


# The experiment trackers' files in a record folder (``<out>/trackers/<tracker>/``, ``hfl_bench.trackers``):
# they may hold copies of records (an artifact), so the record walker leaves them out; only those:
# a folder that happens to be named ``trackers`` (``--out study/trackers``) holds records like any.
TRACKER_FOLDER = "trackers"
TRACKER_OUTPUTS = ("tensorboard", "mlruns", "wandb")  # what each tracker writes under TRACKER_FOLDER


def in_tracker_output(parts: tuple[str, ...]) -> bool:
    """Whether a path (its folder names, relative to a searched folder) lies in a tracker's own output,
    ``trackers/<tensorboard|mlruns|wandb>/...``."""
    return any(a == TRACKER_FOLDER and b in TRACKER_OUTPUTS for a, b in zip(parts, parts[1:]))


def trackers_folder(out: str | Path, tracker: str) -> Path:
    """Where ``tracker`` writes in the record folder ``out``."""
    return Path(out) / TRACKER_FOLDER / tracker


def checkpoint_for(record: Path) -> Path:
    """The checkpoint that belongs to the record file ``record``."""
    return record.parent / ".checkpoints" / f"{record.stem}.pt"


def remove_checkpoint(checkpoint: Path) -> bool:
    """Delete a checkpoint its record has made obsolete. Called after the record is written, so a
    failure (a read-only folder, something else at the path) is a one-line warning, never an
    error: the record is written, and reporting it unwritten (or writing a second copy) would be
    wrong. False when the checkpoint is still there."""
    try:
        checkpoint.unlink(missing_ok=True)
    except OSError as e:
        log.warning("the record is written, but its checkpoint %s could not be removed (%s: %s): delete it by hand",
                    checkpoint, type(e).__name__, e.strerror or e)
        return False
    return True


# ----------------------------------------------------------------------------- output folders


def check_out_dir(folder: str | Path, create: bool = True) -> Path:
    """Make sure records can be written to ``folder`` before anything runs: create it (with
    ``create``; otherwise check the nearest folder above that exists), refuse a file or a folder
    this process cannot write to (OutDirError, one line)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutDirError(f"--out {folder} is a file, not a folder: pass a folder for the records")
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutDirError(f"--out {folder}: cannot create the folder ({_reason(e)})") from None
        probe_in = folder
    else:
        probe_in = next((p for p in [folder, *folder.absolute().parents] if p.exists()), Path("/"))
        if not probe_in.is_dir():
            raise OutDirError(f"--out {folder}: {probe_in} is a file, not a folder")
    try:  # the only reliable test (root ignores permission bits, a read-only mount does not)
        fd, probe = tempfile.mkstemp(dir=probe_in, prefix=".hfl-bench-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutDirError(f"--out {folder}: cannot write there ({_reason(e)})") from None
    return folder


def check_folder_target(folder: str | Path, what: str) -> Path:
    """Refuse (OutDirError, one line) a folder to write into that is an existing file or lies below
    one: ``plot --out``, ``leaderboard html --out``, before anything is read or drawn."""
    folder = Path(folder)
    for p in (folder, *folder.parents):  # a relative path's last parent is ".", which exists
        if p.exists():  # the nearest existing path: a folder, or the file that blocks the way
            if not p.is_dir():
                raise OutDirError(f"{what} {folder}: {p} is a file, not a folder")
            break
    return folder


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def cache_home() -> Path:
    """hfl-bench's cache folder: ``$XDG_CACHE_HOME/hfl-bench``, else ``~/.cache/hfl-bench``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hfl-bench"


def unsaved_dirs() -> list[Path]:
    """Folders a record goes to when its own folder cannot take it (disk full, folder removed), in
    order of preference: ``~/.cache/hfl-bench/unsaved`` (or under $XDG_CACHE_HOME), then the
    system's temporary folder."""
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return [cache_home() / "unsaved", Path(tempfile.gettempdir()) / f"hfl-bench-unsaved-{user}"]


def unsaved_folder(base: Path) -> Path:
    """A new folder under ``base`` for one unsaved record (never overwriting an earlier one)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=base, prefix=f"{stamp}-{os.getpid()}-"))


# ----------------------------------------------------------------------------- writing


def _temporary_affixes(path: Path) -> tuple[str, str]:
    """The prefix and suffix of ``write_atomic``'s temporary files for ``path``."""
    return f".{path.name}.", ".tmp"


# mkstemp's random part: 8 characters of tempfile's alphabet (lower-case letters, digits, "_").
_TEMP_RANDOM = r"[a-z0-9_]{8}"


def remove_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporary files ``write_atomic`` left beside ``path`` (a process killed mid-write
    cannot remove its own), and only those: ``.<name>.<8 random characters>.tmp``. Call it where
    no other process writes ``path`` (a run holding its claim, at its start). Returns the removed
    files; one that cannot be removed is left (it only takes space)."""
    path = Path(path)
    prefix, suffix = _temporary_affixes(path)
    pattern = re.compile(re.escape(prefix) + _TEMP_RANDOM + re.escape(suffix))
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:  # no folder yet (nothing to remove), or one that cannot be listed
        return removed
    for entry in entries:
        if pattern.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
            try:
                entry.unlink()
                removed.append(entry)
            except OSError:
                pass
    return removed


def write_atomic(path: str | Path, data: str | bytes | Callable[[Any], None]) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written file.

    ``data`` is text, bytes, or a function that writes into the open binary file (``torch.save``,
    ``figure.savefig``). A process killed mid-write leaves its temporary file
    (``remove_temporaries`` finds it by name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix, suffix = _temporary_affixes(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, shared_mode())  # mkstemp creates 0600; a file made by open() would get this
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_sealed(path: str | Path, magic: bytes, payload: bytes) -> None:
    """``write_atomic`` of ``payload`` behind one header: ``magic``, the payload's SHA-256 (hex) and
    a newline. ``unseal`` checks it before a byte of the payload is trusted (torch's zip reader
    does not check its members: one flipped bit in a weight would load in silence)."""
    write_atomic(path, magic + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def unseal(blob: bytes, magic: bytes) -> tuple[bytes | None, str]:
    """The payload of a ``write_sealed`` file's bytes and ``""``; or None and why not: ``"unsealed"``
    (no such header: another format, or an older writer's) or ``"damaged"`` (the digest disagrees)."""
    if not blob.startswith(magic):
        return None, "unsealed"
    digest, newline, payload = blob[len(magic):].partition(b"\n")
    if not newline:
        return None, "unsealed"
    if digest != hashlib.sha256(payload).hexdigest().encode():
        return None, "damaged"
    return payload, ""


def shared_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the process umask (0o644 under the usual
    022, 0o600 under 077). Read from /proc on Linux: setting the umask to read it (the only portable
    way) would race with other threads creating files."""
    try:
        with open("/proc/self/status") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask
