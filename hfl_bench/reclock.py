"""Offline re-clocking (``hfl-bench reclock``): a record's rounds timed again on other devices.

Without a deadline the simulated clock only observes (``hfl_bench.clock``): which clients run, what
they train and what they send do not depend on the devices, so a run under one device preset and a
run under another with the same seed train identically and differ only in their ``clock`` section
and each round's ``history[].clock``. Each round's clock entry records, per client that ran, what
its time was computed from (its training FLOPs, bytes sent and received); the record holds each
client's training FLOPs per sample (``cost.flops.per_sample.training``, which ``by-size`` assigns
by) and the seed. From these the other profile's devices are generated and assigned as a run does
(``clock.build``) and every round is timed again by the same code (``Clock.replay``, which calls
``Clock.round_entry``), in the same order: the result equals, to the float, what a run on those
devices records.

Refused (``ReclockError``, one line): a file that is no valid record, a record without a clock, one
run with a deadline (its late clients were dropped: on other devices training would differ), a
target with a deadline (the same reason), a record whose clock entries predate the recorded inputs.
The new record is the old one with the other device setting (``config.devices``,
``config.device_assignment``: not part of the config hash without a deadline, so its file name
and ``record_id`` are those a run on those devices gets) and a ``clock.reclocked`` block naming the
record it came from (``record_id``, file name, SHA-256) and the code that re-clocked it; written
atomically into the output folder under the project's record file name.

Reads and writes JSON with numpy and the standard library (no torch).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import hfl_bench
from hfl_bench import clock as clock_mod
from hfl_bench.config import ConfigError
from hfl_bench.paths import check_out_dir, inside, record_filename, write_atomic
from hfl_bench.provenance import git_info
from hfl_bench.record.check import problems
from hfl_bench.record.io import current_shape, loads_strict
from hfl_bench.regularfile import read_regular

MAX_RECORD_BYTES = 256 << 20  # far above any record (a 200-round, 100-client run is a few MB)


class ReclockError(ConfigError):
    """A record that cannot be re-clocked, or a target that cannot be: one line for the user."""


def read(path: str | Path) -> tuple[dict[str, Any], str]:
    """The record in ``path`` (upgraded to the current version) and its file's SHA-256; ReclockError
    for a file that cannot be read or is not a valid record (``record.check.problems``, frozen: what
    ``leaderboard validate`` checks)."""
    name = Path(path).name
    try:
        data = read_regular(path, MAX_RECORD_BYTES)
    except (OSError, ValueError) as e:
        raise ReclockError(f"{name}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        raw = loads_strict(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ReclockError(f"{name}: not a record ({type(e).__name__}: {e})") from None
    found = problems(raw, frozen=True)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ReclockError(f"{name}: not a valid record: {found[0]}{more} (hfl-bench leaderboard validate)")
    return current_shape(raw), hashlib.sha256(data).hexdigest()


def _entries(record: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The record's rounds with a clock entry, refused where they cannot be timed again."""
    section = record.get("clock")
    if not isinstance(section, dict):
        raise ReclockError(f"{name}: has no clock (it ran without --devices): there is nothing to re-clock; "
                           "run it with --devices")
    if section.get("deadline_s") is not None:
        raise ReclockError(f"{name}: ran with --deadline {section['deadline_s']:g}, which dropped late clients: "
                           "on other devices training would differ; run it again instead")
    timed = [h["clock"] for h in record.get("history") or [] if isinstance(h.get("clock"), dict)]
    if any(not all(isinstance(e.get(k), list) for k in clock_mod.INPUTS) for e in timed):
        raise ReclockError(f"{name}: its rounds' clock entries do not record each client's FLOPs and bytes "
                           f"({', '.join(clock_mod.INPUTS)}; written before they were): run it again")
    return timed


def reclock(record: dict[str, Any], sha256: str, name: str, devices: str, assignment: str = "random",
            deadline: float | None = None) -> dict[str, Any]:
    """``record`` (as ``read`` returns it, from the file ``name`` with that SHA-256) timed again on
    the devices of ``devices`` (a preset or a profile file) assigned by ``assignment``: a new record,
    ``record`` left as it was. ReclockError (one line) where it cannot be."""
    if deadline is not None:
        raise ReclockError(f"--deadline {deadline:g}: a deadline drops late clients, so training would differ "
                           "from the record's; run with --devices and --deadline instead")
    if devices.strip().lower() in ("", "none"):
        raise ReclockError("--devices must name a preset or a profile file to re-clock on")
    if assignment not in clock_mod.ASSIGNMENTS:
        raise ReclockError(f"--device-assignment must be {' or '.join(clock_mod.ASSIGNMENTS)}, got {assignment!r}")
    entries = _entries(record, name)
    old = record["clock"]
    per_sample = ((record.get("cost") or {}).get("flops") or {}).get("per_sample", {}).get("training")
    n = len(old["devices"])
    if not isinstance(per_sample, list) or len(per_sample) != n:
        raise ReclockError(f"{name}: has no training FLOPs per sample for its {n} clients (cost.flops), "
                           "which assign the devices")
    spec = devices.strip()
    # no deadline: the first-round estimates only serve a deadline's admission, so they are not needed
    new_clock = clock_mod.build(spec, assignment, None, int(old["seed"]), per_sample, [0.0] * n)
    try:
        timed = iter(new_clock.replay(entries))
    except ValueError as e:
        raise ReclockError(f"{name}: {e}") from None
    out = copy.deepcopy(record)
    for h in out["history"]:
        if isinstance(h.get("clock"), dict):
            h["clock"] = next(timed)
    code = git_info()
    out["clock"] = {**new_clock.record(out["history"]), "reclocked": {
        "record_id": str(record.get("record_id")), "file": name, "sha256": sha256,
        "profile": str(old["profile"]), "assignment": old["assignment"],
        "git_sha": code.get("git_sha"), "git_dirty": code.get("git_dirty"),
        "hfl_bench_version": hfl_bench.__version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}}
    # the device setting, as a run on those devices records it (not hashed without a deadline)
    out["config"] = {**out["config"], "devices": spec, "device_assignment": assignment}
    found = problems(out)
    if found:  # a bug here, never the user's: refuse rather than write a record the views would skip
        raise ReclockError(f"{name}: the re-clocked record would not be valid: {found[0]}")
    return out


def write(record: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``record`` atomically into ``out_dir`` under its record file name (``record_filename``)."""
    folder = check_out_dir(out_dir)
    path = inside(folder, record_filename(record))
    write_atomic(path, json.dumps(record, indent=1, allow_nan=False) + "\n")
    return path


def reclock_files(paths: list[str | Path], devices: str, out_dir: str | Path, assignment: str = "random",
                  deadline: float | None = None) -> list[Path]:
    """Re-clock each record in ``paths`` (``reclock``) and write them into ``out_dir``; returns their
    paths. Every record is read, checked and re-clocked before any is written, so a refusal
    (ReclockError, one line) writes nothing; so are two records that would take one file name, and
    a record that would overwrite itself (``out_dir`` its own folder)."""
    done: dict[Path, dict[str, Any]] = {}
    for path in map(Path, paths):
        record, sha256 = read(path)
        new = reclock(record, sha256, path.name, devices, assignment, deadline)
        target = Path(out_dir) / record_filename(new)
        if target.exists() and target.resolve() == path.resolve():
            raise ReclockError(f"{path.name}: --out would overwrite the record being re-clocked; choose another folder")
        if target in done:
            raise ReclockError(f"{path.name}: re-clocks to the same file as another record given ({target.name})")
        done[target] = new
    return [write(record, out_dir) for record in done.values()]
