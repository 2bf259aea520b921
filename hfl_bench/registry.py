"""Name-keyed registries with decorator registration and entry-point discovery.

One ``Registry`` type serves methods, tasks, architecture pools, partitioners and
aggregation rules. Built-in plugins and third-party packages are discovered the same way:
through the entry-point groups ``hfl_bench.<kind>`` (see ``pyproject.toml``). An entry point
may name a module (importing it runs its ``@register`` decorators) or an object, which is then
registered under the entry point's name.

One faulty plugin disables nothing else (issue 47): an entry point whose import raises, or whose
registration is refused (a name already taken, a class the registry's ``validate`` rejects), is
skipped with one warning line on stderr naming its distribution, the entry point and the error
(``Skipped``), and whatever it registered before failing is taken back; a lookup of a name it
might have provided says so in its one-line error. Built-in entry points (modules under
``hfl_bench``) load first, so a plugin can never take a built-in's name, and their failure still
raises: that is a bug in hfl-bench, not a plugin to skip. A process can be pinned to the entry
points another one resolved (``resolve_plugins`` / ``pin``): a matrix's workers load exactly what
its driver loaded at start, whatever is installed meanwhile.

Discovery is thread-safe (issue 63): one process-wide reentrant lock (``DISCOVERY_LOCK``) is held
while any registry discovers, and a registry counts as discovered only once every entry point of
its group has loaded, so a thread never sees another's half-finished discovery (it waits for it).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

log = logging.getLogger("hfl_bench.plugins")

# An entry point as a driver hands it to its workers: (group, name, value, distribution).
EntryPointKey = tuple[str, str, str, str]
BUILTIN_DIST = "hfl-bench"


class RegistryError(LookupError):
    """An unknown or duplicate name; the message is meant for the user."""


@dataclass(frozen=True)
class Skipped:
    """An entry point this process did not load: its import raised, or what it registered was
    refused (``why`` says which, on one line)."""

    group: str
    name: str
    value: str
    dist: str
    why: str

    def describe(self) -> str:
        return f"plugin {self.dist}'s entry point {self.name!r} ({self.group}: {self.value}) {self.why}"


@dataclass
class _Load:
    """An entry point being loaded, and every (registry, name) it registered so far (taken back
    if it fails)."""

    key: EntryPointKey
    added: list[tuple["Registry", str]] = field(default_factory=list)


# Per process: the entry points loaded, the ones skipped (each warned about once), those being
# loaded (a stack: a plugin's import may look a registry up, which discovers another group), and
# the pinned set (None: every installed entry point may load).
_LOADED: set[EntryPointKey] = set()
_SKIPPED: dict[EntryPointKey, Skipped] = {}
_PINNED: frozenset[EntryPointKey] | None = None
# Held by the thread that discovers (any registry): another thread's lookup waits for the whole
# discovery instead of seeing a registry half filled ("Available: (none)"). One lock for every
# group, not one per registry: a plugin's import may discover another group, and one lock cannot
# be taken in two orders. Reentrant for that same reason.
DISCOVERY_LOCK = threading.RLock()


class _Loading(threading.local):
    """The entry points being loaded, per thread: a registration by another thread meanwhile (a
    module it imports itself) is never taken for the loading plugin's."""

    def __init__(self):
        self.stack: list[_Load] = []


_LOADING_NOW = _Loading()


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, T] = {}
        self._origin: dict[str, str] = {}
        self._dist: dict[str, str] = {}  # the distribution whose entry point registered a name
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
            if key in self._items:
                if self._items[key] is not item:
                    raise RegistryError(self._taken_message(key, origin or getattr(item, "__module__", "?")))
                return item  # the very same object again: harmless
            self._items[key] = item
            self._origin[key] = origin or getattr(item, "__module__", "?")
            loading = _LOADING_NOW.stack
            if loading:
                self._dist[key] = loading[-1].key[3]
                loading[-1].added.append((self, key))
            return item

        return add if obj is None else add(obj)

    def _taken_message(self, key: str, newcomer: str) -> str:
        """Why ``key`` cannot be registered again: both who asks (the plugin distribution being
        loaded, else the module's) and who has it."""
        loading = _LOADING_NOW.stack
        asking = loading[-1].key[3] if loading else _dist_of(newcomer)
        owner = self._origin[key]
        owner_dist = self._dist.get(key) or _dist_of(owner)
        return (f"{newcomer}{f' ({asking})' if asking else ''} registers {self.kind} {key!r}, "
                f"already registered (by {owner}{f', {owner_dist}' if owner_dist else ''})")

    def discover(self) -> None:
        """Load every entry point of this registry's group once (built-ins first; a plugin that
        fails is skipped with a warning, ``_load``). Thread-safe: a thread that finds another one
        discovering waits for it to finish (``DISCOVERY_LOCK``)."""
        if self._discovered or not self.entry_point_group:
            return
        with DISCOVERY_LOCK:
            # checked again under the lock: another thread may have finished meanwhile; and
            # ``_loading`` here is this very thread's discovery, re-entered by a plugin's import
            if self._discovered or self._loading:
                return
            self._loading = True
            try:
                for ep in _entry_points(self.entry_point_group):
                    self._load(ep)
            finally:
                self._loading = False
            self._discovered = True

    def _load(self, ep: Any) -> None:
        """Load one entry point; if its import or registration raises, take back what it
        registered and skip it with one warning line (a built-in's failure raises)."""
        load = _Load(_key(ep))
        _LOADING_NOW.stack.append(load)
        try:
            loaded = ep.load()
            if not isinstance(loaded, types.ModuleType):  # a module: importing it ran its decorators
                self.register(ep.name, loaded, origin=f"entry point {ep.value}")
        except Exception as e:
            for registry, name in reversed(load.added):
                registry._forget(name)
            if _is_builtin(ep):
                raise
            _skip(load.key, e)
            return
        finally:
            _LOADING_NOW.stack.pop()
        _LOADED.add(load.key)

    def _forget(self, name: str) -> None:
        for table in (self._items, self._origin, self._dist):
            table.pop(name, None)

    def skipped(self) -> list[Skipped]:
        """The entry points of this registry's group that this process skipped."""
        self.discover()
        return [s for s in _SKIPPED.values() if s.group == self.entry_point_group]

    def get(self, name: str) -> T:
        self.discover()
        try:
            return self._items[name]
        except KeyError:
            raise RegistryError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        """The unknown-name error; it names the skipped plugins of this group, which may have been
        meant (the one whose entry point has this very name first)."""
        names = self.names()
        skipped = sorted(self.skipped(), key=lambda s: s.name != name)
        why = f" (the {'; the '.join(s.describe() for s in skipped)})" if skipped else ""
        return unknown_message(self.kind, name, names, why)

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


