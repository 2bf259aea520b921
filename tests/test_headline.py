"""The headline rule (``hfl_bench.results.headline``): one figure, the same in every view; and the
critical-difference plot (``hfl_bench.results.cd``) on a synthetic folder whose order is known."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
from scipy.stats import chi2
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.results.figures import FINAL, SELECTED, headline_basis, headline_value

from helpers import write_records as write

REPO = Path(__file__).resolve().parents[1]
# A real record with final figures (schema 1.2): every synthetic record below is a copy of it.
BASE = REPO / "leaderboards" / "reproduced" / "digits" / "digits__local__1624b0b7f8d9f009__seed0.json"


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.output


def synthetic(base: dict, task: str, method: str, seed: int, selected: float, final: float) -> dict:
    """The real record as another task, method and seed, with its selected-round and final figures set."""
    r = copy.deepcopy(base)
    r["task"]["name"] = r["config"]["task"] = task
    r["method"]["name"] = r["config"]["method"] = method
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["metrics"]["global_acc"], r["metrics"]["final"]["global_acc"] = selected, final
    r["config_hash"] = f"{task}-{method}"
    r["partition"]["hash"] = f"part-seed{seed}"
    r["record_id"] = f"{task}-{method}-{seed}"
    return r




@pytest.fixture(scope="module")
def base() -> dict:
    return json.loads(BASE.read_text())


# ----------------------------------------------------------------------------- the rule


def test_headline_value_is_the_final_figure_with_a_visible_fallback(base):
    r = synthetic(base, "digits", "local", 0, 60.0, 70.0)
    assert headline_value(r) == 70.0 and headline_basis(r) == FINAL
    del r["metrics"]["final"]  # a record from before schema 1.2
    assert headline_value(r) == 60.0 and headline_basis(r) == SELECTED
    r["metrics"]["global_acc"] = None
    assert headline_value(r) is None and headline_basis(r) is None


def _summary_headline(output: str) -> float:
    return float(re.search(r"headline global acc \(%\)\s*│?\s*([0-9.]+)", output).group(1))


def test_every_view_shows_the_same_headline(tmp_path):
    """Two real runs: the run summary, `show RECORD`, `leaderboard show` (json, csv, markdown), the
    rank and the HTML site all give each run's final figure as its headline, and the selected
    round's beside it."""
    runs = tmp_path / "runs"
    printed = {}
    for method in ("local", "uniform-kd"):
        code, _, output = invoke("run", "--method", method, "--task", "digits", "--clients", "3", "--rounds", "4",
                                 "--out", str(runs), "-q")
        assert code == 0, output
        printed[method] = _summary_headline(output)
    records = {json.loads(p.read_text())["method"]["name"]: (p, json.loads(p.read_text())) for p in runs.glob("*.json")}
    for method, (path, record) in records.items():
        final = record["metrics"]["final"]["global_acc"]
        assert printed[method] == round(final, 2)  # the run summary
        code, _, output = invoke("show", str(path))
        assert code == 0 and _summary_headline(output) == round(final, 2)

    board = json.loads(invoke("leaderboard", "show", str(runs), "--format", "json")[1])
    by_method = {g["method"]: g for g in board["groups"]}
    for method, (_, record) in records.items():
        g = by_method[method]
        assert g["global_acc"]["mean"] == record["metrics"]["final"]["global_acc"]
        assert g["selected"]["global_acc"]["mean"] == record["metrics"]["global_acc"]
        assert g["headline_statistic"] == FINAL

    csv_out = invoke("leaderboard", "show", str(runs), "--format", "csv")[1]
    markdown = invoke("leaderboard", "show", str(runs), "--format", "markdown")[1]
    rank = json.loads(invoke("leaderboard", "show", str(runs), "--rank", "--format", "json")[1])["rank"]
    site = tmp_path / "site"
    assert invoke("leaderboard", "html", str(site), str(runs))[0] == 0
    index = (site / "index.html").read_text()
    for method, (_, record) in records.items():
        final, selected = record["metrics"]["final"]["global_acc"], record["metrics"]["global_acc"]
        line = next(x for x in markdown.splitlines() if x.startswith(f"| {method} |"))
        header = next(x for x in markdown.splitlines() if x.startswith("| method |")).split(" | ")
        cells = line.split(" | ")
        assert cells[header.index("global acc")] == f"{final:.2f} ± -"
        assert cells[header.index("selected global")] == f"{selected:.2f} ± -"
        assert f",{final},-," in csv_out.replace(",,", ",-,")  # global_mean, then an empty global_sd
        [row] = [r for r in rank if r["method"] == method]
        assert row["ranks"][0]["global_acc"] == final
        assert f'data-v="{final}">{final:.2f} ± -</td>' in index
        assert f'data-v="{selected}">{selected:.2f} ± -</td>' in index
    finals = {m: rec["metrics"]["final"]["global_acc"] for m, (_, rec) in records.items()}
    assert [r["method"] for r in rank] == sorted(finals, key=lambda m: -finals[m])


