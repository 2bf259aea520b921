"""FLOPs measured with torch's counter (``hfl_bench.flops``): a linear model and a pool CNN against
counts by hand, the count leaves the model and the RNG alone, a real ``hfl-bench run`` record holds
FLOPs per client that are its budget's samples x the per-sample figures, and an old record reads as
not recorded (never zero)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from hfl_bench import flops
from hfl_bench.data import get_task
from hfl_bench.pools import get_pool, seeded_model
from hfl_bench.record.model import record_problems
from hfl_bench.results.budget import flops_label, training_flops_per_client_round
from hfl_bench.results.loading import load_record

from helpers import invoke_cli

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("d, k", [(64, 10), (7, 3)])
def test_a_linear_model_counts_2dk_forward_and_4dk_training(d, k):
    # forward: one [B, d] x [d, k] product, 2 FLOPs per multiply-add; backward: the weight's
    # gradient only (2dk again): the input needs no gradient, and the bias's is a sum (not counted)
    got = flops.count(nn.Linear(d, k), torch.randn(5, d))
    assert got == flops.PerSample(forward=2 * d * k, training=4 * d * k)


def test_per_sample_figures_do_not_depend_on_the_batch():
    model = nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    assert flops.count(model, torch.randn(2, 12)) == flops.count(model, torch.randn(9, 12))


def _conv(h: int, w: int, cin: int, cout: int) -> int:
    return 2 * h * w * 9 * cin * cout  # a 3x3 convolution, padding 1: every output pixel


def test_the_digits_pools_small_cnn_against_a_hand_count():
    info = get_task("digits").info
    assert info.input_shape == (1, 8, 8) and info.num_classes == 10
    member = next(m for m in get_pool("cpu").members if m.name == "cnn_small")
    # cnn_small: conv 1->16 at 8x8, max-pool, conv 16->32 at 4x4, max-pool, conv 32->64 at 2x2, global
    # average pool, linear 64->10 (batch norm, ReLU, pooling: elementwise, not counted)
    layers = [_conv(8, 8, 1, 16), _conv(4, 4, 16, 32), _conv(2, 2, 32, 64), 2 * 64 * 10]
    forward = sum(layers)
    # training: forward, every layer's weight gradient (as many FLOPs as its forward) and every
    # layer's input gradient but the first's (the images need none)
    training = forward + sum(layers) + sum(layers[1:])
    model = seeded_model(member, info, 0, torch.device("cpu"), keep_global_rng=True)
    got = flops.per_sample(member.name, model, torch.randn(4, *info.input_shape))
    assert got == flops.PerSample(forward, training) == flops.PerSample(314_624, 925_440)


def test_counting_leaves_the_model_and_the_rng_as_they_were():
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 2))
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 6)
    torch.manual_seed(3)
    expected_draw = torch.rand(3)
    torch.manual_seed(3)
    flops.count(model, x)  # dropout draws inside it
    assert torch.equal(torch.rand(3), expected_draw)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and model.training


def test_the_transformers_eval_fast_path_is_counted():
    # nn.TransformerEncoderLayer's eval-mode fast path is one fused kernel the counter does not see
    layer = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1)
    model = nn.Sequential(layer, nn.Flatten(), nn.Linear(4 * 16, 2))
    got = flops.count(model, torch.randn(3, 4, 16))
    # per sample: q, k, v and output projections (4 x 4 tokens x 16 x 16), scores and mixing
    # (2 x 4 x 4 x 16), the feed-forward (2 x 4 x 16 x 32), the head (64 x 2); 2 FLOPs each
    assert got.forward == 2 * (4 * 4 * 16 * 16 + 2 * 4 * 4 * 16 + 2 * 4 * 16 * 32 + 64 * 2)
    assert torch.backends.mha.get_fastpath_enabled()  # put back


def test_the_cache_tells_a_changed_head_apart():
    x = torch.randn(4, 8)
    ten, three = nn.Linear(8, 10), nn.Linear(8, 3)
    three.requires_grad_(False)  # a frozen model is counted as trained whole
    assert flops.per_sample("head", ten, x).forward == 2 * 8 * 10
    assert flops.per_sample("head", three, x) == flops.PerSample(2 * 8 * 3, 4 * 8 * 3)


@pytest.fixture(scope="module")
def run_record(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("flops")
    result, stdout, _ = invoke_cli("run", "--method", "local", "--task", "digits", "--rounds", "1", "--out", str(out))
    assert result.exit_code == 0, stdout
    (path,) = out.rglob("*.json")
    return json.loads(path.read_text())


def test_a_run_records_flops_per_client_from_its_budget(run_record):
    record = run_record
    assert record_problems(record) == []
    cost, n = record["cost"], record["federation"]["n_clients"]
    section, budget = cost["flops"], cost["budget"]
    assert section["counter"] == "torch.utils.flop_counter.FlopCounterMode"
    info = get_task("digits").info
    members = {m.name: m for m in get_pool(record["arch_pool"]["name"]).members}
    x = torch.randn(4, *info.input_shape)
    expected = [flops.count(seeded_model(members[a], info, 0, torch.device("cpu"), keep_global_rng=True), x)
                for a in record["arch_pool"]["assignment"]]
    assert section["per_sample"] == {"forward": [e.forward for e in expected],
                                     "training": [e.training for e in expected]}
    assert section["per_sample"]["training"][1] == 925_440  # client 1 is the hand-counted cnn_small
    for kind in ("private", "public", "synthetic"):
        samples = budget["per_client"][kind]["samples"]
        trained = [s * e.training for s, e in zip(samples, expected)]
        assert section["training"]["per_client"][kind] == trained
        assert section["training"]["totals"][kind] == sum(trained)
        rounds = budget["rounds"]
        assert section["training"]["per_client_round"][kind] == pytest.approx(sum(trained) / n / rounds, abs=0.1)
    assert all(v > 0 for v in section["training"]["per_client"]["private"])  # local trains every client
    assert training_flops_per_client_round(record) == section["training"]["per_client_round"]["private"]


def test_the_board_shows_flops_only_when_chosen(run_record, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(run_record))
    result, default, _ = invoke_cli("leaderboard", "show", str(path), "--format", "markdown")
    assert result.exit_code == 0 and "GFLOP" not in default and "train FLOPs" not in default
    result, chosen, _ = invoke_cli("leaderboard", "show", str(path), "--format", "markdown",
                                   "--columns", "method,train FLOPs / client / round")
    assert result.exit_code == 0, chosen
    gflops = run_record["cost"]["flops"]["training"]["per_client_round"]["private"] / 1e9
    assert f"{gflops:.3g} GFLOPs" in chosen


def test_an_old_record_reads_as_not_recorded():
    path = next(p for p in sorted((REPO / "leaderboards").rglob("*.json"))
                if json.loads(p.read_text()).get("schema_version") == "1.7"
                and json.loads(p.read_text()).get("status") == "ok")
    record = load_record(path)
    assert record["schema_version"] == "1.11" and "budget" in record["cost"] and "flops" not in record["cost"]
    assert training_flops_per_client_round(record) is None
    assert flops_label([record]) == "-"  # not recorded, never 0
