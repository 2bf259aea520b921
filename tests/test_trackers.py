"""Trackers that fail (issue 63, rows 3 and 12, and TensorBoard's round 0): a tracking server that is
down costs one request and one warning, and a matrix stops starting that tracker; W&B's run file
cut by refused writes is one warning; TensorBoard draws each curve in round order. Each through the
real CLI or API and the real tracker packages, offline."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest
import yaml
from typer.testing import CliRunner

import hfl_bench
from hfl_bench.cli import app
from hfl_bench.testing import QUICK

TINY = {"method": "local", "task": "digits", "rounds": 1, "clients": 3, **QUICK}
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", COLUMNS="400")


def _flags(settings: dict) -> list[str]:
    return [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def _closed_port() -> int:
    """A local port nothing listens on (bound, then closed): a tracking server that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DroppingServer:
    """A local server that accepts each connection and closes it unanswered (a server that is
    down behind its port), counting the connections: each is one request tried."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.uri = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _warnings(caplog, tracker: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"tracker {tracker}:")]


# ----------------------------------------------------------------------------- 3: a tracking server down


def test_a_tracking_server_that_is_down_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    result = CliRunner().invoke(app, ["run", *_flags(TINY), "--out", str(tmp_path), "-q", "--tracker", "mlflow"])
    assert result.exit_code == 0, result.output
    [record] = tmp_path.glob("*.json")
    assert json.loads(record.read_text())["status"] == "ok"
    # the probe's one request gave up, not MLflow's client after its retries ("Max retries exceeded")
    assert _warnings(caplog, "mlflow") == [f"tracker mlflow: start failed (ConnectionError: no tracking server "
                                           f"answers at {uri} (Connection refused; one request, 5 s at most)); "
                                           "the run goes on without it"]
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the tracker's bounds are not left behind


# in this process, and with worker processes whose rounds the driver logs (slow: processes)
@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_matrix_drops_a_tracker_that_failed_to_start(tmp_path, monkeypatch, caplog, jobs):
    pytest.importorskip("mlflow")
    server = DroppingServer()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    suite = tmp_path / "suite.yaml"
    settings = {k: v for k, v in TINY.items() if k not in ("method", "task")}
    suite.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "seeds": [0, 1, 2],
                                     "out": str(tmp_path / "runs"), "settings": {**settings, "device": "cpu"},
                                     "trackers": ["mlflow"]}))
    try:
        result = CliRunner().invoke(app, ["matrix", str(suite), "--jobs", str(jobs), "--json"])
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    assert [row["status"] for row in json.loads(result.stdout)["cells"]] == ["ok", "ok", "ok"]
    assert server.connections == 1  # the first cell's probe; no later cell tried (MLflow alone: 8 per call)
    [warning] = _warnings(caplog, "mlflow")
    assert warning.startswith(f"tracker mlflow: start failed (ConnectionError: no tracking server answers at "
                              f"{server.uri} (") and warning.endswith("; the matrix goes on without it")


def test_a_tracking_server_that_fails_after_the_probe_costs_three_requests():
    """After the probe, each of the tracker's requests runs under bounded retries: a server that
    stops answering mid-run costs 3 tries (MLflow's default: 8, over about 4 minutes)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hfl_bench.trackers import bounded_http

    server = DroppingServer()
    try:
        with bounded_http(), pytest.raises(Exception, match="get-by-name"):
            MlflowClient(tracking_uri=server.uri).get_experiment_by_name("hfl-bench")
    finally:
        server.close()
    assert server.connections == 3


# ----------------------------------------------------------------------------- 12: W&B's writes refused

CUT_WANDB = """
import resource, sys
import psutil
import hfl_bench

def refuse_writes(rnd, total, entry):
    # W&B writes its run file in a process of its own: from round 1 on, every write it makes past
    # one byte is refused (EFBIG), as a full disk refuses it (ENOSPC)
    if rnd == 1:
        for child in psutil.Process().children(recursive=True):
            if child.name().startswith("wandb-core"):
                resource.prlimit(child.pid, resource.RLIMIT_FSIZE, (1, 1))

settings = dict(method="local", task="digits", rounds=2, clients=3, local_epochs=1, batch_size=64, lr=0.01,
                heldout_fraction=0.2)
hfl_bench.run(out=sys.argv[1], trackers=["wandb"], progress=refuse_writes, **settings)
"""


@pytest.mark.slow  # a program, and W&B's own process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit on another process is Linux's")
def test_a_wandb_run_file_cut_by_refused_writes_is_one_warning(tmp_path):
    pytest.importorskip("wandb")
    out = tmp_path / "runs"
    env = dict(ENV, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
               WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"), WANDB_DATA_DIR=str(tmp_path / "wandb-data"))
    proc = subprocess.run([sys.executable, "-c", CUT_WANDB, str(out)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [record] = out.glob("*.json")
    assert json.loads(record.read_text())["status"] == "ok"
    [run_file] = (out / "trackers" / "wandb").glob("offline-run-*/run-*.wandb")
    warned = [line for line in proc.stderr.splitlines() if "tracker wandb:" in line]
    assert len(warned) == 1, proc.stderr[-3000:]
    assert (f"tracker wandb: logging the record failed (OSError: W&B's run file {run_file} is cut after "
            f"{run_file.stat().st_size} bytes") in warned[0]
    assert warned[0].endswith("were its writes refused (a full disk)?); the run goes on without it")


# ----------------------------------------------------------------------------- TensorBoard: round 0 last


def test_tensorboard_draws_each_curve_in_round_order(tmp_path):
    """Round 0 (the initial models) reaches the trackers with the record, after the last round:
    TensorBoard draws a run's points in the order written, so it goes to the run ``<stem>/late``,
    at step 0, and no curve of the run itself steps back."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    hfl_bench.run(**{**TINY, "method": "fml", "rounds": 3}, out=str(tmp_path), trackers=["tensorboard"])
    [path] = tmp_path.glob("*.json")
    history = json.loads(path.read_text())["history"]
    folder = tmp_path / "trackers" / "tensorboard" / path.stem
    own, late = EventAccumulator(str(folder), size_guidance={"scalars": 0}), EventAccumulator(str(folder / "late"))
    own.Reload()
    for tag in own.Tags()["scalars"]:
        steps = [e.step for e in own.Scalars(tag)]  # in the order written, as TensorBoard draws them
        assert steps == sorted(set(steps)), (tag, steps)
    late.Reload()
    curve = {e["round"]: e["global_acc"] for e in history if e.get("global_acc") is not None}
    drawn = {e.step: e.value for e in own.Scalars("global_acc")}
    assert 0 not in drawn and {e.step: e.value for e in late.Scalars("global_acc")} == \
        pytest.approx({0: curve[0]}, rel=1e-6)
    assert {**drawn, 0: curve[0]} == pytest.approx(curve, rel=1e-6)
