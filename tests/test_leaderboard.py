"""Leaderboards: grouping over seeds, failed runs counted apart, published figures beside groups,
filters, output formats, rank, and schema validation of every shipped record (real CLI)."""

from __future__ import annotations

import copy
import csv
import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.cli.leaderboard import DEFAULT_DIRS
from hfl_bench.results.ranking import average_ranks
from hfl_bench.testing import builtin_methods

REPO = Path(__file__).resolve().parent.parent
REPRODUCED = REPO / "leaderboards" / "reproduced"
ARCHIVE = REPO / "leaderboards" / "archive" / "first-wave"  # records of the first wave's protocol
PUBLISHED = REPO / "leaderboards" / "published"
REAL = ARCHIVE / "digits" / "digits__crad__da48ac8fb4f0dad1__seed0.json"


@pytest.fixture(scope="module")
def real_record() -> dict:
    record = json.loads(REAL.read_text())
    record["history"] = record["history"][:3]  # keep the test files small; nothing here reads it
    return record


def variant(base: dict, seed: int, global_acc: float | None, local_acc: float | None = 90.0, *,
            status: str = "ok", task: str | None = None, method: str | None = None, pool: str | None = None,
            config_hash: str | None = None, partition_hash: str | None = None, date: str | None = None,
            endpoints: dict | None = None) -> dict:
    """A realistic record: the real one with its seed, figures and identity changed."""
    r = copy.deepcopy(base)
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["status"] = status
    r["error"] = None if status == "ok" else f"run {status}"
    r["metrics"]["global_acc"], r["metrics"]["local_acc"] = global_acc, local_acc
    r["metrics"]["extra_endpoints"] = endpoints or {}
    if task:
        r["task"]["name"] = r["config"]["task"] = task
    if method:
        r["method"]["name"] = r["config"]["method"] = method
    if pool:
        r["arch_pool"]["name"] = r["config"]["pool"] = pool
    r["config_hash"] = config_hash or f"{r['task']['name']}-{r['method']['name']}-{r['arch_pool']['name']}"
    r["partition"]["hash"] = partition_hash or f"part-seed{seed}"  # the partition is drawn per seed
    r["date"] = date or r["date"]
    r["record_id"] = f"{r['config_hash']}-{seed}-{status}-{r['date']}"
    return r


def write(folder: Path, *records: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(records):
        name = f"{r['task']['name']}__{r['method']['name']}__{r['config_hash']}__seed{r['config']['seed']}__{i}.json"
        (folder / name).write_text(json.dumps(r))
    return folder


def show(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["leaderboard", "show", *args])
    return result.exit_code, result.stdout


def show_json(*args: str) -> dict:
    code, out = show(*args, "--format", "json")
    assert code == 0, out
    return json.loads(out)


def group(board: dict, method: str, task: str = "digits") -> dict:
    [g] = [g for g in board["groups"] if g["method"] == method and g["task"] == task]
    return g


# ----------------------------------------------------------------------------- aggregation


def test_mean_sample_sd_and_failed_counted_apart(real_record, tmp_path):
    folder = write(tmp_path / "runs",
                   variant(real_record, 0, 60.0, 90.0), variant(real_record, 1, 62.0, 94.0),
                   variant(real_record, 2, 64.0, 98.0),
                   variant(real_record, 3, 5.0, 5.0, status="failed"),
                   variant(real_record, 4, 1.0, None, status="diverged"))
    g = group(show_json(str(folder)), "crad")
    assert g["seeds"] == [0, 1, 2] and g["n_seeds"] == 3
    assert g["global_acc"] == {"mean": 62.0, "sd": 2.0, "n": 3}  # ddof = 1: sqrt(8 / 2)
    assert g["local_acc"] == {"mean": 94.0, "sd": 4.0, "n": 3}
    assert (g["n_failed"], g["n_diverged"]) == (1, 1)  # counted, never averaged in
    assert g["partition_hashes"] == ["part-seed0", "part-seed1", "part-seed2"]


def test_a_run_that_failed_before_loading_data_counts_in_its_group(real_record, tmp_path):
    early = variant(real_record, 2, None, None, status="failed")  # the shape of recording.build_failed_record
    for block in ("partition", "federation", "arch_pool"):
        del early[block]
    early["metrics"] = None
    del early["task"]["n_train"], early["task"]["n_test"]
    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0), variant(real_record, 1, 62.0), early)
    [g] = show_json(str(folder))["groups"]
    assert (g["n_seeds"], g["n_failed"], g["global_acc"]["mean"]) == (2, 1, 61.0)


