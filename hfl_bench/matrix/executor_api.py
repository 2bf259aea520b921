"""The executor API: how a matrix's cells get run (``hfl-bench matrix --executor NAME``).

An executor is an ``Executor`` subclass with one entry point, ``run(cells, on_record, on_round,
plugins)``, and one options dataclass (``Options``, an ``ExecutorOptions`` subclass: its fields are
the ``hfl-bench matrix`` flags it takes, ``cells_per_gpu`` for ``--cells-per-gpu``, and its ``check``
validates their values). Executors live in the registry ``EXECUTORS``, keyed by name:
``@register_executor("name")`` on the class, or, from another package, an entry point of the group
``hfl_bench.executors`` naming the module that registers it or the class itself (registered under
the entry point's name). The built-ins (``executors``: ``local``, ``pool``, ``ray``) are registered
before any plugin loads, so a plugin cannot take their names; look executors up there
(``executors.executor_class``, ``make_executor``).

``executors.executor_options(name, given)`` turns the flags given into the executor's options, in
one place: a flag the executor does not take, or a bad value, is one ``ConfigError`` line (exit 2
from the CLI). The driver (``runner.run_matrix``) claims each cell's record before and writes it
after; an executor only runs cells and hands back what they return.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.registry import Registry, RegistryError

if TYPE_CHECKING:
    from hfl_bench.matrix.suite import Cell
    from hfl_bench.resolved import ResolvedRun

OnRecord = Callable[["Cell", dict[str, Any]], None]  # a cell's record, once it has run (or failed)
OnRound = Callable[["Cell", dict[str, Any]], None]  # a cell's history entry, as the round ends
# The entry points a matrix's driver loaded at its start (``hfl_bench.registry.resolve_plugins``).
Plugins = Optional[tuple[tuple[str, str, str, str], ...]]


def flag(field: str) -> str:
    """The ``hfl-bench matrix`` flag of an options field: ``cells_per_gpu`` -> ``--cells-per-gpu``."""
    return "--" + field.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class ExecutorOptions:
    """An executor's options; subclass it as a frozen dataclass whose fields are named after the
    flags they come from. ``HINTS`` maps a field the executor does NOT take to a hint appended to
    the one-line refusal (what to use instead)."""

    HINTS: ClassVar[dict[str, str]] = {}

    def check(self) -> None:
        """Raise ``ConfigError`` (one line) for a bad value; the base checks the common fields."""
        for name, low, strict in (("jobs", 1, False), ("threads", 1, False), ("cells_per_gpu", 1, False),
                                  ("cpus_per_cell", 0, True), ("gpus_per_cell", 0, False)):
            value = getattr(self, name, None)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    (value <= low if strict else value < low):
                shown = f"{value:g}" if isinstance(value, float) else repr(value)
                raise ConfigError(f"{flag(name)} must be {'>' if strict else '>='} {low}, got {shown}")


class Executor(abc.ABC):
    """Runs a list of matrix cells. Subclass it, set ``Options`` to its options dataclass, implement
    ``run`` and register it (``@register_executor("name")`` or an entry point)."""

    Options: ClassVar[type[ExecutorOptions]] = ExecutorOptions
    name: ClassVar[str] = ""  # set by register_executor / the registry
    # One cell at a time, in the order given, in this process: the CLI then shows the running cell's
    # rounds (its progress for a cell starts when the cell before it has its record).
    serial: bool = False

    def __init__(self, options: Optional[ExecutorOptions] = None):
        options = self.Options() if options is None else options
        if not isinstance(options, self.Options):
            raise ConfigError(f"executor {self.name or type(self).__name__!r} takes {self.Options.__name__}, "
                              f"got {type(options).__name__}")
        options.check()
        self.options = options

    @abc.abstractmethod
    def run(self, cells: list[Cell], on_record: OnRecord, on_round: Optional[OnRound] = None,
            plugins: Plugins = None) -> None:
        """Run every cell and call ``on_record(cell, record)`` once for each (a failed record for one
        that raised or whose worker died: never raise for one cell), and, when given,
        ``on_round(cell, entry)`` as each of its rounds ends (its history entry), before its record.
        Call both from the thread that called ``run``. ``plugins``: the entry points the driver
        loaded, the only ones a worker in another process may load (``hfl_bench.registry.pin``; a
        cell in this process needs nothing). Ctrl-C (KeyboardInterrupt) ends ``run``: stop what
        runs, then let it propagate."""


def run_here(cell: Cell, on_round: Optional[OnRound] = None, threads: Optional[int] = None,
             progress: Optional[Callable[[int, int, dict], None]] = None) -> dict[str, Any]:
    """Run one cell in this process and return its record (a failed record for anything it raised),
    calling ``on_round(cell, entry)`` as each round ends: what a simple executor needs."""
    from hfl_bench.matrix.cells import run_cell
    from hfl_bench.runpath import each_round

    rounds = (lambda rnd, total, entry: on_round(cell, entry)) if on_round else None
    return run_cell(job_of(cell), threads, each_round(progress, rounds))


def job_of(cell: Cell, device: Optional[str] = None) -> ResolvedRun | RunConfig:
    """What a cell's worker runs: its ``ResolvedRun`` (a bare config for a cell built without one),
    on ``device`` when given (not hashed: the same record path and claim)."""
    if cell.run is not None:
        return cell.run if device is None else cell.run.with_device(device)
    return cell.cfg if device is None else dataclasses.replace(cell.cfg, device=device)


def check_executor_class(name: str, cls: Any) -> None:
    """A registered executor must be a concrete ``Executor`` subclass whose ``Options`` is a
    dataclass subclassing ``ExecutorOptions``."""
    if not (inspect.isclass(cls) and issubclass(cls, Executor)):
        raise RegistryError(f"executor {name!r} must be a subclass of hfl_bench.matrix.executor_api.Executor, "
                            f"got {cls!r}")
    if inspect.isabstract(cls):
        raise RegistryError(f"executor {name!r} ({cls.__qualname__}) does not implement "
                            f"{', '.join(sorted(cls.__abstractmethods__))}")
    options = cls.Options
    if not (inspect.isclass(options) and issubclass(options, ExecutorOptions) and dataclasses.is_dataclass(options)):
        raise RegistryError(f"executor {name!r}: Options must be a dataclass subclassing ExecutorOptions, "
                            f"got {options!r}")


class _ExecutorRegistry(Registry["type[Executor]"]):
    """A registry that gives each class registered the name it is registered under (``Executor.name``)."""

    def register(self, name: str, obj: Any = None, *, origin: Optional[str] = None):
        added = super().register(name, origin=origin)

        def add(cls: Any) -> Any:
            added(cls)
            if not vars(cls).get("name"):  # its own, not a base's; registered under several: the first
                cls.name = name.strip()
            return cls

        return add if obj is None else add(obj)


# Look executors up through ``hfl_bench.matrix.executors`` (``executor_class``, ``make_executor``):
# importing it registers the built-ins before any plugin's entry point loads (the entry point
# ``builtin`` of the group does the same for a discovery started here).
EXECUTORS = _ExecutorRegistry("executor", "hfl_bench.executors")
EXECUTORS.validate = check_executor_class  # also checks classes third-party entry points register


def register_executor(name: str) -> Callable[[type], type]:
    """Class decorator: register an ``Executor`` subclass under ``name`` (refuses anything else)."""
    return EXECUTORS.register(name)
