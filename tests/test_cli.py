"""The ``hfl-bench`` CLI in process (Typer's CliRunner): runs, records, listings and user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.cli.catalog import quick_start_text, text_task_text
from hfl_bench.method_api import get_method_class
from hfl_bench.record.io import load_schema
from hfl_bench.testing import builtin_methods, smoke_config

jsonschema = pytest.importorskip("jsonschema")

# The methods run through the CLI here: the first built-in of each topology (every method runs
# in the engine-level suites; here the command line and the record it writes are under test).
METHODS = sorted({card.topology: name for name, card in reversed(
    [(m, get_method_class(m).card) for m in builtin_methods()])}.values())
RUN_ARGS = ["--task", "digits", "--clients", "4", "--rounds", "2", "-q"]


def smoke_args(method: str) -> list[str]:
    """The command-line options of the method card's smoke settings (pool, public set, --set)."""
    smoke = smoke_config(method)
    args = [*(["--pool", smoke["pool"]] if smoke["pool"] else []),
            *(["--public-size", str(smoke["public_size"])] if smoke["public_size"] else []),
            *(["--pretrain-size", str(smoke["pretrain_size"])] if smoke.get("pretrain_size") else [])]
    for key, value in smoke["method_params"].items():
        args += ["--set", f"{key}={value}"]
    return args


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
            args = ["run", "--method", method, *RUN_ARGS, "--out", str(out / method), "--json",
                    *smoke_args(method)]
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
    card = get_method_class(method).card
    if card.topology == "none":
        assert record["cost"]["bytes_total"] == 0
        assert all(h["bytes"] == 0 for h in record["history"])
    else:
        assert record["cost"]["bytes_total"] > 0
        assert all(h["bytes"] > 0 for h in record["history"][1:])
    if card.single_architecture:
        assert record["arch_pool"]["name"] == card.smoke.pool
        assert len(set(record["arch_pool"]["assignment"])) == 1
    elif card.pool:  # a method with its own model family (depthfl, the server methods' first): its pool
        assert record["arch_pool"]["name"] == card.pool
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
    ("methods", None),  # every built-in method
    ("tasks", {"digits", "mnist1d", "cifar10", "cifar100", "pathmnist"}),
    ("pools", {"paper", "cpu", "cpu-cnn", "paper-resnet18"}),
    ("partitioners", {"dirichlet", "classes", "iid"}),
    ("aggregators", {"uniform", "entropy", "crad", "crad-lcb", "crad-stage1", "crad-no-agreement-filter",
                     "crad-support-filter-only"}),
])
def test_list(runner, kind, expected):
    expected = set(builtin_methods()) if expected is None else expected
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
        for name in expected:  # the card's fields
            card = get_method_class(name).card
            assert by_name[name] == {"name": name, "description": card.summary, "fidelity": card.fidelity,
                                     "topology": card.topology, "transfer": card.transfer,
                                     "single_architecture": card.single_architecture,
                                     "peer_data": card.peer_data, "submodels": card.submodels,
                                     "model_family": card.pool, "predictor": card.predictor,
                                     "refuses_faults": sorted(card.refuses_faults), "version": card.version,
                                     "presets": {n: dict(v) for n, v in card.presets.items()},
                                     "on_digits": quick_start_text(card), "on_text": text_task_text(card),
                                     "origin": get_method_class(name).__module__}
        assert by_name["fedavg"]["single_architecture"] and by_name["fedmd"]["transfer"] == "public-labelled"
        assert by_name["dfml"]["peer_data"] and by_name["dfml"]["predictor"] == "stored snapshot"
        assert by_name["crad"]["on_digits"] == "runs" and by_name["fedavg"]["on_digits"] == "needs --pool cpu-cnn"
    if kind == "tasks":
        digits = next(r for r in rows if r["name"] == "digits")
        assert digits["classes"] == 10 and digits["input"] == [1, 8, 8]
    if kind == "aggregators":  # each rule's version: bumped when what it computes changes
        versions = {r["name"]: r["version"] for r in rows}
        assert versions["crad"] == "1.0" and versions["crad-accuracy"] == "1.1"
        assert versions["crad-stage1"] == versions["crad-support-filter-only"] == "1.0"
    if kind == "pools":
        paper = next(r for r in rows if r["name"] == "paper")
        assert len(paper["members"]) == 3 and "params" in paper["members"][0]