def test_invalid_records_are_listed_never_averaged(real_record, tmp_path):
    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0), variant(real_record, 1, 62.0),
                   variant(real_record, 2, 150.0),  # over 100 percent
                   variant(real_record, 3, "85.0"),  # a string
                   variant(real_record, 4, 70.0, local_acc=-3.0))
    nan = json.dumps(variant(real_record, 5, 64.0)).replace('"global_acc": 64.0', '"global_acc": NaN', 1)
    (folder / "nan.json").write_text(nan)
    history = variant(real_record, 6, 66.0)
    history["history"][1]["global_acc"] = 1000.0
    (folder / "history.json").write_text(json.dumps(history))
    result = CliRunner().invoke(app, ["leaderboard", "show", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output  # one NaN record no longer crashes the board
    board = json.loads(result.stdout)
    [g] = board["groups"]
    assert g["seeds"] == [0, 1] and g["global_acc"]["mean"] == 61.0
    skipped = " ".join(board["skipped"])
    assert len(board["skipped"]) == 5
    assert "metrics/global_acc: accuracy 150.0 is not within [0, 100]" in skipped
    assert "metrics/global_acc: accuracy '85.0' is not a number" in skipped
    assert "metrics/local_acc: accuracy -3.0 is not within [0, 100]" in skipped
    assert "nan.json" in skipped and "NaN is not a JSON number" in skipped
    assert "history/1/global_acc" in skipped
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 5 and all(ln.startswith("skipped: ") for ln in lines)
    # The rank and the plots read the same records.
    code, out = show(str(folder), "--rank", "--format", "json")
    assert code == 0
    plotted = CliRunner().invoke(app, ["plot", "bytes", str(folder), "--out", str(tmp_path / "plots"), "--json"])
    assert plotted.exit_code == 0, plotted.output
    summary = json.loads(plotted.stdout)
    assert summary["written"][0]["n_records"] == 2
    assert sum("invalid record" in s["reason"] or "not valid JSON" in s["reason"] for s in summary["skipped"]) == 5


def test_duplicate_record_ids_resolve_by_date_then_path(real_record, tmp_path):
    """The same record_id and date in two files: the lexicographically smallest path counts,
    whatever order the files are listed or found in; an earlier date beats any path."""
    from hfl_bench.results.grouping import group_seeds
    from hfl_bench.results.loading import load_records

    same = variant(real_record, 0, 50.0)
    copy_b = dict(copy.deepcopy(same), metrics=dict(same["metrics"], global_acc=70.0))
    folder = tmp_path / "runs"
    for sub, record in (("a", same), ("b", copy_b)):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "x.json").write_text(json.dumps(record))
    for order in (["a", "b"], ["b", "a"]):
        loaded, _ = load_records([folder / o for o in order])
        [g] = group_seeds(loaded if order == ["a", "b"] else list(reversed(loaded)))
        assert [r.path.parent.name for r in g.ok] == ["a"] and len(g.duplicates) == 1
        board = show_json(*[str(folder / o) for o in order])
        assert group(board, "crad")["global_acc"]["mean"] == 50.0
    newer = dict(copy.deepcopy(same), date="2999-01-01T00:00:00+00:00")
    (folder / "a" / "x.json").write_text(json.dumps(newer))
    assert group(show_json(str(folder)), "crad")["global_acc"]["mean"] == 70.0
    # Dates are compared as instants, not as text: 01:00+01:00 is 00:00 UTC, earlier than 00:30Z.
    (folder / "a" / "x.json").write_text(json.dumps(dict(same, date="2030-01-01T01:00:00+01:00")))
    (folder / "b" / "x.json").write_text(json.dumps(dict(copy_b, date="2030-01-01T00:30:00+00:00")))
    assert group(show_json(str(folder)), "crad")["global_acc"]["mean"] == 50.0


def test_data_fingerprints_split_groups(real_record, tmp_path):
    def on(data, seed, acc):
        r = variant(real_record, seed, acc)
        if data:
            r["task"]["data_fingerprint"] = data
        return r

    folder = write(tmp_path / "runs", on("a" * 16, 0, 60.0), on("a" * 16, 1, 62.0), on("b" * 16, 2, 90.0),
                   on(None, 3, 10.0), on(None, 4, 20.0))
    groups = sorted((g["seeds"], g["global_acc"]["mean"]) for g in show_json(str(folder))["groups"])
    assert groups == [([0, 1], 61.0), ([2], 90.0), ([3, 4], 15.0)]  # no fingerprint: its own "unknown data"


def test_one_seed_has_no_sd(real_record, tmp_path):
    folder = write(tmp_path / "runs", variant(real_record, 0, 70.0, 80.0))
    g = group(show_json(str(folder)), "crad")
    assert g["global_acc"] == {"mean": 70.0, "sd": None, "n": 1}
    code, md = show(str(folder), "--format", "markdown")
    assert code == 0 and "| 70.00 ± - |" in md


def test_groups_by_setting_and_earliest_of_a_rerun_seed(real_record, tmp_path):
    folder = write(tmp_path / "runs",
                   variant(real_record, 0, 54.0, date="2026-01-01T00:00:00+00:00"),
                   variant(real_record, 0, 50.0, date="2026-02-01T00:00:00+00:00"),  # rerun: the first stands
                   variant(real_record, 1, 56.0),
                   variant(real_record, 0, 80.0, method="uniform-kd"))
    board = show_json(str(folder))
    crad = group(board, "crad")
    assert crad["global_acc"]["mean"] == 55.0 and crad["n_duplicates"] == 1
    assert group(board, "uniform-kd")["global_acc"] == {"mean": 80.0, "sd": None, "n": 1}


def test_same_config_on_different_data_is_split(real_record, tmp_path):
    # Same config hash and seed, different partition hash: another data folder (data_dir is not in
    # the config hash), so these two must not be averaged.
    folder = write(tmp_path / "runs",
                   variant(real_record, 0, 40.0, partition_hash="aaaa"),
                   variant(real_record, 0, 90.0, partition_hash="bbbb"))
    groups = [g for g in show_json(str(folder))["groups"] if g["method"] == "crad"]
    assert sorted(g["global_acc"]["mean"] for g in groups) == [40.0, 90.0]
    assert all(g["split_by_partition"] and g["n_seeds"] == 1 for g in groups)


# ----------------------------------------------------------------------------- published


def test_published_sits_beside_with_delta_never_averaged(real_record, tmp_path):
    # A crad group in the CRAD paper's CIFAR-10 setting (N = 10, Dirichlet 0.3, R = 300, paper pool).
    folder = write(tmp_path / "runs", *[variant(real_record, s, acc, task="cifar10", pool="paper")
                                        for s, acc in ((0, 70.0), (1, 72.0))])
    board = show_json(str(folder), str(PUBLISHED), "--task", "cifar10")
    g = group(board, "crad", "cifar10")
    assert g["global_acc"] == {"mean": 71.0, "sd": pytest.approx(1.4142, abs=1e-4), "n": 2}
    [pub] = g["published"]  # not N = 100 (other clients), not epsilon = 1 (other hyperparameters)
    assert (pub["citation_key"], pub["value"], pub["setting_match"]) == ("fan2026crad", 78.6, "exact")
    assert pub["locator"].startswith("Table 1") and pub["delta"] == pytest.approx(71.0 - 78.6)
    unmatched = {(p["method"], p["value"]) for p in board["unmatched_published"]}
    assert ("crad", 22.19) in unmatched and ("uniform-kd", 77.19) in unmatched


def test_published_match_is_approximate_where_the_setting_differs(real_record, tmp_path):
    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0, task="cifar10", pool="cpu"))
    [pub] = group(show_json(str(folder), str(PUBLISHED)), "crad", "cifar10")["published"]
    assert pub["setting_match"] == "approximate" and pub["differences"] == ["pool: published paper, here cpu"]
    code, out = show(str(folder), str(PUBLISHED), "--format", "csv", "--task", "cifar10", "--method", "crad")
    rows = list(csv.DictReader(io.StringIO(out)))
    [rep] = [r for r in rows if r["row_type"] == "reproduced"]
    beside = [r for r in rows if r["row_type"] == "published" and r["group_id"] == rep["group_id"]]
    assert [(r["published_value"], r["setting_match"], float(r["delta"])) for r in beside] == \
        [("78.6", "approximate", pytest.approx(-18.6))]


