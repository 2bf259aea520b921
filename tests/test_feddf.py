"""FedDF: with no distillation step it is FedAvg within each architecture (by hand, from what the
clients uploaded), the teacher is the mean of every active client's logits (by hand on a tiny case,
and what the distillation gets in a real round), early stopping keeps the best held-out model,
the public labels are never read, and the CLI and Python API run it on digits (heterogeneous and
one-architecture pools) and refuse a missing public set or a bad setting in one line."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import hfl_bench
from hfl_bench.cli import app
from hfl_bench.federation import Federation
from hfl_bench.metering import SERVER
from hfl_bench.methods import feddf
from hfl_bench.methods.feddf import architecture_groups, batches, ensemble_teacher, split_public
from hfl_bench.testing import ready_method, tiny_federation
from hfl_bench.training import predict_logits


def spy_uploads(monkeypatch, fed):
    uploads, send = {}, fed.channel.send

    def spy(src, dsts, payload, kind):
        got = send(src, dsts, payload, kind)
        if dsts == SERVER:
            uploads[src] = {k: v.clone() for k, v in got.items()}
        return got

    monkeypatch.setattr(fed.channel, "send", spy)
    return uploads


def test_the_teacher_is_the_mean_of_the_clients_logits_by_hand():
    a = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])
    b = torch.tensor([[3.0, 0.0, -1.0], [2.0, 4.0, 0.0]])
    c = torch.tensor([[2.0, 1.0, 1.0], [1.0, -1.0, 3.0]])
    assert ensemble_teacher([a, b]).tolist() == [[2.0, 1.0, 1.0], [1.0, 2.0, 3.0]]
    assert ensemble_teacher([a, b, c]).tolist() == [[2.0, 1.0, 1.0], [1.0, 1.0, 3.0]]


def test_zero_distillation_steps_is_fedavg_within_each_architecture(monkeypatch):
    fed = tiny_federation(clients=6, public_size=60)  # pool cpu: mlp, cnn, resnet, mlp, cnn, resnet
    method = ready_method("feddf", fed, distill_steps=0)
    groups = architecture_groups(fed)
    assert list(groups.values()) == [[0, 3], [1, 4], [2, 5]]
    for cids in groups.values():  # one starting model per prototype
        assert all(torch.equal(a, b) for a, b in zip(fed.clients[cids[0]].model.state_dict().values(),
                                                     fed.clients[cids[1]].model.state_dict().values()))
    uploads = spy_uploads(monkeypatch, fed)
    fed.channel.start_round()
    active = [0, 1, 3, 4]  # resnet's clients sit the round out
    before_resnet = {k: v.clone() for k, v in fed.clients[2].model.state_dict().items()}
    out = method.run_round(fed, 1, active)
    assert sorted(uploads) == active and "distill_loss" not in out
    for i, j in ((0, 3), (1, 4)):
        ni, nj = fed.clients[i].n_train, fed.clients[j].n_train
        assert ni != nj  # the weighting is exercised
        for key, got in fed.clients[i].model.state_dict().items():
            a, b = uploads[i][key], uploads[j][key]
            if got.is_floating_point():
                want = (ni * a.double() + nj * b.double()) / (ni + nj)
                assert torch.allclose(got.double(), want, atol=1e-6), key
            assert torch.equal(got, fed.clients[j].model.state_dict()[key])
    for key, value in fed.clients[2].model.state_dict().items():  # no active client: unchanged
        assert torch.equal(value, before_resnet[key])
    assert method.changed_clients(fed, active) == [0, 1, 3, 4]


def test_one_architecture_pool_with_zero_steps_is_plain_fedavg(monkeypatch):
    fed = tiny_federation(clients=3, public_size=60, pool="cpu-cnn")
    method = ready_method("feddf", fed, distill_steps=0)
    assert list(architecture_groups(fed).values()) == [[0, 1, 2]]
    uploads = spy_uploads(monkeypatch, fed)
    fed.channel.start_round()
    method.run_round(fed, 1, [0, 1, 2])
    n = [fed.clients[i].n_train for i in range(3)]
    key = next(k for k, v in uploads[0].items() if v.is_floating_point())
    want = sum(n[i] * uploads[i][key].double() for i in range(3)) / sum(n)
    for c in fed.clients:
        assert torch.allclose(c.model.state_dict()[key].double(), want, atol=1e-6)


def test_each_prototype_distils_the_mean_logits_of_every_active_model(monkeypatch):
    fed = tiny_federation(clients=4, public_size=60)
    method = ready_method("feddf", fed, distill_steps=3)

    def forbidden(self):
        raise AssertionError("feddf read the public labels")

    monkeypatch.setattr(Federation, "public_y", property(forbidden))
    uploads = spy_uploads(monkeypatch, fed)
    seen = []

    def fake_distill(self, fed_, rnd, name, student, x, teacher):
        seen.append((name, teacher.clone()))
        return 0.25, 3

    monkeypatch.setattr(feddf.FedDF, "distill", fake_distill)
    active = [0, 1, 2]
    fed.channel.start_round()
    out = method.run_round(fed, 1, active)
    assert [name for name, _ in seen] == ["mlp_small", "cnn_small", "resnet_tiny"]
    logits = []
    for cid in active:  # each uploaded model, rebuilt: its logits on the public set
        model = feddf.new_model(fed, fed.clients[cid].arch, "check", cid)
        model.load_state_dict(uploads[cid])
        logits.append(predict_logits(model, fed.public_x))
    want = torch.stack(logits).mean(0)
    for _, teacher in seen:
        assert torch.allclose(teacher, want, atol=1e-5)
    assert out["distill_loss"] == 0.25 and out["distill_steps"] == 3


def test_distillation_keeps_the_best_held_out_model_and_stops_early():
    fed = tiny_federation(clients=2, public_size=50, pool="cpu-cnn")
    method = ready_method("feddf", fed, distill_steps=400, eval_every=2, patience=4, val_fraction=0.2)
    student = feddf.new_model(fed, fed.clients[0].arch, "student")
    teacher = predict_logits(feddf.new_model(fed, fed.clients[0].arch, "teacher"), fed.public_x) * 5
    x = fed.public_x
    _, val = split_public(len(x), 0.2, feddf.derive_seed(fed.cfg.seed, "feddf-split"))
    assert len(val) == 10
    targets = feddf.soft_targets(teacher, 1.0)
    start = method.held_out_loss(student, x[val], targets[val], 1.0)
    server = fed.budget.steps[-1].sum()
    loss, steps = method.distill(fed, 1, "cnn_small", student, x, teacher)
    assert steps < 400 and loss > 0  # stopped early
    assert fed.budget.steps[-1].sum() - server == steps  # counted as the server's work
    end = method.held_out_loss(student, x[val], targets[val], 1.0)
    assert end < start


def test_split_and_batches_are_seeded_and_cover_the_set():
    train, val = split_public(10, 0.2, 7)
    assert sorted(train.tolist() + val.tolist()) == list(range(10)) and len(val) == 2
    assert split_public(10, 0.2, 7)[1].tolist() == val.tolist()
    assert len(split_public(1, 0.2, 7)[1]) == 0 and len(split_public(5, 0.0, 7)[1]) == 0
    it = batches(7, 3, 1)
    epoch = [next(it) for _ in range(2)]  # 3 + 4: a trailing single sample joins the batch before
    assert [len(b) for b in epoch] == [3, 4] and sorted(torch.cat(epoch).tolist()) == list(range(7))


def test_cli_runs_on_a_heterogeneous_pool_and_the_api_on_one_architecture(run_record, tmp_path):
    record = run_record("--method", "feddf", "--task", "digits", "--clients", "4", "--rounds", "2",
                        "--public-size", "100", "--set", "distill_steps=10", "--set", "eval_every=5")
    assert record["status"] == "ok" and record["method"]["name"] == "feddf"
    assert (record["method"]["fidelity"], record["federation"]["topology"]) == ("reconstructed", "server")
    assert record["method"]["transfer"] == "public-unlabelled"
    assert record["method"]["hparams"]["distill_steps"] == 10
    for h in record["history"][1:]:
        assert {"train_loss", "distill_loss", "distill_steps"} <= set(h)
        assert 0 < h["distill_steps"] <= 10
    api = hfl_bench.run(method="feddf", task="digits", clients=3, rounds=1, public_size=60, pool="cpu-cnn",
                        method_params={"distill_steps": 4}, out=str(tmp_path / "api"))
    assert api.status == "ok"


def test_refusals_are_one_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["run", "--method", "feddf", "--task", "digits", "--out", str(tmp_path / "a")])
    assert result.exit_code == 2
    assert "method feddf needs a public transfer set: pass --public-size N" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = runner.invoke(app, ["run", "--method", "feddf", "--task", "digits", "--public-size", "60",
                                 "--set", "val_fraction=1", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2
    assert "feddf: val_fraction must be in [0, 1), got 1" in result.output


@pytest.mark.parametrize("bad", ["distill_steps=-1", "temperature=0", "eval_every=0"])
def test_bad_hyperparameters_are_refused(bad, tmp_path):
    result = CliRunner().invoke(app, ["run", "--method", "feddf", "--task", "digits", "--public-size", "60",
                                      "--set", bad, "--out", str(tmp_path / "c")])
    assert result.exit_code == 2 and "feddf" in result.output
