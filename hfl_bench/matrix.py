"""Matrix runs: a suite of methods x tasks x seeds, run cell by cell.

A suite is a YAML file (format below, and in the README). Each cell is one ``RunConfig``,
resolved against its task's defaults, run as ``engine.run`` + ``records.build_record`` and
written to the suite's output folder under ``records.record_filename``, so a cell's record path
is known before it runs: a rerun skips every cell whose record is already there (status ok or
diverged, same config hash and seed) and retries the failed ones. A cell that raises becomes a
``status: "failed"`` record and the matrix goes on.

Executors: in-process (``--jobs 1``), a local process pool (forkserver, not fork: torch is imported),
or Ray tasks on a local or existing cluster; pool workers and Ray tasks return the record and
the driver writes it, so records land in the driver's folder even on a multi-machine cluster.

Suite format::

    name: mini                      # optional; default: the file name
    description: ...                # optional
    out: leaderboards/reproduced/mini   # record folder (relative to the working directory)
    methods: [local, crad, fedavg]
    tasks: [digits, mnist1d]
    seeds: [0, 1, 2]                # optional; default: each task's default seed
    settings:                       # shared: any RunConfig field, plus method_params
      rounds: 100
    task_overrides:                 # optional, per task; applied over settings
      mnist1d: {rounds: 50}
    method_overrides:               # optional, per method; applied last
      fedavg: {pool: cpu-cnn}
      crad: {method_params: {lam: 0.5}}

``method_params`` mappings are merged key by key across the layers; other keys replace.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import typer

from hfl_bench import config as config_mod
from hfl_bench.config import ConfigError, RunConfig, read_yaml_mapping

SUITE_KEYS = ("name", "description", "out", "methods", "tasks", "seeds", "settings",
              "task_overrides", "method_overrides")
# Set by the suite's axes and its ``out``, so not allowed among the settings.
AXIS_FIELDS = ("method", "task", "seed", "out")
SETTING_KEYS = tuple(k for k in config_mod.FIELDS if k not in AXIS_FIELDS)
# A record with one of these statuses is final: its cell is skipped on a rerun.
FINAL_STATUSES = ("ok", "diverged")
EXECUTORS = ("local", "ray")
TRACEBACK_LINES = 12  # lines of traceback kept in a failed record's error text


# ----------------------------------------------------------------------------- suite


@dataclass
class Suite:
    """A parsed suite file: the three axes, shared settings and overrides."""

    name: str
    methods: list[str]
    tasks: list[str]
    seeds: list[Optional[int]]
    out: str = "runs"
    description: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    task_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    method_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Cell:
    """One run of the matrix. ``cfg`` is resolved against the task's defaults; when resolution
    failed (an unknown task, a bad setting) it is the unresolved config and ``error`` says why."""

    cfg: RunConfig
    error: Optional[str] = None

    @property
    def label(self) -> str:
        return f"{self.cfg.method} on {self.cfg.task}, seed {self.cfg.seed}"

    def record_path(self) -> Path:
        return Path(self.cfg.out) / expected_filename(self.cfg)


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; raises ConfigError with a one-line message."""
    path = Path(path)
    data = read_yaml_mapping(path, "suite file", f"(keys: {', '.join(SUITE_KEYS)})")
    return parse_suite(data, default_name=path.stem, where=str(path))


def parse_suite(data: dict[str, Any], default_name: str = "suite", where: str = "suite") -> Suite:
    _check_keys(data, SUITE_KEYS, where)
    methods = _names(data, "methods", where)
    tasks = _names(data, "tasks", where)
    seeds = _seeds(data.get("seeds"), where)
    settings = _settings(data.get("settings"), f"{where}: settings")
    task_overrides = _overrides(data, "task_overrides", tasks, "tasks", where)
    method_overrides = _overrides(data, "method_overrides", methods, "methods", where)
    out = data.get("out", "runs")
    if not isinstance(out, str) or not out.strip():
        raise ConfigError(f"{where}: out must be a folder path, got {out!r}")
    return Suite(name=str(data.get("name") or default_name), methods=methods, tasks=tasks, seeds=seeds,
                 out=out, description=str(data.get("description") or ""), settings=settings,
                 task_overrides=task_overrides, method_overrides=method_overrides)


