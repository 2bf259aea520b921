"""Engine and peer-KD backbone: snapshot semantics, fast == reference, determinism, metering."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from hfl_bench import engine
from hfl_bench.aggregation import AGGREGATORS, get_aggregator
from hfl_bench.config import resolve
from hfl_bench.data import get_task
from hfl_bench.families import peer_kd as peerkd
from hfl_bench.testing import builtin_names
from hfl_bench.training import make_plan, predict_logits, soft_targets

from helpers import cpu_federation, in_float64

# Single-pass comparisons (fast against reference targets): one eval-mode forward pass of the same
# float32 teachers each way, so they differ at most by the rounding of reordered reductions in one
# pass (fan-in <= 576, |logit| <= ~20: ~sqrt(576) x 6e-8 x 20 ~ 3e-5 worst, far less in practice);
# softmax at temperature 2 scales a logit error by <= 1/4 (its Jacobian's row sums are <= 1/2, over
# T) and the rules average teachers with weights that do not depend on the path, so targets agree
# within TARGETS_ATOL. Measured on SSE4.1, AVX2 and AVX-512/AMX kernels (ATEN_CPU_CAPABILITY,
# ONEDNN_MAX_CPU_ISA): 0.
TARGETS_ATOL = 1e-5

RULES = builtin_names(AGGREGATORS)  # every rule hfl-bench registers (tests/test_aggregation.py names them)


def build(cfg, augmentation: str | None = None):
    fed = cpu_federation(cfg)
    if augmentation:
        fed.info = dataclasses.replace(fed.info, augmentation=augmentation)
    # Give the clients different, non-trivial weights and statistics.
    for c in fed.clients:
        plan = make_plan(fed, c.cid, 0)
        from hfl_bench.training import train_on_plan

        train_on_plan(fed, c, plan)
    fed.val_correct = torch.round(fed.val_counts * torch.rand(fed.val_counts.shape,
                                                              generator=torch.Generator().manual_seed(0)))
    return fed


@pytest.mark.parametrize("rule", RULES)
def test_fast_targets_equal_reference_targets(tiny_cfg, rule):
    fed = build(tiny_cfg(), augmentation="crop-flip")
    active = list(range(fed.n_clients))
    agg = get_aggregator(rule)
    counts, accs = fed.val_counts, fed.val_accs()
    plans = {i: make_plan(fed, i, 1) for i in active}
    fast = peerkd.peer_targets(fed, plans, active, agg, temperature=2.0, counts=counts, accs=accs).peer
    snaps = peerkd.frozen_snapshots(fed, active)
    for i in active:
        fn = peerkd.reference_target_fn(snaps, peerkd.peers_of(i, active), agg, 2.0, counts, accs)
        per_batch = torch.cat([fn(s, e, plans[i].view(fed, s, e)) for s, e in plans[i].bounds])
        assert per_batch.shape == fast[i].shape
        assert torch.allclose(per_batch, fast[i], atol=TARGETS_ATOL), f"client {i}"


def test_plan_views_are_consistent_per_batch_and_whole_epoch(tiny_cfg):
    fed = build(tiny_cfg(), augmentation="crop-flip")
    plan = make_plan(fed, 0, 3)
    whole = plan.view(fed)
    parts = torch.cat([plan.view(fed, s, e) for s, e in plan.bounds])
    assert torch.equal(whole, parts)
    # the augmentation really changes the inputs
    assert not torch.equal(whole, fed.data.train_x[plan.indices])


def test_distinct_view_holds_each_sample_once_and_spreads_back_to_the_epoch(tiny_cfg):
    fed = build(tiny_cfg(local_epochs=3))  # digits: no augmentation, the same view every epoch
    plan = make_plan(fed, 1, 2)
    rows, where = plan.distinct_view(fed)
    assert len(rows) == len(fed.clients[1].train_idx) and len(plan) == 3 * len(rows)
    assert torch.equal(rows[where], plan.view(fed))
    fed.info = dataclasses.replace(fed.info, augmentation="crop-flip")  # augmented: every view is its own
    plan = make_plan(fed, 1, 2)
    rows, where = plan.distinct_view(fed)
    assert where is None and torch.equal(rows, plan.view(fed))


@pytest.mark.parametrize("rule", ["uniform", "crad"])
def test_teachers_predicting_each_sample_once_give_the_per_position_targets(tiny_cfg, rule):
    """Several local epochs without augmentation: the fast path's targets (and a memory's) are
    exactly those of teachers run over every position of every epoch, as before the dedup (eval-mode
    rows do not depend on the other rows of a call; the method pins rely on it too)."""
    fed = build(tiny_cfg(local_epochs=3))
    active = list(range(fed.n_clients))
    agg = get_aggregator(rule)
    counts, accs = fed.val_counts, fed.val_accs()
    plans = {i: make_plan(fed, i, 1) for i in active}
    got = peerkd.peer_targets(fed, plans, active, agg, temperature=2.0, counts=counts, accs=accs, memory={0})
    views = {i: plans[i].view(fed) for i in active}
    for i in active:
        peers = peerkd.peers_of(i, active)
        probs = torch.stack([soft_targets(predict_logits(fed.clients[j].model, views[i]), 2.0) for j in peers])
        assert torch.equal(got.peer[i], agg(probs, counts[peers], accs[peers])), f"client {i}"
    assert torch.equal(got.memory[0], soft_targets(predict_logits(fed.clients[0].model, views[0]), 2.0))


@pytest.mark.parametrize("path", ["reference", "fast"])
def test_students_only_see_round_r_minus_1_snapshots(tiny_cfg, path):
    fed = build(tiny_cfg(exec=path))
    active = list(range(fed.n_clients))
    before = [copy.deepcopy(c.model) for c in fed.clients]
    seen: list[torch.Tensor] = []
    uniform = get_aggregator("uniform")

    def recording(probs, counts, accs):
        seen.append(probs.clone())
        return uniform(probs, counts, accs)

    peerkd.peer_kd_round(fed, 1, active, recording, lam=0.7, temperature=2.0,
                         counts=fed.val_counts, accs=fed.val_accs())
    # Recompute what each student should have seen: its peers' pre-round models on its views.
    plans = {i: make_plan(fed, i, 1) for i in active}
    expected, stale = [], []
    for i in active:
        x = plans[i].view(fed)
        peers = peerkd.peers_of(i, active)
        expected.append(torch.stack([soft_targets(predict_logits(before[j], x), 2.0) for j in peers]))
        stale.append(torch.stack([soft_targets(predict_logits(fed.clients[j].model, x), 2.0) for j in peers]))
    got = seen if path == "fast" else _regroup(seen, plans, active)
    for i in active:
        assert torch.allclose(got[i], expected[i], atol=TARGETS_ATOL)  # one pass each way, as above
        # after the round the peers' models changed: the check can tell stale from fresh
        assert not torch.allclose(stale[i], expected[i], atol=1e-4)


def _regroup(seen, plans, active):
    """The reference path calls the aggregator once per batch: join each student's batches."""
    out, k = [], 0
    for i in active:
        n = len(plans[i].bounds)
        out.append(torch.cat(seen[k : k + n], dim=1))
        k += n
    return out


