"""`hfl-bench matrix`: suite parsing, the real CLI over a small matrix (records, resume by
skipping, failed cells), the local process pool and the Ray executor on a loopback cluster."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_repo_hygiene import machine_paths
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import ConfigError
from hfl_bench.data import get_task
from hfl_bench.matrix.cells import error_text, portable_filename
from hfl_bench.matrix.executors import cell_gpus, unschedulable
from hfl_bench.matrix.runner import engine_check, run_matrix
from hfl_bench.matrix.suite import expected_filename, load_suite, parse_suite, resolve_cell, suite_cells
from hfl_bench.paths import checkpoint_path
from hfl_bench.record.io import load_schema
from hfl_bench.registry import METHODS
from hfl_bench.testing import QUICK, builtin_names

jsonschema = pytest.importorskip("jsonschema")
REPO = Path(__file__).resolve().parent.parent
SMALL = {"rounds": 2, "clients": 4, **QUICK}


@pytest.fixture(scope="module")
def validator():
    return jsonschema.Draft202012Validator(load_schema())


def _schema_errors(validator, record) -> list[str]:
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(record)]


def _write_suite(path: Path, **suite) -> Path:
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def _invoke(*args: str):
    result = CliRunner().invoke(app, ["matrix", *args])
    stdout = getattr(result, "stdout", result.output)
    return result, stdout


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_text()) for p in sorted(folder.glob("*.json"))}


# --------------------------------------------------------------------------- suite parsing


def test_unknown_keys_are_errors_that_list_the_known_ones(tmp_path):
    base = {"methods": ["local"], "tasks": ["digits"]}
    with pytest.raises(ConfigError, match=r"unknown key\(s\) method\. Known: name, description, out, methods"):
        parse_suite({**base, "method": "crad"})
    with pytest.raises(ConfigError, match=r"settings: unknown key\(s\) roundz\. Known: .*rounds"):
        parse_suite({**base, "settings": {"roundz": 3}})
    for removed in ("vmap", "lockstep"):  # removed settings (config.LEGACY_FIELDS) are unknown keys too
        with pytest.raises(ConfigError, match=rf"settings: unknown key\(s\) {removed}\. Known: "):
            parse_suite({**base, "settings": {removed: "on"}})
    with pytest.raises(ConfigError, match=r"method_overrides\.local: unknown key\(s\) pol"):
        parse_suite({**base, "method_overrides": {"local": {"pol": "cpu"}}})
    with pytest.raises(ConfigError, match="'seed' is set by the suite's seeds list"):
        parse_suite({**base, "settings": {"seed": 3}})
    with pytest.raises(ConfigError, match="method_overrides names crad, not in the suite's methods"):
        parse_suite({**base, "method_overrides": {"crad": {"rounds": 1}}})
    with pytest.raises(ConfigError, match="seeds lists 1 more than once"):
        parse_suite({**base, "seeds": [1, 1]})
    with pytest.raises(ConfigError, match="tasks must be a non-empty list"):
        parse_suite({"methods": ["local"]})

    # Through the CLI: exit code 2 and one line naming the problem.
    suite = _write_suite(tmp_path / "bad.yaml", **base, output="x")
    result, _ = _invoke(str(suite))
    assert result.exit_code == 2
    assert "unknown key(s) output. Known:" in result.output
    result, _ = _invoke(str(tmp_path / "missing.yaml"))
    assert result.exit_code == 2 and "suite file not found" in result.output


def test_layers_merge_and_cells_resolve_against_task_defaults(tmp_path):
    suite = parse_suite({
        "methods": ["crad", "fedavg"], "tasks": ["digits", "mnist1d"], "seeds": [3, 4], "out": "somewhere",
        "settings": {"rounds": 7, "method_params": {"lam": 0.5}},
        "task_overrides": {"mnist1d": {"rounds": 9, "alpha": 0.5}},
        "method_overrides": {"fedavg": {"pool": "cpu-cnn", "rounds": 11, "method_params": {}},
                             "crad": {"method_params": {"min_support": 3}}},
    })
    cells = suite_cells(suite, out=tmp_path)
    assert [(c.cfg.task, c.cfg.method, c.cfg.seed) for c in cells] == [
        (t, m, s) for t in ("digits", "mnist1d") for m in ("crad", "fedavg") for s in (3, 4)]
    by = {(c.cfg.task, c.cfg.method): c.cfg for c in cells}
    assert all(c.error is None for c in cells if c.cfg.method == "crad")
    # a cell is resolved once, hyperparameters included (``resolve_run``): the shared lam, unknown to
    # fedavg, fails its cells before any runs; their settings still resolve against the task
    assert all(c.error.startswith("ConfigError: unknown hyperparameter(s) for method 'fedavg': lam")
               for c in cells if c.cfg.method == "fedavg")
    assert by["digits", "crad"].rounds == 7 and by["mnist1d", "crad"].rounds == 9  # task over shared
    assert by["mnist1d", "fedavg"].rounds == 11  # method over task
    assert by["digits", "crad"].method_params == {"lam": 0.5, "min_support": 3}  # merged key by key
    assert by["digits", "fedavg"].pool == "cpu-cnn" and by["digits", "crad"].pool == "cpu"  # task default
    assert by["mnist1d", "crad"].alpha == 0.5 and by["digits", "crad"].alpha == 0.3
    assert by["digits", "crad"].clients == 10  # resolved from the task's defaults
    assert all(Path(c.cfg.out) == tmp_path for c in cells)
    # The expected record path is known before the run: task__method__hash__seedS.json
    name = cells[0].record_path().name
    assert name.startswith("digits__crad__") and name.endswith("__seed3.json")


def test_unresolvable_cell_becomes_a_failed_record(tmp_path, validator):
    # A suite naming an unknown task is refused before any cell (test_misspelt_names_...); a cell
    # that still cannot resolve (e.g. a plugin gone between the check and the cell) is a failed record.
    cells = [resolve_cell({"method": "local", "task": t, "seed": 0, "out": str(tmp_path)})
             for t in ("digits", "no-such-task")]
    assert cells[0].error is None
    assert cells[1].error.startswith("RegistryError: unknown task 'no-such-task'")
    [row] = run_matrix(cells[1:])  # nothing to run: written as failed straight away
    assert row["status"] == "failed" and row["error"].startswith("RegistryError: unknown task")
    record = json.loads(Path(row["record"]).read_text())
    assert _schema_errors(validator, record) == []
    assert record["task"] == {"name": "no-such-task", "version": None, "num_classes": None}
    assert record["method"]["fidelity"] == "paper"  # local is registered: its details are filled in


@pytest.mark.parametrize("suite, line", [
    ({"methods": ["crad", "fedmkdd"]}, r"methods: unknown method 'fedmkdd'\. Did you mean 'fedmkd'\?"),
    ({"tasks": ["digts"]}, r"tasks: unknown task 'digts'\. Did you mean 'digits'\?"),
    ({"settings": {"pool": "cpu-cn"}},
     r"settings: pool: unknown architecture pool 'cpu-cn'\. Did you mean 'cpu-cnn'\?"),
    ({"method_overrides": {"crad": [{}, {"pool": "cpu-mn"}]}},
     r"method_overrides: crad: pool: unknown architecture pool 'cpu-mn'\. Did you mean 'cpu-mm'\?"),
])
def test_misspelt_names_are_one_line_before_any_cell(tmp_path, suite, line):
    """A misspelt method, task or pool in a suite is a bad command line (issue 63): one line with the
    registry's did-you-mean, exit 2, no folder and no record written; before, every cell of it ran
    and failed, exit 1, and the typo was named nowhere."""
    out = tmp_path / "out"
    data = {"methods": ["crad"], "tasks": ["digits"], "seeds": [0], "out": str(out), "settings": {"rounds": 1},
            **suite}
    path = _write_suite(tmp_path / "typo.yaml", **data)
    result, _ = _invoke(str(path))
    assert result.exit_code == 2, result.output
    [message] = result.output.strip().splitlines()
    assert re.search(line, message) and message.startswith(f"error: {path}: "), message
    assert not out.exists()
    with pytest.raises(ConfigError, match=line):  # the API's path checks it too
        suite_cells(load_suite(path))


def test_the_faults_axis(tmp_path):
    """``faults:`` lists fault settings (none included): one cell per spec, canonical in the cell's
    config, so each has its own config hash and record path; faults then may not be a setting."""
    suite = parse_suite({"methods": ["local", "crad"], "tasks": ["digits"], "seeds": [0, 1],
                         "faults": ["none", "byzantine:0.2", "label-noise:[1,2]@0.5/pair"]})
    assert suite.faults == ["", "byzantine:0.2/random", "label-noise:[1,2]@0.5/pair"]
    cells = suite_cells(suite, out=tmp_path)
    assert len(cells) == 2 * 2 * 3 and all(c.error is None for c in cells)
    assert [c.cfg.faults for c in cells[:4]] == [""] * 4  # the runs without faults come first
    assert [(c.cfg.method, c.cfg.seed) for c in cells[:4]] == [("local", 0), ("local", 1), ("crad", 0), ("crad", 1)]
    assert len({c.record_path() for c in cells}) == 12
    assert "faults byzantine:0.2/random" in cells[4].label and "faults" not in cells[0].label
    bad = [({"faults": []}, "faults must be a non-empty list"),
           ({"faults": ["byzantine:0.2", "byzantine:0.2/random"]},
            "faults lists byzantine:0.2/random more than once"),
           ({"faults": ["byzantine:2"]}, "fraction of faulty clients must be in (0, 1]"),
           ({"faults": ["none"], "settings": {"faults": "byzantine:0.2"}},
            "'faults' is set by the suite's faults list"),
           ({"faults": ["none"], "method_overrides": {"local": {"faults": "none"}}}, "set by the suite's faults list")]
    for extra, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_suite({"methods": ["local"], "tasks": ["digits"], **extra})
    # without the axis a faults setting is a setting like any other
    [cell] = suite_cells(parse_suite({"methods": ["local"], "tasks": ["digits"], "seeds": [0],
                                      "settings": {"faults": "free-rider:0.2"}}), out=tmp_path)
    assert cell.cfg.faults == "free-rider:0.2"


def test_matrix_dry_run_lists_the_fault_settings(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "seeds": [0], "out": str(tmp_path / "r"),
                                    "faults": ["none", "free-rider:0.5"]}))
    result = CliRunner().invoke(app, ["matrix", str(path), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["cells"]
    assert [r["faults"] for r in rows] == ["none", "free-rider:0.5"] and {r["status"] for r in rows} == {"would run"}
    assert rows[0]["record"] != rows[1]["record"]


def test_matrix_dry_run_says_which_cells_cannot_find_their_data(tmp_path):
    """A task whose data folder lacks its files would fail: the dry run says so, with the task's own
    line (how to build it), and exits 1; a task whose data is there (digits, bundled) would run."""
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"methods": ["local", "crad"], "tasks": ["digits", "hapt"], "seeds": [0],
                                    "out": str(tmp_path / "r")}))
    result = CliRunner().invoke(app, ["matrix", str(path), "--dry-run", "--json"],
                                env={"HFL_BENCH_DATA": str(tmp_path / "empty")})
    assert result.exit_code == 1, result.output
    rows = json.loads(result.stdout)["cells"]
    status = {(r["method"], r["task"]): r["status"] for r in rows}
    assert status == {("local", "digits"): "would run", ("crad", "digits"): "would run",
                      ("local", "hapt"): "would fail", ("crad", "hapt"): "would fail"}
    errors = {r["error"] for r in rows if r["task"] == "hapt"}
    assert len(errors) == 1 and "hfl-bench prepare hapt" in errors.pop()


def test_seed_ranges_in_a_suite_and_on_the_command_line(tmp_path):
    assert parse_suite({"methods": ["local"], "tasks": ["digits"], "seeds": "0-3"}).seeds == [0, 1, 2, 3]
    for bad in ("3-1", "0-2,2", "x", "1-"):
        with pytest.raises(ConfigError, match="seeds"):
            parse_suite({"methods": ["local"], "tasks": ["digits"], "seeds": bad})
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "seeds": [0],
                                    "out": str(tmp_path / "r")}))
    result = CliRunner().invoke(app, ["matrix", str(path), "--seeds", "0-2,5", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["seed"] for r in json.loads(result.stdout)["cells"]] == [0, 1, 2, 5]
    result = CliRunner().invoke(app, ["matrix", str(path), "--seeds", "2-0", "--dry-run"])
    assert result.exit_code == 2 and "seeds" in result.output and len(result.output.strip().splitlines()) == 1


def test_method_variants(tmp_path):
    """A method's override may be a list: one variant of the method per entry (its own config hash,
    record and summary label), merged over the shared and task layers like a single override."""
    suite = parse_suite({
        "methods": ["local", "dfml"], "tasks": ["digits"], "seeds": [0, 1], "settings": {"rounds": 3},
        "method_overrides": {"dfml": [{}, {"method_params": {"eval": "current"}},
                                      {"rounds": 4, "method_params": {"wsm": False, "alpha_max": 0}}]}})
    assert suite.variants("local") == [{}] and len(suite.variants("dfml")) == 3
    cells = suite_cells(suite, out=tmp_path)
    assert all(c.error is None for c in cells)
    assert [(c.cfg.method, c.variant, c.cfg.seed) for c in cells] == [
        ("local", "", 0), ("local", "", 1),
        *[("dfml", v, s) for v in ("defaults", "eval=current", "rounds=4, wsm=false, alpha_max=0") for s in (0, 1)]]
    by = {(c.variant, c.cfg.seed): c.cfg for c in cells}
    assert by["defaults", 0].method_params == {} and by["defaults", 0].rounds == 3
    assert by["eval=current", 0].method_params == {"eval": "current"}
    assert by["rounds=4, wsm=false, alpha_max=0", 1].method_params == {"wsm": False, "alpha_max": 0.0}
    assert by["rounds=4, wsm=false, alpha_max=0", 1].rounds == 4
    assert len({c.record_path() for c in cells}) == len(cells) == 8
    assert cells[4].label == "dfml [eval=current] on digits, seed 0"
    # the dry run names each cell's variant
    path = _write_suite(tmp_path / "v.yaml", methods=["dfml"], tasks=["digits"], seeds=[0], out=str(tmp_path / "r"),
                        method_overrides={"dfml": [None, {"method_params": {"wsm": False}}]})
    result, stdout = _invoke(str(path), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(stdout)["cells"]
    assert [(r["variant"], r["status"]) for r in rows] == [("defaults", "would run"), ("wsm=false", "would run")]
    result = CliRunner().invoke(app, ["matrix", str(path), "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "variant" in result.stdout and "wsm=false" in result.stdout
    plain, _ = _invoke(str(_write_suite(tmp_path / "p.yaml", methods=["dfml"], tasks=["digits"], seeds=[0],
                                        out=str(tmp_path / "r"))), "--dry-run", "--json")
    assert json.loads(plain.stdout)["cells"][0]["variant"] is None  # a single override: no variant
    # refused: an empty list, an entry given twice, a list for a task, two entries that are one run
    base = {"methods": ["dfml"], "tasks": ["digits"], "seeds": [0]}
    for overrides, message in (({"method_overrides": {"dfml": []}}, "must hold at least one override"),
                               ({"method_overrides": {"dfml": [{}, None]}}, "variants lists defaults more than once"),
                               ({"method_overrides": {"dfml": [{}, {"roundz": 2}]}}, r"dfml\[1\]: unknown key"),
                               ({"task_overrides": {"digits": [{}]}}, "must be a mapping of run settings")):
        with pytest.raises(ConfigError, match=message):
            parse_suite({**base, **overrides})
    same = parse_suite({**base, "method_overrides": {"dfml": [{}, {"method_params": {"eval": "peak"}}]}})
    with pytest.raises(ConfigError, match=r"dfml \[defaults\] on digits, seed 0 and dfml \[eval=peak\] on digits, "
                                          r"seed 0 are the same run"):
        suite_cells(same, out=tmp_path)
    path = _write_suite(tmp_path / "same.yaml", **base, out=str(tmp_path / "r"),
                        method_overrides={"dfml": [{}, {"method_params": {"eval": "peak"}}]})
    result, _ = _invoke(str(path), "--dry-run")
    assert result.exit_code == 2 and "are the same run" in result.output
    assert len(result.output.strip().splitlines()) == 1


SHIPPED_SUITES = sorted(p.stem for p in (REPO / "suites").glob("*.yaml"))


@pytest.mark.parametrize("level", ["k2", "dir01"])
def test_the_skew_trend_suites_extend_their_levels_cells(level):
    """The trend's ten-seed suites run the same cells as their level's five-seed suite on seeds 0-4
    (the same record files: a run skips them), and only FedCC's and MSFKD's, under Adam and under
    the protocol's SGD."""
    base = {c.record_path() for c in suite_cells(load_suite(REPO / "suites" / f"label-skew-{level}.yaml"))}
    trend = suite_cells(load_suite(REPO / "suites" / f"label-skew-{level}-trend.yaml"))
    assert {c.seed for c in (cell.cfg for cell in trend)} == set(range(10))
    assert {c.record_path() for c in trend if c.cfg.seed < 5} <= base
    assert {(c.cfg.method, c.cfg.optimizer) for c in trend} == {
        (m, o) for m in ("fedcc", "msfkd") for o in ("adam", "sgd")}
    assert {c.cfg.lr for c in trend if c.cfg.optimizer == "adam"} == {0.001}


