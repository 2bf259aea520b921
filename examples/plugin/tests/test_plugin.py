"""The example plugin's own tests, written against ``hfl_bench.testing`` (installed with hfl-bench)."""

import importlib.metadata

import torch

from hfl_bench.aggregation import get_aggregator
from hfl_bench.data import get_task
from hfl_bench.testing import ready_method, run_record, tiny_federation


def test_median_rule_by_hand():
    # 4 teachers, 1 sample; medians: class 0 (0.5 + 0.6) / 2, class 1 (0.4 + 0.5) / 2; they sum to 1 already
    probs = torch.tensor([[[0.6, 0.4]], [[0.2, 0.8]], [[0.5, 0.5]], [[0.9, 0.1]]])
    assert torch.allclose(get_aggregator("example-median")(probs), torch.tensor([[0.55, 0.45]]))
    ignores_extras = get_aggregator("example-median", min_support=2)  # what crad's --set aggregator= passes
    assert torch.allclose(ignores_extras(probs[:3]), torch.tensor([[0.5, 0.5]]))


def test_task_is_seeded_and_shaped():
    a, b = get_task("example-blobs").load(), get_task("example-blobs").load()
    assert a.train_x.shape == (800, 1, 8, 8) and len(a.test_y) == 200 and torch.equal(a.train_x, b.train_x)


def test_one_round_trains_every_active_client():
    fed = tiny_federation("example-blobs", clients=4)
    assert 0 < ready_method("example-kd", fed, lam=0.3).run_round(fed, 1, [0, 1, 2, 3])["train_loss"] < 10


def test_cli_run_records_the_plugin(tmp_path):
    record = run_record("--method", "example-kd", "--task", "example-blobs", "--rounds", "2", out=tmp_path)
    assert record["method"]["fidelity"] == "original" and record["status"] == "ok"
    ours = {p["kind"]: p for p in record["plugins"] if p["dist"] == "hfl-bench-example-plugin"}
    assert set(ours) == {"method", "task", "aggregator"}
    assert ours["method"]["version"] == importlib.metadata.version("hfl-bench-example-plugin")
