"""The metadata index: what ``hfl-bench list`` and ``describe`` print, kept on disk so that a later
call answers without importing the plugins (and so torch, timm and the methods).

This module only stores and keys the index; what goes in it is the command line's business
(``hfl_bench.cli.catalog`` builds it from the imported registries and reads it back). The file is
``<cache>/hfl-bench/index/metadata-<interpreter>.json``, ``<cache>`` being ``$XDG_CACHE_HOME`` or
``~/.cache`` (the rule of ``hfl_bench.paths.unsaved_dirs``), one file per Python interpreter
(``sys.executable`` and ``sys.prefix``), so two virtual environments do not overwrite each other's.
It is written atomically (``paths.write_atomic``: a temporary file, then ``os.replace``).

The index is used only when its key equals the key computed now, and the key changes whenever
what would be printed could change. It is computed without importing any plugin, from:

- the index format (``FORMAT``), the interpreter (``sys.version``, ``sys.executable``,
  ``sys.prefix``) and hfl_bench's version and location;
- every installed distribution, in ``sys.path`` order: where its metadata lives and that folder's
  modification time (an install, an upgrade or a removal of any package, e.g. timm, whose models
  size the pools); for a distribution that declares ``hfl_bench.*`` entry points, also its name,
  version and the entry points themselves;
- the path, modification time (ns) and size of every file (but bytecode) under the hfl_bench
  package and under each package an entry point's module is in, located through the import
  system's finders (``sys.meta_path``, editable-install finders included) without running any
  module: a module edited in a checkout or an editable install changes the key.

What cannot be located that way (an entry point whose module the finders do not find) or an error
while computing the key means no key: the commands then import the plugins, as without an index.
A file that is unreadable, not a regular file of at most ``MAX_BYTES`` (``regularfile``: a FIFO is
never waited on), not JSON, of another format or key, or malformed is ignored and
rebuilt; it is data, never code. ``HFL_BENCH_NO_INDEX=1`` bypasses the index (neither read nor
written). Left out of the key: code outside those packages that a plugin imports without being an
installed distribution, and environment variables a plugin might read when imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import hfl_bench
from hfl_bench.regularfile import read_regular

# Bump when the stored layout (this module's or the catalog's) changes: an older file is rebuilt.
# 2: the partitioner kind is "partitioners" (was "partitions"); 3: methods' metadata from their cards;
# 4: a method's changelog.
FORMAT = 4
# Entry-point groups hfl-bench discovers plugins through (``hfl_bench.registry``).
GROUP_PREFIX = "hfl_bench."
DISABLE_ENV = "HFL_BENCH_NO_INDEX"
# Larger files are not read (the real index is well under a megabyte).
MAX_BYTES = 32 * 2**20
# More files than this under the packages to watch: no index (stat-ing them would cost too much).
MAX_FILES = 20_000
_MODULE = re.compile(r"\s*([\w.]+)")


class _NoKey(Exception):
    """Something the key needs cannot be determined without importing it."""


def enabled() -> bool:
    """False when ``$HFL_BENCH_NO_INDEX`` is set to anything but empty or ``0``."""
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hfl-bench``, else ``~/.cache/hfl-bench`` (as ``paths.unsaved_dirs``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hfl-bench"


def index_path() -> Path:
    """The index file of this interpreter."""
    who = hashlib.sha256(f"{sys.executable}\0{sys.prefix}".encode()).hexdigest()[:16]
    return cache_dir() / "index" / f"metadata-{who}.json"


# ----------------------------------------------------------------------------- the key


def current_key() -> str | None:
    """The key of the plugins installed now, or None when it cannot be computed without importing
    them (then no index is read or written)."""
    try:
        parts = _key_parts()
    except Exception:  # noqa: BLE001 - any doubt means no index, never a stale one
        return None
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()


def _key_parts() -> dict[str, Any]:
    import importlib.metadata

    distributions = []
    modules: set[str] = set()
    for dist in importlib.metadata.distributions():
        where = _metadata_folder(dist)
        part: list[Any] = [where, _mtime(where)]
        text = dist.read_text("entry_points.txt") or ""
        if GROUP_PREFIX in text:  # a quick filter; the parsed entry points decide
            eps = sorted([ep.group, ep.name, ep.value] for ep in dist.entry_points
                         if ep.group.startswith(GROUP_PREFIX))
            if eps:
                part += [dist.metadata["Name"], dist.version, eps]
                modules.update(_module_of(value) for _, _, value in eps)
        if where is None:  # metadata not in a folder: name and version are all there is
            part += [dist.metadata["Name"], dist.version]
        distributions.append(part)
    files: dict[str, list[int]] = {}
    for root in sorted({*_package_roots("hfl_bench"), *(r for m in sorted(modules) for r in _package_roots(m))}):
        _stat_tree(root, files)
    return {
        "format": FORMAT,
        "python": [sys.version, sys.executable, sys.prefix],
        "hfl_bench": [hfl_bench.__version__, os.path.abspath(hfl_bench.__file__ or "")],
        "distributions": distributions,
        "files": sorted([path, *stat] for path, stat in files.items()),
    }


def _metadata_folder(dist: Any) -> str | None:
    path = getattr(dist, "_path", None)  # PathDistribution: the .dist-info / .egg-info folder
    if path is None:
        return None
    try:
        return os.path.abspath(os.fspath(path))
    except TypeError:  # e.g. a folder inside a zip archive
        return None


def _mtime(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _module_of(value: str) -> str:
    """The module of an entry point value ``pkg.mod:attr [extra]``."""
    match = _MODULE.match(value)
    if not match:
        raise _NoKey(value)
    return match.group(1)


def _package_roots(module: str) -> list[str]:
    """The folders (packages) and files (modules) that importing ``module`` runs: it and each
    package above it, located with the finders of ``sys.meta_path`` as the import system does,
    without importing anything."""
    roots: list[str] = []
    path: list[str] | None = None
    parts = module.split(".")
    for i in range(len(parts)):
        spec = _find_spec(".".join(parts[: i + 1]), path)
        if spec is None:
            raise _NoKey(module)
        locations = spec.submodule_search_locations
        if locations is not None:
            path = list(locations)
            roots += path
        elif i < len(parts) - 1:
            raise _NoKey(module)  # a module above a module: the import would fail
        elif spec.origin and spec.has_location:
            roots.append(spec.origin)
        else:
            raise _NoKey(module)  # built in, frozen or otherwise not a file to watch
    return [os.path.abspath(r) for r in roots]


def _find_spec(name: str, path: list[str] | None):
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is not None:
            spec = find_spec(name, path, None)
            if spec is not None:
                return spec
    return None


def _stat_tree(root: str, files: dict[str, list[int]]) -> None:
    """Path -> [mtime ns, size] of ``root`` (a file) or of every file under it but bytecode,
    ``__pycache__`` and hidden entries."""
    if os.path.isfile(root):
        names = [(os.path.dirname(root), [os.path.basename(root)])]
    elif os.path.isdir(root):
        names = []
        for folder, dirs, found in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            names.append((folder, sorted(found)))
    else:
        raise _NoKey(root)
    for folder, found in names:
        for name in found:
            if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(folder, name)
            st = os.stat(path)
            files[path] = [st.st_mtime_ns, st.st_size]
            if len(files) > MAX_FILES:
                raise _NoKey(root)


# ----------------------------------------------------------------------------- the file


def read(key: str) -> dict[str, Any] | None:
    """The stored data if the index file holds this format and ``key``; else None."""
    try:  # only a regular file, opened non-blocking: a FIFO there would hang every command
        raw = read_regular(index_path(), MAX_BYTES)
    except (OSError, RuntimeError):  # too large, not a regular file; RuntimeError: no home folder
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if (not isinstance(doc, dict) or type(doc.get("format")) is not int or doc["format"] != FORMAT
            or doc.get("key") != key or not isinstance(doc.get("data"), dict)):
        return None
    return doc["data"]


def write(key: str, data: dict[str, Any]) -> bool:
    """Store ``data`` under ``key`` (atomically); False when the cache folder cannot take it."""
    from hfl_bench.paths import write_atomic

    doc = {"format": FORMAT, "key": key, "hfl_bench": hfl_bench.__version__, "python": sys.executable,
           "data": data}
    try:
        write_atomic(index_path(), json.dumps(doc, separators=(",", ":")))
    except (OSError, RuntimeError, ValueError, TypeError):
        return False
    return True
