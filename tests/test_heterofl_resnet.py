"""HeteroFL's pre-activation ResNet-18 in the width family (``hfl_bench.width_models``, pools
``heterofl-resnet18`` and ``heterofl-resnet18-paper``): its parameter count at the paper's widths
by hand, every level's sub-model is the leading slices of the global model (built at its rate, loaded
from the family's slices, shape for shape), the scaler and static batch norm, and full-capacity
``heterofl`` on it equal to ``fedavg`` through the real CLI, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hfl_bench.families.submodel import LEVELS, slice_state, window
from hfl_bench.pools import get_pool
from hfl_bench.width_models import HeteroResNet, Scaler, heterofl_resnet18, scaled_width

from helpers import figures, invoke_cli


def by_hand(c: tuple[int, ...], in_chans: int, classes: int) -> int:
    """ResNet-18 pre-activation, every convolution without bias, a 1x1 projection where a stage
    widens, batch norm (weight and bias) on each block's two inputs and before the head."""
    total = in_chans * c[0] * 9  # stem
    cin = c[0]
    for cout in c:
        for b in range(2):
            total += 2 * cin + cin * cout * 9 + 2 * cout + cout * cout * 9  # n1, conv1, n2, conv2
            if cin != cout:
                total += cin * cout  # shortcut projection
            cin = cout
    return total + 2 * cin + cin * classes + classes  # norm, fc


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_paper_width_parameter_count_by_hand():
    model = heterofl_resnet18(num_classes=10, in_chans=3, img_size=(32, 32), hidden=(64, 128, 256, 512))
    assert n_params(model) == by_hand((64, 128, 256, 512), 3, 10) == 11_172_170
    # and the scaled levels: every stage at ceil(r * C) channels, the input and the classes unscaled
    for level, rate in LEVELS.items():
        sub = heterofl_resnet18(num_classes=10, in_chans=3, img_size=(32, 32), hidden=(64, 128, 256, 512), rate=rate)
        assert n_params(sub) == by_hand(tuple(scaled_width(c, rate) for c in (64, 128, 256, 512)), 3, 10), level
    # the structure: 4 stages of 2 blocks, a projection where a stage widens and strides only
    assert [len(s) for s in model.stages] == [2, 2, 2, 2]
    assert [b.shortcut is not None for s in model.stages for b in s] == [False, False] + [True, False] * 3
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_each_level_is_the_leading_slices_of_the_global_model():
    torch.manual_seed(0)
    full = heterofl_resnet18(num_classes=10, in_chans=1, img_size=(8, 8))
    state = full.state_dict()
    axes = full.width_axes()
    assert set(axes) == {n for n, _ in full.named_parameters()}  # every parameter states its axes
    for level, rate in LEVELS.items():
        sub = heterofl_resnet18(num_classes=10, in_chans=1, img_size=(8, 8), rate=rate)
        idx = {k: window(c, scaled_width(c, rate), 0) for k, c in enumerate(full.full_hidden)}
        sliced = slice_state(state, axes, idx)
        sub.load_state_dict(sliced)  # strict: the level's model takes exactly the slices, shape for shape
        for name, t in sub.state_dict().items():
            lead = state[name][tuple(slice(0, n) for n in t.shape)]
            assert torch.equal(t, lead), (level, name)
        assert n_params(sub) < n_params(full) or rate == 1.0
    # level e of the CPU widths (16-128) keeps one channel of the first stage
    e = heterofl_resnet18(num_classes=10, in_chans=1, img_size=(8, 8), rate=LEVELS["e"])
    assert e.stem.weight.shape == (1, 1, 3, 3) and e.fc.weight.shape == (10, 8)


def test_scaler_and_static_batch_norm():
    model = heterofl_resnet18(num_classes=10, in_chans=1, img_size=(8, 8), rate=0.5)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.track_running_stats and m.running_mean is None for m in norms)
    scalers = [m for m in model.modules() if isinstance(m, Scaler)]
    assert len(scalers) == 9 and all(s.rate == 0.5 for s in scalers)  # one a block, one before the head
    x = torch.randn(4, 3)
    scalers[0].train()
    assert torch.equal(scalers[0](x), x / 0.5)
    scalers[0].eval()
    assert torch.equal(scalers[0](x), x)
    assert torch.equal(model.fc.bias, torch.zeros(10))  # the authors' init
    # a signal (1 x L) strides only along its length
    signal = heterofl_resnet18(num_classes=6, in_chans=9, img_size=(1, 32))
    assert signal(torch.randn(2, 9, 1, 32)).shape == (2, 6)
    assert isinstance(signal, HeteroResNet)