def test_same_seed_same_metrics_and_different_seed_differs(tiny_cfg):
    task = get_task("digits")
    a = engine.run(resolve(tiny_cfg(method="crad"), task.info.defaults))
    b = engine.run(resolve(tiny_cfg(method="crad"), task.info.defaults))
    c = engine.run(resolve(tiny_cfg(method="crad", seed=1), task.info.defaults))
    strip = lambda h: [{k: v for k, v in e.items() if k not in ("seconds", "phases")} for e in h]  # noqa: E731
    assert strip(a.history) == strip(b.history)
    assert np.array_equal(a.best.global_acc, b.best.global_acc)
    assert strip(a.history) != strip(c.history)


def test_reference_and_fast_runs_agree(tiny_cfg, monkeypatch):
    # Whole runs, many steps after targets computed two ways: in float64 (helpers.in_float64 says
    # why), where the paths' parameters differ by ~1e-12, so no validation prediction flips.
    build_federation = engine.build_federation
    monkeypatch.setattr(engine, "build_federation", lambda *a, **k: in_float64(build_federation(*a, **k)))
    task = get_task("digits")
    ref = engine.run(resolve(tiny_cfg(method="crad", exec="reference"), task.info.defaults))
    fast = engine.run(resolve(tiny_cfg(method="crad", exec="fast"), task.info.defaults))
    assert next(ref.fed.clients[0].model.parameters()).dtype == torch.float64
    for r, f in zip(ref.history, fast.history):
        # the history rounds to 4 decimals: values ~1e-12 apart round alike (but for a ~1e-8 chance
        # of straddling a rounding boundary, which abs=1e-4 covers up to its representation error)
        assert r["train_loss" if "train_loss" in r else "round"] == pytest.approx(
            f["train_loss" if "train_loss" in f else "round"], abs=1e-4)
        assert r["mean_val_acc"] == pytest.approx(f["mean_val_acc"], abs=1e-6)  # the same count of correct samples


