"""``hfl-bench run`` (one method on one task, one record) and ``hfl-bench show`` (one record)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from hfl_bench import config as config_mod
from hfl_bench.cli.options import CLI_SETTINGS, config_help, given_settings, with_settings
from hfl_bench.cli.output import (
    USER_ERRORS,
    RoundLines,
    cell,
    command_line,
    emit_json,
    err,
    fail,
    fmt,
    interrupted,
    line,
    note,
    out,
    plain,
)
from hfl_bench.config import ConfigError
from hfl_bench.resolved import (  # noqa: F401 (idle_cores, largest_model_params: re-exported)
    ResolvedRun,
    TorchThreads,
    auto_threads,
    idle_cores,
    largest_model_params,
    resolve_run,
)
from hfl_bench.results.text import terminal


def build_config(config_file: Optional[Path], flags: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    """The run's settings: the --config file's, the options given over them, ``--set`` over its
    ``method_params``. A mapping, checked where the run is resolved (``resolve_run``)."""
    values: dict[str, Any] = config_mod.load_yaml(config_file) if config_file else {}
    method_params = dict(values.pop("method_params", None) or {})
    values.update(flags)
    method_params.update(config_mod.parse_set(sets))
    return {**values, "method_params": method_params}


THREADS_HELP = (
    "Torch CPU threads for this run. Default: 1, unless the pool's largest model has >= 1M parameters "
    "and >= 4 cores are idle (cores less the 1-minute load average); then the idle cores, at most "
    "torch's own default."
)
TRACKER_HELP = ("Log each round and the record to an experiment tracker: tensorboard, mlflow or wandb "
                "(repeatable; each an extra, e.g. pip install 'hfl-bench[tensorboard]'; offline by default, "
                "files under <out>/trackers). Never part of the config hash; a tracker that fails is one warning "
                "and the run goes on (an MLflow server that is down: one request, 5 s at most).")


@with_settings(CLI_SETTINGS)
def run(
    ctx: typer.Context,
    config_file: Optional[Path] = typer.Option(None, "--config", help=config_help()),
    sets: list[str] = typer.Option([], "--set", help="Method hyperparameter key=value (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary instead of tables."),
    quiet: bool = typer.Option(False, "--quiet", "-q",
                               help="No progress (neither the bar on a terminal nor the plain lines otherwise)."),
    threads: Optional[int] = typer.Option(None, "--threads", help=THREADS_HELP),
    resume: bool = typer.Option(False, "--resume",
                                help="Continue from this exact config's checkpoint, if there is one."),
    tracker: list[str] = typer.Option([], "--tracker", help=TRACKER_HELP),
    **settings: Any,
):
    """Run one method on one task and write one JSON record.

    An option given overrides the --config file, which overrides the defaults."""
    from hfl_bench import runpath  # the results layer: imported by the command, not at start-up
    from hfl_bench.trackers import Trackers

    flags = given_settings(ctx, settings)
    if threads is not None and threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    done = _Rounds()
    resolved: Optional[ResolvedRun] = None
    try:
        trackers = Trackers(tracker)
        # checked, resolved and named once (``resolve_run``), before torch is even imported
        resolved = _resolve(build_config(config_file, flags, sets))
        show_progress = not (quiet or as_json)
        done.sized = gpu_sized_note(resolved.cfg)

        def started() -> None:
            _say_checkpoint(resolved.checkpoint_path, resume)
            done.start()

        with _progress(show_progress, resolved.cfg.method, resolved.cfg.task, resolved.cfg.rounds) as update:
            # the claim, the same-data check, the run, the atomic write (``runpath``)
            try:
                outcome = runpath.run_resolved(resolved, progress=done.tracking(update), resume=resume,
                                               trackers=trackers, threads=threads, started=started)
            finally:
                done.stop()
    except USER_ERRORS as e:
        fail(str(e))
    except KeyboardInterrupt:
        interrupted(_interrupted_at(resolved, done), command_line(["--resume"]))
    _finish(outcome.saved, as_json)


def _finish(saved: Any, as_json: bool) -> None:
    record = saved.record
    if saved.path is None:  # nowhere to write: the record goes to stdout, the one place left
        sys.stdout.write(json.dumps(record, indent=1) + "\n")
        fail(f"the record {saved.problem}; it was printed above", code=1)
    if as_json:
        emit_json({"record": str(saved.path), "status": record["status"], "metrics": _headline(record)})
    else:
        _print_summary(record)
        out.print(Text.assemble("record written to ", plain(saved.path, "bold")), highlight=False)
    if saved.fallback:
        fail(f"the record {saved.problem}", code=1)
    if record["status"] != "ok":
        note(f"run {record['status']}:", record["error"])
    if record["status"] == "failed":
        raise typer.Exit(1)


def _resolve(settings: dict[str, Any]) -> ResolvedRun:
    """``resolve_run``; an unknown ``--set`` key prints the error line and then, when stderr is a
    terminal, the method's hyperparameter table (``hfl-bench describe METHOD``), exit code 2.
    Piped or captured, the error stays one line (scripts and logs read one line per user error)
    and names ``hfl-bench describe METHOD`` instead."""
    try:
        return resolve_run(settings)
    except ConfigError as e:
        if not str(e).startswith("unknown hyperparameter"):
            raise
        from hfl_bench.cli.describe import hyperparameters, print_params
        from hfl_bench.method_api import get_method_class

        method = settings.get("method") or config_mod.FIELDS["method"].default
        params_cls = get_method_class(method).Params
        if not err.is_terminal:
            fail(f"{e} (hfl-bench describe {method} shows their types, defaults and help)")
        err.print(line("error:", "bold red", str(e)), highlight=False, soft_wrap=True)
        print_params(err, method, hyperparameters(params_cls))
        raise typer.Exit(2) from None


class _Rounds:
    """The last round a run completed (for the line Ctrl-C prints); for a GPU-sized run on a CPU
    (``sized``: the note said before the run), the time the whole run will take, after the first
    round it ran."""

    def __init__(self):
        self.last: Optional[int] = None
        self.sized: Optional[str] = None
        self.t0: Optional[float] = None
        self._said = threading.Lock()  # held once the note is said (or the run ended first)
        self._timer: Optional[threading.Timer] = None

    def start(self) -> None:
        """The run's checks passed: the GPU-sized note is said after ``SIZED_NOTE_AFTER_S`` or at the
        first round, whichever comes first, so a run that stops at its data (missing, corrupt) first
        says only that, in one line."""
        if self.sized:
            self.t0 = time.perf_counter()
            self._timer = threading.Timer(SIZED_NOTE_AFTER_S, self._say)
            self._timer.daemon = True
            self._timer.start()

    def _say(self) -> None:
        if self.sized and self._said.acquire(blocking=False):
            note("note:", self.sized)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._said.acquire(blocking=False)  # nothing said after the run

    def tracking(self, update: Optional[Callable]) -> Callable:
        def progress(rnd: int, total: int, entry: dict[str, Any]) -> None:
            first = self.last is None
            self.last = rnd
            if first and self.t0 is not None:
                if self._timer is not None:
                    self._timer.cancel()
                self._say()
                took = time.perf_counter() - self.t0
                left = total - rnd + 1  # a resumed run: the rounds still to run, this one included
                note("note:", f"round {rnd} took {duration_text(took)} with the setup: about "
                              f"{duration_text(took * left)} for {'the' if left == total else 'its'} {left} "
                              f"round{'s' if left != 1 else ''} on this CPU")
            if update is not None:
                update(rnd, total, entry)

        return progress


# The CPU-sized protocol a GPU-sized run is pointed to: the CPU tasks' pools and digits' rounds.
CPU_ROUNDS = 30
# A GPU-sized run on a CPU says so this long after its checks passed (or at its first round if
# sooner): long enough for a missing or corrupt data file to be its one line, short beside a round.
SIZED_NOTE_AFTER_S = 10.0


def _on_cpu(device: str) -> bool:
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"  # cuda or cuda:N without one is the engine's one-line error


def gpu_sized_note(cfg: config_mod.RunConfig) -> Optional[str]:
    """The line a run prints before its first round when its pool is sized for a GPU
    (``ArchPool.gpu_sized``, e.g. the paper pool of pathmnist's and CIFAR's defaults) and it runs
    on the CPU, naming a CPU-sized run of the task; None otherwise."""
    from hfl_bench.data import get_task, resolve_data_dir
    from hfl_bench.pools import get_pool

    pool = get_pool(cfg.pool)
    if not pool.gpu_sized or not _on_cpu(cfg.device):
        return None
    files = get_task(cfg.task).data_files(resolve_data_dir(cfg.data_dir))
    if not cfg.download and not all(f.is_file() for f in files):
        return None  # the run stops at the missing data, with its one line
    members = ", ".join(dict.fromkeys(m.name for m in pool.members))
    smaller = "cpu-cnn" if pool.homogeneous else "cpu"
    return (f"pool {pool.name} ({members}) is sized for a GPU and this run is on the CPU: an estimate of its "
            f"{cfg.rounds} round{'s' if cfg.rounds != 1 else ''} follows the first one. A CPU-sized run of "
            f"{cfg.task}: --pool {smaller} --rounds {CPU_ROUNDS}")


def duration_text(seconds: float) -> str:
    """``5 h 25 min``, ``12 min``, ``40 s``: a duration as an estimate reads."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _interrupted_at(resolved: Optional[ResolvedRun], done: _Rounds) -> str:
    if resolved is None:
        return "before the run started"
    rounds = resolved.cfg.rounds
    where = f"after round {done.last} of {rounds}" if done.last is not None else "before round 1"
    try:
        has_checkpoint = resolved.checkpoint_path.exists()
    except Exception:  # noqa: BLE001 - only for the message
        has_checkpoint = False
    resume = ("--resume continues from its last checkpoint" if has_checkpoint else
              "no checkpoint was written yet, so --resume starts over; --checkpoint-every sets how often")
    return f"{where}; {resume}"


