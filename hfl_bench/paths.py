"""Where things are written: record and checkpoint names, and the one atomic writer."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from hfl_bench.config import RunConfig, config_hash


def record_stem(task: str, method: str, chash: str, seed: int | None) -> str:
    return f"{task}__{method}__{chash}__seed{seed}"


def record_filename(record: dict[str, Any]) -> str:
    """``<task>__<method>__<config hash>__seed<S>.json`` of a record."""
    cfg = record["config"]
    return f"{record_stem(cfg['task'], cfg['method'], record['config_hash'], cfg['seed'])}.json"


def record_path(cfg: RunConfig) -> Path:
    """Where the record of a (resolved) config is written: ``<out>/<task>__<method>__<hash>__seed<S>.json``."""
    return Path(cfg.out) / f"{record_stem(cfg.task, cfg.method, config_hash(dataclasses.asdict(cfg)), cfg.seed)}.json"


def checkpoint_path(cfg: RunConfig) -> Path:
    """Where a run's checkpoint is kept: ``<out>/.checkpoints/<record file stem>.pt``."""
    record = record_path(cfg)
    return checkpoint_for(record)


def checkpoint_for(record: Path) -> Path:
    """The checkpoint that belongs to the record file ``record``."""
    return record.parent / ".checkpoints" / f"{record.stem}.pt"


def write_atomic(path: str | Path, data: str | bytes | Callable[[Any], None]) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written file.

    ``data`` is text, bytes, or a function that writes into the open binary file (``torch.save``,
    ``figure.savefig``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; records and plots are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
