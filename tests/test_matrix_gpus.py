"""Several matrix cells on one GPU (``--cells-per-gpu``): the planning functions, the local pool's
GPU bookkeeping with stand-in workers (no GPU here: each stand-in says which device it was given
and what it saw), the flag's refusals, and the throughput figures of the summary."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.matrix.executors import run_process_pool
from hfl_bench.matrix.gpus import (
    MAX_CELLS_PER_GPU,
    GpuPlan,
    MemoryReport,
    gpu_slots,
    is_cuda_cell,
    memory_reporter,
    parse_cells_per_gpu,
    pick_gpu,
    pinned_gpu,
    take_slots,
)
from hfl_bench.matrix.runner import rounds_now, throughput
from hfl_bench.matrix.suite import Cell

GiB = 2**30


# --------------------------------------------------------------------------- planning, pure


def test_slots_from_memory():
    assert gpu_slots(80 * GiB, 10 * GiB) == 6  # floor(0.8 * 80 / 10)
    assert gpu_slots(80 * GiB, 8 * GiB) == 8
    assert gpu_slots(141 * GiB, GiB // 4) == MAX_CELLS_PER_GPU == 8  # small cells: the ceiling
    assert gpu_slots(16 * GiB, 15 * GiB) == 1  # one cell that nearly fills it: still one
    assert gpu_slots(16 * GiB, 40 * GiB) == 1  # never none
    assert gpu_slots(None, GiB) == gpu_slots(80 * GiB, None) == gpu_slots(80 * GiB, 0) == 1  # not known yet


def test_gpu_choice():
    assert pick_gpu([0, 0], [2, 2]) == 0  # a tie: the lowest index
    assert pick_gpu([1, 0], [2, 2]) == 1  # the fewest running
    assert pick_gpu([2, 1], [2, 2]) == 1
    assert pick_gpu([2, 2], [2, 2]) is None  # all full
    assert pick_gpu([1, 3], [1, 8]) == 1  # GPU 0 full at its own cap, though it runs fewer
    assert pick_gpu([], []) is None
    assert [is_cuda_cell(d, 2) for d in ("cuda", "cuda:1", "auto", "cpu")] == [True, True, True, False]
    assert [is_cuda_cell(d, 0) for d in ("cuda", "cuda:1", "auto", "cpu")] == [False] * 4  # no GPU: as before
    assert (pinned_gpu("cuda:3"), pinned_gpu("cuda"), pinned_gpu("auto"), pinned_gpu("cpu")) == (3, None, None, None)


def test_the_flag_value():
    assert parse_cells_per_gpu(None) is None and parse_cells_per_gpu("auto") is None
    assert parse_cells_per_gpu("3") == 3
    for bad in ("0", "-1", "x", "1.5", ""):
        with pytest.raises(ConfigError, match="--cells-per-gpu must be a positive integer or auto"):
            parse_cells_per_gpu(bad)


def test_fixed_plan_and_the_jobs_cap():
    plan = GpuPlan(2, fixed=2)
    # 6 GPU cells and a CPU cell, 5 jobs free: two per GPU, alternating; the CPU cell fits past the
    # waiting GPU cells; the jobs cap stops there
    devices = ["cuda", "auto", "cuda", "cuda", "cuda", "cpu", "cuda"]
    assert take_slots(devices, plan, free=5, idle=True) == [(0, 0), (1, 1), (2, 0), (3, 1), (5, None)]
    assert plan.running == [2, 2]
    assert take_slots(["cuda"], plan, free=10, idle=False) == []  # both GPUs full: it waits
    assert take_slots(["cpu", "cuda"], plan, free=10, idle=False) == [(0, None)]  # CPU cells: --jobs alone
    plan.finish(1)
    assert take_slots(["cuda", "cuda"], plan, free=10, idle=False) == [(0, 1)]
    assert take_slots(["cpu", "cpu", "cpu"], GpuPlan(0), free=2, idle=True) == [(0, None), (1, None)]  # no GPU
    assert take_slots(["cuda"], GpuPlan(2, fixed=2), free=0, idle=False) == []


def test_a_cuda_n_cell_keeps_its_gpu():
    plan = GpuPlan(2, fixed=1)
    assert take_slots(["cuda:1", "cuda:1", "cuda"], plan, free=8, idle=True) == [(0, 1), (2, 0)]
    assert plan.running == [1, 1]
    assert take_slots(["cuda:1"], plan, free=8, idle=False) == []  # its GPU is full: it waits, not moves
    assert plan.place("cuda:5") == (True, None)  # a GPU this machine lacks: it fails in its worker


def test_auto_plan_follows_the_reported_peaks():
    plan = GpuPlan(2)  # auto
    assert plan.caps() == [1, 1]  # one per GPU until a cell reports
    plan.observe(0, 4 * GiB, 40 * GiB)
    assert plan.caps() == [8, 1]  # GPU 1's memory is not known yet
    plan.observe(1, 2 * GiB, 20 * GiB)  # a smaller peak does not lower the plan's peak
    assert plan.peak == 4 * GiB and plan.caps() == [8, 4]
    plan.observe(1, 10 * GiB)  # a larger one (a finished record's) lowers every share
    assert plan.caps() == [3, 1]
    plan.observe(None, None)  # a CPU cell's record: nothing
    assert plan.caps() == [3, 1]


def test_memory_reporter_sends_once_and_never_fails_the_cell():
    sent = []
    report = memory_reporter("cuda:1", sent.append, measure=lambda device: MemoryReport(5, 10))
    for rnd in (1, 2, 3):
        report(rnd, 3, {})
    assert sent == [MemoryReport(5, 10)]
    assert memory_reporter("cpu", sent.append) is None and memory_reporter("auto", sent.append) is None

    def broken(device):
        raise RuntimeError("no NVML here")

    memory_reporter("cuda", sent.append, measure=broken)(1, 3, {})  # nothing raised
    assert len(sent) == 1


# --------------------------------------------------------------------------- the pool, stand-in workers

# A stand-in pool worker (a module-level function, so a forkserver child can import it). The cell's
# ``rounds`` picks what it does; its ``out`` is a folder shared by the stand-ins of one test, where
# each marks its start and end, so a record can say how many ran at once.
REPORT_THEN_RECORD, REPORT_THEN_DIE, BARRIER = 1, 2, 3


def stand_in(cfg: RunConfig, threads: int, driver_pid: int, send) -> None:
    folder = Path(cfg.out)
    (folder / f"start-{cfg.seed}").touch()
    live = len(list(folder.glob("start-*"))) - len(list(folder.glob("end-*")))
    send.send(MemoryReport(GiB, 40 * GiB))  # peak 1 GiB of 40: auto lets the GPU take 8 cells
    if cfg.rounds == REPORT_THEN_DIE:
        os._exit(3)
    if cfg.rounds == BARRIER:  # wait for the others (at most 30 s): only a plan that grew lets them in
        deadline = time.monotonic() + 30
        while len(list(folder.glob("start-*"))) < int(cfg.method_params["n"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        time.sleep(0.2)
    live = max(live, len(list(folder.glob("start-*"))) - len(list(folder.glob("end-*"))))
    (folder / f"end-{cfg.seed}").touch()
    send.send({"status": "ok", "device": cfg.device, "seed": cfg.seed, "live": live,
               "started": len(list(folder.glob("start-*")))})
    send.close()


def _pool(tmp_path: Path, devices: list[str], mode: int, jobs: int, gpus: int, cells_per_gpu=None) -> dict:
    cells = [Cell(RunConfig(method="local", task="digits", seed=i, device=d, rounds=mode, out=str(tmp_path),
                            method_params={"n": len(devices)}))
             for i, d in enumerate(devices)]
    records = {}
    run_process_pool(cells, lambda cell, record: records.__setitem__(cell.cfg.seed, record), jobs,
                     cells_per_gpu=cells_per_gpu, gpus=gpus, worker=stand_in)
    assert sorted(records) == list(range(len(devices)))
    return records


@pytest.mark.slow  # worker processes
def test_pool_gives_each_cuda_cell_a_gpu_within_the_cap(tmp_path):
    records = _pool(tmp_path, ["cuda", "cuda:1", "cuda", "cpu", "cuda"], REPORT_THEN_RECORD, jobs=4, gpus=2,
                    cells_per_gpu=1)
    devices = {seed: r["device"] for seed, r in records.items()}
    assert devices[0] == "cuda:0" and devices[1] == "cuda:1"  # fewest running, then the pinned one keeps its GPU
    assert {devices[2], devices[4]} <= {"cuda:0", "cuda:1"} and devices[3] == "cpu"
    # one cell per GPU and the CPU cell: never more than 3 at once (the stand-ins count the live ones)
    assert max(r["live"] for r in records.values()) <= 3


@pytest.mark.slow  # worker processes
def test_auto_grows_past_one_cell_per_gpu_once_a_peak_is_reported(tmp_path):
    # 4 cells on 1 GPU: each waits until all 4 have started, which needs the plan to grow from 1
    records = _pool(tmp_path, ["cuda"] * 4, BARRIER, jobs=4, gpus=1)
    assert {r["started"] for r in records.values()} == {4}
    assert {r["device"] for r in records.values()} == {"cuda:0"}


@pytest.mark.slow  # worker processes
def test_a_worker_that_dies_after_its_report_fails_only_its_cell(tmp_path):
    records = _pool(tmp_path, ["cuda", "cuda"], REPORT_THEN_DIE, jobs=2, gpus=1, cells_per_gpu=2)
    for record in records.values():
        assert record["status"] == "failed"
        assert "WorkerDied: the worker process running this cell exited with code 3" in record["error"]
        assert record["config"]["device"] == "cuda"  # the cell's own config, as planned


# --------------------------------------------------------------------------- the CLI


def _suite(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "out": str(tmp_path / "o")}))
    return path


@pytest.mark.parametrize("args,message", [
    (["--cells-per-gpu", "0"], "--cells-per-gpu must be a positive integer or auto, got '0'"),
    (["--cells-per-gpu", "-1"], "--cells-per-gpu must be a positive integer or auto, got '-1'"),
    (["--cells-per-gpu", "x"], "--cells-per-gpu must be a positive integer or auto, got 'x'"),
    (["--executor", "ray", "--cells-per-gpu", "2"],
     "--cells-per-gpu is for --executor local or pool, not ray; on Ray, --gpus-per-cell"),
    (["--executor", "ray", "--cells-per-gpu", "auto"], "--cells-per-gpu is for --executor local or pool, not ray"),
    (["--executor", "pool", "--gpus-per-cell", "0.5"], "--gpus-per-cell is for --executor ray, not pool; in the pool, "
     "--cells-per-gpu"),
])
def test_bad_cells_per_gpu_exits_2_with_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["matrix", str(_suite(tmp_path)), *args], env={"COLUMNS": "200"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "o").exists()  # refused before anything is written


def test_throughput_counts_the_rounds_run_now():
    assert rounds_now({"federation": {"rounds_run": 30}}) == 30
    assert rounds_now({"federation": {"rounds_run": 30, "resumed_from_rounds": [10, 20]}}) == 10  # the last resume
    assert rounds_now({"status": "failed", "metrics": None}) == 0
    rows = [{"rounds_now": 30}, {"rounds_now": 10}, {"rounds_now": 0}]
    assert throughput(rows, 120.0) == {"wall_time_s": 120.0, "cell_rounds": 40, "cell_rounds_per_min": 20.0}
    assert throughput(rows, None) == {"wall_time_s": None, "cell_rounds": None, "cell_rounds_per_min": None}
    assert throughput([], 0.0)["cell_rounds_per_min"] == 0.0


def test_dry_run_json_has_null_throughput(tmp_path):
    result = CliRunner().invoke(app, ["matrix", str(_suite(tmp_path)), "--dry-run", "--json", "--cells-per-gpu", "2"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["wall_time_s"], summary["cell_rounds"], summary["cell_rounds_per_min"]) == (None, None, None)
    assert summary["cells"][0]["rounds_now"] == 0
