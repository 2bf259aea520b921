"""Several matrix cells on one GPU (``--cells-per-gpu``, local worker pool): which GPU a CUDA cell
runs on, and how many cells each GPU takes at once.

With ``--cells-per-gpu N`` each GPU takes at most N cells. With ``auto`` (the default) each takes
one until a worker reports its peak CUDA memory after its first round (``MemoryReport``); from
then on a GPU takes ``gpu_slots(its total memory, the largest peak reported so far)`` cells. A GPU
whose total is not known yet (no cell has reported from it) stays at one. ``--jobs`` caps every
cell, GPU or not, on top of this.

Everything here is plain bookkeeping, testable without a GPU; the driver never initialises CUDA
(``visible_gpus`` asks ``torch.cuda.device_count``, which reads NVML and creates no context): a
CUDA context in the driver would hold memory on every GPU for the whole matrix. The workers,
which hold a context anyway, measure.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from hfl_bench.config import ConfigError

AUTO = "auto"
MEMORY_FRACTION = 0.8  # of a GPU's memory that auto plans to fill: the rest covers what a peak misses
MAX_CELLS_PER_GPU = 8  # auto's ceiling: past it the cells compete for the GPU's compute, not memory


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """What a pool worker running a CUDA cell sends its driver once its first round is done, before
    the record (which stays the last message): its peak CUDA memory so far (allocated, or reserved
    by the caching allocator if larger) and its GPU's total memory, in bytes."""

    peak_bytes: int
    total_bytes: Optional[int]


def parse_cells_per_gpu(value: Optional[str]) -> Optional[int]:
    """``--cells-per-gpu``: a positive integer, or None for ``auto`` (also when not given)."""
    if value is None or value.strip().lower() == AUTO:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"--cells-per-gpu must be a positive integer or auto, got {value!r}")
    return n


