"""The width-sliced sub-model family (HeteroFL, FedRolex; ``hfl_bench.families.submodel``): slicing
and aggregation by hand on a 2-layer toy, the capacity profile, FedRolex's rolling window, the
full-capacity reduction to FedAvg through the real CLI (bit for bit), the default model family, the
one-line refusals and the leaderboard's own setting section."""

from __future__ import annotations

import json

import pytest
import torch

from hfl_bench.families.submodel import (
    aggregate,
    assign_rates,
    move_optimizer_state,
    parse_profile,
    slice_state,
    window,
)
from hfl_bench.method_api import ConfigError
from hfl_bench.results.setting import SUBMODELS_LABEL, SUBMODELS_REASON

from helpers import assert_refused, figures, invoke_cli, quick_run

# A 2-layer toy: a hidden layer of 4 channels (weight [4, 2], bias [4]) and a classifier of 3 classes
# reading it (weight [3, 4], bias [3]): the input's 2 features and the classes are never sliced.
AXES = {"h.weight": (0, None), "h.bias": (0,), "fc.weight": (None, 0), "fc.bias": (None,)}


def toy_global() -> dict[str, torch.Tensor]:
    return {"h.weight": torch.arange(8.0).reshape(4, 2), "h.bias": torch.arange(4.0),
            "fc.weight": torch.arange(12.0).reshape(3, 4), "fc.bias": torch.zeros(3)}


def test_slicing_cuts_hidden_channels_and_keeps_inputs_and_classes():
    g = toy_global()
    static = slice_state(g, AXES, {0: window(4, 2, 0)})  # HeteroFL at rate 1/2: channels 0, 1
    assert static["h.weight"].tolist() == [[0, 1], [2, 3]]
    assert static["h.bias"].tolist() == [0, 1]
    assert static["fc.weight"].tolist() == [[0, 1], [4, 5], [8, 9]]  # every class, hidden columns 0, 1
    rolled = slice_state(g, AXES, {0: window(4, 2, 3)})  # a window from channel 3 wraps to channel 0
    assert rolled["h.bias"].tolist() == [3, 0]
    assert rolled["fc.weight"].tolist() == [[3, 0], [7, 4], [11, 8]]


def test_each_entry_is_the_mean_over_the_clients_that_hold_it():
    g = toy_global()
    a = {"h.weight": torch.full((2, 2), 10.0), "h.bias": torch.full((2,), 10.0),
         "fc.weight": torch.full((3, 2), 10.0), "fc.bias": torch.full((3,), 10.0)}
    b = {k: v * 3 for k, v in a.items()}  # 30 everywhere
    # A holds channels {0, 1}, B channels {3, 0}, each weight 1/2: channel 0 both, 1 only A, 3 only B, 2 none.
    new = aggregate(g, AXES, [(a, {0: window(4, 2, 0)}, 0.5), (b, {0: window(4, 2, 3)}, 0.5)])
    assert new["h.bias"].tolist() == [20.0, 10.0, 2.0, 30.0]  # channel 2 keeps its value
    assert new["h.weight"].tolist() == [[20, 20], [10, 10], [4, 5], [30, 30]]
    assert new["fc.weight"][:, 2].tolist() == [2.0, 6.0, 10.0]
    assert new["fc.weight"][:, 0].tolist() == [20.0] * 3
    assert new["fc.bias"].tolist() == [20.0] * 3  # every class held by both
    # weights 3/4 and 1/4: an entry held by one client only is that client's value, whatever its weight
    new = aggregate(g, AXES, [(a, {0: window(4, 2, 0)}, 0.75), (b, {0: window(4, 2, 3)}, 0.25)])
    assert new["h.bias"].tolist() == [15.0, 10.0, 2.0, 30.0]


def test_momentum_moves_with_the_window():
    model = torch.nn.Module()
    model.h = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.h.bias.grad = torch.zeros(2)
    model.h.weight.grad = torch.zeros(2, 2)
    optimizer.step()
    optimizer.state[model.h.bias]["momentum_buffer"] = torch.tensor([5.0, 6.0])  # global channels 1, 2
    full = {"h.weight": torch.Size([4, 2]), "h.bias": torch.Size([4])}
    move_optimizer_state(optimizer, model, AXES, full, {0: window(4, 2, 1)}, {0: window(4, 2, 2)})
    # now channels 2, 3: channel 2 keeps its 6, channel 3 is new to the client
    assert optimizer.state[model.h.bias]["momentum_buffer"].tolist() == [6.0, 0.0]


def test_capacity_profile_and_seeded_assignment():
    assert parse_profile("a1-b1-c1-d1-e1") == [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)]
    rates = assign_rates(parse_profile("a1-e1"), 10, seed=7)
    assert sorted(rates) == [0.0625] * 5 + [1.0] * 5
    assert rates == assign_rates(parse_profile("a1-e1"), 10, seed=7)  # seeded
    assert sorted(assign_rates(parse_profile("a2-c1"), 4, seed=0)) == [0.25, 1.0, 1.0, 1.0]  # 8/3, 4/3
    for bad in ("a1-f1", "a0", "a1-a1", "", "a1--b1"):
        with pytest.raises(ConfigError):
            parse_profile(bad)


