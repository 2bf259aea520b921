"""``leaderboard families`` (``results.families``): the sub-model family against the
knowledge-exchange family on the same clients, per task, protocol and capacity profile. Through the
real CLI on records in the real format: two real runs (``heterofl --set profile=a1-e1`` and ``local``
on ``heterofl-cnn-levels --capacity-profile a1-e1``) are the templates, written again as each
method's seeds with hand-chosen accuracies and budgets, so that the sub-model family wins at one
profile and the knowledge-exchange family at the other; every expected figure, p-value and Holm
adjustment is worked here by hand."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path
from typing import Optional

import pytest

from hfl_bench.results.families import record_profile

from helpers import invoke_cli, quick_run
from helpers import write_records as write

SEEDS = range(8)  # 8 pairs: an exact sign-flip p of 2/256, which Holm over four pairs keeps below 5%
WIDE, EVEN = "a1-e1", "a1-b1-c1-d1-e1"
SUBMODEL, EXCHANGE = ("heterofl", "fedrolex"), ("crad", "fml")
WIGGLE = [0.3, -0.2, 0.1, -0.4, 0.2, 0.0, -0.1, 0.4]  # per-seed noise, so the differences have a spread
ALTERNATE = [0.5, -0.5, 0.5, -0.5, 0.5, -0.5, 0.5, -1.0]  # differences of both signs: never resolved


def floor(seed: int) -> float:
    return 50.0 + seed


# Global accuracy per profile, method and seed: at a1-e1 the sub-model methods are ahead of every
# knowledge-exchange method on every seed; at the even profile the knowledge-exchange ones are, except
# heterofl - fml, whose differences change sign.
ACC = {
    WIDE: {"heterofl": lambda s: floor(s) + 10 + WIGGLE[s], "fedrolex": lambda s: floor(s) + 8 - WIGGLE[s],
           "crad": lambda s: floor(s) + 2 + WIGGLE[(s + 1) % 8], "fml": lambda s: floor(s) - 1,
           "local": floor},
    EVEN: {"heterofl": lambda s: floor(s) + 5 + ALTERNATE[s], "fedrolex": lambda s: floor(s) - 2 + WIGGLE[s],
           "crad": lambda s: floor(s) + 6 - WIGGLE[s], "fml": lambda s: floor(s) + 5, "local": floor},
}
BYTES = {"heterofl": 200_000.0, "fedrolex": 200_000.0, "crad": 1_800_000.0, "fml": 2_000.0, "local": 0.0}
STEPS = {"heterofl": 30.0, "fedrolex": 30.0, "crad": 30.0, "fml": 30.0, "local": 30.0}
FLOPS = {WIDE: 3.0e8, EVEN: 1.6e8}


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("families-templates")
    sub = quick_run(base / "sub", "--method", "heterofl", "--set", f"profile={WIDE}")
    ke = quick_run(base / "ke", "--method", "local", "--pool", "heterofl-cnn-levels", "--capacity-profile", WIDE)
    assert sub["method"]["submodels"] is True and record_profile(sub) == WIDE
    assert not ke["method"].get("submodels") and record_profile(ke) == WIDE
    for r in (sub, ke):
        r["history"] = r["history"][:2]  # small files; nothing here reads it
    return {"sub": sub, "ke": ke}


def variant(templates: dict, method: str, profile: Optional[str], seed: int, acc: float,
            flops: Optional[float] = None, bytes_sent: Optional[float] = None) -> dict:
    """A real record as ``method``'s seed ``seed`` at ``profile`` (None: no profile) with global accuracy
    ``acc`` (the headline: the final window's), and these budget figures (None: not recorded)."""
    submodel = method in SUBMODEL
    r = copy.deepcopy(templates["sub" if submodel else "ke"])
    r["method"]["name"] = r["config"]["method"] = method
    if submodel:
        r["method"]["hparams"]["profile"] = profile
        r["config"]["method_params"] = {"profile": profile}
    else:
        r["config"]["capacity_profile"] = profile
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["metrics"]["global_acc"] = acc
    # the local test the other way: each client's own model (knowledge exchange) 10 points above the
    # sub-model's on every seed, give or take a tenth
    local = 75.0 + seed + 0.1 * (seed % 3) if submodel else 85.0 + seed
    r["metrics"]["final"] |= {"global_acc": acc, "local_acc": local}
    r["config_hash"] = f"{method}-{profile}"
    r["partition"]["hash"] = f"part-{profile}-seed{seed}"  # the same clients in both families
    r["record_id"] = f"{method}-{profile}-{seed}"
    cost = r["cost"]
    cost["budget"]["per_client_round"]["private"]["steps"] = STEPS[method]
    if bytes_sent is None:
        cost.pop("bytes_sent_per_client_per_round", None)
    else:
        cost["bytes_sent_per_client_per_round"] = bytes_sent
    if flops is None:
        cost.pop("flops", None)
    else:
        cost["flops"]["training"]["per_client_round"] |= {"private": flops, "public": 0.0, "synthetic": 0.0}
    return r




def suite(templates: dict, seeds=SEEDS, plain: bool = True) -> list[dict]:
    """Both profiles' records; fml at the even profile without bytes or FLOPs (not recorded), fedrolex's
    seed 0 at a1-e1 without FLOPs (recorded by some seeds); one crad record without a profile."""
    out = []
    for profile, methods in ACC.items():
        for method, acc in methods.items():
            for s in seeds:
                missing = (method == "fml" and profile == EVEN) or (method == "fedrolex" and profile == WIDE and s == 0)
                out.append(variant(templates, method, profile, s, round(acc(s), 4),
                                   None if missing else FLOPS[profile],
                                   None if method == "fml" and profile == EVEN else BYTES[method]))
    if plain:
        out.append(variant(templates, "crad", None, 0, 60.0, FLOPS[WIDE], BYTES["crad"]))
    return out


@pytest.fixture(scope="module")
def folder(templates, tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("families") / "records", suite(templates))


def families(*args: str) -> tuple[int, str, str]:
    result, out, err = invoke_cli("leaderboard", "families", *args)
    return result.exit_code, out, err or result.output


def as_json(*args: str) -> dict:
    code, out, err = families(*args, "--json")
    assert code == 0, out + err
    return json.loads(out)


def table_of(data: dict, profile: str) -> dict:
    [t] = [t for t in data["tables"] if t["profile"] == profile]
    return t


def pair_of(t: dict, a: str, b: str) -> dict:
    [c] = [c for c in t["pairs"] if c["a"] == a and c["b"] == b]
    return c


# ----------------------------------------------------------------------------- the tables


def test_rows_per_profile_with_family_figures_and_the_paired_difference_against_local(folder):
    data = as_json(str(folder))
    assert [t["profile"] for t in data["tables"]] == sorted([EVEN, WIDE])
    assert data["left_out"]["records"] == 1  # the crad record without a profile
    for profile, methods in ACC.items():
        t = table_of(data, profile)
        assert t["task"] == "digits"
        rows = {r["method"]: r for r in t["methods"]}
        assert set(rows) == set(methods)
        assert {m: r["family"] for m, r in rows.items()} == {
            "heterofl": "sub-model", "fedrolex": "sub-model", "crad": "knowledge exchange",
            "fml": "knowledge exchange", "local": "floor"}
        for m, acc in methods.items():
            accs = [round(acc(s), 4) for s in SEEDS]
            assert rows[m]["n_seeds"] == 8
            assert rows[m]["global_acc"]["mean"] == pytest.approx(statistics.fmean(accs), abs=1e-4)
            assert rows[m]["global_acc"]["sd"] == pytest.approx(statistics.stdev(accs), abs=1e-4)
            local = [75.0 + s + 0.1 * (s % 3) if m in SUBMODEL else 85.0 + s for s in SEEDS]
            assert rows[m]["local_acc"]["mean"] == pytest.approx(statistics.fmean(local), abs=1e-4)
            if m == "local":
                assert rows[m]["vs_local"] is None
                continue
            d = [a - floor(s) for a, s in zip(accs, SEEDS)]
            vs = rows[m]["vs_local"]
            assert (vs["b"], vs["n"]) == ("local", 8)
            assert vs["mean_difference"] == pytest.approx(statistics.fmean(d), abs=1e-4)
        # Holm over the table's four rows against local (statsmodels' step-down, worked by hand below)
        ps = sorted(r["vs_local"]["p_sign_flip"] for r in t["methods"] if r["vs_local"])
        holm = [min(1.0, max((4 - j) * ps[j] for j in range(i + 1))) for i in range(4)]
        assert sorted(r["vs_local"]["p_holm"] for r in t["methods"] if r["vs_local"]) == pytest.approx(holm, abs=1e-6)


def test_the_sub_model_family_wins_at_one_profile_and_the_knowledge_exchange_family_at_the_other(folder):
    data = as_json(str(folder))
    wide, even = table_of(data, WIDE), table_of(data, EVEN)
    # every sub-model method against every knowledge-exchange method: 2 x 2 pairs, none picked first
    for t in (wide, even):
        assert sorted((c["a"], c["b"]) for c in t["pairs"]) == sorted((a, b) for a in SUBMODEL for b in EXCHANGE)
    # a1-e1: A - B above zero on all 8 seeds -> exact sign-flip p 2/256; Holm over 4 pairs: 4 x 2/256
    for c in wide["pairs"]:
        d = [round(ACC[WIDE][c["a"]](s), 4) - round(ACC[WIDE][c["b"]](s), 4) for s in SEEDS]
        assert min(d) > 0
        assert c["mean_difference"] == pytest.approx(statistics.fmean(d), abs=1e-4)
        assert c["p_sign_flip"] == pytest.approx(2 / 256) and c["p_holm"] == pytest.approx(4 * 2 / 256)
        assert c["resolved"] and c["verdict"] == "resolved"
    assert wide["counts"] == {"pairs": 4, "sub_model_ahead": 4, "knowledge_exchange_ahead": 0, "equal": 0,
                                   "not_paired": 0, "resolved": 4, "resolved_sub_model": 4,
                                   "resolved_knowledge_exchange": 0}
    assert wide["reading"].startswith(f"digits, profile {WIDE}, global test: the sub-model methods come out ahead")
    assert "4 of 4 resolved (4 for sub-model, 0 for knowledge exchange), every resolved pair in favour of " \
           "sub-model" in wide["reading"]
    # the even profile: three pairs below zero on every seed; heterofl - fml changes sign (not resolved)
    mixed = pair_of(even, "heterofl", "fml")
    assert mixed["mean_difference"] == pytest.approx(statistics.fmean(ALTERNATE), abs=1e-4)
    assert not mixed["resolved"] and mixed["verdict"] == "not resolved"
    for c in even["pairs"]:
        if c is not mixed:
            assert c["mean_difference"] < 0 and c["resolved"]
    assert (even["counts"]["knowledge_exchange_ahead"], even["counts"]["resolved_knowledge_exchange"],
            even["counts"]["resolved"]) == (4, 3, 3)
    assert even["reading"].startswith(f"digits, profile {EVEN}, global test: the knowledge-exchange methods "
                                      "come out ahead")
    assert "every resolved pair in favour of knowledge exchange" in even["reading"]


def test_holm_over_the_pairs_keeps_an_unadjusted_win_from_being_resolved(templates, tmp_path):
    """Six seeds: each pair's own p, 2/64, is below 5%, but Holm over the four pairs of a profile
    makes it 4 x 2/64 = 0.125: not resolved, and the reading says none is."""
    folder = write(tmp_path / "six", suite(templates, seeds=range(6), plain=False))
    wide = table_of(as_json(str(folder)), WIDE)
    for c in wide["pairs"]:
        assert c["n"] == 6 and c["p_sign_flip"] == pytest.approx(2 / 64) and c["p_holm"] == pytest.approx(0.125)
        assert c["ci95"][0] > 0 and not c["resolved"] and c["verdict"] == "not resolved"
    assert "0 of 4 resolved (4 pairs: not resolved)" in wide["reading"]


def test_five_seeds_say_no_pair_can_resolve(templates, tmp_path):
    folder = write(tmp_path / "five", suite(templates, seeds=range(5), plain=False))
    wide = table_of(as_json(str(folder)), WIDE)
    assert {c["verdict"] for c in wide["pairs"]} == {"n=5 cannot resolve at 5%"}
    assert wide["reading"].endswith("6 or more paired seeds are needed to resolve at 5%")


def test_the_budget_beside_each_row_and_not_recorded(folder):
    data = as_json(str(folder))
    wide = {r["method"]: r["budget"] for r in table_of(data, WIDE)["methods"]}
    even = {r["method"]: r["budget"] for r in table_of(data, EVEN)["methods"]}
    for m, budget in wide.items():
        assert budget["steps_per_client_round"]["mean"] == STEPS[m]
        assert budget["bytes_sent_per_client_round"] == {"mean": BYTES[m], "seeds": 8, "state": None}
    assert wide["crad"]["train_flops_per_client_round"] == {"mean": 3.0e8, "seeds": 8, "state": None}
    assert wide["fedrolex"]["train_flops_per_client_round"] == {"mean": 3.0e8, "seeds": 7, "state": None}
    assert even["fml"]["bytes_sent_per_client_round"] == {"mean": None, "seeds": 0, "state": "not recorded"}
    assert even["fml"]["train_flops_per_client_round"]["state"] == "not recorded"
    # the markdown cells: what the views show
    code, out, err = families(str(folder), "--format", "markdown")
    assert code == 0, out + err
    lines = out.splitlines()
    even_rows = lines[next(i for i, x in enumerate(lines) if f"capacity profile {EVEN}" in x):]
    fml = next(x for x in even_rows if x.startswith("| fml |"))
    assert fml.endswith("| 30 | not recorded | not recorded |")
    wide_rows = lines[next(i for i, x in enumerate(lines) if f"capacity profile {WIDE}" in x):]
    assert next(x for x in wide_rows if x.startswith("| crad |")).endswith("| 30 | 1.80 MB | 0.3 GFLOPs |")
    assert next(x for x in even_rows if x.startswith("| crad |")).endswith("| 30 | 1.80 MB | 0.16 GFLOPs |")
    fedrolex = next(x for x in wide_rows if x.startswith("| fedrolex |"))
    assert fedrolex.endswith("| 0.3 GFLOPs (7/8 seeds) |")


# ----------------------------------------------------------------------------- the CLI


def test_the_table_piped_is_plain_lines(folder):
    code, out, err = families(str(folder))
    assert code == 0, out + err
    assert "\x1b[" not in out and "┃" not in out and "│" not in out
    assert f"capacity profile {WIDE}; digits " in out
    assert ("method | family | seeds | global acc | local acc | vs local [95% CI] | p Holm | verdict | "
            "steps / client / round | bytes / client / round | train FLOPs / client / round") in out
    assert "sub-model | knowledge exchange | n | A - B [95% CI] | p sign-flip | p Holm | verdict | notes" in out
    assert f"reading: digits, profile {WIDE}, global test: the sub-model methods come out ahead" in out
    assert f"reading: digits, profile {EVEN}, global test: the knowledge-exchange methods come out ahead" in out
    assert "1 record without a capacity profile left out" in out


def test_task_filter(folder):
    assert len(as_json(str(folder), "--task", "digits")["tables"]) == 2


@pytest.mark.parametrize("case", ["empty", "unknown task", "no profile"])
def test_bad_input_is_one_line_and_exit_2(templates, tmp_path, case):
    folder = tmp_path / "records"
    args: list[str] = []
    if case == "empty":
        folder.mkdir()
        says = "no record files found"
    elif case == "unknown task":
        write(folder, [variant(templates, "local", WIDE, 0, 50.0, 1e8, 0.0)])
        args, says = ["--task", "digitz"], "unknown task 'digitz'"
    else:
        write(folder, [variant(templates, "crad", None, 0, 50.0, 1e8, 0.0)])
        says = "no record here names a capacity profile"
    code, out, err = families(str(folder), *args)
    assert code == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], err