def test_list_unknown_kind_names_the_closest(runner):
    result = runner.invoke(app, ["list", "partitions"])
    assert result.exit_code == 2
    assert "unknown kind 'partitions'. Did you mean 'partitioners'?" in _all_output(result)
    result = runner.invoke(app, ["describe", "dirichlet", "--kind", "partitions"])
    assert result.exit_code == 2
    assert "Did you mean 'partitioners'?" in _all_output(result)


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


# --------------------------------------------------------------------------- run's options, from RunConfig


# Options of ``run`` that are not run settings (declared in hfl_bench.cli.run itself).
RUN_ONLY_OPTIONS = {"--config", "--set", "--json", "--quiet", "-q", "--threads", "--resume", "--tracker"}


def _command(name: str):
    import typer

    group = typer.main.get_command(app)
    return group.commands[name]


def test_each_run_setting_has_exactly_one_option_with_its_help():
    """One help text per setting: the option shows the RunConfig field's own (escaped for rich
    markup), its default is the field's, and no option of run re-declares a setting by hand."""
    import dataclasses

    from rich.markup import escape

    from hfl_bench.config import RunConfig

    options = [p for p in _command("run").params if p.param_type_name == "option"]
    on_cli = [f for f in dataclasses.fields(RunConfig) if f.metadata["flags"] is not None]
    assert {f.name for f in dataclasses.fields(RunConfig)} - {f.name for f in on_cli} == {
        "momentum", "weight_decay", "grad_clip", "method_params"}  # set in a config file (--set for the last)
    setting_opts = set()
    for f in on_cli:
        matching = [p for p in options if p.help == escape(f.metadata["help"])]
        assert len(matching) == 1, f.name
        option = matching[0]
        assert option.name == f.name and option.default == f.default
        assert option.opts[0] == (f.metadata["flags"] or (f"--{f.name.replace('_', '-')}",))[0]
        setting_opts.update(option.opts)
    all_opts = {o for p in options for o in p.opts}
    assert all_opts - setting_opts == RUN_ONLY_OPTIONS


def test_partition_settings_share_run_settings_help():
    from rich.markup import escape

    from hfl_bench.config import FIELDS

    for p in _command("partition").params:
        if p.name in FIELDS:
            assert p.help == escape(FIELDS[p.name].metadata["help"])
    assert {p.name for p in _command("partition").params} >= {"task", "partition", "alpha", "classes_per_client",
                                                              "seed", "data_dir", "download"}


def test_run_help_shows_types_and_defaults_and_no_type_for_flags(runner):
    text = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    lines = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ --")}
    assert "<str>" in lines["--method"] and "[default: crad]" in lines["--method"] and "-m" in lines["--method"]
    assert "<int>" in lines["--k"] and "[default: 2]" in lines["--k"]
    assert "<path>" in lines["--out"] and "[default: runs]" in lines["--out"]
    assert "<float>" in lines["--alpha"] and "default: the task's" in lines["--alpha"]
    assert "[default:" not in lines["--alpha"]  # a task's default is not shown as None
    for flag in ("--download", "--json", "--resume", "--help"):
        assert "<" not in lines[flag], lines[flag]


def test_a_config_file_wins_over_defaults_and_an_option_over_the_file(runner, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("eval_every: 0\nmethod: nosuch\n")  # both refused: so each error shows which won
    result = runner.invoke(app, ["run", "--config", str(config), "-q", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "--eval-every must be >= 1, got 0" in _all_output(result)
    result = runner.invoke(app, ["run", "--config", str(config), "--eval-every", "3", "-q",
                                 "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "unknown method 'nosuch'" in _all_output(result)
    result = runner.invoke(app, ["run", "--config", str(config), "--eval-every", "3", "-m", "crad", "--rounds", "0",
                                 "-q", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "--rounds must be >= 1, got 0" in _all_output(result)


def test_root_and_group_help_show_no_type_for_flags(runner):
    for args in (["--help"], ["leaderboard", "--help"], ["leaderboard", "show", "--help"], ["matrix", "--help"]):
        text = runner.invoke(app, args, env={"COLUMNS": "200"}).output
        assert "--help" in text and "<bool>" not in text, args