def _check_keys(data: dict[str, Any], known: Iterable[str], where: str) -> None:
    known = tuple(known)
    unknown = sorted(str(k) for k in set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}. Known: {', '.join(known)}")


def _names(data: dict[str, Any], key: str, where: str) -> list[str]:
    names = data.get(key)
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}: {key} must be a non-empty list of names, got {names!r}")
    _no_duplicates(names, key, where)
    return names


def _seeds(seeds: Any, where: str) -> list[Optional[int]]:
    if seeds is None:
        return [None]  # each task's default seed
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds):
        raise ConfigError(f"{where}: seeds must be a non-empty list of integers, got {seeds!r}")
    _no_duplicates(seeds, "seeds", where)
    return seeds


def _no_duplicates(items: list, key: str, where: str) -> None:
    repeated = sorted({str(x) for x in items if items.count(x) > 1})
    if repeated:
        raise ConfigError(f"{where}: {key} lists {', '.join(repeated)} more than once")


def _settings(values: Any, where: str) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping of run settings, got {values!r}")
    for axis in AXIS_FIELDS:
        if axis in values:
            hint = "the suite's top-level out" if axis == "out" else f"the suite's {axis}s list"
            raise ConfigError(f"{where}: {axis!r} is set by {hint}, not here")
    _check_keys(values, SETTING_KEYS, where)
    params = values.get("method_params")
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"{where}: method_params must be a mapping, got {params!r}")
    return dict(values)


def _overrides(data: dict[str, Any], key: str, names: list[str], axis: str, where: str) -> dict[str, dict]:
    raw = data.get(key) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {key} must map names to settings, got {raw!r}")
    stray = sorted(set(raw) - set(names))
    if stray:  # most likely a typo: an override that would never apply
        raise ConfigError(f"{where}: {key} names {', '.join(map(str, stray))}, not in the suite's {axis} "
                          f"({', '.join(names)})")
    return {name: _settings(values, f"{where}: {key}.{name}") for name, values in raw.items()}


