"""``leaderboard compare --clock`` (the time figures paired by seed, ``timing.compare``) and the
site's clock columns, through the real CLI on records real runs wrote (digits, two clients, three
rounds, ``--devices mixed-phones``): local on seeds 0-2; crad on seeds 0-1 with devices and seed 2
without (no clock: not recorded); crad with a deadline no client meets on seed 0 (it never trains:
its time to local is not reached). Every expected figure is computed here from the records."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.results.timing import accuracy_at, time_to_accuracy

from helpers import REAL_RECORD, invoke_cli

PROTOCOL = ("--task", "digits", "--rounds", "3", "--eval-every", "1", "--clients", "2", "-q")
DEVICES = ("--devices", "mixed-phones")


def _run(out: Path, method: str, seed: int, *args: str) -> dict:
    result, stdout, _ = invoke_cli("run", *PROTOCOL, "--method", method, "--seed", str(seed), "--out", str(out), *args)
    assert result.exit_code == 0, stdout
    (path,) = out.glob(f"*seed{seed}.json")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("clock-compare") / "board"
    out = {"base": base}
    out["local"] = {s: _run(base / "local", "local", s, *DEVICES) for s in (0, 1, 2)}
    out["crad"] = {s: _run(base / "crad", "crad", s, *DEVICES) for s in (0, 1)}
    out["crad_plain"] = _run(base / "crad-plain", "crad", 2)  # no clock: seed 2 is not recorded
    out["crad_late"] = _run(base / "crad-late", "crad", 0, *DEVICES, "--deadline", "0.001")
    return out


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, ["leaderboard", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _target(local: dict) -> float:
    return local["metrics"]["final"]["global_acc"]


def _by_figure(data: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in data["tables"]:
        out.setdefault(t["figure"], []).extend(t["comparisons"])
    return out


def test_compare_clock_pairs_the_time_figures_by_seed(board):
    local, crad = board["local"], board["crad"]
    data = json.loads(cli("compare", str(board["base"]), "--clock", "--method", "crad", "--json"))
    assert data["figures"] == ["sim_time", "time_to_local"]  # acc_at_budget only with --time-budget
    by_figure = _by_figure(data)
    # the crad group the seeds 0-2 fall in (seed 2 without a clock), not the late one (seed 0 only)
    [sim] = [c for c in by_figure["sim_time"] if c["pairing"]["no_figure"]]
    assert sim["b"] == "local" and sim["pairing"]["seeds"] == [0, 1] and sim["pairing"]["no_figure"] == [2]
    assert sim["pairing"]["no_figure_why"] == [{"seed": 2, "why": "crad not recorded"}]
    d = [crad[s]["clock"]["total_s"] - local[s]["clock"]["total_s"] for s in (0, 1)]
    assert sim["mean_difference"] == pytest.approx(statistics.fmean(d), abs=1e-4)
    assert sim["a_figure"]["n"] == 2 and sim["b_figure"]["n"] == 3
    # time to local's final accuracy, by hand from each record's curve
    [ttl] = [c for c in by_figure["time_to_local"] if c["a_group_id"] == sim["a_group_id"]]
    mine = {s: time_to_accuracy(crad[s], _target(local[s])) for s in (0, 1)}
    own = {s: time_to_accuracy(local[s], _target(local[s])) for s in (0, 1)}
    assert all(v is not None for v in own.values())  # local reaches its own final mean at its best round
    paired = [s for s in (0, 1) if mine[s] is not None]
    assert ttl["pairing"]["seeds"] == paired
    if paired:
        assert ttl["mean_difference"] == pytest.approx(statistics.fmean(mine[s] - own[s] for s in paired), abs=1e-4)


def test_a_seed_that_never_reaches_the_target_is_left_out_and_counted(board):
    late = board["crad_late"]
    assert time_to_accuracy(late, _target(board["local"][0])) is None  # no client ever met the deadline
    data = json.loads(cli("compare", str(board["base"]), "--clock", "--method", "crad", "--json"))
    [ttl] = [c for c in _by_figure(data)["time_to_local"] if c["pairing"]["only_b"] == [1, 2]]
    assert ttl["n"] == 0 and ttl["verdict"] == "too few pairs" and ttl["a_figure"]["state"] == "not reached"
    assert ttl["pairing"]["no_figure_why"] == [{"seed": 0, "why": "crad not reached"}]
    lines = cli("compare", str(board["base"]), "--clock", "--method", "crad")  # piped: plain lines
    assert lines.splitlines()[0].startswith("figure | section | protocol | A - B | A figure | B figure")
    assert any(line.startswith("time_to_local |") and "dropped seed 0: crad not reached" in line
               for line in lines.splitlines())
    assert any(line.startswith("sim_time |") and "dropped seed 2: crad not recorded" in line
               for line in lines.splitlines())


def test_time_budget_adds_accuracy_at_budget(board):
    local, crad = board["local"], board["crad"]
    budget = 0.5
    data = json.loads(cli("compare", str(board["base"]), "--time-budget", str(budget), "--method", "crad", "--json"))
    assert data["figures"] == ["sim_time", "time_to_local", "acc_at_budget"]
    [acc] = [c for c in _by_figure(data)["acc_at_budget"] if c["pairing"]["no_figure"] == [2]]
    d = [accuracy_at(crad[s], budget) - accuracy_at(local[s], budget) for s in (0, 1)]
    assert acc["n"] == 2 and acc["mean_difference"] == pytest.approx(statistics.fmean(d), abs=1e-4)
    markdown = cli("compare", str(board["base"]), "--clock", "--time-budget", str(budget), "--method", "crad",
                   "--format", "markdown")
    assert "paired by seed, figure: acc_at_budget" in markdown
    assert "| A | A figure | B | B figure | n | A - B \\[95% CI\\] |" in markdown


@pytest.mark.parametrize("args, said", [
    (("--clock", "--fairness"), "--fairness and --clock each choose the figures compared"),
    (("--clock", "--figure", "selected"), "--clock compares the simulated-time figures"),
    (("--time-budget", "inf"), "--time-budget must be a finite number"),
    (("--clock", "--variants", "crad"), "--variants does not apply"),
])
def test_bad_clock_comparisons_are_one_line_and_exit_2(board, args, said):
    result = CliRunner().invoke(app, ["leaderboard", "compare", str(board["base"]), *args])
    assert result.exit_code == 2 and said in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_site_shows_the_clock_where_a_group_has_one(board, tmp_path):
    cli("html", str(board["base"]), "--out", str(tmp_path / "site"))
    index = (tmp_path / "site" / "index.html").read_text()
    assert ">sim time (s)</th>" in index and ">time to local (s)</th>" in index
    assert "acc @ time budget" not in index  # the site has no budget
    total = statistics.fmean(board["local"][s]["clock"]["total_s"] for s in (0, 1, 2))
    assert f'data-v="{round(total, 4)}"' in index
    pages = {p.name: p.read_text() for p in (tmp_path / "site" / "groups").glob("*.html")}
    [page] = [text for text in pages.values() if "Seeds without a clock (not recorded): 2." in text]
    assert "Time on devices" in page and f'<td class="num">{board["crad"][0]["clock"]["total_s"]:.2f}</td>' in page
    # a board without a clock keeps its site as it was: no clock column, no section
    cli("html", str(REAL_RECORD), "--out", str(tmp_path / "plain"))
    plain = (tmp_path / "plain" / "index.html").read_text()
    assert "sim time" not in plain
    assert not any("Time on devices" in p.read_text() for p in (tmp_path / "plain" / "groups").glob("*.html"))
