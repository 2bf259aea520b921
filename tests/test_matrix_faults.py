"""No finished run lost, no cell stopping the others, no record outside --out, no record of other
data taken for this one: ``run`` and ``matrix`` under a bad --out, a full disk (an OSError(ENOSPC)
from the writer, in process), a record with NaN in it, a suite that names ``x/../../elsewhere``
and a finished record of other data or of another method version. (Ctrl-C and a killed driver:
tests/test_interrupts.py.)

Unwritable folders are made with a path under a regular file (``--out somefile/sub``) and by
monkeypatching the writer, not with chmod: as root, permission bits do not stop writes."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import yaml

from hfl_bench import paths
from hfl_bench import recording as records
from hfl_bench.config import RunConfig
from hfl_bench.matrix import resume
from hfl_bench.matrix.runner import run_matrix
from hfl_bench.matrix.suite import Cell, load_suite, suite_cells
from hfl_bench.record.check import problems as record_problems

from helpers import invoke_cli

TINY = ["--task", "digits", "--clients", "4", "--rounds", "1", "--method", "local"]
SMALL = {"rounds": 1, "clients": 4}


def _invoke(*args: str):
    return invoke_cli(*args)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _suite(tmp_path: Path, out: Path, **suite) -> Path:
    path = tmp_path / "suite.yaml"
    data = {"methods": ["local"], "tasks": ["digits"], "seeds": [0], "out": str(out), "settings": SMALL}
    data.update(suite)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if anything starts training."""
    from hfl_bench import engine

    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(engine, "run", refuse)


@pytest.fixture
def unsaved(tmp_path, monkeypatch) -> Path:
    """The fallback folder of unsaved records, inside the test's folder."""
    folder = tmp_path / "unsaved"
    monkeypatch.setattr(records, "unsaved_dirs", lambda: [folder])
    return folder