def _say_checkpoint(path: Path, resume: bool) -> None:
    if resume and path.exists():
        err.print(plain(f"resuming from checkpoint {path}"), highlight=False)
    elif resume:
        err.print(plain(f"no checkpoint for this configuration at {path}: starting from round 0"), highlight=False)
    elif path.exists():
        note("note:", f"this configuration has a checkpoint ({path}); this run starts over "
                      "(--resume would continue from it)")


def _headline(record: dict[str, Any]) -> dict[str, Any]:
    """The run's figures for ``--json``: the headline (``results.headline``: its value, statistic and
    clients), then the selected round's figures (``global_acc`` ..., the papers' rule) and the round."""
    from hfl_bench.results.figures import headline_basis, headline_of, headline_value

    m = record.get("metrics") or {}
    groups = {f"{who}_global_acc": m[who].get("global_acc") for who in ("recipients", "donors")
              if isinstance(m.get(who), dict)}
    return {"headline_global_acc": headline_value(record), "headline_statistic": headline_basis(record),
            "headline_clients": headline_of(record)} | {
        k: m.get(k) for k in ("global_acc", "local_acc", "mean_val_acc")} | groups | {
        "selected_round": record["selection"]["round"]}


def _headline_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """A reproduced record's headline (``results.headline``, the figure every leaderboard view shows)
    and what it is; a published record has only its paper's figure."""
    from hfl_bench.results.figures import FINAL, headline_basis, headline_of, headline_value

    if _get(record, "source", "kind") != "reproduced":
        return []
    basis, who = headline_basis(record), headline_of(record)
    what = (f"mean of rounds {_get(record, 'metrics', 'final', 'first_round')}-"
            f"{_get(record, 'metrics', 'final', 'last_round')}" if basis == FINAL and who == "all"
            else "mean of the last evaluated rounds" if basis == FINAL
            else "selected round: the record has no final figure")
    return [("headline global acc (%)", _number(headline_value(record))),
            ("headline is", f"{who} clients, {what}")]


