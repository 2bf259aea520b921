"""Where a run's numbers came from: the code version (git) and the environment.

Works from a source checkout and from an installed wheel: git is asked only when the package
sits at the top of a git work tree (an editable install), never for a folder that merely lies
inside some other repository (a wheel installed into a venv inside a checkout).
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the checkout, for an editable install


def git_info(root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    """``{"git_sha", "git_dirty"}`` of the checkout the package runs from; None for both outside one."""
    unknown = {"git_sha": None, "git_dirty": None}

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return unknown
        sha = git("rev-parse", "HEAD")
        if sha.returncode != 0:
            return unknown
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"git_sha": sha.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return unknown


def environment(device) -> dict[str, Any]:
    """Versions and hardware a run used (``device`` is a torch.device)."""
    import numpy as np
    import timm
    import torch

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "numpy": np.__version__,
        "device": str(device),
        "gpu_name": gpu,
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
    }


@functools.lru_cache(maxsize=None)
def plugin_dist(module: str) -> str | None:
    """The installed distribution that provides ``module`` (cached: the scan takes about a second)."""
    top = module.split(".")[0]
    dists = importlib.metadata.packages_distributions().get(top)
    return dists[0] if dists else None
