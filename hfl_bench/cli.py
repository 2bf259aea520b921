"""The ``hfl-bench`` command line (Typer): rich tables for people, ``--json`` for machines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from hfl_bench import config as config_mod
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.data import DatasetError
from hfl_bench.partition import PartitionError
from hfl_bench.registry import REGISTRIES, RegistryError, describe

app = typer.Typer(
    help="hfl-bench: heterogeneous federated learning benchmarks. Run methods on tasks under one "
    "protocol and write standardized JSON records.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

USER_ERRORS = (ConfigError, DatasetError, PartitionError, RegistryError)


def fail(message: str, code: int = 2):
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=1, default=str) + "\n")


# ----------------------------------------------------------------------------- run


def build_config(config_file: Optional[Path], flags: dict[str, Any], sets: list[str]) -> RunConfig:
    values: dict[str, Any] = config_mod.load_yaml(config_file) if config_file else {}
    method_params = dict(values.pop("method_params", None) or {})
    values.update({k: v for k, v in flags.items() if v is not None})
    method_params.update(config_mod.parse_set(sets))
    return RunConfig(**values, method_params=method_params)


@app.command()
def run(
    method: Optional[str] = typer.Option(None, "--method", "-m", help="Method (hfl-bench list methods). \\[default: crad]"),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task (hfl-bench list tasks). \\[default: digits]"),
    pool: Optional[str] = typer.Option(None, help="Architecture pool; default: the task's."),
    partition: Optional[str] = typer.Option(None, help="dirichlet, classes or iid; default: the task's."),
    alpha: Optional[float] = typer.Option(None, help="Dirichlet alpha (> 0); default: the task's."),
    k: Optional[int] = typer.Option(None, "--k", help="Classes per client for --partition classes. \\[default: 2]"),
    clients: Optional[int] = typer.Option(None, help="Number of clients N; default: the task's."),
    clients_per_round: Optional[int] = typer.Option(None, help="Active clients per round; default: all."),
    rounds: Optional[int] = typer.Option(None, help="Communication rounds; default: the task's."),
    local_epochs: Optional[int] = typer.Option(None, help="Local epochs per round. \\[default: 1]"),
    batch_size: Optional[int] = typer.Option(None, help="Local batch size. \\[default: 64]"),
    lr: Optional[float] = typer.Option(None, help="SGD learning rate. \\[default: 0.01]"),
    seed: Optional[int] = typer.Option(None, help="Seed of python, numpy, torch and the partition; default: the task's."),
    public_size: Optional[int] = typer.Option(None, help="Hold out this many training samples (stratified, before partitioning) as a public transfer set; needed by fedmd, msfkd, fedcc. \\[default: 0]"),
    eval_every: Optional[int] = typer.Option(None, help="Global test every k rounds (and at each new best val round). \\[default: 1]"),
    device: Optional[str] = typer.Option(None, help="auto, cpu, cuda or cuda:N. \\[default: auto]"),
    exec_path: Optional[str] = typer.Option(None, "--exec", help="Peer-KD path: reference, fast or auto. \\[default: auto]"),
    vmap: Optional[str] = typer.Option(None, help="Vmapped teacher inference per architecture: on, off or auto (= off, measured slower). \\[default: auto]"),
    lockstep: Optional[str] = typer.Option(None, help="Train same-architecture students together (vmapped SGD steps): on, off or auto (= off: not faster on a CPU, not yet measured on a GPU). \\[default: auto]"),
    data_dir: Optional[Path] = typer.Option(None, help="Dataset folder; default: $HFL_BENCH_DATA or ~/.cache/hfl-bench/data."),
    download: bool = typer.Option(False, "--download", help="Download the dataset if it is missing."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Folder for the JSON record. \\[default: runs]"),
    config_file: Optional[Path] = typer.Option(None, "--config", help="YAML file of run settings (flags override it)."),
    sets: list[str] = typer.Option([], "--set", help="Method hyperparameter key=value (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of tables."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    checkpoint_every: Optional[int] = typer.Option(None, help="Checkpoint every k rounds under <out>/.checkpoints; 0 = never. \\[default: 10]"),
    resume: bool = typer.Option(False, "--resume", help="Continue from this exact config's checkpoint, if there is one."),
):
    """Run one method on one task and write one JSON record."""
    from hfl_bench import engine, records

    flags = dict(
        method=method, task=task, pool=pool, partition=partition, alpha=alpha, classes_per_client=k,
        clients=clients, clients_per_round=clients_per_round, rounds=rounds, local_epochs=local_epochs,
        batch_size=batch_size, lr=lr, seed=seed, public_size=public_size, eval_every=eval_every, device=device, exec=exec_path, vmap=vmap,
        lockstep=lockstep,
        data_dir=str(data_dir) if data_dir else None, download=download or None,
        out=str(out_dir) if out_dir else None, checkpoint_every=checkpoint_every,
    )
    try:
        cfg = build_config(config_file, flags, sets)
        _, cfg = engine.load_task(cfg)
        engine.make_method(cfg)  # unknown method or hyperparameter: fail before loading data
        show_bar = not (quiet or as_json)
        _say_checkpoint(records.checkpoint_path(cfg), resume)
        with _progress(show_bar, cfg) as update:
            result = engine.run(cfg, progress=update, resume=resume)
    except USER_ERRORS as e:
        fail(str(e))
    record = records.build_record(cfg, result)
    path = records.write_record(record, cfg.out)
    if as_json:
        emit_json({"record": str(path), "status": record["status"], "metrics": _headline(record)})
    else:
        _print_summary(record)
        out.print(f"record written to [bold]{path}[/]", highlight=False)
    if record["status"] != "ok":
        err.print(f"[yellow]run {record['status']}:[/] {record['error']}", highlight=False)


def _say_checkpoint(path: Path, resume: bool) -> None:
    if resume and path.exists():
        err.print(f"resuming from checkpoint {path}", highlight=False)
    elif resume:
        err.print(f"no checkpoint for this configuration at {path}: starting from round 0", highlight=False)
    elif path.exists():
        err.print(f"[yellow]note:[/] this configuration has a checkpoint ({path}); this run starts over "
                  "(--resume would continue from it)", highlight=False)


def _headline(record: dict[str, Any]) -> dict[str, Any]:
    m = record.get("metrics") or {}
    return {k: m.get(k) for k in ("global_acc", "local_acc", "mean_val_acc")} | {
        "selected_round": record["selection"]["round"]}


class _progress:
    """A rich progress bar over rounds showing the mean validation accuracy and an ETA."""

    def __init__(self, enabled: bool, cfg: RunConfig):
        self.enabled, self.cfg = enabled, cfg
        self.bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("round {task.completed}/{task.total}"),
            TextColumn("val {task.fields[val]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=err, transient=True,
        )

    def __enter__(self):
        if not self.enabled:
            return None
        self.bar.start()
        self.task = self.bar.add_task(f"{self.cfg.method} on {self.cfg.task}", total=self.cfg.rounds, val="-")
        return self.update

    def update(self, rnd: int, total: int, entry: dict[str, Any]) -> None:
        val = entry.get("mean_val_acc")
        self.bar.update(self.task, completed=rnd, val=f"{val:.1f}%" if val is not None else "-")

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.stop()
        return False


def _fmt(x: Any, nd: int = 2) -> str:
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def _print_summary(record: dict[str, Any]) -> None:
    m = record.get("metrics") or {}
    t = Table(title=f"{record['method']['name']} on {record['task']['name']} ({record['source']['kind']})")
    t.add_column("field")
    t.add_column("value", justify="right")
    cost = record.get("cost") or {}
    rows = [
        ("status", record["status"]),
        ("fidelity", record["method"]["fidelity"]),
        ("global acc (%)", _fmt(m.get("global_acc"))),
        ("local acc (%)", _fmt(m.get("local_acc"))),
        ("mean val acc (%)", _fmt(m.get("mean_val_acc"))),
        ("selected round", _fmt(record["selection"]["round"])),
    ]
    if record["source"]["kind"] == "reproduced":
        rows += [
            ("pool", record["arch_pool"]["name"]),
            ("partition", f"{record['partition']['scheme']} {record['partition']['params']} #{record['partition']['hash']}"),
            ("clients / rounds", f"{record['federation']['n_clients']} / {record['federation']['rounds']}"),
            ("seed", _fmt(record["config"]["seed"])),
            ("bytes sent / client / round", f"{cost.get('bytes_sent_per_client_per_round', 0):,.0f}"),
            ("wall time (s)", _fmt(cost.get("wall_time_total_s"), 1)),
            ("config hash", record["config_hash"]),
        ]
    for row in rows:
        t.add_row(*row)
    out.print(t)


# ----------------------------------------------------------------------------- show


@app.command()
def show(
    record_path: Path = typer.Argument(..., metavar="RECORD", help="A record JSON file."),
    as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
):
    """Render one record: headline metrics, then per-client and per-architecture figures."""
    from hfl_bench.records import load_record

    try:
        record = load_record(record_path)
    except ValueError as e:
        fail(str(e))
    if as_json:
        emit_json(record)
        return
    _print_summary(record)
    m = record.get("metrics") or {}
    if m.get("per_client"):
        t = Table(title="per client (selected round)")
        for col in ("cid", "arch", "global acc", "local acc", "val acc"):
            t.add_column(col, justify="right")
        for c in m["per_client"]:
            t.add_row(str(c["cid"]), c["arch"], _fmt(c.get("global_acc")), _fmt(c.get("local_acc")),
                      _fmt(c.get("val_acc")))
        out.print(t)
    if m.get("extra_endpoints"):
        t = Table(title="extra endpoints (selected round)")
        for col in ("endpoint", "global acc", "local acc"):
            t.add_column(col, justify="right")
        for name, e in m["extra_endpoints"].items():
            t.add_row(name, _fmt(e.get("global_acc")), _fmt(e.get("local_acc")))
        out.print(t)
    if m.get("per_arch_global_acc"):
        t = Table(title="global accuracy per architecture")
        t.add_column("arch")
        t.add_column("global acc", justify="right")
        for arch, acc in m["per_arch_global_acc"].items():
            t.add_row(arch, _fmt(acc))
        out.print(t)


# ----------------------------------------------------------------------------- list


@app.command("list")
def list_(
    kind: str = typer.Argument(..., help="methods, tasks, pools, partitions or aggregators."),
    task: str = typer.Option("digits", help="For pools: the task whose input shape sizes the models."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """List registered plugins of one kind."""
    if kind not in REGISTRIES:
        fail(f"unknown kind {kind!r}; choose one of: {', '.join(REGISTRIES)}")
    try:
        rows = _list_rows(kind, task)
    except USER_ERRORS as e:
        fail(str(e))
    if as_json:
        emit_json(rows)
        return
    t = Table(title=kind)
    columns = [c for c in (rows[0].keys() if rows else ["name"]) if c != "origin"]  # origin: --json only
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*[_cell(row[c]) for c in columns])
    out.print(t)


def _cell(v: Any) -> str:
    if isinstance(v, list):
        return "\n".join(map(str, v))
    return _fmt(v)


def _list_rows(kind: str, task_name: str) -> list[dict[str, Any]]:
    registry = REGISTRIES[kind]
    rows = []
    if kind == "pools":
        from hfl_bench.data import get_task
        from hfl_bench.pools import build_model, n_params

        info = get_task(task_name).info
        for name, pool in registry.items():
            members = [f"{m.name} ({m.model}): {n_params(build_model(m, info)):,} params" for m in pool.members]
            rows.append({"name": name, "members": members, "description": pool.description})
        return rows
    for name, obj in registry.items():
        row = {"name": name, "description": describe(obj)}
        if kind == "methods":
            row.update(fidelity=obj.fidelity, topology=obj.topology)
        if kind == "tasks":
            info = obj.info
            row.update(version=info.version, classes=info.num_classes, input=list(info.input_shape),
                       source=info.source)
        row["origin"] = registry.origin(name)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- partition


@app.command()
def partition(
    task: str = typer.Option("digits", "--task", "-t", help="Task whose training labels are partitioned."),
    scheme: Optional[str] = typer.Option(None, "--partition", help="dirichlet, classes or iid; default: the task's."),
    alpha: Optional[float] = typer.Option(None, help="Dirichlet alpha; default: the task's."),
    k: int = typer.Option(2, "--k", help="Classes per client for --partition classes."),
    clients: Optional[int] = typer.Option(None, help="Number of clients; default: the task's."),
    seed: Optional[int] = typer.Option(None, help="Partition seed; default: the task's."),
    heldout_fraction: float = typer.Option(0.2, help="Held-out fraction of each shard (val + test)."),
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
    table = Table(title=f"{task}: {part.scheme} {part.params}, seed {part.seed}{public}, hash {part.hash}")
    table.add_column("client", justify="right")
    for j in range(c):
        table.add_column(str(j), justify="right")
    for col in ("train", "val", "test"):
        table.add_column(col, justify="right", style="bold")
    for cid in range(part.n_clients):
        table.add_row(str(cid), *[str(v) for v in train[cid]], str(train[cid].sum()), str(val[cid]), str(test[cid]))
    out.print(table)


# ----------------------------------------------------------------------------- command groups in their own modules

from hfl_bench.leaderboard import app as leaderboard_app  # noqa: E402

app.add_typer(leaderboard_app, name="leaderboard")
from hfl_bench.matrix import matrix as matrix_command  # noqa: E402  (imports cli's helpers lazily)

app.command("matrix")(matrix_command)
from hfl_bench.plots import plot_command  # noqa: E402  (after app: plots imports cli's helpers lazily)

app.command("plot")(plot_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