class _progress:
    """Progress over rounds on stderr: a rich bar with the mean validation accuracy and an ETA on
    a terminal; otherwise (piped, redirected, captured) plain lines, one every
    max(1, rounds // 20) rounds and at the last, without escape sequences."""

    def __init__(self, enabled: bool, method: str, task: str, rounds: int):
        self.enabled, self.what, self.rounds = enabled, f"{method} on {task}", rounds
        self.tty = err.is_terminal
        self.line = RoundLines(self.what, left="eta")
        self.bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("round {task.completed}/{task.total}"),
            TextColumn("val {task.fields[val]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=err, transient=True,
        )

    def __enter__(self):
        if not self.enabled:
            return None
        if not self.tty:
            self.line = RoundLines(self.what, left="eta")  # the clock starts with the rounds
            return self.line
        self.bar.start()
        description = escape(terminal(self.what))  # the column reads markup
        self.task = self.bar.add_task(description, total=self.rounds, val="-")
        return self.update

    def update(self, rnd: int, total: int, entry: dict[str, Any]) -> None:
        val = entry.get("mean_val_acc")
        self.bar.update(self.task, completed=rnd, val=f"{val:.1f}%" if val is not None else "-")

    def __exit__(self, *exc):
        if self.enabled and self.tty:
            self.bar.stop()
        return False


