"""``leaderboard claims``: each claim of a claims file tested on small copies of a real record
(``test_paired_stats``' helpers), through the real CLI: verdicts computed from the numbers (and
flipping when a record's figure changes), Holm over the comparisons of one claim, not yet tested
where the records are absent, method-parameter variants and figures per side, a trend over N, and
a bad claims file as one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_compare_variants import with_params
from test_paired_stats import real, runs, variant, write  # noqa: F401 - real is a fixture used by name

from helpers import invoke_cli

UP = [62.0, 63.0, 61.5, 64.0, 62.5, 63.5]  # six seeds: one sign pattern in 32 as extreme, p = 2/64
BASE = [60.0, 60.5, 60.0, 61.0, 60.0, 61.0]  # UP - BASE: +2.0 +2.5 +1.5 +3.0 +2.5 +2.5


def claim(cid: str = "c1", **test) -> dict:
    return {"id": cid, "paper": "CRAD", "claim": "A beats B", "figures": "Table 1: 78.60", "setting": "paper",
            "paper_figure": "final", "needs": "a GPU", **test}


def one(a: dict, b: dict, records: str = "reproduced/runs") -> dict:
    return {"records": records, "a": a, "b": b}


def claims_file(tmp_path: Path, *claims: dict) -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": list(claims)}, sort_keys=False))
    return path


def run_json(path: Path) -> dict[str, dict]:
    result, out, err = invoke_cli("leaderboard", "claims", str(path), "--json")
    assert result.exit_code == 0, out + err
    return {c["id"]: c for c in json.loads(out)["claims"]}


@pytest.fixture
def folder(real, tmp_path):  # noqa: F811
    return write(tmp_path / "reproduced" / "runs", *runs(real, "crad", UP), *runs(real, "local", BASE),
                 *with_params(runs(real, "crad", BASE), aggregator="crad-stage1"))


def test_verdicts_follow_the_numbers(real, folder, tmp_path):  # noqa: F811
    path = claims_file(tmp_path, claim("up", comparisons=[one({"method": "crad"}, {"method": "local"})]),
                       claim("down", comparisons=[one({"method": "local"}, {"method": "crad"})]))
    got = run_json(path)
    [up] = got["up"]["results"]
    assert (up["n"], up["mean_difference"], up["p_holm"]) == ("6", 2.3333, pytest.approx(2 / 64))
    assert up["means"] == [pytest.approx(sum(UP) / 6, abs=1e-4), pytest.approx(sum(BASE) / 6, abs=1e-4)]
    assert (got["up"]["verdict"], got["down"]["verdict"]) == ("reproduced", "contradicted")
    # one seed of crad falls below local: the interval still excludes 0 but p = 4/64 is not below 0.05
    write(folder, variant(real, "crad", 5, 60.5))  # +2.5 becomes -0.5
    got = run_json(path)
    assert got["up"]["results"][0]["ci95"][0] > 0 and got["up"]["results"][0]["p_holm"] == pytest.approx(4 / 64)
    assert (got["up"]["verdict"], got["down"]["verdict"]) == ("not resolved", "not resolved")


def test_holm_runs_over_the_comparisons_of_one_claim(folder, tmp_path):
    # each comparison alone has p = 2/64 (reproduced); two in one claim: Holm doubles the smaller, 0.0625
    path = claims_file(tmp_path, claim(comparisons=[
        one({"method": "crad"}, {"method": "local"}),
        one({"method": "crad"}, {"method": "crad", "params": {"aggregator": "crad-stage1"}})]))
    c = run_json(path)["c1"]
    assert [r["test"] for r in c["results"]] == ["crad - local", "crad - crad [aggregator=crad-stage1]"]
    assert [r["p_holm"] for r in c["results"]] == pytest.approx([0.0625, 0.0625])
    assert [r["verdict"] for r in c["results"]] == ["not resolved", "not resolved"]
    assert c["verdict"] == "not resolved"


def test_absent_records_are_not_yet_tested_with_what_they_need(folder, tmp_path):
    path = claims_file(tmp_path, claim("absent", comparisons=[
        one({"method": "crad"}, {"method": "local"}),
        one({"method": "crad"}, {"method": "local"}, records="reproduced/not-run-yet")]),
        claim("untestable"), claim("no-variant", comparisons=[
            one({"method": "crad", "params": {"aggregator": "crad-lcb"}}, {"method": "crad"})]))
    got = run_json(path)
    assert got["absent"]["verdict"] == "not yet tested"  # one of two comparisons has no records yet
    assert got["absent"]["results"][1]["verdict"] == "not yet tested" and got["absent"]["results"][1]["n"] == "0"
    assert got["untestable"]["verdict"] == "not yet tested" and got["untestable"]["results"] == []
    assert got["no-variant"]["results"][0]["notes"] == ["no records of crad [aggregator=crad-lcb] yet"]
    _, md, _ = invoke_cli("leaderboard", "claims", str(path), "--format", "markdown")
    assert "| untestable | A beats B | Table 1: 78.60 | paper | none yet |" in md
    assert "not yet tested (needs: a GPU) |" in md


def test_a_side_reads_its_own_figure(real, tmp_path):  # noqa: F811
    # dfml: selected 70 + s, final 65; crad: selected 60, final 61 + s
    write(tmp_path / "reproduced" / "runs", *[variant(real, "dfml", s, 70.0 + s, final=65.0) for s in range(6)],
          *[variant(real, "crad", s, 60.0, final=61.0 + s) for s in range(6)])
    path = claims_file(tmp_path, claim(comparisons=[
        one({"method": "dfml", "figure": "selected"}, {"method": "dfml", "figure": "final"}),
        one({"method": "dfml", "figure": "selected-minus-final"},
            {"method": "crad", "figure": "selected-minus-final"})]))
    swing, gap = run_json(path)["c1"]["results"]
    assert (swing["test"], swing["figure"], swing["mean_difference"]) == (
        "dfml (selected) - dfml (final)", "selected vs final", 7.5)  # 5..10
    assert gap["mean_difference"] == 11.0  # (5 + s) - (-1 - s), s = 0..5
    assert gap["notes"] == ["dfml's own gap: +7.50", "crad's own gap: -3.50"]


def clients_runs(real: dict, method: str, n: int, accs: list[float]) -> list[dict]:  # noqa: F811
    """Runs at N = n clients (10 a round): another protocol, another partition per seed."""
    out = runs(real, method, accs)
    for r in out:
        r["federation"] |= {"n_clients": n, "clients_per_round": 10}
        r["config"] |= {"clients": n, "clients_per_round": 10}
        r["config_hash"] += f"-n{n}"
        r["record_id"] += f"-n{n}"
        r["partition"]["hash"] += f"-n{n}"
    return out


def test_a_trend_compares_the_last_setting_it_lists_with_the_first(real, tmp_path):  # noqa: F811
    small = [60.0 + d for d in (1.0, 1.2, 0.8, 1.1, 0.9, 1.0)]
    large = [50.0 + d for d in (5.0, 5.5, 4.5, 5.2, 4.8, 5.0)]
    write(tmp_path / "reproduced" / "runs", *clients_runs(real, "crad", 10, small),
          *clients_runs(real, "uniform-kd", 10, [60.0] * 6), *clients_runs(real, "crad", 20, large),
          *clients_runs(real, "uniform-kd", 20, [50.0] * 6))
    trend = {"records": "reproduced/runs", "over": "clients", "values": [10, 15, 20],
             "a": {"method": "crad"}, "b": {"method": "uniform-kd"}}
    c = run_json(claims_file(tmp_path, claim(trend=trend)))["c1"]
    [r] = c["results"]
    assert (r["n"], r["mean_difference"], c["verdict"]) == ("6 vs 6", 4.0, "reproduced")  # 5.0 - 1.0
    assert r["notes"] == ["clients=10: +1.00 (ratio 1.02, n=6)", "clients=15: no records",
                          "clients=20: +5.00 (ratio 1.10, n=6)"]
    assert r["ci95"][0] > 0 and r["p_holm"] < 1e-4  # Welch's t-test, a family of one
    # the order is the claim's: an advantage that should grow as N shrinks lists 20 first
    c = run_json(claims_file(tmp_path, claim(trend=dict(trend, values=[20, 15, 10]))))["c1"]
    assert (c["results"][0]["mean_difference"], c["verdict"]) == (-4.0, "contradicted")
    # a list of trends (one per task, say): each tested, Holm over them, the claim's verdict from all
    c = run_json(claims_file(tmp_path, claim(trend=[trend, dict(trend, values=[20, 10])])))["c1"]
    assert [r["mean_difference"] for r in c["results"]] == [4.0, -4.0] and c["verdict"] == "contradicted"
    assert [r["p_holm"] for r in c["results"]] == [round(2 * c["results"][0]["p"], 6)] * 2  # Holm over the two


def test_a_trend_says_where_its_levels_ran_on_mixed_hosts(real, tmp_path):  # noqa: F811
    """Each level pairs on one host here, but N = 20 ran on another processor than N = 10: the
    Welch test compares across hosts, and the row says so, as compare marks a paired table."""
    def level(n: int, cpu: str) -> list[dict]:
        out = clients_runs(real, "crad", n, [60.0 + n / 2 + d for d in range(6)]) + clients_runs(
            real, "uniform-kd", n, [60.0] * 6)
        for r in out:
            r["environment"] |= {"cpu": cpu, "cpu_isa": "avx2", "torch_cpu_capability": "AVX2"}
        return out

    trend = {"records": "reproduced/runs", "over": "clients", "values": [10, 20],
             "a": {"method": "crad"}, "b": {"method": "uniform-kd"}}
    for cpu_20, said in (("CPU B", ["mixed hosts: 2 processors"]), ("CPU A", [])):
        folder = tmp_path / cpu_20.replace(" ", "")
        write(folder / "reproduced" / "runs", *level(10, "CPU A"), *level(20, cpu_20))
        [r] = run_json(claims_file(folder, claim(trend=trend)))["c1"]["results"]
        assert r["mean_difference"] == 5.0 and r["notes"][2:] == said  # after the two levels' notes


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, "unknown key(s) 'colour'"),
    ({"needs": None}, "claim 1: missing 'needs'"),
    ({"needs": " "}, "claim 1 (c1): needs must be a non-empty text"),
    ({"comparisons": [one({"method": "krad"}, {"method": "local"})]}, "unknown method 'krad'. Did you mean 'crad'?"),
    ({"comparisons": [one({"method": "crad"}, {"method": "local"}, records="../elsewhere")]},
     "'records' must be a folder relative to the claims file, inside its folder"),
    ({"comparisons": [one({"method": "crad", "figure": "best"}, {"method": "local"})]}, "'figure' must be one of"),
    ({"trend": {"records": "r", "over": "rounds", "values": [1, 2], "a": {"method": "crad"},
                "b": {"method": "local"}}}, "'over' must be one of clients, alpha, k"),
    ({"trend": []}, "'trend' must be a trend or a non-empty list of trends"),
    ({"trend": [{"records": "r", "over": "k", "values": [2, 1], "a": {"method": "crad"}, "b": {"method": "local"}},
                {"records": "r", "over": "k", "values": [2], "a": {"method": "crad"}, "b": {"method": "local"}}]},
     "trend 2: 'values' must be a list of two or more numbers"),
])
def test_a_bad_claims_file_is_one_line_exit_2(tmp_path, change, message):
    assert_one_line_exit_2(tmp_path, change, message)


def assert_one_line_exit_2(tmp_path, change: dict, message: str) -> None:
    """A claim with ``change`` over ``claim()`` (a None value drops the field) is refused by
    ``leaderboard claims`` in one line with ``message``, exit 2."""
    c = claim() | change
    path = claims_file(tmp_path, {k: v for k, v in c.items() if v is not None})
    result, out, err = invoke_cli("leaderboard", "claims", str(path))
    text = (err or out).strip()
    assert result.exit_code == 2, text
    assert message in text and len(text.splitlines()) == 1, text


def test_text_from_the_claims_file_is_escaped(folder, tmp_path):
    path = claims_file(tmp_path, claim(claim="A | B <b>x</b> [link](http://x)",
                                       comparisons=[one({"method": "crad"}, {"method": "local"})]))
    result, md, _ = invoke_cli("leaderboard", "claims", str(path), "-f", "markdown")
    assert result.exit_code == 0
    row = next(line for line in md.splitlines() if line.startswith("| c1 "))
    assert "A \\| B &lt;b&gt;x&lt;/b&gt; \\[link\\](http://x)" in row
    assert row.count(" | ") == 12  # thirteen cells: the claim's text added none
    assert "| 62.75, 60.42 | +2.33 \\[1.79, 2.88\\] |" in row  # each side's mean over the paired seeds, then A - B


def skew_runs(real: dict, method: str, k: int, accs: list[float], optimizer: str = "sgd") -> list[dict]:  # noqa: F811
    """Runs on ``classes`` k (another partition per k) under one clients' optimizer."""
    out = runs(real, method, accs)
    tag = f"-k{k}-{optimizer}"
    for r in out:
        r["partition"] |= {"scheme": "classes", "params": {"k": k}}
        r["partition"]["hash"] += f"-k{k}"
        r["config"] |= {"partition": "classes", "classes_per_client": k, "optimizer": optimizer}
        r["config"] |= {"lr": 0.001} if optimizer == "adam" else {}
        r["config_hash"] += tag
        r["record_id"] += tag
    return out