@pytest.mark.parametrize("task", ["hapt", "fashion-mnist", "rotten-tomatoes"])
def test_issue_64s_suites_run_every_method_that_runs_on_their_task(task):
    """suites/TASK.yaml, TASK-methods.yaml and TASK-public.yaml together hold every built-in method
    the task does not refuse (``check_method_for_task``: the card's one line), each once, and no
    method it refuses; their records share the partition, each suite at the task's own protocol."""
    from hfl_bench.method_api import check_method_for_task

    suites = [load_suite(REPO / "suites" / f"{task}{tail}.yaml") for tail in ("", "-methods", "-public")]
    listed = [m for suite in suites for m in suite.methods if m != "local" or suite.name == task]
    assert len(listed) == len(set(listed)), listed
    runs = set()
    for name in builtin_names(METHODS):
        try:
            check_method_for_task(METHODS.get(name), task)
            runs.add(name)
        except ConfigError:
            pass
    assert set(listed) == runs
    assert {s.tasks[0] for s in suites} == {task} and all(len(s.tasks) == 1 for s in suites)
    public = suites[2]
    assert {c.cfg.public_size for c in suite_cells(public)} == {500}
    assert set(public.methods) - {"local"} == {m for m in runs if METHODS.get(m).card.needs_public}


@pytest.mark.parametrize("name", SHIPPED_SUITES)  # every suite the repository ships
def test_shipped_suites_parse(name):
    suite = load_suite(REPO / "suites" / f"{name}.yaml")
    cells = suite_cells(suite)
    variants = sum(len(suite.variants(m)) for m in suite.methods)
    assert len(cells) == variants * len(suite.tasks) * len(suite.seeds) * len(suite.faults)
    assert all(c.error is None for c in cells), [c.error for c in cells if c.error]
    registered = set(builtin_names(METHODS))  # an installed plugin's methods are not the suites' business
    for cell in cells:
        if cell.cfg.method in registered:  # the rest are checked once their plugins exist
            engine_check(cell.cfg)
    if name == "mini":
        assert suite.out == "leaderboards/reproduced/mini" and suite.seeds == [0, 1, 2]
        assert set(suite.tasks) == {"digits", "mnist1d"}
        # every registered built-in method is in it, but the control of the missing-modality setting
        # (its suite is suites/multimodal.yaml)
        assert registered - {"naive-shared"} <= set(suite.methods)
        # the task's calibrated protocol, not a suite-wide override
        for field in ("rounds", "batch_size", "lr", "local_epochs", "heldout_fraction"):
            assert {(c.cfg.task, getattr(c.cfg, field)) for c in cells} == \
                {(t, get_task(t).info.defaults[field]) for t in suite.tasks}, field
        assert {c.cfg.pool for c in cells if METHODS.get(c.cfg.method).card.single_architecture} == {"cpu-cnn"}
        assert {c.cfg.public_size for c in cells if METHODS.get(c.cfg.method).card.needs_public} == {200}
    elif name == "multimodal":  # every method that runs the setting, at the task's own protocol
        assert suite.tasks == ["digits-mnist1d"] and suite.seeds == [0, 1, 2]
        able = {m for m in registered if METHODS.get(m).card.missing_modalities}
        assert set(suite.methods) == able
        assert ({(c.cfg.recipient_fraction, c.cfg.missing_modality, c.cfg.pool) for c in cells}
                == {(0.5, "signal", "cpu-mm")})
    elif name == "robustness":
        assert suite.out == "leaderboards/reproduced/robustness" and suite.seeds == [0, 1, 2]
        assert suite.tasks == ["digits"] and len(cells) == 105
        assert {"local", "uniform-kd", "crad", "fedmd", "fedcc", "dfml", "fml"} <= set(suite.methods)
        assert suite.faults == ["", "label-noise:0.3@0.5/symmetric", "byzantine:0.2/random", "byzantine:0.4/random",
                                "free-rider:0.2"]
        for field in ("rounds", "batch_size", "lr", "local_epochs", "heldout_fraction", "clients"):
            assert {getattr(c.cfg, field) for c in cells} == {get_task("digits").info.defaults[field]}, field
        assert {c.cfg.public_size for c in cells} == {200}  # one partition for every cell, as in mini
        # every cell with faults has its baseline in the suite: the same config without faults
        from hfl_bench.config import config_hash
        hashes = {config_hash(vars(c.cfg)) for c in cells if not c.cfg.faults}
        assert all(config_hash(dict(vars(c.cfg), faults="")) in hashes for c in cells if c.cfg.faults)
    elif name == "dfml-controls":  # DFML's controls beside its defaults, at digits' calibrated protocol
        assert suite.out == "leaderboards/reproduced/dfml-controls" and suite.seeds == list(range(10))
        assert suite.methods == ["dfml"] and suite.tasks == ["digits"]
        assert [c.cfg.method_params for c in cells[::10]] == [{}, {"eval": "current"}, {"wsm": False},
                                                              {"alpha_max": 0.0}]
        for field in ("rounds", "batch_size", "lr", "local_epochs", "heldout_fraction", "clients", "alpha", "pool"):
            assert {getattr(c.cfg, field) for c in cells} == {get_task("digits").info.defaults[field]}, field
        assert {c.cfg.public_size for c in cells} == {0}
        # the defaults are digits.yaml's dfml cells: the same config, so the same record names
        digits = {c.record_path().name for c in suite_cells(load_suite(REPO / "suites" / "digits.yaml"))}
        assert {c.record_path().name for c in cells[:10]} <= digits
    elif name in ("crad-ablations", "crad-sweeps"):  # one folder; the base point pairs with both sweeps
        assert suite.out == "leaderboards/reproduced/crad-ablations" and suite.seeds == list(range(10))
        assert suite.methods == ["crad", "uniform-kd"] and suite.tasks == ["digits"]
        assert {c.cfg.public_size for c in cells} == {0}
        if name == "crad-ablations":  # every CRAD rule the registry holds, at digits' defaults
            from hfl_bench.registry import AGGREGATORS

            rules = {c.cfg.method_params.get("aggregator", "crad") for c in cells if c.cfg.method == "crad"}
            assert rules == {n for n in builtin_names(AGGREGATORS) if n.startswith("crad")}
            assert {c.cfg.alpha for c in cells} == {0.3} and {c.cfg.clients for c in cells} == {10}
        else:  # alpha 0.1 / 1.0 at N = 10, and N = 15 / 20 with 10 active, for both methods
            settings = {(c.cfg.alpha, c.cfg.clients, c.cfg.clients_per_round) for c in cells}
            assert settings == {(0.1, 10, None), (1.0, 10, None), (0.3, 15, 10), (0.3, 20, 10)}
    elif name == "pool-size-cifar10-jpg":  # CRAD's Table 3 shape: N = 20, 50, 100, 10 active, on all 50,000 images
        assert suite.out == "leaderboards/reproduced/pool-size-cifar10-jpg" and suite.seeds == list(range(10))
        assert suite.methods == ["crad", "uniform-kd"] and suite.tasks == ["cifar10-jpg-full"]
        assert {(c.cfg.method, c.cfg.clients, c.cfg.clients_per_round) for c in cells} == {
            (m, n, 10) for m in ("crad", "uniform-kd") for n in (20, 50, 100)}
        defaults = get_task("cifar10-jpg-full").info.defaults
        for field in ("rounds", "batch_size", "lr", "local_epochs", "heldout_fraction", "alpha", "pool"):
            assert {getattr(c.cfg, field) for c in cells} == {defaults[field]}, field
        # every cell's partition gives each client a validation and a local test sample (else the run
        # refuses it): drawn from CIFAR-10's training labels as the task loads them, 5,000 a class
        import numpy as np

        from hfl_bench.engine import clients_without_heldout
        from hfl_bench.partition import make_partition

        labels = np.repeat(np.arange(10), 5000)
        for clients, seed in {(c.cfg.clients, c.cfg.seed) for c in cells}:
            drawn = make_partition(labels, clients, "dirichlet", seed=seed,
                                   heldout_fraction=defaults["heldout_fraction"], alpha=defaults["alpha"])
            assert not clients_without_heldout(drawn), (clients, seed)
    elif name == "crad-table1":
        assert suite.seeds == [1024] and set(suite.tasks) == {"cifar10", "cifar100", "pathmnist"}
        assert {c.cfg.pool for c in cells} == {"paper"} and {c.cfg.rounds for c in cells} == {300}
        assert {c.cfg.public_size for c in cells if METHODS.get(c.cfg.method).card.needs_public} == {500}


