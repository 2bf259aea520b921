"""The one run path: a ``ResolvedRun`` (``hfl_bench.resolved``) in, one record out, with the same
guarantees whoever runs it (``hfl-bench run``, a matrix cell local or on Ray, ``hfl_bench.run``):

- ``begin``: the output folder can take the record, the record file is claimed (one writer per
  record file, ``locks``), and no finished record of other data or another method version is
  there to be overwritten (``records.check_same_data``); all before any training.
- ``execute``: the run (``engine.run``, from its checkpoint when resuming), then its record
  (``records.build_record``; a failed record that says so when building it raises). Trackers
  (``hfl_bench.trackers``) see each round as it ends.
- ``save``: the atomic write (``records.save_record``), re-checked at the write; the record is
  never lost (a fallback folder, else the caller prints it). Then the trackers log its summary
  and the file.

``run_resolved`` chains the three for a caller in one process (the CLI, the Python API); the
matrix calls ``begin`` and ``save`` in its driver and ``execute`` wherever the cell runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hfl_bench import locks, paths
from hfl_bench import recording as records
from hfl_bench.resolved import ResolvedRun, TorchThreads, auto_threads
from hfl_bench.trackers import Trackers

ProgressFn = Callable[[int, int, dict[str, Any]], None]


def begin(run: ResolvedRun, check_out: bool = True) -> locks.Claim:
    """Checks before a run, then its claim (release it once the record is written): the output
    folder (``paths.check_out_dir``, with ``check_out``), the claim (``locks.ClaimError``), and no
    finished record of other data or another method version at the record path (ConfigError)."""
    return _open(run, check_out)[0]


def _open(run: ResolvedRun, check_out: bool = True) -> tuple[locks.Claim, records.RecordFile]:
    """``begin``, and the run's record file (``records.open_record``) for its record and write."""
    if check_out:
        paths.check_out_dir(run.cfg.out)  # a file or an unwritable folder: refused before any training
    claim = locks.take(run.record_path)  # one writer per record file
    try:
        return claim, _record_file(run, check=True)
    except BaseException:
        claim.release()
        raise


def _record_file(run: ResolvedRun, check: bool = False) -> records.RecordFile:
    return records.open_record(run.cfg, run.record_path, run.config_hash, run.version, run.portable_config,
                               check=check)


def execute(run: ResolvedRun, progress: Optional[ProgressFn] = None, resume: bool = False,
            restart_refused: bool = False, trackers: Optional[Trackers] = None,
            record_file: Optional[records.RecordFile] = None) -> dict[str, Any]:
    """Run and build the record. ``resume`` continues from the run's checkpoint if there is one;
    with ``restart_refused`` a checkpoint that cannot be trusted (other code or settings, damaged)
    is dropped and the run starts over, its record saying why (``federation.checkpoint_refused``),
    else its CheckpointError is raised. The run's own errors are raised; a record that cannot be
    built becomes a failed record that says so. The run takes what resolving it built
    (``ResolvedRun.built``: the method, the plans) when it runs in the same process."""
    from hfl_bench import engine
    from hfl_bench.checkpoint import CheckpointError

    cfg, checkpoint = run.cfg, run.checkpoint_path
    out = record_file if record_file is not None else _record_file(run)
    each = _each_round(progress, trackers)
    refused = None
    try:
        built = run.built.take() if run.built is not None else None  # made by resolving it, in this process
        result = engine.run(cfg, progress=each, resume=resume, checkpoint=checkpoint, built=built)
    except CheckpointError as e:
        if not restart_refused:
            raise
        refused = str(e).replace(str(checkpoint), checkpoint.name)  # a record names no machine path
        with contextlib.suppress(OSError):  # a folder stays: the new run's checkpoint writes warn about it
            checkpoint.unlink(missing_ok=True)
        result = engine.run(cfg, progress=each, checkpoint=checkpoint)
    try:
        record = out.build(result)
    except Exception as e:  # noqa: BLE001 - the run finished: keep what can be kept, say what broke
        return out.build_failed(f"the run finished but its record could not be built: {type(e).__name__}: {e}")
    if refused:  # the run started over: its record says why it did not resume
        record["federation"]["checkpoint_refused"] = refused
    return record


def each_round(*calls: Optional[ProgressFn]) -> Optional[ProgressFn]:
    """One progress callback that calls each of ``calls`` given, in order (None when none is)."""
    given = [c for c in calls if c is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def each(rnd: int, total: int, entry: dict[str, Any]) -> None:
        for call in given:
            call(rnd, total, entry)

    return each


def _each_round(progress: Optional[ProgressFn], trackers: Optional[Trackers]) -> Optional[ProgressFn]:
    logged = (lambda rnd, total, entry: trackers.round(entry)) if trackers else None
    return each_round(logged, progress)


def save(run: ResolvedRun, record: dict[str, Any], keep_final: bool = False,
         trackers: Optional[Trackers] = None, record_file: Optional[records.RecordFile] = None) -> records.Saved:
    """Write the record atomically to its folder (``records.save_record``): a finished record of
    other data or another method version that appeared meanwhile is kept, and this one goes to a
    fallback folder (``records.write_conflict``); with ``keep_final`` a failed record never
    replaces a finished one. Then the trackers log the record's summary and the written file."""
    final = record.get("status") in records.FINAL_STATUSES
    out = record_file if record_file is not None else _record_file(run)
    divert = out.conflict() if final or not keep_final else None
    saved = records.save_record(record, run.cfg.out, keep_final=keep_final, divert=divert)
    if trackers:
        trackers.finish(saved.record, saved.path)
    return saved


@dataclass
class Outcome:
    """What ``run_resolved`` did: the record as written, and where (``records.Saved``)."""

    record: dict[str, Any]
    saved: records.Saved


def run_resolved(run: ResolvedRun, progress: Optional[ProgressFn] = None, resume: bool = False,
                 trackers: Optional[Trackers] = None, started: Optional[Callable[[], None]] = None,
                 threads: Optional[int] = None) -> Outcome:
    """``begin``, ``execute`` and ``save`` in this process; the claim is held until the record is
    written. ``started`` is called once the checks passed, before the run (the CLI's notes).
    Torch runs on ``threads`` threads (default ``resolved.auto_threads``) until the record is
    written (its environment shows them), and then on as many as before. One at a time per
    process (``engine.RUN_LOCK``, held from the checks to the written record): a run another
    thread started meanwhile waits, and the thread counts are set and restored in turn."""
    from hfl_bench.data import get_task  # imports torch: not at start-up (a matrix's dry run never does)
    from hfl_bench.engine import RUN_LOCK

    with RUN_LOCK:
        claim, out = _open(run)
        torch_threads = TorchThreads()
        try:
            torch_threads.set(threads or auto_threads(run.cfg.pool, get_task(run.cfg.task).info))
            if started is not None:
                started()
            if trackers:
                trackers.start(run)
            try:
                record = execute(run, progress, resume=resume, trackers=trackers, record_file=out)
            except BaseException:
                if trackers:
                    trackers.close()
                raise
            saved = save(run, record, trackers=trackers, record_file=out)
        finally:
            torch_threads.restore()
            claim.release()
    return Outcome(saved.record, saved)
