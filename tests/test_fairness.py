"""Fairness views (issue 65): client sd, worst 10 % and below local, per seed then over seeds,
through the real CLI (``leaderboard show --fairness`` / ``--columns``, ``compare --fairness``,
``--json``, the HTML site) on records in the real format with hand-chosen per-client accuracies.

The numbers, by hand (10 clients, final local-test accuracy by client id 0-9):

- crad seed 0: 70, 90, 70, 90, ... (five of each): population sd 10, worst 10 % (1 client) 70;
  crad seed 1: 75, 85, ...: sd 5, worst 75. Over seeds: sd 7.50 ± 3.54 (sample sd of 10 and 5:
  sqrt(12.5)), worst 72.50 ± 3.54.
- local seed 0: 80 everywhere (sd 0, worst 80): crad's five 70s are below: 50 %. local seed 1:
  85 for clients 0-4, 75 for 5-9 (sd 5, worst 75): crad's 75s of clients 0, 2, 4 are below; its
  85s of 1, 3 and 75s of 6, 8 are equal, not below: 30 %. Over seeds: 40.00 ± 14.14.
- crad - local, paired by seed: sd 10 - 0 and 5 - 5 (+5.00), worst 70 - 80 and 75 - 75 (-5.00),
  below local 50 - 0 and 30 - 0 (+40.00).
"""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.results.fairness import below_local, client_sd, worst10, worst_count

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "leaderboards" / "reproduced" / "digits" / "digits__crad__0d282c207317eaa2__seed0.json"  # schema 1.6
OLD = REPO / "leaderboards" / "archive" / "first-wave" / "digits" / "digits__crad__da48ac8fb4f0dad1__seed0.json"

CRAD = {0: [70, 90] * 5, 1: [75, 85] * 5}
LOCAL = {0: [80] * 10, 1: [85] * 5 + [75] * 5}


@pytest.fixture(scope="module")
def base() -> dict:
    record = json.loads(BASE.read_text())
    record["history"] = record["history"][:3]  # small files; nothing here reads it
    return record


def record(base: dict, method: str, seed: int, accs: list[float], partition: str = "") -> dict:
    """The real record as ``method``'s run of ``seed`` with these final local-test accuracies by client id."""
    r = copy.deepcopy(base)
    r["method"]["name"] = r["config"]["method"] = method
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["config_hash"] = f"fair-{method}"
    r["partition"]["hash"] = partition or f"part-seed{seed}"
    r["record_id"] = f"fair-{method}-{seed}"
    r["metrics"]["final"]["per_client"] = [{"cid": cid, "global_acc": 50.0, "local_acc": float(acc)}
                                           for cid, acc in enumerate(accs)]
    return r


