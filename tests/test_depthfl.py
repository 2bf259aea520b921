"""DepthFL, the depth-sliced sub-model family (``hfl_bench.families.depth``, ``methods/depthfl.py``):
the exits' loss and self-distillation by hand (values and gradients), aggregation by hand on a toy,
the depth model's sub-models, the one-exit reduction to FedAvg through the real CLI (bit for bit),
the default model family through the CLI, the Python API and a matrix, the one-line refusals and
the leaderboard's sub-model section."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hfl_bench.families.depth import aggregate, assign_depths, check_levels, exit_losses
from hfl_bench.families.submodel import assign_rates, parse_profile
from hfl_bench.method_api import ConfigError, check_method_for_task, get_method_class
from hfl_bench.results.setting import SUBMODELS_LABEL

from helpers import assert_refused, figures, invoke_cli, quick_run, straight_and_resumed


def log_softmax(z: list[float]) -> list[float]:
    top = max(z)
    norm = top + math.log(sum(math.exp(v - top) for v in z))
    return [v - norm for v in z]


def test_exit_losses_by_hand():
    # two exits, one sample of 3 classes, label 2; kd 0.5, temperature 2
    z0, z1 = [1.0, 2.0, 0.5], [0.0, -1.0, 3.0]
    kd, t = 0.5, 2.0
    ce = -log_softmax(z0)[2] - log_softmax(z1)[2]

    def kl(teacher: list[float], student: list[float]) -> float:  # T^2 KL(softmax(teacher/T) || softmax(student/T))
        lq, lp = log_softmax([v / t for v in teacher]), log_softmax([v / t for v in student])
        return t * t * sum(math.exp(a) * (a - b) for a, b in zip(lq, lp))

    want = ce + kd * (kl(z1, z0) + kl(z0, z1))  # d - 1 = 1
    a, b = torch.tensor([z0], requires_grad=True), torch.tensor([z1], requires_grad=True)
    y = torch.tensor([2])
    got = exit_losses([a, b], y, kd, t)
    assert got.item() == pytest.approx(want, rel=1e-6)
    # the teacher is detached: exit 0's gradient is its CE's plus its own KL's as a student,
    # (softmax(z0) - onehot) + kd * T * (softmax(z0 / T) - softmax(z1 / T)), nothing from teaching exit 1
    got.backward()
    p0, onehot = torch.softmax(a.detach(), -1), torch.tensor([[0.0, 0.0, 1.0]])
    grad = (p0 - onehot) + kd * t * (torch.softmax(a.detach() / t, -1) - torch.softmax(b.detach() / t, -1))
    assert torch.allclose(a.grad, grad, atol=1e-6)
    # three exits: each pair's KL is weighted kd / (d - 1) = kd / 2
    c = torch.tensor([[0.3, 0.3, 0.3]])
    three = exit_losses([a.detach(), b.detach(), c], y, kd, t).item()
    zs = [z0, z1, [0.3, 0.3, 0.3]]
    want3 = sum(-log_softmax(z)[2] for z in zs) + kd / 2 * sum(kl(zs[j], zs[k]) for k in range(3)
                                                                 for j in range(3) if j != k)
    assert three == pytest.approx(want3, rel=1e-6)
    # kd = 0: the summed CE alone; one exit: its CE, the very value plain training computes
    assert exit_losses([a.detach(), b.detach()], y, 0.0, t).item() == pytest.approx(ce, rel=1e-6)
    assert torch.equal(exit_losses([a.detach()], y, kd, t), torch.nn.functional.cross_entropy(a.detach(), y))


def toy_state(value: float) -> dict[str, torch.Tensor]:
    return {"blocks.0.w": torch.full((2,), value), "blocks.1.w": torch.full((2,), value),
            "blocks.2.w": torch.full((2,), value), "blocks.0.n": torch.tensor(int(value))}


def test_each_tensor_is_the_mean_over_the_clients_that_hold_it():
    g = toy_state(7.0)
    deep, mid, shallow = toy_state(10.0), toy_state(40.0), toy_state(100.0)
    del mid["blocks.2.w"]  # depth 2
    for k in ("blocks.1.w", "blocks.2.w"):  # depth 1
        del shallow[k]
    third = 1 / 3
    new = aggregate(g, [(deep, third), (mid, third), (shallow, third)])
    assert new["blocks.0.w"].tolist() == pytest.approx([50.0, 50.0])  # all three: (10 + 40 + 100) / 3
    assert new["blocks.1.w"].tolist() == [25.0, 25.0]  # held by 2 of 3: their mean
    assert new["blocks.2.w"].tolist() == [10.0, 10.0]  # held by one: its value
    assert new["blocks.0.n"].item() == 10  # an integer buffer: the first holder's
    # weights 1/2, 1/4, 1/4: a tensor held by two is renormalized over them; none held keeps its value
    new = aggregate(g, [(mid, 0.5), (shallow, 0.25), (toy_state(1.0), 0.25)])
    assert new["blocks.1.w"].tolist() == [(0.5 * 40 + 0.25 * 1) / 0.75] * 2
    new = aggregate(g, [(shallow, 1.0)])
    assert new["blocks.2.w"].tolist() == [7.0, 7.0]


def test_where_every_client_holds_a_tensor_the_sum_is_fedavgs_term_for_term():
    torch.manual_seed(0)
    states = [{"w": torch.randn(50)} for _ in range(3)]
    weights = [0.2, 0.3, 0.5]
    fedavg = sum(w * s["w"].double() for w, s in zip(weights, states)).to(torch.float32)
    assert torch.equal(aggregate({"w": torch.zeros(50)}, list(zip(states, weights)))["w"], fedavg)


def test_a_sub_model_is_the_first_blocks_and_exits_of_the_global_one():
    from hfl_bench.depth_models import depthfl_cnn

    torch.manual_seed(3)
    full = depthfl_cnn(num_classes=10, in_chans=1, img_size=(8, 8))
    torch.manual_seed(3)
    two = depthfl_cnn(num_classes=10, in_chans=1, img_size=(8, 8), depth=2)
    assert set(two.state_dict()) == {k for k in full.state_dict() if k.split(".")[1] in ("0", "1")}
    for k, v in two.state_dict().items():  # built in turn: a shallower model draws the same first tensors
        assert torch.equal(v, full.state_dict()[k])
    full.eval()
    x = torch.randn(5, 1, 8, 8)
    outs = full.exit_logits(x)
    assert len(outs) == 4 and torch.allclose(full(x), torch.stack(outs).mean(0))  # the exits' ensemble
    with pytest.raises(ValueError):
        depthfl_cnn(depth=5)


def test_levels_are_the_width_familys_draw_read_as_depths():
    assert assign_depths("a1-b1-c1-d1", 8, 5, 4) == [{1.0: 4, 0.5: 3, 0.25: 2, 0.125: 1}[r]
                                                     for r in assign_rates(parse_profile("a1-b1-c1-d1"), 8, 5)]
    assert sorted(assign_depths("a1-d1", 4, 0, 4)) == [1, 1, 4, 4]
    assert assign_depths("a1", 3, 0, 1) == [1, 1, 1]
    with pytest.raises(ConfigError, match="depth levels are a-d"):
        check_levels("depthfl", "a1-e1")
    with pytest.raises(ConfigError, match="has 2 block"):
        check_levels("depthfl", "a1-c1", 2)
    check_levels("depthfl", "a1-b1", 2)


@pytest.fixture
def one_exit_pool():
    """A global model of one block and its one exit, registered for this test only."""
    from hfl_bench.pools import POOLS, ArchPool, PoolMember, register_pool

    register_pool(ArchPool("depthfl-cnn-1", (PoolMember("depthfl_cnn", {"hidden": (16,)}, "depthfl-cnn-1"),),
                           "test only: DepthFL's CNN of one block"))
    yield "depthfl-cnn-1"
    POOLS._forget("depthfl-cnn-1")


def test_one_exit_is_fedavg_bit_for_bit(one_exit_pool, tmp_path):
    # One block, one exit: the loss is that exit's CE (self-distillation has no pair, whatever kd),
    # the prediction its logits, and every client holds every tensor, so the server's sum is
    # fedavg's: the records agree bit for bit, every round, every client.
    fedavg = quick_run(tmp_path, "--method", "fedavg", "--pool", one_exit_pool)
    depth = quick_run(tmp_path, "--method", "depthfl", "--pool", one_exit_pool, "--set", "profile=a1",
                "--set", "weighting=samples")
    assert depth["method"]["hparams"]["kd"] == 1.0
    assert figures(depth) == figures(fedavg)
    assert depth["method"]["run_details"]["client_depths"] == [1] * 4


def test_default_runs_its_own_family_through_cli_api_and_matrix_in_the_submodel_section(tmp_path):
    from hfl_bench import run as api_run

    records = tmp_path / "records"
    cli = quick_run(records, "--method", "depthfl")
    api = api_run(method="depthfl", task="digits", clients=4, rounds=3, out=str(tmp_path / "api")).data
    assert figures(api) == figures(cli)  # one run, whichever door
    for rec in (cli, api):
        assert rec["arch_pool"]["name"] == "depthfl-cnn" and rec["method"]["submodels"] is True
        assert rec["method"]["hparams"] == {"profile": "a1-b1-c1-d1", "weighting": "uniform", "kd": 1.0,
                                            "temperature": 1.0, "capacity": "fixed"}
        assert sorted(rec["method"]["run_details"]["client_depths"]) == [1, 2, 3, 4]
        assert sorted(rec["method"]["run_details"]["client_params"]) == [3914, 14516, 43390, 118664]
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: depth\nmethods: [depthfl, heterofl]\ntasks: [digits]\nseeds: [0]\n"
                     "settings: {clients: 4, rounds: 2}\nmethod_overrides:\n  depthfl: {method_params: {kd: 0}}\n")
    result, stdout, _ = invoke_cli("matrix", str(suite), "--out", str(tmp_path / "suite"), "-q")
    assert result.exit_code == 0, stdout
    cells = {json.loads(p.read_text())["method"]["name"]: json.loads(p.read_text())
             for p in (tmp_path / "suite").rglob("*.json") if "__seed" in p.name}
    assert cells["depthfl"]["method"]["hparams"]["kd"] == 0 and cells["depthfl"]["status"] == "ok"
    # the same profile and seed give each client the same capacity level in both families
    levels = {1.0: 4, 0.5: 3, 0.25: 2, 0.125: 1}
    assert cells["depthfl"]["method"]["run_details"]["client_depths"] == \
        [levels[r] for r in cells["heterofl"]["method"]["run_details"]["client_rates"]]
    quick_run(records, "--method", "fedavg", "--pool", "cpu-cnn")
    result, stdout, _ = invoke_cli("leaderboard", "show", str(records), "--format", "json")
    assert result.exit_code == 0, result.output
    sections = {g["method"]: g["section"] for g in json.loads(stdout)["groups"]}
    assert sections["depthfl"] == f"data-free, {SUBMODELS_LABEL}, protocol budget"
    assert sections["fedavg"] == "data-free, single architecture, protocol budget"


@pytest.mark.parametrize("args,says", [
    (("--pool", "cpu"), "slices the depth of one global model with exits; pool 'cpu'"),
    (("--pool", "heterofl-cnn"), "pool 'heterofl-cnn' is not one depth-scalable model"),
    (("--set", "profile=a1-e1"), "names level e; depth levels are a-d"),
    (("--set", "profile=a1-z1"), "capacity profile 'a1-z1'"),
    (("--set", "weighting=mean"), "weighting must be uniform or samples"),
    (("--set", "kd=-1"), "kd must be >= 0"),
    (("--set", "temperature=0"), "temperature must be > 0"),
])
def test_a_setting_it_cannot_run_is_one_line_and_exit_2(args, says, tmp_path):
    assert_refused(tmp_path, "depthfl", *args, says=says)


def test_text_tasks_are_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        check_method_for_task(get_method_class("depthfl"), "rotten-tomatoes")
    assert "whose inputs are token ids" in str(e.value) and "\n" not in str(e.value)


def test_describe_states_the_family_and_its_pool():
    result, _, _ = invoke_cli("describe", "depthfl")
    assert result.exit_code == 0 and "sub-models of one global model: True" in result.output
    assert "default pool: depthfl-cnn" in result.output


def test_a_resumed_run_is_the_run_that_never_stopped(tmp_path):
    # the clients' sub-models, the global tensors and the levels come back from a checkpoint
    from hfl_bench.resolved import resolve_run

    cfg = resolve_run({"method": "depthfl", "task": "digits", "clients": 4, "rounds": 3,
                       "out": str(tmp_path)}).cfg
    straight, resumed = straight_and_resumed(cfg, tmp_path / "ckpt.pt", rounds=3, stop=1)
    keys = ("global_acc", "local_acc", "train_loss")
    assert [{k: h.get(k) for k in keys} for h in resumed.history] == \
        [{k: h.get(k) for k in keys} for h in straight.history]
    assert resumed.method.depths == straight.method.depths
