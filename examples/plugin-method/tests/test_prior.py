"""The tutorial plugin's own tests, written against ``hfl_bench.testing`` (installed with hfl-bench)."""

import importlib.metadata
import math

import torch

from hfl_bench.testing import ready_method, run_record, tiny_federation
from hfl_bench_prior.method import prior_loss


def test_the_loss_by_hand():
    logits, y = torch.zeros(2, 2), torch.tensor([0, 1])  # uniform predictions: CE = log 2
    assert math.isclose(prior_loss(logits, y, torch.tensor([0.5, 0.5]), 1.0).item(), math.log(2), rel_tol=1e-6)
    # KL([0.75, 0.25] || [0.5, 0.5]) = 0.75 log 1.5 + 0.25 log 0.5
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    got = prior_loss(logits, y, torch.tensor([0.75, 0.25]), 2.0).item()
    assert math.isclose(got, math.log(2) + 2 * kl, rel_tol=1e-6)


def test_one_round_sends_the_counts_up_and_the_prior_down():
    fed = tiny_federation("digits", clients=4)
    method = ready_method("example-prior", fed, lam=0.5)
    sent_before = fed.channel.total
    result = method.run_round(fed, 1, [0, 1, 2, 3])
    assert 0 < result["train_loss"] < 10
    counts = sum(torch.as_tensor(fed.clients[c].train_counts, dtype=torch.float32) for c in range(4))
    assert torch.allclose(method.prior.cpu(), counts / counts.sum())
    # 4 uploads of C float32 counts and one prior to each of the 4 clients
    assert fed.channel.total - sent_before == 8 * fed.num_classes * 4


def test_cli_run_records_the_plugin(tmp_path):
    record = run_record("--method", "example-prior", "--task", "digits", "--rounds", "2", "--clients", "4",
                        out=tmp_path)
    assert record["method"]["fidelity"] == "original" and record["status"] == "ok"
    ours = [p for p in record["plugins"] if p["dist"] == "hfl-bench-prior-example"]
    assert [p["kind"] for p in ours] == ["method"]
    assert ours[0]["version"] == importlib.metadata.version("hfl-bench-prior-example")
    assert record["cost"]["bytes_sent_per_client_per_round"] > 0