def _disk_full_for(monkeypatch, predicate) -> None:
    """Writing a record whose path satisfies ``predicate`` raises OSError(ENOSPC)."""
    real = records.write_atomic

    def write(path, data):
        if predicate(Path(path)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(records, "write_atomic", write)


# ----------------------------------------------------------------------------- --out checked first


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_run_refuses_a_bad_out_before_training(tmp_path, no_training, where):
    afile = tmp_path / "somefile"
    afile.write_text("not a folder")
    out = afile if where == "file" else afile / "sub"
    result, stdout, stderr = _invoke("run", *TINY, "--out", str(out), "-q")
    assert result.exit_code == 2, (result.exception, stdout, stderr)
    [line] = _lines(stdout + stderr)
    assert line.startswith("error: --out ") and str(out) in line


def test_matrix_refuses_a_bad_out_before_any_cell(tmp_path, no_training):
    afile = tmp_path / "somefile"
    afile.write_text("x")
    suite = _suite(tmp_path, afile / "sub")
    for extra in ([], ["--dry-run"]):
        result, stdout, stderr = _invoke("matrix", str(suite), *extra)
        assert result.exit_code == 2, (stdout, stderr)
        [line] = _lines(stdout + stderr)
        assert line.startswith("error: --out ") and "somefile" in line


def test_out_dir_check_creates_and_refuses():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        made = paths.check_out_dir(Path(d) / "a" / "b")
        assert made.is_dir() and list(made.iterdir()) == []  # the probe file is gone
        assert paths.check_out_dir(Path(d) / "x" / "y", create=False) == Path(d) / "x" / "y"
        assert not (Path(d) / "x").exists()  # a dry check creates nothing
        (Path(d) / "f").write_text("")
        with pytest.raises(paths.OutDirError, match="is a file"):
            paths.check_out_dir(Path(d) / "f")
        with pytest.raises(paths.OutDirError):
            paths.check_out_dir(Path(d) / "f" / "sub", create=False)


# ----------------------------------------------------------------------------- a finished run is never lost


def test_run_disk_full_saves_the_record_elsewhere(tmp_path, monkeypatch, unsaved):
    out = tmp_path / "runs"
    _disk_full_for(monkeypatch, lambda p: p.parent == out)
    result, stdout, stderr = _invoke("run", *TINY, "--out", str(out), "--json", "-q")
    assert result.exit_code == 1, (result.exception, stdout, stderr)
    [line] = _lines(stderr)
    assert line.startswith(f"error: the record could not be written to {out}") and "No space left on device" in line
    [saved] = list(unsaved.rglob("*.json"))
    assert f"saved to {saved} instead" in line
    assert json.loads(stdout)["record"] == str(saved)
    record = json.loads(saved.read_text())
    assert record["status"] == "ok" and record_problems(record) == []
    assert saved.name == paths.record_filename(record)  # moving it back into --out is all it takes
    assert not list(out.glob("*.json"))


def test_run_with_nowhere_to_write_prints_the_record(tmp_path, monkeypatch, unsaved):
    _disk_full_for(monkeypatch, lambda p: True)
    result, stdout, stderr = _invoke("run", *TINY, "--out", str(tmp_path / "runs"), "-q")
    assert result.exit_code == 1
    [line] = _lines(stderr)
    assert "nor to a fallback folder" in line and "printed above" in line
    record = json.loads(stdout)
    assert record["status"] == "ok" and record["metrics"]["global_acc"] is not None


def test_run_record_with_nan_is_written_as_failed(tmp_path, monkeypatch):
    build = records.build_record

    def with_nan(cfg, result, *args):
        record = build(cfg, result, *args)
        record["metrics"]["global_acc"] = float("nan")
        record["history"][1]["loss"] = float("inf")
        return record

    monkeypatch.setattr(records, "build_record", with_nan)
    out = tmp_path / "runs"
    result, stdout, stderr = _invoke("run", *TINY, "--out", str(out), "-q")
    assert result.exit_code == 1, (result.exception, stdout, stderr)
    [path] = list(out.glob("*.json"))
    record = json.loads(path.read_text())
    assert record["status"] == "failed" and record["metrics"]["global_acc"] is None
    assert "metrics/global_acc" in record["error"] and "history/1/loss" in record["error"]
    assert record_problems(record) == []
    assert "run failed: record had non-finite numbers" in stderr


# ----------------------------------------------------------------------------- one cell never stops the others


def test_matrix_cells_are_isolated(tmp_path, monkeypatch, unsaved):
    """Seed 1's record cannot be written anywhere, seed 2's holds a NaN: both cells fail, every
    other cell completes, and the rerun retries exactly the failed ones."""
    out = tmp_path / "records"
    suite = _suite(tmp_path, out, seeds=[0, 1, 2, 3])
    _disk_full_for(monkeypatch, lambda p: p.name.endswith("__seed1.json"))
    build = records.build_record

    def nan_for_seed2(cfg, result, *args):
        record = build(cfg, result, *args)
        if cfg.seed == 2:
            record["metrics"]["local_acc"] = float("nan")
        return record

    monkeypatch.setattr(records, "build_record", nan_for_seed2)
    result, stdout, stderr = _invoke("matrix", str(suite), "--json")
    assert result.exit_code == 1, (result.exception, stdout, stderr)
    rows = {r["seed"]: r for r in json.loads(stdout)["cells"]}
    assert [rows[s]["status"] for s in (0, 1, 2, 3)] == ["ok", "failed", "failed", "ok"]
    assert rows[1]["error"].startswith("record could not be written to ")
    assert "nor to a fallback folder" in rows[1]["error"]
    assert rows[1]["record"] is None
    assert "non-finite" in rows[2]["error"] and "metrics/local_acc" in rows[2]["error"]
    failed = json.loads(Path(rows[2]["record"]).read_text())
    assert failed["status"] == "failed" and record_problems(failed) == []
    assert sorted(p.name[-10:] for p in out.glob("*.json")) == ["seed0.json", "seed2.json", "seed3.json"]

    # The human summary says the same, one line per failed cell.
    monkeypatch.undo()
    result, stdout, stderr = _invoke("matrix", str(suite), "--dry-run", "--json")
    plan = {r["seed"]: r["status"] for r in json.loads(stdout)["cells"]}
    assert plan == {0: "would skip", 1: "would run", 2: "would run", 3: "would skip"}


def test_matrix_record_lands_in_the_fallback_folder(tmp_path, monkeypatch, unsaved):
    out = tmp_path / "records"
    suite = _suite(tmp_path, out, seeds=[0, 1])
    _disk_full_for(monkeypatch, lambda p: p.parent == out and p.name.endswith("__seed0.json"))
    result, stdout, stderr = _invoke("matrix", str(suite), "-q")
    assert result.exit_code == 1
    [saved] = list(unsaved.rglob("*.json"))
    assert json.loads(saved.read_text())["status"] == "ok"
    [line] = [ln for ln in _lines(stderr) if ln.startswith("failed:")]
    assert "seed 0" in line and f"saved to {saved} instead" in line
    assert [p.name[-10:] for p in out.glob("*.json")] == ["seed1.json"]


def test_a_failed_record_never_replaces_a_finished_one(tmp_path):
    cfg = RunConfig(method="local", task="digits", clients=4, rounds=1, seed=0, pool="cpu", partition="dirichlet",
                    alpha=0.3, out=str(tmp_path))
    ok = dict(records.build_failed_record(cfg, "x"), status="ok", error=None)
    path = records.write_record(ok, tmp_path)
    saved = records.save_record(records.build_failed_record(cfg, "boom"), tmp_path, keep_final=True)
    assert saved.path is None and saved.problem.startswith("not written: the finished record")
    assert "was kept" in saved.problem
    assert json.loads(path.read_text())["status"] == "ok"


# ----------------------------------------------------------------------------- names that would leave --out


def test_suite_with_a_traversing_name_is_refused(tmp_path, no_training):
    out = tmp_path / "deep" / "records"
    suite = _suite(tmp_path, out, methods=["local", "x/../../elsewhere/evil"])
    result, stdout, stderr = _invoke("matrix", str(suite))
    assert result.exit_code == 2
    [line] = _lines(stdout + stderr)
    assert "methods: method name 'x/../../elsewhere/evil' cannot name a record file" in line
    assert not (tmp_path / "elsewhere").exists() and not out.exists()


def test_a_cell_with_a_traversing_name_fails_alone(tmp_path):
    """Past the suite check (a hand-built cell): its record is not written anywhere, the summary
    says so, and the other cell completes."""
    out = tmp_path / "deep" / "records"
    good = suite_cells(load_suite(_suite(tmp_path, out)))[0]
    bad = Cell(RunConfig(**{**good.cfg.__dict__, "method": "../../../elsewhere/evil"}))
    rows = run_matrix([bad, good])
    assert rows[0]["status"] == "failed" and "cannot name a record file" in rows[0]["error"]
    assert rows[0]["record"] is None and rows[1]["status"] == "ok"
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json")] == [
        Path(rows[1]["record"]).relative_to(tmp_path).as_posix()]


