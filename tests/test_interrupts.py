"""Ctrl-C and a killed driver, in real subprocesses: ``run`` and ``matrix`` end with one line that
names the exact command that continues (exit 130, no traceback), and that command does continue;
the worker processes of ``matrix --jobs 2`` end with their driver, Ctrl-C or SIGKILL alike."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = pytest.mark.slow  # signals real CLI processes and their matrix workers (and Ray)

CLI = [sys.executable, "-m", "hfl_bench.cli"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", COLUMNS="400")
FOREVER = 100_000  # rounds: a cell that is still running whenever the test interrupts it


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"exited with {proc.returncode} while waiting for {what}:\n{err[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def _terminal_signals() -> None:
    # A foreground command in a terminal never starts with SIGINT ignored; a test run launched
    # in the background of a non-interactive shell does (POSIX shells ignore SIGINT in
    # asynchronous commands) and Python keeps an inherited SIG_IGN, so the CLI is started as a
    # terminal would start it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    # A session of its own: its process group is the driver and whatever it starts, as in a
    # terminal, where Ctrl-C signals the whole foreground group.
    return subprocess.Popen([*CLI, *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_terminal_signals)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _cleanup(proc: subprocess.Popen, pids: list[int]) -> None:
    """Whatever the test left running, ended (by pid: only processes this test started)."""
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.communicate()


def _continue_command(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("interrupted (") and "Traceback" not in stderr, stderr
    return lines[0].split("; continue with: ", 1)[1]


def test_ctrl_c_in_run_prints_the_command_that_resumes_it(tmp_path):
    out = tmp_path / "runs"
    args = ["run", "--method", "local", "--task", "digits", "--clients", "4", "--rounds", "20", "--local-epochs", "1",
            "--checkpoint-every", "1", "--out", str(out), "--json"]
    proc = _start(args, tmp_path)
    try:
        _wait_for(lambda: list((out / ".checkpoints").glob("*.pt")), 180, "the first round's checkpoint", proc)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal does
        _, stderr = proc.communicate(timeout=60)
    finally:
        _cleanup(proc, [])
    assert proc.returncode == 130, stderr
    command = _continue_command(stderr)
    assert "after round" in stderr and "continues from its last checkpoint" in stderr
    assert shlex.split(command)[-len(args) - 1:] == [*args, "--resume"]
    assert not list(out.glob("*.json"))
    # The printed command is the exact one that continues: run it as printed.
    done = subprocess.run(command, shell=True, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(Path(json.loads(done.stdout)["record"]).read_text())
    assert record["status"] == "ok" and record["federation"]["resumed_from_rounds"]


def _pool_matrix(tmp_path: Path) -> tuple[subprocess.Popen, list[str], Path, list[int]]:
    """``matrix --jobs 2`` over two never-ending cells, once both workers run theirs; returns the
    driver, its arguments, the output folder and the pids of everything it started."""
    out = tmp_path / "records"
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({
        "methods": ["local"], "tasks": ["digits"], "seeds": [0, 1], "out": str(out),
        "settings": {"rounds": FOREVER, "clients": 4, "checkpoint_every": 1}}))
    args = ["matrix", "suite.yaml", "--jobs", "2", "-q"]
    proc = _start(args, tmp_path)
    try:
        _wait_for(lambda: len(list((out / ".checkpoints").glob("*.pt"))) >= 2, 240, "both cells' checkpoints", proc)
        pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    except BaseException:
        _cleanup(proc, [])
        raise
    assert len(pids) >= 3  # the fork server and two workers (and multiprocessing's resource tracker)
    return proc, args, out, pids


def test_ctrl_c_in_a_pool_matrix_stops_every_worker(tmp_path):
    proc, args, out, pids = _pool_matrix(tmp_path)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        _wait_for(lambda: not _alive(pids), 15, "the workers to end")
    finally:
        _cleanup(proc, pids)
    assert proc.returncode == 130, stderr
    command = _continue_command(stderr)
    assert "0 of 2 cells done" in stderr
    assert shlex.split(command)[-len(args):] == args  # the same command: it skips finished cells
    assert len(list((out / ".checkpoints").glob("*.pt"))) == 2  # kept for the rerun


def test_killing_a_pool_matrix_driver_ends_its_workers(tmp_path):
    proc, _, _, pids = _pool_matrix(tmp_path)
    try:
        workers = _alive(pids)
        assert len(workers) >= 3
        os.kill(proc.pid, signal.SIGKILL)  # no handler, no cleanup: only the workers can notice
        proc.wait(timeout=30)  # reaped (not communicate: live workers would hold its pipes open)
        t0 = time.monotonic()
        _wait_for(lambda: not _alive(pids), 10, f"the driver's processes {_alive(pids)} to end")
        assert time.monotonic() - t0 < 10
    finally:
        _cleanup(proc, pids)


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_sigterm_ends_a_matrix_as_the_os_would_and_the_rerun_resumes(tmp_path, executor):
    """SIGTERM to the driver of ``matrix --jobs 1`` (a preemption): a local one dies of the signal
    (no handler: exit -15, nothing printed), and a Ray one ends the same way, not with Ray's crash
    dump and exit 134 or 1; the finished cell's record is intact, the running cell's checkpoint
    stays, and the same command skips the first and resumes the second."""
    if executor == "ray":
        pytest.importorskip("ray")
    out = tmp_path / "records"
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump({
        "methods": ["local"], "tasks": ["digits"], "seeds": [0, 1], "out": str(out),
        "settings": {"rounds": 6, "clients": 3, "checkpoint_every": 1}}))
    args = ["matrix", "suite.yaml", "--executor", executor, "--jobs", "1", "--json"]
    env = dict(ENV, RAY_worker_niceness="0")  # see test_matrix's ray_cluster: beside busy cores
    proc = subprocess.Popen([*CLI, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        # seed 0 written and seed 1 past its first round: 5 more rounds to go when SIGTERM comes
        _wait_for(lambda: list(out.glob("*seed0.json")) and list((out / ".checkpoints").glob("*seed1.pt")), 180,
                  "the first record and the second cell's checkpoint", proc)
        first = list(out.glob("*seed0.json"))[0].read_text()
        os.kill(proc.pid, signal.SIGTERM)  # the driver alone, as a scheduler's kill does
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr and not stdout, stderr[-3000:]
    assert len(list(out.glob("*.json"))) == 1 and list(out.glob("*seed0.json"))[0].read_text() == first
    assert json.loads(first)["status"] == "ok"
    assert len(list((out / ".checkpoints").glob("*seed1.pt"))) == 1  # kept for the rerun
    done = subprocess.run([*CLI, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = {row["seed"]: row for row in json.loads(done.stdout)["cells"]}
    assert cells[0]["status"] == "skipped" and cells[1]["status"] == "ok"
    resumed = json.loads(Path(cells[1]["record"]).read_text())
    assert resumed["federation"]["resumed_from_rounds"]