def test_fedrolex_window_rolls_one_channel_a_round_and_heterofl_stays():
    from hfl_bench.method_api import get_method_class

    rolex, hetero = get_method_class("fedrolex")(), get_method_class("heterofl")()
    for m in (rolex, hetero):
        m.rates, m.hidden = [0.5, 1.0], (16,)
    assert rolex.indices(None, 0, 1)[0].tolist() == list(range(8))
    assert rolex.indices(None, 0, 2)[0].tolist() == list(range(1, 9))
    assert rolex.indices(None, 0, 10)[0].tolist() == [9, 10, 11, 12, 13, 14, 15, 0]
    assert rolex.indices(None, 0, 17)[0].tolist() == list(range(8))  # back to the start
    assert hetero.indices(None, 0, 10)[0].tolist() == list(range(8))
    assert rolex.indices(None, 1, 5)[0].tolist() == list(range(16))  # full capacity: every channel in order


@pytest.mark.parametrize("method", ["heterofl", "fedrolex"])
def test_full_capacity_is_fedavg_bit_for_bit(method, tmp_path):
    fedavg = quick_run(tmp_path, "--method", "fedavg", "--pool", "heterofl-cnn")
    sub = quick_run(tmp_path, "--method", method, "--set", "profile=a1", "--set", "weighting=samples")
    assert sub["arch_pool"]["name"] == "heterofl-cnn"
    assert figures(sub) == figures(fedavg)  # bit for bit, every round, every client
    assert sub["method"]["run_details"]["client_rates"] == [1.0] * 4


def test_default_runs_its_own_family_and_sits_in_its_own_section(tmp_path):
    from hfl_bench import run as api_run

    records = tmp_path / "records"
    hetero = api_run(method="heterofl", task="digits", clients=4, rounds=3, out=str(records)).data
    rolex = quick_run(records, "--method", "fedrolex")
    quick_run(records, "--method", "fedavg", "--pool", "heterofl-cnn")
    for rec in (hetero, rolex):
        assert rec["arch_pool"]["name"] == "heterofl-cnn" and rec["method"]["submodels"] is True
        assert rec["method"]["hparams"] == {"profile": "a1-b1-c1-d1-e1", "weighting": "uniform", "capacity": "fixed"}
        assert sorted(rec["method"]["run_details"]["client_rates"]) == [0.125, 0.25, 0.5, 1.0]
        params = rec["method"]["run_details"]["client_params"]
        assert len(set(params)) == 4  # four widths, four sizes
    result, stdout, _ = invoke_cli("leaderboard", "show", str(records), "--format", "json")
    assert result.exit_code == 0, result.output
    board = json.loads(stdout)
    sections = {g["method"]: g["section"] for g in board["groups"]}
    assert sections["heterofl"] == sections["fedrolex"] == f"data-free, {SUBMODELS_LABEL}, protocol budget"
    assert sections["fedavg"] == "data-free, single architecture, protocol budget"
    result, stdout, _ = invoke_cli("leaderboard", "show", str(records))
    assert result.exit_code == 0 and " ".join(SUBMODELS_REASON.split()[:6]) in " ".join(stdout.split())


@pytest.mark.parametrize("args,says", [
    (("--pool", "cpu"), "slices the width of one global model; pool 'cpu'"),
    (("--pool", "cpu-cnn"), "slices the width of one global model; pool 'cpu-cnn'"),
    (("--set", "profile=a1-z1"), "capacity profile 'a1-z1'"),
    (("--set", "weighting=mean"), "weighting must be uniform or samples"),
])
def test_a_setting_it_cannot_run_is_one_line_and_exit_2(args, says, tmp_path):
    assert_refused(tmp_path, "heterofl", *args, says=says)


def test_describe_states_the_family_and_its_pool():
    result, _, _ = invoke_cli("describe", "fedrolex")
    assert result.exit_code == 0 and "sub-models of one global model: True" in result.output
    assert "default pool: heterofl-cnn" in result.output


def test_static_batch_norm_takes_a_single_value_per_channel_and_is_batch_norm_otherwise():
    """A client's local test half of one image reaches HeteroFL's last layer as one value per
    channel: static BN gives the bias (x minus its own mean is zero) where torch's BatchNorm refuses;
    any larger batch is torch's BatchNorm, bit for bit."""
    from hfl_bench.width_models import heterofl_cnn, static_bn

    torch.manual_seed(0)
    bn = static_bn(4)
    with torch.no_grad():
        bn.weight.uniform_(), bn.bias.uniform_()
    one = torch.randn(1, 4, 1, 1)
    assert torch.allclose(bn(one).flatten(), bn.bias.detach(), atol=1e-4)  # computed as x * s + (b - mean * s)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        torch.nn.BatchNorm2d(4, momentum=None, track_running_stats=False)(one)
    plain = torch.nn.BatchNorm2d(4, momentum=None, track_running_stats=False)
    plain.load_state_dict(bn.state_dict())
    for x in (torch.randn(2, 4, 1, 1), torch.randn(1, 4, 3, 3), torch.randn(5, 4, 2, 2)):
        assert torch.equal(bn(x), plain(x))
    model = heterofl_cnn(num_classes=10, in_chans=1, img_size=(8, 8), rate=0.0625).eval()
    assert model(torch.randn(1, 1, 8, 8)).shape == (1, 10)  # a single image at level e
