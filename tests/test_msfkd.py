"""MSFKD: per-sample confident-teacher selection (with its fallback, never the student's own
prediction), the confidence read from the sent p_T, the unlabeled public set, the all-to-all
metering and the 2-round CLI record."""

from __future__ import annotations

import pytest
import torch

from hfl_bench import engine
from hfl_bench.config import RunConfig
from hfl_bench.federation import Federation
from hfl_bench.methods.msfkd import MSFKD, MSFKDParams, confidence, select_targets

from helpers import cpu_federation


def build(**overrides):
    return cpu_federation(RunConfig(**{"task": "digits", "method": "msfkd", "clients": 4, "rounds": 2, "seed": 0,
                                        "public_size": 60, **overrides}))


def test_selection_rule_on_a_hand_made_case():
    # 3 clients, 3 public samples, 2 classes; rows are the clients' predictions.
    soft = torch.tensor([
        [[0.9, 0.1], [0.6, 0.4], [0.5, 0.5]],  # client 0
        [[0.2, 0.8], [0.3, 0.7], [0.5, 0.5]],  # client 1
        [[0.4, 0.6], [0.1, 0.9], [0.5, 0.5]],  # client 2
    ])
    confident = torch.tensor([
        [True, True, False],
        [True, False, False],
        [False, True, False],  # sample 2: nobody passes -> fallback
    ])
    targets, n_kept, fallback = select_targets(soft, confident)
    expected = torch.tensor([
        # student 0: sample 0 -> client 1 only; sample 1 -> client 2 only; sample 2 -> fallback mean(1, 2)
        [[0.2, 0.8], [0.1, 0.9], [0.5, 0.5]],
        # student 1: sample 0 -> client 0; sample 1 -> mean(0, 2); sample 2 -> fallback mean(0, 2)
        [[0.9, 0.1], [0.35, 0.65], [0.5, 0.5]],
        # student 2: sample 0 -> mean(0, 1); sample 1 -> client 0; sample 2 -> fallback mean(0, 1)
        [[0.55, 0.45], [0.6, 0.4], [0.5, 0.5]],
    ])
    assert torch.allclose(targets, expected)
    assert n_kept.tolist() == [[1, 1, 2], [1, 2, 2], [2, 1, 2]]
    assert fallback.tolist() == [[False, False, True]] * 3


def test_fallback_when_no_peer_passes_even_if_the_student_itself_does():
    # Only client 0 is confident on the sample: its peers 1 and 2 are not, so student 0 falls back
    # to the mean of its peers; students 1 and 2 use client 0 alone.
    soft = torch.tensor([[[1.0, 0.0]], [[0.2, 0.8]], [[0.4, 0.6]]])
    confident = torch.tensor([[True], [False], [False]])
    targets, n_kept, fallback = select_targets(soft, confident)
    assert torch.allclose(targets[0, 0], torch.tensor([0.3, 0.7]))
    assert torch.allclose(targets[1, 0], soft[0, 0]) and torch.allclose(targets[2, 0], soft[0, 0])
    assert fallback[:, 0].tolist() == [True, False, False]
    assert n_kept[:, 0].tolist() == [2, 1, 1]


def test_no_student_target_uses_its_own_prediction():
    gen = torch.Generator().manual_seed(0)
    k, m, c = 5, 40, 7
    soft = torch.softmax(torch.randn(k, m, c, generator=gen) * 3, dim=-1)
    confident = torch.rand(k, m, generator=gen) > 0.5
    targets, _, _ = select_targets(soft, confident)
    for s in range(k):  # a reference written the slow way, one sample at a time
        for j in range(m):
            peers = [t for t in range(k) if t != s]
            kept = [t for t in peers if confident[t, j]] or peers
            # a float32 mean of <= 4 probabilities in another order: <= 4 x 6e-8 < 1e-6
            assert torch.allclose(targets[s, j], soft[kept, j].mean(0), atol=1e-6)
    # changing a student's own prediction never changes its target
    changed = soft.clone()
    changed[2] = torch.softmax(torch.randn(m, c, generator=gen), dim=-1)
    assert torch.equal(select_targets(changed, confident)[0][2], targets[2])


def test_confidence_is_max_softmax_at_t1_recovered_from_the_sent_p_T():
    z = torch.tensor([[2.0, 0.0, -1.0], [0.1, 0.2, 0.3]])
    for t in (1.0, 2.0, 4.0):
        sent = torch.softmax(z / t, dim=-1)
        # the same softmax maximum through another float32 path: a few x 6e-8 on values <= 1
        assert torch.allclose(confidence(sent, t), torch.softmax(z, dim=-1).amax(-1), atol=1e-6)


def test_round_never_reads_public_labels_and_meters_all_to_all(monkeypatch):
    fed = build()
    method = MSFKD(MSFKDParams())
    method.check(fed)
    method.setup(fed)

    def forbidden(self):
        raise AssertionError("msfkd read the public labels")

    monkeypatch.setattr(Federation, "public_y", property(forbidden))
    before = {cid: [p.detach().clone() for p in fed.clients[cid].model.parameters()] for cid in range(4)}
    active = [0, 1, 3]
    fed.channel.start_round()
    out = method.run_round(fed, 1, active)
    assert {"train_loss", "distill_loss", "kept_teacher_share", "fallback_rate"} <= set(out)
    # each active client sends its 60 x 10 float32 p_T to the 2 other active clients
    assert fed.channel.sent.tolist() == [2 * 60 * 10 * 4, 2 * 60 * 10 * 4, 0, 2 * 60 * 10 * 4]
    assert fed.channel.server_sent == 0
    changed = [cid for cid in range(4)
               if any(not torch.equal(a, b) for a, b in zip(before[cid], fed.clients[cid].model.parameters()))]
    assert changed == active


def test_single_active_client_skips_distillation():
    fed = build()
    method = MSFKD(MSFKDParams())
    method.setup(fed)
    out = method.run_round(fed, 1, [2])
    assert "distill_loss" not in out and out["train_loss"] > 0


def test_cli_two_rounds_writes_a_valid_record(run_record):
    record = run_record("--method", "msfkd", "--task", "digits", "--clients", "4", "--rounds", "2",
                        "--public-size", "100")
    assert record["status"] == "ok" and record["method"]["name"] == "msfkd"
    assert record["method"]["fidelity"] == "reconstructed"
    assert record["federation"]["topology"] == "p2p"
    assert record["partition"]["public_size"] == 100
    assert any("own prediction is never a candidate" in n for n in record["method"]["notes"])
    assert record["method"]["hparams"] == {"tau": 0.5, "temperature": 2.0, "distill_epochs": 1, "local_epochs": 0}
    for h in record["history"][1:]:
        assert "distill_loss" in h and "fallback_rate" in h
        assert h["bytes"] == 4 * 3 * 100 * 10 * 4  # 4 clients x 3 peers x (100 x 10 float32)


def test_needs_a_public_set():
    with pytest.raises(Exception, match="--public-size"):
        engine.make_method(RunConfig(task="digits", method="msfkd"))
