"""Lockstep training of same-architecture students (``--lockstep on``) against the plain loop."""

from __future__ import annotations

import copy
from dataclasses import asdict

import pytest
import torch

from hfl_bench import lockstep
from hfl_bench.config import ConfigError, RunConfig, config_hash, resolve
from hfl_bench.training import make_plan

from helpers import ATOL64, cpu_federation, in_float64

# Six clients of the CPU pool: two of each architecture (MLP, plain CNN with max-pool, ResNet
# with BatchNorm), Dirichlet shards of different sizes, so batch counts and last batches differ.
SKEWED = dict(task="digits", clients=6, alpha=0.3, seed=0)


def _states(fed, ids):
    out = {}
    for i in ids:
        c = fed.clients[i]
        momenta = [c.optimizer.state[p].get("momentum_buffer") for p in c.model.parameters()]
        out[i] = (c.model.state_dict(), momenta)
    return out


def _assert_close(a, b, atol):
    for i in a:
        (sa, ma), (sb, mb) = a[i], b[i]
        for k in sa:
            # .double(), not .float(): integer buffers compare as numbers, and float64 states are not
            # rounded to float32 first (two values 1e-15 apart can round one float32 ulp apart).
            assert torch.allclose(sa[k].double(), sb[k].double(), atol=atol, rtol=0), f"client {i} {k}"
        for x, y in zip(ma, mb):
            assert (x is None) == (y is None) and (x is None or torch.allclose(x, y, atol=atol, rtol=0)), f"client {i}"


def _train_both(fed, ids, plans, **kwargs):
    """The loop on ``fed``, lockstep on a copy; returns (losses, states) of each."""
    twin = copy.deepcopy(fed)
    fed.cfg.lockstep, twin.cfg.lockstep = "off", "on"
    looped = lockstep.train_students(fed, ids, plans, **kwargs)
    stepped = lockstep.train_students(twin, ids, plans, **kwargs)
    return (looped, _states(fed, ids)), (stepped, _states(twin, ids))


def test_groups_are_same_architecture_sgd_students():
    fed = cpu_federation(RunConfig(**SKEWED))
    ids = list(range(6))
    assert lockstep.lockstep_groups(fed, ids) == [[0, 3], [1, 4], [2, 5]]
    # Students with and without distillation targets never share a group.
    assert lockstep.lockstep_groups(fed, ids, with_targets={0, 1, 4}) == [[1, 4], [2, 5]]
    fed.clients[3].optimizer = torch.optim.Adam(fed.clients[3].model.parameters())  # e.g. fedcc
    fed.clients[4].model.fc = torch.nn.Sequential(torch.nn.Dropout(0.5), fed.clients[4].model.fc)
    assert lockstep.lockstep_groups(fed, ids) == [[2, 5]]
    assert lockstep.lockstep_groups(fed, [0, 1, 2]) == []  # one student per architecture


def test_lockstep_steps_equal_the_loop_with_strong_decay_and_clipping():
    """A large learning rate, weight decay and a small clip norm make every part of the update
    visible: a missing or misplaced term would move parameters far beyond the tolerance."""
    fed = in_float64(cpu_federation(RunConfig(**SKEWED, lr=0.05, weight_decay=0.05, grad_clip=0.5, local_epochs=1)))
    ids = list(range(6))
    plans = {i: make_plan(fed, i, 1) for i in ids}
    assert len({(len(p.bounds), p.bounds[-1][1] - p.bounds[-1][0]) for p in plans.values()}) > 1
    targets = {i: torch.softmax(torch.randn(len(plans[i]), 10, generator=torch.Generator().manual_seed(i),
                                            dtype=torch.float64), -1)
               for i in ids}
    (looped, a), (stepped, b) = _train_both(fed, ids, plans, targets=targets, lam=0.5, temperature=2.0)
    # Reported losses are float32 totals of n float64 batch losses <= 3 either path: rounding
    # <= n x eps32/2 x 3 ~ 55 x 6e-8 x 3 ~ 1e-5 / 2 for n <= 55 batches (digits, batch 16, 5 epochs).
    assert looped == pytest.approx(stepped, abs=1e-5)
    _assert_close(a, b, atol=ATOL64)
    # Training moved the parameters by far more than the tolerance.
    start = cpu_federation(RunConfig(**SKEWED)).clients[2].model.state_dict()
    assert max(float((a[2][0][k] - start[k]).abs().max()) for k in start) > 1e-2


def test_lockstep_continues_from_existing_momentum_without_targets():
    fed = in_float64(cpu_federation(RunConfig(**SKEWED, local_epochs=1)))
    ids = list(range(6))
    fed.cfg.lockstep = "off"
    lockstep.train_students(fed, ids, {i: make_plan(fed, i, 1) for i in ids})  # momentum buffers now exist
    plans = {i: make_plan(fed, i, 2) for i in ids}
    (looped, a), (stepped, b) = _train_both(fed, ids, plans)
    assert looped == pytest.approx(stepped, abs=1e-5)  # float32 loss totals: bound as above
    _assert_close(a, b, atol=ATOL64)


def test_a_peer_kd_round_in_lockstep_matches_the_loop():
    from hfl_bench.method_api import get_method_class

    from helpers import ready_method

    fed = in_float64(cpu_federation(RunConfig(**SKEWED, method="crad")))  # a round of many steps: see in_float64
    twin = copy.deepcopy(fed)
    fed.cfg.lockstep, twin.cfg.lockstep = "off", "on"
    cls = get_method_class("crad")
    looped = ready_method(cls, fed).run_round(fed, 1, list(range(6)))
    stepped = ready_method(cls, twin).run_round(twin, 1, list(range(6)))
    assert looped["train_loss"] == pytest.approx(stepped["train_loss"], abs=1e-5)  # float32 totals: as above
    _assert_close(_states(fed, range(6)), _states(twin, range(6)), atol=ATOL64)


def test_lockstep_flag_is_recorded_and_leaves_the_config_hash(run_record):
    quick = ("--batch-size", "64", "--lr", "0.01", "--local-epochs", "1")  # the regime the tolerance is for
    on = run_record("--method", "fedavg", "--task", "digits", "--pool", "cpu-cnn", "--clients", "4", "--rounds", "1",
                    *quick, "--lockstep", "on")
    off = run_record("--method", "fedavg", "--task", "digits", "--pool", "cpu-cnn", "--clients", "4", "--rounds", "1",
                     *quick)
    assert on["federation"]["lockstep"] is True and off["federation"]["lockstep"] is False
    assert on["config_hash"] == off["config_hash"]
    # float32 through the CLI: the paths' parameters differ by rounding, ~1e-6 after this one short
    # round (a float32 peer-KD round measured <= 6e-7 on SSE4.1, AVX2 and AVX-512 kernels), so only a
    # test sample whose top-two logits are within ~1e-5 can flip; 0.5 points of the 4 clients' mean
    # over 359 test samples is 7 flips, against an expected ~4 x 359 x 1e-5 ~ 0.01.
    assert on["metrics"]["global_acc"] == pytest.approx(off["metrics"]["global_acc"], abs=0.5)


def test_a_bad_lockstep_value_is_refused():
    with pytest.raises(ConfigError, match="--lockstep must be auto, on or off"):
        resolve(RunConfig(task="digits", lockstep="sometimes"), {})
    assert config_hash(asdict(resolve(RunConfig(task="digits", lockstep="on"), {}))) == \
        config_hash(asdict(resolve(RunConfig(task="digits"), {})))
