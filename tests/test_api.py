"""The Python API and the one run path: ``hfl_bench.run`` writes the record ``hfl-bench run`` writes,
and every way of running a config (the command line, a local matrix cell, a Ray cell) takes the
claim and the same-data check of ``runpath.begin``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import hfl_bench
from hfl_bench import locks
from hfl_bench.cli import app
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.matrix.suite import load_suite
from hfl_bench.resolved import resolve_run
from hfl_bench.testing import QUICK

ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", COLUMNS="400")
TINY = {"method": "local", "task": "digits", "rounds": 1, "clients": 3, **QUICK}
TIMINGS = ("seconds", "phases")  # per round: what differs between two runs of one config


def _flags(settings: dict) -> list[str]:
    return [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def _without_timings(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in TIMINGS} for e in history]


@pytest.mark.slow  # two processes
def test_python_run_writes_the_record_the_command_line_writes(tmp_path):
    # Both as programs, each with one torch thread (thread counts change CPU numerics).
    api_out, cli_out = tmp_path / "api", tmp_path / "cli"
    script = ("import json, sys, hfl_bench\n"
              f"r = hfl_bench.run(method='crad', task='digits', rounds=2, out={str(api_out)!r})\n"
              "print(json.dumps({'path': str(r.path), 'headline': r.headline, 'selected': r.selected.global_acc,"
              " 'clients': [c.global_acc for c in r.per_client], 'rounds': len(r.history)}))\n")
    api = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                         timeout=600)
    assert api.returncode == 0, api.stderr[-3000:]
    cli = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "run", "--method", "crad", "--task", "digits",
                          "--rounds", "2", "--out", str(cli_out), "-q"],
                         capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    shown = json.loads(api.stdout)
    [api_file], [cli_file] = list(api_out.glob("*.json")), list(cli_out.glob("*.json"))
    assert api_file.name == cli_file.name and Path(shown["path"]) == api_file  # same name: same config hash
    a, c = json.loads(api_file.read_text()), json.loads(cli_file.read_text())
    assert a["config_hash"] == c["config_hash"] and a["config"] | {"out": None} == c["config"] | {"out": None}
    assert a["metrics"] == c["metrics"] and a["selection"] == c["selection"]
    assert _without_timings(a["history"]) == _without_timings(c["history"])
    assert a["environment"]["torch_threads"] == c["environment"]["torch_threads"] == 1
    # the typed view reads the record it wrote
    assert shown["headline"] == a["metrics"]["headline"]["value"] and shown["rounds"] == 3
    assert shown["selected"] == a["metrics"]["global_acc"]
    assert shown["clients"] == [x["global_acc"] for x in a["metrics"]["per_client"]]


def test_python_run_raises_the_command_lines_one_line_errors(tmp_path):
    cases = [({"rounds": 0}, [], "--rounds must be >= 1, got 0"),
             ({"method_params": {"lamb": 1}}, ["--set", "lamb=1"],
              "unknown hyperparameter(s) for method 'local': lamb"),
             ({"task": "no-such-task"}, [], "unknown task 'no-such-task'"),
             ({"roundz": 2}, None, "unknown setting(s): roundz. Known: method, preset")]
    for bad, flags, message in cases:
        with pytest.raises(ConfigError if "task" not in bad else hfl_bench.RegistryError) as e:
            hfl_bench.run(**{**TINY, "out": str(tmp_path), **bad})
        assert message in str(e.value) and "\n" not in str(e.value)
        if flags is not None:  # the command line says the same, exit code 2
            given = {k: v for k, v in bad.items() if k != "method_params"}
            result = CliRunner().invoke(app, ["run", *_flags({**TINY, "out": tmp_path, **given}), *flags])
            assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert not list(tmp_path.glob("*.json"))  # refused before any run


def _record_path(settings: dict, out: Path) -> Path:
    return resolve_run(RunConfig(**{**settings, "out": str(out)})).record_path


def _suite(tmp_path: Path, out: Path, **extra) -> Path:
    settings = {k: v for k, v in TINY.items() if k not in ("method", "task")}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "seeds": [0], "out": str(out),
                                    "settings": {**settings, "device": "cpu"}, **extra}))
    return path


def _matrix(suite: Path, executor: str) -> dict:
    """``hfl-bench matrix SUITE --executor EXECUTOR``'s one cell."""
    result = CliRunner().invoke(app, ["matrix", str(suite), "--executor", executor, "--json"])
    assert result.exit_code in (0, 1), result.output
    [row] = json.loads(result.stdout)["cells"]
    return row


