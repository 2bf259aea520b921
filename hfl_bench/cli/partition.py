"""``hfl-bench partition``: the client x class count table of a task's partition."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from hfl_bench.cli.output import USER_ERRORS, emit_json, fail, out, plain
from hfl_bench.config import RunConfig


def partition(
    task: str = typer.Option("digits", "--task", "-t", help="Task whose training labels are partitioned."),
    scheme: Optional[str] = typer.Option(None, "--partition", help="dirichlet, classes or iid; default: the task's."),
    alpha: Optional[float] = typer.Option(None, help="Dirichlet alpha; default: the task's."),
    k: int = typer.Option(2, "--k", help="Classes per client for --partition classes."),
    clients: Optional[int] = typer.Option(None, help="Number of clients; default: the task's."),
    seed: Optional[int] = typer.Option(None, help="Partition seed; default: the task's."),
    heldout_fraction: Optional[float] = typer.Option(None, help="Held-out fraction of each shard (val + test); default: the task's."),
    public_size: int = typer.Option(0, help="Public transfer set held out before partitioning (0 = none)."),
    data_dir: Optional[Path] = typer.Option(None, help="Dataset folder."),
    download: bool = typer.Option(False, "--download", help="Download the dataset if it is missing."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """Print the client x class count table of a task's partition (train part; val/test totals)."""
    from hfl_bench.engine import load_task, partition_for

    try:
        t, cfg = load_task(RunConfig(task=task, partition=scheme, alpha=alpha, classes_per_client=k, clients=clients,
                                     seed=seed, heldout_fraction=heldout_fraction, public_size=public_size,
                                     data_dir=str(data_dir) if data_dir else None))
        data = t.load(data_dir, download)
        labels = data.train_y.numpy()
        part = partition_for(cfg, t.info, data)
    except USER_ERRORS as e:
        fail(str(e))
    c = t.info.num_classes
    train = part.class_counts(labels, c, "train")
    val = part.class_counts(labels, c, "val").sum(1)
    test = part.class_counts(labels, c, "test").sum(1)
    if as_json:
        emit_json({"task": task, "scheme": part.scheme, "params": part.params, "seed": part.seed,
                   "hash": part.hash, "public_size": part.public_size, "train_counts": train.tolist(), "val_sizes": val.tolist(),
                   "test_sizes": test.tolist()})
        return
    public = f", public set {part.public_size}" if part.public_size else ""
    table = Table(title=plain(f"{task}: {part.scheme} {part.params}, seed {part.seed}{public}, hash {part.hash}"))
    table.add_column("client", justify="right")
    for j in range(c):
        table.add_column(str(j), justify="right")
    for col in ("train", "val", "test"):
        table.add_column(col, justify="right", style="bold")
    for cid in range(part.n_clients):
        table.add_row(str(cid), *[str(v) for v in train[cid]], str(train[cid].sum()), str(val[cid]), str(test[cid]))
    out.print(table)
