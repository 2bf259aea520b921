"""A resolved run: everything one run needs, worked out once from its config.

``resolve_run(cfg)`` validates the config, resolves it against its task's defaults, puts it in
the one form that is hashed (``engine.load_task``), checks the method and its hyperparameters
(``engine.make_method``) and names the record and checkpoint files. Every way of running a
config takes the ``ResolvedRun`` it returns to the one run path (``hfl_bench.runpath``):
``hfl-bench run``, a matrix cell (local or Ray) and ``hfl_bench.run``. A config value is
checked and turned into a path here, once, and nowhere again.

Nothing here loads data or trains; torch is imported only after the config's values are checked
(a bad value costs no start-up).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hfl_bench import config as config_mod
from hfl_bench import locks, paths
from hfl_bench.config import RunConfig

if TYPE_CHECKING:
    from hfl_bench.data import Task
    from hfl_bench.method_api import Method
    from hfl_bench.method_card import MethodCard


class Built:
    """What resolution built while checking the config, handed once to the run that follows it
    (``ResolvedRun.built``) so the run does not build it again: the method instance, the
    modality plan and the fault plan. Once only: the method and the fault plan carry a run's state."""

    def __init__(self, method: Method, modality_plan: Any, fault_plan: Any):
        self._parts: Optional[tuple[Method, Any, Any]] = (method, modality_plan, fault_plan)

    def take(self) -> Optional[tuple[Method, Any, Any]]:
        parts, self._parts = self._parts, None
        return parts


@dataclass(frozen=True)
class ResolvedRun:
    """One run's resolved config and what follows from it. It pickles as its config and file
    names (a Ray task, a pool worker): the method class and the task are registry look-ups by
    name, made where they are used (after the matrix pins the plugins there, ``registry.pin``),
    and what resolution built stays in the process that resolved it."""

    cfg: RunConfig  # resolved against the task's defaults, in its canonical (hashed) form
    config_hash: str
    record_path: Path
    checkpoint_path: Path
    # the method version this code records for the run (``records.registered_version``: the card's,
    # with its aggregation rule's past "1.0"), as its record will say
    version: str | None = None
    # the config as its record stores it (``paths.portable_config``: no machine path)
    portable_config: Optional[dict[str, Any]] = field(default=None, compare=False)
    # what resolution built (the method, the plans), for this process's run only
    built: Optional[Built] = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "built": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def method_cls(self) -> type[Method]:
        """The registered method class (a registry look-up: after ``registry.pin`` in a worker)."""
        from hfl_bench.method_api import get_method_class

        return get_method_class(self.cfg.method)

    @property
    def task(self) -> Task:
        from hfl_bench.data import get_task

        return get_task(self.cfg.task)

    @property
    def card(self) -> MethodCard:
        return self.method_cls.card

    def claim(self) -> locks.Claim:
        """Claim the record file for this process (``locks.take``): ClaimError, one line, when a
        running process holds it."""
        return locks.take(self.record_path)

    def with_device(self, device: str) -> ResolvedRun:
        """The same run on another device (``device`` is not hashed: same record, same claim)."""
        return dataclasses.replace(self, cfg=dataclasses.replace(self.cfg, device=device))


def resolve_run(cfg: RunConfig | dict[str, Any]) -> ResolvedRun:
    """The ``ResolvedRun`` of a config or a mapping of settings (``RunConfig``'s fields), each
    value through each module once, downward: the settings checked, filled from the task's
    defaults and put in their hashed form (``config.resolve_settings``), the modality plan
    (``modalities.plan_for``), the fault spec and plan (``faults.resolve``), the device profile
    (``clock.canonical_config``), the method, its preset
    and hyperparameters (``method_api.resolve_method``), the record's file name
    (``paths.run_files``). Raises the project's own errors, each one line: ConfigError for a bad
    value, an unknown setting, method or hyperparameter (before any data loads), RegistryError for
    an unknown task or pool, UnsafePathError for a name that cannot name a file."""
    cfg = config_mod.resolve_settings(cfg, _task_defaults, _method_defaults)  # checked before torch is imported
    from hfl_bench import clock, data, faults, modalities
    from hfl_bench.aggregation import run_version
    from hfl_bench.method_api import resolve_method
    from hfl_bench.pools import get_pool

    if cfg.capacity_profile is not None:  # a profile without a levels pool: one line before any data loads
        get_pool(cfg.pool).check_profile(cfg.capacity_profile)
    modality_plan = modalities.plan_for(cfg, data.get_task(cfg.task).info)  # a setting that does not fit the task
    cfg, fault_plan = faults.resolve(cfg)
    cfg = clock.canonical_config(cfg)  # a bad profile: one line before any data loads
    cfg, method = resolve_method(cfg)
    files = paths.run_files(cfg)
    return ResolvedRun(cfg, files.config_hash, files.record, files.checkpoint,
                       run_version(method.card.version, method.hparams()), files.portable_config,
                       Built(method, modality_plan, fault_plan))


def _task_defaults(task: str, data_dir: Any) -> dict[str, Any]:
    from hfl_bench.data import task_defaults  # imports torch: only once the settings are checked

    return task_defaults(task, data_dir)


def _method_defaults(method: str) -> dict[str, Any]:
    from hfl_bench.method_api import method_defaults

    return method_defaults(method)


ConfigError = config_mod.ConfigError


# ----------------------------------------------------------------------------- torch threads

# The default thread count (``auto_threads``): one torch thread unless the models are large and
# many cores are idle; more threads on small models contend for the cores and run slower.
LARGE_MODEL_PARAMS = 1_000_000
MANY_IDLE_CORES = 4


def idle_cores() -> int:
    """Cores this process may use, less the 1-minute load average (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, int(cores - load))


def largest_model_params(pool: str, info: Any) -> int:
    """Parameters of the pool's largest member on this task (built on the meta device: no memory)."""
    import torch

    from hfl_bench.pools import build_model, get_pool, n_params

    with torch.device("meta"):
        return max(n_params(build_model(m, info)) for m in get_pool(pool).members)


def auto_threads(pool: str, info: Any) -> int:
    """The default torch thread count of a run: 1, unless the pool's models are large (>= 1M
    parameters) and many cores are idle (>= 4), then the idle cores, at most torch's default."""
    import torch

    idle = idle_cores()
    if idle < MANY_IDLE_CORES:
        return 1
    try:
        large = largest_model_params(pool, info) >= LARGE_MODEL_PARAMS
    except Exception:  # noqa: BLE001 - only a default; the run reports a broken pool itself
        return 1
    return min(idle, torch.get_num_threads()) if large else 1


class TorchThreads:
    """Sets torch's intra-op threads for a run and restores the previous count afterwards (the
    run may be in a process that goes on: tests, a notebook)."""

    def __init__(self):
        self.previous: int | None = None

    def set(self, n: int) -> None:
        import torch

        if self.previous is None:
            self.previous = torch.get_num_threads()
        torch.set_num_threads(n)
        try:  # only possible before any inter-op work in this process; harmless to skip
            torch.set_num_interop_threads(n)
        except RuntimeError:
            pass

    def restore(self) -> None:
        if self.previous is not None:
            import torch

            torch.set_num_threads(self.previous)
            self.previous = None
