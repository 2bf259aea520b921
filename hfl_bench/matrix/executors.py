"""The built-in executors (``executor_api``): ``local``, the cells one after another in this
process; ``pool``, each cell in a worker process of its own (forkserver, not fork: torch is
imported), up to ``--jobs`` at once; ``ray``, each cell a Ray task on a local or existing cluster.
``local`` with ``--jobs`` > 1 runs the pool, as ``--executor local --jobs N`` always did. Workers and
Ray tasks return the record and the driver writes it (``on_record``), so records land in the
driver's folder even on a multi-machine cluster; a worker that dies costs only its own cell, and
a Ray node that dies costs none (its cells are sent again, ``node_lost``). Pool
workers of CUDA cells share out the visible GPUs (``--cells-per-gpu``, ``hfl_bench.matrix.gpus``).

Workers and Ray tasks load the plugins the driver resolved at the matrix's start, no others
(``plugins``: ``hfl_bench.registry.resolve_plugins`` / ``pin``): a plugin installed while a
matrix runs is not loaded by its later cells, so it cannot change or break them.

Every executor reports each cell's rounds as they end (``on_round``: the experiment trackers log
them live): a pool worker sends them down its pipe (``RoundReport``), a Ray task puts them on a
``ray.util.queue.Queue`` that the driver drains while it waits for records.

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
import logging
from typing import Any, Callable, ClassVar, Mapping, Optional

from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.matrix.cells import error_text, failed_record, run_cell
from hfl_bench.matrix.executor_api import (
    EXECUTORS,
    Executor,
    ExecutorOptions,
    OnRecord,
    OnRound,
    Plugins,
    flag,
    job_of,
    register_executor,
    run_here,
)
from hfl_bench.matrix.suite import Cell
from hfl_bench.registry import RegistryError
from hfl_bench.resolved import ResolvedRun

__all__ = ["EXECUTORS", "LocalExecutor", "LocalOptions", "PoolExecutor", "PoolOptions", "RayExecutor",
           "RayOptions", "executor_class", "executor_options", "job_of", "make_executor", "run_process_pool"]

Done = OnRecord  # the name the functions below always used
log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- looking executors up
# Here, not in executor_api: importing this module registers the built-ins below before any
# plugin's entry point loads, so a lookup always sees them and no plugin takes their names.


def executor_class(name: str) -> type[Executor]:
    """The executor registered as ``name``; an unknown name is a ``ConfigError`` with the closest
    registered one ("Did you mean") and the list."""
    try:
        return EXECUTORS.get(name)
    except RegistryError as e:
        raise ConfigError(f"--executor: {e}") from None


def executor_options(name: str, given: Optional[Mapping[str, Any]] = None) -> ExecutorOptions:
    """The options of executor ``name`` from the flags given (field name -> value; a field present
    counts as given, even as None), checked: a field the executor does not take names the
    executors that do (and the executor's hint, ``ExecutorOptions.HINTS``)."""
    given = given or {}
    options = executor_class(name).Options
    takes = {f.name for f in dataclasses.fields(options)}
    for field in given:
        if field not in takes:
            owners = [n for n, cls in EXECUTORS.items() if field in {f.name for f in dataclasses.fields(cls.Options)}]
            listed = " or ".join([", ".join(owners[:-1]), owners[-1]] if len(owners) > 1 else owners)
            where = f"is for --executor {listed}" if owners else "is for no executor"
            hint = options.HINTS.get(field)
            raise ConfigError(f"{flag(field)} {where}, not {name}" + (f"; {hint}" if hint else ""))
    made = options(**{k: v for k, v in given.items() if v is not None})
    made.check()
    return made


def make_executor(executor: str | Executor, options: Optional[ExecutorOptions] = None) -> Executor:
    """An executor instance from a name and its options (None: its defaults), or the instance given
    (which has its own options: passing others too is an error)."""
    if isinstance(executor, Executor):
        if options is not None and options is not executor.options:
            raise ConfigError("an Executor instance carries its own options: pass the name with options, "
                              "or the instance alone")
        return executor
    if not isinstance(executor, str):
        raise ConfigError(f"executor must be a registered name or an Executor, got {executor!r}")
    return executor_class(executor)(options)


# ----------------------------------------------------------------------------- the built-ins


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


_POOL_GPU_HINT = "in the pool, --cells-per-gpu sets how many cells share a GPU"


@dataclasses.dataclass(frozen=True)
class LocalOptions(ExecutorOptions):
    """``--executor local``: ``threads``, torch threads (None: the process's, unchanged). ``jobs``
    above 1 hands the cells to the pool (``PoolOptions``, with ``cells_per_gpu``), as
    ``--executor local --jobs N`` always did; ``cells_per_gpu`` does nothing in this process."""

    threads: Optional[int] = None
    jobs: int = 1
    cells_per_gpu: Optional[int] = None

    HINTS: ClassVar[dict[str, str]] = {"gpus_per_cell": _POOL_GPU_HINT}


@register_executor("local")
class LocalExecutor(Executor):
    """The cells one after another, in this process (the default; with --jobs > 1, the pool)."""

    Options = LocalOptions
    options: LocalOptions

    @property
    def serial(self) -> bool:
        return self.options.jobs == 1

    def run(self, cells: list[Cell], on_record: OnRecord, on_round: Optional[OnRound] = None,
            plugins: Plugins = None) -> None:
        o = self.options
        if o.jobs > 1:
            PoolExecutor(PoolOptions(o.jobs, o.threads, o.cells_per_gpu)).run(cells, on_record, on_round, plugins)
            return
        for cell in cells:
            on_record(cell, run_here(cell, on_round, o.threads))


@dataclasses.dataclass(frozen=True)
class PoolOptions(ExecutorOptions):
    """``--executor pool``: ``jobs`` worker processes at most (None: the CPUs' count), ``threads``
    torch threads each (None: 1), ``cells_per_gpu`` most cells per visible GPU (None: auto,
    ``hfl_bench.matrix.gpus``)."""

    jobs: Optional[int] = None
    threads: Optional[int] = None
    cells_per_gpu: Optional[int] = None

    HINTS: ClassVar[dict[str, str]] = {"gpus_per_cell": _POOL_GPU_HINT}


@register_executor("pool")
class PoolExecutor(Executor):
    """Each cell in a worker process of its own, up to --jobs at once (a dying worker fails only its cell)."""

    Options = PoolOptions
    options: PoolOptions

    def run(self, cells: list[Cell], on_record: OnRecord, on_round: Optional[OnRound] = None,
            plugins: Plugins = None) -> None:
        import os

        o = self.options
        run_process_pool(cells, on_record, o.jobs or os.cpu_count() or 1, o.threads or 1, o.cells_per_gpu,
                         plugins=plugins, on_round=on_round)


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


def _cell_worker(job: ResolvedRun | RunConfig, threads: int, driver_pid: int, send, rounds: bool = False) -> None:
    """One cell in its own worker process: set up as a pool worker, run, send the record back (the
    last message; a CUDA cell sends its peak memory once before it, ``gpus.memory_reporter``; with
    ``rounds``, each round's history entry as the round ends, ``RoundReport``)."""
    from hfl_bench.matrix.gpus import memory_reporter
    from hfl_bench.runpath import each_round  # the run path (numpy, the record writer): in the worker only

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


_RAY_GPU_HINT = "on Ray, --gpus-per-cell sets each cell's share of a GPU (0.5: two cells per GPU)"


@dataclasses.dataclass(frozen=True)
class RayOptions(ExecutorOptions):
    """``--executor ray``: ``address`` of an existing cluster (or ``auto``; None: start a local Ray
    on loopback); ``cpus_per_cell`` and ``gpus_per_cell`` each task asks for (GPUs None: 1 for a
    CUDA cell, or auto on a cluster with GPUs, else 0, ``cell_gpus``); ``jobs`` most cells in
    flight (None: all, Ray's scheduler decides); ``threads`` torch threads (None: ``cpus_per_cell``)."""

    address: Optional[str] = None
    cpus_per_cell: float = 1
    gpus_per_cell: Optional[float] = None
    jobs: Optional[int] = None
    threads: Optional[int] = None

    HINTS: ClassVar[dict[str, str]] = {"cells_per_gpu": _RAY_GPU_HINT}


@register_executor("ray")
class RayExecutor(Executor):
    """Each cell a Ray task on a local Ray or an existing cluster (--address), records written here."""

    Options = RayOptions
    options: RayOptions

    def run(self, cells: list[Cell], on_record: OnRecord, on_round: Optional[OnRound] = None,
            plugins: Plugins = None) -> None:
        run_ray(cells, on_record, self.options, plugins, on_round)


def run_ray(cells: list[Cell], done: Done, options: RayOptions, plugins: Plugins = None,
            on_round: Optional[OnRound] = None) -> None:
    """Each cell a Ray task with its CPU/GPU request; at most ``options.jobs`` in flight. The task,
    pinned to ``plugins``, returns the record; ``done`` writes it here. With ``on_round``, each
    task puts its rounds' history entries on a Ray queue as they end, and the driver passes them
    on while it waits (``_RayRounds``). SIGTERM ends it as it ends a local matrix (``TermAsLocal``)."""
    ray = ray_module()
    term = TermAsLocal()
    started = False
    try:
        started = start_ray(options.address)
        term.install()  # after ray.init, which replaced it
        with _RayRounds.open(ray, cells, on_round) as rounds:
            _ray_cells(ray, cells, done, options, plugins, rounds, term.held)
    except _Terminated:
        pass  # the cells in flight are cancelled; ends by the signal below
    finally:
        try:
            if started:
                ray.shutdown()
        finally:
            term.finish()


def _ray_task(job: ResolvedRun | RunConfig, threads: int, plugins: Plugins, rounds: Any = None,
              key: int = 0) -> dict[str, Any]:
    """A Ray task: one cell's record; with ``rounds`` (a ``ray.util.queue.Queue``), each round's
    history entry put there as ``(key, entry)`` as the round ends."""
    def report(rnd: int, total: int, entry: dict[str, Any]) -> None:
        try:
            rounds.put((key, entry))
        except Exception:  # noqa: BLE001 - a lost report never fails the cell: the record has every round
            pass

    return run_cell(job, threads, report if rounds is not None else None, plugins=plugins)


class _RayRounds:
    """The driver's end of the round reports: a Ray queue (an actor asking for no CPU, kept on the
    driver's node where it can: another node's loss does not take it along) that the tasks put
    ``(cell index, entry)`` on, drained into ``on_round``; with no ``on_round``, nothing. A round a
    cell already reported is not passed on again: a cell sent again after losing its node reports
    the rounds after its checkpoint a second time."""

    def __init__(self, queue: Any, cells: list[Cell], on_round: Optional[OnRound]):
        self.queue, self.cells, self.on_round = queue, cells, on_round
        self.last: dict[int, int] = {}  # cell index -> the last round passed on

    @classmethod
    @contextlib.contextmanager
    def open(cls, ray, cells: list[Cell], on_round: Optional[OnRound]):
        queue = None
        if on_round is not None:
            from ray.util.queue import Queue
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
            queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        try:
            yield cls(queue, cells, on_round)
        finally:
            if queue is not None:
                with contextlib.suppress(Exception):  # best effort: ray.shutdown ends it anyway
                    queue.shutdown()

    def drain(self) -> None:
        """Pass on every round reported so far (in the order put, so a cell's rounds in order)."""
        if self.queue is None:
            return
        try:
            size = self.queue.qsize()
            entries = self.queue.get_nowait_batch(size) if size else []
        except Exception:  # noqa: BLE001 - the queue is gone: the trackers replay the rest from the records
            self.queue = None
            return
        for key, entry in entries:
            rnd = entry.get("round")
            if isinstance(rnd, int):
                if key in self.last and rnd <= self.last[key]:
                    continue
                self.last[key] = rnd
            self.on_round(self.cells[key], entry)


NODE_RETRIES = 3  # how many times a cell whose node was lost is sent again before it is failed


def node_lost(ray, error: BaseException, nodes_before: set[str]) -> bool:
    """Whether a Ray task's error means it lost its node, not that the cell itself broke: the node
    died (``NodeDiedError``), its finished record was lost with the node (``ObjectLostError``), or
    its worker process died while a node that was alive when it started is now gone (Ray may
    report a worker on a removed node as crashed before it knows the node is dead). A worker that
    crashed on a node still alive (the out-of-memory killer, a crash in native code) is the cell's
    own failure, as in the pool."""
    exceptions = ray.exceptions
    if isinstance(error, (exceptions.NodeDiedError, exceptions.ObjectLostError)):
        return True
    if isinstance(error, (exceptions.WorkerCrashedError, exceptions.LocalRayletDiedError)):
        return bool(nodes_before - _alive_nodes(ray))
    return False


def _alive_nodes(ray) -> set[str]:
    try:
        return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    except Exception:  # noqa: BLE001 - the cluster cannot say: treat every node as gone
        return set()


def _ray_cells(ray, cells: list[Cell], done: Done, options: RayOptions, plugins: Plugins,
               rounds: _RayRounds, held: Callable = contextlib.nullcontext) -> None:
    """Submit the cells (at most ``options.jobs`` in flight) and hand each record to ``done`` once.
    A cell whose node is lost (``node_lost``) is sent again, at most ``NODE_RETRIES`` times, to
    whatever node can take it: it continues from its last checkpoint when the nodes share the
    output folder (its record says ``federation.resumed_from_rounds``), else starts over, with the
    same result either way (a run is deterministic; resuming is bit-identical). Only the driver
    writes records, and only the attempt that returns one is written: a lost attempt writes nothing."""
    in_flight: dict[Any, tuple[int, Cell, set[str]]] = {}  # ref -> (key, cell, nodes alive when sent)
    tries: dict[int, int] = {}  # key -> times the cell was sent again after losing its node
    try:
        remote = ray.remote(_ray_task)
        resources = ray.cluster_resources()
        cpus, jobs = options.cpus_per_cell, options.jobs
        threads = options.threads or max(1, int(cpus))
        pending = list(enumerate(cells))
        while pending or in_flight:
            while pending and (not jobs or len(in_flight) < jobs):
                key, cell = pending.pop(0)
                gpus = cell_gpus(cell.cfg, options.gpus_per_cell, resources.get("GPU", 0))
                problem = unschedulable(cpus, gpus, resources)
                if problem:  # Ray would wait for it forever
                    if key in tries:
                        problem += " (since the node it ran on was lost)"
                    done(cell, failed_record(cell.cfg, f"ConfigError: {problem}"))
                    continue
                # no retries by Ray: the driver decides what a lost node costs (node_lost) and says so
                task = remote.options(num_cpus=cpus, num_gpus=gpus, max_retries=0)
                in_flight[task.remote(job_of(cell), threads, plugins, rounds.queue, key)] = \
                    (key, cell, _alive_nodes(ray))
            if not in_flight:
                break
            # with a timeout: a signal's Python handler (SIGTERM, Ctrl-C) runs only between calls
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=RAY_WAIT_S)
            rounds.drain()  # a finished task put its rounds before returning: all of them are here
            if not ready:
                continue
            with held():  # a finished cell's record is written before a SIGTERM ends the driver
                key, cell, nodes = in_flight.pop(ready[0])
                try:
                    record = ray.get(ready[0])
                except Exception as e:  # noqa: BLE001 - a crashed worker or node
                    if node_lost(ray, e, nodes) and tries.get(key, 0) < NODE_RETRIES:
                        tries[key] = tries.get(key, 0) + 1
                        log.warning("cell %s lost its Ray node (%s); sent again (%d of %d), from its checkpoint "
                                    "if it left one", cell.label, type(e).__name__, tries[key], NODE_RETRIES)
                        pending.insert(0, (key, cell))
                        resources = ray.cluster_resources()  # without the lost node's
                        continue
                    record = failed_record(cell.cfg, error_text(e, with_traceback=False))
                done(cell, record)
    except BaseException:  # Ctrl-C, SIGTERM: cells in flight on a cluster would otherwise run on
        for ref in list(in_flight):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort
                pass
        raise
