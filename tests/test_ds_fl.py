"""DS-FL: entropy-reduction averaging by hand, the distillation target each client gets (the ERA
of every active client's prediction after its private step), the unlabeled public set, the
upload / broadcast metering, the plain ensemble as its server predictor, and the 2-round CLI
record with a bad setting as one line."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import RunConfig
from hfl_bench.federation import Federation
from hfl_bench.metering import SERVER
from hfl_bench.methods import ds_fl
from hfl_bench.methods.ds_fl import DSFL, DSFLParams, era
from hfl_bench.training import kd_loss, predict_logits

from helpers import cpu_federation


def build(**overrides):
    return cpu_federation(RunConfig(**{"task": "digits", "method": "ds-fl", "clients": 4, "rounds": 2, "seed": 0,
                                        "public_size": 60, **overrides}))


def test_era_is_the_mean_sharpened_by_a_softmax_at_t_by_hand():
    probs = torch.tensor([[[0.7, 0.2, 0.1]], [[0.1, 0.6, 0.3]]])  # 2 clients, 1 sample, 3 classes
    mean = [0.4, 0.4, 0.2]
    expected = [math.exp(m / 0.1) / sum(math.exp(v / 0.1) for v in mean) for m in mean]  # e^4, e^4, e^2
    assert era(probs, 0.1)[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert expected[2] == pytest.approx(1 / (2 * math.e**2 + 1), abs=1e-9)

    def entropy(p):
        return float(-(p * p.log()).sum())

    assert entropy(era(probs, 0.1)[0]) < entropy(probs.mean(0)[0])  # lower entropy: the point of ERA
    assert era(probs, 1e6)[0].tolist() == pytest.approx([1 / 3] * 3, abs=1e-5)  # a hot softmax flattens


def test_each_client_distills_toward_the_era_of_the_active_clients_after_their_private_step(monkeypatch):
    fed = build()
    method = DSFL(DSFLParams())
    method.check(fed)
    method.setup(fed)

    def forbidden(self):
        raise AssertionError("ds-fl read the public labels")

    monkeypatch.setattr(Federation, "public_y", property(forbidden))
    active, seen = [0, 2, 3], []
    uploads, send = {}, fed.channel.send

    def spy(src, dsts, payload, kind):
        if dsts == SERVER:
            uploads[src] = payload.clone()
        return send(src, dsts, payload, kind)

    def fake_distill(fed_, model, opt, x, loss_fn, *, epochs, seed_parts, who):
        # nobody has distilled yet (this stand-in trains nothing): the target is the ERA of the
        # active models' softmaxes on the public set as they are now, after their private CE
        probs = torch.stack([torch.softmax(predict_logits(fed.clients[c].model, x), -1) for c in active])
        expected = era(probs, 0.1)
        z, pos = torch.randn(7, 10, generator=torch.Generator().manual_seed(len(seen))), torch.arange(5, 12)
        assert torch.allclose(loss_fn(z, pos), kd_loss(z, expected[pos], 1.0), atol=1e-6)
        seen.append((model, epochs, seed_parts))
        return 0.5

    monkeypatch.setattr(fed.channel, "send", spy)
    monkeypatch.setattr(ds_fl, "train_on_transfer", fake_distill)
    before = {c: [p.detach().clone() for p in fed.clients[c].model.parameters()] for c in range(4)}
    fed.channel.start_round()
    out = method.run_round(fed, 1, active)
    assert [s[0] for s in seen] == [fed.clients[c].model for c in active]
    assert [s[2] for s in seen] == [("ds-fl", 1, c) for c in active] and {s[1] for s in seen} == {1}
    payload = 60 * 10 * 4  # M x C float32
    assert sorted(uploads) == active and fed.channel.sent.tolist() == [payload, 0, payload, payload]
    assert fed.channel.server_sent == 3 * payload  # the target, to the round's active clients
    for c in active:
        assert torch.allclose(uploads[c].sum(-1), torch.ones(60))
    assert out["distill_loss"] == 0.5 and out["train_loss"] > 0 and 0 <= out["target_entropy"] < math.log(10)
    changed = [c for c in range(4)
               if any(not torch.equal(a, b) for a, b in zip(before[c], fed.clients[c].model.parameters()))]
    assert changed == active


def test_plain_mean_aggregation_is_the_sa_ablation(monkeypatch):
    fed = build()
    method = DSFL(DSFLParams(aggregation="mean", distill_epochs=0))
    method.setup(fed)
    got = []
    send = fed.channel.send

    def spy(src, dsts, payload, kind):
        if src == SERVER:
            got.append(payload.clone())
        return send(src, dsts, payload, kind)

    monkeypatch.setattr(fed.channel, "send", spy)
    uploads = {}
    real_upload = ds_fl.upload

    def keep(fed_, outputs, kind):
        uploads.update(outputs)
        return real_upload(fed_, outputs, kind)

    monkeypatch.setattr(ds_fl, "upload", keep)
    fed.channel.start_round()
    method.run_round(fed, 1, [0, 1])
    assert torch.allclose(got[0], (uploads[0] + uploads[1]) / 2)


def test_cli_record_with_the_plain_ensemble_and_a_bad_setting_is_one_line(run_record, tmp_path):
    record = run_record("--method", "ds-fl", "--task", "digits", "--clients", "4", "--rounds", "2",
                        "--public-size", "100", "--ensemble")
    assert record["status"] == "ok" and record["method"]["name"] == "ds-fl"
    assert (record["method"]["fidelity"], record["federation"]["topology"]) == ("reconstructed", "server")
    assert record["method"]["transfer"] == "public-unlabelled"
    assert record["method"]["hparams"] == {"aggregation": "era", "era_temperature": 0.1, "distill_epochs": 1}
    for h in record["history"][1:]:
        assert {"distill_loss", "target_entropy"} <= set(h)
        assert h["bytes"] == 2 * 4 * 100 * 10 * 4  # 4 uploads and 4 broadcast copies of 100 x 10 float32
    assert "ensemble" in record["metrics"]["extra_endpoints"] and "ensemble" in record["history"][-1]["endpoints"]
    result = CliRunner().invoke(app, ["run", "--method", "ds-fl", "--task", "digits", "--public-size", "100",
                                      "--set", "aggregation=median", "--out", str(tmp_path / "bad")])
    assert result.exit_code == 2
    assert "ds-fl: aggregation must be one of era, mean, got 'median'" in result.output
