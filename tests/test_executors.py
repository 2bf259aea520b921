"""The executor API (``hfl_bench.matrix.executor_api``): the registry holds local, pool and ray;
a bad name gets "did you mean", a class that is not an Executor is refused, options are checked
in one place; a third-party executor installed as a real distribution (an entry point of
``hfl_bench.executors``) runs a matrix through the CLI; and every executor hands each round to
``on_round`` while its cell runs (a method waits at round 2 until the driver has seen round 1)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hfl_bench.config import ConfigError
from hfl_bench.matrix.executor_api import EXECUTORS, Executor, ExecutorOptions, register_executor
from hfl_bench.matrix.executors import (
    LocalOptions,
    PoolExecutor,
    PoolOptions,
    RayExecutor,
    RayOptions,
    executor_class,
    executor_options,
    make_executor,
)
from hfl_bench.matrix.runner import run_matrix
from hfl_bench.matrix.suite import parse_suite, suite_cells
from hfl_bench.registry import RegistryError
from hfl_bench.testing import QUICK, builtin_names

from helpers import write_dist

# --------------------------------------------------------------------------- the registry


def test_the_registry_holds_local_pool_and_ray():
    assert builtin_names(EXECUTORS) == ["local", "pool", "ray"]
    assert {name: cls.Options for name, cls in EXECUTORS.items() if name in ("local", "pool", "ray")} == \
        {"local": LocalOptions, "pool": PoolOptions, "ray": RayOptions}
    assert executor_class("pool") is PoolExecutor and PoolExecutor.name == "pool"


def test_a_bad_name_says_did_you_mean():
    with pytest.raises(ConfigError, match=r"unknown executor 'rey'\. Did you mean 'ray'\? Available: local, pool, ray"):
        executor_class("rey")
    with pytest.raises(ConfigError, match="unknown executor 'dask'"):  # the Python API says so too
        run_matrix([], "dask")


def test_what_is_not_an_executor_is_refused():
    class NotAnExecutor:
        def run(self, cells, on_record, on_round=None, plugins=None):
            pass

    class Abstract(Executor):
        pass

    @dataclasses.dataclass(frozen=True)
    class Plain:  # a dataclass, not an ExecutorOptions
        jobs: int = 1

    class BadOptions(Executor):
        Options = Plain

        def run(self, cells, on_record, on_round=None, plugins=None):
            pass

    for name, obj, message in (("not-a-class", lambda cells: None, "must be a subclass of"),
                               ("duck", NotAnExecutor, "must be a subclass of"),
                               ("abstract", Abstract, "does not implement run"),
                               ("bad-options", BadOptions, "Options must be a dataclass subclassing ExecutorOptions")):
        with pytest.raises(RegistryError, match=message):
            register_executor(name)(obj)
        assert name not in EXECUTORS
    with pytest.raises(RegistryError, match="already registered"):
        register_executor("ray")(type("Other", (PoolExecutor,), {}))


def test_options_are_checked_in_one_place():
    assert executor_options("local") == LocalOptions()
    assert executor_options("pool", {"jobs": 3, "cells_per_gpu": None}) == PoolOptions(jobs=3)
    assert executor_options("ray", {"address": "auto", "gpus_per_cell": 0.5}) == \
        RayOptions(address="auto", gpus_per_cell=0.5)
    for name, given, message in (
            ("local", {"address": "auto"}, "--address is for --executor ray, not local"),
            ("ray", {"cells_per_gpu": None}, "--cells-per-gpu is for --executor local or pool, not ray; on Ray, "
                                             "--gpus-per-cell sets each cell's share of a GPU"),
            ("pool", {"jobs": 0}, "--jobs must be >= 1, got 0"),
            ("ray", {"cpus_per_cell": 0.0}, "--cpus-per-cell must be > 0, got 0"),
            ("ray", {"gpus_per_cell": -1.0}, "--gpus-per-cell must be >= 0, got -1")):
        with pytest.raises(ConfigError) as e:
            executor_options(name, given)
        assert str(e.value) == message or str(e.value).startswith(message), str(e.value)
    with pytest.raises(ConfigError, match="--threads must be >= 1"):  # the dataclass made by hand: checked too
        make_executor("local", LocalOptions(threads=0))
    with pytest.raises(ConfigError, match="executor 'ray' takes RayOptions, got PoolOptions"):
        run_matrix([], "ray", PoolOptions())
    with pytest.raises(ConfigError, match="carries its own options"):
        make_executor(PoolExecutor(PoolOptions(jobs=2)), PoolOptions(jobs=3))
    assert isinstance(make_executor("pool"), PoolExecutor)


def test_options_subclass_a_frozen_dataclass():
    assert dataclasses.is_dataclass(ExecutorOptions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        PoolOptions().jobs = 2  # type: ignore[misc]


# --------------------------------------------------------------------------- a third-party executor


TOY = '''
"""A third-party executor: the cells in this process, last first."""

import dataclasses
import sys
from typing import Optional

from hfl_bench.matrix.executor_api import Executor, ExecutorOptions, register_executor, run_here


@dataclasses.dataclass(frozen=True)
class ToyOptions(ExecutorOptions):
    threads: Optional[int] = None


@register_executor("toy")
class ToyExecutor(Executor):
    """The cells in this process, last first (a test plugin)."""

    Options = ToyOptions

    def run(self, cells, on_record, on_round=None, plugins=None):
        for cell in reversed(cells):
            rounds = []
            record = run_here(cell, lambda c, e: (rounds.append(e["round"]), on_round and on_round(c, e)),
                              self.options.threads)
            sys.stderr.write(f"toy ran seed {cell.cfg.seed}: rounds {rounds}\\n")
            on_record(cell, record)
'''

NOT_AN_EXECUTOR = '''
class NotAnExecutor:
    """Registered under the entry point's name: refused, and skipped with a warning."""
