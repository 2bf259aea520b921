"""Selection under faults without an oracle (issue 30): the reported round is chosen on every
client's validation, as without faults (``evaluation.select_round``, which is given nothing that
says which clients are faulty); records selected the old way (on the honest clients' validation,
``faults.selection: "honest"``) are never grouped with or ranked against new ones; and a fault's
drop is paired by seed and by client (``results.robustness``)."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from hfl_bench import engine
from hfl_bench import recording as record_writer
from hfl_bench.config import SELECTION_RULE, RunConfig, config_hash
from hfl_bench.evaluation import select_round
from hfl_bench.record.check import problems as record_problems
from hfl_bench.recording import final_figures
from hfl_bench.testing import QUICK

from helpers import REAL_RECORD, invoke_cli

REAL = REAL_RECORD


def oracle_round(val_by_round: list[np.ndarray], honest: list[int]) -> int | None:
    """The old rule, for contrast only: the round of best mean validation over the honest clients."""
    return select_round([np.asarray(v)[honest] for v in val_by_round])


# ----------------------------------------------------------------------------- the rule


def test_the_selection_takes_every_clients_validation_and_nothing_else():
    assert list(inspect.signature(select_round).parameters) == ["val_by_round"]
    # clients 0, 1 improve to the end; 2, 3 peak at round 1; round 0 (initial models) is never selected
    val = [np.array([90.0, 90.0, 90.0, 90.0]), np.array([40.0, 40.0, 70.0, 70.0]),
           np.array([60.0, 60.0, 55.0, 55.0]), np.array([70.0, 70.0, 30.0, 30.0])]
    assert oracle_round(val, [2, 3]) == 1 and oracle_round(val, [0, 1]) == 3  # the oracle depends on who is faulty
    assert select_round(val) == 2  # every client's mean: 55, 57.5, 50
    tied = [val[0], np.array([50.0, 60.0, 0.0, 0.0]), np.array([60.0, 50.0, 0.0, 0.0])]
    assert select_round(tied) == 1  # equal best means: the first
    assert select_round([val[0], np.array([np.nan, 80.0, 20.0, np.nan])]) == 1  # a client without a figure is left out
    assert select_round([val[0]]) is None and select_round([val[0], np.full(4, np.nan)]) is None


def _local_run(faults: str) -> tuple[dict, list[np.ndarray]]:
    """`local` on digits (4 clients, 2 rounds) with ``faults``, and every round's per-client validation."""
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=4, rounds=2, seed=0, checkpoint_every=0,
                                     faults=faults, **QUICK))[1]
    sim = engine.Simulation(cfg)
    val = [sim.evaluator._val_acc()]
    for rnd in (1, 2):
        sim.step(rnd)
        val.append(sim.evaluator._val_acc())
    return record_writer.build_record(cfg, sim.result()), val


def test_two_faulty_sets_on_one_runs_validation_select_the_same_round():
    """`local` sends nothing, so a byzantine fault leaves its training as it was: both runs below are
    the same run with two different faulty sets. On its figures the honest clients' rule picks round
    1 for one set and round 2 for the other; the engine picks one round for both: every client's."""
    a, val_a = _local_run("byzantine:[0,1]")
    b, val_b = _local_run("byzantine:[2,3]")
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(val_a, val_b))  # one run's figures
    assert oracle_round(val_a, [2, 3]) != oracle_round(val_a, [0, 1])  # these figures tell the rules apart
    assert a["selection"] == b["selection"] == {"rule": SELECTION_RULE, "round": select_round(val_a)}
    assert a["faults"]["selection"] == b["faults"]["selection"] == "all"
    assert a["metrics"]["mean_val_acc"] == pytest.approx(float(np.nanmean(val_a[a["selection"]["round"]])), abs=1e-3)


