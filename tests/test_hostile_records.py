"""Records read defensively (issue 28): a file nested too deep is listed as skipped (never a
RecursionError) by validate, show, html, plot and matrix --dry-run; a record whose config.seed is
a list, a string or null is refused as invalid with the reason (never a crash, never an extra
seed); file names from record text are bounded; records of different class counts draw; with
every client faulty the table, CSV and JSON count the same seeds."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from helpers import REAL_RECORD, invoke_cli

REPO = Path(__file__).resolve().parent.parent
REAL = REAL_RECORD
FAULTY = REPO / "leaderboards" / "reproduced" / "robustness" / "digits__local__15cc72945c7fa83f__seed0.json"
DEEP = "[" * 100_000 + "]" * 100_000  # past what Python's parser can nest
DEEP_ENOUGH = '{"schema_version": "1.2", "x": ' + "[" * 500 + "]" * 500 + "}"  # parses, but no record nests so


def _clean(result) -> None:
    assert "Traceback" not in result.output and "RecursionError" not in result.output, result.output[-2000:]


@pytest.mark.parametrize("text", [DEEP, DEEP_ENOUGH], ids=["unparseable", "parseable"])
@pytest.mark.parametrize("command", ["validate", "show", "html", "plot", "show-one"])
def test_a_deeply_nested_file_is_skipped(tmp_path, text, command):
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / REAL.name).write_bytes(REAL.read_bytes())
    (folder / "deep.json").write_text(text)
    args = {"validate": ["leaderboard", "validate", str(folder)], "show": ["leaderboard", "show", str(folder)],
            "html": ["leaderboard", "html", str(tmp_path / "site"), str(folder)],
            "plot": ["plot", "all", str(folder), "--out", str(tmp_path / "plots")],
            "show-one": ["show", str(folder / "deep.json")]}[command]
    result, _, _ = invoke_cli(*args)
    _clean(result)
    text_out = "".join(result.output.split())  # tables wrap long cells
    assert "deep" in text_out and "nested" in text_out
    assert result.exit_code == {"validate": 1, "show-one": 2}.get(command, 0), result.output


def test_matrix_dry_run_with_a_deeply_nested_file_at_a_cells_record(tmp_path):
    out = tmp_path / "records"
    out.mkdir()
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"methods": ["local"], "tasks": ["digits"], "seeds": [0], "out": str(out),
                                     "settings": {"rounds": 1, "clients": 2}}))
    result, stdout, _ = invoke_cli("matrix", str(suite), "--dry-run", "--json")
    [row] = json.loads(stdout)["cells"]
    Path(row["record"]).write_text(DEEP)
    result, stdout, _ = invoke_cli("matrix", str(suite), "--dry-run", "--json")
    _clean(result)
    assert result.exit_code == 0 and json.loads(stdout)["cells"][0]["status"] == "would run"


def _copy(seed, **changes) -> dict:
    r = json.loads(REAL.read_text())
    r["config"]["seed"] = seed
    r.update(changes)
    return r


@pytest.mark.parametrize("seed", [[0, 1], "0", None, True, -1], ids=["list", "string", "null", "bool", "negative"])
def test_a_record_whose_seed_is_not_an_integer_is_refused_with_the_reason(tmp_path, seed):
    (tmp_path / "good.json").write_text(REAL.read_text())
    (tmp_path / "bad.json").write_text(json.dumps(_copy(seed, record_id="f" * 16)))
    result, stdout, stderr = invoke_cli("leaderboard", "validate", str(tmp_path))
    assert result.exit_code == 1 and "config/seed: must be an integer" in result.output + stderr
    for args in (["leaderboard", "show", str(tmp_path), "--format", "json"],
                 ["leaderboard", "show", str(tmp_path), "--rank", "--format", "json"]):
        result, stdout, stderr = invoke_cli(*args)
        _clean(result)
        assert result.exit_code == 0 and "config/seed" in result.output + stderr
    result, stdout, _ = invoke_cli("leaderboard", "show", str(tmp_path), "--format", "json")
    assert [g["n_seeds"] for g in json.loads(stdout)["groups"]] == [1]  # a copy is not another seed
    result, _, _ = invoke_cli("plot", "all", str(tmp_path), "--out", str(tmp_path / "plots"))
    _clean(result)
    assert result.exit_code == 0


def test_a_failed_record_may_have_no_seed(tmp_path):
    record = _copy(None, status="failed", error="ConfigError: unknown task", metrics=None)
    (tmp_path / "failed.json").write_text(json.dumps(record))
    result, stdout, stderr = invoke_cli("leaderboard", "validate", str(tmp_path))
    assert "config/seed" not in result.output + stderr


def test_a_long_task_name_makes_bounded_file_names(tmp_path):
    name = "t" * 300
    record = _copy(0)
    record["task"]["name"] = record["config"]["task"] = name
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "r.json").write_text(json.dumps(record))
    result, _, _ = invoke_cli("plot", "all", str(tmp_path / "in"), "--out", str(tmp_path / "plots"))
    _clean(result)
    assert result.exit_code == 0
    result, _, _ = invoke_cli("leaderboard", "html", str(tmp_path / "site"), str(tmp_path / "in"))
    _clean(result)
    assert result.exit_code == 0
    written = list((tmp_path / "plots").iterdir()) + list((tmp_path / "site").rglob("*"))
    assert any(p.name.endswith(".png") for p in written) and max(len(p.name) for p in written) <= 120


def _classes(record: dict, n: int, fingerprint: str) -> dict:
    r = copy.deepcopy(record)
    r["task"]["num_classes"], r["task"]["data_fingerprint"] = n, fingerprint
    r["metrics"]["per_class_global_acc"] = r["metrics"]["per_class_global_acc"][:n]
    for key in ("train_counts", "val_counts"):
        r["partition"][key] = [row[:n] for row in r["partition"][key]]
    return r


@pytest.mark.parametrize("same_fingerprint", [True, False], ids=["one-group", "two-data"])
def test_records_of_different_class_counts_draw_and_rank_apart(tmp_path, same_fingerprint):
    (tmp_path / "in").mkdir()
    base = _copy(0)
    (tmp_path / "in" / "ten.json").write_text(json.dumps(_classes(base, 10, "a" * 16)))
    three = _classes(dict(_copy(1), record_id="1" * 16), 3, "a" * 16 if same_fingerprint else "b" * 16)
    (tmp_path / "in" / "three.json").write_text(json.dumps(three))
    for args in (["plot", "per-class", str(tmp_path / "in"), "--out", str(tmp_path / "p1")],
                 ["plot", "all", str(tmp_path / "in"), "--out", str(tmp_path / "p2")],
                 ["leaderboard", "html", str(tmp_path / "site"), str(tmp_path / "in")]):
        result, _, _ = invoke_cli(*args)
        _clean(result)
        assert result.exit_code == 0, result.output[-2000:]
    assert list((tmp_path / "p1").glob("per*class__digits.png"))
    result, stdout, _ = invoke_cli("leaderboard", "show", str(tmp_path / "in"), "--format", "markdown")
    rows = [line for line in stdout.splitlines() if line.startswith("| crad")]
    if not same_fingerprint:  # two data identities: two groups, told apart by their data
        assert len(rows) == 2 and "data=aaaaaaaa classes=10" in rows[0] + rows[1]
        assert "data=bbbbbbbb classes=3" in rows[0] + rows[1]


def test_runs_on_two_image_folders_are_two_protocols(tmp_path):
    """A 2-class folder is never ranked against a 7-class one under one task name."""
    base = _copy(0)
    for method, fingerprint, n, acc in (("crad", "a" * 16, 10, 60.0), ("local", "b" * 16, 3, 90.0),
                                        ("crad", "b" * 16, 3, 80.0)):
        r = _classes(base, n, fingerprint)
        r["method"]["name"] = r["config"]["method"] = method
        r["config_hash"] = ("1" if method == "crad" else "2") * 16
        r["metrics"]["global_acc"] = acc
        (tmp_path / f"{method}-{n}.json").write_text(json.dumps(r))
    result, stdout, _ = invoke_cli("leaderboard", "show", str(tmp_path), "--rank", "--format", "json")
    ranked = {r["method"]: r["ranks"] for r in json.loads(stdout)["rank"]}
    assert [r["n_methods"] for r in ranked["crad"]] == [2]  # only the 3-class protocol has two methods
    assert "data=bbbbbbbb classes=3" in ranked["crad"][0]["protocol"]
    assert ranked["local"][0]["rank"] == 1.0 and ranked["crad"][0]["rank"] == 2.0


def test_every_client_faulty_counts_the_same_seeds_in_table_csv_and_json(tmp_path):
    r = json.loads(FAULTY.read_text())
    n = r["federation"]["n_clients"]
    r["faults"]["faulty_clients"], r["faults"]["honest_clients"] = list(range(n)), []
    r["metrics"]["honest"] = {"n_clients": 0, "global_acc": None, "local_acc": None, "mean_val_acc": None}
    (tmp_path / "r.json").write_text(json.dumps(r))
    result, stdout, _ = invoke_cli("leaderboard", "show", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    [group] = json.loads(stdout)["groups"]
    _, csv_text, _ = invoke_cli("leaderboard", "show", str(tmp_path), "--format", "csv")
    [row] = [row for row in csv.DictReader(io.StringIO(csv_text)) if row.get("group_id")]
    _, markdown, _ = invoke_cli("leaderboard", "show", str(tmp_path), "--format", "markdown", "--columns", "all")
    table_row = next(line for line in markdown.splitlines() if line.startswith("| local"))
    columns = [c.strip() for c in markdown.splitlines()[2].strip("|").split("|")]  # after the section's label
    seeds = [c.strip() for c in table_row.strip("|").split("|")][columns.index("seeds")]
    assert group["n_seeds"] == int(row["n_seeds"]) == int(seeds) == 1
