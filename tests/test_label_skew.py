"""FedCC's label-skew comparison: the plain ensemble endpoint (``--ensemble``) on hand-computed
cases and through the real CLI, FedCC's open-set rule (the paper's local-model evaluation, an
endpoint only), one optimizer for every method (``--optimizer``) in the config hash and the
setting section, FedMD on an unlabelled public set, and the claims file selecting by k and by
optimizer."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from hfl_bench import engine
from hfl_bench.cli import app
from hfl_bench.config import RunConfig, config_hash
from hfl_bench.evaluation import row_hits
from hfl_bench.families.ensemble import MeanEnsemble, with_mean_ensemble
from hfl_bench.federation import Federation
from hfl_bench.methods.fedcc import FedCC, OpenSetRule
from hfl_bench.results.setting import optimizer_setting, section_label
from hfl_bench.testing import QUICK

from helpers import cpu_federation, ready_method

LN = math.log


class Fixed(nn.Module):
    """A 'model' that returns the same logits row for every input (one row per input)."""

    def __init__(self, row):
        super().__init__()
        self.row = nn.Parameter(torch.tensor(row), requires_grad=False)

    def forward(self, x):
        return self.row.expand(len(x), -1)


# ----------------------------------------------------------------------------- the plain ensemble


def test_mean_ensemble_is_the_mean_softmax_by_hand():
    # model A: softmax (.5, .25, .25); model B: (.1, .8, .1); mean: (.3, .525, .175) -> class 1,
    # where A alone says class 0
    a, b = Fixed([LN(2), 0.0, 0.0]), Fixed([0.0, LN(8), 0.0])
    ens = MeanEnsemble([a, b])
    got = ens(torch.zeros(3, 5)).exp()
    assert got.shape == (3, 3)
    assert got[0].tolist() == pytest.approx([0.3, 0.525, 0.175], abs=1e-6)
    assert list(ens.parameters()) == []  # the models are held outside: evaluated as itself, never merged
    y = torch.tensor([1, 1, 0])
    assert row_hits(ens, ens(torch.zeros(3, 5)), y).tolist() == [True, True, False]


def test_the_run_setting_adds_a_shared_ensemble_unless_the_method_has_its_own():
    fed = cpu_federation(RunConfig(task="digits", method="local", clients=3, rounds=1, seed=0, **QUICK))
    models = [c.model for c in fed.clients]
    added = with_mean_ensemble({}, models, fed)
    assert list(added) == ["ensemble"] and len({id(p) for p in added["ensemble"]}) == 1  # one, shared
    own = {"ensemble": [nn.Identity()] * 3}
    assert with_mean_ensemble(own, models, fed) is own  # FedCC's confidence-weighted ensemble stays


@pytest.fixture
def cli(tmp_path):
    def run(*args, out="runs"):
        result = CliRunner().invoke(app, ["run", *args, "--out", str(tmp_path / out), "--json", "-q"])
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / out / json.loads(result.stdout)["record"].split("/")[-1]).read_text())
    return run


TINY = ("--task", "digits", "--clients", "4", "--rounds", "2", "--local-epochs", "1", "--batch-size", "64",
        "--partition", "classes", "--k", "1", "--public-size", "60")


def test_ensemble_flag_reports_the_ensemble_every_test_round_and_changes_nothing_else(cli):
    plain = cli("--method", "local", *TINY, out="plain")
    ens = cli("--method", "local", *TINY, "--ensemble", out="ens")
    assert plain["config_hash"] == ens["config_hash"]  # evaluation only: the same run
    assert ens["metrics"]["final"]["global_acc"] == plain["metrics"]["final"]["global_acc"]
    assert "ensemble" not in (plain["metrics"].get("extra_endpoints") or {})
    assert all("ensemble" in h["endpoints"] for h in ens["history"])  # every test round, round 0 included
    final = ens["metrics"]["final"]["endpoints"]["ensemble"]["global_acc"]
    window = [h["endpoints"]["ensemble"]["global_acc"] for h in ens["history"][1:]]
    assert final == pytest.approx(sum(window) / len(window), abs=1e-3)


# ----------------------------------------------------------------------------- FedCC's open-set rule


def test_open_set_rule_counts_unknown_as_right_only_outside_the_majority_classes():
    majority = torch.tensor([True, False, False])  # C_J = {0}; unknown is output 3
    rule = OpenSetRule(nn.Identity(), majority)
    logits = torch.tensor([[9.0, 0, 0, 0],  # says 0
                           [0, 0, 0, 9.0],  # says unknown
                           [0, 0, 0, 9.0],
                           [0, 9.0, 0, 0]])  # says 1
    y = torch.tensor([0, 0, 2, 2])
    # right / unknown on a majority class (wrong) / unknown on a class outside C_J (right) / wrong
    assert rule.hits(logits, y).tolist() == [True, False, True, False]
    assert row_hits(rule, logits, y).tolist() == [True, False, True, False]
    assert row_hits(nn.Identity(), logits, y).tolist() == [True, False, False, False]  # plain argmax


def test_open_set_endpoint_scores_an_always_unknown_model_on_the_classes_a_client_lacks():
    """A model that answers "unknown" everywhere scores 0 on the headline, and on the paper's rule
    exactly the global test share of the classes outside its client's C_J."""
    fed = cpu_federation(RunConfig(task="digits", method="fedcc", clients=4, rounds=1, seed=0, public_size=60,
                                   partition="classes", classes_per_client=1, **QUICK))
    m = ready_method(FedCC, fed)
    for client in fed.clients:
        head = [mod for mod in client.model.modules() if isinstance(mod, nn.Linear)][-1]
        with torch.no_grad():
            head.bias[10] = 1e4
    endpoints = m.endpoints(fed)
    metrics = engine.Evaluator(fed, fed.timer)(1, m.eval_models(fed), list(range(4)), endpoints=endpoints)
    y = fed.data.test_y
    outside = [float((~m.majority[c].cpu()[y]).double().mean()) * 100 for c in range(4)]
    assert list(metrics.endpoint_clients["open-set"]["global_acc"]) == pytest.approx(outside, abs=1e-6)
    # the headline stays argmax over the C known classes: the rule never reaches it
    known = [float(engine.evaluate_global(fed, w).sum()) / len(y) * 100 for w in m.eval_models(fed)]
    assert list(metrics.global_acc) == pytest.approx(known, abs=1e-6) and known != pytest.approx(outside, abs=1)
    assert all(v == pytest.approx(90, abs=3) for v in outside)  # one class held of ten