'''


def _cli(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(cwd / "cache"),
               COLUMNS="200")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_third_party_executor_from_an_entry_point_runs_a_matrix(tmp_path):
    site = tmp_path / "site"
    write_dist(site, "hflb_toy_executor", "hflb-toy-executor", TOY,
               "[hfl_bench.executors]\ntoy = hflb_toy_executor\n")
    write_dist(site, "hflb_bad_executor", "hflb-bad-executor", NOT_AN_EXECUTOR,
               "[hfl_bench.executors]\nbad = hflb_bad_executor:NotAnExecutor\n")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "seeds": [0, 1], "out": "runs",
                                     "settings": {"rounds": 2, "clients": 3, **QUICK}}))
    refused = ("warning: plugin hflb-bad-executor's entry point 'bad' (hfl_bench.executors: "
               "hflb_bad_executor:NotAnExecutor) was refused: executor 'bad' must be a subclass of "
               "hfl_bench.matrix.executor_api.Executor")

    proc = _cli(site, tmp_path, "matrix", "s.yaml", "--executor", "toy", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["counts"] == {"ok": 2} and [r["seed"] for r in summary["cells"]] == [0, 1]
    assert "toy ran seed 1: rounds [1, 2]\ntoy ran seed 0: rounds [1, 2]" in proc.stderr  # last first, live
    assert refused in proc.stderr

    proc = _cli(site, tmp_path, "matrix", "--help")
    assert proc.returncode == 0 and "toy: the cells in this process, last first (a test plugin)" in \
        " ".join(proc.stdout.replace("│", " ").split()), proc.stdout

    proc = _cli(site, tmp_path, "matrix", "s.yaml", "--executor", "toy", "--jobs", "2")
    assert proc.returncode == 2 and "error: --jobs is for --executor local, pool or ray, not toy" in proc.stderr
    proc = _cli(site, tmp_path, "matrix", "s.yaml", "--executor", "bad")
    assert proc.returncode == 2 and "unknown executor 'bad' (the plugin hflb-bad-executor's entry point 'bad'" \
        in proc.stderr


# --------------------------------------------------------------------------- rounds reach the driver live


WAITER = '''
"""A test method: round 2 waits until the driver has seen round 1 (the file ``go`` exists)."""

import dataclasses
import time
from pathlib import Path

