"""FjORD (``methods/fjord.py``) on the width-sliced sub-model family: a step at a sampled width p
moves only the leading ceil(p * C) channels (by hand, against a model built at rate p), the width
sampler is seeded and draws only levels <= p_max, full capacity is FedAvg bit for bit through the
real CLI, the default runs its own family through the CLI, the Python API and a matrix, and what it
cannot run is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from hfl_bench.families.submodel import slice_state, window
from hfl_bench.method_api import ConfigError, get_method_class
from hfl_bench.methods.fjord import NestedStep, held, narrow_forward, sample_widths, width_masks, width_set
from hfl_bench.width_models import heterofl_cnn

from helpers import QUICK, assert_refused, figures, invoke_cli, quick_run

HIDDEN = (4, 8)


def cnn(rate: float) -> torch.nn.Module:
    return heterofl_cnn(num_classes=3, in_chans=1, img_size=(4, 4), hidden=HIDDEN, rate=rate)


def test_a_step_at_width_p_moves_only_the_leading_channels():
    torch.manual_seed(0)
    model, template = cnn(1.0), cnn(0.5).train()  # a client at p_max = 1 draws p = 1/2
    axes = model.width_axes()
    x, y = torch.randn(6, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    F.cross_entropy(model(x), y).backward()  # a full-width step first: momentum on every entry
    optimizer.step()

    keep = held(HIDDEN, 0.5)
    assert keep == {0: 2, 1: 4}  # ceil(p * C) of each hidden layer
    # The width-p forward is the sub-model of the first ceil(p * C) channels: the same logits and
    # gradients as a network built at rate p holding those entries.
    own = cnn(0.5).train()
    own.load_state_dict(slice_state(model.state_dict(), axes, {k: window(c, keep[k], 0) for k, c in enumerate(HIDDEN)}))
    F.cross_entropy(own(x), y).backward()

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    momentum = {n: optimizer.state[p]["momentum_buffer"].clone() for n, p in model.named_parameters()}
    step = NestedStep(optimizer, model)
    step.masks = width_masks(model, axes, keep)
    step.zero_grad()
    logits = narrow_forward(template, model, axes, keep, x)
    assert torch.allclose(logits, own(x), atol=1e-6)
    F.cross_entropy(logits, y).backward()
    step.step()

    for (name, p), (_, q) in zip(model.named_parameters(), own.named_parameters()):
        mask = step.masks[name]
        assert mask.sum() == q.numel()  # the held entries are the sub-model's
        assert torch.allclose(p.grad[mask].view(q.shape), q.grad, atol=1e-6), name
        assert torch.equal(p.grad[~mask], torch.zeros_like(p.grad[~mask])), name
        moved = p.detach() != before[name]
        assert not moved[~mask].any(), f"{name}: an entry outside the width moved"
        assert moved[mask].all(), f"{name}: a held entry did not move"
        buffer = optimizer.state[p]["momentum_buffer"]
        assert torch.equal(buffer[~mask], momentum[name][~mask]), f"{name}: momentum outside the width changed"
    # e.g. the second layer's conv holds out-channels 0-3 and in-channels 0-1 of [8, 4, 3, 3]
    conv = step.masks["features.5.weight"]
    assert conv[:4, :2].all() and not conv[4:].any() and not conv[:, 2:].any()
    assert step.masks["fc.weight"][:, :4].all() and not step.masks["fc.weight"][:, 4:].any()


def test_the_width_sampler_is_seeded_and_draws_levels_up_to_p_max():
    levels = width_set("profile", "a1-b1-c1-d1-e1")
    assert levels == [1.0, 0.5, 0.25, 0.125, 0.0625]
    draws = sample_widths(7, 3, 2, 400, levels, 0.25)
    assert draws == sample_widths(7, 3, 2, 400, levels, 0.25)  # seeded: run seed, round, client
    assert set(draws) == {0.25, 0.125, 0.0625}  # every level <= p_max, nothing wider
    assert all(draws.count(p) > 100 for p in set(draws))  # uniform over them (400 / 3 each)
    assert draws != sample_widths(7, 4, 2, 400, levels, 0.25) != sample_widths(7, 3, 1, 400, levels, 0.25)
    assert draws != sample_widths(8, 3, 2, 400, levels, 0.25)
    assert sample_widths(7, 3, 2, 50, levels, 1.0)[:10] != [1.0] * 10
    assert set(sample_widths(0, 1, 0, 20, levels, 0.0625)) == {0.0625}  # the smallest client: its own width
    assert sample_widths(0, 1, 0, 5, width_set("profile", "a1"), 1.0) == [1.0] * 5
    assert width_set("a-b-c-d-e", "a1-c1") == levels
    assert width_set("a-c", "a1-c1") == [1.0, 0.25]
    for widths, profile in (("a-f", "a1"), ("a-a", "a1"), ("a-b", "a1-c1"), ("", "a1")):
        with pytest.raises(ConfigError):
            width_set(widths, profile)


def test_full_capacity_with_one_width_is_fedavg_bit_for_bit(tmp_path):
    fedavg = quick_run(tmp_path, "--method", "fedavg", "--pool", "heterofl-cnn")
    fjord = quick_run(tmp_path, "--method", "fjord", "--set", "profile=a1")  # P = {1.0}; kd on, weighting samples
    assert fjord["arch_pool"]["name"] == "heterofl-cnn"
    assert fjord["method"]["hparams"]["kd"] == "on" and fjord["method"]["hparams"]["weighting"] == "samples"
    assert figures(fjord) == figures(fedavg)  # bit for bit, every round, every client
    assert fjord["method"]["run_details"]["client_rates"] == [1.0] * 4
    assert fjord["method"]["run_details"]["widths"] == [1.0]


def test_default_runs_its_family_through_the_cli_the_api_and_a_matrix(tmp_path):
    from hfl_bench import run as api_run

    cli = quick_run(tmp_path / "cli", "--method", "fjord")
    api = api_run(method="fjord", task="digits", clients=4, rounds=3, out=str(tmp_path / "api")).data
    assert figures(cli) == figures(api)  # one code path, one seed
    for rec in (cli, api):
        assert rec["status"] == "ok" and rec["arch_pool"]["name"] == "heterofl-cnn"
        assert rec["method"]["submodels"] is True and rec["method"]["fidelity"] == "reconstructed"
        assert sorted(rec["method"]["run_details"]["client_rates"]) == [0.125, 0.25, 0.5, 1.0]
        assert rec["method"]["run_details"]["widths"] == [1.0, 0.5, 0.25, 0.125, 0.0625]
    # kd=off trains other steps (the width-p sub-model alone): another run
    off = quick_run(tmp_path / "off", "--method", "fjord", "--set", "kd=off")
    assert figures(off)["history"] != figures(cli)["history"]

    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump({"name": "tiny", "out": str(tmp_path / "matrix"), "tasks": ["digits"],
                                     "methods": ["fjord"], "seeds": [0],
                                     "settings": {"clients": 4, "rounds": 3}}, sort_keys=False))
    result, stdout, _ = invoke_cli("matrix", str(suite), "--json")
    assert result.exit_code == 0, result.output
    [cell] = json.loads(stdout)["cells"]
    assert cell["status"] == "ok"
    assert figures(json.loads(Path(cell["record"]).read_text())) == figures(cli)


@pytest.mark.parametrize("args,says", [
    (("--pool", "cpu"), "fjord slices the width of one global model; pool 'cpu'"),
    (("--set", "widths=a-b", "--set", "profile=a1-c1"), "leave out level c of profile 'a1-c1'"),
    (("--set", "kd=yes"), "fjord: kd must be on or off"),
    (("--set", "kd_weight=2"), "fjord: kd_weight must be in [0, 1]"),
    (("--task", "rotten-tomatoes"), "does not run task rotten-tomatoes, whose inputs are token ids"),
])
def test_a_setting_it_cannot_run_is_one_line_and_exit_2(args, says, tmp_path):
    base = QUICK if "--task" not in args else QUICK[2:]  # a text task in place of digits
    assert_refused(tmp_path, "fjord", "--data-dir", str(tmp_path / "none"), *args, says=says, base=base)


def test_card_and_describe():
    card = get_method_class("fjord").card
    assert card.submodels and card.pool == "heterofl-cnn" and card.fidelity == "reconstructed"
    assert any("self-distillation on by default" in n for n in card.notes)
    result, _, _ = invoke_cli("describe", "fjord")
    assert result.exit_code == 0 and "sub-models of one global model: True" in result.output
    assert "default pool: heterofl-cnn" in result.output and "kd_weight" in result.output
