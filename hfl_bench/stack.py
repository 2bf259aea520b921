"""The installed torch and torchvision: their versions (``hfl-bench --version``) and whether they
work together, said in one line with the fix instead of a traceback.

A torchvision built for another torch (another version, or a CUDA build beside a CPU-only torch,
which is what pip installs when the CPU index cannot be reached) fails on ``import torchvision``
with ``RuntimeError: operator torchvision::nms does not exist`` or a missing symbol: every command
that trains dies there. Two checks say so first:

- ``version_problem``: from the installed distributions' metadata, without importing either:
  torchvision 0.N pairs with torch 2.(N - 15) (0.18 with 2.3, 0.29 with 2.14);
- ``import_problem``: the error a failed ``import torchvision`` raised, recognised by its text.
"""

from __future__ import annotations

import re
from typing import Optional

# torchvision 0.(minor + OFFSET) is built for torch 2.minor (torch 2.0 and torchvision 0.15 on).
OFFSET = 15
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def installed(name: str) -> Optional[str]:
    """The installed version of distribution ``name``, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _minor(v: str) -> Optional[tuple[int, int]]:
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else None


def matching_torchvision(torch_version: str) -> Optional[str]:
    """The torchvision series built for ``torch_version`` ("0.29" for 2.14.1); None if unknown."""
    mm = _minor(torch_version)
    return f"0.{mm[1] + OFFSET}" if mm and mm[0] == 2 else None


def fix(torch_version: str) -> str:
    """The command that installs a matching pair, from the CPU index when torch is a CPU build."""
    base = torch_version.split("+")[0]
    vision = matching_torchvision(torch_version)
    pair = f"torch=={base} torchvision=={vision}.*" if vision else "torch torchvision"
    index = f" --index-url {CPU_INDEX}" if torch_version.endswith("+cpu") else ""
    return f"pip install --force-reinstall '{pair}'{index}"


def version_problem() -> Optional[str]:
    """One line when the installed torch and torchvision are not a pair; None when they are (or
    when either is missing or has a version this cannot read)."""
    torch, vision = installed("torch"), installed("torchvision")
    if not torch or not vision:
        return None
    wanted, have = matching_torchvision(torch), _minor(vision)
    if wanted is None or have is None or have[0] != 0 or f"0.{have[1]}" == wanted:
        return None
    return (f"torch {torch} and torchvision {vision} do not work together (torch {torch.split('+')[0]} needs "
            f"torchvision {wanted}); fix: {fix(torch)}")


def import_problem(error: BaseException) -> Optional[str]:
    """One line for an error that says torchvision's compiled operators do not load with this
    torch (``operator torchvision::nms does not exist``, an undefined symbol in torchvision's
    library); None for any other error."""
    text = str(error)
    if not (re.search(r"operator torchvision::\w+ does not exist", text)
            or ("torchvision" in text and ("undefined symbol" in text or "_C.so" in text))):
        return None
    torch, vision = installed("torch") or "?", installed("torchvision") or "?"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return (f"torch {torch} and torchvision {vision} do not work together ({first}); "
            f"fix: {fix(torch) if torch != '?' else 'pip install --force-reinstall torch torchvision'}")


def versions() -> str:
    """What ``hfl-bench --version`` prints after the package's own version: Python, torch,
    torchvision, timm and numpy (from the installed distributions' metadata: nothing imported)."""
    import platform

    parts = [f"python {platform.python_version()}"]
    for name in ("torch", "torchvision", "timm", "numpy"):
        parts.append(f"{name} {installed(name) or 'not installed'}")
    return ", ".join(parts)
