"""Executors: in-process (``--jobs 1``), local worker processes, one per cell (forkserver, not
fork: torch is imported), or Ray tasks on a local or existing cluster. Workers and Ray tasks
return the record and the driver writes it (``done``), so records land in the driver's folder
even on a multi-machine cluster; a worker that dies costs only its own cell. Local workers of
CUDA cells share out the visible GPUs (``--cells-per-gpu``, ``hfl_bench.matrix.gpus``).

Workers and Ray tasks load the plugins the driver resolved at the matrix's start, no others
(``plugins``: ``hfl_bench.registry.resolve_plugins`` / ``pin``): a plugin installed while a
matrix runs is not loaded by its later cells, so it cannot change or break them.

A local cell's rounds reach the driver as they end (``on_round``: the experiment trackers log
them live); a Ray task's reach it with its record.

Workers die with their driver (``die_with``), however it ends, and leave Ctrl-C to it: the
driver then ends them at once (``stop_workers``). A local Ray started by the driver is shut down
with it; on Ctrl-C the cells in flight are cancelled. SIGTERM ends a Ray matrix as it ends a local
one (``TermAsLocal``): the cells in flight cancelled, Ray shut down, then the driver dies of the
signal, its finished records and its cells' checkpoints kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Optional

from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.matrix.cells import error_text, failed_record, run_cell
from hfl_bench.matrix.suite import Cell
from hfl_bench.resolved import ResolvedRun
from hfl_bench.runpath import each_round

EXECUTORS = ("local", "ray")

Done = Callable[[Cell, dict[str, Any]], None]
OnRound = Callable[[Cell, dict[str, Any]], None]  # a cell's history entry, as the round ends
# The entry points a matrix's driver loaded at its start (``hfl_bench.registry.resolve_plugins``).
Plugins = Optional[tuple[tuple[str, str, str, str], ...]]


WATCH_INTERVAL_S = 0.5  # how often a pool worker checks that its driver is still there
RAY_WAIT_S = 0.5  # how long the Ray driver blocks in ray.wait, which does not run signal handlers


def _pool_init(threads: int, driver_pid: Optional[int] = None) -> None:
    """Set up one pool worker: its torch threads; Ctrl-C left to the driver (which stops the pool);
    and death with the driver (``die_with``)."""
    import os
    import signal

    os.environ["OMP_NUM_THREADS"] = str(threads)  # for anything this worker starts
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver handles Ctrl-C and stops this worker
    if driver_pid is not None:
        die_with(driver_pid)
    import torch

    torch.set_num_threads(threads)


def die_with(driver_pid: int, interval: float = WATCH_INTERVAL_S) -> None:
    """End this process when the process ``driver_pid`` ends, however it ends (SIGKILL included),
    so a killed matrix leaves no worker computing (each holds a cell's data and models).

    Two ways, so it holds wherever one does not: on Linux the kernel's parent-death signal
    (``prctl(PR_SET_PDEATHSIG, SIGKILL)``; a forkserver worker's parent is the fork server, which
    exits when the driver does); everywhere, a daemon thread that checks the driver every
    ``interval`` seconds (psutil: pid and start time, so a reused pid is not mistaken for it; a
    zombie counts as gone) and kills this process once it is gone."""
    import os
    import signal
    import threading
    import time

    import psutil

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the thread alone
        pass
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:  # already gone
        os.kill(os.getpid(), signal.SIGKILL)
        return

    def gone() -> bool:
        try:
            return not driver.is_running() or driver.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def watch() -> None:
        while not gone():
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="hfl-bench-driver-watch", daemon=True).start()


@dataclasses.dataclass(frozen=True)
class RoundReport:
    """A pool worker's message as each round ends: the round's history entry (only when the driver
    asked for rounds: ``on_round``)."""

    entry: dict[str, Any]


def run_in_process(cells: list[Cell], done: Done, threads: Optional[int] = None,
                   round_progress: Optional[Callable[[Cell], Callable]] = None,
                   on_round: Optional[OnRound] = None) -> None:
    """Serially, in this process (``--jobs 1``)."""
    for cell in cells:
        rounds = (lambda rnd, total, entry, c=cell: on_round(c, entry)) if on_round else None
        progress = each_round(round_progress(cell) if round_progress else None, rounds)
        done(cell, run_cell(job_of(cell), threads, progress))


def run_process_pool(cells: list[Cell], done: Done, jobs: int, threads: int = 1,
                     cells_per_gpu: Optional[int] = None, gpus: Optional[int] = None,
                     worker: Optional[Callable] = None, plugins: Plugins = None,
                     on_round: Optional[OnRound] = None) -> None:
    """Up to ``jobs`` cells at once, each in a worker process of its own that sends its record back
    to this process. A worker that dies (killed by the out-of-memory killer, SIGKILL, a crash in
    native code) costs only its own cell, written as failed with the signal or exit code; the
    other running and pending cells go on (a shared pool breaks as a whole when one worker dies).

    CUDA cells also share out the ``gpus`` visible GPUs (default: ``gpus.visible_gpus``): each
    starts on the GPU with the fewest cells running, at most ``cells_per_gpu`` per GPU (None:
    auto, from the peak memory the workers report; ``hfl_bench.matrix.gpus``). A pending cell that
    does not fit yet waits, and the cells after it that fit start first. ``worker`` is what each
    worker process runs (default ``_cell_worker``; tests put a stand-in there), pinned to ``plugins``
    (None: whatever is installed when it starts). With ``on_round``, each worker sends each round's
    history entry as the round ends (``RoundReport``) and the driver passes it on."""
    import multiprocessing
    import os
    from multiprocessing.connection import wait

    from hfl_bench.matrix.gpus import GpuPlan, MemoryReport, may_use_cuda, take_slots, visible_gpus

    # forkserver, not fork (fork is unsafe once torch has started threads): the server imports
    # the engine once and every worker forks from it, instead of each worker importing torch;
    # timm too (the CLI imports it lazily, at the first model: a few seconds per cell otherwise).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["hfl_bench.engine", "hfl_bench.recording", "hfl_bench.matrix.cells",
                                    "hfl_bench.methods", "hfl_bench.tasks", "timm"])
    if gpus is None:  # a CPU-only suite never asks
        gpus = visible_gpus() if any(may_use_cuda(cell.cfg.device) for cell in cells) else 0
    plan = GpuPlan(gpus, cells_per_gpu)
    worker = worker or (functools.partial(_cell_worker, rounds=True) if on_round else _cell_worker)
    pending = list(cells)
    # receiving end -> (process, cell, receiving end, its GPU or None)
    running: dict[Any, tuple[Any, Cell, Any, Optional[int]]] = {}
    try:
        while pending or running:
            starts = take_slots([cell.cfg.device for cell in pending], plan, jobs - len(running), idle=not running)
            for i, gpu in starts:
                cell = pending[i]
                receive, send = context.Pipe(duplex=False)
                # the worker's own copy names its GPU; ``device`` is not in the config hash, so the
                # record path and the claim on it are the cell's as planned
                job = job_of(cell, None if gpu is None else f"cuda:{gpu}")
                process = context.Process(target=_pinned, args=(worker, plugins, job, threads, os.getpid(), send),
                                          name=f"hfl-bench cell {cell.label}", daemon=True)
                process.start()
                send.close()  # this process keeps only the receiving end: EOF once the worker is gone
                running[receive] = (process, cell, receive, gpu)
            taken = {i for i, _ in starts}
            pending = [cell for i, cell in enumerate(pending) if i not in taken]
            for receive in wait(list(running)):
                process, cell, _, gpu = running[receive]
                message = _receive(receive)
                if isinstance(message, MemoryReport):  # the cell runs on; its peak resizes the plan
                    plan.observe(gpu, message.peak_bytes, message.total_bytes)
                    continue
                if isinstance(message, RoundReport):
                    if on_round is not None:
                        on_round(cell, message.entry)
                    continue
                del running[receive]
                plan.finish(gpu)
                record = _worker_result(process, cell, receive, message)
                plan.observe(gpu, _record_cuda_peak(record))
                done(cell, record)
    except BaseException:  # Ctrl-C: end the running cells (their checkpoints stay for the rerun)
        stop_workers([process for process, _, _, _ in running.values()])
        raise


def _pinned(worker: Callable, plugins: Plugins, *args: Any) -> None:
    """A pool worker's target: load only the driver's plugins in this process, then ``worker``.
    (Pinned here, not in the fork server: the server may outlive one matrix in a process.)"""
    from hfl_bench.registry import pin

    pin(plugins)
    worker(*args)


def job_of(cell: Cell, device: Optional[str] = None) -> ResolvedRun | RunConfig:
    """What a cell's worker runs: its ``ResolvedRun`` (a bare config for a cell built without one),
    on ``device`` when given (not hashed: the same record path and claim)."""
    if cell.run is not None:
        return cell.run if device is None else cell.run.with_device(device)
    return cell.cfg if device is None else dataclasses.replace(cell.cfg, device=device)


def _cell_worker(job: ResolvedRun | RunConfig, threads: int, driver_pid: int, send, rounds: bool = False) -> None:
    """One cell in its own worker process: set up as a pool worker, run, send the record back (the
    last message; a CUDA cell sends its peak memory once before it, ``gpus.memory_reporter``; with
    ``rounds``, each round's history entry as the round ends, ``RoundReport``)."""
    from hfl_bench.matrix.gpus import memory_reporter

    _pool_init(threads, driver_pid)
    device = job.cfg.device if isinstance(job, ResolvedRun) else job.device
    each = (lambda rnd, total, entry: send.send(RoundReport(entry))) if rounds else None
    send.send(run_cell(job, threads, each_round(memory_reporter(device, send.send), each)))
    send.close()


def _receive(receive) -> Any:
    """The next message a worker sent, or None once it is gone without one."""
    try:
        return receive.recv()
    except (EOFError, OSError):
        return None


def _worker_result(process, cell: Cell, receive, record: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The record a finished worker sent, or a failed record saying how the worker died."""
    receive.close()
    process.join()
    if record is not None:
        return record
    return failed_record(cell.cfg, f"WorkerDied: {death(process.exitcode)}; the other cells went on")


def _record_cuda_peak(record: dict[str, Any]) -> Optional[int]:
    """A finished cell's peak CUDA memory over all its rounds (later rounds can top the first)."""
    return ((record.get("cost") or {}).get("peak_memory") or {}).get("cuda_bytes")


def death(exitcode: Optional[int]) -> str:
    """How a worker process ended, in words (a negative exit code is the signal that ended it)."""
    import signal

    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (as the out-of-memory killer does: lower --jobs or the model size)" if name == "SIGKILL" else ""
        return f"the worker process running this cell was killed by {name}{hint}"
    return f"the worker process running this cell exited with code {exitcode} without a record"


def stop_workers(processes: list, timeout: float = 5.0) -> None:
    """End worker processes now (SIGTERM, then SIGKILL), each gone before this returns; a second
    Ctrl-C meanwhile is ignored (it would leave a traceback, and the workers running)."""
    import signal

    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        previous = None
    try:
        for p in processes:
            if p.is_alive():
                p.terminate()
        for p in processes:
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join(timeout)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


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


class _Terminated(BaseException):
    """SIGTERM reached a Ray matrix's driver (``TermAsLocal``); not an Exception, so no cell's
    error handling takes it for a failure."""


class TermAsLocal:
    """SIGTERM in a Ray matrix's driver, handled as a local matrix's driver takes it: the process
    ends by the signal (exit status 143 in a shell, -15 from ``subprocess``), silently, keeping
    the records already written and the checkpoints of the cells in flight, so the same command
    resumes. ``ray.init`` replaces any SIGTERM handler twice over (a Python one that exits with the
    signal's number, and the core worker's native failure handler that prints a crash dump and
    aborts, exit 134), so ``install`` is called after it and puts a handler of ours back; Ray's
    clean-up (cancelling the cells in flight, ``ray.shutdown``) runs as the ``_Terminated`` it
    raises unwinds, and ``finish`` then ends the process by SIGTERM itself. A SIGTERM that arrives
    while the driver fetches and writes a finished cell's record waits until it is written
    (``held``). Only the main thread can set handlers; elsewhere this does nothing (Ray's own
    handling stays). A SIGTERM to the whole process group also reaches the local Ray's own
    processes (they share it), which drain for some seconds; the driver ends the same way after."""

    def __init__(self) -> None:
        import signal
        import threading

        self.active = threading.current_thread() is threading.main_thread()
        self.previous = signal.getsignal(signal.SIGTERM) if self.active else None
        self.received = False
        self.busy = False

    def install(self) -> None:
        import signal

        if self.active:
            signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        import signal

        if self.received:
            return
        self.received = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one would cut the clean-up short
        if not self.busy:
            raise _Terminated()

    @contextlib.contextmanager
    def held(self):
        """A SIGTERM meanwhile (a finished cell's record fetched and written) waits until the end."""
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
        if self.received:
            raise _Terminated()

    def finish(self) -> None:
        """After Ray's clean-up: die by SIGTERM if one came, else put the previous handler back."""
        import os
        import signal

        if not self.active:
            return
        if self.received:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
            os.kill(os.getpid(), signal.SIGTERM)  # the process ends here, as a local matrix would
        signal.signal(signal.SIGTERM, self.previous if self.previous is not None else signal.SIG_DFL)


def run_ray(cells: list[Cell], done: Done, address: Optional[str], cpus_per_cell: float = 1,
            gpus_per_cell: Optional[float] = None, jobs: Optional[int] = None,
            threads: Optional[int] = None, plugins: Plugins = None) -> None:
    """Each cell a Ray task with its CPU/GPU request; at most ``jobs`` in flight (default: all,
    Ray's scheduler decides). The task, pinned to ``plugins``, returns the record; ``done`` writes
    it here. SIGTERM ends it as it ends a local matrix (``TermAsLocal``)."""
    ray = ray_module()
    term = TermAsLocal()
    started = False
    try:
        started = start_ray(address)
        term.install()  # after ray.init, which replaced it
        _ray_cells(ray, cells, done, cpus_per_cell, gpus_per_cell, jobs, threads, plugins, term.held)
    except _Terminated:
        pass  # the cells in flight are cancelled; ends by the signal below
    finally:
        try:
            if started:
                ray.shutdown()
        finally:
            term.finish()


def _ray_cells(ray, cells: list[Cell], done: Done, cpus_per_cell: float,
               gpus_per_cell: Optional[float], jobs: Optional[int], threads: Optional[int],
               plugins: Plugins, held: Callable = contextlib.nullcontext) -> None:
    in_flight: dict[Any, Cell] = {}
    try:
        remote = ray.remote(run_cell)
        resources = ray.cluster_resources()
        threads = threads or max(1, int(cpus_per_cell))
        pending = list(cells)
        while pending or in_flight:
            while pending and (not jobs or len(in_flight) < jobs):
                cell = pending.pop(0)
                gpus = cell_gpus(cell.cfg, gpus_per_cell, resources.get("GPU", 0))
                problem = unschedulable(cpus_per_cell, gpus, resources)
                if problem:  # Ray would wait for it forever
                    done(cell, failed_record(cell.cfg, f"ConfigError: {problem}"))
                    continue
                options = dict(num_cpus=cpus_per_cell, num_gpus=gpus, max_retries=0)
                in_flight[remote.options(**options).remote(job_of(cell), threads, plugins=plugins)] = cell
            if not in_flight:
                break
            # with a timeout: a signal's Python handler (SIGTERM, Ctrl-C) runs only between calls
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=RAY_WAIT_S)
            if not ready:
                continue
            with held():  # a finished cell's record is written before a SIGTERM ends the driver
                cell = in_flight.pop(ready[0])
                try:
                    record = ray.get(ready[0])
                except Exception as e:  # noqa: BLE001 - a crashed worker or node
                    record = failed_record(cell.cfg, error_text(e, with_traceback=False))
                done(cell, record)
    except BaseException:  # Ctrl-C, SIGTERM: cells in flight on a cluster would otherwise run on
        for ref in list(in_flight):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort
                pass
        raise
