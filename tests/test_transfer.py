"""``leaderboard transfer`` (``results.transfer``): each method's paired gain over the reference per
task and Kendall's tau-b between two tasks' gains with its seed-bootstrap interval, through the real
CLI on records written in the real format (the committed record, varied): rankings that agree
exactly, that reverse, a tau worked by hand, too few methods, a method missing on one task, the
bootstrap's determinism, the JSON shape and bad input."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

from hfl_bench.results.transfer import batch_tau_b

from helpers import REAL_RECORD, invoke_cli

LOCAL = [50.0, 52.0, 54.0]  # local's headline per seed on every task


@pytest.fixture(scope="module")
def real() -> dict:
    record = json.loads(REAL_RECORD.read_text())
    record["history"] = record["history"][:3]  # small files; nothing here reads it
    return record


def record(base: dict, task: str, method: str, seed: int, acc: float, pool: str = "cpu") -> dict:
    """The real record as ``method``'s seed ``seed`` on ``task`` with headline ``acc``."""
    r = copy.deepcopy(base)
    r["task"]["name"] = r["config"]["task"] = task
    r["method"]["name"] = r["config"]["method"] = method
    r["arch_pool"]["name"] = r["config"]["pool"] = pool
    r["config"]["seed"] = seed
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["metrics"]["global_acc"] = acc
    r["metrics"]["final"] = {"rounds": 2, "first_round": 1, "last_round": 2, "global_acc": acc, "local_acc": 90.0}
    r["config_hash"] = f"{task}-{method}-{pool}"
    r["partition"]["hash"] = f"{task}-part-seed{seed}"
    r["record_id"] = f"{task}-{method}-{seed}"
    return r


