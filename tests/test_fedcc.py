"""FedCC: the pseudo-label weights and the server aggregation on hand-computed cases, the C + 1
models built in setup, a round's exchange and metering, evaluation that ignores the unknown class,
the ensemble endpoint, and the CLI record on the one-class-per-client partition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from hfl_bench import engine
from hfl_bench.config import RunConfig
from hfl_bench.federation import Federation
from hfl_bench.metering import SERVER
from hfl_bench.methods.fedcc import (
    ConfidenceEnsemble,
    FedCC,
    KnownClasses,
    aggregate_predictions,
    majority_classes,
    pseudo_label_weights,
    pseudo_labels,
)
from hfl_bench.training import predict_logits

from helpers import cpu_federation, ready_method

LN = math.log


def build(**overrides):
    return cpu_federation(RunConfig(**{"task": "digits", "method": "fedcc", "clients": 4, "rounds": 2, "seed": 0,
                                        "public_size": 60, **overrides}))


def method(fed, **params) -> FedCC:
    return ready_method(FedCC, fed, **params)


def test_pseudo_label_weights_one_majority_class_by_hand():
    # C = 3, delta = 0; counts 50 / 1 / 0: only class 0 is above 2% (1/51 = 1.96%), so C_J = {0}.
    majority = majority_classes(np.array([50, 1, 0]), 0.02)
    assert majority.tolist() == [True, False, False]
    # probe: known logits (ln 2, 0, 0) -> p = (.5, .25, .25); the unknown logit (7) is ignored.
    probe = torch.tensor([LN(2), 0.0, 0.0, 7.0])
    public = torch.tensor([
        [0.0, 0.0, 0.0, -3.0],  # p uniform: H = ln 3 = 1.09861 > w_l -> alpha 0
        [LN(8), 0.0, 0.0, 5.0],  # p = (.8, .1, .1): H = 0.63903
        [0.0, LN(8), 0.0, 0.0],  # p = (.1, .8, .1): same H; m is still class 0 (argmax over C_J)
    ])
    w = pseudo_label_weights(probe, public, majority, delta=0.0)
    # w_l = -(.5 ln .5 + 2 * .25 ln .25) = 1.5 ln 2 = 1.03972; w_u = ln(3 - 1 + 1) = ln 3 = 1.09861
    # The literals are rounded to 5 decimals (<= 5e-6); the float32 weights add <= a few x 6e-8: abs=1e-5.
    assert float(w.w_l) == pytest.approx(1.03972, abs=1e-5)
    assert w.w_u == pytest.approx(1.09861, abs=1e-5)
    # w_x = min(w_l, H(x)): (1.03972, 0.63903, 0.63903)
    assert w.w_x.tolist() == pytest.approx([1.03972, 0.63903, 0.63903], abs=1e-5)
    # alpha = (w_l - w_x) / (w_l + w_u) = (0, 0.40069 / 2.13833, same) = (0, 0.18738, 0.18738)
    assert w.alpha.tolist() == pytest.approx([0.0, 0.18738, 0.18738], abs=1e-5)
    assert w.m.tolist() == [0, 0, 0]
    rows = pseudo_labels(w.alpha, w.m, 3)
    expected = [[0, 0, 0, 1], [0.18738, 0, 0, 0.81262], [0.18738, 0, 0, 0.81262]]
    assert rows.tolist()[0] == pytest.approx(expected[0], abs=1e-5)
    assert rows.tolist()[1] == pytest.approx(expected[1], abs=1e-5)
    assert rows.tolist()[2] == pytest.approx(expected[2], abs=1e-5)


def test_pseudo_label_weights_two_majority_classes_with_smoothing_by_hand():
    # counts 50 / 50 / 1: C_J = {0, 1} (1/101 < 2%); w_u = ln(3 - 2 + 1) = ln 2 = 0.69315.
    majority = majority_classes(np.array([50, 50, 1]), 0.02)
    assert majority.tolist() == [True, True, False]
    # delta = 0.3. probe p = (.5, .5, 0) -> smoothed .7 p + .1 = (.45, .45, .1):
    # w_l = -(2 * .45 ln .45 + .1 ln .1) = 0.71866 + 0.23026 = 0.94892
    probe = torch.tensor([0.0, 0.0, -1e4, 0.0])
    # x: p = (.02, .08, .9) -> smoothed (.114, .156, .73): H = 0.24756 + 0.28983 + 0.22974 = 0.76713
    public = torch.tensor([[LN(0.02), LN(0.08), LN(0.9), 9.0]])
    w = pseudo_label_weights(probe, public, majority, delta=0.3)
    assert float(w.w_l) == pytest.approx(0.94892, abs=1e-5)
    assert w.w_u == pytest.approx(0.69315, abs=1e-5)
    assert w.w_x.tolist() == pytest.approx([0.76713], abs=1e-5)
    # alpha = (0.94892 - 0.76713) / (0.94892 + 0.69315) = 0.18179 / 1.64206 = 0.11071
    assert w.alpha.tolist() == pytest.approx([0.11071], abs=1e-5)
    assert w.m.tolist() == [1]  # class 2 is the most likely, but not a majority class
    assert pseudo_labels(w.alpha, w.m, 3).tolist()[0] == pytest.approx([0, 0.11071, 0, 0.88929], abs=1e-5)


def test_majority_classes_fall_back_to_the_held_classes():
    assert majority_classes(np.ones(100, dtype=int), 0.02).all()  # 1% each: none above 2%
    counts = np.zeros(100, dtype=int)
    counts[:60] = 1
    assert majority_classes(counts, 0.02).tolist() == [True] * 60 + [False] * 40


def test_server_aggregation_by_hand():
    # 2 clients, 3 samples, C = 2 (+ unknown in the last column).
    soft = torch.tensor([
        [[0.6, 0.2, 0.2], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]],  # client 0
        [[0.1, 0.4, 0.5], [0.3, 0.1, 0.6], [0.0, 0.0, 1.0]],  # client 1
    ])
    out = aggregate_predictions(soft)
    # sample 0: mu = (.8, .5) / 1.3; known mean (.53, .36) / 1.3; unknown zeroed; / .89 -> (.59551, .40449)
    # float32 sums of <= 3 probabilities, renormalized: <= ~5 x 6e-8 < 1e-6 from the float64 fractions
    assert out[0].tolist() == pytest.approx([0.53 / 0.89, 0.36 / 0.89, 0.0], abs=1e-6)
    # sample 1: client 0 is certain of "unknown" (weight 0): client 1's known part renormalized
    assert out[1].tolist() == pytest.approx([0.75, 0.25, 0.0], abs=1e-6)
    # sample 2: nothing known anywhere: uniform over the known classes
    assert out[2].tolist() == pytest.approx([0.5, 0.5, 0.0], abs=1e-6)


def test_setup_rebuilds_seeded_c_plus_one_models_with_the_chosen_optimizer():
    fed_a, fed_b = build(), build()
    rng = torch.get_rng_state()
    method(fed_a, optimizer="adam")  # the paper preset's optimizer
    assert torch.equal(torch.get_rng_state(), rng)  # the run's global RNG stream is left alone
    method(fed_b, optimizer="adam")
    for a, b in zip(fed_a.clients, fed_b.clients):
        assert predict_logits(a.model, fed_a.public_x).shape == (60, 11)
        assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
        assert isinstance(a.optimizer, torch.optim.Adam) and a.optimizer.param_groups[0]["lr"] == 1e-3
        assert {id(p) for p in a.model.parameters()} == {id(p) for g in a.optimizer.param_groups for p in g["params"]}
    fed = build()
    method(fed)  # the default: the protocol's SGD
    opt = fed.clients[0].optimizer
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["lr"] == fed.cfg.lr


def test_private_epochs_are_the_runs_local_epochs_unless_the_paper_preset_adds_one():
    """(CE-step epochs, pseudo-label-step epochs) per round: the pseudo-label step's private epoch
    is one of the run's local epochs by default; pseudo_in_budget=false puts it on top."""
    from hfl_bench.methods.fedcc import FedCCParams, private_epochs

    assert private_epochs(5, FedCCParams()) == (4, 1)
    assert private_epochs(1, FedCCParams()) == (0, 1)
    assert private_epochs(2, FedCCParams(pseudo_epochs=3)) == (0, 2)
    assert private_epochs(5, FedCCParams(pseudo_epochs=0)) == (5, 0)
    assert private_epochs(5, FedCCParams(pseudo_in_budget=False)) == (5, 1)