PATHS = ["cli", "local-cell", pytest.param("ray-cell", marks=[pytest.mark.ray, pytest.mark.slow])]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished record of TINY, run once for the module."""
    out = tmp_path_factory.mktemp("finished")
    result = CliRunner().invoke(app, ["run", *_flags(TINY), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    return _record_path(TINY, out)


def _run_by(path: str, tmp_path: Path, out: Path) -> tuple[int, str]:
    """Run TINY into ``out`` by ``path``: the exit code and the one line that says why it stopped."""
    if path == "cli":
        result = CliRunner().invoke(app, ["run", *_flags(TINY), "--out", str(out), "-q"])
        return result.exit_code, result.output
    if path == "ray-cell":
        pytest.importorskip("ray")
    row = _matrix(_suite(tmp_path, out), "ray" if path == "ray-cell" else "local")
    return (0 if row["status"] == "ok" else 1), row["error"] or ""


@pytest.mark.parametrize("path", PATHS)
def test_each_path_refuses_a_record_another_run_is_writing(tmp_path, path):
    out = tmp_path / "runs"
    out.mkdir()
    with locks.take(_record_path(TINY, out)):  # another run of this config holds it
        code, said = _run_by(path, tmp_path, out)
    assert code != 0 and "is being written by another run of this configuration" in said
    assert not list(out.glob("*.json"))  # neither run nor written


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("conflict", ["other data", "other version"])
def test_each_path_keeps_a_record_of_other_data_or_another_version(tmp_path, path, conflict, finished):
    out = tmp_path / "runs"
    out.mkdir()
    record = json.loads(finished.read_text())
    if conflict == "other data":
        record["task"]["data_fingerprint"] = "0" * 16
    else:
        record["method"]["version"] = "0.9"
    target = out / finished.name
    target.write_text(json.dumps(record))
    before = target.read_bytes()
    code, said = _run_by(path, tmp_path, out)
    assert code != 0
    assert ("holds a record of other data" if conflict == "other data" else "but this code's local is") in said
    assert target.read_bytes() == before and len(list(out.glob("*.json"))) == 1


def test_load_records_group_and_compare(tmp_path):
    out = tmp_path / "runs"
    tracked = ["tensorboard"] if _installed("tensorboard") else []
    for method in ("local", "fml"):
        for seed in (0, 1):
            r = hfl_bench.run(**{**TINY, "method": method, "seed": seed, "out": str(out)}, threads=1, trackers=tracked)
            assert r.path.is_file() and r.path == _record_path({**TINY, "method": method, "seed": seed}, out)
            if tracked:  # hfl_bench.run takes the trackers the command line takes
                assert list((out / "trackers" / "tensorboard" / r.path.stem).glob("events.out.tfevents.*"))
    (out / "notes.json").write_text("[]")
    records = hfl_bench.load_records(out)  # the trackers' copies of the records (trackers/) are not read
    assert sorted((r.method, r.seed) for r in records) == [("fml", 0), ("fml", 1), ("local", 0), ("local", 1)]
    assert len(records.skipped) == 1 and "notes.json" in records.skipped[0]
    assert all(r.status == "ok" and isinstance(r.headline, float) for r in records)
    groups = hfl_bench.group(records)
    assert sorted(g.method for g in groups) == ["fml", "local"] and all(len(g.ok) == 2 for g in groups)
    [table] = hfl_bench.compare(records, against="local")
    [comparison] = table.comparisons
    assert comparison.a.group.method == "fml" and comparison.n == 2
    by_seed = {(r.method, r.seed): r.headline for r in records}
    expected = sum(by_seed["fml", s] - by_seed["local", s] for s in (0, 1)) / 2
    assert comparison.mean == pytest.approx(expected, abs=1e-4)  # rounded to 4 places
    # what is there and what to run, not just a missing name (issue 63: the README's first compare)
    with pytest.raises(ValueError, match=r"no records of fedavg to compare against \(the records hold: fml, "
                                         r"local\); run fedavg on the same task and seeds first"):
        hfl_bench.compare(records, against="fedavg")
    pd = pytest.importorskip("pandas")
    frame = records.to_frame()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 4 and set(frame["method"]) == {"local", "fml"}
    history = records[0].to_frame()
    assert list(history["round"]) == [0, 1]
    assert list(hfl_bench.comparison_frame([table])["mean_difference"]) == [pytest.approx(expected, abs=1e-4)]


# --------------------------------------------------------------------------- trackers

TRACKED = {**TINY, "method": "fml", "rounds": 3}


def _wandb_records(path: Path):
    """The records of a W&B offline run file (``run-*.wandb``): W&B's own protobuf ``Record``s, in
    the LevelDB log framing the file uses (a 7-byte W&B header, then 32 KiB blocks of chunks with a
    7-byte header each: checksum, length, type full / first / middle / last)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's trailer
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> tuple[Path, dict]:
    """One run of TRACKED logged to every tracker whose package is installed, as a program (W&B
    offline, its settings in the run's folder)."""
    installed = [name for name, module in (("tensorboard", "tensorboard"), ("mlflow", "mlflow"), ("wandb", "wandb"))
                 if _installed(module)]
    if not installed:
        pytest.skip("no tracker package installed")
    root = tmp_path_factory.mktemp("tracked")
    out = root / "runs"
    env = dict(ENV, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONFIG_DIR=str(root / "wandb-config"),
               WANDB_CACHE_DIR=str(root / "wandb-cache"), WANDB_DATA_DIR=str(root / "wandb-data"))
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "run", *_flags(TRACKED), "--out", str(out), "-q",
                           *[x for name in installed for x in ("--tracker", name)]],
                          capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tracker" not in proc.stderr, proc.stderr  # no tracker warned
    [path] = out.glob("*.json")
    return path, json.loads(path.read_text())


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _curve(record: dict, key: str = "global_acc") -> dict[int, float]:
    return {e["round"]: e[key] for e in record["history"] if e.get(key) is not None}