def test_published_endpoint_compares_with_the_same_endpoint(real_record, tmp_path):
    endpoints = {"private": {"global_acc": 40.0, "local_acc": 80.0}, "q": {"global_acc": 55.0, "local_acc": 70.0},
                 "joint": {"global_acc": 60.0, "local_acc": 85.0}}
    folder = write(tmp_path / "runs", variant(real_record, 0, 40.0, task="cifar100", method="fedsocket",
                                              endpoints=endpoints))
    g = group(show_json(str(folder), str(PUBLISHED), "-m", "fedsocket"), "fedsocket", "cifar100")
    deltas = {p["endpoint"]: p["delta"] for p in g["published"]}
    assert deltas == pytest.approx({"private": 40.0 - 45.13, "q": 55.0 - 50.32, "joint": 60.0 - 53.59})


# ----------------------------------------------------------------------------- filters, formats, rank


def test_filters(real_record, tmp_path):
    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0), variant(real_record, 0, 61.0, method="local"),
                   variant(real_record, 0, 62.0, pool="cpu-cnn", method="fedavg"),
                   variant(real_record, 0, 63.0, task="cifar10"))
    keys = lambda board: sorted((g["method"], g["task"]) for g in board["groups"])  # noqa: E731
    assert keys(show_json(str(folder), "--task", "digits", "--method", "crad")) == [("crad", "digits")]
    assert keys(show_json(str(folder), "--pool", "cpu-cnn")) == [("fedavg", "digits")]
    assert keys(show_json(str(folder), "-m", "crad", "-m", "local", "-t", "digits")) == \
        [("crad", "digits"), ("local", "digits")]
    board = show_json(str(folder), str(PUBLISHED), "--task", "pathmnist")
    assert board["groups"] == [] and {p["task"] for p in board["unmatched_published"]} == {"pathmnist"}
    assert {p["metric"] for p in board["unmatched_published"]} == {"global_acc", "local_acc"}


