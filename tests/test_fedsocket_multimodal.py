"""FedSocket and its Naive Shared control on a task with missing modalities (digits-mnist1d:
image + signal, recipients miss the signal): end to end, features never computed from what a
client lacks, the three endpoints on the same inputs, the conditional target, ownership of
modality blocks, and the control's plain training and averaging."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hfl_bench.methods.fedsocket as fs
import hfl_bench.methods.naive_shared as ns
from hfl_bench import engine
from hfl_bench import recording as records
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.evaluation import Evaluator
from hfl_bench.families import shared_predictor as sp
from hfl_bench.metering import payload_bytes
from hfl_bench.modalities import mask
from hfl_bench.testing import ready_method, tiny_federation
from hfl_bench.training import predict_logits

TASK = "digits-mnist1d"
# A short encoder pretraining (the default's shape, fewer steps) on a small pretraining split: the
# images have no generator (the signals' encoder pretrains on mnist1d's generator samples).
QUICK_PARAMS = {"warmup_epochs": 1, "local_epochs": 1, "pretrain_steps": 50}
PRETRAIN = 100


@pytest.fixture(scope="module")
def fed():
    # task defaults: half the clients are recipients missing the signal
    return tiny_federation(TASK, 4, pretrain_size=PRETRAIN)


def fresh(fed):
    return copy.deepcopy(fed)


def test_the_fixture_has_donors_and_recipients(fed):
    assert fed.recipients and len(fed.recipients) < fed.n_clients
    assert all(fed.clients[k].modalities == ("image",) for k in fed.recipients)


# ----------------------------------------------------------------------------- end to end


def run_cli(out, *args: str) -> dict:
    """``hfl-bench run ARGS`` in-process; the record it wrote, checked by ``record_problems`` (which
    validates a multimodal record against the schema version it names)."""
    from typer.testing import CliRunner

    from hfl_bench.cli import app
    from hfl_bench.record.check import problems as record_problems

    result = CliRunner().invoke(app, ["run", *args, "--out", str(out), "--json", "-q"])
    assert result.exit_code == 0, result.output
    record = json.loads(Path(json.loads(getattr(result, "stdout", result.output))["record"]).read_text())
    assert not record_problems(record), record_problems(record)
    return record


@pytest.mark.parametrize("method", ["fedsocket", "naive-shared"])
def test_runs_end_to_end_with_finite_private_q_joint(method, tmp_path):
    record = run_cli(tmp_path, "--method", method, "--task", TASK, "--clients", "4", "--rounds", "2",
                     "--set", "warmup_epochs=1", "--set", "local_epochs=1", "--set", "pretrain_steps=50",
                     "--pretrain-size", str(PRETRAIN))
    assert record["status"] == "ok" and record["method"]["name"] == method
    assert record["modalities"]["recipients"]
    metrics = record["metrics"]
    for group in (metrics, metrics["recipients"], metrics["donors"]):
        extra = group["extra_endpoints"] if group is metrics else group["endpoints"]
        assert set(extra) == {"private", "q", "joint"}
        for scores in extra.values():
            assert np.isfinite(scores["global_acc"]) and 0 <= scores["global_acc"] <= 100
            assert np.isfinite(scores["local_acc"]) and 0 <= scores["local_acc"] <= 100
    assert all(h["bytes"] > 0 for h in record["history"][1:])


# ----------------------------------------------------------------------------- what a recipient computes


class ExtractorSpy:
    """Counts the rows each modality's extractor reads and fails on a non-finite input (the
    missing modality is NaN: an extractor fed a missing value would be poisoned)."""

    def __init__(self, bank):
        self.rows = {name: 0 for name in bank.extractors}
        self.handles = [ex.register_forward_pre_hook(self.hook(name)) for name, ex in bank.extractors.items()]

    def hook(self, name):
        def pre(module, args):
            (x,) = args
            assert torch.isfinite(x).all(), f"the {name} extractor was fed a missing value"
            self.rows[name] += len(x)
        return pre

    def reset(self):
        self.rows = dict.fromkeys(self.rows, 0)

    def close(self):
        for h in self.handles:
            h.remove()


def test_features_of_a_missing_modality_are_absent_never_computed(fed):
    fed = fresh(fed)
    method = ready_method("fedsocket", fed, **QUICK_PARAMS)
    assert isinstance(method.bank, sp.ModalityFeatureBank) and method.bank.modalities == ("image", "signal")
    for k in range(fed.n_clients):
        c = fed.clients[k]
        rows = torch.cat([c.train_idx, c.val_idx, c.test_idx])
        present = torch.isfinite(method.feats[rows]).all(-1)  # [rows, M]
        assert present[:, 0].all()
        assert (present[:, 1] == (k not in fed.recipients)).all()
    spy = ExtractorSpy(method.bank)
    try:
        method.run_round(fed, 1, list(range(fed.n_clients)))
        for k in fed.recipients:  # a recipient's Q and Joint on its own test inputs
            x = mask(fed.data.test_x, fed.info, fed.clients[k].modalities)
            spy.reset()
            for predictor in (method.q_predictors[k], method.joint[k]):
                logits = predict_logits(predictor, x)
                assert torch.isfinite(logits).all()
            assert spy.rows["signal"] == 0 and spy.rows["image"] == 2 * len(x)
            spy.reset()
            local = fed.data.train_x[fed.clients[k].test_idx]  # its local test rows (signal NaN in the data)
            assert torch.isfinite(predict_logits(method.q_predictors[k], local)).all()
            assert spy.rows == {"image": len(local), "signal": 0}
        donor = next(k for k in range(fed.n_clients) if k not in fed.recipients)
        spy.reset()
        assert torch.isfinite(predict_logits(method.q_predictors[donor],
                                             fed.data.train_x[fed.clients[donor].test_idx])).all()
        assert spy.rows["signal"] == spy.rows["image"] > 0
    finally:
        spy.close()


def test_a_recipients_q_copy_never_touches_its_missing_modality(fed):
    fed = fresh(fed)
    p = fs.FedSocketParams(**QUICK_PARAMS)
    method = ready_method("fedsocket", fed, **QUICK_PARAMS)
    k = fed.recipients[0]
    q_copy = copy.deepcopy(method.held[k]).requires_grad_(True)
    calls = {"image": 0, "signal": 0}
    hooks = [q_copy.adapters[m].register_forward_pre_hook(
        lambda mod, args, m=m: calls.__setitem__(m, calls[m] + len(args[0]))) for m in calls]
    fs.teach_q(fed, k, 1, q_copy, method.feats, p, [])
    for h in hooks:
        h.remove()
    assert calls["signal"] == 0 and calls["image"] > 0
    before, after = method.held[k].state_dict(), q_copy.state_dict()
    for key in before:
        if sp.modality_of(key) == "signal":
            assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before["adapters.image.0.weight"], after["adapters.image.0.weight"])


# ----------------------------------------------------------------------------- the endpoints


@pytest.mark.parametrize("method_name", ["fedsocket", "naive-shared"])
def test_three_endpoints_of_a_client_read_the_same_inputs(method_name, fed):
    fed = fresh(fed)
    method = ready_method(method_name, fed, **QUICK_PARAMS)
    method.run_round(fed, 1, list(range(fed.n_clients)))
    evaluator = Evaluator(fed, fed.timer)
    figures = {name: evaluator.endpoint(predictors) for name, predictors in method.endpoints(fed).items()}
    y = fed.data.test_y
    for k in range(fed.n_clients):
        x = mask(fed.data.test_x, fed.info, fed.clients[k].modalities) if k in fed.recipients else fed.data.test_x
        private = predict_logits(fed.clients[k].model, x)
        q = predict_logits(method.q_predictors[k], x)
        joint = predict_logits(method.joint[k], x)
        # Joint is the mix of this very Private and Q output, on this very input.
        omega = method.joint[k].omega
        mixed = (1 - omega) * torch.softmax(private, -1) + omega * torch.softmax(q, -1)
        # the same float32 mixture through log and back: a few x 6e-8 on probabilities <= 1
        assert torch.allclose(joint.exp(), mixed, atol=1e-6)
        for name, logits in (("private", private), ("q", q), ("joint", joint)):
            acc = float((logits.argmax(-1) == y).float().mean()) * 100
            # the same count of correct predictions (one flip: 0.28 points) in float32 and float64:
            # the evaluator runs channels-last on the CPU, this check contiguous; a prediction flips only
            # if its top-two logits are within rounding (~1e-6), expected ~359 x 1e-6 per client
            assert figures[name]["global_acc"][k] == pytest.approx(acc, abs=1e-4), (name, k)
    # and the recipients' figures are not those of the complete inputs
    k = fed.recipients[0]
    full = predict_logits(method.q_predictors[k], fed.data.test_x)
    assert not torch.allclose(full, predict_logits(method.q_predictors[k], mask(fed.data.test_x, fed.info, ("image",))))


# ----------------------------------------------------------------------------- the conditional target


def test_donor_conditional_target_uses_the_recipient_interface():
    torch.manual_seed(0)
    q = sp.SharedPredictor(6, 8, 2, 3, ("image", "signal"))
    with torch.no_grad():  # non-zero embeddings so that each modality's block shows
        for e in q.embeddings.values():
            e.normal_()
    u = torch.randn(5, 2, 6)
    y = torch.tensor([0, 1, 2, 1, 0])
    t_soft = torch.softmax(torch.randn(5, 3), -1)
    rel = torch.tensor([1.0, 0.5, 0.25, 0.0, 0.75])
    p = fs.FedSocketParams()
    image_only = torch.tensor([True, False])
    terms = fs.q_student_terms(q, u, y, t_soft, rel, [image_only], p)
    assert len(terms) == 2

    def term(logits):
        return (torch.nn.functional.cross_entropy(logits, y, label_smoothing=p.label_smoothing)
                + p.lambda_rel * fs.weighted_kd(logits, t_soft, rel, p.temperature))

    # the first term reads the full features, the second Q on the image features only
    assert torch.allclose(terms[0], term(q(u)))
    u_image = u.clone()
    u_image[:, 1] = float("nan")
    assert torch.allclose(terms[1], term(q(u_image)))
    # which is Q run without the signal: adapter_image(u_image) + e_image, nothing of the signal
    z = q.adapters["image"](u[:, 0]) + q.embeddings["image"]
    by_hand = q.head(q.expert(z) + torch.sigmoid(q.gate) * q.up(q.down(z)))
    # the same float32 layers in another grouping: a few x 6e-8 on outputs of order 1
    assert torch.allclose(q(u_image), by_hand, atol=1e-6)
    assert not torch.allclose(terms[0], terms[1])
    # the loss is their mean, and the recipient-interface term sends no gradient to the signal block
    loss = fs.q_student_loss(q, u, y, t_soft, rel, [image_only], p)
    assert torch.allclose(loss, (terms[0] + terms[1]) / 2)
    terms[1].backward()
    assert all(prm.grad is None for prm in q.adapters["signal"].parameters()) and q.embeddings["signal"].grad is None
    assert q.adapters["image"][0].weight.grad is not None
    # without interfaces (a recipient, or any single-modality client) it is the one term
    assert torch.equal(fs.q_student_loss(q, u, y, t_soft, rel, [], p), term(q(u)))


def test_donors_and_only_donors_train_q_through_the_recipient_interface(fed):
    fed = fresh(fed)
    method = ready_method("fedsocket", fed, **QUICK_PARAMS)
    assert method.interfaces == [("image",)]
    seen = {}

    def spy(k):
        q_copy = copy.deepcopy(method.held[k]).requires_grad_(True)
        forward = q_copy.forward
        views = seen.setdefault(k, [])

        def recording(u):
            views.append(tuple(bool(b) for b in torch.isfinite(u).all(-1).all(0)))
            return forward(u)

        q_copy.forward = recording
        return q_copy

    p = method.params
    for k in range(fed.n_clients):
        interfaces = [] if k in fed.recipients else [sp.interface_mask(fed, o) for o in method.interfaces]
        fs.teach_q(fed, k, 1, spy(k), method.feats, p, interfaces)
    for k, views in seen.items():
        if k in fed.recipients:
            assert set(views) == {(True, False)}
        else:  # every batch: once on the full interface, once on the recipients' (image only)
            assert views[0::2] == [(True, True)] * (len(views) // 2)
            assert views[1::2] == [(True, False)] * (len(views) // 2)


# ----------------------------------------------------------------------------- aggregation


def _state(image, signal, head, expert):
    return {"adapters.image.0.weight": torch.full((2,), float(image)),
            "adapters.signal.0.weight": torch.full((2,), float(signal)),
            "embeddings.image": torch.full((2,), float(image)),
            "embeddings.signal": torch.full((2,), float(signal)),
            "embeddings.depth": torch.full((2,), 7.0),
            "head.bias": torch.tensor([float(head), float(head)]),
            "expert.0.weight": torch.full((2,), float(expert))}


def test_ownership_aggregation_of_modality_blocks_by_hand():
    old = _state(0, 0, 0, 0)
    old["embeddings.depth"] = torch.full((2,), 3.0)
    donor, rec_a, rec_b = _state(10, 20, 30, 40), _state(1, 99, 2, 4), _state(5, 77, 6, 8)
    n = [6, 2, 4]
    class_counts = [[3, 3], [2, 0], [0, 4]]
    modality_counts = {"image": [6, 2, 4], "signal": [6, 0, 0], "depth": [0, 0, 0]}
    new = sp.aggregate_q(old, [donor, rec_a, rec_b], n, class_counts, keep=0.5, modality_counts=modality_counts)
    # image: all three observe it, weights 6:2:4 -> (60 + 2 + 20) / 12 = 6.8333; stabilized: 3.41667
    assert new["adapters.image.0.weight"].tolist() == pytest.approx([0.5 * 82 / 12] * 2)
    assert new["embeddings.image"].tolist() == pytest.approx([0.5 * 82 / 12] * 2)
    # signal: only the donor observes it (the recipients' untouched copies, 99 and 77, are left out)
    assert new["adapters.signal.0.weight"].tolist() == pytest.approx([10.0, 10.0])
    assert new["embeddings.signal"].tolist() == pytest.approx([10.0, 10.0])
    # a modality nobody observes keeps its block
    assert torch.equal(new["embeddings.depth"], old["embeddings.depth"])
    # head rows over the holders: class 0 held by donor (6) and rec_a (2): (180 + 4) / 8 = 23; class 1
    # by donor (6) and rec_b (4): (180 + 24) / 10 = 20.4
    assert new["head.bias"].tolist() == pytest.approx([0.5 * 23, 0.5 * 20.4])
    # the rest sample-weighted over all: (240 + 8 + 32) / 12
    assert new["expert.0.weight"].tolist() == pytest.approx([0.5 * 280 / 12] * 2)


def test_naive_average_is_plain_fedavg_of_every_block():
    old = _state(0, 0, 0, 0)
    donor, rec_a, rec_b = _state(10, 20, 30, 40), _state(1, 99, 2, 4), _state(5, 77, 6, 8)
    new = sp.aggregate_q(old, [donor, rec_a, rec_b], [6, 2, 4], keep=0.0)
    assert new["adapters.image.0.weight"].tolist() == pytest.approx([82 / 12] * 2)
    assert new["adapters.signal.0.weight"].tolist() == pytest.approx([(120 + 198 + 308) / 12] * 2)
    assert new["head.bias"].tolist() == pytest.approx([(180 + 4 + 24) / 12] * 2)
    assert new["embeddings.depth"].tolist() == pytest.approx([7.0, 7.0])


def test_uploads_carry_modality_counts_as_counts(fed):
    fed = fresh(fed)
    method = ready_method("fedsocket", fed, **QUICK_PARAMS)
    sent_before = fed.channel.sent.copy()
    method.run_round(fed, 1, list(range(fed.n_clients)))
    q_bytes = payload_bytes(method.phi)
    counts_bytes = 8 + 8 * fed.num_classes + 8 * 2  # sample count, class counts, two modality counts
    assert (fed.channel.sent - sent_before).tolist() == [q_bytes + counts_bytes] * fed.n_clients
    n_q = sum(v.numel() for v in method.phi.values())
    single = sum(v.numel() for v in sp.SharedPredictor(256, 256, 32, 10).state_dict().values())
    assert n_q - single == 256 * 256 + 256 + 2 * 256 + 256  # a second adapter and embedding


# ----------------------------------------------------------------------------- the control


def test_naive_shared_trains_plainly_and_sends_q_and_count_only(fed):
    fed = fresh(fed)
    method = ready_method("naive-shared", fed, **QUICK_PARAMS)
    before = {k: v.clone() for k, v in method.phi.items()}
    sent_before = fed.channel.sent.copy()
    out = method.run_round(fed, 1, list(range(fed.n_clients)))
    assert np.isfinite(out["q_loss"]) and np.isfinite(out["private_loss"])
    assert (fed.channel.sent - sent_before).tolist() == [payload_bytes(method.phi) + 8] * fed.n_clients
    # every block is averaged over every upload, the recipients' untouched signal blocks included
    assert not torch.equal(before["adapters.signal.0.weight"], method.phi["adapters.signal.0.weight"])


def test_naive_shared_runs_on_a_single_modality_task():
    fed = tiny_federation("digits", 4, pretrain_size=PRETRAIN)
    method = ready_method("naive-shared", fed, **QUICK_PARAMS)
    assert type(method.bank) is sp.FeatureBank
    out = method.run_round(fed, 1, [0, 1, 2, 3])
    assert np.isfinite(out["q_loss"])
    for predictors in method.endpoints(fed).values():
        assert torch.isfinite(predict_logits(predictors[0], fed.data.test_x)).all()


def test_same_q_init_features_and_batch_orders_as_fedsocket(fed):
    a = ready_method("fedsocket", fresh(fed), warmup_epochs=0, local_epochs=1, pretrain_steps=50)
    b = ready_method("naive-shared", fresh(fed), warmup_epochs=0, local_epochs=1, pretrain_steps=50)
    assert all(torch.equal(a.phi[k], b.phi[k]) for k in a.phi)
    assert torch.equal(a.feats.nan_to_num(), b.feats.nan_to_num())
    assert torch.equal(a.feats.isnan(), b.feats.isnan())


def test_naive_shared_bad_settings_are_rejected():
    for bad in ({"extractor": "resnet18"}, {"endpoint": "q"}, {"rho_grid": "1,x"}, {"warmup_epochs": -1},
                {"q_lr": 0.0}):
        with pytest.raises(ConfigError, match="naive-shared"):
            ns.NaiveShared(ns.NaiveSharedParams(**bad)).check(None)
    assert ns.NaiveShared.card.missing_modalities and fs.FedSocket.card.missing_modalities


# ----------------------------------------------------------------------------- resume


def test_multimodal_fedsocket_resumes_to_the_same_record(tmp_path):
    values = dict(method="fedsocket", task=TASK, clients=4, rounds=3, seed=0, checkpoint_every=2, out=str(tmp_path),
                  method_params={"warmup_epochs": "1", "local_epochs": "1", "pretrain_steps": "50"}, local_epochs=1,
                  batch_size=64, pretrain_size=PRETRAIN)
    cfg = engine.load_task(RunConfig(**values))[1]
    full = records.build_record(cfg, engine.run(cfg))
    resumed = records.build_record(cfg, engine.run(cfg, resume=True))
    assert resumed["federation"]["resumed_from_rounds"] == [2]
    for key in ("status", "metrics", "selection"):
        assert full[key] == resumed[key], key
    strip = lambda h: [{k: v for k, v in e.items() if k not in ("seconds", "phases")} for e in h]  # noqa: E731
    assert strip(full["history"]) == strip(resumed["history"])