def _get(node: Any, *keys: Any) -> Any:
    """``node[k1][k2]...``, or None where a level is missing or not a mapping / list (a shown
    record may be malformed; ``show`` renders what it has)."""
    for key in keys:
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
            node = node[key]
        else:
            return None
    return node


def _number(x: Any, nd: int = 2) -> str:
    return fmt(x, nd) if x is None or isinstance(x, (int, float)) else str(x)


def _print_summary(record: dict[str, Any]) -> None:
    m = _get(record, "metrics") or {}
    t = Table(title=plain(f"{_get(record, 'method', 'name')} on {_get(record, 'task', 'name')} "
                          f"({_get(record, 'source', 'kind')})"))
    t.add_column("field")
    t.add_column("value", justify="right")
    cost = _get(record, "cost") or {}
    selected = ", selected round" if _get(record, "source", "kind") == "reproduced" else ""
    rows = [
        ("status", _get(record, "status")),
        ("fidelity", _get(record, "method", "fidelity")),
        *_headline_rows(record),
        (f"global acc{selected} (%)", _number(_get(m, "global_acc"))),
        (f"local acc{selected} (%)", _number(_get(m, "local_acc"))),
        ("mean val acc (%)", _number(_get(m, "mean_val_acc"))),
        *[(f"global acc, {who} (%)", _number(_get(m, who, "global_acc")))  # a multimodal task's client groups
          for who in ("recipients", "donors") if isinstance(_get(m, who), dict)],
        ("selected round", _number(_get(record, "selection", "round"))),
    ]
    if _get(record, "source", "kind") == "reproduced":
        rows += _seen_unseen_rows(m)
        sent = _get(cost, "bytes_sent_per_client_per_round")
        part = _get(record, "partition") or {}
        rows += [
            ("pool", _get(record, "arch_pool", "name")),
            ("partition", f"{_get(part, 'scheme')} {_get(part, 'params')} #{_get(part, 'hash')}"),
            ("clients / rounds", f"{_get(record, 'federation', 'n_clients')} / {_get(record, 'federation', 'rounds')}"),
            # sampled evaluation (--eval-clients) and offloaded client state, only in a run that used them
            *([("test rounds before the final window", f"a seeded {ev} clients each")]
              if (ev := _get(record, "federation", "eval_clients")) is not None else []),
            *([("client state", state)] if (state := _get(record, "federation", "client_state")) else []),
            ("seed", _number(_get(record, "config", "seed"))),
            ("bytes sent / client / round", f"{sent:,.0f}" if isinstance(sent, (int, float)) else _number(sent)),
            ("wall time (s)", _number(_get(cost, "wall_time_total_s"), 1)),
            ("config hash", _get(record, "config_hash")),
            *_clock_rows(record),
        ]
    for field, value in rows:
        t.add_row(field, cell(value))
    out.print(t)