def test_the_pools():
    for name, hidden in (("heterofl-resnet18", (16, 32, 64, 128)), ("heterofl-resnet18-paper", (64, 128, 256, 512))):
        pool = get_pool(name)
        assert pool.homogeneous and pool.members[0].model == "heterofl_resnet18"
        assert tuple(pool.members[0].kwargs.get("hidden", (16, 32, 64, 128))) == hidden


QUICK = ("--task", "digits", "--clients", "4", "--rounds", "2", "--local-epochs", "1")


def run(out: Path, *args: str) -> dict:
    result, _, _ = invoke_cli("run", *QUICK, "--out", str(out), *args)
    assert result.exit_code == 0, result.output
    [path] = list(out.glob("*.json"))
    return json.loads(path.read_text())




@pytest.mark.slow  # two ResNet-18 runs on the CPU
def test_full_capacity_heterofl_on_the_resnet_is_fedavg_bit_for_bit(tmp_path):
    fedavg = run(tmp_path / "fedavg", "--method", "fedavg", "--pool", "heterofl-resnet18")
    hetero = run(tmp_path / "heterofl", "--method", "heterofl", "--pool", "heterofl-resnet18",
                 "--set", "profile=a1", "--set", "weighting=samples")
    assert hetero["arch_pool"]["name"] == "heterofl-resnet18"
    assert figures(hetero) == figures(fedavg)
    assert hetero["method"]["run_details"]["client_rates"] == [1.0] * 4


@pytest.mark.slow  # ResNet-18 sub-models on the CPU
def test_fedrolex_rolls_windows_through_the_residual_streams(tmp_path):
    rec = run(tmp_path, "--method", "fedrolex", "--pool", "heterofl-resnet18", "--set", "profile=a1-c1")
    assert rec["status"] == "ok"
    assert sorted(set(rec["method"]["run_details"]["client_params"])) == [
        by_hand(tuple(scaled_width(c, 0.25) for c in (16, 32, 64, 128)), 1, 10), by_hand((16, 32, 64, 128), 1, 10)]


def test_list_pools_levels_states_each_levels_params_and_flops():
    from hfl_bench.flops import count

    result, stdout, _ = invoke_cli("list", "pools", "--levels", "--json")
    assert result.exit_code == 0, result.output
    rows = {(r["pool"], r["level"]): r for r in json.loads(stdout)}
    assert {p for p, _ in rows} == {"heterofl-cnn", "heterofl-cnn-paper", "heterofl-resnet18",
                                    "heterofl-resnet18-paper", "depthfl-cnn"}
    for level, rate in LEVELS.items():
        row = rows[("heterofl-resnet18", level)]
        model = heterofl_resnet18(num_classes=10, in_chans=1, img_size=(8, 8), rate=rate)
        assert row["params"] == n_params(model) == by_hand(tuple(scaled_width(c, rate) for c in (16, 32, 64, 128)),
                                                           1, 10)
        per = count(model, torch.zeros(4, 1, 8, 8))  # the project's counter, as a run's record counts
        assert (row["forward_flops"], row["training_flops"]) == (per.forward, per.training)
    assert rows[("heterofl-resnet18", "b")]["scale"] == "width 1/2"
    assert rows[("depthfl-cnn", "d")]["scale"] == "depth 1 of 4"
    # the paper's widths at 1/4 are the CPU widths at 1
    assert rows[("heterofl-resnet18-paper", "c")]["params"] == rows[("heterofl-resnet18", "a")]["params"]
    result, stdout, stderr = invoke_cli("list", "methods", "--levels")
    assert result.exit_code == 2 and "--levels lists the capacity levels of the sub-model pools" in result.output