@pytest.mark.parametrize("task, method, chash, seed", [
    ("digits", "x/../../evil", "0123456789abcdef", 0),
    ("..", "local", "0123456789abcdef", 0),
    ("digits", ".hidden", "0123456789abcdef", 0),
    ("digits", "local", "../0123", 0),
    ("digits", "local", "0123456789abcdef", "0/../../x"),
    ("digits", "a\nb", "0123456789abcdef", 0),
])
def test_record_names_are_built_from_checked_parts(tmp_path, task, method, chash, seed):
    record = {"schema_version": "1.0", "status": "ok", "config_hash": chash,
              "config": {"task": task, "method": method, "seed": seed}}
    with pytest.raises(paths.UnsafePathError):
        records.write_record(record, tmp_path / "out")
    assert not list(tmp_path.rglob("*.json"))


def test_a_record_path_resolving_outside_out_is_refused(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere.json"
    out.mkdir()
    record = {"schema_version": "1.0", "status": "ok", "config_hash": "0123456789abcdef",
              "config": {"task": "digits", "method": "local", "seed": 0}}
    (out / paths.record_filename(record)).symlink_to(elsewhere)  # a planted link
    with pytest.raises(paths.UnsafePathError, match="outside the output folder"):
        records.write_record(record, out)
    assert not elsewhere.exists()


# ----------------------------------------------------------------------------- data identity, method version


def _other_data(path: Path) -> str:
    record = json.loads(path.read_text())
    assert len(record["task"]["data_fingerprint"]) == 16  # the engine's TaskData.fingerprint
    other = "f" * 16 if record["task"]["data_fingerprint"] != "f" * 16 else "e" * 16
    record["task"]["data_fingerprint"] = other
    path.write_text(json.dumps(record, indent=1))
    return path.read_text()


def _other_version(path: Path) -> str:
    """Make ``path`` a record of the same setting from another version of its method."""
    record = json.loads(path.read_text())
    assert record["method"]["version"] == "1.0"  # local's version, the one this code registers
    record["method"]["version"] = "0.9"
    path.write_text(json.dumps(record, indent=1))
    return path.read_text()


OTHER_KINDS = [(_other_data, "holds a record of other data"),
               (_other_version, "holds this setting's result from local 0.9, but this code's local is 1.0")]


@pytest.mark.parametrize("change, says", OTHER_KINDS, ids=["other-data", "other-method-version"])
def test_matrix_neither_skips_nor_replaces_a_finished_record_of_another_kind(tmp_path, change, says):
    out = tmp_path / "records"
    suite = _suite(tmp_path, out)
    assert _invoke("matrix", str(suite), "-q")[0].exit_code == 0
    [path] = list(out.glob("*.json"))
    result, stdout, _ = _invoke("matrix", str(suite), "--json")
    assert json.loads(stdout)["counts"] == {"skipped": 1}  # same data and version: skipped
    before = change(path)
    result, stdout, stderr = _invoke("matrix", str(suite))
    assert result.exit_code == 1
    [line] = [ln for ln in _lines(stderr) if ln.startswith("failed:")]
    assert f"{path} {says}" in line and "use another --out" in line
    assert path.read_text() == before
    result, stdout, _ = _invoke("matrix", str(suite), "--dry-run", "--json")
    [row] = json.loads(stdout)["cells"]
    assert row["status"] == "would fail" and says in row["error"]
    path.rename(tmp_path / "archived.json")  # moved away: the cell runs again
    assert _invoke("matrix", str(suite), "-q")[0].exit_code == 0 and path.read_text() != before


@pytest.mark.parametrize("change, says", OTHER_KINDS, ids=["other-data", "other-method-version"])
def test_run_refuses_to_overwrite_a_finished_record_of_another_kind(tmp_path, monkeypatch, change, says):
    out = tmp_path / "runs"
    assert _invoke("run", *TINY, "--out", str(out), "-q")[0].exit_code == 0
    [path] = list(out.glob("*.json"))
    before = change(path)
    from hfl_bench import engine

    monkeypatch.setattr(engine, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("training started")))
    result, stdout, stderr = _invoke("run", *TINY, "--out", str(out), "-q")
    assert result.exit_code == 2
    [line] = _lines(stdout + stderr)
    assert line.startswith(f"error: {path} {says}")
    assert path.read_text() == before


def test_a_fingerprint_that_raises_runs_the_cell(tmp_path, monkeypatch):
    out = tmp_path / "records"
    cell = suite_cells(load_suite(_suite(tmp_path, out)))[0]
    rows = run_matrix([cell])
    assert rows[0]["status"] == "ok"
    _other_data(Path(rows[0]["record"]))
    assert resume.existing_record(cell).conflict is not None

    def missing(cfg):
        raise FileNotFoundError("data gone")

    monkeypatch.setattr(resume, "data_fingerprint", missing)
    assert resume.existing_record(cell) == resume.Existing()  # to run: it fails as a run without data fails