def _clock_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The simulated clock (``--devices``, schema 1.10): the device setting, the total simulated
    time, and where a re-clocked record's clock came from (``hfl-bench reclock``); none without one."""
    clock = _get(record, "clock")
    if not isinstance(clock, dict):
        return []
    deadline = _get(clock, "deadline_s")
    rows = [("devices", f"{_get(clock, 'profile')}, {_get(clock, 'assignment')}"
             + (f", deadline {_number(deadline)} s" if deadline is not None else "")),
            ("simulated time (s)", _number(_get(clock, "total_s"), 1))]
    source = _get(clock, "reclocked")
    if isinstance(source, dict):
        sha = _get(source, "git_sha")
        commit = f"{str(sha)[:12]}{' (dirty)' if _get(source, 'git_dirty') else ''}" if sha else "unknown commit"
        rows.append(("re-clocked from", f"{_get(source, 'file')} (record {_get(source, 'record_id')}, sha256 "
                     f"{str(_get(source, 'sha256'))[:12]}; devices {_get(source, 'profile')}, "
                     f"{_get(source, 'assignment')}) by {commit}"))
    return rows


def _seen_unseen_rows(m: dict[str, Any]) -> list[tuple[str, str]]:
    """The seen / unseen-class accuracy (schema 1.6) over all clients and each client group, at the
    selected round and over the final window; "-" for a record from before 1.6."""
    rows = []
    for who in ("all", "honest", "faulty", "recipients", "donors"):
        block = _get(m, "seen_unseen") if who == "all" else _get(m, who, "seen_unseen")
        if who != "all" and not isinstance(_get(m, who), dict):
            continue
        suffix = "" if who == "all" else f", {who}"
        lacking = _get(block, "n_clients_unseen")
        of = f" ({lacking} of {_get(block, 'n_clients')} clients lack a class)" if isinstance(lacking, int) else ""
        rows += [(f"seen-class acc{suffix} (%)", _number(_get(block, "seen_acc"))),
                 (f"unseen-class acc{suffix} (%)", _number(_get(block, "unseen_acc")) + of),
                 (f"final seen / unseen acc{suffix} (%)",
                  f"{_number(_get(block, 'final', 'seen_acc'))} / {_number(_get(block, 'final', 'unseen_acc'))}")]
    return rows


def show(
    record_path: Path = typer.Argument(..., metavar="RECORD", help="A record JSON file."),
    as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
):
    """Render one record: headline metrics, then per-client and per-architecture figures.

    Text from the record is shown as itself (never as markup, without control characters)."""
    from hfl_bench.record.io import load_record

    try:
        record = load_record(record_path)
    except ValueError as e:
        fail(str(e))
    if as_json:
        emit_json(record)
        return
    _print_summary(record)
    m = _get(record, "metrics") or {}
    clients = _get(m, "per_client")
    if isinstance(clients, list) and clients:
        t = Table(title="per client (selected round)")
        for col in ("cid", "arch", "global acc", "local acc", "val acc"):
            t.add_column(col, justify="right")
        for c in clients:
            t.add_row(*[cell(_number(_get(c, k))) for k in ("cid", "arch", "global_acc", "local_acc", "val_acc")])
        out.print(t)
    endpoints = _get(m, "extra_endpoints")
    if isinstance(endpoints, dict) and endpoints:
        t = Table(title="extra endpoints (selected round)")
        for col in ("endpoint", "global acc", "local acc"):
            t.add_column(col, justify="right")
        for name, e in endpoints.items():
            t.add_row(plain(name), cell(_number(_get(e, "global_acc"))), cell(_number(_get(e, "local_acc"))))
        out.print(t)
    per_arch = _get(m, "per_arch_global_acc")
    if isinstance(per_arch, dict) and per_arch:
        # beside each architecture's global accuracy, its seen- and unseen-class accuracy ("-" before schema 1.6)
        t = Table(title="global accuracy per architecture (seen / unseen: on the classes its clients hold / lack)")
        t.add_column("arch")
        for col in ("global acc", "seen acc", "unseen acc"):
            t.add_column(col, justify="right")
        seen_unseen = _get(m, "seen_unseen", "per_arch")
        for arch, acc in per_arch.items():
            figures = _get(seen_unseen, arch)
            t.add_row(plain(arch), cell(_number(acc)), cell(_number(_get(figures, "seen_acc"))),
                      cell(_number(_get(figures, "unseen_acc"))))
        out.print(t)
