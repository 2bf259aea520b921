"""The ``hfl-bench`` CLI in process (Typer's CliRunner): runs, records, listings and user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.results.records import load_schema

jsonschema = pytest.importorskip("jsonschema")

METHODS = ["local", "uniform-kd", "uncertainty-kd", "crad", "fedavg"]
RUN_ARGS = ["--task", "digits", "--clients", "4", "--rounds", "2", "-q"]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def validator():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _stdout(result) -> str:
    return getattr(result, "stdout", result.output)


def _stderr(result) -> str:
    try:
        return getattr(result, "stderr", "") or ""
    except ValueError:  # older Click: stderr not captured separately
        return ""


def _all_output(result) -> str:
    text = result.output
    err = _stderr(result)
    return text if err in text else text + err


@pytest.fixture(scope="module")
def run_records(tmp_path_factory, runner):
    """Runs each method at most once per module (also reused by the show tests)."""
    cache: dict[str, tuple[object, Path]] = {}
    out = tmp_path_factory.mktemp("runs")

    def get(method: str):
        if method not in cache:
            args = ["run", "--method", method, *RUN_ARGS, "--out", str(out / method), "--json"]
            if method == "fedavg":
                args += ["--pool", "cpu-cnn"]
            result = runner.invoke(app, args)
            assert result.exit_code == 0, _all_output(result)
            summary = json.loads(_stdout(result))
            cache[method] = (summary, Path(summary["record"]))
        return cache[method]

    return get


# --------------------------------------------------------------------------- run


@pytest.mark.parametrize("method", METHODS)
def test_run_every_method(method, run_records, validator):
    summary, path = run_records(method)
    assert path.is_file()
    assert path.name.startswith(f"digits__{method}__")
    assert summary["status"] == "ok"
    record = json.loads(path.read_text())
    errors = sorted(validator.iter_errors(record), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    assert record["status"] == "ok" and record["error"] is None
    assert record["method"]["name"] == method
    acc = record["metrics"]["global_acc"]
    assert isinstance(acc, (int, float)) and not isinstance(acc, bool) and 0 <= acc <= 100
    assert summary["metrics"]["global_acc"] == acc
    assert [h["round"] for h in record["history"]] == [0, 1, 2]
    assert record["federation"]["n_clients"] == 4 and record["federation"]["rounds_run"] == 2
    assert record["config"]["method"] == method and record["config"]["clients"] == 4
    assert len(record["metrics"]["per_client"]) == 4
    assert record["selection"]["round"] in (1, 2)
    assert record["task"]["name"] == "digits" and record["task"]["n_train"] == 1438
    if method == "local":
        assert record["cost"]["bytes_total"] == 0
        assert all(h["bytes"] == 0 for h in record["history"])
    else:
        assert record["cost"]["bytes_total"] > 0
        assert all(h["bytes"] > 0 for h in record["history"][1:])
    if method == "fedavg":
        assert record["arch_pool"]["name"] == "cpu-cnn"
        assert set(record["arch_pool"]["assignment"]) == {"cnn_small"}
    else:
        assert record["arch_pool"]["assignment"] == ["mlp_small", "cnn_small", "resnet_tiny", "mlp_small"]


def test_run_is_reproducible(run_records, runner, tmp_path):
    _, first = run_records("crad")
    result = runner.invoke(app, ["run", "--method", "crad", *RUN_ARGS, "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, _all_output(result)
    a = json.loads(first.read_text())
    b = json.loads(Path(json.loads(_stdout(result))["record"]).read_text())
    assert a["config_hash"] == b["config_hash"] and a["partition"]["hash"] == b["partition"]["hash"]
    assert a["metrics"]["global_acc"] == b["metrics"]["global_acc"]
    assert [h["global_acc"] for h in a["history"]] == [h["global_acc"] for h in b["history"]]


def test_run_table_output(runner, tmp_path):
    result = runner.invoke(app, ["run", "--method", "local", "--task", "digits", "--clients", "3", "--rounds", "1",
                                 "--out", str(tmp_path), "-q"])
    assert result.exit_code == 0, _all_output(result)
    assert "global acc" in result.output
    assert "record written to" in result.output
    assert len(list(tmp_path.glob("*.json"))) == 1


# --------------------------------------------------------------------------- show


def test_show_renders(run_records, runner):
    _, path = run_records("crad")
    result = runner.invoke(app, ["show", str(path)])
    assert result.exit_code == 0, _all_output(result)
    assert "global acc" in result.output
    assert "per client" in result.output
    assert "mlp_small" in result.output


def test_show_json(run_records, runner):
    _, path = run_records("crad")
    result = runner.invoke(app, ["show", str(path), "--json"])
    assert result.exit_code == 0, _all_output(result)
    assert json.loads(_stdout(result)) == json.loads(path.read_text())


def test_show_rejects_non_record(runner, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    result = runner.invoke(app, ["show", str(bad)])
    assert result.exit_code != 0
    _assert_one_clear_line(result, "not an hfl-bench record")
    result = runner.invoke(app, ["show", str(tmp_path / "missing.json")])
    _assert_one_clear_line(result, "record not found")


# --------------------------------------------------------------------------- list


@pytest.mark.parametrize("kind, expected", [
    ("methods", {"local", "uniform-kd", "uncertainty-kd", "crad", "fedavg"}),
    ("tasks", {"digits", "mnist1d", "cifar10", "cifar100", "pathmnist"}),
    ("pools", {"paper", "cpu", "cpu-cnn", "paper-resnet18"}),
    ("partitions", {"dirichlet", "classes", "iid"}),
    ("aggregators", {"uniform", "entropy", "crad", "crad-lcb"}),
])
def test_list(runner, kind, expected):
    result = runner.invoke(app, ["list", kind])
    assert result.exit_code == 0, _all_output(result)
    for name in expected:
        assert name in result.output
    result = runner.invoke(app, ["list", kind, "--json"])
    assert result.exit_code == 0, _all_output(result)
    rows = json.loads(_stdout(result))
    assert expected <= {row["name"] for row in rows}
    if kind == "methods":
        by_name = {r["name"]: r for r in rows}
        assert by_name["fedavg"]["topology"] == "server"
        assert by_name["local"]["topology"] == "none"
        assert by_name["uncertainty-kd"]["fidelity"] == "reconstructed"
    if kind == "tasks":
        digits = next(r for r in rows if r["name"] == "digits")
        assert digits["classes"] == 10 and digits["input"] == [1, 8, 8]
    if kind == "pools":
        paper = next(r for r in rows if r["name"] == "paper")
        assert len(paper["members"]) == 3 and "params" in paper["members"][0]


def test_list_bogus_kind(runner):
    result = runner.invoke(app, ["list", "bogus"])
    assert result.exit_code == 2
    _assert_one_clear_line(result, "bogus")


# --------------------------------------------------------------------------- partition


def test_partition_json(runner):
    args = ["partition", "--task", "digits", "--clients", "5", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, _all_output(first)
    data = json.loads(_stdout(first))
    counts = data["train_counts"]
    assert len(counts) == 5 and all(len(row) == 10 for row in counts)
    assert isinstance(data["hash"], str) and len(data["hash"]) == 16
    assert sum(map(sum, counts)) + sum(data["val_sizes"]) + sum(data["test_sizes"]) == 1438
    assert data["scheme"] == "dirichlet" and data["params"]["alpha"] == 0.3
    second = runner.invoke(app, args)
    assert json.loads(_stdout(second))["hash"] == data["hash"]
    other = runner.invoke(app, args + ["--seed", "1"])
    assert json.loads(_stdout(other))["hash"] != data["hash"]


def test_partition_table(runner):
    result = runner.invoke(app, ["partition", "--task", "digits", "--clients", "3", "--partition", "classes",
                                 "--k", "1"])
    assert result.exit_code == 0, _all_output(result)
    assert "classes" in result.output and "hash" in result.output


# --------------------------------------------------------------------------- user errors


def _assert_one_clear_line(result, *needles: str) -> None:
    text = _all_output(result)
    assert result.exit_code != 0, text
    # A user error exits through typer.Exit (SystemExit), never an uncaught exception.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert lines[0].startswith("error:"), text
    for needle in needles:
        assert needle in lines[0], text


def _write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


BAD_RUNS = {
    "unknown-method": (["--method", "crda"], ["unknown method 'crda'", "Did you mean 'crad'?"]),
    "unknown-task": (["--task", "digitz"], ["unknown task 'digitz'", "Did you mean 'digits'?"]),
    "unknown-pool": (["--pool", "bogus"], ["unknown architecture pool 'bogus'"]),
    "unknown-set-key": (["--method", "crad", "--set", "bogus=1"], ["unknown hyperparameter", "bogus"]),
    "alpha-zero": (["--alpha", "0"], ["--alpha must be > 0"]),
    "alpha-negative": (["--alpha", "-1"], ["--alpha must be > 0"]),
    "too-many-clients": (["--clients", "5000"], ["5000 clients", "1438"]),
    "fedavg-heterogeneous": (["--method", "fedavg", "--pool", "cpu"], ["fedavg", "homogeneous"]),
    "bad-set-value": (["--method", "crad", "--set", "lam=abc"], ["lam", "abc"]),
    "bad-set-syntax": (["--method", "crad", "--set", "lam"], ["key=value"]),
    "zero-rounds": (["--rounds", "0"], ["--rounds must be >= 1"]),
    "bad-device": (["--device", "tpu"], ["tpu"]),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_bad_run_inputs(runner, tmp_path, case):
    args, needles = BAD_RUNS[case]
    base = {"--task": "digits", "--clients": "3", "--rounds": "1", "--out": str(tmp_path / "runs")}
    base = [arg for flag, value in base.items() if flag not in args for arg in (flag, value)]  # given once
    result = runner.invoke(app, ["run", *base, "-q", *args])
    _assert_one_clear_line(result, *needles)
    assert not list(tmp_path.rglob("*.json"))  # no record for a rejected run


def test_missing_dataset(runner, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["run", "--task", "pathmnist", "--data-dir", str(empty), "--out",
                                 str(tmp_path / "runs"), "-q"])
    _assert_one_clear_line(result, str(empty / "pathmnist.npz"), "--download")


def test_corrupt_dataset(runner, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "pathmnist.npz").write_bytes(b"\x00garbage, not a zip file" * 50)
    result = runner.invoke(app, ["run", "--task", "pathmnist", "--data-dir", str(folder), "--out",
                                 str(tmp_path / "runs"), "-q"])
    _assert_one_clear_line(result, str(folder / "pathmnist.npz"), "corrupt")


def test_missing_config_file(runner, tmp_path):
    missing = tmp_path / "nope.yaml"
    result = runner.invoke(app, ["run", "--config", str(missing), "-q"])
    _assert_one_clear_line(result, "config file not found", str(missing))


def test_config_unknown_key(runner, tmp_path):
    cfg = _write_yaml(tmp_path / "c.yaml", {"rounds": 1, "bogus_key": 3})
    result = runner.invoke(app, ["run", "--config", str(cfg), "-q"])
    _assert_one_clear_line(result, "unknown setting", "bogus_key")


def test_config_not_a_mapping(runner, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("- 1\n- 2\n")
    result = runner.invoke(app, ["run", "--config", str(cfg), "-q"])
    _assert_one_clear_line(result, "mapping")


def test_config_file_and_flag_override(runner, tmp_path):
    cfg = _write_yaml(tmp_path / "run.yaml", {
        "method": "uniform-kd", "task": "digits", "rounds": 3, "clients": 3,
        "method_params": {"lam": 0.5, "temperature": 3.0},
    })
    result = runner.invoke(app, ["run", "--config", str(cfg), "--rounds", "1", "--set", "temperature=4",
                                 "--out", str(tmp_path / "runs"), "--json", "-q"])
    assert result.exit_code == 0, _all_output(result)
    record = json.loads(Path(json.loads(_stdout(result))["record"]).read_text())
    assert record["method"]["name"] == "uniform-kd"
    assert record["config"]["clients"] == 3  # from the YAML file
    assert record["config"]["rounds"] == 1  # the flag beats the YAML file
    assert [h["round"] for h in record["history"]] == [0, 1]
    assert record["config"]["method_params"]["lam"] == 0.5
    hp = record["method"]["hparams"]
    assert hp["lam"] == 0.5  # from the YAML file
    assert hp["temperature"] == 4.0  # --set beats the YAML file
    assert hp["aggregator"] == "uniform"