def test_a_record_without_a_final_figure_is_marked(base, tmp_path):
    old = synthetic(base, "digits", "local", 0, 60.0, 70.0)
    del old["metrics"]["final"]
    old["schema_version"] = "1.1"
    folder = write(tmp_path / "old", [old])
    markdown = invoke("leaderboard", "show", str(folder), "--format", "markdown")[1]
    assert "| 60.00 ± -\\* |" in markdown and "the figure at the selected round stands in" in markdown
    [g] = json.loads(invoke("leaderboard", "show", str(folder), "--format", "json")[1])["groups"]
    assert g["global_acc"]["mean"] == 60.0 and g["headline_statistic"] == SELECTED


# ----------------------------------------------------------------------------- critical difference

# Four methods over five tasks, in the same order in every task (a > b > c > d): finals far apart,
# the selected-round figures in the opposite order (the diagram ranks the headline).
METHODS = ("crad", "uniform-kd", "fedmkd", "local")
TASKS = ("t1", "t2", "t3", "t4", "t5")


@pytest.fixture(scope="module")
def cd_folder(base, tmp_path_factory) -> Path:
    records = []
    for t, task in enumerate(TASKS):
        for m, method in enumerate(METHODS):
            for seed in (0, 1):
                final = 90.0 - 10 * m + t + seed
                records.append(synthetic(base, task, method, seed, selected=50.0 + 10 * m, final=final))
    # a fifth method in one task only: left out (a Friedman test needs complete blocks)
    records.append(synthetic(base, "t1", "fml", 0, 50.0, 99.0))
    return write(tmp_path_factory.mktemp("cd") / "runs", records)


def test_cd_plot_ranks_and_friedman_p_as_computed_by_hand(cd_folder, tmp_path):
    out = tmp_path / "plots"
    code, stdout, output = invoke("plot", "cd", str(cd_folder), "--out", str(out), "--json")
    assert code == 0, output
    [w] = json.loads(stdout)["written"]
    png = Path(w["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    sidecar = json.loads(Path(w["sources"]).read_text())
    assert sidecar["methods"] == sorted(METHODS) and sidecar["left_out"] == ["fml"]
    assert sidecar["average_ranks"] == {"crad": 1.0, "uniform-kd": 2.0, "fedmkd": 3.0, "local": 4.0}
    # Friedman by hand (Demsar 2006, eq. 1): k = 4, N = 5, average ranks 1..4
    k, n = 4, 5
    statistic = 12 * n / (k * (k + 1)) * sum(r * r for r in (1, 2, 3, 4)) - 3 * n * (k + 1)
    assert statistic == 15.0
    assert sidecar["friedman"]["statistic"] == pytest.approx(statistic)
    assert sidecar["friedman"]["p"] == pytest.approx(chi2.sf(statistic, k - 1))
    # CD = q_0.05 * sqrt(k (k + 1) / (6 N)), q_0.05 = 2.569 for k = 4 (Demsar's Table 5a)
    assert sidecar["critical_difference"] == pytest.approx(2.569 * math.sqrt(k * (k + 1) / (6 * n)), abs=1e-3)
    assert sidecar["nemenyi_p"]["crad"]["local"] < 0.05 < sidecar["nemenyi_p"]["crad"]["uniform-kd"]
    assert len(sidecar["records"]) == len(METHODS) * len(TASKS) * 2


@pytest.mark.parametrize("keep", [("t1",), ("t1", "t2")])
def test_cd_plot_refuses_too_few_blocks_or_methods(cd_folder, tmp_path, keep):
    folder = tmp_path / "few"
    folder.mkdir()
    for p in cd_folder.glob("*.json"):
        r = json.loads(p.read_text())
        if r["task"]["name"] in keep and (len(keep) == 1 or r["method"]["name"] in METHODS[:2]):
            (folder / p.name).write_text(p.read_text())
    code, _, output = invoke("plot", "cd", str(folder), "--out", str(tmp_path / "plots"))
    assert code == 2
    assert "needs 2 or more blocks" in output and len(output.strip().splitlines()) == 1
    assert not (tmp_path / "plots").exists() or not list((tmp_path / "plots").glob("*.png"))
