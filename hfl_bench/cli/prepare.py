"""``hfl-bench prepare``: build a task's data folder from files a user can obtain."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hfl_bench.cli.options import BenchCommand, BenchGroup
from hfl_bench.cli.output import fail, note, out, plain

app = typer.Typer(help="Build a task's data folder from files a user can obtain.", no_args_is_help=True,
                  cls=BenchGroup)


@app.command("cifar10-jpg", cls=BenchCommand)
def cifar10_jpg(
    source: Path = typer.Option(..., "--from", help="CIFAR-10's python release: cifar-10-python.tar.gz (from "
                                "https://www.cs.toronto.edu/~kriz/cifar.html), the cifar-10-batches-py folder "
                                "torchvision's download unpacks, or the folder that holds it."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Where to write cifar10-jpg/ \\[default: "
                                            "$HFL_BENCH_DATA or ~/.cache/hfl-bench/data]"),
):
    """Write DATA_DIR/cifar10-jpg/{train,test}/CLASS/NNNN.jpg, the folder the cifar10-jpg task reads,
    from CIFAR-10's python release, offline, and SOURCE.json beside it: each source file's SHA-256,
    the JPEG quality and Pillow's version. The images are encoded here, so they are not the
    project's mirror archive byte for byte: records of runs on this folder carry another data
    fingerprint and form leaderboard groups of their own. The pickles are read by an unpickler
    that builds only what the release holds, and the whole release is checked (ten distinct class
    names that can name folders, each batch's shape and labels) before anything is written. An
    existing cifar10-jpg folder is never overwritten, and a second prepare into the same folder
    while one builds is refused."""
    from hfl_bench.cifar_jpg import BuildError, build
    from hfl_bench.data import resolve_data_dir

    target = resolve_data_dir(data_dir)
    try:
        info = build(source, target, progress=lambda split, n: note(f"{split}:", f"{n:,} images written", "green"))
    except BuildError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {target}: {e.strerror or e}")
    total = sum(sum(c.values()) for c in info["images"].values())
    out.print(plain(f"wrote {target / 'cifar10-jpg'} ({total:,} images; what it was built from: "
                    f"{target / 'cifar10-jpg' / 'SOURCE.json'})"), highlight=False, soft_wrap=True)