def gpu_slots(total_bytes: Optional[int], peak_bytes: Optional[int]) -> int:
    """Cells one GPU takes under ``auto``: ``floor(MEMORY_FRACTION * total / peak)``, at least 1
    and at most ``MAX_CELLS_PER_GPU``; 1 while either figure is unknown."""
    if not total_bytes or not peak_bytes or peak_bytes <= 0:
        return 1
    return max(1, min(MAX_CELLS_PER_GPU, int(MEMORY_FRACTION * total_bytes // peak_bytes)))


def pick_gpu(running_per_gpu: Sequence[int], caps: Sequence[int]) -> Optional[int]:
    """The GPU a new cell goes to: of those under their cap, the one with the fewest cells running
    (the lowest index on a tie); None when every GPU is full."""
    open_gpus = [i for i, (n, cap) in enumerate(zip(running_per_gpu, caps)) if n < cap]
    return min(open_gpus, key=lambda i: (running_per_gpu[i], i)) if open_gpus else None


def may_use_cuda(device: str) -> bool:
    """Whether a cell of this ``device`` would run on a GPU were there one: ``cuda``, ``cuda:N`` or
    ``auto`` (``engine.pick_device``)."""
    return device == "auto" or device.startswith("cuda")


def is_cuda_cell(device: str, gpus: int) -> bool:
    """Whether a cell of this ``device`` runs on a GPU here (``may_use_cuda``, and a GPU is
    visible). With no GPU visible none is: a ``cuda`` cell then fails in its worker as it always did."""
    return gpus > 0 and may_use_cuda(device)


def pinned_gpu(device: str) -> Optional[int]:
    """The GPU a ``cuda:N`` device names (the cell keeps it); None for ``cuda`` and ``auto``."""
    name, _, index = device.partition(":")
    return int(index) if name == "cuda" and index.isdigit() else None


def visible_gpus() -> int:
    """The CUDA devices this process sees, without creating a CUDA context (NVML); 0 without torch's
    CUDA build."""
    import torch

    try:
        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - a broken driver: no GPU to plan for, the cells report it
        return 0


@dataclasses.dataclass
class GpuPlan:
    """The driver's view of its GPUs: the cells running on each, and under ``auto`` the largest peak
    reported and each GPU's total memory. ``fixed`` is ``--cells-per-gpu N``, None for auto."""

    gpus: int
    fixed: Optional[int] = None
    running: list[int] = dataclasses.field(default_factory=list)
    totals: dict[int, int] = dataclasses.field(default_factory=dict)
    peak: Optional[int] = None

    def __post_init__(self) -> None:
        self.running = self.running or [0] * self.gpus

    def caps(self) -> list[int]:
        """Cells each GPU may run at once now."""
        if self.fixed is not None:
            return [self.fixed] * self.gpus
        return [gpu_slots(self.totals.get(i), self.peak) for i in range(self.gpus)]

    def place(self, device: str) -> tuple[bool, Optional[int]]:
        """Whether a cell of this ``device`` may start now, and the GPU it takes (None: no GPU slot,
        a CPU cell or a ``cuda:N`` this machine does not have, which fails in its worker)."""
        if not is_cuda_cell(device, self.gpus):
            return True, None
        pinned = pinned_gpu(device)
        if pinned is not None:
            if pinned >= self.gpus:
                return True, None
            return self.running[pinned] < self.caps()[pinned], pinned
        gpu = pick_gpu(self.running, self.caps())
        return gpu is not None, gpu

    def start(self, gpu: Optional[int]) -> None:
        if gpu is not None:
            self.running[gpu] += 1

    def finish(self, gpu: Optional[int]) -> None:
        if gpu is not None:
            self.running[gpu] -= 1

    def observe(self, gpu: Optional[int], peak_bytes: Optional[int], total_bytes: Optional[int] = None) -> None:
        """A peak measured on ``gpu`` (a worker's report, or a finished record's): auto plans with
        the largest one so far, so a bigger cell shrinks every GPU's share (running cells go on)."""
        if peak_bytes:
            self.peak = max(self.peak or 0, int(peak_bytes))
        if gpu is not None and total_bytes:
            self.totals[gpu] = int(total_bytes)


def take_slots(devices: Sequence[str], plan: GpuPlan, free: int, idle: bool) -> list[tuple[int, Optional[int]]]:
    """The pending cells to start now: their indices in ``devices`` (the pending cells' devices, in
    order), each with its GPU (None: no GPU slot), at most ``free`` of them (what ``--jobs``
    leaves); each is counted as running in ``plan``. A cell that does not fit yet waits and the
    ones after it that fit go first. With nothing running (``idle``) the first cell starts even if
    the plan had no room: an idle GPU always has room, but a plan that said otherwise would leave
    the driver waiting on nothing."""
    chosen: list[tuple[int, Optional[int]]] = []
    for i, device in enumerate(devices):
        if len(chosen) >= free:
            break
        fits, gpu = plan.place(device)
        if fits:
            plan.start(gpu)
            chosen.append((i, gpu))
    if idle and not chosen and devices and free > 0:
        chosen.append((0, None))
    return chosen


def measure_memory(device: str) -> MemoryReport:
    """In a worker: the peak CUDA memory of this process on ``device`` so far, and that GPU's total."""
    import torch

    dev = torch.device(device)
    peak = max(torch.cuda.max_memory_allocated(dev), torch.cuda.memory_reserved(dev))
    return MemoryReport(int(peak), int(torch.cuda.get_device_properties(dev).total_memory))


def memory_reporter(device: str, send: Callable[[MemoryReport], None],
                    measure: Callable[[str], MemoryReport] = measure_memory) -> Optional[Callable]:
    """A ``run_cell`` progress callback that sends one ``MemoryReport`` after the first round a CUDA
    cell runs (None for any other device). Nothing it raises reaches the cell: a report is only a
    hint for the driver's plan, and a cell that never reports runs on unchanged."""
    if not device.startswith("cuda"):
        return None
    sent = False

    def report(rnd: int, total: int, entry: dict) -> None:
        nonlocal sent
        if sent:
            return
        sent = True
        try:
            send(measure(device))
        except Exception:  # noqa: BLE001 - see above
            pass

    return report
