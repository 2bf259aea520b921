"""Inference FLOPs (``cost.flops.inference``, 1.10): the samples each client's model processes in
forward-only passes (``metering.Budget.watch``'s hook), by kind, x its forward FLOPs per sample.
Checked by hand on a linear model (one ``nn.Linear(64, 10)``: 2 x 64 x 10 FLOPs a sample) under
``uniform-kd``, whose teachers predict on their peers' private shards once per round; counting
leaves the run's numerics alone; an older record reads as not recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfl_bench import metering, pools
from hfl_bench.pools import ArchPool, PoolMember
from hfl_bench.registry import POOLS
from hfl_bench.results.budget import inference_flops_per_client_round, inference_label
from hfl_bench.results.loading import load_record

from helpers import REAL_RECORD, invoke_cli

LINEAR = "linear-test"
FORWARD = 2 * 64 * 10  # digits' 8x8 inputs flattened, ten classes
ROUNDS, EPOCHS = 2, 2
RUN = ("run", "--method", "uniform-kd", "--task", "digits", "--pool", LINEAR, "--clients", "2", "--rounds",
       str(ROUNDS), "--local-epochs", str(EPOCHS), "--eval-every", "1", "--seed", "0", "-q")


@pytest.fixture()
def linear_pool(monkeypatch):
    """A pool of one linear layer (the pool's MLP with no hidden layer), for this test only."""
    POOLS.get("cpu")  # the registry's plugins discovered first
    pool = ArchPool(LINEAR, (PoolMember(LINEAR, label="linear"),), "One nn.Linear(64, 10).")
    monkeypatch.setitem(POOLS._items, LINEAR, pool)
    monkeypatch.setitem(POOLS._origin, LINEAR, __name__)
    build = pools.build_model

    def build_model(member: PoolMember, info):
        if member.model != LINEAR:
            return build(member, info)
        in_chans, *size = info.input_shape
        return pools.MLP((), info.num_classes, in_chans, tuple(size))  # Flatten, Linear(64, 10)

    monkeypatch.setattr(pools, "build_model", build_model)


def _run(out: Path) -> dict:
    result, stdout, _ = invoke_cli(*RUN, "--out", str(out))
    assert result.exit_code == 0, stdout
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


def test_uniform_kd_teacher_passes_by_hand_on_a_linear_model(linear_pool, tmp_path):
    record = _run(tmp_path / "run")
    flops = record["cost"]["flops"]
    assert flops["per_sample"] == {"forward": [FORWARD, FORWARD], "training": [2 * FORWARD, 2 * FORWARD]}
    # each round, each client's model predicts once on its peer's whole training shard (no
    # augmentation: one distinct view, however many local epochs); a shard's size is what its
    # owner trained over the rounds and epochs
    trained = record["cost"]["budget"]["per_client"]["private"]["samples"]
    shard = [s // (ROUNDS * EPOCHS) for s in trained]
    assert [s * ROUNDS * EPOCHS for s in shard] == trained
    inference = flops["inference"]
    by_hand = [ROUNDS * shard[1] * FORWARD, ROUNDS * shard[0] * FORWARD]
    assert inference["per_client"]["private"] == by_hand
    assert inference["totals"]["private"] == sum(by_hand)
    assert inference["per_client_round"]["private"] == pytest.approx(sum(by_hand) / 2 / ROUNDS, abs=0.1)
    for kind in ("public", "synthetic", "server"):
        assert inference["per_client"][kind] == [0, 0] and inference["totals"][kind] == 0
    # evaluation apart: every client's model measured every round (and the initial models)
    assert all(v > 0 and v % FORWARD == 0 for v in inference["per_client"]["evaluation"])
    # training is counted as before: samples trained x 2 x forward (weight gradient only)
    assert flops["training"]["per_client"]["private"] == [s * 2 * FORWARD for s in trained]
    assert inference_flops_per_client_round(record) == inference["per_client_round"]["private"]
    path = tmp_path / "run"
    result, shown, _ = invoke_cli("leaderboard", "show", str(path), "--format", "markdown", "--columns",
                                  "method,inference FLOPs / client / round,eval FLOPs / client / round")
    assert result.exit_code == 0, shown
    assert inference_label([record]) in shown and "not recorded" not in shown


def test_counting_changes_nothing_the_run_computes(linear_pool, tmp_path):
    counted = _run(tmp_path / "counted")
    with metering.uncounted():  # the hook returns before it reads anything: the run as if unhooked
        plain = _run(tmp_path / "plain")
    assert plain["cost"]["flops"]["inference"]["totals"] == dict.fromkeys(metering.INFERENCE, 0)

    def numerics(r: dict) -> list:
        return [{k: v for k, v in h.items() if k not in ("seconds", "phases")} for h in r["history"]]

    assert numerics(counted) == numerics(plain) and counted["metrics"] == plain["metrics"]
    assert counted["cost"]["budget"] == plain["cost"]["budget"]


def test_an_older_record_reads_as_not_recorded():
    record = load_record(REAL_RECORD)
    assert "inference" not in (record["cost"].get("flops") or {})
    assert inference_flops_per_client_round(record) is None
    assert inference_label([record]) == inference_label([record], evaluation=True) == "not recorded"
