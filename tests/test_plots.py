"""``hfl-bench plot`` through the real CLI, drawn from real records of leaderboards/archive/first-wave/digits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hfl_bench.cli import app

DIGITS = Path(__file__).resolve().parent.parent / "leaderboards" / "archive" / "first-wave" / "digits"
# Two methods with two seeds each (one group of seeds per method) and one single-seed method
# that sends no bytes (drawn as a reference line on the bytes plot).
REAL = [
    "digits__crad__da48ac8fb4f0dad1__seed0.json",
    "digits__crad__da48ac8fb4f0dad1__seed1.json",
    "digits__fml__ad769b2585dd3bfd__seed0.json",
    "digits__fml__ad769b2585dd3bfd__seed1.json",
    "digits__local__eb2fa9c945b44fa6__seed0.json",
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURE_PIXELS = (715, 1210)  # 6.5 x 11 inches at 110 dpi (plots.render)


def _stdout(result) -> str:
    return getattr(result, "stdout", result.output)


def _copy_real(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(DIGITS / name, folder / name)) for name in REAL]


def _variant(src: Path, dst: Path, **changes) -> Path:
    """A copy of a real record with some fields changed (and its own record id)."""
    record = json.loads(src.read_text())
    for dotted, value in changes.items():
        node = record
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    dst.write_text(json.dumps(record))
    return dst


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict:
    """A folder of five real ok records, one failed record and one JSON file that is no record."""
    root = tmp_path_factory.mktemp("records")
    ok = _copy_real(root / "digits")
    failed = _variant(ok[0], root / "digits" / "failed.json", status="failed", error="diverged at round 3",
                      record_id="f" * 16)
    (root / "notes.json").write_text(json.dumps({"hello": "not a record"}))
    return {"root": root, "ok": ok, "failed": failed}


@pytest.fixture(scope="module")
def plotted(records, tmp_path_factory) -> dict:
    """`hfl-bench plot all` once over the folder; every kind's test reads what it wrote."""
    out = tmp_path_factory.mktemp("plots")
    result = CliRunner().invoke(app, ["plot", "all", str(records["root"]), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return {"out": out, "summary": json.loads(_stdout(result))}


def _assert_valid_png(path: Path) -> None:
    import matplotlib.image

    data = path.read_bytes()
    assert len(data) > 10_000 and data[:8] == PNG_SIGNATURE
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == FIGURE_PIXELS
    assert pixels.std() > 0  # not a blank canvas


@pytest.mark.parametrize("kind", ["curves", "per-class", "per-arch", "bytes"])
def test_all_writes_each_kind_with_its_sources(kind, records, plotted):
    written = {w["kind"]: w for w in plotted["summary"]["written"]}
    assert set(written) == {"curves", "per-class", "per-arch", "bytes"}
    entry = written[kind]
    png = Path(entry["png"])
    assert png == plotted["out"] / f"{kind}__digits.png" and entry["task"] == "digits"
    _assert_valid_png(png)
    sources = json.loads(Path(entry["sources"]).read_text())
    assert Path(entry["sources"]).name == png.name + ".sources.json"
    drawn = {Path(r["file"]).resolve() for r in sources["records"]}
    assert drawn == {p.resolve() for p in records["ok"]}  # exactly the ok records, the failed one left out
    expected_ids = {json.loads(p.read_text())["record_id"] for p in records["ok"]}
    assert {r["record_id"] for r in sources["records"]} == expected_ids
    assert sources["n_records"] == entry["n_records"] == 5
    # seeds group by (method, config hash): crad and fml have two seeds each, local one
    assert {g["method"]: g["seeds"] for g in sources["groups"]} == {"crad": [0, 1], "fml": [0, 1], "local": [0]}
    assert "Drawn from 5 records (status ok) of task digits" in sources["caption"]
    reasons = {Path(s["file"]).name: s["reason"] for s in sources["skipped"]}
    assert "failed.json" in reasons and "status 'failed'" in reasons["failed.json"]
    no_tmp = [p.name for p in plotted["out"].iterdir() if p.name.endswith(".tmp")]
    assert not no_tmp


def test_skipped_files_are_reported(records, plotted):
    reasons = {Path(s["file"]).name: s["reason"] for s in plotted["summary"]["skipped"]}
    assert reasons["notes.json"] == "not an hfl-bench record"
    assert "status 'failed'" in reasons["failed.json"]


def test_a_folder_with_plots_beside_its_records_reads_only_the_records(records, plotted, tmp_path):
    """Plot sidecars (``*.png.sources.json``) found under a folder are not records: validate, show
    and plot leave them out instead of reporting them; one named explicitly is still refused."""
    folder = tmp_path / "with-plots"
    shutil.copytree(records["root"] / "digits", folder / "records")
    shutil.copytree(plotted["out"], folder / "plots")
    sidecars = sorted((folder / "plots").glob("*.sources.json"))
    assert sidecars
    validated = CliRunner().invoke(app, ["leaderboard", "validate", str(folder)])
    assert "sources.json" not in validated.output and "records valid" in validated.output
    shown = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "json"])
    assert shown.exit_code == 0 and "sources.json" not in shown.output
    named = CliRunner().invoke(app, ["leaderboard", "validate", str(sidecars[0])])
    assert named.exit_code != 0 and sidecars[0].name in named.output


