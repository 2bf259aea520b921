"""The two families on the same clients (issue 66): a capacity profile expressed as sub-models of one
global model (heterofl, ``--set profile=P``) and as independent architectures of a levels pool
(``--pool heterofl-cnn-levels --capacity-profile P``) gives client i the same width rate, so the
same parameters and FLOPs, read from the real runs' records; the one-line refusals; the config hash
of a run that does not name a profile is the one it always had."""

from __future__ import annotations

import json

import pytest

from hfl_bench.capacity import LEVELS, assign_rates, parse_profile
from hfl_bench.config import ConfigError, RunConfig, config_hash
from hfl_bench.pools import get_pool

from helpers import assert_refused, invoke_cli

RATE_OF_LABEL = {f"heterofl-cnn-{level}": rate for level, rate in LEVELS.items()}


def run(out, method: str, *args: str) -> dict:
    """The record of ``hfl-bench run`` (in-process) on digits, 5 clients, 1 round."""
    result, _, _ = invoke_cli("run", "--method", method, "--task", "digits", "--clients", "5", "--rounds", "1",
                              "--out", str(out), *args)
    assert result.exit_code == 0, result.output
    [path] = [p for p in out.glob("*.json") if p.name.split("__")[1] == method]
    return json.loads(path.read_text())


@pytest.mark.parametrize("profile,seed", [("a1-b1-c1-d1-e1", "3"), ("a1-e1", "0")])
def test_levels_pool_gives_each_client_the_sub_model_family_width(profile, seed, tmp_path):
    sub = run(tmp_path, "heterofl", "--set", f"profile={profile}", "--seed", seed)
    pool = run(tmp_path, "crad", "--pool", "heterofl-cnn-levels", "--capacity-profile", profile, "--seed", seed)
    rates = sub["method"]["run_details"]["client_rates"]
    assert sorted(set(rates)) == sorted({LEVELS[level] for level, _ in parse_profile(profile)})
    assert [RATE_OF_LABEL[label] for label in pool["arch_pool"]["assignment"]] == rates
    assert pool["arch_pool"]["n_params"] == sub["method"]["run_details"]["client_params"]
    assert pool["arch_pool"]["n_params"] == sub["arch_pool"]["n_params"]
    assert pool["cost"]["flops"]["per_sample"] == sub["cost"]["flops"]["per_sample"]
    assert pool["config"]["capacity_profile"] == profile
    # the leaderboard's setting names the profile of the levels pool's group
    from hfl_bench.results.board import build_board
    from hfl_bench.results.columns import GroupRow
    from hfl_bench.results.loading import load_records

    rows = {row.group.method: row.setting for row in GroupRow.of(build_board(load_records([tmp_path])[0]).groups)}
    assert f"profile={profile}" in rows["crad"] and "profile=" not in rows["heterofl"].replace(f"profile={profile}", "")


def test_without_a_profile_the_levels_pool_is_round_robin_and_old_hashes_hold():
    pool = get_pool("heterofl-cnn-levels")
    assert [m.name for m in pool.assign(7)] == [f"heterofl-cnn-{x}" for x in "abcdeab"]
    assert [m.kwargs["rate"] for m in pool.members] == list(LEVELS.values())
    rates = assign_rates(parse_profile("a2-c1"), 6, seed=11)
    assert [m.kwargs["rate"] for m in pool.assign(6, "a2-c1", 11)] == rates
    plain = RunConfig(task="digits", pool="cpu").__dict__
    assert config_hash({**plain, "capacity_profile": None}) == config_hash(
        {k: v for k, v in plain.items() if k != "capacity_profile"})
    assert config_hash({**plain, "capacity_profile": "a1-e1"}) != config_hash(plain)
    with pytest.raises(ConfigError, match="pool cpu is not one"):
        get_pool("cpu").assign(4, "a1-e1", 0)


@pytest.mark.parametrize("method,args,says", [
    ("crad", ("--capacity-profile", "a1-b1"), "pool cpu is not one: use --pool heterofl-cnn-levels"),
    ("heterofl", ("--capacity-profile", "a1-b1"), "the sub-model methods take their profile as --set profile"),
    ("crad", ("--pool", "heterofl-cnn-levels", "--capacity-profile", "a1-z2"), "capacity profile 'a1-z2'"),
])
def test_a_profile_that_cannot_apply_is_one_line_and_exit_2(method, args, says, tmp_path):
    assert_refused(tmp_path, method, *args, says=says)


@pytest.mark.parametrize("name", ["two-family-digits", "two-family-cifar10-jpg"])
def test_suite_runs_both_families_on_the_same_clients(name):
    """Every knowledge-exchange cell has a sub-model cell of each family method at the same profile
    and seed (and the rest of the protocol), and every profile a method of each family."""
    from pathlib import Path

    from hfl_bench.families.submodel import SubmodelParams
    from hfl_bench.matrix.suite import load_suite, suite_cells

    cells = suite_cells(load_suite(Path(__file__).resolve().parent.parent / "suites" / f"{name}.yaml"))
    submodel = {"heterofl", "fedrolex", "fjord"}
    exchange = {"crad", "fedmkd", "fml", "fd", "fedproto", "local"}
    assert {c.cfg.method for c in cells} == submodel | exchange

    def protocol(c):
        return (c.cfg.seed, c.cfg.clients, c.cfg.rounds, c.cfg.partition, c.cfg.alpha, c.cfg.lr, c.cfg.local_epochs)

    clients = {}
    for c in cells:
        if c.cfg.method in submodel:
            assert c.cfg.capacity_profile is None and c.cfg.pool == "heterofl-cnn"
            profile = c.cfg.method_params.get("profile", SubmodelParams().profile)  # a default is not kept
        else:
            assert c.cfg.pool == "heterofl-cnn-levels" and not c.cfg.method_params
            profile = c.cfg.capacity_profile
        clients.setdefault((profile, protocol(c)), set()).add(c.cfg.method)
    assert {p for p, _ in clients} == {"a1-b1-c1-d1-e1", "a1-e1"}
    assert all(methods == submodel | exchange for methods in clients.values())