def test_sides_are_selected_by_k_and_optimizer_and_a_trend_runs_over_k(real, tmp_path):  # noqa: F811
    sgd, adam = "sgd", "adam"
    write(tmp_path / "reproduced" / "runs",
          *skew_runs(real, "crad", 2, [60.0 + d for d in (1.0, 1.2, 0.8, 1.1, 0.9, 1.0)]),
          *skew_runs(real, "local", 2, [60.0] * 6),
          *skew_runs(real, "crad", 1, [50.0 + d for d in (5.0, 5.5, 4.5, 5.2, 4.8, 5.0)]),
          *skew_runs(real, "local", 1, [50.0] * 6),
          *skew_runs(real, "crad", 1, [40.0] * 6, adam), *skew_runs(real, "local", 1, BASE, adam))
    path = claims_file(tmp_path, claim("sgd", comparisons=[
        {**one({"method": "crad"}, {"method": "local"}), "k": 1, "optimizer": sgd}]),
        claim("adam", comparisons=[{**one({"method": "crad"}, {"method": "local"}), "k": 1,
                                    "optimizer": "adam lr=0.001"}]),
        claim("widens", trend={"records": "reproduced/runs", "over": "k", "values": [2, 1], "optimizer": sgd,
                               "a": {"method": "crad"}, "b": {"method": "local"}}))
    got = run_json(path)
    assert got["sgd"]["results"][0]["test"] == "crad - local at k=1 optimizer=sgd"
    assert (got["sgd"]["results"][0]["mean_difference"], got["sgd"]["verdict"]) == (5.0, "reproduced")
    assert got["adam"]["verdict"] == "contradicted"  # 40 against 60-61
    r = got["widens"]["results"][0]
    assert (r["mean_difference"], got["widens"]["verdict"]) == (4.0, "reproduced")  # 5.0 at k=1 - 1.0 at k=2
    # a trend reads each side's endpoint, not the model: these records have no ensemble, so no figure
    trend = {"records": "reproduced/runs", "over": "k", "values": [2, 1], "optimizer": sgd,
             "a": {"method": "crad", "endpoint": "ensemble"}, "b": {"method": "local", "endpoint": "ensemble"}}
    r = run_json(claims_file(tmp_path, claim("ens", trend=trend)))["ens"]["results"][0]
    assert r["mean_difference"] is None and r["n"] == "0 vs 0"
    # without the optimizer, k=1 matches two groups of crad: one line, exit 2, naming what to add
    path = claims_file(tmp_path, claim("both", comparisons=[{**one({"method": "crad"}, {"method": "local"}), "k": 1}]))
    result, out, err = invoke_cli("leaderboard", "claims", str(path))
    assert result.exit_code == 2 and "matches 2 groups" in out + err and "optimizer" in out + err