# ----------------------------------------------------------------------------- one optimizer


def _cfg(**values) -> RunConfig:
    return RunConfig(**{"task": "digits", "method": "local", "clients": 3, "rounds": 1, "seed": 0, **QUICK, **values})


def test_one_optimizer_for_every_method_is_part_of_the_hash_and_of_the_section():
    import dataclasses

    sgd, explicit, adam = _cfg(), _cfg(optimizer="sgd"), _cfg(optimizer="adam", lr=0.001)
    assert config_hash(dataclasses.asdict(sgd)) == config_hash(dataclasses.asdict(explicit))  # older hashes hold
    assert config_hash(dataclasses.asdict(adam)) != config_hash(dataclasses.asdict(_cfg(lr=0.001)))
    fed = cpu_federation(adam)
    opt = fed.clients[0].optimizer
    assert type(opt) is torch.optim.Adam and opt.param_groups[0]["lr"] == 0.001
    assert opt.param_groups[0]["weight_decay"] == 0
    fedcc = cpu_federation(_cfg(method="fedcc", optimizer="adam", lr=0.002, public_size=60))
    m = ready_method(FedCC, fedcc)  # optimizer=run: the run's Adam, at the run's lr
    assert type(fedcc.clients[0].optimizer) is torch.optim.Adam and fedcc.clients[0].optimizer.param_groups[0][
        "lr"] == 0.002 and m.params.optimizer == "run"
    assert type(cpu_federation(sgd).clients[0].optimizer) is torch.optim.SGD
    assert optimizer_setting({"config": {"optimizer": "adam", "lr": 0.001}}) == "adam lr=0.001"
    assert optimizer_setting({"config": {"lr": 0.05}}) == "sgd"  # a record from before the setting
    label = section_label("public-unlabelled", False, "protocol", optimizer="adam lr=0.001")
    assert label == "unlabelled public set, heterogeneous pool, protocol budget, optimizer adam lr=0.001"


def test_a_bad_optimizer_is_one_line_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["run", "--method", "local", "--task", "digits", "--optimizer", "adamw",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--optimizer must be sgd or adam, got 'adamw'" in result.output
    assert "Traceback" not in result.output


def test_compare_keeps_two_optimizers_apart_and_pairs_within_one(cli, tmp_path):
    for opt in (("--optimizer", "adam", "--lr", "0.001"), ()):
        for method in ("msfkd", "fedcc"):
            cli("--method", method, *TINY, "--ensemble", *opt, out="board")
    result = CliRunner().invoke(app, ["leaderboard", "compare", str(tmp_path / "board"), "--against", "msfkd",
                                      "--endpoint", "ensemble", "--against-endpoint", "ensemble", "--json"])
    assert result.exit_code == 0, result.output
    tables = json.loads(result.stdout)["tables"]
    assert [t["section"].endswith("optimizer adam lr=0.001") for t in tables] == [False, True]
    for t in tables:  # fedcc - msfkd once per optimizer, never across: the two groups of one optimizer
        [c] = t["comparisons"]
        assert (c["a"], c["b"], c["pairing"]["seeds"]) == ("fedcc [ensemble]", "msfkd [ensemble]", [0])
        assert c["b_group_id"] == t["reference_group_id"]


# ----------------------------------------------------------------------------- FedMD unlabelled


def test_fedmd_without_its_transfer_step_never_reads_the_public_labels_and_says_so(monkeypatch, cli):
    fed = cpu_federation(_cfg(method="fedmd", public_size=60))

    def forbidden(self):
        raise AssertionError("fedmd read the public labels")

    monkeypatch.setattr(Federation, "public_y", property(forbidden))
    m = ready_method("fedmd", fed, transfer_epochs=0)
    assert m.transfer() == "public-unlabelled"
    with pytest.raises(AssertionError, match="public labels"):
        ready_method("fedmd", cpu_federation(_cfg(method="fedmd", public_size=60)))  # its default reads them
    monkeypatch.undo()
    record = cli("--method", "fedmd", *TINY, "--set", "transfer_epochs=0", out="fedmd")
    assert record["method"]["transfer"] == "public-unlabelled"
    assert cli("--method", "fedmd", *TINY, out="fedmd")["method"]["transfer"] == "public-labelled"
