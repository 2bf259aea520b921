"""Writers that cannot lose each other's work (issue 28): a record path is claimed before training,
so a second concurrent run of the same identity (the same config, on the same or on other data)
is refused in one line and never writes over the first; a killed holder leaves no claim that
blocks; a finished record of other data that appears during a run is kept at the write;
``leaderboard html`` never clears its own inputs; a killed matrix worker costs its own cell only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from hfl_bench import engine, locks, paths
from hfl_bench import recording as records
from hfl_bench.config import RunConfig

from helpers import REAL_RECORD, invoke_cli

REAL = REAL_RECORD
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
RUN = ["run", "--method", "local", "--clients", "2", "--rounds", "1", "-q", "--json"]


def _target(out: Path) -> Path:
    cfg = engine.load_task(RunConfig(method="local", clients=2, rounds=1, out=str(out)))[1]
    return paths.record_path(cfg)


def _hold(path: Path) -> subprocess.Popen:
    """Another process that claims ``path`` and keeps it until it is killed."""
    code = ("import sys, time; from pathlib import Path; from hfl_bench import locks; "
            "c = locks.take(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.slow  # processes
def test_a_second_run_of_the_same_identity_is_refused_while_the_first_runs(tmp_path):
    target = _target(tmp_path)
    holder = _hold(target)
    try:
        result, _, _ = invoke_cli(*RUN, "--out", str(tmp_path))
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert "being written by another run of this configuration" in text and f"pid {holder.pid}" in text
        assert "Traceback" not in result.output and not target.exists()
    finally:
        holder.kill()
        holder.wait()
    # killed (as SIGKILL or the OOM killer would): the kernel dropped its lock, nothing blocks
    result, stdout, _ = invoke_cli(*RUN, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert json.loads(stdout)["record"] == str(target) and target.is_file()
    assert not locks.claim_file(target).exists()  # released after the write


def test_a_claim_is_exclusive_and_released():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "x.json"
        with locks.take(record):
            with pytest.raises(locks.ClaimError, match="being written by another run"):
                locks.take(record)
        locks.take(record).release()  # free again


def test_a_finished_record_of_other_data_that_appears_during_a_run_is_kept(tmp_path):
    result, stdout, _ = invoke_cli(*RUN, "--out", str(tmp_path))
    target = Path(json.loads(stdout)["record"])
    mine = json.loads(target.read_text())
    other = dict(mine, task=dict(mine["task"], data_fingerprint="f" * 16))  # the same config on other data
    target.write_text(json.dumps(other))
    cfg = engine.load_task(RunConfig(method="local", clients=2, rounds=1, out=str(tmp_path)))[1]
    saved = records.save_record(mine, tmp_path, divert=records.write_conflict(cfg))  # what run does at the write
    assert json.loads(target.read_text())["task"]["data_fingerprint"] == "f" * 16  # not overwritten
    assert saved.path is not None and saved.path != target and saved.fallback
    assert "holds a record of other data" in saved.problem and json.loads(saved.path.read_text()) == saved.record


def test_html_refuses_an_output_folder_that_holds_its_inputs(tmp_path):
    site = tmp_path / "site"
    (site / "records").mkdir(parents=True)
    record = site / "records" / REAL.name
    record.write_bytes(REAL.read_bytes())
    for inputs in ([site / "records"], [site]):
        result, _, _ = invoke_cli("leaderboard", "html", str(site), *map(str, inputs))
        assert result.exit_code == 2 and "inside the output folder" in " ".join(result.output.split())
        assert "Traceback" not in result.output
        assert record.read_bytes() == REAL.read_bytes() and not (site / "index.html").exists()


def test_html_regenerated_under_its_input_folder_reads_no_copies_of_its_own(tmp_path):
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / REAL.name).write_bytes(REAL.read_bytes())
    for _ in range(2):  # the second time, tmp_path/site/records/ holds the first site's copies
        result, stdout, _ = invoke_cli("leaderboard", "html", str(tmp_path / "site"), str(tmp_path))
        assert result.exit_code == 0, result.output
        assert "from 1 records" in stdout


@pytest.mark.slow  # the CLI and its worker processes
def test_a_killed_matrix_worker_costs_only_its_own_cell(tmp_path):
    out = tmp_path / "records"
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({
        "methods": ["local"], "tasks": ["digits"], "seeds": [0, 1, 2], "out": str(out),
        "settings": {"rounds": 12, "clients": 2, "checkpoint_every": 1}}))
    proc = subprocess.Popen([sys.executable, "-m", "hfl_bench.cli", "matrix", "suite.yaml", "--jobs", "2", "--json",
                             "-q"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list((out / ".checkpoints").glob("*.pt")):  # a cell is mid-run
            assert proc.poll() is None and time.monotonic() < deadline, "no cell started"
            time.sleep(0.2)
        # the cell workers are the fork server's children (the fork server is the driver's)
        server = [c for c in psutil.Process(proc.pid).children() if "forkserver" in " ".join(c.cmdline())]
        workers = [w for s in server for w in s.children()]
        assert workers, "no cell worker found"
        victim = workers[0]
        victim.kill()  # as the out-of-memory killer would
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = json.loads(stdout)["cells"]
    statuses = sorted(r["status"] for r in rows)
    assert statuses == ["failed", "ok", "ok"], (statuses, stderr[-2000:])
    failed = next(r for r in rows if r["status"] == "failed")
    assert "killed by SIGKILL" in failed["error"]
    assert proc.returncode == 1


@pytest.mark.slow  # processes
def test_a_matrix_cell_another_process_is_writing_is_failed_not_run(tmp_path):
    out = tmp_path / "records"
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "seeds": [0], "out": str(out),
                                     "settings": {"rounds": 1, "clients": 2}}))
    holder = _hold(_target(out))
    try:
        result, stdout, _ = invoke_cli("matrix", str(suite), "--json", "-q")
    finally:
        holder.kill()
        holder.wait()
    [row] = json.loads(stdout)["cells"]
    assert result.exit_code == 1 and row["status"] == "failed"
    assert "being written by another run" in row["error"] and not list(out.glob("*.json"))


@pytest.mark.parametrize("kind", ["folder", "fifo", "file-for-claims-folder"])
def test_a_claim_path_of_the_wrong_kind_is_one_line_exit_2(tmp_path, kind):
    """A folder (or a FIFO) at the lock path, or a file where the .claims folder goes: one line naming
    the path, exit 2, nothing trained or written (issue 47, row 12)."""
    out = tmp_path / "runs"
    lock = locks.claim_file(_target(out))
    if kind == "folder":
        lock.mkdir(parents=True)
    elif kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs on this platform")
        lock.parent.mkdir(parents=True)
        os.mkfifo(lock)
    else:
        out.mkdir()
        lock.parent.write_text("")
    result, stdout, stderr = invoke_cli(*RUN, "--out", str(out))
    output = result.output + stderr
    assert result.exit_code == 2, output
    assert "Traceback" not in output and "cannot claim the record" in " ".join(output.split())
    assert str(lock if kind != "file-for-claims-folder" else lock.parent) in "".join(output.split())
    assert not list(out.glob("*.json"))