@pytest.mark.slow  # its fixture runs the CLI as a process
def test_tensorboard_logs_the_records_history(tracked):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path, record = tracked
    folder = path.parent / "trackers" / "tensorboard" / path.stem
    events, late = (EventAccumulator(str(f), size_guidance={"scalars": 0}) for f in (folder, folder / "late"))
    events.Reload()
    late.Reload()

    def logged(tag: str) -> dict[int, float]:  # round 0 (the initial models) comes at the end: in the run late
        return {e.step: e.value for e in [*events.Scalars(tag), *late.Scalars(tag)]}

    assert [e.step for e in events.Scalars("global_acc")] == [1, 2, 3]
    assert set(logged("global_acc")) == {0, 1, 2, 3}
    assert logged("global_acc") == pytest.approx(_curve(record), rel=1e-6)  # event files hold float32
    assert logged("bytes") == pytest.approx(_curve(record, "bytes"))
    clients = {e.step: e.value for e in events.Scalars("client/0/global_acc")}
    assert clients == pytest.approx({e["round"]: e["client_global_acc"][0] for e in record["history"]
                                     if e.get("client_global_acc")}, rel=1e-6)
    [headline] = events.Scalars("summary/headline_global_acc")
    assert headline.value == pytest.approx(record["metrics"]["headline"]["value"], rel=1e-6)
    assert json.loads((path.parent / "trackers" / "tensorboard" / path.stem / "record.json").read_text()) == record


@pytest.mark.slow  # its fixture runs the CLI as a process
def test_mlflow_logs_the_records_history(tracked):
    pytest.importorskip("mlflow")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    path, record = tracked
    client = MlflowClient(tracking_uri=(path.parent / "trackers" / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("hfl-bench").experiment_id])
    assert run.info.run_name == path.stem and run.info.status == "FINISHED"
    assert run.data.tags["hfl_bench.config_hash"] == record["config_hash"]
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "global_acc")}
    assert logged == _curve(record)
    assert run.data.metrics["summary/headline_global_acc"] == record["metrics"]["headline"]["value"]
    artifact = Path(client.download_artifacts(run.info.run_id, path.name, str(path.parent.parent / "download")))
    assert json.loads(artifact.read_text()) == record