def write(folder: Path, *records: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r in records:
        (folder / f"{r['record_id']}.json").write_text(json.dumps(r))
    return folder


@pytest.fixture()
def board(base, tmp_path) -> Path:
    """crad and local with the hand-chosen figures; fedmkd on partitions local never drew (no twin)."""
    return write(tmp_path / "records",
                 *(record(base, "crad", s, CRAD[s]) for s in (0, 1)),
                 *(record(base, "local", s, LOCAL[s]) for s in (0, 1)),
                 *(record(base, "fedmkd", s, CRAD[s], partition=f"other{s}") for s in (0, 1)))


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, ["leaderboard", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return result.stdout


def groups(*args: str) -> dict[str, dict]:
    return {g["method"]: g for g in json.loads(cli("show", *args, "--json"))["groups"]}


# ----------------------------------------------------------------------------- the figures


def test_the_figures_of_one_seed_by_hand():
    assert client_sd([70, 90] * 5) == 10.0 and client_sd([80] * 10) == 0.0  # population sd
    assert worst10([70, 90] * 5) == 70.0
    assert [worst_count(n) for n in (1, 5, 10, 11, 15, 20, 21)] == [1, 1, 1, 2, 2, 2, 3]  # ceil(n / 10), at least 1
    assert worst10([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 100, 100, 100, 100, 100]) == 15.0  # 15 clients: 2
    assert below_local({0: 75.0, 1: 85.0, 2: 60.0}, {0: 85.0, 1: 85.0}) == 50.0  # equal is not below; 2 unpaired
    assert below_local({0: 75.0}, {1: 85.0}) is None


def test_show_fairness_json_matches_the_hand_numbers(board):
    g = groups(str(board), "--fairness")
    crad = g["crad"]
    assert crad["client_sd"] == {"mean": 7.5, "sd": 3.5355, "n": 2, "state": None}
    assert crad["worst10"] == {"mean": 72.5, "sd": 3.5355, "n": 2, "state": None}
    assert crad["below_local"] == {"mean": 40.0, "sd": 14.1421, "n": 2, "state": None}
    assert [s["below_local"] for s in crad["fairness"]["per_seed"]] == [50.0, 30.0]
    assert g["local"]["below_local"]["mean"] == 0.0 and g["local"]["client_sd"]["mean"] == 2.5
    # fedmkd drew partitions no local record drew: its figures, but below local is not available
    fedmkd = g["fedmkd"]
    assert fedmkd["client_sd"]["mean"] == 7.5
    assert fedmkd["below_local"] == {"mean": None, "sd": None, "n": 0, "state": "not available"}
    assert fedmkd["fairness"]["no_local_seeds"] == [0, 1]


def test_default_views_have_no_fairness_columns(board):
    assert "client_sd" not in groups(str(board))["crad"]
    table = cli("show", str(board))
    assert not any(word in table for word in ("client sd", "worst", "below", "not available"))
    assert "below_local" not in cli("show", str(board), "--format", "csv")
    assert "client sd" not in cli("show", str(board), "--format", "markdown")


def test_show_fairness_table_markdown_csv_and_columns(board):
    table = cli("show", str(board), "--fairness")
    assert "7.50 ± 3.54" in table and "72.50 ± 3.54" in table and "40.00 ± 14.14" in table
    assert "not available" in table
    markdown = cli("show", str(board), "--fairness", "--format", "markdown")
    assert "| client sd | worst 10% | below local |" in markdown
    assert "| 7.50 ± 3.54 | 72.50 ± 3.54 | 40.00 ± 14.14 |" in markdown
    rows = {r["method"]: r for r in csv.DictReader(io.StringIO(cli("show", str(board), "--fairness", "-f", "csv")))}
    assert [rows["crad"][f"worst10_{k}"] for k in ("mean", "sd", "n")] == ["72.5", "3.5355", "2"]
    assert rows["fedmkd"]["below_local_mean"] == "" and rows["fedmkd"]["below_local_n"] == "0"
    chosen = cli("show", str(board), "--format", "markdown", "--columns", "method,below local")
    assert "| method | below local |" in chosen and "| crad | 40.00 ± 14.14 |" in chosen
    assert "below local" not in cli("show", str(board), "--format", "markdown", "--columns", "all")
    assert "| below local |" in cli("show", str(board), "--format", "markdown", "--columns", "all", "--fairness")


def test_an_old_record_reads_not_recorded(base, tmp_path):
    old = json.loads(OLD.read_text())  # schema 1.0: no final per-client figures
    old["history"] = old["history"][:3]
    folder = write(tmp_path / "old", old)
    [g] = json.loads(cli("show", str(folder), "--fairness", "--json"))["groups"]
    assert all(g[k]["state"] == "not recorded" and g[k]["n"] == 0 for k in ("client_sd", "worst10", "below_local"))
    assert g["fairness"]["not_recorded_seeds"] == [0]
    assert cli("show", str(folder), "--fairness").count("not recorded") == 3


def test_a_group_without_a_local_twin_is_not_available(base, tmp_path):
    folder = write(tmp_path / "alone", *(record(base, "crad", s, CRAD[s]) for s in (0, 1)))
    [g] = json.loads(cli("show", str(folder), "--fairness", "--json"))["groups"]
    assert g["below_local"]["state"] == "not available" and g["client_sd"]["mean"] == 7.5


def test_under_faults_only_the_honest_clients_count(base, tmp_path):
    faulty = record(base, "crad", 0, [10.0] + [70, 90] * 4 + [10.0])
    faulty["faults"] = {"spec": "byzantine:fraction=0.2", "honest_clients": list(range(1, 9)),
                        "faulty_clients": [0, 9]}
    from hfl_bench.results.fairness import client_accuracies, headline_client_ids

    accs = client_accuracies(faulty, headline_client_ids(faulty))
    assert sorted(accs) == list(range(1, 9)) and client_sd(accs.values()) == 10.0


def test_compare_fairness_pairs_by_seed(board):
    data = json.loads(cli("compare", str(board), "--fairness", "--method", "crad", "--json"))
    by_figure = {t["figure"]: t["comparisons"] for t in data["tables"]}
    assert list(by_figure) == ["client_sd", "worst10", "below_local"]
    means = {f: c[0]["mean_difference"] for f, c in by_figure.items()}
    assert means == {"client_sd": 5.0, "worst10": -5.0, "below_local": 40.0}
    assert all(c[0]["n"] == 2 and c[0]["b"] == "local" for c in by_figure.values())
    assert by_figure["worst10"][0]["a_figure"]["mean"] == 72.5
    lines = cli("compare", str(board), "--fairness", "--method", "crad")  # piped: plain lines
    assert lines.splitlines()[0].startswith("figure | section | protocol | A - B")
    assert any(line.startswith("below_local |") and "+40.00" in line and "n=2" in line
               for line in lines.splitlines())
    # fedmkd drew other partitions than local: no seed pairs (counted), and its below local is not available
    data = json.loads(cli("compare", str(board), "--fairness", "--method", "fedmkd", "--json"))
    [below] = [t["comparisons"][0] for t in data["tables"] if t["figure"] == "below_local"]
    assert below["n"] == 0 and below["pairing"]["partition_differs"] == [0, 1]
    assert below["a_figure"]["state"] == "not available"


def test_compare_fairness_refuses_a_figure_in_one_line(board):
    result = CliRunner().invoke(app, ["leaderboard", "compare", str(board), "--fairness", "--figure", "selected"])
    assert result.exit_code == 2 and "--figure does not apply" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_site_has_the_fairness_columns(board, tmp_path):
    cli("html", str(board), "--out", str(tmp_path / "site"))
    index = (tmp_path / "site" / "index.html").read_text()
    for header in ("client sd", "worst 10%", "below local"):
        assert f">{header}</th>" in index
    assert "7.50 ± 3.54" in index and 'data-v="72.5"' in index and "not available" in index
    pages = {p.name: p.read_text() for p in (tmp_path / "site" / "groups").glob("*.html")}
    [crad] = [text for name, text in pages.items() if "crad" in name]
    assert "Whom it serves" in crad and '<td class="num">50.00</td>' in crad and '<td class="num">30.00</td>' in crad
