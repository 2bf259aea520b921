"""``hfl-bench partition``: the client x class count table of a task's partition."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from hfl_bench.cli.options import as_config_values, with_settings
from hfl_bench.cli.output import USER_ERRORS, emit_json, fail, out, plain
from hfl_bench.config import RunConfig

# The run settings that decide a partition (and where the data is).
PARTITION_SETTINGS = ("task", "partition", "alpha", "classes_per_client", "clients", "heldout_fraction",
                      "public_size", "pretrain_size", "seed", "data_dir", "download")


@with_settings(PARTITION_SETTINGS)
def partition(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    **settings: Any,
):
    """Print the client x class count table of a task's partition (train part; val/test totals)."""
    from hfl_bench.engine import load_task, partition_for

    try:
        t, cfg = load_task(RunConfig(**as_config_values(settings)))
        data = t.load(cfg.data_dir, cfg.download)
        labels = data.train_y.numpy()
        part = partition_for(cfg, t.info, data)
    except USER_ERRORS as e:
        fail(str(e))
    task = cfg.task
    c = t.info.num_classes
    train = part.class_counts(labels, c, "train")
    val = part.class_counts(labels, c, "val").sum(1)
    test = part.class_counts(labels, c, "test").sum(1)
    if as_json:
        emit_json({"task": task, "scheme": part.scheme, "params": part.params, "seed": part.seed,
                   "hash": part.hash, "public_size": part.public_size,
                   **({"pretrain_size": part.pretrain_size} if part.pretrain_size else {}),
                   "train_counts": train.tolist(),
                   "val_sizes": val.tolist(), "test_sizes": test.tolist()})
        return
    public = f", public set {part.public_size}" if part.public_size else ""
    public += f", pretraining split {part.pretrain_size}" if part.pretrain_size else ""
    table = Table(title=plain(f"{task}: {part.scheme} {part.params}, seed {part.seed}{public}, hash {part.hash}"))
    table.add_column("client", justify="right")
    for j in range(c):
        table.add_column(str(j), justify="right")
    for col in ("train", "val", "test"):
        table.add_column(col, justify="right", style="bold")
    for cid in range(part.n_clients):
        table.add_row(str(cid), *[str(v) for v in train[cid]], str(train[cid].sum()), str(val[cid]), str(test[cid]))
    out.print(table)