def test_every_format_parses(real_record, tmp_path):
    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0, task="cifar10", pool="paper"),
                   variant(real_record, 1, 64.0, task="cifar10", pool="paper"))
    args = (str(folder), str(PUBLISHED), "--task", "cifar10")
    assert show_json(*args)["groups"][0]["global_acc"]["mean"] == 62.0
    code, out = show(*args, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and rows[0]["row_type"] == "reproduced" and float(rows[0]["global_mean"]) == 62.0
    assert rows[0]["global_sd"] == "2.8284" and rows[0]["seeds"] == "0 1"
    assert {r["row_type"] for r in rows} == {"reproduced", "published"}
    code, out = show(*args, "--format", "markdown")
    # the section's label, what every row shares, its table
    heading, same, table = out.split("\n\n")[0], out.split("\n\n")[1], out.split("\n\n")[2].splitlines()
    assert heading == "**Setting: data-free, heterogeneous pool, protocol budget**"
    assert same.startswith("Same in every row: predictor live model, task cifar10, pool paper,")
    assert code == 0 and table[0].startswith("| method | seeds | global acc |") and set(table[1]) <= set("|-")
    assert "| 62.00 ± 2.83 |" in out and "fan2026crad" in out
    assert len({len(re.split(r"(?<!\\)\|", line)) for line in table}) == 1  # same cell count on every row
    code, out = show(*args, "--format", "table")
    assert code == 0 and "crad" in out and "cifar10" in out
    code, _ = show(*args, "--format", "yaml")
    assert code == 2


def test_rank_across_tasks(real_record, tmp_path):
    folder = write(tmp_path / "runs",
                   variant(real_record, 0, 60.0), variant(real_record, 0, 70.0, method="uniform-kd"),
                   variant(real_record, 0, 60.0, method="local"),  # tied with crad on digits
                   variant(real_record, 0, 80.0, task="cifar10"),
                   variant(real_record, 0, 70.0, task="cifar10", method="uniform-kd"),
                   variant(real_record, 0, 99.0, task="pathmnist"))  # alone on its protocol: not ranked
    code, out = show(str(folder), "--rank", "--format", "json")
    ranked = {r["method"]: r for r in json.loads(out)["rank"]}
    assert [r["method"] for r in json.loads(out)["rank"]] == ["uniform-kd", "crad", "local"]
    assert ranked["uniform-kd"]["mean_rank"] == 1.5 and ranked["crad"]["mean_rank"] == 1.75
    assert ranked["local"]["mean_rank"] == 2.5 and ranked["local"]["n_protocols"] == 1
    assert all(x["task"] != "pathmnist" for r in ranked.values() for x in r["ranks"])
    code, out = show(str(folder), "--rank", "--format", "csv")
    assert code == 0 and [r["method"] for r in csv.DictReader(io.StringIO(out))] == ["uniform-kd", "crad", "local"]


def test_public_hold_out_is_part_of_the_setting(real_record, tmp_path):
    """Runs on shards with a public set held out are another protocol: shown, never ranked with
    runs on the full shards."""
    def held_out(r):
        r["partition"]["public_size"] = r["config"]["public_size"] = 200
        return r

    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0), variant(real_record, 0, 50.0, method="local"),
                   held_out(variant(real_record, 0, 70.0, method="fd", config_hash="p1")),
                   held_out(variant(real_record, 0, 40.0, method="local", config_hash="p2")))
    board = show_json(str(folder))
    public = {g["method"]: g for g in board["groups"] if g["partition"]["params"].get("public") == 200}
    assert set(public) == {"fd", "local"}
    ranks = {r["method"]: r for r in json.loads(show(str(folder), "--rank", "--format", "json")[1])["rank"]}
    assert ranks["local"]["n_protocols"] == 2 and ranks["fd"]["n_protocols"] == 1
    assert ranks["fd"]["mean_rank"] == 1.0  # ranked against local on the held-out shards only
    code, out = show(str(folder))
    assert code == 0 and "public=200" in out


