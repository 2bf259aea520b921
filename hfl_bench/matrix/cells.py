"""Running one cell: its record, or a failed record that says what broke (the matrix goes on)."""

from __future__ import annotations

import json
import sysconfig
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from hfl_bench.config import RunConfig
from hfl_bench.paths import remove_checkpoint
from hfl_bench.resolved import ResolvedRun, resolve_run

TRACEBACK_LINES = 12  # lines of traceback kept in a failed record's error text


def error_text(exc: BaseException, with_traceback: bool = True) -> str:
    """``Type: message``, then the traceback's header and its tail (where in the code it broke),
    each file named as a record may name it (``portable_filename``: no machine path)."""
    text = f"{type(exc).__name__}: {exc}"
    if with_traceback and exc.__traceback__ is not None:
        lines = "".join(_portable(traceback.TracebackException.from_exception(exc)).format()).rstrip().splitlines()
        tail = lines[-TRACEBACK_LINES:]
        if lines and tail[0] != lines[0]:  # the header, "Traceback (most recent call last):", then the tail
            tail = [lines[0], "  ...", *tail]
        text += "\n" + "\n".join(tail)
    return text


def portable_filename(filename: str) -> str:
    """A traceback's file as a record names it: inside an installed package, its path from the
    packages folder (``torch/nn/modules/module.py``); in this project's checkout, its path from the
    checkout (``hfl_bench/engine.py``); in the standard library, its path there (``json/decoder.py``);
    any other absolute path, its file name alone."""
    path = Path(filename)
    if not path.is_absolute():
        return filename
    parts = path.parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor):])
    resolved = path.resolve()
    for root in (Path(__file__).resolve().parents[2], Path(sysconfig.get_paths()["stdlib"]).resolve()):
        if resolved.is_relative_to(root):
            return resolved.relative_to(root).as_posix()
    return path.name


def _portable(te: traceback.TracebackException, seen: Optional[set] = None) -> traceback.TracebackException:
    """``te`` with every frame's file (and its chained exceptions') through ``portable_filename``;
    each source line is read before its file is renamed."""
    seen = set() if seen is None else seen
    if id(te) in seen:
        return te
    seen.add(id(te))
    for frame in te.stack:
        _ = frame.line  # read from the real file, kept once the name changes
        frame.filename = portable_filename(frame.filename)
    for chained in (te.__cause__, te.__context__):
        if chained is not None:
            _portable(chained, seen)
    return te


def run_cell(job: ResolvedRun | RunConfig, threads: Optional[int] = None,
             progress: Optional[Callable[[int, int, dict], None]] = None,
             plugins: Optional[tuple] = None) -> dict[str, Any]:
    """Run one cell on the run path (``runpath.execute``) and return its record; any exception
    becomes a failed record. ``job`` is the cell's ``ResolvedRun`` (a bare config is resolved
    here first). ``plugins``: the entry points the matrix's driver loaded at its start, the only
    ones this process may load (a Ray task; ``hfl_bench.registry.pin``); None leaves the process
    as it is.

    A cell continues from its checkpoint if an interrupted matrix left one (on the machine that
    runs it); a checkpoint of other code or settings, or a damaged one, is dropped and the cell
    starts over, and its record says why (``federation.checkpoint_refused``). The
    cell removes its own checkpoint once it has a record, so a Ray worker leaves none behind.
    The driver claims the record and checks its folder before (``runpath.begin``) and writes it
    after (``runpath.save``)."""
    from hfl_bench import runpath

    if plugins is not None:
        from hfl_bench.registry import pin

        pin(plugins)
    cfg = job.cfg if isinstance(job, ResolvedRun) else job
    try:
        if threads:
            import torch

            torch.set_num_threads(threads)
        run = job if isinstance(job, ResolvedRun) else resolve_run(job)  # UnsafePathError for a bad name
        record = runpath.execute(run, progress, resume=True, restart_refused=True)
    except Exception as e:  # noqa: BLE001 - the matrix records every failure and goes on
        return failed_record(cfg, error_text(e))
    remove_checkpoint(run.checkpoint_path)  # a warning if it cannot be removed: the record must not be lost
    return record


def failed_record(cfg: RunConfig, error: str) -> dict[str, Any]:
    """``records.build_failed_record``, or, should even that raise, the fields a failed record
    needs (the matrix writes a record for every cell it can)."""
    import dataclasses
    import datetime as dt
    import hashlib

    from hfl_bench import recording as records
    from hfl_bench.config import config_hash

    try:
        return records.build_failed_record(cfg, error)
    except Exception as e:  # noqa: BLE001
        cfg_dict = dataclasses.asdict(cfg)
        chash = config_hash(cfg_dict)
        return {
            "schema_version": records.SCHEMA_VERSION,
            "record_id": hashlib.sha256(f"{chash}|{cfg.seed}|reproduced".encode()).hexdigest()[:16],
            "source": {"kind": "reproduced", "citation": None},
            "status": "failed",
            "error": f"{error}\n(and building the failed record raised {type(e).__name__}: {e})",
            "method": {"name": str(cfg.method), "fidelity": None, "version": None},
            "task": {"name": str(cfg.task), "version": None, "num_classes": None},
            "metrics": None,
            "config": json.loads(json.dumps(cfg_dict, default=str)),
            "config_hash": chash,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }

