"""Replayed student steps (``hfl_bench.graphs``, ``--cuda-graphs``): the plan of eager, warm-up,
capture and replay steps, who replays, and the replayed path against the eager loop on a CPU
(through ``EagerRecorder``, which replays the recorded step where CUDA graphs do not exist: the
static buffers, keys and plan are the CUDA path's own). CUDA itself is measured by
``benchmarks/gpu_check.sh`` on a lent GPU."""

from __future__ import annotations

import copy
from dataclasses import asdict

import pytest
import torch

from hfl_bench import graphs
from hfl_bench.config import ConfigError, RunConfig, config_hash, resolve, validate
from hfl_bench.graphs import EagerRecorder, StepGraphs, StepPlanner, why_eager
from hfl_bench.training import make_plan, train_on_plan

from helpers import cpu_federation

# Six clients of the CPU pool (MLP, plain CNN, ResNet with BatchNorm), Dirichlet shards of different
# sizes: full batches and a partial last batch per epoch, two local epochs.
SKEWED = dict(task="digits", clients=6, alpha=0.3, seed=0, local_epochs=2)


def test_the_plan_warms_up_captures_once_and_replays_full_batches():
    planner = StepPlanner(warmup=2)
    kinds = [planner.next("k", full) for full in (True, True, False, True, True, True, False)]
    assert kinds == ["warmup", "warmup", "eager", "capture", "replay", "replay", "eager"]


def test_a_changed_key_warms_up_and_captures_again():
    planner = StepPlanner(warmup=1)
    assert [planner.next("a", True) for _ in range(3)] == ["warmup", "capture", "replay"]
    assert [planner.next("b", True) for _ in range(3)] == ["warmup", "capture", "replay"]
    assert planner.next("b", False) == "eager"  # a partial batch never resets the plan
    assert planner.next("b", True) == "replay"


def test_who_replays():
    fed = cpu_federation(RunConfig(**SKEWED))
    c = fed.clients
    assert why_eager(c[0], None, frozenset()) is None
    assert why_eager(c[0], torch.zeros(3, 10), frozenset()) is None
    assert why_eager(c[0], lambda s, e, x: x, frozenset()) == "per-batch targets"
    assert why_eager(c[0], None, frozenset({0})) == "free-rider"
    c[1].optimizer = torch.optim.Adam(c[1].model.parameters())
    assert why_eager(c[1], None, frozenset()) == "not the protocol's SGD"
    c[2].model.fc = torch.nn.Sequential(torch.nn.Dropout(0.5), c[2].model.fc)
    assert why_eager(c[2], None, frozenset()) == "stochastic layers"
    next(c[3].model.parameters()).requires_grad_(False)
    assert why_eager(c[3], None, frozenset()) == "frozen parameters"


def _state(client):
    momenta = [client.optimizer.state[p].get("momentum_buffer") for p in client.model.parameters()]
    return client.model.state_dict(), momenta


def _assert_equal(a, b, who):
    (sa, ma), (sb, mb) = a, b
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{who} {k}"
    for x, y in zip(ma, mb):
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), who


@pytest.mark.parametrize("with_targets", [False, True])
def test_replayed_steps_equal_the_eager_loop_over_rounds(with_targets):
    """Three rounds of every client, eager on one federation and replayed on its copy: the same
    losses, parameters, BatchNorm buffers and momentum, bit for bit, and the same work counted."""
    fed = cpu_federation(RunConfig(**SKEWED))
    twin = copy.deepcopy(fed)
    steps = StepGraphs(EagerRecorder(), warmup=2)
    ids = list(range(6))
    for rnd in range(1, 4):
        plans = {i: make_plan(fed, i, rnd) for i in ids}
        targets = {i: torch.softmax(torch.randn(len(plans[i]), 10, generator=torch.Generator().manual_seed(i)), -1)
                   for i in ids} if with_targets else {}
        for i in ids:
            eager = train_on_plan(fed, fed.clients[i], plans[i], targets=targets.get(i), lam=0.5, temperature=2.0)
            replayed = steps.train(twin, twin.clients[i], plans[i], targets.get(i), 0.5, 2.0)
            assert eager == replayed, f"round {rnd} client {i}"
            _assert_equal(_state(fed.clients[i]), _state(twin.clients[i]), f"round {rnd} client {i}")
    assert steps.counts["capture"] == 6 and steps.counts["replay"] > 0 and steps.counts["eager"] > 0
    assert (fed.budget.steps == twin.budget.steps).all() and fed.budget.steps.sum() > 0
    assert (fed.budget.samples == twin.budget.samples).all()


def test_a_new_optimizer_is_captured_again():
    fed = cpu_federation(RunConfig(**SKEWED))
    steps = StepGraphs(EagerRecorder(), warmup=1)
    client = fed.clients[0]
    steps.train(fed, client, make_plan(fed, 0, 1), None, 0.0, 1.0)
    client.optimizer = fed.make_optimizer(client.model)  # e.g. a method that resets its optimizer
    steps.train(fed, client, make_plan(fed, 0, 2), None, 0.0, 1.0)
    assert steps.counts["capture"] == 2


def test_train_students_uses_the_loop_on_a_cpu(monkeypatch):
    fed = cpu_federation(RunConfig(**SKEWED))
    assert graphs.step_graphs(fed) is None  # CPU: never replayed
    called = []
    monkeypatch.setattr(graphs, "train_on_plan", lambda *a, **k: called.append(a[1].cid) or 0.0)
    graphs.train_students(fed, [0, 2], {i: make_plan(fed, i, 1) for i in (0, 2)})
    assert called == [0, 2]


def test_the_option_is_checked_and_not_hashed():
    def hashed(**kw):
        return config_hash(asdict(resolve(RunConfig(method="crad", task="digits", **kw), {})))

    assert hashed(cuda_graphs="off") == hashed(cuda_graphs="on") == hashed()

    with pytest.raises(ConfigError, match="--cuda-graphs must be auto, on or off"):
        validate(RunConfig(method="crad", task="digits", cuda_graphs="sometimes"))
