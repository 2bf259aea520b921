"""Where a run's numbers came from: the code version (git) and the environment.

Also which distribution (and version, and for an editable install the git commit) provides each
registered plugin a run used: ``plugins_used``, the record's ``plugins`` block.

Works from a source checkout and from an installed wheel: git is asked only when the package
sits at the top of a git work tree (an editable install), never for a folder that merely lies
inside some other repository (a wheel installed into a venv inside a checkout). A plugin's commit
is asked only for an editable install (PEP 610), in the folder it was installed from.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import platform
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the checkout, for an editable install


UNKNOWN_CHECKOUT = {"git_sha": None, "git_dirty": None}


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)


def git_info(root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    """``{"git_sha", "git_dirty"}`` of the checkout the package runs from; None for both outside one."""
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
    except (OSError, subprocess.SubprocessError):
        return dict(UNKNOWN_CHECKOUT)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return dict(UNKNOWN_CHECKOUT)
    return checkout_info(root)


# Vector-instruction flags that decide which kernels (and so which rounding) a CPU run gets.
_ISA_PREFIXES = ("sse4", "avx", "fma", "f16c", "amx")


@functools.lru_cache(maxsize=None)
def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The CPU a run's arithmetic ran on: its model and vector-instruction flags (Linux) and the
    kernel set torch dispatches to. Two CPUs can round differently and a run's figures then drift
    apart over the rounds, so two records' hosts are part of their provenance."""
    import torch

    first: dict[str, str] = {}  # the first processor's entries
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            first.setdefault(key.strip(), value.strip())
            if "model name" in first and "flags" in first:
                break
    except OSError:
        pass
    model = first.get("model name") or platform.processor() or None
    flags = sorted(f for f in first.get("flags", "").split() if f.startswith(_ISA_PREFIXES))
    return {"cpu": model, "cpu_isa": " ".join(flags) or None,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def environment(device) -> dict[str, Any]:
    """Versions and hardware a run used (``device`` is a torch.device)."""
    import numpy as np
    import timm
    import torch

    # Only a process that used CUDA asks: a matrix driver writing a dead worker's failed record
    # would otherwise create a CUDA context (memory held on the GPU for the whole matrix).
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_initialized() else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "numpy": np.__version__,
        "device": str(device),
        "gpu_name": gpu,
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        **cpu_info(),
    }


@functools.cache
def _top_level_distributions() -> dict[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, scanned once per process (about half a
    second: every installed distribution's file list is read)."""
    return importlib.metadata.packages_distributions()


def plugin_dist(module: str) -> str | None:
    """The installed distribution that provides ``module`` (a record asks for its method's, task's
    and pool's modules: one scan serves them all)."""
    dists = _top_level_distributions().get(module.split(".")[0])
    return dists[0] if dists else None


# ----------------------------------------------------------------------------- plugins a run used

def _registry(kind: str):
    """The registry a record's ``plugins`` block names entries of by ``kind``."""
    from hfl_bench.registry import AGGREGATORS, METHODS, PARTITIONERS, POOLS, TASKS

    return {"method": METHODS, "task": TASKS, "pool": POOLS, "partitioner": PARTITIONERS,
            "aggregator": AGGREGATORS}[kind]


def origin_module(registry, name: str) -> str:
    """The module that registered ``name``: its origin (``Registry.origin``), or the module part
    of an entry point that named an object (``entry point pkg.mod:Obj`` -> ``pkg.mod``)."""
    origin = registry.origin(name)
    if origin.startswith("entry point "):
        origin = origin[len("entry point "):].split(":", 1)[0]
    return origin.strip()


def is_builtin(registry, name: str) -> bool:
    """Whether ``name`` was registered by hfl-bench itself (its origin module is under ``hfl_bench.``)."""
    module = origin_module(registry, name)
    return module == "hfl_bench" or module.startswith("hfl_bench.")


@functools.lru_cache(maxsize=None)
def _dist_facts(dist: str) -> tuple[str | None, Path | None]:
    """The version of an installed distribution and, for an editable install (PEP 610
    ``direct_url.json`` with ``dir_info.editable``), the local folder it was installed from."""
    found = list(importlib.metadata.distributions(name=dist))
    if not found:
        return None, None
    # A source checkout on sys.path (its ``*.egg-info``) may come before the installed metadata,
    # which alone holds direct_url.json: look at every copy.
    for d in found:
        try:
            direct = json.loads(d.read_text("direct_url.json") or "{}")
        except ValueError:
            continue
        url = direct.get("url") if isinstance(direct, dict) else None
        dir_info = direct.get("dir_info") if isinstance(direct, dict) else None
        if isinstance(dir_info, dict) and dir_info.get("editable") is True and isinstance(url, str) \
                and url.startswith("file://"):
            return d.version, Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
    return found[0].version, None


def checkout_info(folder: Path) -> dict[str, Any]:
    """``{"git_sha", "git_dirty"}`` of the git checkout that holds ``folder`` (an editable install's
    source; it may be a subfolder of the checkout): HEAD, and whether tracked files under
    ``folder`` have uncommitted changes. None for both outside a checkout."""
    try:
        sha = _git(folder, "rev-parse", "HEAD")
        if sha.returncode != 0:
            return dict(UNKNOWN_CHECKOUT)
        dirty = _git(folder, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return dict(UNKNOWN_CHECKOUT)
    return {"git_sha": sha.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}


def plugins_used(used) -> list[dict[str, Any]]:
    """The record's ``plugins`` block: for each ``(kind, name)`` in ``used`` (kind: method, task,
    pool, partitioner or aggregator; names not registered, or None, are left out; duplicates
    once), the registering module, the distribution that provides it and its version
    (``importlib.metadata``) and, for an editable install in a git checkout, its commit and dirty
    flag (``checkout_info``; null otherwise)."""
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    git_by_folder: dict[Path, dict[str, Any]] = {}
    for kind, name in used:
        if not isinstance(name, str) or (kind, name) in seen:
            continue
        seen.add((kind, name))
        registry = _registry(kind)
        try:
            if name not in registry:
                continue
            module = origin_module(registry, name)
        except Exception:  # noqa: BLE001 - a plugin that fails to load is the run's error, not ours
            continue
        dist = plugin_dist(module) if module else None
        version, folder = _dist_facts(dist) if dist else (None, None)
        git = {"git_sha": None, "git_dirty": None}
        if folder is not None:
            if folder not in git_by_folder:
                git_by_folder[folder] = checkout_info(folder)
            git = git_by_folder[folder]
        rows.append({"kind": kind, "name": name, "module": module, "dist": dist, "version": version, **git})
    return rows
