"""DFML (methods/dfml.py): CLI record, WSM by hand, alpha schedule, seeded aggregator and its
traffic, peak models, and the controls (eval=current, wsm=false)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from hfl_bench import engine
from hfl_bench.cli import app
from hfl_bench.config import resolve
from hfl_bench.data import get_task
from hfl_bench.methods.dfml import (
    BETA_FLOOR,
    alpha_at,
    dfml_loss,
    draw_aggregator,
    is_peak,
    log_class_prior,
    supervision_log_prior,
    weighted_log_softmax,
)
from hfl_bench.training import state_bytes


def _simulation(tiny_cfg, **params) -> engine.Simulation:
    cfg = resolve(tiny_cfg(method="dfml", method_params=params), get_task("digits").info.defaults)
    return engine.Simulation(cfg)


# --------------------------------------------------------------------------- CLI


def test_cli_two_rounds_writes_valid_record(run_record):
    record = run_record("--method", "dfml", "--task", "digits", "--clients", "4", "--rounds", "2")
    assert record["status"] == "ok" and record["error"] is None
    assert record["method"]["name"] == "dfml"
    assert record["method"]["fidelity"] == "reconstructed"
    assert any("peak model" in note for note in record["method"]["notes"])
    acc = record["metrics"]["global_acc"]
    assert isinstance(acc, (int, float)) and 0 <= acc <= 100
    assert [h["round"] for h in record["history"]] == [0, 1, 2]
    assert all(h["bytes"] > 0 for h in record["history"][1:])
    assert [h["alpha"] for h in record["history"][1:]] == [0.0, pytest.approx(alpha_at(1, 0.8, 10), abs=1e-4)]


def test_cli_rejects_odd_period(tmp_path):
    result = CliRunner().invoke(app, ["run", "--method", "dfml", "--task", "digits", "--clients", "3", "--rounds", "1",
                                      "--set", "period=3", "--out", str(tmp_path), "-q"])
    assert result.exit_code != 0
    assert "period must be an even integer" in result.output
    assert not list(tmp_path.rglob("*.json"))


# --------------------------------------------------------------------------- WSM


def test_wsm_with_a_class_absent_at_the_aggregator():
    # Aggregator counts: class 0 three times, class 1 once, class 2 never -> beta = (3/4, 1/4, 0).
    counts = np.array([3, 1, 0])
    logits = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 60.0]], requires_grad=True)
    log_p = weighted_log_softmax(logits, counts)
    assert torch.isfinite(log_p).all()
    p = log_p.exp()
    # By hand, row 0: p_c proportional to beta_c e^{z_c}: (0.75 e, 0.25 e^2, ~0), so
    # p_0 = 3 / (3 + e) = 0.524633, p_1 = e / (3 + e) = 0.475367, and the absent class gets
    # 1e-8 / (0.75 e + 0.25 e^2) = 2.5734e-9.
    # The pinned literals are rounded to 6 decimals (<= 5e-7) and float32 softmax of 3 logits adds
    # <= a few x 6e-8: abs=1e-6. The absent class's 5-digit literal: rel=1e-3 (float32 keeps ~1e-7 relative).
    assert p[0, 0].item() == pytest.approx(0.524633, abs=1e-6)
    assert p[0, 1].item() == pytest.approx(0.475367, abs=1e-6)
    assert p[0, 2].item() == pytest.approx(2.5734e-9, rel=1e-3)
    # Row 1: even a huge logit on the absent class stays finite and is scaled by the floor:
    # log p_2 = log 1e-8 + 60 - log(0.75 + 0.25 + 1e-8 e^60).
    expected = math.log(1e-8) + 60 - math.log(1.0 + 1e-8 * math.exp(60))
    # log p_2 ~ -18.4 in float32 after a log-sum-exp with a 1e26 term: ulp(18.4) ~ 2e-6, a few ops -> 1e-4 holds
    assert log_p[1, 2].item() == pytest.approx(expected, abs=1e-4)
    # The present classes keep their 3:1 ratio in row 1 (equal logits), whatever the absent one does.
    assert (log_p[1, 0] - log_p[1, 1]).item() == pytest.approx(math.log(3), abs=1e-5)
    # The NLL of label 0 in row 0 is -log(3 / (3 + e)) = 0.645056; gradients are finite.
    nll = -log_p[0, 0]
    assert nll.item() == pytest.approx(0.645056, abs=1e-6)
    (-log_p[:, 0].sum()).backward()
    assert torch.isfinite(logits.grad).all()
    assert log_class_prior(counts)[2].item() == pytest.approx(math.log(BETA_FLOOR))


def test_dfml_loss_mixes_wsm_and_peer_kl():
    counts = np.array([2, 2, 0])
    log_beta = log_class_prior(counts)
    z = torch.tensor([[0.5, -0.5, 1.0]], requires_grad=True)
    y = torch.tensor([1])
    q1, q2 = torch.tensor([[0.7, 0.2, 0.1]]), torch.tensor([[0.1, 0.1, 0.8]])
    wsm_nll = -weighted_log_softmax(z, counts)[0, 1]
    p = torch.softmax(z, -1)[0]
    kl = lambda q: sum(qc * math.log(qc / pc) for qc, pc in zip(q[0].tolist(), p.tolist()))  # noqa: E731
    expected = 0.75 * wsm_nll.item() + 0.25 * (kl(q1) + kl(q2)) / 2
    # float32 loss ~1 from ~20 ops (softmax, logs, a 3-term KL sum) against a float64 sum: ~20 x 6e-8 < 1e-5
    assert dfml_loss(z, y, log_beta, [q1, q2], 0.25).item() == pytest.approx(expected, abs=1e-5)
    # No peers: the WSM loss alone, whatever alpha says.
    assert dfml_loss(z, y, log_beta, [], 0.8).item() == pytest.approx(wsm_nll.item(), abs=1e-6)


# --------------------------------------------------------------------------- schedule


def test_alpha_schedule():
    assert alpha_at(0, 0.8, 10) == 0.0
    assert alpha_at(5, 0.8, 10) == pytest.approx(0.8)
    assert alpha_at(10, 0.8, 10) == pytest.approx(0.0, abs=1e-12)
    assert alpha_at(2, 0.8, 10) == pytest.approx(0.8 * (1 - math.cos(0.4 * math.pi)) / 2)
    assert alpha_at(3, 0.8, 10) == pytest.approx(alpha_at(7, 0.8, 10))  # symmetric about the peak
    assert [t for t in range(25) if is_peak(t, 10)] == [5, 15]
    assert alpha_at(1, 0.8, 2) == pytest.approx(0.8) and is_peak(1, 2) and not is_peak(0, 2)


# --------------------------------------------------------------------------- aggregator and bytes


def test_aggregator_draw_is_seeded():
    active = [0, 1, 2, 3, 4, 5]
    first = [draw_aggregator(7, r, active) for r in range(1, 41)]
    assert first == [draw_aggregator(7, r, active) for r in range(1, 41)]
    assert first != [draw_aggregator(8, r, active) for r in range(1, 41)]
    assert set(first) <= set(active) and len(set(first)) > 1  # varies over rounds
    assert draw_aggregator(7, 3, [4]) == 4


def test_each_participant_sends_its_model_to_the_aggregator(tiny_cfg):
    sim = _simulation(tiny_cfg)
    fed = sim.fed
    entry = sim.step(1)
    active = sim.active_clients(1)
    a = draw_aggregator(fed.cfg.seed, 1, active)
    assert entry["aggregator"] == a
    size = [state_bytes(c.model) for c in fed.clients]
    others = [n for n in active if n != a]
    for n in others:  # to a, and nothing else (the return trip is a's)
        assert fed.channel.sent[n] == size[n]
        assert fed.channel.received[n] == size[n]
    assert fed.channel.sent[a] == sum(size[n] for n in others)
    assert fed.channel.received[a] == sum(size[n] for n in others)
    assert entry["bytes"] == 2 * sum(size[n] for n in others)


# --------------------------------------------------------------------------- peak models


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(model, state) -> bool:
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_evaluated_model_is_the_peak_model(tiny_cfg):
    sim = _simulation(tiny_cfg, period=2)  # t = rnd - 1: round 1 has alpha 0, round 2 is a peak
    fed, method = sim.fed, sim.method
    sim.step(1)
    assert sim.history[-1]["alpha"] == 0.0
    assert all(m is c.model for m, c in zip(method.eval_models(fed), fed.clients))  # no peak yet
    assert method.changed_clients(fed, sim.active_clients(1)) == sim.active_clients(1)

    sim.step(2)
    assert sim.history[-1]["alpha"] == pytest.approx(0.8)
    at_peak = [_state(c.model) for c in fed.clients]
    evaluated = method.eval_models(fed)
    for model, client, state in zip(evaluated, fed.clients, at_peak):
        assert model is not client.model
        assert _same(model, state)

    sim.step(3)  # a trough round: the models train on, the evaluated ones stay at the peak
    assert method.changed_clients(fed, sim.active_clients(3)) == []
    for model, client, state in zip(method.eval_models(fed), fed.clients, at_peak):
        assert _same(model, state)
        assert not _same(client.model, state)


# --------------------------------------------------------------------------- budget


def test_k_follows_the_runs_local_epochs_unless_set(tiny_cfg, monkeypatch):
    """Version 1.1: the aggregator trains --local-epochs epochs per round, as every method's clients do."""
    import hfl_bench.methods.dfml as module

    steps = []
    real_plan = module.make_plan

    def plan(fed, cid, rnd, epochs=None):
        made = real_plan(fed, cid, rnd, epochs=epochs)
        steps.append(len(made.bounds))
        return made

    monkeypatch.setattr(module, "make_plan", plan)
    for params in ({}, {"epochs": 1}):
        sim = _simulation(lambda **kw: tiny_cfg(**kw, local_epochs=3), **params)
        assert sim.fed.cfg.local_epochs == 3
        sim.step(1)
    default, one = steps
    assert default == 3 * one > 0  # three epochs of the aggregator's batches against one