def test_a_run_with_faults_records_the_all_client_rule_and_honest_figures_at_that_round(tmp_path):
    result, out, err = invoke_cli("run", "--method", "uniform-kd", "--task", "digits", "--clients", "4",
                                  "--rounds", "3", "--seed", "0", "--faults", "byzantine:0.5",
                                  "--local-epochs", "1", "--batch-size", "64",
                                  "--lr", "0.01", "-q", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, out + err
    record = json.loads(Path(json.loads(out)["record"]).read_text())
    assert not record_problems(record)
    assert record["selection"]["rule"] == SELECTION_RULE and record["faults"]["selection"] == "all"
    history = record["history"]
    # the selected round is the first of best mean validation over every client (the history's mean_val_acc)
    means = [h["mean_val_acc"] for h in history[1:]]
    assert record["selection"]["round"] == 1 + means.index(max(means))
    selected = history[record["selection"]["round"]]
    honest, faulty = record["metrics"]["honest"], record["metrics"]["faulty"]
    assert honest["n_clients"] == faulty["n_clients"] == 2
    assert honest["global_acc"] == pytest.approx(selected["honest"]["global_acc"], abs=1e-3)
    per_client = {c["cid"]: c for c in record["metrics"]["per_client"]}
    ids = record["faults"]["honest_clients"]
    assert honest["global_acc"] == pytest.approx(np.mean([per_client[c]["global_acc"] for c in ids]), abs=1e-3)
    assert honest["final"] == final_figures(history, "honest")  # and at the final rounds


# ----------------------------------------------------------------------------- the views and the drop


@pytest.fixture(scope="module")
def real() -> dict:
    r = json.loads(REAL.read_text())
    r["history"] = r["history"][:3]
    r["method"]["version"] = "1.0"
    r["config"]["faults"] = ""
    return r


def record_of(base: dict, method: str, per_client: list[float], faults: str = "", faulty: tuple[int, ...] = (),
              seed: int = 0, honest_rule: bool = False) -> dict:
    """A record of ``method`` at ``seed`` whose clients' selected-round global accuracy is ``per_client``;
    with faults (``faulty`` clients) when ``faults`` names a spec, selected by the old rule with ``honest_rule``."""
    r = copy.deepcopy(base)
    n = len(per_client)
    r["method"]["name"] = r["config"]["method"] = method
    r["config"].update(seed=seed, faults=faults, clients=n)
    r["federation"]["n_clients"] = r["federation"]["clients_per_round"] = n
    r["seeds"] = {k: seed for k in r["seeds"]}
    r["config_hash"] = config_hash(r["config"])
    r["record_id"] = f"{r['config_hash']}-{seed}-{honest_rule}"
    r["partition"]["hash"] = f"part-seed{seed}"
    template = r["metrics"]["per_client"][0]
    r["metrics"]["per_client"] = [dict(template, cid=c, global_acc=acc) for c, acc in enumerate(per_client)]
    r["metrics"]["global_acc"] = round(float(np.mean(per_client)), 4)
    if faults:
        honest = [c for c in range(n) if c not in faulty]
        plan = {"spec": faults, "kind": "byzantine", "strength": None, "mode": "random", "fraction": None,
                "faulty_clients": list(faulty), "honest_clients": honest}
        r["faults"] = record_writer.faults_section(r["config"], plan)
        if honest_rule:  # written before issue 30
            r["faults"]["selection"] = "honest"
        r["schema_version"] = "1.3"
        for group, ids in (("honest", honest), ("faulty", list(faulty))):
            acc = round(float(np.mean([per_client[c] for c in ids])), 4)
            r["metrics"][group] = {"n_clients": len(ids), "global_acc": acc,
                                   "local_acc": 80.0, "mean_val_acc": 80.0}
    assert record_problems(r) == [], record_problems(r)
    return r


def board(folder: Path, *records: dict, rank: bool = False) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(records):
        (folder / f"r{i}.json").write_text(json.dumps(r))
    result, out, err = invoke_cli("leaderboard", "show", str(folder), "--format", "json", *(["--rank"] if rank else []))
    assert result.exit_code == 0, out + err
    return json.loads(out)


BASELINE = [60.0, 70.0, 80.0, 90.0]
BYZ = "byzantine:[0]/random"


def test_a_fault_that_leaves_the_honest_clients_as_they_were_drops_exactly_zero(real, tmp_path):
    # local-like: client 0 is byzantine, clients 1-3 have the very figures of the run without faults.
    # Against all clients of the baseline (the old drop) this read 80 - 75 = +5, a change of composition.
    gs = board(tmp_path, record_of(real, "local", BASELINE),
               record_of(real, "local", [5.0, 70.0, 80.0, 90.0], BYZ, faulty=(0,)))["groups"]
    drop = next(g for g in gs if g["faults"] == BYZ)["drop"]
    assert drop["mean"] == 0.0 and drop["n_paired"] == 1
    assert drop["pairs"][0]["clients"] == [1, 2, 3]
    assert drop["pairs"][0]["honest_global_acc"] == drop["pairs"][0]["baseline_global_acc"] == 80.0


def test_the_drop_is_over_the_same_clients_at_each_runs_own_selected_round(real, tmp_path):
    # seed 0: honest clients 1-3 at 65, 80, 84 against 70, 80, 90: (229 - 240) / 3 = -3.6667
    # seed 1: client 3 faulty; clients 0-2 at 58, 70, 77 against 62, 71, 80: (205 - 213) / 3 = -2.6667
    rs = [record_of(real, "crad", BASELINE, seed=0), record_of(real, "crad", [62.0, 71.0, 80.0, 95.0], seed=1),
          record_of(real, "crad", [1.0, 65.0, 80.0, 84.0], BYZ, faulty=(0,), seed=0),
          record_of(real, "crad", [58.0, 70.0, 77.0, 3.0], BYZ, faulty=(3,), seed=1)]
    drop = next(g for g in board(tmp_path, *rs)["groups"] if g["faults"] == BYZ)["drop"]
    assert [(p["seed"], p["drop"], p["clients"]) for p in drop["pairs"]] == [(0, -3.6667, [1, 2, 3]),
                                                                            (1, -2.6667, [0, 1, 2])]
    assert drop["mean"] == round((-11 / 3 - 8 / 3) / 2, 4) and drop["seeds"] == [0, 1]


def test_a_baseline_without_a_clients_figure_gives_no_drop(real, tmp_path):
    base = record_of(real, "crad", BASELINE)
    base["metrics"]["per_client"] = base["metrics"]["per_client"][:3]  # client 3 missing
    drop = next(g for g in board(tmp_path, base, record_of(real, "crad", [1.0, 65.0, 80.0, 84.0], BYZ, faulty=(0,)))
                ["groups"] if g["faults"] == BYZ)["drop"]
    assert drop["mean"] is None and drop["n_paired"] == 0


def test_records_selected_on_the_honest_clients_are_kept_apart(real, tmp_path):
    """The same config and seed, once selected by the old rule and once by the new one: two groups,
    two protocols (never ranked together), the old one marked, with no drop against the baseline."""
    new = record_of(real, "crad", [1.0, 65.0, 80.0, 84.0], BYZ, faulty=(0,))
    old = record_of(real, "crad", [1.0, 75.0, 85.0, 86.0], BYZ, faulty=(0,), honest_rule=True)
    # another data-free method (a public-set one would be in another setting section: never ranked)
    others = [record_of(real, "uniform-kd", [1.0, 60.0, 60.0, 60.0], BYZ, faulty=(0,)),
              record_of(real, "uniform-kd", [1.0, 62.0, 62.0, 62.0], BYZ, faulty=(0,), honest_rule=True)]
    shown = board(tmp_path, record_of(real, "crad", BASELINE), new, old, *others)
    faulty = [g for g in shown["groups"] if g["faults"] == BYZ and g["method"] == "crad"]
    assert len(faulty) == 2 and {g["n_seeds"] for g in faulty} == {1}
    by_rule = {g["selection_rule"]: g for g in faulty}
    assert set(by_rule) == {SELECTION_RULE, "best_mean_honest_val"}
    assert by_rule["best_mean_honest_val"]["group_id"].endswith("!honest-val")
    assert not by_rule[SELECTION_RULE]["group_id"].endswith("!honest-val")
    assert by_rule["best_mean_honest_val"]["drop"]["n_paired"] == 0  # no pair across rules
    assert by_rule[SELECTION_RULE]["drop"]["n_paired"] == 1
    # the rank: one protocol per rule, crad's figure in each its own group's
    ranks = {r["method"]: r["ranks"] for r in board(tmp_path, rank=True)["rank"]}
    crad = {("selection=honest-val" in x["protocol"]): x["global_acc"] for x in ranks["crad"]}
    assert crad == {False: round(229 / 3, 4), True: round(246 / 3, 4)}
    assert len(ranks["uniform-kd"]) == 2
    # markdown: an 80-column terminal table may cut the setting cell (the predictor column, 1.7)
    result, out, err = invoke_cli("leaderboard", "show", str(tmp_path), "--format", "markdown")
    assert result.exit_code == 0 and "selection=honest-val" in out


def test_the_final_window_drop_pairs_each_clients_final_figures(tmp_path):
    """Real runs: each client's final-window mean (metrics.final.per_client, from the history's
    per-client figures) averages to the final figure, and ``local`` (it sends nothing) under a
    byzantine fault keeps the honest clients' final figures, so its final-window drop is exactly 0."""
    records = []
    for faults in ("", "byzantine:[0]"):
        record, _ = _local_run(faults)
        final = record["metrics"]["final"]
        assert [c["cid"] for c in final["per_client"]] == [0, 1, 2, 3]
        assert np.mean([c["global_acc"] for c in final["per_client"]]) == pytest.approx(final["global_acc"], abs=1e-3)
        window = [h for h in record["history"] if h["round"] >= final["first_round"]]
        assert final["per_client"][1]["global_acc"] == pytest.approx(
            np.mean([h["client_global_acc"][1] for h in window]), abs=1e-3)
        assert "client_global_acc" not in record["history"][0]  # round 0 is outside the window
        assert record_problems(json.loads(json.dumps(record))) == []
        records.append(record)
    drop = next(g for g in board(tmp_path, *records)["groups"] if g["faults"] != "none")["drop"]
    assert drop["n_final_paired"] == 1 and drop["final_mean"] == 0.0