from hfl_bench.method_api import Method, MethodCard, register_method
from hfl_bench.training import make_plan, train_on_plan


@dataclasses.dataclass
class WaitParams:
    go: str = ""


@register_method
class WaitForDriver(Method):
    card = MethodCard(name="wait-for-driver", version="1.0", fidelity="reconstructed", topology="none",
                      citation="test", summary="Local CE; round 2 waits until the driver saw round 1.")
    Params = WaitParams

    def run_round(self, fed, rnd, active):
        if rnd == 2:
            deadline = time.monotonic() + 60
            while not Path(self.params.go).exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the driver did not see round 1 while the cell ran")
                time.sleep(0.05)
        losses = [train_on_plan(fed, fed.clients[i], make_plan(fed, i, rnd)) for i in active]
        return {"train_loss": sum(losses) / len(losses)}
'''


@pytest.fixture(scope="module")
def waiter(tmp_path_factory):
    """The method above as an installed distribution, on this process's path and on PYTHONPATH (so
    pool workers and a Ray started here find it too); imported here, which registers it."""
    site = tmp_path_factory.mktemp("site")
    write_dist(site, "hflb_waiter", "hflb-waiter", WAITER, "[hfl_bench.methods]\nwaiter = hflb_waiter\n")
    before = (list(sys.path), os.environ.get("PYTHONPATH"))
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), before[1]) if p)
    import multiprocessing.forkserver as forkserver

    # A fork server started before (another test in this process) holds the old path: a new one
    # starts at the next pool, with this one.
    with contextlib.suppress(Exception):
        forkserver._forkserver._stop()
    import hflb_waiter  # noqa: F401 - registers wait-for-driver in this process

    yield site
    sys.path[:] = before[0]
    if before[1] is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before[1]


def _waiting_cells(tmp_path: Path, seeds: list[int]):
    go = tmp_path / "go"
    suite = parse_suite({"methods": ["wait-for-driver"], "tasks": ["digits"], "seeds": seeds,
                         "out": str(tmp_path / "runs"),
                         "settings": {"rounds": 3, "clients": 3, "device": "cpu", **QUICK},
                         "method_overrides": {"wait-for-driver": {"method_params": {"go": str(go)}}}})
    return suite_cells(suite)


def _run_live(executor: Executor, tmp_path: Path, seeds: list[int]) -> list[tuple]:
    """Run the waiting cells; the driver's on_round opens the gate of a cell's round 2 when it sees
    the cell's round 1 (one gate per cell: each cell's method reads its own path)."""
    cells = _waiting_cells(tmp_path, seeds)
    for cell in cells:
        assert cell.error is None, cell.error
    events: list[tuple] = []

    def on_round(cell, entry):
        events.append(("round", cell.cfg.seed, entry["round"]))
        if entry["round"] == 1:
            Path(cell.cfg.method_params["go"]).touch()

    def on_record(cell, record):
        events.append(("record", cell.cfg.seed, record["status"], record.get("error")))

    executor.run(cells, on_record, on_round)
    return events


def _check(events: list[tuple], seeds: list[int]) -> None:
    for seed in seeds:
        mine = [e for e in events if e[1] == seed]
        assert mine == [("round", seed, 1), ("round", seed, 2), ("round", seed, 3), ("record", seed, "ok", None)], \
            events


def test_the_local_executor_reports_rounds_live(tmp_path, waiter):
    _check(_run_live(make_executor("local"), tmp_path, [0]), [0])


def test_the_pool_reports_rounds_live(tmp_path, waiter):
    _check(_run_live(PoolExecutor(PoolOptions(jobs=1, threads=1)), tmp_path, [0]), [0])


@pytest.mark.slow
@pytest.mark.ray
def test_ray_reports_rounds_live(tmp_path, waiter):
    pytest.importorskip("ray")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported: loopback only
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_worker_niceness"] = "0"  # beside busy test workers, niced Ray workers starve
    # The executor starts a local Ray (inheriting PYTHONPATH) and shuts it down at the end.
    _check(_run_live(RayExecutor(RayOptions(cpus_per_cell=1)), tmp_path, [0]), [0])