def test_average_ranks_share_ties():
    assert average_ranks({"a": 3.0, "b": 1.0, "c": 3.0, "d": 0.5}) == {"a": 1.5, "c": 1.5, "b": 3.0, "d": 4.0}


@pytest.mark.slow  # reads every committed record (about 2,000)
def test_default_folders_and_bad_paths(tmp_path):
    assert DEFAULT_DIRS == (REPRODUCED, PUBLISHED)
    board = show_json()  # the default folders: every published figure is on the board, beside a group or not
    shown = {p["record_id"] for p in board["unmatched_published"]}
    shown |= {p["record_id"] for g in board["groups"] for p in g["published"]}
    assert shown == {json.loads(p.read_text())["record_id"] for p in PUBLISHED.glob("*.json")}
    reproduced = len(list(REPRODUCED.rglob("*.json")))
    assert sum(len(g["records"]) for g in board["groups"]) <= reproduced
    code, _ = show(str(tmp_path / "missing"))
    assert code == 2
    (tmp_path / "notes.json").write_text('{"hello": 1}')  # not a record: skipped with a warning
    assert show_json(str(tmp_path))["skipped"]


# ----------------------------------------------------------------------------- validate and the shipped records


def validate(*args: str):
    return CliRunner().invoke(app, ["leaderboard", "validate", *args])


@pytest.mark.slow  # validates every committed record (about 2,000)
def test_validate_every_shipped_record():
    pytest.importorskip("jsonschema")
    result = validate()
    n = len(list(REPRODUCED.rglob("*.json"))) + len(list(PUBLISHED.rglob("*.json")))
    assert result.exit_code == 0, result.output
    assert f"{n} of {n} records valid" in result.stdout
    assert len(list(PUBLISHED.glob("*.json"))) >= 25


