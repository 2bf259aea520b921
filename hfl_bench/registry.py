"""Name-keyed registries with decorator registration and entry-point discovery.

One ``Registry`` type serves methods, tasks, architecture pools, partitioners and
aggregation rules. Built-in plugins and third-party packages are discovered the same way:
through the entry-point groups ``hfl_bench.<kind>`` (see ``pyproject.toml``). An entry point
may name a module (importing it runs its ``@register`` decorators) or an object, which is then
registered under the entry point's name.
"""

from __future__ import annotations

import difflib
import inspect
import types
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class RegistryError(LookupError):
    """An unknown or duplicate name; the message is meant for the user."""


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, T] = {}
        self._origin: dict[str, str] = {}
        self._discovered = False
        self._loading = False
        # Set by the module that defines what this registry holds (e.g. the method API checks
        # for a Method subclass): ``validate(name, obj)`` raises RegistryError to refuse it.
        self.validate: Callable[[str, Any], None] | None = None

    def register(self, name: str, obj: T | None = None, *, origin: str | None = None):
        """Register ``obj`` under ``name``; usable as ``@registry.register("name")``."""

        def add(item: T) -> T:
            key = name.strip()
            if not key:
                raise RegistryError(f"empty {self.kind} name")
            if self.validate is not None:
                self.validate(key, item)
            if key in self._items and self._items[key] is not item:
                raise RegistryError(
                    f"{self.kind} {key!r} is already registered (by {self._origin[key]})"
                )
            self._items[key] = item
            self._origin[key] = origin or getattr(item, "__module__", "?")
            return item

        return add if obj is None else add(obj)

    def discover(self) -> None:
        """Load every entry point of this registry's group once."""
        if self._discovered or self._loading or not self.entry_point_group:
            return
        import importlib.metadata  # here: --help never reads entry points

        self._loading = True
        try:
            for ep in sorted(
                importlib.metadata.entry_points(group=self.entry_point_group), key=lambda e: e.name
            ):
                loaded = ep.load()
                if isinstance(loaded, types.ModuleType):
                    continue  # importing the module ran its @register decorators
                if ep.name not in self._items:
                    self.register(ep.name, loaded, origin=f"entry point {ep.value}")
        finally:
            self._loading = False
        self._discovered = True

    def get(self, name: str) -> T:
        self.discover()
        try:
            return self._items[name]
        except KeyError:
            raise RegistryError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        return unknown_message(self.kind, name, self.names())

    def untouched(self) -> bool:
        """Nothing registered and no discovery run yet in this process: what this registry would
        hold is exactly what its entry points register (``hfl_bench.metadata_index`` relies on it)."""
        return not self._items and not self._discovered and not self._loading

    def origin(self, name: str) -> str:
        self.get(name)
        return self._origin[name]

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        for name in self.names():
            yield name, self._items[name]

    def __contains__(self, name: str) -> bool:
        self.discover()
        return name in self._items

    def __len__(self) -> int:
        return len(self.names())


def unknown_message(kind: str, name: str, names: list[str]) -> str:
    """The error for an unknown ``name`` among ``names`` (sorted), with the closest one as a hint."""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}.{hint} Available: {', '.join(names) or '(none)'}"


def describe(obj: Any) -> str:
    """First line of an object's docstring, for listings."""
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


# The registries. Each is filled by decorators in built-in modules and plugin packages.
METHODS: Registry[Callable] = Registry("method", "hfl_bench.methods")
TASKS: Registry[Callable] = Registry("task", "hfl_bench.tasks")
POOLS: Registry[Any] = Registry("architecture pool", "hfl_bench.pools")
PARTITIONERS: Registry[Callable] = Registry("partitioner", "hfl_bench.partitioners")
AGGREGATORS: Registry[Callable] = Registry("aggregator", "hfl_bench.aggregators")

REGISTRIES = {
    "methods": METHODS,
    "tasks": TASKS,
    "pools": POOLS,
    "partitioners": PARTITIONERS,
    "aggregators": AGGREGATORS,
}