# --------------------------------------------------------------------------- controls


def test_record_carries_the_controls_at_their_defaults(run_record):
    record = run_record("--method", "dfml", "--task", "digits", "--clients", "3", "--rounds", "1")
    hparams = record["method"]["hparams"]
    assert (hparams["eval"], hparams["wsm"], hparams["alpha_max"]) == ("peak", True, 0.8)
    assert record["config"]["method_params"] == {}  # defaults are not in the config (nor its hash)
    assert any("eval=current" in note and "wsm=false" in note for note in record["method"]["notes"])
    changed = run_record("--method", "dfml", "--task", "digits", "--clients", "3", "--rounds", "1",
                         "--set", "eval=current", "--set", "wsm=false")
    assert (changed["method"]["hparams"]["eval"], changed["method"]["hparams"]["wsm"]) == ("current", False)
    assert changed["config"]["method_params"] == {"eval": "current", "wsm": False}
    assert changed["config_hash"] != record["config_hash"]


def test_wsm_false_supervises_with_the_plain_softmax():
    counts = np.array([3, 1, 0])
    assert torch.equal(supervision_log_prior(counts), log_class_prior(counts))  # the default: WSM
    assert torch.equal(supervision_log_prior(counts, wsm=True), log_class_prior(counts))
    assert supervision_log_prior(counts, wsm=False) is None
    z = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    y = torch.tensor([0, 2])
    plain = dfml_loss(z, y, supervision_log_prior(counts, wsm=False), [], 0.8)
    assert plain.item() == pytest.approx(F.cross_entropy(z, y).item(), abs=1e-6)
    wsm = dfml_loss(z, y, supervision_log_prior(counts), [], 0.8)
    assert wsm.item() > plain.item() + 5  # label 2 is absent at the aggregator: WSM makes it ~impossible
    # with peers, the plain NLL is mixed with the same KL term as the WSM one
    q = torch.tensor([[0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    kl = F.kl_div(torch.log_softmax(z, -1), q, reduction="batchmean")
    mixed = dfml_loss(z, y, None, [q], 0.25)
    assert mixed.item() == pytest.approx(0.75 * F.cross_entropy(z, y).item() + 0.25 * kl.item(), abs=1e-6)


def test_wsm_false_reaches_the_round(tiny_cfg, monkeypatch):
    import hfl_bench.methods.dfml as module

    seen = []
    real = module.mutual_learning

    def spy(fed, plan, members, log_beta, alpha):
        seen.append(log_beta)
        return real(fed, plan, members, log_beta, alpha)

    monkeypatch.setattr(module, "mutual_learning", spy)
    for params in ({}, {"wsm": False}):
        sim = _simulation(tiny_cfg, **params)
        sim.step(1)
    default, plain = seen
    a = draw_aggregator(0, 1, list(range(4)))
    assert torch.equal(default, log_class_prior(sim.fed.clients[a].train_counts))
    assert plain is None


def _stepped(tiny_cfg, rounds: int, **params) -> engine.Simulation:
    sim = _simulation(lambda **kw: tiny_cfg(**kw, rounds=rounds), **params)
    for rnd in range(1, rounds + 1):
        sim.step(rnd)
    return sim


def test_eval_current_evaluates_the_live_model(tiny_cfg):
    # period 2: round 1 has alpha 0 (no peak yet), round 2 is a peak, round 3 trains on past it.
    peak = _stepped(tiny_cfg, 3, period=2)
    current = _stepped(tiny_cfg, 3, period=2, eval="current")
    # The control changes what is evaluated, not what is trained.
    assert [h["train_loss"] for h in peak.history[1:]] == [h["train_loss"] for h in current.history[1:]]
    for a, b in zip(peak.fed.clients, current.fed.clients):
        assert _same(a.model, _state(b.model))
    fed, method = current.fed, current.method
    assert all(m is c.model for m, c in zip(method.eval_models(fed), fed.clients))
    assert method.peaks == {}  # no peak model is stored
    assert method.changed_clients(fed, current.active_clients(3)) == current.active_clients(3)

    def figures(h):
        return h["global_acc"], h["local_acc"], h["mean_val_acc"]

    # Rounds 1 and 2 evaluate the same models either way (no peak yet; the peak copied this round);
    # at round 3 the peak run still reads round 2's models, the current run the live ones.
    for rnd in (1, 2):
        assert figures(peak.history[rnd]) == figures(current.history[rnd]), rnd
    assert figures(peak.history[3]) == figures(peak.history[2])
    assert figures(current.history[3]) != figures(peak.history[3])


@pytest.mark.parametrize("params,message", [({"eval": "best"}, "eval must be peak or current, got 'best'"),
                                            ({"eval": "Peak"}, "eval must be peak or current")])
def test_bad_eval_is_refused(tiny_cfg, params, message):
    from hfl_bench.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        _simulation(tiny_cfg, **params)
