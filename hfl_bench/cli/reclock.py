"""``hfl-bench reclock``: records timed again on other devices, without training again."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hfl_bench.cli.output import fail

DEVICES_HELP = ("The devices to time the rounds on: a preset (uniform, mixed-phones) or a profile file (YAML/JSON), "
                "as hfl-bench run --devices.")


def reclock(
    records: list[Path] = typer.Argument(..., metavar="RECORD...", help="Record files of runs with --devices and "
                                         "no --deadline.", show_default=False),
    devices: str = typer.Option(..., "--devices", help=DEVICES_HELP, show_default=False),
    device_assignment: str = typer.Option("random", "--device-assignment", help="Which client gets which device: "
                                          "random (seeded) or by-size (larger architectures, by training FLOPs per "
                                          "sample, to faster devices), as hfl-bench run."),
    out: Path = typer.Option(..., "--out", "-o", help="The folder to write the re-clocked records into, each under "
                             "its record file name (never over the record it reads).", show_default=False),
    deadline: Optional[float] = typer.Option(None, "--deadline", help="Refused: a deadline drops late clients, so "
                                             "training would differ; run with --devices and --deadline instead.",
                                             show_default=False),
):
    """Time recorded runs again on other devices, without training again: each RECORD (run with
    --devices and no --deadline) is written into --out as the record that a run of the same config
    and seed under --devices and --device-assignment writes. Exact, not an estimate: without a
    deadline the clock only observes, so training (which clients run, their FLOPs, their bytes) is
    the same on any devices; each round's clock entry records those per client, and the rounds are
    timed again by the run's own clock code. Everything but the clock section, each round's clock
    entry and config.devices / config.device_assignment is kept; the clock section's `reclocked`
    names the source record (id, file, SHA-256) and this code's commit. Refused, one line and exit 2,
    nothing written: a file `leaderboard validate` refuses, a record without a clock or with a
    deadline, one written before rounds recorded their FLOPs and bytes, --deadline. Each file is
    written atomically."""
    from hfl_bench.config import ConfigError
    from hfl_bench.reclock import reclock_files

    try:
        written = reclock_files(records, devices, out, device_assignment, deadline)
    except ConfigError as e:
        fail(str(e))
    except OSError as e:
        fail(f"--out {out}: cannot write there ({e.strerror or e})")
    for path in written:
        print(f"re-clocked record written to {path}")
