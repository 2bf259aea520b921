"""Builders the method tests share: a federation on the CPU, a method set up on it, and short runs
through the real command line (in-process, or as a program for its exit code)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from hfl_bench import testing
from hfl_bench.config import RunConfig
from hfl_bench.federation import Federation
from hfl_bench.method_api import Method

# A real committed record (crad on digits, first wave) that the views' tests copy and vary.
REPO = Path(__file__).resolve().parent.parent
REAL_RECORD = REPO / "leaderboards" / "archive" / "first-wave" / "digits" / "digits__crad__da48ac8fb4f0dad1__seed0.json"


def cpu_federation(cfg: RunConfig) -> Federation:
    """The federation ``cfg`` describes (unset fields from the task's defaults), on the CPU
    (``hfl_bench.testing.cpu_federation``, which plugin packages use too)."""
    return testing.cpu_federation(cfg)


def ready_method(cls: type[Method] | str, fed: Federation, **params) -> Method:
    """``cls`` (or a method name) with these hyperparameters, checked against ``fed`` and set up on
    it (``hfl_bench.testing.ready_method``)."""
    return testing.ready_method(cls, fed, **params)


def record_sends(fed: Federation, monkeypatch) -> list[tuple]:
    """The (source, destination) of every metered send on ``fed``'s channel from now on; the
    sends still go through (and are counted) as usual."""
    sends: list[tuple] = []
    send = fed.channel.send
    monkeypatch.setattr(fed.channel, "send",
                        lambda src, dst, p, kind: sends.append((src, dst)) or send(src, dst, p, kind))
    return sends


def invoke_cli(*args: str):
    """Run the real CLI in-process: (result, stdout, stderr); stderr is "" where the runner mixes it in."""
    from typer.testing import CliRunner

    from hfl_bench.cli import app

    result = CliRunner().invoke(app, list(args))
    try:
        stderr = result.stderr
    except ValueError:
        stderr = ""
    return result, result.stdout, stderr


def seen_unseen_problems(record: dict) -> list[str]:
    """What an ok run's record gets wrong of its seen / unseen-class accuracy (schema 1.6): the
    block at the selected round and over the final window, agreeing with the partition, the
    per-round means in history and each client group's block; [] when nothing."""
    m = record.get("metrics") or {}
    su = m.get("seen_unseen")
    if not isinstance(su, dict):
        return ["no metrics.seen_unseen"]
    problems = []
    held_classes = [sum(n >= su["min_train_count"] for n in row) for row in record["partition"]["train_counts"]]
    if [c["n_seen_classes"] for c in su["per_client"]] != held_classes:
        problems.append("per_client n_seen_classes disagree with partition.train_counts")
    if su["seen_acc"] is None or su["n_clients_seen"] != su["n_clients"] == len(held_classes):
        problems.append(f"seen_acc {su['seen_acc']} over {su['n_clients_seen']} of {su['n_clients']} clients")
    with_unseen = sum(c["unseen_acc"] is not None for c in su["per_client"])
    if su["n_clients_unseen"] != with_unseen or (su["unseen_acc"] is None) != (with_unseen == 0):
        problems.append(f"unseen_acc {su['unseen_acc']} with {su['n_clients_unseen']} clients, {with_unseen} have one")
    selected = record["history"][record["selection"]["round"]]
    if (selected.get("seen_acc"), selected.get("unseen_acc")) != (su["seen_acc"], su["unseen_acc"]):
        problems.append("the selected round's history entry disagrees with metrics.seen_unseen")
    final = su.get("final") or {}
    if final.get("rounds") != (m.get("final") or {}).get("rounds") or final.get("seen_acc") is None:
        problems.append(f"final window {final} is not metrics.final's")
    problems += [f"no metrics.{g}.seen_unseen" for g in ("honest", "faulty", "recipients", "donors")
                 if isinstance(m.get(g), dict) and not isinstance(m[g].get("seen_unseen"), dict)]
    return problems


def in_float64(fed: Federation) -> Federation:
    """``fed`` with its models and float data in double precision, for tests that compare two
    execution paths over many training steps (reference and fast, ...).

    The paths compute the same update with different reduction orders (per-batch teachers against
    one pass), so they may differ by rounding. In
    float32 that rounding is ~6e-8 per reduction and a few hundred clipped, decayed SGD steps can
    amplify it past any fixed tolerance on some CPUs (an AMD host with AVX-512 measured > 2e-5);
    in float64 the same accumulation bound is ~1e-16 x (reduction length <= 1e3) x (steps <= 1e3)
    x (lr x gradient <= 1) ~ 1e-10, while a missing or misplaced term moves parameters by > 1e-3.
    Teachers' logits still come back as float32 (``training.predict_logits``): float64 values
    ~1e-13 apart round to the same float32 but for a ~1e-13/6e-8 chance per element.
    """
    for c in fed.clients:
        c.model.double()
    floats = {f.name: getattr(fed.data, f.name) for f in dataclasses.fields(fed.data)}
    fed.data = dataclasses.replace(fed.data, **{k: v.double() for k, v in floats.items()
                                                 if isinstance(v, torch.Tensor) and v.is_floating_point()})
    return fed


# Two execution paths' float64 parameters agree within this (in_float64's bound, ~1e-10, with two
# orders of margin).
ATOL64 = 1e-8


def write_dist(root: Path, package: str, dist: str, source: str, entry_points: str) -> None:
    """A real installed distribution under ``root`` (a folder for sys.path / PYTHONPATH): the package
    ``package`` with ``source`` as its __init__, and a dist-info with ``entry_points``, so that
    importlib.metadata discovers it as pip would have installed it."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text(textwrap.dedent(source))
    info = root / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    (info / "top_level.txt").write_text(package + "\n")


# A short run the sub-model families' tests (width, depth, FjORD) share.
QUICK = ("--task", "digits", "--clients", "4", "--rounds", "3")


def quick_run(out: Path, *args: str) -> dict:
    """The record of ``hfl-bench run`` (in-process) on ``QUICK`` with ``args``, which name
    ``--method``, written under ``out`` (other methods' records may sit there too)."""
    result, _, _ = invoke_cli("run", *QUICK, "--out", str(out), *args)
    assert result.exit_code == 0, result.output
    [path] = [p for p in out.glob("*.json") if p.name.split("__")[1] == args[args.index("--method") + 1]]
    return json.loads(path.read_text())


def figures(record: dict) -> dict:
    """What two runs that train alike agree on bit for bit: each round's global and local accuracy
    and training loss, and the per-client and mean accuracies of ``metrics``."""
    m = record["metrics"]
    return {"history": [{k: h.get(k) for k in ("global_acc", "local_acc", "train_loss")} for h in record["history"]],
            "per_client": m["per_client"], "global_acc": m["global_acc"], "local_acc": m["local_acc"]}


def assert_refused(out: Path, method: str, *args: str, says: str, base: tuple[str, ...] = QUICK) -> None:
    """``hfl-bench run --method method *base --out out *args`` as a program (its real exit code and
    stderr) exits 2 with one line on stderr that holds ``says``, and writes no record."""
    proc = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "run", "--method", method, *base,
                           "--out", str(out), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not list(out.glob("*.json"))


def straight_and_resumed(cfg: RunConfig, checkpoint: Path, rounds: int = 3, stop: int = 1):
    """The run ``cfg`` describes stepped through ``rounds`` rounds without stopping, and the same run
    checkpointed to ``checkpoint`` after round ``stop``, loaded into a fresh simulation and stepped
    on to ``rounds``: (straight, resumed) ``engine.Simulation``s, to compare."""
    from hfl_bench.engine import Simulation

    straight = Simulation(cfg)
    for rnd in range(1, rounds + 1):
        straight.step(rnd)
    first = Simulation(cfg)
    for rnd in range(1, stop + 1):
        first.step(rnd)
    first.save_checkpoint(checkpoint)
    resumed = Simulation(cfg)
    assert resumed.load_checkpoint(checkpoint) == stop
    for rnd in range(stop + 1, rounds + 1):
        resumed.step(rnd)
    return straight, resumed


def write_records(folder: Path, records: list[dict]) -> Path:
    """Each record as ``<record_id>.json`` in ``folder`` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in records:
        (folder / f"{r['record_id']}.json").write_text(json.dumps(r))
    return folder