def write_task(folder: Path, base: dict, task: str, gains: dict[str, float], noise=(-0.01, 0.0, 0.01),
               pool: str = "cpu") -> None:
    """local and one group per method on ``task``: seed s of a method scores local's + its gain +
    ``noise[s]`` (a small noise keeps the order of the gains in every resample)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [record(base, task, "local", s, acc, pool) for s, acc in enumerate(LOCAL)]
    rows += [record(base, task, m, s, LOCAL[s] + g + noise[s], pool) for m, g in gains.items() for s in range(3)]
    for r in rows:
        (folder / f"{r['record_id']}.json").write_text(json.dumps(r))


def transfer_json(*args: str) -> dict:
    result, out, err = invoke_cli("leaderboard", "transfer", *args, "--json")
    assert result.exit_code == 0, out + err
    return json.loads(out)


def pair_of(data: dict) -> dict:
    [pair] = data["pairs"]
    return pair


METHODS = ("crad", "fd", "fedgh", "fedkd", "fml")


# ----------------------------------------------------------------------------- tau and its interval


def test_a_tau_worked_by_hand(real, tmp_path):
    # gains 1..5 on digits; on mnist1d fd and crad swap, fml and fedkd swap: of the 10 pairs of
    # methods 8 keep their order and 2 reverse, tau = (8 - 2) / 10 = 0.6
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    write_task(tmp_path / "r", real, "mnist1d", dict(zip(METHODS, [2.0, 1.0, 3.0, 5.0, 4.0])))
    pair = pair_of(transfer_json(str(tmp_path / "r")))
    assert pair["tau"] == pytest.approx(0.6)
    assert pair["tau"] == pytest.approx(kendalltau([1, 2, 3, 4, 5], [2, 1, 3, 5, 4]).statistic)
    # the noise (0.01) never swaps two gains 1 apart: every resample gives 0.6
    assert pair["ci95"] == pytest.approx([0.6, 0.6])
    assert pair["sentence"] == "rankings agree (tau = 0.60 [0.60, 0.60])"


def test_rankings_that_agree_exactly(real, tmp_path):
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    write_task(tmp_path / "r", real, "mnist1d", dict(zip(METHODS, [-3.0, 10.0, 20.0, 30.0, 40.0])))
    pair = pair_of(transfer_json(str(tmp_path / "r")))
    assert (pair["tau"], pair["ci95"], pair["verdict"]) == (1.0, [1.0, 1.0], "agree")
    assert pair["n_methods"] == 5 and pair["methods"] == sorted(METHODS)


def test_rankings_that_reverse(real, tmp_path):
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    write_task(tmp_path / "r", real, "mnist1d", dict(zip(METHODS, [5.0, 4.0, 3.0, 2.0, 1.0])))
    pair = pair_of(transfer_json(str(tmp_path / "r")))
    assert (pair["tau"], pair["ci95"], pair["verdict"]) == (-1.0, [-1.0, -1.0], "disagree")
    assert pair["sentence"] == "rankings disagree (tau = -1.00 [-1.00, -1.00])"


def test_noisy_gains_give_no_evidence_and_the_same_output_twice(real, tmp_path):
    # gains 0.1 apart under seed noise of +-3: resamples reorder them, the interval covers 0
    noise = (-3.0, 0.0, 3.0)
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [0.1, 0.2, 0.3, 0.4, 0.5])), noise)
    write_task(tmp_path / "r", real, "mnist1d", dict(zip(METHODS, [0.5, 0.1, 0.4, 0.2, 0.3])), (3.0, -3.0, 0.0))
    first = invoke_cli("leaderboard", "transfer", str(tmp_path / "r"), "--json")[1]
    second = invoke_cli("leaderboard", "transfer", str(tmp_path / "r"), "--json")[1]
    assert first == second  # the bootstrap is seeded
    pair = pair_of(json.loads(first))
    low, high = pair["ci95"]
    assert low < 0 < high and high - low > 0.5, pair
    assert pair["verdict"] == "no evidence"
    assert pair["sentence"].startswith("no evidence of agreement (interval covers 0: tau = ")
    # a third task read first (its name sorts first) leaves the pair's interval as it was: each
    # pair's generator is seeded by its own two names
    write_task(tmp_path / "r", real, "adult", dict(zip(METHODS, [0.3, 0.1, 0.5, 0.2, 0.4])), noise)
    pairs = {tuple(p["tasks"]): p for p in transfer_json(str(tmp_path / "r"))["pairs"]}
    assert len(pairs) == 3 and pairs[("digits", "mnist1d")] == pair


def test_the_batched_tau_is_scipys_row_by_row():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 4, size=(200, 6)).astype(float)  # small integers: many ties
    y = rng.integers(0, 4, size=(200, 6)).astype(float)
    x[0], y[1] = 2.0, 3.0  # a row all ties: no tau
    ours = batch_tau_b(x, y)
    theirs = np.array([kendalltau(a, b).statistic for a, b in zip(x, y)])
    assert np.isnan(ours[0]) and np.isnan(ours[1])
    np.testing.assert_allclose(ours, theirs, equal_nan=True, atol=1e-12)


# ----------------------------------------------------------------------------- which methods count


def test_too_few_methods(real, tmp_path):
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS[:3], [1.0, 2.0, 3.0])))
    write_task(tmp_path / "r", real, "mnist1d", dict(zip(METHODS[:3], [1.0, 2.0, 3.0])))
    pair = pair_of(transfer_json(str(tmp_path / "r")))
    assert (pair["tau"], pair["ci95"], pair["verdict"]) == (None, None, "too few methods")
    assert pair["sentence"] == "too few methods (3 compared on both; at least 4)"


def test_a_method_missing_on_one_task(real, tmp_path):
    # fml runs on digits only: not run on mnist1d, left out of the pair; the other four agree.
    # fedavg runs on mnist1d, but with other rounds than local's: another protocol, no gain
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, -9.0])))
    write_task(tmp_path / "r", real, "mnist1d", dict(zip(METHODS[:4], [1.0, 2.0, 3.0, 4.0])))
    for s in range(3):
        r = record(real, "mnist1d", "fedavg", s, 70.0)
        r["federation"]["rounds"] = r["config"]["rounds"] = 7
        (tmp_path / "r" / f"fedavg-{s}.json").write_text(json.dumps(r))
    data = transfer_json(str(tmp_path / "r"))
    cells = {(c["method"], c["task"]): c for c in data["cells"]}
    assert cells[("fml", "mnist1d")]["status"] == "not run" and cells[("fml", "mnist1d")]["n"] == 0
    assert cells[("fml", "digits")]["mean_difference"] == pytest.approx(-9.0)
    assert pair_of(data)["methods"] == sorted(METHODS[:4]) and pair_of(data)["tau"] == 1.0
    assert cells[("fedavg", "mnist1d")]["status"] == "other protocol only" and "fedavg" not in data["methods"]
    assert data["not_compared"] == ["fedavg"]
    result, out, _ = invoke_cli("leaderboard", "transfer", str(tmp_path / "r"))  # piped: plain lines
    assert result.exit_code == 0
    # differences -9.01, -9.00, -8.99: sd 0.01, half-width t(0.975, 2) 4.303 x 0.01 / sqrt(3) = 0.025
    assert "fml | -9.00 [-9.02, -8.98] n=3 | not run" in out
    assert "(ran only in other protocols or setting sections than local's chosen ones): fedavg" in out
    assert "digits | mnist1d | 4 | same | rankings agree (tau = 1.00 [1.00, 1.00])" in out


def test_one_task_is_one_sentence_not_an_error(real, tmp_path):
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    result, out, err = invoke_cli("leaderboard", "transfer", str(tmp_path / "r"), "--format", "markdown")
    assert result.exit_code == 0, out + err
    assert "1 task (digits) with methods compared against local: comparing rankings across tasks needs two" in out
    assert "do the rankings agree" not in out
    assert transfer_json(str(tmp_path / "r"))["pairs"] == []


def test_tasks_of_different_pools_say_so(real, tmp_path):
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    write_task(tmp_path / "r", real, "hapt", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])), pool="sensor")
    data = transfer_json(str(tmp_path / "r"))
    assert pair_of(data)["pools_differ"] is True
    assert {t["task"]: t["pools"] for t in data["tasks"]} == {"digits": ["cpu"], "hapt": ["sensor"]}
    assert "the methods are the same, the models are not" in data["definitions"]["modalities"]


# ----------------------------------------------------------------------------- shape and bad input


def test_json_shape(real, tmp_path):
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    write_task(tmp_path / "r", real, "mnist1d", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    data = transfer_json(str(tmp_path / "r"), "--reference", "local")
    assert set(data) == {"reference", "figure", "definitions", "tasks", "methods", "cells", "pairs",
                         "not_compared", "summary"}
    assert data["reference"] == "local" and data["summary"] is None and data["methods"] == sorted(METHODS)
    [task, _] = data["tasks"]
    assert set(task) == {"task", "protocol", "section", "pools", "reference_group_id", "reference_seeds",
                         "other_protocols_with_reference"}
    assert task["task"] == "digits" and task["reference_seeds"] == 3 and task["protocol"].startswith("digits ")
    assert len(data["cells"]) == 10
    cell = data["cells"][0]
    assert set(cell) == {"method", "task", "status", "n", "mean_difference", "ci95", "seeds", "group_id", "version"}
    assert (cell["status"], cell["n"], cell["seeds"]) == ("compared", 3, [0, 1, 2])
    assert set(pair_of(data)) == {"tasks", "methods", "n_methods", "tau", "ci95", "resamples",
                                  "undefined_resamples", "pools_differ", "verdict", "sentence"}
    assert pair_of(data)["resamples"] == 2000


def test_a_bad_reference_is_one_line_exit_2(real, tmp_path):
    write_task(tmp_path / "r", real, "digits", dict(zip(METHODS, [1.0, 2.0, 3.0, 4.0, 5.0])))
    result, out, err = invoke_cli("leaderboard", "transfer", str(tmp_path / "r"), "--reference", "locl")
    text = (err or out).strip()
    assert result.exit_code == 2
    assert len(text.splitlines()) == 1 and re.search(r"--reference: unknown method 'locl'\. Did you mean 'local'\?",
                                                     text), text
    result, out, err = invoke_cli("leaderboard", "transfer", str(tmp_path / "r"), "--task", "digit")
    assert result.exit_code == 2 and "Did you mean 'digits'?" in (err or out)