def alpha_runs(real: dict, method: str, alpha: float, accs: list[float]) -> list[dict]:  # noqa: F811
    """Runs on a Dirichlet partition at ``alpha`` under the protocol's SGD."""
    out = runs(real, method, accs)
    tag = f"-a{alpha}-sgd"
    for r in out:
        r["partition"] |= {"scheme": "dirichlet", "params": {"alpha": alpha}}
        r["partition"]["hash"] += tag
        r["config"] |= {"partition": "dirichlet", "alpha": alpha, "optimizer": "sgd"}
        r["config_hash"] += tag
        r["record_id"] += tag
    return out


def test_a_trend_over_levels_of_two_partition_schemes(real, tmp_path):  # noqa: F811
    # Dirichlet 0.1, then two classes per client, then one: no one setting runs through all three
    write(tmp_path / "reproduced" / "runs",
          *alpha_runs(real, "crad", 0.1, [62.0 + d for d in (0.0, 0.2, -0.2, 0.1, -0.1, 0.0)]),
          *alpha_runs(real, "local", 0.1, [60.0] * 6),
          *skew_runs(real, "crad", 2, [60.0 + d for d in (1.0, 1.2, 0.8, 1.1, 0.9, 1.0)]),
          *skew_runs(real, "local", 2, [60.0] * 6),
          *skew_runs(real, "crad", 1, [50.0 + d for d in (5.0, 5.5, 4.5, 5.2, 4.8, 5.0)]),
          *skew_runs(real, "local", 1, [50.0] * 6))
    step = {"records": "reproduced/runs", "optimizer": "sgd", "a": {"method": "crad"}, "b": {"method": "local"}}
    c = run_json(claims_file(tmp_path, claim(trend=[dict(step, levels=[{"alpha": 0.1}, {"k": 2}]),
                                                    dict(step, levels=[{"k": 2}, {"k": 1}])])))["c1"]
    first, second = c["results"]
    assert first["test"] == "(crad - local at optimizer=sgd) at k=2 - at alpha=0.1"
    assert first["notes"] == ["alpha=0.1: +2.00 (ratio 1.03, n=6)", "k=2: +1.00 (ratio 1.02, n=6)"]
    assert (first["mean_difference"], first["verdict"]) == (-1.0, "contradicted")  # the advantage shrank
    assert (second["mean_difference"], second["verdict"]) == (4.0, "reproduced")
    assert c["verdict"] == "contradicted"  # a claim of growth at every step fails at the one that shrinks
    # one trend over all three levels compares the last with the first; the middle one is a note
    c = run_json(claims_file(tmp_path, claim(trend=dict(step, levels=[{"alpha": 0.1}, {"k": 2}, {"k": 1}]))))["c1"]
    [r] = c["results"]
    assert (r["mean_difference"], r["n"], len(r["notes"]), c["verdict"]) == (3.0, "6 vs 6", 3, "reproduced")


