"""FedGD: the generator's shapes (images and 1-D signals), the BN-statistics matching term (it
decreases, it is deterministic, BN-free models add nothing), the adversarial term, metering, and
2-round CLI records on digits and mnist1d."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.data import get_task
from hfl_bench.metering import SERVER
from hfl_bench.methods.fedgd import (
    BNStats,
    FedGD,
    FedGDParams,
    Generator,
    adversarial_loss,
    bn_matching,
    synthesize,
    train_generator,
)
from hfl_bench.pools import PoolMember, build_model
from hfl_bench.training import state_bytes

from helpers import cpu_federation, ready_method, record_sends

PUBLIC = 100
SYNTH = 500


def build(cfg):
    return cpu_federation(cfg)


def method(fed, **params) -> FedGD:
    return ready_method(FedGD, fed, **params)


def tiny_bn_model(seed: int = 0) -> nn.Module:
    """A 2-layer conv net with BatchNorm whose running statistics are those of shifted, scaled
    noise (reachable by the generator, but far from what it produces at initialization)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=None), nn.ReLU(),
                              nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=None), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    with torch.no_grad():  # momentum None: the running statistics are exactly this batch's
        model.train()(1.5 + 0.5 * torch.randn(256, 1, 8, 8, generator=gen))
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("shape, start", [((1, 8, 8), (2, 2)), ((1, 1, 40), (1, 10)), ((3, 32, 32), (8, 8)),
                                          ((3, 28, 28), (7, 7)), ((1, 6, 12), (6, 3))])
def test_generator_output_has_the_task_input_shape(shape, start):
    g = Generator(256, 10, shape, output_range=3.0)
    assert g.start == start
    x = g(torch.randn(5, 256), torch.arange(5))
    assert x.shape == (5, *shape)
    assert x.abs().max() <= 3.0


def test_bn_matching_loss_decreases_and_is_deterministic(tiny_cfg):
    fed = build(tiny_cfg())

    def bn_curve() -> tuple[list[float], torch.Tensor]:
        m = method(fed, lambda_oh=0.0, lambda_adv=0.0, g_steps=8, g_batch_size=32)
        curve = [train_generator(fed, m.generator, m.g_opt, [tiny_bn_model()], m.params, rnd)["g_bn"]
                 for rnd in range(1, 5)]
        return curve, synthesize(fed, m.generator, m.params, 5)

    curve, x = bn_curve()
    assert max(curve[1:]) < curve[0] and curve[-1] < 0.5 * curve[0], curve
    curve2, x2 = bn_curve()
    assert curve == curve2 and torch.equal(x, x2)


def test_a_model_without_batchnorm_adds_no_bn_term():
    mlp = build_model(PoolMember("mlp_small"), get_task("digits").info).eval()
    x = torch.randn(16, 1, 8, 8)
    with bn_matching([mlp]) as bn:
        mlp(x)
        assert bn.with_bn == [False] and bn.loss().item() == 0.0
    cnn = tiny_bn_model()
    with bn_matching([mlp, cnn]) as both:  # the mean runs over the models that have BN
        mlp(x), cnn(x)
        mixed = both.loss()
    with bn_matching([cnn]) as alone:
        cnn(x)
        assert torch.allclose(mixed, alone.loss()) and mixed > 0
    assert not any(m._forward_hooks for m in cnn.modules())  # hooks are removed on exit


def test_bn_term_is_the_l2_gap_of_batch_statistics():
    bn = nn.BatchNorm2d(3).eval()
    bn.running_mean.copy_(torch.tensor([1.0, 0.0, -1.0]))
    x = torch.randn(64, 3, 4, 4)
    stats = BNStats([bn])
    bn(x)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    expected = torch.norm(mean - bn.running_mean) + torch.norm(var - bn.running_var)
    assert torch.allclose(stats.loss(), expected)
    stats.remove()