# --------------------------------------------------------------------------- the CLI, in-process


@pytest.fixture(scope="module")
def mnist1d_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))  # mnist1d generates its cache here once


def _error_text_of(call) -> str:
    try:
        call()
    except Exception as e:  # noqa: BLE001
        return error_text(e)
    raise AssertionError("did not raise")


def test_a_failed_records_traceback_names_no_machine_path():
    import torch

    def here():
        raise ValueError("broken here")

    texts = {"checkout": _error_text_of(here), "package": _error_text_of(lambda: torch.nn.Linear(2, 2)(torch.zeros(3))),
             "stdlib": _error_text_of(lambda: json.loads("{"))}
    assert not [machine_paths(t) for t in texts.values() if machine_paths(t)], texts
    assert 'File "tests/test_matrix.py"' in texts["checkout"]
    assert 'raise ValueError("broken here")' in texts["checkout"]  # each line read before its file was renamed
    assert 'File "torch/nn/modules/linear.py"' in texts["package"]  # from the packages folder
    assert 'File "json/decoder.py"' in texts["stdlib"]  # from the standard library's folder
    assert portable_filename("relative/x.py") == "relative/x.py"
    assert portable_filename("/opt/elsewhere/lib/x.py") == "x.py"  # anywhere else: the file name alone