@pytest.mark.parametrize("change, message", [
    ({"levels": [{"k": 2}, {"k": 1}], "over": "k"}, "give either 'over' and 'values' or 'levels'"),
    ({}, "give either 'over' and 'values' or 'levels'"),
    ({"values": [2, 1]}, "'over' must be one of clients, alpha, k"),
    ({"levels": [{"k": 2}]}, "'levels' must be a list of two or more mappings of clients, alpha, k to numbers"),
    ({"levels": [{"task": "digits"}, {"k": 1}]}, "'levels' must be a list of two or more mappings"),
    ({"levels": [{"k": 2}, {"k": 2.0}]}, "'levels' lists a level twice"),
    ({"levels": [{"k": 2}, {"k": 1}], "k": 1}, "k is what the trend runs over; give it in its levels only"),
])
def test_a_bad_trend_level_is_one_line_exit_2(tmp_path, change, message):
    trend = {"records": "r", "a": {"method": "crad"}, "b": {"method": "local"}, **change}
    result, out, err = invoke_cli("leaderboard", "claims", str(claims_file(tmp_path, claim(trend=trend))))
    text = (err or out).strip()
    assert result.exit_code == 2 and message in text and len(text.splitlines()) == 1, text


def test_one_papers_claims_in_brief(folder, tmp_path):
    path = claims_file(tmp_path, claim("up", comparisons=[one({"method": "crad"}, {"method": "local"}),
                                                          one({"method": "crad"}, {"method": "fedcc"})]),
                       claim("other", paper="FedCC", comparisons=[one({"method": "local"}, {"method": "crad"})]))
    result, md, _ = invoke_cli("leaderboard", "claims", str(path), "--paper", "crad", "--brief", "-f", "markdown")
    assert result.exit_code == 0
    [row] = [line for line in md.splitlines() if line.startswith("| CRAD ")]  # FedCC's claim left out
    assert row.endswith("| not yet tested (needs: a GPU) | 1 reproduced, 1 not yet tested |")
    result, out, _ = invoke_cli("leaderboard", "claims", str(path), "--paper", "FedCC", "--brief")
    assert out.splitlines() == ["paper | claim id | claim | paper's figures | setting match | verdict | tested lines",
                                "FedCC | other | A beats B | Table 1: 78.60 | paper | contradicted | 1 contradicted"]
    result, _, err = invoke_cli("leaderboard", "claims", str(path), "--paper", "FedSocket")
    assert result.exit_code == 2 and "unknown paper 'FedSocket'; the claims file names 'CRAD'; 'FedCC'" in err