def test_round_exchange_metering_and_unlabeled_public_set(monkeypatch):
    fed = build()
    m = method(fed)

    def forbidden(self):
        raise AssertionError("fedcc read the public labels")

    monkeypatch.setattr(Federation, "public_y", property(forbidden))
    uploads = {}
    send = fed.channel.send

    def spy(src, dsts, payload, kind):
        if dsts == SERVER:
            uploads[src] = payload.clone()
        return send(src, dsts, payload, kind)

    monkeypatch.setattr(fed.channel, "send", spy)
    active = [0, 2, 3]
    fed.channel.start_round()
    out = m.run_round(fed, 1, active)
    assert "sync_loss" not in out and {"train_loss", "pseudo_loss", "alpha_mean"} <= set(out)
    payload = 60 * 11 * 4  # M x (C + 1) float32
    assert sorted(uploads) == active and fed.channel.sent.tolist() == [payload, 0, payload, payload]
    assert fed.channel.server_sent == 4 * payload  # broadcast to every client
    assert torch.allclose(m.targets, aggregate_predictions(torch.stack([uploads[k] for k in active])))
    assert torch.all(m.targets[:, 10] == 0) and torch.allclose(m.targets.sum(-1), torch.ones(60))
    out = m.run_round(fed, 2, [1, 2])  # round 2 syncs to the broadcast targets first
    assert out["sync_loss"] > 0


