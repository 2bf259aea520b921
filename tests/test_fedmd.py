"""FedMD: CLI record, the public-set requirement, transfer learning, the digest step moving a model
toward the consensus, and metering (an all-to-all broadcast of the M x C logit matrix)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import ConfigError
from hfl_bench.families.fedmd_exchange import consensus, digest, make_digest_optimizers
from hfl_bench.families.transfer import transfer_logits
from hfl_bench.methods.fedmd import FedMD, FedMDParams
from hfl_bench.training import predict_logits

from helpers import cpu_federation, ready_method, record_sends

PUBLIC = 100


def build(cfg):
    return cpu_federation(cfg)


def method(fed, **params) -> FedMD:
    return ready_method(FedMD, fed, **params)


def test_cli_two_rounds_writes_a_valid_record(run_record):
    record = run_record("--method", "fedmd", "--task", "digits", "--clients", "4", "--rounds", "2",
                        "--public-size", str(PUBLIC))
    assert record["status"] == "ok" and record["method"]["name"] == "fedmd"
    assert record["method"]["fidelity"] == "paper"
    assert record["federation"]["topology"] == "p2p"
    assert record["partition"]["public_size"] == PUBLIC
    hp = record["method"]["hparams"]
    assert hp["digest_loss"] == "l1" and hp["digest_lr"] == 1e-3 and hp["transfer_epochs"] == 5
    assert any("L1 on logits" in n for n in record["method"]["notes"])
    # 4 clients, each sends its [100, 10] float32 logits to 3 peers
    assert [h["bytes"] for h in record["history"][1:]] == [4 * 3 * PUBLIC * 10 * 4] * 2
    assert all(h["digest_loss"] > 0 and h["train_loss"] > 0 for h in record["history"][1:])


def test_without_a_public_set_the_cli_names_the_option(tmp_path):
    result = CliRunner().invoke(app, ["run", "--method", "fedmd", "--task", "digits", "--clients", "4",
                                      "--rounds", "1", "--out", str(tmp_path), "-q"])
    assert result.exit_code == 2
    assert "--public-size" in result.output


def test_bad_digest_loss_is_rejected(tiny_cfg):
    fed = build(tiny_cfg(public_size=PUBLIC))
    with pytest.raises(ConfigError, match="digest_loss"):
        FedMD(FedMDParams(digest_loss="mse")).check(fed)


def test_transfer_learning_fits_the_labeled_public_set(tiny_cfg):
    fed = build(tiny_cfg(public_size=PUBLIC))
    before = [predict_logits(c.model, fed.public_x) for c in fed.clients]
    method(fed, private_init_epochs=0, transfer_epochs=20)
    for c, old in zip(fed.clients, before):
        acc = (predict_logits(c.model, fed.public_x).argmax(1) == fed.public_y).float().mean()
        assert acc > 0.5 > (old.argmax(1) == fed.public_y).float().mean(), c.arch.name


@pytest.mark.parametrize("loss", ["l1", "kl"])
def test_digest_moves_public_logits_toward_the_consensus(tiny_cfg, loss):
    fed = build(tiny_cfg(public_size=PUBLIC))
    m = method(fed, digest_loss=loss, digest_epochs=3, transfer_epochs=1, private_init_epochs=1)
    x = fed.public_x
    target = consensus(transfer_logits(fed, {i: c.model for i, c in enumerate(fed.clients)}, x))
    before = predict_logits(fed.clients[1].model, x)
    out = digest(fed, 1, m.digest_opts[1], x, target, m.params, rnd=1)
    after = predict_logits(fed.clients[1].model, x)
    assert out > 0
    if loss == "l1":  # the official loss: the mean absolute logit gap shrinks
        assert (after - target).abs().mean() < 0.8 * (before - target).abs().mean()
    else:  # KL is blind to a per-sample logit shift: the softened distributions get closer
        def kl(z):
            return torch.nn.functional.kl_div((z / 2).log_softmax(-1), (target / 2).softmax(-1), reduction="batchmean")
        assert kl(after) < 0.8 * kl(before)


def test_consensus_is_the_mean_of_the_active_clients_logits():
    logits = {0: torch.tensor([[1.0, 2.0]]), 3: torch.tensor([[3.0, -2.0]])}
    assert torch.equal(consensus(logits), torch.tensor([[2.0, 0.0]]))


@pytest.mark.parametrize("alignment_size", [0, 30])
def test_bytes_per_round_are_the_all_to_all_logit_broadcast(tiny_cfg, monkeypatch, alignment_size):
    fed = build(tiny_cfg(clients=5, public_size=PUBLIC))
    m = method(fed, transfer_epochs=1, private_init_epochs=0, alignment_size=alignment_size)
    sends = record_sends(fed, monkeypatch)
    active = [0, 2, 3]
    fed.channel.start_round()
    out = m.run_round(fed, 1, active)
    M = alignment_size or PUBLIC
    per_matrix = M * fed.num_classes * 4
    assert int(fed.channel.sent.sum() + fed.channel.server_sent) == len(active) * (len(active) - 1) * per_matrix
    assert fed.channel.sent.tolist() == [2 * per_matrix, 0, 2 * per_matrix, 2 * per_matrix, 0]
    assert fed.channel.server_sent == 0
    assert sorted(sends) == [(0, [2, 3]), (2, [0, 3]), (3, [0, 2])]
    assert set(out) == {"train_loss", "digest_loss"}


def test_digest_optimizers_are_adam_kept_per_client(tiny_cfg):
    fed = build(tiny_cfg(public_size=PUBLIC))
    m = method(fed, transfer_epochs=0, private_init_epochs=0)
    assert len(m.digest_opts) == fed.n_clients
    assert all(isinstance(o, torch.optim.Adam) and o.param_groups[0]["lr"] == 1e-3 for o in m.digest_opts)
    first = m.digest_opts
    m.run_round(fed, 1, [0, 1])
    assert m.digest_opts is first and len(first[0].state) > 0 and len(first[2].state) == 0
    assert make_digest_optimizers(fed, 0.5)[0].param_groups[0]["lr"] == 0.5
