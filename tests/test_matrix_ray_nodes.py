"""`hfl-bench matrix --executor ray` on a cluster of two nodes (both on this machine, loopback
only): one node is removed while a cell runs on it, and the matrix loses nothing: that cell is sent
again, continues from its checkpoint on the other node, and every record equals the record of the
same cell run by `--executor local` (issue 67, "Beyond one machine")."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from test_resume import assert_same_run

from hfl_bench.config import RunConfig
from hfl_bench.matrix.executors import NODE_RETRIES, RayOptions, _ray_cells, _RayRounds
from hfl_bench.matrix.suite import Cell
from hfl_bench.testing import QUICK

ROUNDS = 5
LOST = "lost its Ray node"  # the driver's line for a cell sent again


@pytest.fixture
def two_nodes():
    """A head node (it also runs cells) and one worker node, 1 CPU each, every socket on loopback;
    yields the cluster and the worker node, shut down after."""
    # Read when ray is imported: with the node IP below, every Ray socket listens on 127.0.0.1.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_worker_niceness"] = "0"  # see test_matrix's ray_cluster: beside busy cores
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    loopback = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={**loopback, "include_dashboard": False})
    try:
        worker = cluster.add_node(**loopback)
        cluster.wait_for_nodes()
        yield cluster, worker
    finally:
        cluster.shutdown()


def _raylet(node) -> psutil.Process:
    from ray._private import ray_constants

    return psutil.Process(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)


def _cells_on(node) -> int:
    """The cells running on a node now: its Ray workers executing ``_ray_task`` (Ray titles a
    worker process after the task it runs)."""
    count = 0
    for child in _raylet(node).children(recursive=True):
        try:
            count += "ray::_ray_task" in " ".join(child.cmdline())
        except psutil.Error:  # ended meanwhile
            pass
    return count


def _not_loopback(node) -> set[str]:
    """The addresses a node's processes listen on that are not loopback (``::ffff:127.0.0.1`` is)."""
    procs = [psutil.Process(info.process.pid) for infos in node.all_processes.values() for info in infos]
    addresses = set()
    for proc in procs + [c for p in procs for c in p.children(recursive=True)]:
        try:
            addresses |= {c.laddr.ip for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    mapped = {a: ipaddress.ip_address(a) for a in addresses}
    return {a for a, ip in mapped.items() if not (getattr(ip, "ipv4_mapped", None) or ip).is_loopback}


@pytest.mark.slow  # a Ray cluster and two driver processes
@pytest.mark.ray
def test_a_node_lost_mid_run_loses_no_cell_and_changes_no_record(tmp_path, two_nodes):
    cluster, worker = two_nodes
    assert cluster.address.startswith("127.0.0.1:")
    assert not _not_loopback(cluster.head_node) | _not_loopback(worker)
    settings = {**QUICK, "rounds": ROUNDS, "clients": 4, "device": "cpu", "checkpoint_every": 1}
    suite = tmp_path / "two-nodes.yaml"
    suite.write_text(yaml.safe_dump({"methods": ["local", "uniform-kd"], "tasks": ["digits"], "seeds": [0, 1],
                                     "out": str(tmp_path / "unused"), "settings": settings}))
    ray_out, local_out = tmp_path / "ray", tmp_path / "local"
    checkpoints = ray_out / ".checkpoints"
    cli = [sys.executable, "-m", "hfl_bench.cli", "matrix", str(suite), "--json"]
    # The fixture's Ray variables included: without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 the driver's
    # Ray replaces 127.0.0.1 in --address by this machine's IP, where a loopback cluster is not.
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")

    # A separate driver process connects to the cluster by its address (it attaches to the head).
    proc = subprocess.Popen([*cli, "--executor", "ray", "--address", cluster.address, "--out", str(ray_out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        # Remove the worker node once a cell runs there and every running cell has checkpointed a
        # round (one cell per node: 1 CPU each, 1 per cell), so the lost cell has rounds to resume.
        deadline, lost = time.monotonic() + 300, 0
        while not lost and proc.poll() is None and time.monotonic() < deadline:
            on_worker = _cells_on(worker)
            running = on_worker + _cells_on(cluster.head_node)
            if on_worker and len(list(checkpoints.glob("*.pt"))) >= running:
                lost = on_worker
                cluster.remove_node(worker)
            time.sleep(0.1)
        try:
            stdout, stderr = proc.communicate(timeout=300)  # a guard: about 40 s
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            pytest.fail(f"the Ray matrix did not end within the guard:\n{stderr[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lost == 1, f"no cell was running on the worker node before the matrix ended:\n{stderr[-3000:]}"
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout)
    assert summary["counts"] == {"ok": 4}

    # The lost cell was sent again once and continued from its checkpoint on the head node.
    resent = [line for line in stderr.splitlines() if LOST in line]
    assert len(resent) == 1, stderr[-3000:]
    [row] = [r for r in summary["cells"] if f"cell {r['method']} on digits, seed {r['seed']} {LOST}" in resent[0]]
    record = json.loads(Path(row["record"]).read_text())
    [resumed] = record["federation"]["resumed_from_rounds"]
    assert 1 <= resumed < ROUNDS and row["rounds_now"] == ROUNDS - resumed
    assert not list(checkpoints.glob("*.pt"))  # each cell removed its own

    # The same matrix in one process: every cell's record, the one of each, equal but for timing.
    local = subprocess.run([*cli, "--executor", "local", "--out", str(local_out)], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=300)  # a guard: about 20 s
    assert local.returncode == 0, local.stderr[-3000:]
    names = sorted(p.name for p in local_out.glob("*.json"))
    assert len(names) == 4 and sorted(p.name for p in ray_out.glob("*.json")) == names
    assert sorted(Path(r["record"]).name for r in summary["cells"]) == names  # none lost, none twice
    for name in names:
        assert_same_run(json.loads((ray_out / name).read_text()), json.loads((local_out / name).read_text()))


# --------------------------------------------------------------------------- the driver's policy, by hand


class FakeRay:
    """The few Ray calls ``_ray_cells`` makes, scripted: each ``get`` gives the next outcome (a
    record, or the error it raises), in the order the cells were sent; ``alive`` the nodes."""

    def __init__(self, outcomes: list, alive: set[str]):
        import ray.exceptions

        self.exceptions = ray.exceptions
        self.outcomes, self.alive, self.sent = list(outcomes), set(alive), []
        self.resources = {"CPU": 2}

    def remote(self, fn):
        fake = self

        class Task:
            def options(self, **kwargs):
                assert kwargs["max_retries"] == 0  # the driver decides, not Ray
                return self

            def remote(self, job, threads, plugins, queue, key):
                ref = object()
                fake.sent.append(key)
                return ref

        return Task()

    def cluster_resources(self):
        return dict(self.resources)

    def nodes(self):
        return [{"NodeID": n, "Alive": True} for n in sorted(self.alive)]

    def wait(self, refs, num_returns, timeout):
        return refs[:1], refs[1:]

    def get(self, ref):
        outcome = self.outcomes.pop(0)
        if callable(outcome):
            outcome = outcome(self)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _drive(fake: FakeRay, n: int = 2) -> tuple[list[Cell], dict[int, dict]]:
    cells = [Cell(RunConfig(method="local", task="digits", seed=seed)) for seed in range(n)]
    written: dict[int, dict] = {}

    def done(cell, record):
        assert cell.cfg.seed not in written  # once per cell
        written[cell.cfg.seed] = record

    _ray_cells(fake, cells, done, RayOptions(), None, _RayRounds(None, cells, None))
    return cells, written


def test_a_cell_whose_node_died_is_sent_again_and_written_once(caplog):
    errors = pytest.importorskip("ray.exceptions")
    fake = FakeRay([{"status": "ok", "n": 0}, errors.NodeDiedError("node b died"), {"status": "ok", "n": 1}],
                   alive={"a"})
    _, written = _drive(fake)
    assert fake.sent == [0, 1, 1] and written == {0: {"status": "ok", "n": 0}, 1: {"status": "ok", "n": 1}}
    assert "cell local on digits, seed 1 lost its Ray node (NodeDiedError); sent again (1 of 3)" in caplog.text


def test_a_record_lost_with_its_node_is_computed_again():
    errors = pytest.importorskip("ray.exceptions")
    fake = FakeRay([errors.ObjectLostError("ab" * 14, None, ""), {"status": "ok"}], alive={"a"})
    assert _drive(fake, 1)[1] == {0: {"status": "ok"}} and fake.sent == [0, 0]


def test_a_crashed_worker_is_the_cells_failure_unless_a_node_is_gone():
    errors = pytest.importorskip("ray.exceptions")
    fake = FakeRay([errors.WorkerCrashedError()], alive={"a", "b"})  # every node still there: OOM, a crash
    [record] = _drive(fake, 1)[1].values()
    assert record["status"] == "failed" and record["error"].startswith("WorkerCrashedError") and fake.sent == [0]

    def node_b_gone(fake):  # Ray reported the worker before the node: node b died meanwhile
        fake.alive.discard("b")
        return errors.WorkerCrashedError()

    fake = FakeRay([node_b_gone, {"status": "ok"}], alive={"a", "b"})
    assert _drive(fake, 1)[1] == {0: {"status": "ok"}} and fake.sent == [0, 0]


def test_a_cell_that_keeps_losing_its_node_fails_after_the_retries():
    errors = pytest.importorskip("ray.exceptions")
    fake = FakeRay([errors.NodeDiedError(f"node {i} died") for i in range(NODE_RETRIES + 1)], alive={"a"})
    [record] = _drive(fake, 1)[1].values()
    assert fake.sent == [0] * (NODE_RETRIES + 1)
    assert record["status"] == "failed" and record["error"].startswith(f"NodeDiedError: node {NODE_RETRIES} died")


def test_a_cell_the_cluster_can_no_longer_take_fails_instead_of_waiting():
    errors = pytest.importorskip("ray.exceptions")

    def last_cpu_node_gone(fake):
        fake.alive.discard("b")
        fake.resources = {"CPU": 0}
        return errors.NodeDiedError("node b died")

    fake = FakeRay([last_cpu_node_gone], alive={"a", "b"})
    [record] = _drive(fake, 1)[1].values()
    assert fake.sent == [0] and record["status"] == "failed"
    assert record["error"] == ("ConfigError: the cell asks Ray for 1 CPU(s) but the cluster has 0: lower "
                               "--cpus-per-cell (since the node it ran on was lost)")


class FakeQueue:
    def __init__(self, entries):
        self.entries = list(entries)

    def qsize(self):
        return len(self.entries)

    def get_nowait_batch(self, n):
        taken, self.entries = self.entries[:n], self.entries[n:]
        return taken


def test_rounds_a_resent_cell_reports_again_are_passed_on_once():
    cells = [Cell(RunConfig(method="local", task="digits", seed=seed)) for seed in range(2)]
    seen = []
    # cell 0 reached round 3, lost its node, and continues from its round-2 checkpoint
    queue = FakeQueue([(0, {"round": 0}), (0, {"round": 1}), (1, {"round": 0}), (0, {"round": 2}),
                       (0, {"round": 3}), (0, {"round": 3}), (1, {"round": 1}), (0, {"round": 4}), (0, {"note": 1})])
    _RayRounds(queue, cells, lambda cell, entry: seen.append((cell.cfg.seed, entry))).drain()
    assert seen == [(0, {"round": 0}), (0, {"round": 1}), (1, {"round": 0}), (0, {"round": 2}), (0, {"round": 3}),
                    (1, {"round": 1}), (0, {"round": 4}), (0, {"note": 1})]
