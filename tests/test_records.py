"""Record files: atomic writes (no temp files, no partial records) and clear load errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hfl_bench import paths
from hfl_bench.paths import record_filename, write_atomic
from hfl_bench.record.io import load_record
from hfl_bench.recording import write_record


def _record(**extra):
    rec = {
        "schema_version": "1.11",  # the current version: load_record reads it back as it is
        "config": {"task": "digits", "method": "local", "seed": 0},
        "config_hash": "0123456789abcdef",
        "status": "ok",
    }
    rec.update(extra)
    return rec


def test_write_atomic_leaves_only_the_target(tmp_path):
    target = tmp_path / "sub" / "rec.json"
    write_atomic(target, "first\n")
    assert target.read_text() == "first\n"
    write_atomic(target, "second\n")  # overwrite in place
    assert target.read_text() == "second\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["rec.json"]


def test_write_atomic_failure_cleans_up_and_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "rec.json"
    target.write_text("old\n")

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(paths.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"  # never half-replaced
    assert [p.name for p in tmp_path.iterdir()] == ["rec.json"]  # no temp file left behind

    fresh = tmp_path / "fresh.json"
    with pytest.raises(OSError):
        write_atomic(fresh, "new\n")
    assert not fresh.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["rec.json"]


def test_write_atomic_failure_in_rename(tmp_path, monkeypatch):
    target = tmp_path / "rec.json"

    def broken_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(paths.os, "replace", broken_replace)
    with pytest.raises(OSError, match="rename failed"):
        write_atomic(target, "x")
    assert list(tmp_path.iterdir()) == []


def test_write_record_round_trip(tmp_path):
    rec = _record(metrics={"global_acc": 12.5})
    path = write_record(rec, tmp_path / "runs")
    assert path.name == record_filename(rec) == "digits__local__0123456789abcdef__seed0.json"
    assert path.read_text().endswith("\n")
    assert load_record(path) == rec
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_write_record_rejects_non_finite_without_a_file(tmp_path, bad):
    out = tmp_path / "runs"
    rec = _record(metrics={"global_acc": bad})
    with pytest.raises(ValueError):
        write_record(rec, out)
    assert not (out / record_filename(rec)).exists()
    assert not out.exists() or list(out.iterdir()) == []


def test_write_record_keeps_previous_record_on_failure(tmp_path):
    out = tmp_path / "runs"
    good = write_record(_record(metrics={"global_acc": 1.0}), out)
    before = good.read_text()
    with pytest.raises(ValueError):
        write_record(_record(metrics={"global_acc": float("nan")}), out)  # same file name
    assert good.read_text() == before
    assert [p.name for p in out.iterdir()] == [good.name]


@pytest.mark.parametrize("content", ['{"hello": 1}', "[1, 2, 3]", '"schema_version"', "42", "null"])
def test_load_record_rejects_non_records(tmp_path, content):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="not an hfl-bench record") as e:
        load_record(path)
    assert str(path) in str(e.value)


def test_load_record_invalid_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON") as e:
        load_record(path)
    assert str(path) in str(e.value)
    assert not isinstance(e.value, json.JSONDecodeError)  # a clean message, not the raw parser error


def test_load_record_missing(tmp_path):
    with pytest.raises(ValueError, match="record not found"):
        load_record(tmp_path / "missing.json")


def test_load_record_accepts_minimal(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"schema_version": "1.0"}))
    assert load_record(path) == {"schema_version": "1.11"}  # upgraded to the current version: nothing to fill
    assert os.listdir(tmp_path) == ["x.json"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_load_record_rejects_non_finite_numbers(tmp_path, literal):
    path = tmp_path / "x.json"
    path.write_text('{"schema_version": "1.0", "metrics": {"global_acc": %s}}' % literal)
    with pytest.raises(ValueError, match="is not valid JSON") as e:
        load_record(path)
    assert str(path) in str(e.value)


def test_strict_record_turns_non_finite_numbers_into_a_failed_record():
    from hfl_bench.recording import strict_record

    rec = _record(metrics={"global_acc": float("nan"), "per_client": [{"val_acc": float("inf")}]}, error=None)
    strict = strict_record(rec)
    assert strict["status"] == "failed" and strict["metrics"]["global_acc"] is None
    assert "metrics/global_acc" in strict["error"] and "metrics/per_client/0/val_acc" in strict["error"]
    assert json.loads(json.dumps(strict, allow_nan=False)) == strict
    assert strict_record(_record(metrics={"global_acc": 1.0})) == _record(metrics={"global_acc": 1.0})


def test_an_ok_record_without_its_headline_figures_is_invalid():
    from hfl_bench.record.check import problems as record_problems

    real = Path(__file__).resolve().parent.parent / "leaderboards" / "archive" / "first-wave" / "digits"
    record = json.loads(next(real.glob("digits__crad__*.json")).read_text())
    assert record_problems(record) == []
    no_metrics = dict(record, metrics=None)
    assert "metrics: status ok, but the record has no metrics" in record_problems(no_metrics)
    null_figure = json.loads(json.dumps(record))
    null_figure["metrics"]["global_acc"] = None
    assert "metrics/global_acc: status ok, but it is null or missing" in record_problems(null_figure)
    failed = dict(no_metrics, status="failed")  # a failed run has no figures, and says so
    assert not [p for p in record_problems(failed) if "status ok" in p]


# ----------------------------------------------------------------------------- no machine paths


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("runs", "runs"),
    ("../elsewhere/runs", "../elsewhere/runs"),
    ("{cwd}/leaderboards/reproduced/mini", "leaderboards/reproduced/mini"),
    ("{cwd}", "."),
    ("{outside}/runs", "<out folder>"),
])
def test_portable_path(tmp_path, value, expected):
    cwd, outside = tmp_path / "project", tmp_path / "elsewhere"
    cwd.mkdir()
    value = value.format(cwd=cwd, outside=outside) if value else value
    assert paths.portable_path(value, "<out folder>", cwd) == expected


def test_a_record_stores_no_machine_path(tmp_path, monkeypatch):
    """Through the real CLI: --out inside the working folder is stored relative to it, --out and
    --data-dir outside it by their role; the config hash does not depend on either."""
    from typer.testing import CliRunner

    from hfl_bench.cli import app

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    args = ["run", "--method", "local", "--task", "digits", "--clients", "3", "--rounds", "1", "--json"]
    runs = {"inside": [*args, "--out", str(project / "runs" / "a")],
            "outside": [*args, "--out", str(tmp_path / "elsewhere"), "--data-dir", str(tmp_path / "data")]}
    records = {}
    for name, argv in runs.items():
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        text = Path(json.loads(result.stdout)["record"]).read_text()
        assert str(tmp_path) not in text
        records[name] = json.loads(text)
    assert records["inside"]["config"]["out"] == "runs/a"
    assert records["inside"]["config"]["data_dir"] is None
    assert records["outside"]["config"]["out"] == "<out folder>"
    assert records["outside"]["config"]["data_dir"] == "<data folder>"
    assert records["inside"]["config_hash"] == records["outside"]["config_hash"]