def test_validate_fails_on_a_broken_record(real_record, tmp_path):
    pytest.importorskip("jsonschema")
    broken = variant(real_record, 0, 150.0)  # over 100 percent
    del broken["method"]["fidelity"]
    folder = write(tmp_path / "runs", variant(real_record, 1, 60.0), broken)
    (folder / "garbage.json").write_text("{not json")
    result = validate(str(folder), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["checked"] == 3 and len(report["invalid"]) == 2
    errors = " ".join(e for errs in report["invalid"].values() for e in errs)
    assert "metrics/global_acc" in errors and "fidelity" in errors and "not readable JSON" in errors
    result = validate(str(folder))
    assert result.exit_code == 1 and "1 of 3 records valid" in result.stdout


def test_validate_rejects_a_published_record_with_two_figures(tmp_path):
    pytest.importorskip("jsonschema")
    record = json.loads(next(PUBLISHED.glob("fan2026crad__pathmnist__crad__local_acc__*.json")).read_text())
    record["metrics"]["global_acc"] = 89.44  # one figure per published record
    (tmp_path / "two.json").write_text(json.dumps(record))
    assert validate(str(tmp_path)).exit_code == 1


def test_validate_without_jsonschema_gives_the_same_verdicts(real_record, tmp_path, monkeypatch):
    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0), variant(real_record, 1, 150.0),
                   variant(real_record, 2, "85.0"))
    with_it = validate(str(folder), "--json")
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema -> ImportError
    without = validate(str(folder), "--json")
    assert with_it.exit_code == without.exit_code == 1
    assert set(json.loads(with_it.stdout)["invalid"]) == set(json.loads(without.stdout)["invalid"])
    assert len(json.loads(without.stdout)["invalid"]) == 2
    assert validate().exit_code == 0  # every shipped record, without jsonschema too


def _mutations(real: dict) -> list[tuple[str, dict]]:
    """Records one change away from a valid one (most of them invalid), for comparing validators."""
    published = json.loads(next(PUBLISHED.glob("fan2026crad__pathmnist__crad__local_acc__*.json")).read_text())

    def change(base, path, value):
        r = copy.deepcopy(base)
        node = r
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return r

    cases = [
        ("global_acc 150", (real, ("metrics", "global_acc"), 150.0)),
        ("global_acc -1", (real, ("metrics", "global_acc"), -1)),
        ("global_acc string", (real, ("metrics", "global_acc"), "85.0")),
        ("global_acc bool", (real, ("metrics", "global_acc"), True)),
        ("global_acc null", (real, ("metrics", "global_acc"), None)),
        ("global_acc missing", (real, ("metrics", "global_acc"), KeyError)),
        ("metrics null", (real, ("metrics",), None)),
        ("status", (real, ("status",), "finished")),
        ("fidelity missing", (real, ("method", "fidelity"), KeyError)),
        ("fidelity other", (real, ("method", "fidelity"), "faithful")),
        ("schema_version", (real, ("schema_version",), "2.0")),
        ("record_id int", (real, ("record_id",), 5)),
        ("num_classes 1", (real, ("task", "num_classes"), 1)),
        ("num_classes 2.0", (real, ("task", "num_classes"), 2.0)),
        ("fingerprint good", (real, ("task", "data_fingerprint"), "0123456789abcdef")),
        ("fingerprint bad", (real, ("task", "data_fingerprint"), "../etc")),
        ("history acc 101", (real, ("history", 1, "global_acc"), 101.0)),
        ("endpoint acc 200", (real, ("metrics", "extra_endpoints"), {"q": {"global_acc": 200}})),
        ("per-arch acc", (real, ("metrics", "per_arch_global_acc", "mlp_small"), 100.5)),
        ("topology", (real, ("federation", "topology"), "mesh")),
        ("source kind", (real, ("source", "kind"), "other")),
        ("published ok", (published, ("metrics", "n_seeds"), 3)),
        ("published two figures", (published, ("metrics", "global_acc"), 89.44)),
        ("published no figure", (published, ("metrics", "local_acc"), KeyError)),
        ("published no citation key", (published, ("source", "citation", "key"), KeyError)),
        ("published no setting", (published, ("setting",), KeyError)),
    ]
    return [("unchanged", real), ("published", published)] + [(n, change(*c)) for n, c in cases]