def unknown_message(kind: str, name: str, names: list[str], why: str = "") -> str:
    """The error for an unknown ``name`` among ``names`` (sorted), with the closest one as a hint
    (``why``: what may explain it, e.g. a plugin that failed to load)."""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}{why}.{hint} Available: {', '.join(names) or '(none)'}"


# ----------------------------------------------------------------------------- entry points


def _key(ep: Any) -> EntryPointKey:
    dist = getattr(ep, "dist", None)
    return (ep.group, ep.name, ep.value, dist.name if dist is not None else "?")


def _is_builtin(ep: Any) -> bool:
    return ep.value.split(":")[0].strip().split(".")[0] == "hfl_bench"


def _entry_points(group: str) -> list[Any]:
    """The entry points of ``group`` this process may load, built-ins first (so a plugin never
    takes a built-in's name, whatever its entry point is called), then by name; only the pinned
    ones, if this process is pinned."""
    import importlib.metadata  # here: --help never reads entry points

    eps = importlib.metadata.entry_points(group=group)
    return sorted((ep for ep in eps if _PINNED is None or _key(ep) in _PINNED),
                  key=lambda ep: (not _is_builtin(ep), ep.name))


def plugin_entry_points(group: str) -> list[Any]:
    """The entry points of ``group`` to load (``_entry_points``): for an extension point kept
    outside a ``Registry`` (the leaderboard's ordered columns)."""
    return _entry_points(group)


def skip_plugin(ep: Any, e: Exception) -> None:
    """An entry point of such an extension point failed: raise for a built-in (a bug in
    hfl-bench), else skip it with one warning line, as a ``Registry`` does."""
    if _is_builtin(ep):
        raise e
    _skip(_key(ep), e)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _skip(key: EntryPointKey, e: Exception) -> None:
    """Record a skipped entry point and warn about it, once per process."""
    why = (f"was refused: {_one_line(str(e))}" if isinstance(e, RegistryError)
           else f"failed to import: {type(e).__name__}: {_one_line(str(e))}")
    if key in _SKIPPED:
        return
    _SKIPPED[key] = skipped = Skipped(*key, why=why)
    log.warning("warning: %s; skipped", skipped.describe())


def _dist_of(module: str) -> str | None:
    """The installed distribution providing ``module`` (an origin; ``entry point mod:obj`` too),
    when importlib.metadata can tell."""
    top = module.removeprefix("entry point ").split(":")[0].split(".")[0].strip()
    if top == "hfl_bench":
        return BUILTIN_DIST
    import importlib.metadata

    try:
        dists = importlib.metadata.packages_distributions().get(top) or []
    except Exception:  # noqa: BLE001 - only a nicer message is at stake
        return None
    return dists[0] if dists else None


def skipped_entry_points() -> list[Skipped]:
    """Every entry point this process skipped so far."""
    return list(_SKIPPED.values())


def resolve_plugins() -> tuple[EntryPointKey, ...]:
    """Discover every registry now; the entry points that loaded, for ``pin`` in another process
    (a matrix's workers: they load exactly these, not a plugin installed since)."""
    for registry in REGISTRIES.values():
        registry.discover()
    with DISCOVERY_LOCK:
        return tuple(sorted(_LOADED))


def pin(plugins: tuple[EntryPointKey, ...] | None) -> None:
    """Load only these entry points in this process (None: all); call before any discovery."""
    global _PINNED
    _PINNED = None if plugins is None else frozenset(tuple(p) for p in plugins)


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
