"""The public transfer set (--public-size): a stratified hold-out taken before partitioning."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hfl_bench.cli import app
from hfl_bench.config import ConfigError, RunConfig, config_hash, recorded_config
from hfl_bench.data import TaskData
from hfl_bench.engine import load_task, make_method, partition_for
from hfl_bench.partition import PartitionError, hold_out_public, make_partition

REPRODUCED = Path(__file__).resolve().parent.parent / "leaderboards" / "reproduced"


@pytest.fixture(scope="module")
def digits():
    task, cfg = load_task(RunConfig(task="digits", seed=0))
    return task, cfg, task.load(None, False)


def test_hold_out_is_exact_stratified_and_seeded():
    rng = np.random.default_rng(0)
    labels = rng.choice(5, size=1000, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    public, private = hold_out_public(labels, 137, seed=3)
    assert len(public) == 137 and len(np.intersect1d(public, private)) == 0
    assert len(public) + len(private) == len(labels)
    share = np.bincount(labels[public], minlength=5)
    expected = np.bincount(labels, minlength=5) * 137 / len(labels)
    assert np.all(np.abs(share - expected) < 1)  # each class within one sample of its share
    again, _ = hold_out_public(labels, 137, seed=3)
    other, _ = hold_out_public(labels, 137, seed=4)
    assert np.array_equal(public, again) and not np.array_equal(public, other)


@pytest.mark.parametrize("size", [0, 1000])
def test_hold_out_size_out_of_range(size):
    with pytest.raises(PartitionError, match="--public-size"):
        hold_out_public(np.zeros(1000, dtype=int), size, seed=0)


@pytest.mark.parametrize("scheme,params", [("dirichlet", {"alpha": 0.3}), ("classes", {"k": 1}), ("iid", {})])
def test_public_set_never_overlaps_client_data(digits, scheme, params):
    labels = digits[2].train_y.numpy()
    part = make_partition(labels, 10, scheme, seed=0, public_size=200, **params)
    clients = np.concatenate([np.concatenate([c.train, c.val, c.test]) for c in part.clients])
    assert part.public_size == 200
    assert len(np.intersect1d(clients, part.public)) == 0
    assert sorted(np.concatenate([clients, part.public]).tolist()) == list(range(len(labels)))


def test_public_size_is_in_the_partition_hash(digits):
    labels = digits[2].train_y.numpy()
    hashes = {make_partition(labels, 10, seed=0, public_size=n).hash for n in (0, 100, 200)}
    assert len(hashes) == 3


def test_no_public_set_keeps_committed_hashes(digits):
    """Adding the option changed neither the partition nor the config hash of a run without it:
    a committed record's hashes are reproduced exactly."""
    archived = REPRODUCED.parent / "archive" / "first-wave" / "digits"
    record = json.loads(sorted(archived.glob("*__crad__*seed1.json"))[0].read_text())
    cfg = recorded_config(record["config"])
    assert "public_size" not in record["config"]  # written before the option existed
    assert cfg.public_size == 0
    assert config_hash(cfg.__dict__) == record["config_hash"]
    task, cfg = load_task(cfg)
    assert partition_for(cfg, task.info, digits[2]).hash == record["partition"]["hash"]
    assert config_hash(recorded_config({**record["config"], "public_size": 100}).__dict__) != record["config_hash"]


def test_given_partition_holds_the_public_set_out_of_its_clients_and_no_pretraining_split(digits):
    task, cfg, data = digits
    shipped = TaskData(data.train_x, data.train_y, data.test_x, data.test_y,
                       client_indices=[np.arange(0, 500), np.arange(500, 1000)])
    cfg = RunConfig(**{**cfg.__dict__, "partition": "given", "clients": 2, "public_size": 50})
    part = partition_for(cfg, task.info, shipped)
    assert len(part.public) == 50 and part.public.max() < 1000  # out of the clients' samples only
    kept = np.concatenate([np.concatenate([c.train, c.val, c.test]) for c in part.clients])
    assert len(kept) == 950 and not np.isin(part.public, kept).any()
    assert np.array_equal(part.public, partition_for(cfg, task.info, shipped).public)  # seeded
    cfg = RunConfig(**{**cfg.__dict__, "public_size": 0, "pretrain_size": 50})
    with pytest.raises(ConfigError, match="--pretrain-size"):
        partition_for(cfg, task.info, shipped)


def test_method_needing_public_data_names_the_option(monkeypatch):
    import dataclasses

    from hfl_bench.methods.local import Local

    monkeypatch.setattr(Local, "card", dataclasses.replace(Local.card, transfer="public-labelled"))
    with pytest.raises(ConfigError, match="--public-size"):
        make_method(RunConfig(method="local", task="digits"))
    make_method(RunConfig(method="local", task="digits", public_size=50))


def test_cli_run_records_the_hold_out(run_record, digits):
    record = run_record("--method", "local", "--task", "digits", "--clients", "4", "--rounds", "1",
                        "--public-size", "120")
    assert record["partition"]["public_size"] == 120
    assert record["config"]["public_size"] == 120
    held = sum(map(sum, record["partition"]["train_counts"])) + sum(map(sum, record["partition"]["val_counts"]))
    assert held < record["task"]["n_train"] - 120 + 1
    plain = run_record("--method", "local", "--task", "digits", "--clients", "4", "--rounds", "1")
    assert plain["partition"]["public_size"] == 0
    assert plain["partition"]["hash"] != record["partition"]["hash"]


def test_cli_partition_shows_public_size():
    result = CliRunner().invoke(app, ["partition", "--task", "digits", "--public-size", "60", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["public_size"] == 60
    n_train = len(load_task(RunConfig(task="digits"))[0].load(None, False).train_y)
    assert sum(map(sum, shown["train_counts"])) + sum(shown["val_sizes"]) + sum(shown["test_sizes"]) == n_train - 60


def test_public_tensors_on_the_federation(tiny_cfg):
    from hfl_bench.engine import Simulation

    sim = Simulation(load_task(tiny_cfg(method="local", public_size=80, rounds=1))[1])
    fed = sim.fed
    assert fed.public_x.shape == (80, *fed.info.input_shape)
    assert torch.equal(fed.public_y, fed.data.train_y[fed.public_idx])
    taken = torch.cat([torch.cat([c.train_idx, c.val_idx, c.test_idx]) for c in fed.clients])
    assert not torch.isin(fed.public_idx, taken).any()
