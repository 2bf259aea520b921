"""The prototype family (hfl_bench.families.prototypes) and its methods fedproto, fedtgp and fd:
the losses and the server rules on hand-computed examples, the nearest-prototype headline and the
head endpoint, when FedTGP's uploads are computed, and a refusal in one line."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.families.feature_head import FeatureHeadModel, NearestPrototype
from hfl_bench.families.prototypes import eval_class_means, mean_over_clients, prototype_loss
from hfl_bench.metering import SERVER, Payload
from hfl_bench.methods.fd import fd_loss
from hfl_bench.methods.fedtgp import adaptive_margin, class_gaps, margin_loss
from hfl_bench.testing import ready_method, tiny_federation

# ----------------------------------------------------------------------------- the losses


def test_prototype_loss_is_ce_plus_lam_mse_over_every_entry_absent_rows_zero():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = torch.tensor([0, 1])
    prototypes = torch.tensor([[0.0, 0.0], [9.0, 9.0], [0.0, 0.0]])
    present = torch.tensor([True, False, False])  # class 1's row is not a target: it adds nothing
    loss = prototype_loss(logits, features, y, prototypes, present, lam=2.0)
    ce = (-math.log(math.exp(2) / (math.exp(2) + 2)) - math.log(math.e / (math.e + 2))) / 2
    mse = (1 + 4 + 0 + 0) / 4  # over all B * d = 4 entries, the absent row counted as zero
    assert float(loss.detach()) == pytest.approx(ce + 2.0 * mse, rel=1e-6)
    loss.backward()
    assert torch.equal(features.grad[1], torch.zeros(2))  # no pull on the row without a prototype
    assert features.grad[0].tolist() == pytest.approx([2.0 * 2 * 1 / 4, 2.0 * 2 * 2 / 4])


def test_fd_loss_distills_the_softmax_of_the_global_logit_and_is_plain_ce_without_one():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 1])
    table = torch.tensor([[3.0, 1.0], [0.0, 0.0]])
    present = torch.tensor([True, False])
    ce = F.cross_entropy(z, y)
    t = [math.exp(3) / (math.exp(3) + math.e), math.e / (math.exp(3) + math.e)]  # softmax([3, 1])
    log_p = [1 - math.log(math.e + 1), -math.log(math.e + 1)]  # log softmax([1, 0])
    soft = -(t[0] * log_p[0] + t[1] * log_p[1]) / 2  # batch mean: row 1 (no global logit) adds 0
    assert float(fd_loss(z, y, table, present, 0.5)) == pytest.approx(float(ce) + 0.5 * soft, rel=1e-6)
    # HtFLlib HEAD's raw-logit target gives another value: this is the softmax form
    raw = -(3.0 * log_p[0] + 1.0 * log_p[1]) / 2
    assert float(fd_loss(z, y, table, present, 0.5)) != pytest.approx(float(ce) + 0.5 * raw, rel=1e-3)
    assert torch.equal(fd_loss(z, y, table, torch.zeros(2, dtype=torch.bool), 0.5), ce)


# ----------------------------------------------------------------------------- the server rules


def test_global_prototype_is_the_unweighted_mean_over_the_clients_that_sent_the_class():
    a = {0: torch.tensor([1.0, 1.0]), 2: torch.tensor([2.0, 0.0])}
    b = {0: torch.tensor([3.0, 5.0])}
    means, present = mean_over_clients([a, b, {}], 3, 2, torch.device("cpu"))
    assert present.tolist() == [True, False, True]
    assert means.tolist() == [[2.0, 3.0], [0.0, 0.0], [2.0, 0.0]]


def test_tgp_margin_is_the_largest_nearest_class_gap_capped_absent_classes_take_the_smallest():
    means = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0], [7.0, 7.0]])
    present = torch.tensor([True, True, True, False])
    gaps = class_gaps(means, present)
    assert gaps.tolist() == pytest.approx([1.0, math.sqrt(18), 1.0, 1.0])  # class 3: the smallest gap
    assert adaptive_margin(means, present, 100.0) == pytest.approx(math.sqrt(18))
    assert adaptive_margin(means, present, 3.0) == 3.0


def test_tgp_margin_loss_is_ce_of_minus_distance_with_the_margin_on_the_true_class():
    q = torch.tensor([[0.0, 0.0]])
    prototypes = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # distances 5 and 1
    loss = margin_loss(q, torch.tensor([1]), prototypes, margin=2.0)
    assert float(loss) == pytest.approx(-math.log(math.exp(-3.0) / (math.exp(-3.0) + math.exp(-5.0))), rel=1e-6)


# ----------------------------------------------------------------------------- the methods on a federation


def test_fedproto_headline_is_the_nearest_global_prototype_and_the_head_an_endpoint():
    fed = tiny_federation(clients=3)
    method = ready_method("fedproto", fed)
    before = method.eval_models(fed)
    assert [m is c.model for m, c in zip(before, fed.clients)] == [True] * 3  # no prototypes yet: the heads
    method.run_round(fed, 1, [0, 1, 2])
    held = [c.train_counts > 0 for c in fed.clients]
    assert method.present.tolist() == [bool(any(h[k] for h in held)) for k in range(fed.num_classes)]
    models = method.eval_models(fed)
    assert all(isinstance(m, NearestPrototype) for m in models)
    assert method.endpoints(fed)["head"] == [c.model for c in fed.clients]
    assert method.changed_clients(fed, [1]) == [0, 1, 2]  # new prototypes change every client's predictor
    x = torch.randn(5, *fed.info.input_shape)
    with torch.no_grad():
        f = fed.clients[0].model.eval().forward_features(x)
        dist = ((f.unsqueeze(1) - method.prototypes.unsqueeze(0)) ** 2).mean(2)
        dist[:, ~method.present] = float("inf")
        assert torch.equal(models[0].eval()(x).argmax(1), dist.argmin(1))
        # a class without a prototype is never predicted, and its logit is finite: an infinity would
        # read as a diverged model (a round whose drawn clients lack a class was scored "diverged")
        absent = method.present.clone()
        absent[0] = False
        logits = NearestPrototype(fed.clients[0].model, method.prototypes, absent).eval()(x)
        assert torch.isfinite(logits).all() and not (logits.argmax(1) == 0).any()


def test_fedtgp_uploads_eval_mode_prototypes_of_the_model_after_training():
    """The paper's order: each client's upload is its trained model's per-class mean feature over
    its training set (HtFLlib's code uploads the start-of-round model's: a round behind)."""
    fed = tiny_federation(clients=2)
    method = ready_method("fedtgp", fed, server_epochs=1)
    sent, send = {}, fed.channel.send

    def spy(src, dsts, payload, kind):
        if dsts == SERVER:
            sent[src] = {c: v.clone() for c, v in payload.items()}
            assert set(kind.values()) == {Payload.FEATURES}
        return send(src, dsts, payload, kind)

    fed.channel.send = spy
    start = [{k: v.clone() for k, v in c.model.state_dict().items()} for c in fed.clients]
    method.run_round(fed, 1, [0, 1])
    for c in fed.clients:
        model = c.model
        assert any(not torch.equal(v, start[c.cid][k]) for k, v in model.state_dict().items())
        means, present = eval_class_means(fed, c.cid, model, model.forward_features, method.width)
        assert sorted(sent[c.cid]) == present.nonzero().flatten().tolist()
        for k, v in sent[c.cid].items():
            assert torch.allclose(v, means[k])
    assert bool(method.present.all())  # TGP gives every class a global prototype
    assert method.prototypes.shape == (fed.num_classes, method.width)


def test_fedproto_uploads_train_mode_means_collected_during_training():
    """FedProto's uploads are collected while training (train mode, the model evolving), one per
    class the client holds: not the trained model's eval-mode means (what FedTGP uploads)."""
    fed = tiny_federation(clients=2)
    method = ready_method("fedproto", fed)
    sent, send = {}, fed.channel.send

    def spy(src, dsts, payload, kind):
        if dsts == SERVER:
            sent[src] = {c: v.clone() for c, v in payload.items()}
        return send(src, dsts, payload, kind)

    fed.channel.send = spy
    method.run_round(fed, 1, [0, 1])
    model = fed.clients[0].model
    assert isinstance(model, FeatureHeadModel)
    means, present = eval_class_means(fed, 0, model, model.forward_features, method.width)
    assert sorted(sent[0]) == present.nonzero().flatten().tolist() == fed.clients[0].train_counts.nonzero()[0].tolist()
    assert not all(torch.allclose(v, means[k]) for k, v in sent[0].items())


def test_a_negative_lam_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["run", "-m", "fedproto", "--task", "digits", "--clients", "2", "--rounds", "1",
                                      "--set", "lam=-1", "-q", "--out", str(tmp_path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert any("fedproto: lam must be >= 0, got -1" in line for line in lines), result.output
