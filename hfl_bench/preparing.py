"""What every ``hfl-bench prepare`` build shares: its one-line error, the claim on the folder it
builds (a second build of the same folder at the same time is refused, ``locks.hold``), and the
atomic writing of a task's cache with the ``SOURCE.json`` that says where it came from.

A building block: the standard library, numpy and the project's lock and path helpers only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hfl_bench import locks
from hfl_bench.paths import write_atomic


class BuildError(ValueError):
    """Input a build cannot use, or a folder it cannot claim: one line for the user."""


def claim(target: Path, what: str = "the folder") -> locks.Claim:
    """The build's claim on ``target``; BuildError, one line, while another build holds it."""
    try:
        return locks.hold(target, f"{what} {target}", lambda holder: (
            f"{target} is being built by another hfl-bench prepare ({holder}): wait for it to finish"))
    except locks.ClaimError as e:
        raise BuildError(str(e)) from None


def write_cache(target: Path, cache: str, arrays: dict[str, np.ndarray], source_file: str,
                info: dict[str, Any]) -> None:
    """Write ``target/cache`` (the arrays, ``np.savez``) and ``target/source_file`` (``info`` as
    JSON) atomically, under the build's claim on ``target``; everything is checked before."""
    with claim(target):
        target.mkdir(parents=True, exist_ok=True)
        write_atomic(target / cache, lambda f: np.savez(f, **arrays))
        write_atomic(target / source_file, json.dumps(info, indent=1) + "\n")
