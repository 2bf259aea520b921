"""Faults in the results layer: the fault setting in `leaderboard show` (all formats), the honest
headline, the drop against the same seeds without faults (paired by seed, hand-checked), faulty
and fault-free groups never ranked together, the HTML rows, and `hfl-bench plot robustness` with
its sidecar. Records are a real record's variants: the config hashes and the ``faults`` section
come from the real code (``config.config_hash``, ``records.faults_section``)."""

from __future__ import annotations

import copy
import csv
import io
import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hfl_bench import recording as record_writer
from hfl_bench.cli import app
from hfl_bench.config import config_hash
from hfl_bench.record.check import problems as record_problems

from helpers import REAL_RECORD

REAL = REAL_RECORD


@pytest.fixture(scope="module")
def real() -> dict:
    r = json.loads(REAL.read_text())
    r["history"] = r["history"][:3]
    r["method"]["version"] = "1.0"
    r["config"]["faults"] = ""
    return r


def run_record(base: dict, seed: int, method: str, global_acc: float, faults: str = "", *,
               honest: float | None = None, faulty_acc: float | None = None, kind: str = "", fraction: float = 0.2,
               strength: float | None = None, mode: str | None = None) -> dict:
    """A record of ``method`` at ``seed``, with faults when ``faults`` names a spec."""
    r = copy.deepcopy(base)
    r["method"]["name"] = r["config"]["method"] = method
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["config"]["faults"] = faults
    r["config_hash"] = config_hash(r["config"])
    r["partition"]["hash"] = f"part-seed{seed}"
    r["metrics"]["global_acc"] = global_acc
    r["metrics"]["per_client"] = [dict(c, global_acc=global_acc) for c in r["metrics"]["per_client"]]
    r["record_id"] = f"{r['config_hash']}-{seed}"
    if faults:
        n = r["federation"]["n_clients"]
        bad = list(range(max(1, round(fraction * n))))
        plan = {"spec": faults, "kind": kind, "strength": strength, "mode": mode, "fraction": fraction,
                "faulty_clients": bad, "honest_clients": [c for c in range(n) if c not in bad]}
        r["faults"] = record_writer.faults_section(r["config"], plan)
        r["schema_version"] = "1.3"
        r["metrics"]["honest"] = {"n_clients": n - len(bad), "global_acc": honest, "local_acc": 80.0,
                                  "mean_val_acc": 80.0}
        r["metrics"]["faulty"] = {"n_clients": len(bad), "global_acc": faulty_acc, "local_acc": 20.0,
                                  "mean_val_acc": 20.0}
        # each client's selected-round figure: the drop is over the same (honest) clients' figures
        r["metrics"]["per_client"] = [dict(c, global_acc=faulty_acc if c["cid"] in bad else honest)
                                      for c in r["metrics"]["per_client"]]
    assert record_problems(r) == [], record_problems(r)
    return r


