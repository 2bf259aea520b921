"""FedMKD (decentralized adaptation): CLI record, the memory term's timing, the exact loss form,
fast == reference, and metering (peer snapshots cross the network, the memory does not)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import hfl_bench.methods.fedmkd as fedmkd_module  # registers the method
from hfl_bench.aggregation import get_aggregator
from hfl_bench.families import peer_kd as peerkd
from hfl_bench.families.peer_kd import memory_target_fn
from hfl_bench.methods.fedmkd import FedMKD, FedMKDParams
from hfl_bench.training import make_plan, predict_logits, state_bytes, train_on_plan

from helpers import ATOL64, cpu_federation, in_float64, ready_method


def build(cfg, augmentation: str | None = None, warm: bool = False):
    fed = cpu_federation(cfg)
    if augmentation:
        fed.info = dataclasses.replace(fed.info, augmentation=augmentation)
    if warm:  # distinct, non-trivial models
        for c in fed.clients:
            train_on_plan(fed, c, make_plan(fed, c.cid, 0))
    return fed


def method(fed, **params) -> FedMKD:
    return ready_method(FedMKD, fed, **params)


def states(fed):
    return [{k: v.clone() for k, v in c.model.state_dict().items()} for c in fed.clients]


def same(a, b) -> bool:
    return all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def test_cli_two_rounds_writes_a_valid_record(run_record):
    record = run_record("--method", "fedmkd", "--task", "digits", "--clients", "4", "--rounds", "2")
    assert record["status"] == "ok" and record["method"]["name"] == "fedmkd"
    assert record["method"]["fidelity"] == "reconstructed"
    assert record["method"]["hparams"] == {"lam": 0.5, "mu": 0.5, "temperature": 2.0}
    assert any("first local round" in n for n in record["method"]["notes"])
    assert record["federation"]["topology"] == "p2p"
    assert 0 <= record["metrics"]["global_acc"] <= 100
    assert [h["round"] for h in record["history"]] == [0, 1, 2]


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_memory_term_absent_in_round_1_and_present_in_round_2(tiny_cfg, path):
    with_mu, without_mu = build(tiny_cfg(exec=path)), build(tiny_cfg(exec=path))
    m_with, m_without = method(with_mu, mu=0.5), method(without_mu, mu=0.0)
    active = list(range(with_mu.n_clients))
    before = states(with_mu)
    m_with.run_round(with_mu, 1, active)
    m_without.run_round(without_mu, 1, active)
    assert not same(before, states(with_mu))  # round 1 trained (CE + peer KD)
    assert same(states(with_mu), states(without_mu))  # ... with no memory term: mu had no effect
    m_with.run_round(with_mu, 2, active)
    m_without.run_round(without_mu, 2, active)
    for a, b in zip(states(with_mu), states(without_mu)):  # round 2: every client's memory acts
        assert not all(torch.equal(a[k], b[k]) for k in a)


def test_memory_starts_at_a_clients_first_active_round(tiny_cfg, monkeypatch):
    fed = build(tiny_cfg(clients=4))
    m = method(fed)
    calls: list[list[int]] = []
    original = fedmkd_module.peer_targets

    def spy(*args, memory, **kwargs):
        calls.append(sorted(memory))
        return original(*args, memory=memory, **kwargs)

    monkeypatch.setattr(fedmkd_module, "peer_targets", spy)
    m.run_round(fed, 1, [0, 1])
    m.run_round(fed, 2, [1, 2])
    m.run_round(fed, 3, [0, 1, 2, 3])
    assert calls == [[], [1], [0, 1, 2]]


def test_loss_is_ce_plus_lambda_kd_plus_mu_kd(tiny_cfg, monkeypatch):
    """One whole-shard batch: the reported loss is the unnormalized CE + lambda KD + mu KD."""
    fed = build(tiny_cfg(exec="reference", batch_size=100000), warm=True)
    m = method(fed, lam=0.3, mu=0.7, temperature=3.0)
    m.trained = {0, 1, 2, 3}  # every client has a memory
    plan = make_plan(fed, 0, 5)
    assert len(plan.bounds) == 1
    x, y = plan.view(fed), plan.labels(fed)
    models = [c.model for c in fed.clients]

    def kd(q, z, t):  # T^2 KL(q || softmax(z / t)), by hand
        return (q * (q.log() - F.log_softmax(z / t, dim=-1))).sum(-1).mean() * t * t

    with torch.no_grad():
        peer_mean = torch.stack([torch.softmax(predict_logits(models[j], x) / 3.0, -1) for j in (1, 2)]).mean(0)
        memory = torch.softmax(predict_logits(models[0], x) / 3.0, -1)
        z = copy.deepcopy(models[0]).train()(x)  # train-mode student logits, as train_client sees them
        expected = F.cross_entropy(z, y) + 0.3 * kd(peer_mean, z, 3.0) + 0.7 * kd(memory, z, 3.0)
    losses = []
    original = fedmkd_module.train_client

    def recording(*args, **kwargs):
        losses.append(original(*args, **kwargs))
        return losses[-1]

    monkeypatch.setattr(fedmkd_module, "train_client", recording)
    m.run_round(fed, 5, [0, 1, 2])
    # the same float32 loss (~2, three terms over one batch of <= 64 rows) summed in another order:
    # <= 64 x 6e-8 x 2 ~ 8e-6 worst, ~1e-7 typical
    assert losses[0] == pytest.approx(float(expected), abs=1e-5)


def test_fast_and_reference_targets_agree(tiny_cfg):
    fed = build(tiny_cfg(), augmentation="crop-flip", warm=True)
    active = [0, 1, 2, 3]
    agg = get_aggregator("uniform")
    plans = {i: make_plan(fed, i, 1) for i in active}
    with_memory = {0, 2, 3}
    targets = peerkd.peer_targets(fed, plans, active, agg, temperature=2.0, counts=fed.val_counts,
                                  accs=fed.val_accs(), memory=with_memory)
    peer, memory = targets.peer, targets.memory
    assert set(memory) == with_memory and set(peer) == set(active)
    snaps = peerkd.frozen_snapshots(fed, active)
    for i in active:
        ref_peer = peerkd.reference_target_fn(snaps, peerkd.peers_of(i, active), agg, 2.0, fed.val_counts,
                                              fed.val_accs())
        per_batch = torch.cat([ref_peer(s, e, plans[i].view(fed, s, e)) for s, e in plans[i].bounds])
        # one eval-mode pass each way: the bound of test_engine.TARGETS_ATOL (measured 0 here)
        assert torch.allclose(per_batch, peer[i], atol=1e-5), f"peer targets, client {i}"
        if i in with_memory:
            ref_mem = memory_target_fn(snaps[i], 2.0)
            per_batch = torch.cat([ref_mem(s, e, plans[i].view(fed, s, e)) for s, e in plans[i].bounds])
            assert torch.allclose(per_batch, memory[i], atol=1e-5), f"memory targets, client {i}"
            # the memory is the student's own model, not a peer's
            assert not torch.allclose(memory[i], peer[i], atol=1e-3)


def test_fast_and_reference_rounds_agree(tiny_cfg):
    # Two rounds of training after targets computed two ways: float64, as in_float64 says why.
    feds = {p: in_float64(build(tiny_cfg(exec=p), augmentation="crop-flip")) for p in ("fast", "reference")}
    methods = {p: method(f) for p, f in feds.items()}
    active = list(range(4))
    for rnd in (1, 2):  # round 2 carries the memory term
        out = {p: methods[p].run_round(feds[p], rnd, active) for p in feds}
        # float32 totals of <= 6 float64 batch losses <= 5 (digits, batch 64): <= 6 x 6e-8 x 5 ~ 2e-6
        assert out["fast"]["train_loss"] == pytest.approx(out["reference"]["train_loss"], abs=1e-5)
    for a, b in zip(states(feds["fast"]), states(feds["reference"])):
        for k in a:
            assert torch.allclose(a[k].double(), b[k].double(), atol=ATOL64, rtol=0), k


def test_metering_peer_snapshots_only(tiny_cfg):
    fed = build(tiny_cfg(clients=5))
    m = method(fed)
    m.trained = set(range(5))  # memories exist, yet they must not be metered
    fed.channel.start_round()
    active = [0, 2, 3]
    sizes = {i: state_bytes(fed.clients[i].model) for i in active}
    m.run_round(fed, 2, active)
    for i in range(5):
        assert fed.channel.sent[i] == (2 * sizes[i] if i in active else 0)
        assert fed.channel.received[i] == (sum(sizes.values()) - sizes[i] if i in active else 0)
    assert fed.channel.server_sent == 0


@pytest.mark.parametrize("bad", [{"lam": -0.1}, {"mu": -1.0}, {"temperature": 0.0}])
def test_bad_params_are_rejected(tiny_cfg, bad):
    from hfl_bench.config import ConfigError

    fed = build(tiny_cfg())
    with pytest.raises(ConfigError):
        FedMKD(FedMKDParams(**bad)).check(fed)
