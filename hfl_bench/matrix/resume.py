"""Resuming a matrix: a cell whose final record (ok or diverged, same setting and seed, same data)
is already in the output folder is skipped; failed cells run again.

Same data: a finished record that names its data fingerprint (``task.data_fingerprint``) is of
this cell only if the data the cell would load now has the same fingerprint
(``Task.fingerprint(data_dir)``). One of other data is not skipped, and since the cell's record
would have the same file name, it is not overwritten either: the cell fails with one line naming
the file (use another ``--out``). A record without a fingerprint (written before they were
recorded), or a task that cannot fingerprint its data, is trusted as before. When fingerprinting
raises (the data is missing), the cell is run and fails the way a run without its data fails.

Same output: a setting outside the config hash that adds to the record (``RECORD_EXTRAS``:
``ensemble: true``, the extra endpoint ``ensemble``) asked for by the cell and not by the record's
run makes the record not this cell's: the cell runs again and its record replaces the old one
(the same run, the same config hash, with the endpoint added), so an endpoint a suite asks for is
never silently absent.

Same implementation: a method's version is not part of the config hash, so a record of the same
setting and seed written by another version of the method (``method.version`` against the
version this code records for the cell, ``records.registered_version``: the registered class's
``version``, with its aggregation rule's past "1.0"; its numerics changed since) is not this cell's
result either.
It is neither skipped (that would keep the old numbers under a rerun that says "skipped") nor
overwritten (it is a finished result): the cell fails with one line naming the file and both
versions; archive the record or use another ``--out``. A record without a method version
(written before versions) is trusted as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from hfl_bench import config as config_mod
from hfl_bench.matrix.suite import Cell
from hfl_bench.record.io import load_record
from hfl_bench.recording import (
    FINAL_STATUSES,
    data_fingerprint,
    other_data,
    other_data_message,
    other_version,
    other_version_message,
    registered_version,
)

# Settings outside the config hash that add to what a record holds (``ensemble``: an extra
# endpoint): a record made without one is not the result of a cell that asks for it.
RECORD_EXTRAS = ("ensemble",)


def missing_extras(record: dict[str, Any], cell: Cell) -> list[str]:
    """The ``RECORD_EXTRAS`` the cell asks for and its record was made without."""
    recorded = record.get("config") or {}
    return [name for name in RECORD_EXTRAS if getattr(cell.cfg, name, None) and not recorded.get(name)]


@dataclass
class Existing:
    """What the output folder already holds for a cell: a final record to skip with, or a final
    record of other data or of another method version (``conflict``: why the cell fails without
    being run); both None when the cell has to run."""

    record: Optional[dict[str, Any]] = None
    conflict: Optional[str] = None


def existing_record(cell: Cell) -> Existing:
    """The cell's existing final record of the same setting, seed, method version and data (module
    docstring)."""
    if cell.error is not None:
        return Existing()
    try:
        path = cell.record_path()
    except ValueError:  # a name that cannot be a file name: the cell runs and fails
        return Existing()
    if not path.is_file():
        return Existing()
    try:
        record = load_record(path)
    except ValueError:
        return Existing()
    cfg_dict = dataclasses.asdict(cell.cfg)
    same = (record.get("config_hash") == config_mod.config_hash(cfg_dict)
            and (record.get("config") or {}).get("seed") == cell.cfg.seed)
    if not (same and record.get("status") in FINAL_STATUSES) or missing_extras(record, cell):
        return Existing()
    version = registered_version(cell.cfg.method, cell.cfg.method_params)
    recorded_version = other_version(record, version)
    if recorded_version is not None:  # another implementation's result: neither skipped nor replaced
        return Existing(conflict=other_version_message(path, cell.cfg.method, recorded_version, version))
    if (record.get("task") or {}).get("data_fingerprint") is None:
        return Existing(record)  # written before fingerprints: trusted as before
    try:
        current = data_fingerprint(cell.cfg)
    except Exception:  # noqa: BLE001 - e.g. the data is missing: run the cell, it fails normally
        return Existing()
    recorded = other_data(record, current)
    if recorded is not None:
        return Existing(conflict=other_data_message(path, recorded, current))
    return Existing(record)
