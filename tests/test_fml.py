"""FML (Federated Mutual Learning): CLI record with the meme endpoint, the server's sample-weighted
average and broadcast, metering, the mutual losses, and the meme architecture choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hfl_bench import engine
from hfl_bench.config import ConfigError, resolve
from hfl_bench.data import get_task
from hfl_bench.metering import SERVER
from hfl_bench.methods.fml import FML, FMLParams, mutual_losses
from hfl_bench.training import make_plan, state_bytes, train_on_plan

from helpers import cpu_federation, ready_method


def build(cfg):
    return cpu_federation(cfg)


def method(fed, **params) -> FML:
    return ready_method(FML, fed, **params)


def test_cli_two_rounds_writes_a_valid_record_with_the_meme_endpoint(run_record):
    record = run_record("--method", "fml", "--task", "digits", "--clients", "4", "--rounds", "2")
    assert record["status"] == "ok" and record["method"]["name"] == "fml"
    assert record["method"]["fidelity"] == "paper"
    assert record["federation"]["topology"] == "server"
    assert 0 <= record["metrics"]["global_acc"] <= 100
    meme = record["metrics"]["extra_endpoints"]["meme"]
    assert 0 <= meme["global_acc"] <= 100 and 0 <= meme["local_acc"] <= 100
    # the cpu pool's smallest member (resnet_tiny, ~20k parameters) is the default meme
    assert record["method"]["hparams"]["meme_arch"] == "auto"
    assert record["method"]["hparams"]["meme_arch_used"] == "resnet_tiny"
    assert all("meme_loss" in h for h in record["history"][1:])


def test_memes_are_the_sample_weighted_average_after_a_round(tiny_cfg, monkeypatch):
    fed = build(tiny_cfg(clients=5))
    m = method(fed)
    assert all(_equal(m.memes[0].state_dict(), x.state_dict()) for x in m.memes)  # one shared init
    uploads: dict[int, dict[str, torch.Tensor]] = {}
    send = fed.channel.send

    def spy(src, dsts, payload, kind):
        if dsts == SERVER:  # copy now: the state_dict shares storage with the live meme
            uploads[src] = {k: v.detach().clone() for k, v in payload.items()}
        return send(src, dsts, payload, kind)

    monkeypatch.setattr(fed.channel, "send", spy)
    active = [0, 2, 3]
    m.run_round(fed, 1, active)
    assert sorted(uploads) == active
    assert not _equal(uploads[0], uploads[2])  # trained on different data
    n = torch.tensor([len(fed.clients[i].train_idx) for i in active], dtype=torch.float64)
    w = n / n.sum()
    for key, ref in uploads[0].items():
        if not ref.is_floating_point():
            continue
        expected = sum(w[k] * uploads[i][key].double() for k, i in enumerate(active)).float()
        # the server's meme is the broadcast average (a float32 weighted average of <= 4 states,
        # |w| <= ~1: <= 4 x 6e-8 per entry < 1e-6), the meme every client is evaluated with
        assert torch.allclose(m.server.state_dict()[key], expected, atol=1e-6), key
    assert m.endpoints(fed)["meme"] == [m.server] * 5
    # a client drawn next starts its round from the broadcast: its meme holds it when it trains
    fit_memes = []
    monkeypatch.setattr(m, "mutual_train", lambda fed, i, plan: fit_memes.append(
        {k: v.clone() for k, v in m.memes[i].state_dict().items()}) or [0.0, 0.0])
    m.run_round(fed, 2, [1, 4])
    assert all(_equal(state, m.server.state_dict()) for state in fit_memes) and len(fit_memes) == 2


def _equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_each_active_client_uploads_exactly_one_meme_per_round(tiny_cfg):
    task = get_task("digits")
    result = engine.run(resolve(tiny_cfg(method="fml", clients=6, clients_per_round=3), task.info.defaults))
    assert result.status == "ok"
    meme_bytes = state_bytes(result.method.memes[0])
    sent = result.bytes_sent_per_client_round
    assert sent.shape == (2, 6)
    for row, entry in zip(sent, result.history[1:]):
        assert sorted(set(row.tolist())) == [0, meme_bytes] and (row > 0).sum() == 3
        assert entry["bytes"] == 3 * meme_bytes + 6 * meme_bytes  # uploads + broadcast to all six


def test_mutual_losses_by_hand():
    gen = torch.Generator().manual_seed(0)
    zp = torch.randn(5, 4, generator=gen, requires_grad=True)
    zm = torch.randn(5, 4, generator=gen, requires_grad=True)
    y = torch.tensor([0, 1, 2, 3, 1])
    lp, lm = mutual_losses(zp, zm, y, 0.3, 0.8)
    pp, pm = torch.softmax(zp, -1), torch.softmax(zm, -1)
    kl_m_p = (pm * (pm.log() - pp.log())).sum(-1).mean()  # KL(p_meme || p_private), batchmean
    kl_p_m = (pp * (pp.log() - pm.log())).sum(-1).mean()
    # the same float32 terms (~1) combined in another order: a few x 6e-8 < 1e-6
    assert lp.item() == pytest.approx((0.3 * F.cross_entropy(zp, y) + 0.7 * kl_m_p).item(), abs=1e-6)
    assert lm.item() == pytest.approx((0.8 * F.cross_entropy(zm, y) + 0.2 * kl_p_m).item(), abs=1e-6)
    # the other model's prediction is a constant in each loss
    assert torch.autograd.grad(lp, zm, allow_unused=True)[0] is None
    assert torch.autograd.grad(lm, zp, allow_unused=True)[0] is None


def test_alpha_one_trains_the_private_model_with_plain_ce(tiny_cfg):
    """With alpha = 1 the private model ignores the meme: exactly local CE training on the same plan."""
    fml_fed, local_fed = build(tiny_cfg()), build(tiny_cfg())
    method(fml_fed, alpha=1.0).run_round(fml_fed, 1, [0, 1, 2, 3])
    for c in local_fed.clients:
        train_on_plan(local_fed, c, make_plan(local_fed, c.cid, 1))
    for a, b in zip(fml_fed.clients, local_fed.clients):
        assert _equal(a.model.state_dict(), b.model.state_dict())
    # ... and with the default alpha the meme changes the private model
    default_fed = build(tiny_cfg())
    method(default_fed).run_round(default_fed, 1, [0, 1, 2, 3])
    assert not _equal(default_fed.clients[0].model.state_dict(), local_fed.clients[0].model.state_dict())


def test_meme_architecture_choice(tiny_cfg):
    fed = build(tiny_cfg())
    assert type(method(fed).memes[0]).__name__ == "TinyResNet"  # smallest of the cpu pool by parameters
    chosen = method(fed, meme_arch="cnn_small")
    assert type(chosen.memes[0]).__name__ == "PlainCNN" and chosen.hparams()["meme_arch_used"] == "cnn_small"
    with pytest.raises(ConfigError, match="meme_arch"):
        FML(FMLParams(meme_arch="no_such_model")).check(fed)
    with pytest.raises(ConfigError, match="alpha"):
        FML(FMLParams(alpha=1.5)).check(fed)


def test_meme_init_is_seeded_and_leaves_the_global_rng_alone(tiny_cfg):
    fed = build(tiny_cfg())
    torch.manual_seed(123)
    a = method(fed)
    after = torch.rand(1)
    torch.manual_seed(123)
    b = method(fed)
    assert torch.equal(after, torch.rand(1))
    assert _equal(a.memes[0].state_dict(), b.memes[0].state_dict())
    other = method(build(tiny_cfg(seed=1)))
    assert not _equal(a.memes[0].state_dict(), other.memes[0].state_dict())