def test_adversarial_term_rewards_disagreement_where_argmax_agrees():
    ens = torch.tensor([[2.0, 0.0], [2.0, 0.0]])
    same = ens.expand(3, 2, 2)
    assert adversarial_loss(ens, same).item() == pytest.approx(0.0, abs=1e-7)
    softer = torch.tensor([[[1.0, 0.0], [2.0, 0.0]]])  # agrees on argmax, less confident on sample 0
    assert adversarial_loss(ens, softer) < 0
    flipped = torch.tensor([[[0.0, 2.0], [0.0, 2.0]]])  # disagrees on argmax: masked out
    assert adversarial_loss(ens, flipped).item() == 0.0


def test_round_meters_snapshots_up_and_synthetic_set_down(tiny_cfg, monkeypatch):
    fed = build(tiny_cfg(clients=5))
    m = method(fed, g_steps=1)
    sends = record_sends(fed, monkeypatch)
    active = [0, 2, 3]
    fed.channel.start_round()
    out = m.run_round(fed, 1, active)
    synth = SYNTH * 1 * 8 * 8 * 4 + SYNTH * fed.num_classes * 4  # inputs and consensus, float32
    assert fed.channel.sent.tolist() == [state_bytes(fed.clients[i].model) if i in active else 0 for i in range(5)]
    assert fed.channel.server_sent == len(active) * synth
    assert sends == [(0, SERVER), (2, SERVER), (3, SERVER), (SERVER, active), (SERVER, active)]
    assert {"train_loss", "digest_loss", "g_loss", "g_bn", "g_oh", "g_adv"} <= set(out)


def test_synthetic_set_has_balanced_labels_and_the_input_shape(tiny_cfg):
    fed = build(tiny_cfg())
    m = method(fed, synthetic_size=50, g_batch_size=16)
    x = synthesize(fed, m.generator, m.params, 1)
    assert x.shape == (50, 1, 8, 8)


def test_bad_settings_are_rejected(tiny_cfg):
    fed = build(tiny_cfg())
    with pytest.raises(ConfigError, match="synthetic_size"):
        FedGD(FedGDParams(synthetic_size=0)).check(fed)
    with pytest.raises(ConfigError, match="digest_loss"):
        FedGD(FedGDParams(digest_loss="l2")).check(fed)


def test_cli_two_rounds_on_digits_writes_a_valid_record(run_record, tiny_cfg):
    record = run_record("--method", "fedgd", "--task", "digits", "--clients", "4", "--rounds", "2",
                        "--public-size", str(PUBLIC))
    assert record["status"] == "ok" and record["method"]["name"] == "fedgd"
    assert record["method"]["fidelity"] == "reconstructed"
    assert record["federation"]["topology"] == "server"
    assert record["partition"]["public_size"] == PUBLIC  # held out, never read
    hp = record["method"]["hparams"]
    assert hp["digest_loss"] == "l1" and hp["synthetic_size"] == SYNTH and hp["lambda_bn"] == 10.0
    fed = build(tiny_cfg(public_size=PUBLIC))
    up = sum(state_bytes(c.model) for c in fed.clients)
    down = 4 * (SYNTH * 8 * 8 * 4 + SYNTH * 10 * 4)
    assert [h["bytes"] for h in record["history"][1:]] == [up + down] * 2
    assert all(h["g_loss"] is not None and h["digest_loss"] > 0 for h in record["history"][1:])


def test_cli_two_rounds_on_mnist1d(run_record, tmp_path):
    pytest.importorskip("mnist1d")
    record = run_record("--method", "fedgd", "--task", "mnist1d", "--clients", "3", "--rounds", "2",
                        "--data-dir", str(tmp_path / "data"), "--set", "synthetic_size=60")
    assert record["status"] == "ok" and record["task"]["input_shape"] == [1, 1, 40]
    assert record["history"][-1]["bytes"] > 3 * 60 * 40 * 4