def test_the_same_pairs_on_the_local_test_with_their_own_holm_and_reading(folder):
    """The sub-model family ahead on the global test at a1-e1 is behind on every client's local test
    half: the view tests the pairs on both figures, each its own Holm family, and reads both."""
    data = as_json(str(folder))
    for profile in (WIDE, EVEN):
        t = table_of(data, profile)
        assert sorted((c["a"], c["b"]) for c in t["local_pairs"]) == sorted((c["a"], c["b"]) for c in t["pairs"])
        for c in t["local_pairs"]:
            d = [75.0 + s + 0.1 * (s % 3) - (85.0 + s) for s in SEEDS]
            assert c["mean_difference"] == pytest.approx(statistics.fmean(d), abs=1e-4)
            assert c["p_holm"] == pytest.approx(4 * 2 / 256) and c["resolved"]  # Holm over the 4 local pairs
        assert t["local_counts"]["knowledge_exchange_ahead"] == 4 and t["local_counts"]["resolved"] == 4
        assert t["local_reading"].startswith(f"digits, profile {profile}, local test: the knowledge-exchange "
                                             "methods come out ahead")
    assert table_of(data, WIDE)["reading"].startswith(f"digits, profile {WIDE}, global test: the sub-model")
    code, out, _ = families(str(folder))
    assert code == 0 and "figure: final local (each client's local test half)" in out
    assert f"reading: digits, profile {WIDE}, local test: the knowledge-exchange methods come out ahead" in out