def test_matrix_runs_resumes_and_records_failures(tmp_path, validator, mnist1d_dir):
    out = tmp_path / "records"
    suite = _write_suite(tmp_path / "small.yaml", methods=["local", "uniform-kd"], tasks=["digits", "mnist1d"],
                         seeds=[0, 1], out=str(out), settings={**SMALL, "data_dir": mnist1d_dir})

    result, stdout = _invoke(str(suite), "--json")  # in-process: --jobs 1, the default
    assert result.exit_code == 0, result.output
    summary = json.loads(stdout)
    assert summary["counts"] == {"ok": 8} and summary["exit_code"] == 0
    assert [(r["task"], r["method"], r["seed"]) for r in summary["cells"]] == [
        (t, m, s) for t in ("digits", "mnist1d") for m in ("local", "uniform-kd") for s in (0, 1)]
    files = sorted(out.glob("*.json"))
    assert len(files) == 8
    for row in summary["cells"]:
        record = json.loads(Path(row["record"]).read_text())
        assert _schema_errors(validator, record) == []
        assert record["status"] == "ok" and record["federation"]["rounds_run"] == 2
        assert (record["config"]["method"], record["config"]["task"], record["config"]["seed"]) == (
            row["method"], row["task"], row["seed"])
        assert row["global_acc"] == record["metrics"]["final"]["global_acc"]  # the headline (results.headline)

    # A rerun skips every cell and leaves the files untouched; the table says so.
    before = _snapshot(out)
    result, stdout = _invoke(str(suite))
    assert result.exit_code == 0, result.output
    assert "8 skipped in" in stdout
    assert _snapshot(out) == before

    # fedavg on the heterogeneous default pool raises a ConfigError at run time, an unknown
    # hyperparameter fails before: both become failed records, the other cells still run or skip.
    suite2 = _write_suite(tmp_path / "failing.yaml", methods=["local", "fedavg", "crad"],
                          method_overrides={"crad": {"method_params": {"no_such_param": 1}}},
                          tasks=["digits"], seeds=[0, 2], out=str(out), settings=SMALL)
    result, stdout = _invoke(str(suite2), "--json")
    assert result.exit_code == 1, result.output
    rows = {(r["method"], r["seed"]): r for r in json.loads(stdout)["cells"]}
    assert rows["local", 0]["status"] == "skipped" and rows["local", 2]["status"] == "ok"
    for key in [("fedavg", 0), ("fedavg", 2), ("crad", 0)]:
        row = rows[key]
        assert row["status"] == "failed", row
        record = json.loads(Path(row["record"]).read_text())
        assert record["status"] == "failed" and record["metrics"] is None
        assert _schema_errors(validator, record) == []
        params = {"method_params": {"no_such_param": 1}} if key[0] == "crad" else {}
        assert Path(row["record"]).name == expected_filename(resolve_cell(
            {**SMALL, **params, "method": key[0], "task": "digits", "seed": key[1], "out": str(out)}).cfg)
    fedavg = json.loads(Path(rows["fedavg", 0]["record"]).read_text())
    assert fedavg["error"].startswith("ConfigError: fedavg needs one architecture")
    assert "Traceback" in fedavg["error"] and fedavg["method"]["fidelity"] == "paper"
    assert 'File "hfl_bench/engine.py"' in fedavg["error"] and not machine_paths(fedavg["error"])  # committable
    unknown = json.loads(Path(rows["crad", 0]["record"]).read_text())
    assert unknown["method"]["fidelity"] == "paper" and unknown["task"]["num_classes"] == 10
    assert "unknown hyperparameter(s) for method 'crad': no_such_param" in rows["crad", 0]["error"]

    # Failed cells are retried on a rerun; the finished ones are not. --dry-run says which.
    result, stdout = _invoke(str(suite2), "--dry-run", "--json")
    assert result.exit_code == 1
    plan = {(r["method"], r["seed"]): r["status"] for r in json.loads(stdout)["cells"]}
    assert plan[("local", 0)] == plan[("local", 2)] == "would skip"
    assert plan[("fedavg", 0)] == "would run"  # its pool problem only shows once clients exist
    assert plan[("crad", 0)] == "would fail"

    # Sizing: a dry run estimates each cell that would run by the median wall time of its records
    # for other seeds here (same task, method and hash); failed records, other tasks and a file that
    # is not a record do not count.
    stem = next(out.glob("digits__local__*__seed0.json")).name.rsplit("__seed", 1)[0]
    (out / f"{stem}__seed9.json").write_text("{not json")
    result, stdout = _invoke(str(suite2), "--seeds", "0-3", "--dry-run", "--json")
    summary = json.loads(stdout)
    rows = {(r["method"], r["seed"]): r for r in summary["cells"]}
    times = [json.loads(p.read_text())["cost"]["wall_time_total_s"] for p in sorted(out.glob("digits__local__*.json"))
             if not p.name.endswith("seed9.json")]
    assert len(times) == 3 and rows["local", 3]["status"] == "would run"
    assert rows["local", 3]["estimated_s"] == round(statistics.median(times), 1)
    assert rows["local", 3]["estimated_from"] == 3 and "estimated_s" not in rows["local", 0]  # skipped: its own
    assert [rows["fedavg", s]["estimated_s"] for s in range(4)] == [None] * 4  # only failed records to go by
    assert summary["estimate"] == {"cells": 1, "seconds": rows["local", 3]["estimated_s"], "without": 4}
    result, stdout = _invoke(str(suite2), "--seeds", "0-3", "--dry-run")
    assert f"~{rows['local', 3]['estimated_s']:.1f}" in stdout
    assert "estimate: about" in " ".join(stdout.split()) and "4 without one" in " ".join(stdout.split())