@pytest.mark.slow  # its fixture runs the CLI as a process
def test_wandb_logs_the_records_history_offline(tracked):
    pytest.importorskip("wandb")
    path, record = tracked
    [run_file] = (path.parent / "trackers" / "wandb").glob("offline-run-*/run-*.wandb")
    logged, summary = {}, {}
    for r in _wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        items = r.history.item if kind == "history" else r.summary.update if kind == "summary" else []
        values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
        if kind == "history" and "global_acc" in values:
            logged[int(values["round"])] = values["global_acc"]
        summary.update(values if kind == "summary" else {})
    assert logged == _curve(record)
    assert summary["summary/headline_global_acc"] == record["metrics"]["headline"]["value"]
    assert summary["round"] == 3 and summary["status"] == "ok"


# in this process, and in worker processes that report to the driver (slow: processes)
@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_local_matrix_logs_each_round_as_it_ends(tmp_path, monkeypatch, jobs):
    from hfl_bench import trackers

    calls: list[tuple] = []

    class Recording(trackers.Tracker):  # the driver's tracker: what it saw, and whether the record was there yet
        name = "tensorboard"

        def start(self, run):
            self.path = run.record_path
            calls.append(("start", self.path.name))

        def log(self, step, values):
            calls.append(("log", self.path.name, step, self.path.exists()))

        def finish(self, record, path):
            calls.append(("finish", self.path.name, Path(path) == self.path))

    monkeypatch.setitem(trackers.CLASSES, "tensorboard", Recording)
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["matrix", str(_suite(tmp_path, out, trackers=["tensorboard"], seeds=[0, 1])),
                                      "--jobs", str(jobs), "--json"])
    assert result.exit_code == 0, result.output
    for row in json.loads(result.stdout)["cells"]:
        name = Path(row["record"]).name
        history = json.loads(Path(row["record"]).read_text())["history"]
        mine = [c for c in calls if c[1] == name]
        assert mine[0] == ("start", name) and mine[-1] == ("finish", name, True)
        live = [c[2] for c in mine if c[0] == "log" and not c[3]]  # logged before the record was written
        assert live == [e["round"] for e in history if e["round"] > 0]  # each trained round, as it ended
        assert [c[2] for c in mine if c[0] == "log" and c[3]][:1] == [0]  # the start's score comes with the record


def test_a_failing_tracker_is_a_warning_and_the_record_is_kept(tmp_path, monkeypatch, caplog):
    from hfl_bench import trackers

    class Broken(trackers.Tracker):
        name = "tensorboard"

        def start(self, run):
            pass

        def log(self, step, values):
            raise OSError("no space left on device")

    monkeypatch.setitem(trackers.CLASSES, "tensorboard", Broken)
    result = CliRunner().invoke(app, ["run", *_flags(TINY), "--out", str(tmp_path), "-q", "--tracker", "tensorboard"])
    assert result.exit_code == 0, result.output
    assert json.loads(_record_path(TINY, tmp_path).read_text())["status"] == "ok"
    assert "tracker tensorboard: logging round 1 failed (OSError: no space left on device); the run goes on " \
           "without it" in caplog.text
    bad = CliRunner().invoke(app, ["run", *_flags(TINY), "--out", str(tmp_path), "--tracker", "neptune"])
    assert bad.exit_code == 2 and "unknown tracker 'neptune' in --tracker: known are tensorboard, mlflow, wandb" \
        in bad.output


def test_a_suites_trackers_log_each_cell(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "runs"
    row = _matrix(_suite(tmp_path, out, trackers=["tensorboard"]), "local")
    assert row["status"] == "ok"
    record = json.loads(Path(row["record"]).read_text())
    folder = out / "trackers" / "tensorboard" / Path(row["record"]).stem
    events, late = EventAccumulator(str(folder)), EventAccumulator(str(folder / "late"))  # late: round 0
    events.Reload()
    late.Reload()
    logged = [*events.Scalars("global_acc"), *late.Scalars("global_acc")]
    assert {e.step: e.value for e in logged} == pytest.approx(_curve(record), rel=1e-6)
    with pytest.raises(ConfigError, match=r"suite.yaml: trackers: known are tensorboard, mlflow, wandb"):
        load_suite(_suite(tmp_path, out, trackers=["comet"]))