def test_partial_participation_meters_and_trains_only_active(tiny_cfg):
    task = get_task("digits")
    cfg = resolve(tiny_cfg(method="uniform-kd", clients=6, clients_per_round=3, rounds=2), task.info.defaults)
    result = engine.run(cfg)
    sent = result.bytes_sent_per_client_round
    assert sent.shape == (2, 6)
    for row in sent:
        active = np.flatnonzero(row)
        assert len(active) == 3  # only the active clients send
        # each active client sends its snapshot and 2C statistics to the 2 other active peers
        for cid in active:
            model_bytes = sum(t.numel() * t.element_size() for t in result.fed.clients[cid].model.state_dict().values())
            assert row[cid] == 2 * (model_bytes + 2 * 10 * 4)


def test_crad_dp_noise_released_once_and_nonnegative(tiny_cfg):
    from hfl_bench.methods.crad import CRAD, CRADParams

    fed = build(tiny_cfg())
    m1, m2 = CRAD(CRADParams(dp_epsilon=1.0)), CRAD(CRADParams(dp_epsilon=1.0))
    m1.setup(fed)
    m2.setup(fed)
    assert torch.equal(m1.shared_counts, m2.shared_counts)  # seeded: the same single release
    assert (m1.shared_counts >= 0).all()
    assert not torch.equal(m1.shared_counts, fed.val_counts)


def test_a_diverged_run_is_recorded_not_raised(tiny_cfg):
    task = get_task("digits")
    # a NaN learning rate is refused up front; an absurd finite one still blows up mid-run
    result = engine.run(resolve(tiny_cfg(method="local", lr=1e30, grad_clip=0.0), task.info.defaults))
    assert result.status == "diverged"
    assert "loss became" in result.error


def test_extra_endpoints_are_evaluated_and_recorded(tiny_cfg):
    from hfl_bench import recording as records
    from hfl_bench.methods.local import Local

    class LocalWithShadow(Local):
        """Local training, plus an endpoint that is client 0's model for everyone."""

        def endpoints(self, fed):
            return {"client0": [fed.clients[0].model] * fed.n_clients}

    task = get_task("digits")
    cfg = resolve(tiny_cfg(method="local"), task.info.defaults)
    sim = engine.Simulation(cfg)
    sim.method = LocalWithShadow()
    result = sim.run()
    shadow = result.best.endpoints["client0"]
    # the endpoint's figure is rounded to 4 decimals (evaluation._means: <= 5e-5 off); one flipped
    # prediction of the same model would move it by 100 / 359 ~ 0.28: abs=1e-3 tells them apart
    assert shadow["global_acc"] == pytest.approx(result.best.global_acc[0], abs=1e-3)
    record = records.build_record(cfg, result)
    assert record["metrics"]["extra_endpoints"]["client0"]["global_acc"] == pytest.approx(shadow["global_acc"])


def test_clients_without_heldout_samples_are_refused_with_a_count_that_works(tiny_cfg):
    from hfl_bench.config import ConfigError

    task, cfg = engine.load_task(tiny_cfg(clients=400))
    data = task.load()
    with pytest.raises(ConfigError, match=r"no validation or local test sample.*--clients (\d+) gives") as e:
        engine.partition_for(cfg, task.info, data)
    suggested = int(str(e.value).rsplit("--clients ", 1)[1].split()[0])
    _, fits = engine.load_task(tiny_cfg(clients=suggested))
    part = engine.partition_for(fits, task.info, data)  # the suggestion really works
    assert not engine.clients_without_heldout(part) and suggested < 400
