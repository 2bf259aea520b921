"""``hfl-bench run`` (one method on one task, one record) and ``hfl-bench show`` (one record)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from hfl_bench import config as config_mod
from hfl_bench.cli.output import USER_ERRORS, emit_json, err, fail, fmt, out
from hfl_bench.config import RunConfig
from hfl_bench.paths import checkpoint_path


def build_config(config_file: Optional[Path], flags: dict[str, Any], sets: list[str]) -> RunConfig:
    values: dict[str, Any] = config_mod.load_yaml(config_file) if config_file else {}
    method_params = dict(values.pop("method_params", None) or {})
    values.update({k: v for k, v in flags.items() if v is not None})
    method_params.update(config_mod.parse_set(sets))
    return RunConfig(**values, method_params=method_params)


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
    from hfl_bench import engine
    from hfl_bench.results import records

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
        _say_checkpoint(checkpoint_path(cfg), resume)
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


def _print_summary(record: dict[str, Any]) -> None:
    m = record.get("metrics") or {}
    t = Table(title=f"{record['method']['name']} on {record['task']['name']} ({record['source']['kind']})")
    t.add_column("field")
    t.add_column("value", justify="right")
    cost = record.get("cost") or {}
    rows = [
        ("status", record["status"]),
        ("fidelity", record["method"]["fidelity"]),
        ("global acc (%)", fmt(m.get("global_acc"))),
        ("local acc (%)", fmt(m.get("local_acc"))),
        ("mean val acc (%)", fmt(m.get("mean_val_acc"))),
        ("selected round", fmt(record["selection"]["round"])),
    ]
    if record["source"]["kind"] == "reproduced":
        rows += [
            ("pool", record["arch_pool"]["name"]),
            ("partition", f"{record['partition']['scheme']} {record['partition']['params']} #{record['partition']['hash']}"),
            ("clients / rounds", f"{record['federation']['n_clients']} / {record['federation']['rounds']}"),
            ("seed", fmt(record["config"]["seed"])),
            ("bytes sent / client / round", f"{cost.get('bytes_sent_per_client_per_round', 0):,.0f}"),
            ("wall time (s)", fmt(cost.get("wall_time_total_s"), 1)),
            ("config hash", record["config_hash"]),
        ]
    for row in rows:
        t.add_row(*row)
    out.print(t)


def show(
    record_path: Path = typer.Argument(..., metavar="RECORD", help="A record JSON file."),
    as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
):
    """Render one record: headline metrics, then per-client and per-architecture figures."""
    from hfl_bench.results.records import load_record

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
            t.add_row(str(c["cid"]), c["arch"], fmt(c.get("global_acc")), fmt(c.get("local_acc")),
                      fmt(c.get("val_acc")))
        out.print(t)
    if m.get("extra_endpoints"):
        t = Table(title="extra endpoints (selected round)")
        for col in ("endpoint", "global acc", "local acc"):
            t.add_column(col, justify="right")
        for name, e in m["extra_endpoints"].items():
            t.add_row(name, fmt(e.get("global_acc")), fmt(e.get("local_acc")))
        out.print(t)
    if m.get("per_arch_global_acc"):
        t = Table(title="global accuracy per architecture")
        t.add_column("arch")
        t.add_column("global acc", justify="right")
        for arch, acc in m["per_arch_global_acc"].items():
            t.add_row(arch, fmt(acc))
        out.print(t)