@pytest.mark.slow  # validates every committed record (about 2,000) twice
def test_the_record_check_refuses_what_the_frozen_schemas_refuse(real_record):
    """Each mutation the 1.7 JSON Schema refuses, the record check (upgrade, then the model) refuses
    too; every shipped record passes both its own version's frozen schema and the check; and the
    mutations meant to stay valid are exactly those the check accepts."""
    jsonschema = pytest.importorskip("jsonschema")
    from hfl_bench.record.check import problems
    from hfl_bench.record.io import CURRENT_VERSION, SCHEMA_VERSIONS, load_schema

    def frozen(record):  # a record of no known version is checked against the current schema
        version = record.get("schema_version")
        schema = load_schema(version if version in SCHEMA_VERSIONS else CURRENT_VERSION)
        return list(jsonschema.Draft202012Validator(schema).iter_errors(record))

    shipped = [json.loads(p.read_text())
               for p in [*REPRODUCED.rglob("*.json"), *ARCHIVE.rglob("*.json"), *PUBLISHED.glob("*.json")]]
    assert not [i for i, r in enumerate(shipped) if frozen(r) or problems(r)]
    for name, record in _mutations(real_record):
        if frozen(record):
            assert problems(record), name
    verdicts = {name: not problems(r) for name, r in _mutations(real_record)}
    # the cases meant to stay valid, and only those ("global_acc null" and "metrics null": the schema
    # allows them, the rule that an ok run reports its figures does not)
    assert {name for name, ok in verdicts.items() if ok} == {
        "unchanged", "published", "num_classes 2.0", "fingerprint good", "published ok"}


def test_validate_rejects_nan_and_infinity(real_record, tmp_path):
    folder = write(tmp_path / "runs", variant(real_record, 0, 60.0))
    for name, literal in (("nan", "NaN"), ("inf", "Infinity"), ("minf", "-Infinity"), ("big", "1e999")):
        text = json.dumps(variant(real_record, 1, 61.0)).replace('"global_acc": 61.0', f'"global_acc": {literal}', 1)
        assert literal in text
        (folder / f"{name}.json").write_text(text)
    result = validate(str(folder), "--json")
    assert result.exit_code == 1
    invalid = json.loads(result.stdout)["invalid"]
    assert sorted(Path(f).stem for f in invalid) == ["big", "inf", "minf", "nan"]
    assert all("not readable JSON" in errs[0] for errs in invalid.values())


def test_published_records_are_what_the_generator_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_published", PUBLISHED / "make_published.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--out", str(tmp_path)]) == 0
    generated = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    shipped = {p.name: p.read_text() for p in PUBLISHED.glob("*.json")}
    assert generated == shipped
    records = [json.loads(t) for t in shipped.values()]
    assert len({r["record_id"] for r in records}) == len(records)
    assert {r["method"]["name"] for r in records} <= set(builtin_methods())  # each is a method we run
    assert {r["task"]["name"] for r in records} == {"cifar10", "cifar100", "pathmnist"}


