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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hfl_bench import claims, paths
from hfl_bench import config as config_mod
from hfl_bench.config import RunConfig

if TYPE_CHECKING:
    from hfl_bench.data import Task
    from hfl_bench.method_api import Method
    from hfl_bench.method_card import MethodCard


@dataclass(frozen=True)
class ResolvedRun:
    """One run's resolved config and what follows from it. It pickles as its config and file
    names (a Ray task, a pool worker): the method class and the task are registry look-ups by
    name, made where they are used (after the matrix pins the plugins there, ``registry.pin``)."""

    cfg: RunConfig  # resolved against the task's defaults, in its canonical (hashed) form
    config_hash: str
    record_path: Path
    checkpoint_path: Path
    # the method version this code records for the run (``records.registered_version``: the card's,
    # with its aggregation rule's past "1.0"), as its record will say
    version: str | None = None

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

    def claim(self) -> claims.Claim:
        """Claim the record file for this process (``claims.take``): ClaimError, one line, when a
        running process holds it."""
        return claims.take(self.record_path)

    def with_device(self, device: str) -> ResolvedRun:
        """The same run on another device (``device`` is not hashed: same record, same claim)."""
        return dataclasses.replace(self, cfg=dataclasses.replace(self.cfg, device=device))



def resolve_run(cfg: RunConfig) -> ResolvedRun:
    """The ``ResolvedRun`` of ``cfg`` (module doc). Raises the project's own errors, each one line:
    ConfigError for a bad value, an unknown method or hyperparameter (before any data loads),
    RegistryError for an unknown task or pool, UnsafePathError for a name that cannot name a file."""
    config_mod.validate(cfg)  # before torch is imported
    from hfl_bench import engine
    from hfl_bench.aggregation import run_version

    # the task's defaults, the canonical (hashed) form, the method and its hyperparameters checked
    _, cfg, method = engine.resolve_for_run(cfg, checked=True)
    chash = config_mod.config_hash(dataclasses.asdict(cfg))
    record = paths.record_path(cfg, chash)
    return ResolvedRun(cfg, chash, record, paths.checkpoint_for(record), run_version(method.card.version,
                                                                                     method.hparams()))


def resolve_settings(settings: dict[str, Any]) -> ResolvedRun:
    """``resolve_run`` of a mapping of settings (``RunConfig``'s fields); an unknown one is a
    ConfigError naming the known ones."""
    unknown = sorted(set(settings) - set(config_mod.FIELDS))
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(map(str, unknown))}. Known: {', '.join(config_mod.FIELDS)}")
    return resolve_run(RunConfig(**config_mod.empty_faults_as_none(dict(settings))))


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


def largest_model_params(cfg: RunConfig, info: Any) -> int:
    """Parameters of the pool's largest member on this task (built on the meta device: no memory)."""
    import torch

    from hfl_bench.pools import build_model, get_pool, n_params

    with torch.device("meta"):
        return max(n_params(build_model(m, info)) for m in get_pool(cfg.pool).members)


def auto_threads(cfg: RunConfig, info: Any) -> int:
    """The default torch thread count of a run: 1, unless the pool's models are large (>= 1M
    parameters) and many cores are idle (>= 4), then the idle cores, at most torch's default."""
    import torch

    idle = idle_cores()
    if idle < MANY_IDLE_CORES:
        return 1
    try:
        large = largest_model_params(cfg, info) >= LARGE_MODEL_PARAMS
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