def write(folder: Path, *rs: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r in rs:
        (folder / f"{r['task']['name']}__{r['method']['name']}__{r['config_hash']}__seed{r['config']['seed']}.json"
         ).write_text(json.dumps(r))
    return folder


BYZ = "byzantine:0.2/random"
BYZ4 = "byzantine:0.4/random"


@pytest.fixture(scope="module")
def folder(real, tmp_path_factory) -> Path:
    """crad: seeds 0-2 without faults (80, 82, 84); byzantine:0.2 at seeds 0, 1 and 3 (honest 70,
    77, 50; all 60, 65, 40): seeds 0 and 1 pair, seed 3 has no baseline, so the drop is
    ((70 - 80) + (77 - 82)) / 2 = -7.5 over 2 seeds. byzantine:0.4 at seed 0 (honest 60).
    local: 90 without faults, byzantine:0.2 at seed 0 (honest 90). uniform-kd: byzantine:0.2 only
    (no baseline at all; a data-free method, so that it shares the others' setting section)."""
    rs = [run_record(real, s, "crad", acc) for s, acc in ((0, 80.0), (1, 82.0), (2, 84.0))]
    rs += [run_record(real, s, "crad", every, BYZ, honest=h, faulty_acc=5.0, kind="byzantine", mode="random")
           for s, h, every in ((0, 70.0, 60.0), (1, 77.0, 65.0), (3, 50.0, 40.0))]
    rs.append(run_record(real, 0, "crad", 50.0, BYZ4, honest=60.0, faulty_acc=5.0, kind="byzantine",
                         fraction=0.4, mode="random"))
    rs.append(run_record(real, 0, "local", 90.0))
    rs.append(run_record(real, 0, "local", 88.0, BYZ, honest=90.0, faulty_acc=84.0, kind="byzantine", mode="random"))
    rs.append(run_record(real, 0, "uniform-kd", 30.0, BYZ, honest=35.0, faulty_acc=10.0, kind="byzantine",
                         mode="random"))
    return write(tmp_path_factory.mktemp("faults") / "runs", *rs)


def show(*args: str) -> str:
    result = CliRunner().invoke(app, ["leaderboard", "show", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def groups(folder: Path) -> dict[tuple, dict]:
    board = json.loads(show(str(folder), "--format", "json"))
    return {(g["method"], g["faults"]): g for g in board["groups"]}


# ----------------------------------------------------------------------------- leaderboard show


def test_faults_column_and_honest_headline(folder):
    gs = groups(folder)
    assert set(gs) == {("crad", "none"), ("crad", BYZ), ("crad", BYZ4), ("local", "none"), ("local", BYZ),
                       ("uniform-kd", BYZ)}
    byz = gs[("crad", BYZ)]
    assert byz["headline_clients"] == "honest" and gs[("crad", "none")]["headline_clients"] == "all"
    assert byz["global_acc"]["mean"] == round((70 + 77 + 50) / 3, 4)  # the honest clients' figure
    assert byz["all_clients"]["global_acc"]["mean"] == 55.0  # every client's, still there
    assert byz["honest"]["global_acc"]["mean"] == byz["global_acc"]["mean"]
    assert byz["faulty"]["global_acc"]["mean"] == 5.0
    assert gs[("crad", "none")]["global_acc"]["mean"] == 82.0 and gs[("crad", "none")]["drop"] is None

    table = show(str(folder))
    assert "faults" in table and "byzantine:0.2/random" in table and "drop" in table
    rows = list(csv.DictReader(io.StringIO(show(str(folder), "--format", "csv"))))
    by = {(r["method"], r["faults"]): r for r in rows}
    assert by[("crad", "none")]["faults"] == "none" and by[("crad", BYZ)]["headline_clients"] == "honest"
    assert float(by[("crad", BYZ)]["all_global_mean"]) == 55.0
    markdown = show(str(folder), "--format", "markdown")
    lines = markdown.splitlines()
    heading, same = lines[0], lines[2]  # each setting section: label, what every row shares, table
    assert heading == "**Setting: data-free, heterogeneous pool, protocol budget**"
    assert "faults none" in same  # a section's faults are one setting: said once, above its table
    faulty = markdown.split("**Setting: data-free, heterogeneous pool, protocol budget, faults=")[1]
    header = next(line for line in faulty.splitlines() if line.startswith("| method"))
    assert "| drop |" in header


def test_drop_is_paired_by_seed(folder):
    gs = groups(folder)
    drop = gs[("crad", BYZ)]["drop"]
    assert drop["mean"] == -7.5 and drop["n_paired"] == 2 and drop["seeds"] == [0, 1]  # seed 3 has no baseline
    assert [(p["seed"], p["drop"]) for p in drop["pairs"]] == [(0, -10.0), (1, -5.0)]
    assert drop["baseline_config_hash"] == gs[("crad", "none")]["config_hash"]
    assert gs[("crad", BYZ4)]["drop"]["mean"] == -20.0 and gs[("crad", BYZ4)]["drop"]["n_paired"] == 1
    assert gs[("local", BYZ)]["drop"]["mean"] == 0.0
    assert gs[("uniform-kd", BYZ)]["drop"]["mean"] is None and gs[("uniform-kd", BYZ)]["drop"]["n_paired"] == 0
    rows = {(r["method"], r["faults"]): r for r in csv.DictReader(io.StringIO(show(str(folder), "--format", "csv")))}
    assert rows[("crad", BYZ)]["drop_mean"] == "-7.5" and rows[("crad", BYZ)]["drop_seeds"] == "0 1"
    assert rows[("uniform-kd", BYZ)]["drop_mean"] == "" and rows[("crad", "none")]["drop_mean"] == ""
    # these records have no final window (schema < 1.6): the selected rounds' drop stands in, marked,
    # with its t-interval: -7.5 +- t(0.975, 1) * sd([-10, -5]) / sqrt(2) = -7.5 +- 12.706 * 2.5
    assert drop["statistic"] == "selected" and drop["headline_mean"] == -7.5
    assert drop["ci95"] == [-39.2655, 24.2655]
    assert rows[("crad", BYZ)]["drop_statistic"] == "selected" and rows[("crad", BYZ)]["drop_ci_low"] == "-39.2655"
    markdown = show(str(folder), "--format", "markdown")
    assert r"-7.50\* \[-39.27, +24.27\] (n=2)" in markdown and r"+0.00\* (n=1)" in markdown  # escaped


def with_final(r: dict, shift: float) -> dict:
    """``r`` with a final window: each client's final figure its selected one + ``shift`` (the
    fields the writer gives a final per-client row)."""
    rows = [{"cid": c["cid"], "global_acc": c["global_acc"] + shift, "local_acc": c["local_acc"]}
            for c in r["metrics"]["per_client"]]
    r["metrics"]["final"] = {"rounds": 2, "first_round": 1, "last_round": 2, "local_acc": 80.0, "per_client": rows,
                             "global_acc": statistics.fmean(c["global_acc"] for c in rows)}
    return r


def test_the_drop_shown_is_the_final_windows_like_the_headline(real, tmp_path):
    """With every pair's final window, the drop shown is the final one (the headline's statistic):
    final drops (70 + 1 - 80) = -9 and (77 + 3 - 82) = -2, mean -5.5; the selected rounds' -7.5
    stays in JSON and csv."""
    rs = [with_final(run_record(real, s, "crad", acc), 0.0) for s, acc in ((0, 80.0), (1, 82.0))]
    rs += [with_final(run_record(real, s, "crad", 60.0, BYZ, honest=h, faulty_acc=5.0, kind="byzantine",
                                 mode="random"), shift) for s, h, shift in ((0, 70.0, 1.0), (1, 77.0, 3.0))]
    folder = write(tmp_path / "runs", *rs)
    drop = groups(folder)[("crad", BYZ)]["drop"]
    assert drop["statistic"] == "final" and drop["headline_mean"] == -5.5 and drop["final_mean"] == -5.5
    assert drop["mean"] == -7.5 and [p["final_drop"] for p in drop["pairs"]] == [-9.0, -2.0]
    assert drop["ci95"] == [-49.9717, 38.9717]  # -5.5 +- 12.7062 * 3.5
    rows = {(r["method"], r["faults"]): r for r in csv.DictReader(io.StringIO(show(str(folder), "--format", "csv")))}
    assert rows[("crad", BYZ)]["drop_mean"] == "-5.5" and rows[("crad", BYZ)]["drop_selected_mean"] == "-7.5"
    assert r"-5.50 \[-49.97, +38.97\] (n=2)" in show(str(folder), "--format", "markdown")


def test_the_drop_needs_the_same_data(real, tmp_path):
    """A fault-free record of the same config and seed on other data is not a baseline."""
    base = run_record(real, 0, "crad", 80.0)
    base["task"]["data_fingerprint"] = "f" * 16
    faulty = run_record(real, 0, "crad", 60.0, BYZ, honest=70.0, faulty_acc=5.0, kind="byzantine", mode="random")
    gs = groups(write(tmp_path / "runs", base, faulty))
    assert gs[("crad", BYZ)]["drop"]["n_paired"] == 0 and gs[("crad", BYZ)]["drop"]["mean"] is None


def test_faulty_and_fault_free_groups_are_never_ranked_together(folder):
    rank = json.loads(show(str(folder), "--rank", "--format", "json"))["rank"]
    protocols: dict[str, set] = {}
    for row in rank:
        for x in row["ranks"]:
            protocols.setdefault(x["protocol"], set()).add(row["method"])
    clean = [p for p in protocols if "faults=" not in p]
    faulty = [p for p in protocols if f"faults={BYZ}" in p]
    assert len(clean) == 1 and protocols[clean[0]] == {"crad", "local"}
    assert len(faulty) == 1 and protocols[faulty[0]] == {"crad", "local", "uniform-kd"}
    # in the faulty protocol crad's honest 65.67 ranks below local's 90 and above uniform-kd's 35
    ranks = {row["method"]: {x["protocol"]: x["rank"] for x in row["ranks"]} for row in rank}
    assert ranks["crad"][faulty[0]] == 2 and ranks["uniform-kd"][faulty[0]] == 3 and ranks["local"][faulty[0]] == 1


def test_html_rows_show_faults_and_drop(folder, tmp_path):
    out = tmp_path / "site"
    result = CliRunner().invoke(app, ["leaderboard", "html", str(out), str(folder)])
    assert result.exit_code == 0, result.output
    index = (out / "index.html").read_text()
    assert "<th class=\"num\" data-type=\"num\">drop</th>" in index
    assert "-7.50* [-39.27, +24.27] (n=2)" in index and 'data-v="-7.5"' in index and f'data-faults="{BYZ}"' in index
    assert index.count('<section class="protocol"') == 3  # none, byzantine 0.2, byzantine 0.4
    pages = "".join(p.read_text() for p in (out / "groups").glob("*.html"))
    assert "drop against no faults" in pages and "seed 0: -10.00, seed 1: -5.00" in pages
    assert (out / "plots" / "robustness__digits.png").is_file()
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["leaderboard", "html", str(again), str(folder)]).exit_code == 0
    assert (again / "index.html").read_text() == index  # deterministic


# ----------------------------------------------------------------------------- plot robustness


def test_robustness_plot_with_its_sidecar(folder, tmp_path):
    result = CliRunner().invoke(app, ["plot", "robustness", str(folder), "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    [written] = json.loads(result.stdout)["written"]
    png = Path(written["png"])
    assert png.name == "robustness__digits.png" and png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    sidecar = json.loads(Path(written["sources"]).read_text())
    assert sidecar["kind"] == "robustness" and sidecar["n_records"] == 10
    assert "mean ± sample sd" in sidecar["caption"] and "Drawn from 10 records" in sidecar["caption"]
    [panel] = sidecar["details"]["panels"]
    assert panel["fault_kind"] == "byzantine" and "fraction of clients" in panel["x"]
    lines = {s["method"]: s for s in panel["series"]}
    crad = [(p["x"], p["mean"], p["n"], p["faults"]) for p in lines["crad"]["points"]]
    assert crad == [(0.0, 82.0, 3, "none"), (0.2, round((70 + 77 + 50) / 3, 4), 3, BYZ), (0.4, 60.0, 1, BYZ4)]
    assert [p["x"] for p in lines["uniform-kd"]["points"]] == [0.2]  # no baseline: no point at 0
    assert {r["file"] for r in sidecar["records"]} == {str(p) for p in folder.glob("*.json")}


def test_all_draws_robustness_only_with_faulty_records(folder, tmp_path):
    result = CliRunner().invoke(app, ["plot", "all", str(folder), "--out", str(tmp_path / "a"), "--json"])
    assert result.exit_code == 0, result.output
    assert "robustness" in {w["kind"] for w in json.loads(result.stdout)["written"]}
    clean = tmp_path / "clean"
    clean.mkdir()
    for f in folder.glob("*.json"):
        if "faults" not in json.loads(f.read_text()):
            (clean / f.name).write_text(f.read_text())
    result = CliRunner().invoke(app, ["plot", "all", str(clean), "--out", str(tmp_path / "b"), "--json"])
    assert result.exit_code == 0, result.output
    assert "robustness" not in {w["kind"] for w in json.loads(result.stdout)["written"]}
    result = CliRunner().invoke(app, ["plot", "robustness", str(clean), "--out", str(tmp_path / "c")])
    assert result.exit_code == 2 and "no records run with --faults" in result.output


def test_strength_kinds_use_the_strength_as_x(real, tmp_path):
    rs = [run_record(real, 0, "crad", 80.0)]
    rs += [run_record(real, 0, "crad", 60.0, f"label-noise:0.3@{s}/symmetric", honest=80.0 - 10 * s,
                      faulty_acc=5.0, kind="label-noise", fraction=0.3, strength=s, mode="symmetric")
           for s in (0.5, 1.0)]
    result = CliRunner().invoke(app, ["plot", "robustness", str(write(tmp_path / "runs", *rs)),
                                      "--out", str(tmp_path / "plots"), "--json"])
    assert result.exit_code == 0, result.output
    sidecar = json.loads(Path(json.loads(result.stdout)["written"][0]["sources"]).read_text())
    [panel] = sidecar["details"]["panels"]
    assert panel["fault_kind"] == "label-noise" and "strength" in panel["x"]
    [line] = panel["series"]
    assert [(p["x"], p["mean"]) for p in line["points"]] == [(0.0, 80.0), (0.5, 75.0), (1.0, 70.0)]