def test_interrupted_cell_continues_from_its_checkpoint(tmp_path, validator):
    """A matrix killed inside a cell leaves that cell's checkpoint; the rerun continues from it
    and ends with the record an uninterrupted cell writes (timings aside)."""
    from hfl_bench.engine import Simulation

    settings = {"rounds": 4, "clients": 4, "checkpoint_every": 2}
    plain = _write_suite(tmp_path / "plain.yaml", methods=["uniform-kd"], tasks=["digits"], seeds=[0],
                         out=str(tmp_path / "plain"), settings=settings)
    assert _invoke(str(plain), "-q")[0].exit_code == 0
    expected = json.loads(next((tmp_path / "plain").glob("*.json")).read_text())

    suite = _write_suite(tmp_path / "cut.yaml", methods=["uniform-kd"], tasks=["digits"], seeds=[0],
                         out=str(tmp_path / "cut"), settings=settings)
    cfg = suite_cells(load_suite(suite))[0].cfg
    sim = Simulation(cfg)  # the "killed" first attempt: rounds 1-2, then its checkpoint
    for rnd in (1, 2):
        sim.step(rnd)
    sim.save_checkpoint(checkpoint_path(cfg))
    result, stdout = _invoke(str(suite), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(stdout)  # throughput counts only the rounds after the checkpoint
    assert summary["cells"][0]["rounds_now"] == 2 and summary["cell_rounds"] == 2
    record = json.loads(next((tmp_path / "cut").glob("*.json")).read_text())
    assert record["federation"]["resumed_from_rounds"] == [2]
    assert not checkpoint_path(cfg).exists()
    assert _schema_errors(validator, record) == []
    for key in ("metrics", "selection", "config_hash"):
        assert record[key] == expected[key]
    drop = ("seconds", "phases")
    assert [{k: v for k, v in h.items() if k not in drop} for h in record["history"]] == \
        [{k: v for k, v in h.items() if k not in drop} for h in expected["history"]]


# --------------------------------------------------------------------------- local process pool


@pytest.mark.slow  # worker processes
def test_process_pool_executor(tmp_path, validator):
    out = tmp_path / "records"
    suite = _write_suite(tmp_path / "pool.yaml", methods=["local"], tasks=["digits"], seeds=[0, 1],
                         out=str(out), settings=SMALL)
    result, stdout = _invoke(str(suite), "--jobs", "2", "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(stdout)
    assert summary["counts"] == {"ok": 2}
    records = [json.loads(Path(r["record"]).read_text()) for r in summary["cells"]]
    assert [r["config"]["seed"] for r in records] == [0, 1]
    assert all(_schema_errors(validator, r) == [] for r in records)
    assert {r["environment"]["torch_threads"] for r in records} == {1}  # --threads, set in the worker
    assert sorted(p.name for p in out.glob("*.json")) == sorted(Path(r["record"]).name for r in summary["cells"])
    # no GPU here: the cells run on the device their config names (--cells-per-gpu is for CUDA cells)
    assert {r["config"]["device"] for r in records} == {"auto"}
    # throughput: the rounds the cells ran now over the matrix's wall time
    assert [r["rounds_now"] for r in summary["cells"]] == [2, 2] and summary["cell_rounds"] == 4
    assert summary["wall_time_s"] > 0
    assert summary["cell_rounds_per_min"] == pytest.approx(4 / (summary["wall_time_s"] / 60), abs=0.01)


def test_bad_flags_exit_2(tmp_path):
    suite = _write_suite(tmp_path / "s.yaml", methods=["local"], tasks=["digits"], out=str(tmp_path / "o"))
    for args, message in ([("--executor", "dask"), "unknown executor 'dask'. Available: local, pool, ray"],
                          [("--executor", "rey"), "unknown executor 'rey'. Did you mean 'ray'?"],
                          [("--jobs", "0"), "--jobs must be >= 1"],
                          [("--address", "auto"), "--address is for --executor ray, not local"],
                          [("--executor", "pool", "--cpus-per-cell", "2"), "--cpus-per-cell is for --executor ray"]):
        result, _ = _invoke(str(suite), *args)
        assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- Ray


@pytest.fixture
def ray_cluster():
    """A local Ray kept on loopback (environment notes): 2 CPUs, no dashboard, shut down after."""
    # Read when ray is imported: with the node IP below, every Ray socket listens on 127.0.0.1.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray renices its workers to 15 by default: beside the other test workers (xdist) they starved,
    # and two 1-round cells took 380-430 s on two busy cores; at 0 they take about 30 s.
    os.environ["RAY_worker_niceness"] = "0"
    ray = pytest.importorskip("ray")
    context = ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()


@pytest.mark.slow  # Ray and a driver process
@pytest.mark.ray
def test_ray_executor_returns_records_to_the_driver(tmp_path, validator, ray_cluster):
    assert ray_cluster.startswith("127.0.0.1:")
    out = tmp_path / "driver-records"
    suite = _write_suite(tmp_path / "ray.yaml", methods=["local", "uniform-kd"], tasks=["digits"], seeds=[0],
                         out=str(tmp_path / "unused"), settings={**SMALL, "rounds": 1, "device": "cpu"})
    # A separate driver process connects to the running cluster by its address, as on a real cluster.
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run(
        [sys.executable, "-c", "from hfl_bench.cli import main; main()", "matrix", str(suite), "--executor", "ray",
         "--address", ray_cluster, "--out", str(out), "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,  # a guard: about 30 s
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["counts"] == {"ok": 2} and summary["out"] == str(out)
    assert not (tmp_path / "unused").exists()  # --out wins over the suite's folder
    assert sorted(p.name.split("__")[1] for p in out.glob("*.json")) == ["local", "uniform-kd"]
    for row in summary["cells"]:
        record = json.loads(Path(row["record"]).read_text())
        assert Path(row["record"]).parent == out
        assert _schema_errors(validator, record) == []
        assert record["status"] == "ok" and record["federation"]["rounds_run"] == 1
        assert record["environment"]["torch_threads"] == 1  # --cpus-per-cell 1


def test_ray_gpu_request_defaults():
    from hfl_bench.config import RunConfig

    assert cell_gpus(RunConfig(device="cuda"), None, 0) == 1
    assert cell_gpus(RunConfig(device="auto"), None, 8) == 1
    assert cell_gpus(RunConfig(device="auto"), None, 0) == 0
    assert cell_gpus(RunConfig(device="cpu"), None, 8) == 0
    assert cell_gpus(RunConfig(device="cpu"), 0.5, 0) == 0.5
    assert "cluster has 0" in unschedulable(1, 1, {"CPU": 4})
    assert unschedulable(1, 0, {"CPU": 4}) is None


def _limited(gib: int):
    """A subprocess's preexec_fn: at most ``gib`` GiB of address space, so a regression that builds
    a hundred million cells dies of MemoryError instead of eating the machine."""
    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    return limit


@pytest.mark.slow  # the CLI as a process
@pytest.mark.parametrize("where", ["--seeds", "suite"])
def test_a_huge_seed_range_is_refused_before_any_cell_is_built(tmp_path, where):
    """``0-99999999`` (a typo for 0-9): one line with the limit and the hint, exit 2, at once (issue
    47, row 14); it built every cell before, 5 GB and then a MemoryError traceback."""
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "out": str(tmp_path / "r"),
                                    "seeds": "0-99999999" if where == "suite" else [0]}))
    cmd = [sys.executable, "-m", "hfl_bench.cli", "matrix", str(path), "--dry-run"]
    if where == "--seeds":
        cmd += ["--seeds", "0-99999999"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=_limited(3))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert "100,000,000 seeds" in text and "10,000" in text and "typo" in text


def test_seed_and_cell_limits_hold_for_lists_and_products():
    from hfl_bench.matrix.suite import MAX_CELLS, MAX_SEEDS

    base = {"methods": ["local"], "tasks": ["digits"]}
    assert len(parse_suite({**base, "seeds": f"0-{MAX_SEEDS - 1}"}).seeds) == MAX_SEEDS  # the limit itself is fine
    for seeds in (f"0-{MAX_SEEDS}", f"0-{MAX_SEEDS // 2},{MAX_SEEDS}-{2 * MAX_SEEDS}", list(range(MAX_SEEDS + 1))):
        with pytest.raises(ConfigError, match="more than the 10,000 a suite may have"):
            parse_suite({**base, "seeds": seeds})
    methods = ["local", "fedavg", "crad", "fd", "fml", "fedproto", "fedgh", "fedkd", "lg-fedavg", "fedtgp", "dfml"]
    suite = parse_suite({**base, "methods": methods, "seeds": f"0-{MAX_SEEDS - 1}"})
    assert len(methods) * MAX_SEEDS > MAX_CELLS
    with pytest.raises(ConfigError, match="110,000 cells"):
        suite_cells(suite)  # refused before any cell resolves its task


@pytest.mark.slow  # the CLI as a process
def test_a_piped_matrix_prints_a_line_per_finished_cell_before_it_exits(tmp_path):
    """Piped (not a terminal), ``matrix`` talks as ``run`` does: each finished cell is a line on
    stderr (read here while the process still runs), and the running cell's rounds are lines too."""
    suite = _write_suite(tmp_path / "two.yaml", methods=["local", "uniform-kd"], tasks=["digits"], seeds=[0],
                         out=str(tmp_path / "runs"), settings={**SMALL, "rounds": 2, "device": "cpu"})
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("COLUMNS", None)
    proc = subprocess.Popen([sys.executable, "-m", "hfl_bench.cli", "matrix", str(suite)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:  # line by line as it is written
            lines.append(line.rstrip("\n"))
            if line.startswith("cell 1/2 "):
                assert proc.poll() is None  # while the second cell still runs, not at the end
            if line.startswith("cell 2/2 "):
                break
        stdout, rest = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "\n".join(lines) + rest
    finished = [line for line in lines if line.startswith("cell ")]
    assert [line.split(":")[0] for line in finished] == ["cell 1/2 ok", "cell 2/2 ok"], lines
    assert "local on digits, seed 0, global acc" in finished[0] and "uniform-kd on digits" in finished[1]
    assert re.search(r"left [0-9]+:[0-9]{2}:[0-9]{2}$", finished[0])
    assert any(line.startswith("  local on digits, seed 0: round 2/2  val ") for line in lines), lines
    assert "\x1b" not in "".join(lines)  # no escape sequences when piped
    assert "suite " in stdout  # then the summary table