def test_per_class_orders_classes_abundant_to_rare(records, plotted):
    import numpy as np

    sources = json.loads((plotted["out"] / "per-class__digits.png.sources.json").read_text())
    support = np.mean([np.asarray(json.loads(p.read_text())["partition"]["train_counts"]).sum(axis=0)
                       for p in records["ok"]], axis=0)
    order = sources["details"]["class_order"]
    assert sorted(order) == list(range(10))
    assert list(support[order]) == sorted(support, reverse=True)


def test_bytes_draws_silent_method_as_reference_line(plotted):
    sources = json.loads((plotted["out"] / "bytes__digits.png.sources.json").read_text())
    assert sources["details"]["zero_bytes_reference_lines"] == ["local (n=1)"]


def test_bytes_of_ten_equal_seeds_draw(records, tmp_path):
    """Ten seeds sending the same bytes: the float mean of ten copies of 12305901.6 is 1.9e-9 below
    them, which once made a negative error bar that matplotlib refused (plot all failed)."""
    (tmp_path / "in").mkdir()
    for seed in range(10):
        _variant(records["ok"][0], tmp_path / "in" / f"crad{seed}.json", config__seed=seed, record_id=f"{seed:016x}",
                 cost__bytes_sent_per_client_per_round=12305901.6)
    result = CliRunner().invoke(app, ["plot", "bytes", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    _assert_valid_png(tmp_path / "out" / "bytes__digits.png")
    assert json.loads((tmp_path / "out" / "bytes__digits.png.sources.json").read_text())["n_records"] == 10


def test_single_kind_with_method_filter_and_human_output(records, tmp_path):
    result = CliRunner().invoke(app, ["plot", "per-arch", str(records["root"]), "--method", "crad",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "plots written" in _stdout(result) and "skipped" in _stdout(result)  # the rich tables
    assert sorted(p.name for p in tmp_path.iterdir()) == ["per-arch__digits.png", "per-arch__digits.png.sources.json"]
    _assert_valid_png(tmp_path / "per-arch__digits.png")
    sources = json.loads((tmp_path / "per-arch__digits.png.sources.json").read_text())
    assert {r["method"] for r in sources["records"]} == {"crad"} and sources["n_records"] == 2
    assert sources["details"]["architectures"] == ["mlp_small", "cnn_small", "resnet_tiny"]


def test_tasks_are_never_mixed(records, tmp_path):
    """A record of another task gets its own figure; --task picks one task."""
    (tmp_path / "in").mkdir()
    other = _variant(records["ok"][2], tmp_path / "in" / "other.json", task__name="mnist1d", record_id="a" * 16)
    shutil.copy(records["ok"][0], tmp_path / "in" / "crad.json")
    result = CliRunner().invoke(app, ["plot", "bytes", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    by_task = {w["task"]: w for w in json.loads(_stdout(result))["written"]}
    assert set(by_task) == {"digits", "mnist1d"}
    mnist = json.loads(Path(by_task["mnist1d"]["sources"]).read_text())
    assert [Path(r["file"]).name for r in mnist["records"]] == [other.name]
    result = CliRunner().invoke(app, ["plot", "bytes", str(tmp_path / "in"), "--task", "mnist1d",
                                      "--out", str(tmp_path / "out2"), "--json"])
    assert result.exit_code == 0, result.output
    assert [w["task"] for w in json.loads(_stdout(result))["written"]] == ["mnist1d"]


def test_duplicate_record_counts_once(records, tmp_path):
    """The same run found twice (a copy in another folder) must not count as a second seed."""
    shutil.copy(records["ok"][0], tmp_path / "copy.json")
    result = CliRunner().invoke(app, ["plot", "curves", str(records["ok"][0]), str(tmp_path / "copy.json"),
                                      "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(_stdout(result))
    assert summary["written"][0]["n_records"] == 1
    assert "duplicate record_id" in summary["skipped"][0]["reason"]


@pytest.mark.parametrize("case", ["empty", "non-records", "only-failed", "unknown-kind", "missing-path", "no-match"])
def test_bad_input_exits_2_with_one_line(case, records, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    kind, extra = "curves", []
    if case == "non-records":
        (inputs / "a.json").write_text("[1, 2]")
        (inputs / "b.json").write_text("{not json")
    elif case == "only-failed":
        shutil.copy(records["failed"], inputs / "failed.json")
    elif case == "unknown-kind":
        shutil.copy(records["ok"][0], inputs / "r.json")
        kind = "histogram"
    elif case == "missing-path":
        inputs = tmp_path / "nowhere"
    elif case == "no-match":
        shutil.copy(records["ok"][0], inputs / "r.json")
        extra = ["--method", "fedavg"]
    result = CliRunner().invoke(app, ["plot", kind, str(inputs), "--out", str(tmp_path / "out"), *extra])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.png"))
