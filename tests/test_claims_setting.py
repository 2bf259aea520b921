"""``leaderboard claims`` says where each verdict was tested (issue 62), through the real CLI on
small copies of a real record: each claim's setting match (the paper's setting, a proxy, another
experiment) in its verdict and the brief table; the test at the paper's figure (the selected round)
beside the headline's, and a row whose verdict there differs; as many seeds a trend's level as a
comparison can resolve with; the per-seed ratio of a trend (a paper's "factor"); records from a
tree with uncommitted changes marked on the row; and the committed claims file's quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_claims import BASE, UP, assert_one_line_exit_2, claim, claims_file, clients_runs, one, run_json
from test_paired_stats import real, runs, variant, write  # noqa: F401 - real is a fixture used by name

from helpers import invoke_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def folder(real, tmp_path):  # noqa: F811
    return write(tmp_path / "reproduced" / "runs", *runs(real, "crad", UP), *runs(real, "local", BASE))


def proxy(cid: str = "c1", **test) -> dict:
    return claim(cid, setting="proxy", differs="digits for CIFAR-10", **test)


def test_a_verdict_off_the_papers_setting_says_where_it_was_reached(folder, tmp_path):
    up, down = one({"method": "crad"}, {"method": "local"}), one({"method": "local"}, {"method": "crad"})
    path = claims_file(tmp_path, proxy("p-up", comparisons=[up]), proxy("p-down", comparisons=[down]),
                       claim("o-down", setting="other", differs="another family", comparisons=[down]),
                       claim("paper-down", comparisons=[down]))
    got = run_json(path)
    assert {k: (c["verdict"], c["verdict_label"]) for k, c in got.items()} == {
        "p-up": ("reproduced", "reproduced on a proxy"), "p-down": ("contradicted", "contradicted on a proxy"),
        "o-down": ("contradicted", "contradicted, other experiment"), "paper-down": ("contradicted", "contradicted")}
    assert (got["p-up"]["setting"], got["p-up"]["differs"]) == ("proxy", "digits for CIFAR-10")
    _, md, _ = invoke_cli("leaderboard", "claims", str(path), "-f", "markdown")
    rows = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ") and " | " in line}
    assert "| proxy: digits for CIFAR-10 |" in rows["p-down"] and "| contradicted on a proxy |" in rows["p-down"]
    assert "| contradicted, other experiment |" in rows["o-down"]
    assert "| contradicted |" in rows["paper-down"]  # only the paper's own setting reads bare
    _, brief, _ = invoke_cli("leaderboard", "claims", str(path), "--brief")
    assert brief.splitlines()[0].endswith("| setting match | verdict | tested lines")  # the header row
    assert "| proxy | contradicted on a proxy | 1 contradicted" in brief.splitlines()[2]


@pytest.mark.parametrize("change, message", [
    ({"setting": None}, "claim 1: missing 'setting'"),
    ({"setting": "proxi"}, "'setting' must be one of paper, proxy, other"),
    ({"setting": "proxy"}, "setting proxy needs 'differs': what differs from the paper's setting"),
    ({"setting": "other"}, "setting other needs 'differs': why it is another experiment"),
    ({"differs": "N"}, "'differs' is for a proxy or another experiment; setting is paper"),
    ({"paper_figure": None}, "claim 1: missing 'paper_figure'"),
    ({"paper_figure": "best"}, "'paper_figure' must be one of selected, final"),
    ({"trend": {"records": "r", "over": "k", "values": [2, 1], "a": {"method": "crad"}, "b": {"method": "local"},
                "statistic": "factor"}}, "'statistic' must be one of difference, ratio"),
])
def test_a_bad_setting_match_is_one_line_exit_2(tmp_path, change, message):
    assert_one_line_exit_2(tmp_path, change, message)


def test_the_papers_selected_round_beside_the_headline(real, tmp_path):  # noqa: F811
    # the final window (the headline) resolves crad above local; at the selected round one seed falls
    # below (p 4/64 is not below 0.05), so the verdict there differs and the row says so
    selected = UP[:5] + [60.5]
    write(tmp_path / "reproduced" / "runs", *[variant(real, "crad", s, selected[s], final=UP[s]) for s in range(6)],
          *runs(real, "local", BASE))
    comparison = one({"method": "crad"}, {"method": "local"})
    got = run_json(claims_file(tmp_path, claim(comparisons=[comparison], paper_figure="selected")))["c1"]
    [r] = got["results"]
    assert (r["figure"], r["mean_difference"], r["verdict"]) == ("final", 2.3333, "reproduced")
    at = r["at_paper_figure"]
    assert (at["figure"], at["verdict"], at["p_holm"]) == ("selected", "not resolved", pytest.approx(4 / 64))
    assert got["verdict"] == "reproduced"  # the verdict is the headline's
    _, md, _ = invoke_cli("leaderboard", "claims", str(claims_file(tmp_path, claim(
        comparisons=[comparison], paper_figure="selected"))), "-f", "markdown")
    row = next(line for line in md.splitlines() if line.startswith("| c1 "))
    assert "| reproduced (at the paper's selected figure: not resolved) |" in row
    assert row.endswith("| selected: +1.83 \\[0.52, 3.15\\], p 0.062, not resolved |")
    # a paper that reports the final figure has no second test
    [r] = run_json(claims_file(tmp_path, claim(comparisons=[comparison])))["c1"]["results"]
    assert r["at_paper_figure"] is None


def test_a_trend_needs_as_many_seeds_a_level_as_a_comparison(real, tmp_path):  # noqa: F811
    # two seeds a level used to read "reproduced" from Welch's test; a comparison needs six
    def level(n: int, accs: list[float]) -> list[dict]:
        return clients_runs(real, "crad", n, accs) + clients_runs(real, "uniform-kd", n, [50.0] * len(accs))

    trend = {"records": "reproduced/runs", "over": "clients", "values": [10, 20],
             "a": {"method": "crad"}, "b": {"method": "uniform-kd"}}
    write(tmp_path / "two" / "reproduced" / "runs", *level(10, [51.0, 51.1]), *level(20, [55.0, 55.2]))
    c = run_json(claims_file(tmp_path / "two", claim(trend=trend)))["c1"]
    [r] = c["results"]
    assert r["p_holm"] < 0.05 and r["ci95"][0] > 0  # Welch alone would resolve it
    assert (r["n"], r["verdict"], c["verdict"]) == ("2 vs 2", "n cannot resolve", "n cannot resolve")
    write(tmp_path / "six" / "reproduced" / "runs", *level(10, [51.0 + d / 10 for d in range(6)]),
          *level(20, [55.0 + d / 10 for d in range(6)]))
    [r] = run_json(claims_file(tmp_path / "six", claim(trend=trend)))["c1"]["results"]
    assert (r["n"], r["verdict"]) == ("6 vs 6", "reproduced")
    # a comparison on five seeds, whose smallest sign-flip p is 1/16, says so too
    write(tmp_path / "five" / "reproduced" / "runs", *runs(real, "crad", UP[:5]), *runs(real, "local", BASE[:5]))
    path = claims_file(tmp_path / "five", claim(comparisons=[one({"method": "crad"}, {"method": "local"})]))
    assert run_json(path)["c1"]["results"][0]["verdict"] == "n cannot resolve"


def test_a_trend_on_the_papers_factor(real, tmp_path):  # noqa: F811
    # N = 10: about 61 vs 60 (ratio 1.017); N = 20: about 22 vs 20 (ratio 1.10): the ratio per seed, tested
    write(tmp_path / "reproduced" / "runs",
          *clients_runs(real, "crad", 10, [61.0 + d / 100 for d in range(6)]),
          *clients_runs(real, "uniform-kd", 10, [60.0] * 6),
          *clients_runs(real, "crad", 20, [22.0 + d / 100 for d in range(6)]),
          *clients_runs(real, "uniform-kd", 20, [20.0] * 6))
    trend = {"records": "reproduced/runs", "over": "clients", "values": [10, 20],
             "a": {"method": "crad"}, "b": {"method": "uniform-kd"}}
    c = run_json(claims_file(tmp_path, claim(trend=[trend, dict(trend, statistic="ratio")])))["c1"]
    diff, ratio = c["results"]
    assert diff["test"] == "(crad - uniform-kd) at clients=20 - at clients=10"
    assert ratio["test"] == "(crad / uniform-kd) ratio at clients=20 - at clients=10"
    assert diff["mean_difference"] == pytest.approx(1.0, abs=1e-3)
    assert ratio["mean_difference"] == pytest.approx(1.10125 - 1.01708, abs=1e-4)
    assert ratio["notes"][:2] == ["clients=10: mean ratio 1.017 (n=6)", "clients=20: mean ratio 1.101 (n=6)"]


def test_records_from_a_dirty_tree_are_marked_on_the_row(real, tmp_path):  # noqa: F811
    dirty = runs(real, "local", BASE)
    for r in dirty[:2]:
        r["code"] = {**(r.get("code") or {}), "git_dirty": True}
    write(tmp_path / "reproduced" / "runs", *runs(real, "crad", UP), *dirty)
    path = claims_file(tmp_path, claim(comparisons=[one({"method": "crad"}, {"method": "local"})]))
    [r] = run_json(path)["c1"]["results"]
    assert r["pairing"]["uncommitted"] == [0, 1]
    _, md, _ = invoke_cli("leaderboard", "claims", str(path), "-f", "markdown")
    assert "crad - local; uncommitted: 2 of 6 pairs ran from a tree with uncommitted changes |" in md
    # compare says it the same way
    result, out, _ = invoke_cli("leaderboard", "compare", str(tmp_path / "reproduced" / "runs"), "--against",
                                "local", "--json")
    [table] = json.loads(out)["tables"]
    assert table["comparisons"][0]["pairing"]["uncommitted"] == [0, 1]


def test_the_committed_claims_quote_the_papers_with_their_sections():
    from hfl_bench.results.claims import read_claims

    claims = {c.id: c for c in read_claims(ROOT / "leaderboards" / "claims.yaml")}
    assert all(c.setting in ("paper", "proxy", "other") for c in claims.values())
    assert "Sec. V-B, Table I" in claims["fedcc-one-class"].figures.split("baselines")[1]
    joint_q = claims["fedsocket-joint-q"]
    assert joint_q.setting == "other" and "Sec. 6.2" in joint_q.figures
    assert all(n in joint_q.figures for n in ("+3.27", "+2.65", "+4.50", "+4.33"))
    rules = claims["crad-weighting-rules"].figures
    assert all(rule in rules for rule in ("Acc.", "Sup.", "softmax(-sigma^2)", "LCB", "CE", "1/sigma)"))
    assert "Joint accuracy" in claims["fedsocket-controls"].differs
    pool = claims["crad-pool-size"]
    assert pool.setting == "proxy" and all(t.levels == ({"clients": 15}, {"clients": 20}) for t in pool.trends)
    assert [t.statistic for t in pool.trends] == ["difference", "ratio"]
    assert {c.paper_figure for c in claims.values() if c.paper.startswith(("CRAD", "FedSocket"))} == {"selected"}


def test_the_cifar_pool_size_claim_reads_its_suites_records(real, tmp_path):  # noqa: F811
    """crad-pool-size-cifar as committed: not yet tested before suites/pool-size-cifar10-jpg.yaml has
    run; on records shaped as that suite's cells (cifar10-jpg-full, N = 20, 50, 100 with 10 active)
    the trend reads N = 100 against N = 20, N = 50 beside them, as a difference and as a ratio."""
    import yaml

    from hfl_bench.matrix.suite import load_suite, suite_cells

    [entry] = [c for c in yaml.safe_load((ROOT / "leaderboards" / "claims.yaml").read_text())["claims"]
               if c["id"] == "crad-pool-size-cifar"]
    suite = load_suite(ROOT / "suites" / "pool-size-cifar10-jpg.yaml")
    cells = suite_cells(suite)
    records = {t["records"] for t in entry["trend"]}
    assert {f"leaderboards/{r}" for r in records} == {suite.out}
    assert all(t["values"] == sorted({c.cfg.clients for c in cells}) for t in entry["trend"])
    assert {c.cfg.clients_per_round for c in cells} == {t["clients_per_round"] for t in entry["trend"]} == {10}
    assert {c.cfg.task for c in cells} == {t["task"] for t in entry["trend"]}
    path = claims_file(tmp_path, entry)
    got = run_json(path)["crad-pool-size-cifar"]
    assert got["verdict"] == "not yet tested" and "suites/pool-size-cifar10-jpg.yaml" in got["needs"]

    def level(n: int, method: str, accs: list[float]) -> list[dict]:
        out = clients_runs(real, method, n, accs)
        for r in out:
            r["task"]["name"] = r["config"]["task"] = "cifar10-jpg-full"
        return out

    uniform = [30.0, 31.0, 29.0, 30.5, 29.5, 30.0]
    write(tmp_path / "reproduced" / "pool-size-cifar10-jpg",
          *level(20, "crad", [u * 1.2 + s / 20 for s, u in enumerate(uniform)]), *level(20, "uniform-kd", uniform),
          *level(50, "crad", [u * 1.5 for u in uniform]), *level(50, "uniform-kd", uniform),
          *level(100, "crad", [u * 2.0 + s / 10 for s, u in enumerate(uniform)]), *level(100, "uniform-kd", uniform))
    got = run_json(path)["crad-pool-size-cifar"]
    difference, ratio = got["results"]
    assert difference["n"] == ratio["n"] == "6 vs 6"
    assert [note.split(":")[0] for note in difference["notes"]] == ["clients=20", "clients=50", "clients=100"]
    # mean uniform 30: (30 + 0.25) - (6 + 0.125) at N = 100 against N = 20
    assert difference["mean_difference"] == pytest.approx(24.125, abs=1e-3)
    assert ratio["notes"][0].startswith("clients=20: mean ratio 1.20") and ratio["mean_difference"] > 0.75
    assert got["verdict"] == "reproduced" and got["setting"] == "proxy"