@pytest.mark.slow  # the CLI as a process
@pytest.mark.parametrize("args", [
    ("leaderboard", "show", str(REPRODUCED / "digits")),
    ("leaderboard", "show", str(REPRODUCED / "digits"), "--format", "markdown"),
    ("leaderboard", "show", str(REPRODUCED / "digits"), "--rank"),
    ("leaderboard", "compare", str(REPRODUCED / "digits"), "--against", "local"),
    ("show", str(REAL)),
], ids=["table", "markdown", "rank", "compare", "show"])
def test_output_survives_an_ascii_only_stdout(args):
    """PYTHONIOENCODING=ascii (issue 47, row 10): the real CLI in a subprocess exits 0 with ASCII only,
    the plus-minus sign spelled "+/-", and a rich table's rows still line up."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONIOENCODING="ascii", COLUMNS="250")
    proc = subprocess.run([sys.executable, "-m", "hfl_bench.cli", *args], capture_output=True, timeout=300, env=env)
    stderr = proc.stderr.decode("ascii", "replace")
    assert proc.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr and "UnicodeEncodeError" not in stderr
    stdout = proc.stdout.decode("ascii")  # raises on any byte that is not ASCII
    if args[:2] == ("leaderboard", "show") and "--rank" not in args:
        assert " +/- " in stdout and "?" not in stdout
    if args == ("leaderboard", "show", str(REPRODUCED / "digits")):
        tables, block = [], []
        for line in [*stdout.splitlines(), ""]:
            if line.startswith(("|", "+")):
                block.append(line)
            elif block:
                tables, block = [*tables, block], []
        assert tables and all(len({len(line) for line in t}) == 1 for t in tables), "columns do not line up"


def test_a_new_column_is_one_entry_in_every_view(real_record, tmp_path):
    """One ``register_column`` entry shows in the terminal table, markdown, csv, json and the
    HTML site (its text escaped there as data); unregistered, it is gone from every view."""
    from hfl_bench.results.columns import Column, csv_fields, register_column, unregister_column

    folder = write(tmp_path / "records", *(variant(real_record, s, 80.0 + s, method=m)
                                           for m in ("crad", "fedavg") for s in (0, 1)))
    register_column(Column("tag", lambda row: f"{row.group.method}<b>"), after="seeds")
    try:
        def view(*args: str) -> str:
            result = CliRunner().invoke(app, ["leaderboard", *args], env={"COLUMNS": "400"})
            assert result.exit_code == 0, result.output
            return result.stdout

        table = view("show", str(folder))
        assert re.search(r"[┃│] tag +[┃│]", table) and "crad<b>" in table and "fedavg<b>" in table
        markdown = view("show", str(folder), "--format", "markdown")
        assert "| method | tag |" in markdown and "| crad&lt;b&gt; |" in markdown  # seeds: one value, in the title
        assert "| seeds | tag |" in view("show", str(folder), "--format", "markdown", "--columns", "all")
        rows = list(csv.DictReader(io.StringIO(view("show", str(folder), "--format", "csv"))))
        fields = list(rows[0])
        assert fields.index("tag") == fields.index("n_seeds") + 1 and fields == list(csv_fields())
        assert {r["tag"] for r in rows} == {"crad<b>", "fedavg<b>"}
        board = json.loads(view("show", str(folder), "--format", "json"))
        assert {g["method"]: g["tag"] for g in board["groups"]} == {"crad": "crad<b>", "fedavg": "fedavg<b>"}
        view("html", str(folder), "--out", str(tmp_path / "site"))
        index = (tmp_path / "site" / "index.html").read_text()
        assert '<th data-type="text">tag</th>' in index and "<td>crad&lt;b&gt;</td>" in index
        assert "crad<b>" not in index  # record text is data, never markup
    finally:
        unregister_column("tag")
    assert "tag" not in csv_fields()
    code, out = show(str(folder), "--format", "markdown")
    assert code == 0 and "crad<b>" not in out and "crad&lt;b&gt;" not in out


def test_a_column_name_is_taken_once(real_record):
    from hfl_bench.registry import RegistryError
    from hfl_bench.results.columns import Column, register_column

    with pytest.raises(RegistryError, match="already registered"):
        register_column(Column("seeds", lambda row: 0))
    with pytest.raises(RegistryError, match="unknown leaderboard column 'sedes'.*Did you mean 'seeds'"):
        register_column(Column("new", lambda row: 0), after="sedes")
    with pytest.raises(RegistryError, match="unknown views"):
        Column("new", lambda row: 0, views=frozenset({"pdf"}))


COLUMN_PLUGIN = '''
from hfl_bench.results.columns import Column

PARTITIONS = Column("partitions", lambda row: len({r.partition_hash for r in row.group.ok}), numeric=True)
'''


def test_a_plugin_adds_a_column_through_its_entry_point(real_record, tmp_path):
    """A distribution's ``hfl_bench.columns`` entry point (a Column) is a column of every view of the
    real CLI; one whose import fails is skipped with one warning line, the board still shown."""
    import os
    import subprocess

    from helpers import write_dist

    plugins = tmp_path / "plugins"
    write_dist(plugins, "hflb_column_plugin", "hflb-column-plugin", COLUMN_PLUGIN,
               "[hfl_bench.columns]\npartitions = hflb_column_plugin:PARTITIONS\n")
    write_dist(plugins, "hflb_broken_column", "hflb-broken-column", "raise ImportError('no such thing')\n",
               "[hfl_bench.columns]\nbroken = hflb_broken_column\n")
    folder = write(tmp_path / "records", *(variant(real_record, s, 80.0 + s) for s in (0, 1)))
    env = dict(os.environ, PYTHONPATH=str(plugins), OMP_NUM_THREADS="1", COLUMNS="400")
    proc = subprocess.run([sys.executable, "-m", "hfl_bench.cli", "leaderboard", "show", str(folder), "-f", "json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [g["partitions"] for g in json.loads(proc.stdout)["groups"]] == [2]
    assert "hflb-broken-column" in proc.stderr and "skipped" in proc.stderr