def merge_settings(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; ``method_params`` mappings are merged key by key."""
    merged: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "method_params":
                params.update(value or {})
            else:
                merged[key] = value
    merged["method_params"] = params
    return merged


def suite_cells(suite: Suite, out: str | Path | None = None) -> list[Cell]:
    """Every cell, task by task, method by method, seed by seed (the summary's order)."""
    folder = str(out if out is not None else suite.out)
    cells = []
    for task in suite.tasks:
        for method in suite.methods:
            values = merge_settings(suite.settings, suite.task_overrides.get(task, {}),
                                    suite.method_overrides.get(method, {}))
            for seed in suite.seeds:
                cells.append(resolve_cell(dict(values, method=method, task=task, seed=seed, out=folder)))
    return cells


def resolve_cell(values: dict[str, Any]) -> Cell:
    """Resolve one cell against its task's defaults; a failure is kept on the cell, not raised,
    so the matrix can record it as a failed cell and go on."""
    from hfl_bench import engine

    cfg = RunConfig(**values)
    try:
        _, resolved = engine.load_task(cfg)
    except Exception as e:  # noqa: BLE001 - any cell problem becomes that cell's failed record
        return Cell(cfg, error_text(e, with_traceback=False))
    return Cell(resolved)


def expected_filename(cfg: RunConfig) -> str:
    """The file name ``records.write_record`` will give this config's record."""
    from hfl_bench.records import record_filename

    cfg_dict = dataclasses.asdict(cfg)
    return record_filename({"config": cfg_dict, "config_hash": config_mod.config_hash(cfg_dict)})


def finished_record(cell: Cell) -> Optional[dict[str, Any]]:
    """The cell's existing record if it is final (ok or diverged) and of the same setting and
    seed; None when the cell still has to run (no record, a failed one, or an unreadable one)."""
    from hfl_bench.records import load_record

    path = cell.record_path()
    if cell.error is not None or not path.is_file():
        return None
    try:
        record = load_record(path)
    except ValueError:
        return None
    cfg_dict = dataclasses.asdict(cell.cfg)
    same = (record.get("config_hash") == config_mod.config_hash(cfg_dict)
            and (record.get("config") or {}).get("seed") == cell.cfg.seed)
    return record if same and record.get("status") in FINAL_STATUSES else None


# ----------------------------------------------------------------------------- running one cell


def error_text(exc: BaseException, with_traceback: bool = True) -> str:
    """``Type: message``, then the tail of the traceback (where in the code it broke)."""
    text = f"{type(exc).__name__}: {exc}"
    if with_traceback and exc.__traceback__ is not None:
        lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
        text += "\n" + "\n".join(lines[-TRACEBACK_LINES:])
    return text


def run_cell(cfg: RunConfig, threads: Optional[int] = None,
             progress: Optional[Callable[[int, int, dict], None]] = None) -> dict[str, Any]:
    """Run one resolved cell and return its record; any exception becomes a failed record.

    A cell continues from its checkpoint if an interrupted matrix left one (on the machine that
    runs it); a checkpoint of other code or settings is dropped and the cell starts over. The
    cell removes its own checkpoint once it has a record, so a Ray worker leaves none behind."""
    from hfl_bench import engine, records
    from hfl_bench.checkpoint import CheckpointError

    if threads:
        import torch

        torch.set_num_threads(threads)
    checkpoint = records.checkpoint_path(cfg)
    try:
        try:
            result = engine.run(cfg, progress=progress, resume=True)
        except CheckpointError:
            checkpoint.unlink(missing_ok=True)
            result = engine.run(cfg, progress=progress)
        record = records.build_record(cfg, result)
    except Exception as e:  # noqa: BLE001 - the matrix records every failure and goes on
        return records.build_failed_record(cfg, error_text(e))
    checkpoint.unlink(missing_ok=True)
    return record


def failed_record(cell: Cell, error: str) -> dict[str, Any]:
    from hfl_bench.records import build_failed_record

    return build_failed_record(cell.cfg, error)


def _pool_init(threads: int) -> None:
    import os

    os.environ["OMP_NUM_THREADS"] = str(threads)  # for anything this worker starts
    import torch

    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- executors

Done = Callable[[Cell, dict[str, Any]], None]


def run_in_process(cells: list[Cell], done: Done, threads: Optional[int] = None,
                   round_progress: Optional[Callable[[Cell], Callable]] = None) -> None:
    """Serially, in this process (``--jobs 1``)."""
    for cell in cells:
        progress = round_progress(cell) if round_progress else None
        done(cell, run_cell(cell.cfg, threads, progress))


def run_process_pool(cells: list[Cell], done: Done, jobs: int, threads: int = 1) -> None:
    """A local pool of ``jobs`` worker processes; each returns its record to this process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # forkserver, not fork (fork is unsafe once torch has started threads): the server imports
    # the engine once and every worker forks from it, instead of each worker importing torch.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["hfl_bench.engine", "hfl_bench.records", "hfl_bench.matrix",
                                    "hfl_bench.methods", "hfl_bench.tasks"])
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_pool_init, initargs=(threads,))
    try:
        futures = {pool.submit(run_cell, cell.cfg, threads): cell for cell in cells}
        for future in as_completed(futures):
            cell = futures[future]
            try:
                record = future.result()
            except Exception as e:  # noqa: BLE001 - e.g. a worker killed for memory
                record = failed_record(cell, error_text(e))
            done(cell, record)
    except BaseException:  # Ctrl-C: drop the queued cells instead of running them all first
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def ray_module():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'hfl-bench[ray]'") from None
    return ray


def start_ray(address: Optional[str]):
    """Connect to ``address`` (an existing cluster, or ``auto``), or start a local Ray bound to
    loopback (it is for this machine only). Returns True when this call started Ray."""
    import os

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address:
        # Read when ray is imported; with the node IP below, every Ray socket listens on
        # 127.0.0.1 (environment notes).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = ray_module()
    if ray.is_initialized():
        return False  # e.g. a caller that already connected
    if address:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ConfigError(f"cannot connect to the Ray cluster at {address}: {e}") from None
    else:
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    return True


def cell_gpus(cfg: RunConfig, gpus_per_cell: Optional[float], cluster_gpus: float) -> float:
    """The GPUs a cell asks Ray for: as given, else 1 for a CUDA device, 1 for ``auto`` when the
    cluster has GPUs (auto would pick CUDA there), else 0."""
    if gpus_per_cell is not None:
        return gpus_per_cell
    if cfg.device.startswith("cuda"):
        return 1
    return 1 if cfg.device == "auto" and cluster_gpus > 0 else 0


def unschedulable(cpus: float, gpus: float, resources: dict[str, float]) -> Optional[str]:
    """Why a request can never be met by the cluster as it is now, or None."""
    have_cpus, have_gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    if gpus > have_gpus:
        return (f"the cell asks Ray for {gpus:g} GPU(s) but the cluster has {have_gpus:g}: "
                "set device: cpu in the suite or pass --gpus-per-cell 0")
    if cpus > have_cpus:
        return f"the cell asks Ray for {cpus:g} CPU(s) but the cluster has {have_cpus:g}: lower --cpus-per-cell"
    return None


def run_ray(cells: list[Cell], done: Done, address: Optional[str], cpus_per_cell: float = 1,
            gpus_per_cell: Optional[float] = None, jobs: Optional[int] = None,
            threads: Optional[int] = None) -> None:
    """Each cell a Ray task with its CPU/GPU request; at most ``jobs`` in flight (default: all,
    Ray's scheduler decides). The task returns the record; ``done`` writes it here."""
    ray = ray_module()
    started = start_ray(address)
    try:
        remote = ray.remote(run_cell)
        resources = ray.cluster_resources()
        threads = threads or max(1, int(cpus_per_cell))
        pending = list(cells)
        in_flight: dict[Any, Cell] = {}
        while pending or in_flight:
            while pending and (not jobs or len(in_flight) < jobs):
                cell = pending.pop(0)
                gpus = cell_gpus(cell.cfg, gpus_per_cell, resources.get("GPU", 0))
                problem = unschedulable(cpus_per_cell, gpus, resources)
                if problem:  # Ray would wait for it forever
                    done(cell, failed_record(cell, f"ConfigError: {problem}"))
                    continue
                options = dict(num_cpus=cpus_per_cell, num_gpus=gpus, max_retries=0)
                in_flight[remote.options(**options).remote(cell.cfg, threads)] = cell
            if not in_flight:
                break
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            cell = in_flight.pop(ready[0])
            try:
                record = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - a crashed worker or node
                record = failed_record(cell, error_text(e, with_traceback=False))
            done(cell, record)
    finally:
        if started:
            ray.shutdown()


# ----------------------------------------------------------------------------- summary


def summary_row(cell: Cell, record: Optional[dict[str, Any]], status: str, path: Optional[Path]) -> dict[str, Any]:
    """One line of the summary: ``status`` is ok, diverged, failed or skipped (a final record
    was already there); ``record_status`` is the status inside the record file."""
    record = record or {}
    metrics = record.get("metrics") or {}
    error = record.get("error") or cell.error
    return {
        "method": cell.cfg.method,
        "task": cell.cfg.task,
        "seed": cell.cfg.seed,
        "status": status,
        "record_status": record.get("status"),
        "global_acc": metrics.get("global_acc"),
        "wall_time_s": (record.get("cost") or {}).get("wall_time_total_s"),
        "record": str(path) if path else None,
        "error": error.splitlines()[0] if error else None,
    }


def engine_check(cfg: RunConfig) -> None:
    """Raise what can be known about a resolved cell without loading data: an unknown method,
    pool or hyperparameter. (A method's own ``check`` needs the clients, so runs only in a run.)"""
    from hfl_bench import engine
    from hfl_bench.pools import get_pool

    engine.make_method(cfg)
    get_pool(cfg.pool)


def dry_run_row(cell: Cell) -> dict[str, Any]:
    """What a run would do with this cell, checking what can be checked without loading data."""
    existing = finished_record(cell)
    if existing is not None:
        return summary_row(cell, existing, "would skip", cell.record_path())
    problem = cell.error
    if problem is None:
        try:
            engine_check(cell.cfg)
        except Exception as e:  # noqa: BLE001
            problem = error_text(e, with_traceback=False)
    row = summary_row(cell, None, "would fail" if problem else "would run", cell.record_path())
    row["error"] = problem
    return row


def run_matrix(cells: list[Cell], executor: str = "local", jobs: Optional[int] = None,
               threads: Optional[int] = None, address: Optional[str] = None, cpus_per_cell: float = 1,
               gpus_per_cell: Optional[float] = None, on_cell: Optional[Callable[[dict], None]] = None,
               round_progress: Optional[Callable[[Cell], Callable]] = None) -> list[dict[str, Any]]:
    """Run every cell not already done; returns the summary rows in cell order."""
    from hfl_bench.records import write_record

    rows: dict[int, dict[str, Any]] = {}
    index = {id(cell): i for i, cell in enumerate(cells)}

    def report(cell: Cell, row: dict[str, Any]) -> None:
        rows[index[id(cell)]] = row
        if on_cell:
            on_cell(row)

    def done(cell: Cell, record: dict[str, Any]) -> None:
        report(cell, summary_row(cell, record, record["status"], write_record(record, cell.cfg.out)))

    todo = []
    for cell in cells:
        existing = finished_record(cell)
        if existing is not None:
            report(cell, summary_row(cell, existing, "skipped", cell.record_path()))
        elif cell.error is not None:  # unresolvable: nothing to run
            done(cell, failed_record(cell, cell.error))
        else:
            todo.append(cell)

    if todo:
        if executor == "ray":
            run_ray(todo, done, address, cpus_per_cell, gpus_per_cell, jobs, threads)
        elif (jobs or 1) > 1:
            run_process_pool(todo, done, jobs, threads or 1)
        else:
            run_in_process(todo, done, threads, round_progress)
    return [rows[i] for i in range(len(cells))]


def exit_code(rows: list[dict[str, Any]]) -> int:
    return 1 if any(r["status"] in ("failed", "would fail") for r in rows) else 0


# ----------------------------------------------------------------------------- CLI


def matrix(
    suite_file: Path = typer.Argument(..., metavar="SUITE", help="Suite YAML (methods x tasks x seeds; see README)."),
    executor: str = typer.Option("local", help="local (in-process, or a process pool with --jobs > 1) or ray."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="local: worker processes \\[default: 1, in-process]; ray: most cells in flight \\[default: all]."),
    threads: Optional[int] = typer.Option(None, help="Torch threads per cell; default: 1 in a pool worker, --cpus-per-cell in a Ray task, unchanged in-process."),
    address: Optional[str] = typer.Option(None, help="Ray: address of an existing cluster (or 'auto'); default: start a local Ray on loopback."),
    cpus_per_cell: float = typer.Option(1, help="Ray: CPUs each cell asks for."),
    gpus_per_cell: Optional[float] = typer.Option(None, help="Ray: GPUs each cell asks for; default: 1 if the cell's device is cuda, or auto on a cluster with GPUs, else 0."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Record folder; default: the suite's out."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the cells and what would happen (run, skip, fail); run nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
):
    """Run every cell of a suite (methods x tasks x seeds), one record per cell.

    A cell whose record is already in the output folder (same config hash and seed, status ok or
    diverged) is skipped, so a rerun resumes; failed cells are retried. A cell that raises is
    recorded as failed and the matrix goes on. Exit code: 0 when every cell is ok, diverged or
    skipped; 1 when any cell failed (with --dry-run: would fail); 2 for a bad suite or flag.
    """
    from hfl_bench.cli import USER_ERRORS, emit_json, fail

    if executor not in EXECUTORS:
        fail(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be >= 1, got {jobs}")
    if threads is not None and threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    if cpus_per_cell <= 0 or (gpus_per_cell is not None and gpus_per_cell < 0):
        fail("--cpus-per-cell must be > 0 and --gpus-per-cell >= 0")
    if executor == "local" and (address or gpus_per_cell is not None):
        fail("--address and --gpus-per-cell are for --executor ray")
    try:
        suite = load_suite(suite_file)
        cells = suite_cells(suite, out_dir)
        if dry_run:
            rows = [dry_run_row(cell) for cell in cells]
        else:
            t0 = time.perf_counter()
            with _CellProgress(len(cells), enabled=not (quiet or as_json)) as bar:
                rows = run_matrix(cells, executor, jobs, threads, address, cpus_per_cell, gpus_per_cell,
                                  on_cell=bar.cell_done, round_progress=bar.rounds)
            elapsed = time.perf_counter() - t0
    except USER_ERRORS as e:
        fail(str(e))
    code = exit_code(rows)
    folder = str(out_dir if out_dir is not None else suite.out)
    if as_json:
        emit_json({"suite": suite.name, "out": folder, "dry_run": dry_run, "counts": _counts(rows),
                   "exit_code": code, "cells": rows})
    else:
        _print_table(suite, folder, rows, None if dry_run else elapsed)
    raise typer.Exit(code)


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


STATUS_STYLE = {"ok": "green", "diverged": "yellow", "failed": "bold red", "skipped": "dim",
                "would run": "cyan", "would skip": "dim", "would fail": "bold red"}


def _print_table(suite: Suite, folder: str, rows: list[dict[str, Any]], elapsed: Optional[float]) -> None:
    from rich.table import Table

    from hfl_bench.cli import _fmt, err, out

    title = f"suite {suite.name}: {len(rows)} cells -> {folder}"
    t = Table(title=title)
    for col, justify in (("method", "left"), ("task", "left"), ("seed", "right"), ("status", "left"),
                         ("global acc (%)", "right"), ("time (s)", "right"), ("record", "left")):
        t.add_column(col, justify=justify)
    for r in rows:
        style = STATUS_STYLE.get(r["status"], "")
        record = Path(r["record"]).name if r["record"] else "-"
        t.add_row(r["method"], r["task"], _fmt(r["seed"]), f"[{style}]{r['status']}[/]", _fmt(r["global_acc"]),
                  _fmt(r["wall_time_s"], 1), record)
    out.print(t)
    counts = ", ".join(f"{n} {s}" for s, n in _counts(rows).items())
    took = f" in {elapsed:.1f} s" if elapsed is not None else ""
    out.print(f"{counts}{took}", highlight=False)
    for r in rows:
        if r["error"] and r["status"] in ("failed", "would fail"):
            err.print(f"[red]{r['status']}:[/] {r['method']} on {r['task']}, seed {r['seed']}: {r['error']}",
                      highlight=False, soft_wrap=True)


class _CellProgress:
    """A rich progress bar over cells; in-process runs also show the current cell's rounds."""

    def __init__(self, total: int, enabled: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from hfl_bench.cli import err

        self.enabled = enabled
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True)
        self.total = total

    def __enter__(self):
        if self.enabled:
            self.bar.start()
            self.cells = self.bar.add_task("cells", total=self.total)
            self.round_task = None
        return self

    def cell_done(self, row: dict[str, Any]) -> None:
        if self.enabled:
            self.bar.update(self.cells, advance=1,
                            description=f"cells (last: {row['method']} on {row['task']}: {row['status']})")

    def rounds(self, cell: Cell) -> Optional[Callable]:
        if not self.enabled:
            return None
        if self.round_task is not None:
            self.bar.remove_task(self.round_task)
        self.round_task = self.bar.add_task(f"  {cell.label}", total=cell.cfg.rounds)

        def update(rnd: int, total: int, entry: dict[str, Any]) -> None:
            self.bar.update(self.round_task, completed=rnd)

        return update

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.stop()
        return False