def _last_linear(model: nn.Module) -> nn.Linear:
    return [mod for mod in model.modules() if isinstance(mod, nn.Linear)][-1]


def test_evaluation_ignores_the_unknown_class():
    fed = build()
    m = method(fed)
    m.run_round(fed, 1, [0, 1, 2, 3])
    for client in fed.clients:  # make "unknown" every model's largest logit everywhere
        head = _last_linear(client.model)
        assert head.out_features == 11
        with torch.no_grad():
            head.bias[10] = 1e4
        client.model.train()
    models = m.eval_models(fed)
    y = fed.data.test_y
    for client, wrapper in zip(fed.clients, models):
        raw = predict_logits(client.model, fed.data.test_x)
        assert torch.all(raw.argmax(-1) == 10)  # the raw model would score 0
        per_class = engine.evaluate_global(fed, wrapper)
        assert per_class.shape == (10,)
        assert torch.equal(per_class, engine.class_correct(raw[:, :10], y, 10))
        assert client.model.training  # evaluation left the client's model in its mode
    assert sum(float(engine.evaluate_global(fed, w).sum()) for w in models) > 0
    metrics = engine.Evaluator(fed, fed.timer)(1, models, list(range(4)), endpoints=m.endpoints(fed))
    assert metrics.global_class_acc.shape == (4, 10)
    assert metrics.endpoints["ensemble"]["global_acc"] > 0


def test_ensemble_is_the_confidence_weighted_aggregate_shared_by_every_client():
    fed = build()
    m = method(fed)
    m.run_round(fed, 1, [0, 1, 2, 3])
    views = m.endpoints(fed)["ensemble"]
    # one predictor in every client's place: the evaluator runs it once per set of test inputs
    assert len(views) == 4 and isinstance(views[0], ConfidenceEnsemble) and all(v is views[0] for v in views)
    ensemble = views[0]
    assert not list(ensemble.parameters())  # the clients' models are not its submodules

    def direct(x):  # the aggregate computed here from each model's softmax
        soft = torch.stack([torch.softmax(predict_logits(c.model, x), -1) for c in fed.clients])
        return aggregate_predictions(soft)[:, :10]

    test_x = fed.data.test_x
    got = predict_logits(ensemble, test_x, chunk=50)
    # the same float32 softmax mixture computed through log-probabilities and back (exp(log p)):
    # relative rounding of a few x 6e-8 on probabilities <= 1, within 1e-6
    assert got.shape == (len(test_x), 10) and torch.allclose(got.exp(), direct(test_x), atol=1e-6)
    for client in fed.clients:  # each client's held-out rows
        x = fed.data.train_x[torch.cat([client.val_idx, client.test_idx])]
        assert torch.allclose(predict_logits(ensemble, x).exp(), direct(x), atol=1e-6)
    client = fed.clients[0]
    client.model.train()
    with torch.no_grad():  # the ensemble reads the current models
        _last_linear(client.model).bias[0] += 3.0  # shifts class 0 only (a shift of all is softmax-neutral)
    assert torch.allclose(ensemble(test_x[:20]).exp(), direct(test_x)[:20], atol=1e-6)
    assert client.model.training  # evaluating the ensemble left the client's model in its mode
    assert isinstance(m.eval_models(fed)[0], KnownClasses)


def test_cli_one_class_per_client_writes_a_valid_record_with_the_ensemble(run_record):
    record = run_record("--method", "fedcc", "--task", "digits", "--clients", "4", "--rounds", "2",
                        "--partition", "classes", "--k", "1", "--public-size", "100")
    assert record["status"] == "ok" and record["method"]["name"] == "fedcc"
    assert record["method"]["fidelity"] == "reconstructed" and record["federation"]["topology"] == "server"
    assert record["partition"]["public_size"] == 100
    assert record["method"]["hparams"]["optimizer"] == "run" and record["method"]["preset"] is None
    metrics = record["metrics"]
    assert len(metrics["per_class_global_acc"]) == 10
    ensemble = metrics["extra_endpoints"]["ensemble"]
    assert 0 <= ensemble["global_acc"] <= 100 and 0 <= ensemble["local_acc"] <= 100
    history = record["history"]
    assert "sync_loss" not in history[1] and "sync_loss" in history[2]
    assert all(h["bytes"] == 2 * 4 * 100 * 11 * 4 for h in history[1:])  # 4 uploads + 4 broadcasts
