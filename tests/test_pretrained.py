"""The shared-predictor family's pretrained feature bank (hfl_bench.families.pretrained, issue 49):
the encoder cache (a hit loads and never retrains, the key follows the data, a damaged file is
retrained), the pretraining split (held out before partitioning, hashed only when used), the
generator's samples (none is a task sample), the refusal without pretraining data, the record's
feature bank, and FedSocket's controls (Label Q never reads Private, No return never moves
Private by Q, the matched-capacity ensemble shares nothing), each run from the command line."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import hfl_bench.methods.fedsocket as fs
from hfl_bench.cli import app
from hfl_bench.config import RunConfig, config_hash
from hfl_bench.families import pretrained
from hfl_bench.families import shared_predictor as sp
from hfl_bench.partition import make_partition
from hfl_bench.record.check import problems as record_problems
from hfl_bench.tasks.mnist1d import MNIST1D, pretraining_arrays
from hfl_bench.testing import ready_method, tiny_federation

PRETRAIN = 100
QUICK = {"warmup_epochs": 0, "local_epochs": 1, "pretrain_steps": 20}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The encoder cache in a fresh folder of this test's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hfl-bench" / "encoders"


@pytest.fixture
def trainings(monkeypatch):
    """Counts the encoder trainings (calls of ``pretrained.train_encoder``)."""
    calls = []
    real = pretrained.train_encoder

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrained, "train_encoder", counted)
    return calls


def toy_data(seed: int = 0, n: int = 60):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 1, 12, generator=g), torch.arange(n) % 3


def encode(x, y, steps=5):
    return pretrained.pretrained_encoder(x, y, "toy", (1, 1, 12), 8, 3, steps)


# ----------------------------------------------------------------------------- the cache


def test_a_second_build_loads_the_cached_encoder_and_gives_the_same_features(cache, trainings):
    x, y = toy_data()
    first = encode(x, y)
    assert first.facts["trained"] and first.facts["pretrain_steps"] == 5 and len(trainings) == 1
    assert list(cache.glob("*.pt")) == [pretrained.cache_path(first.facts["cache_key"])]
    second = encode(x, y)
    assert not second.facts["trained"] and "pretrain_seconds" not in second.facts and len(trainings) == 1
    assert torch.equal(first.encoder(x), second.encoder(x))
    # training is deterministic: the cache is only a speedup
    assert torch.equal(pretrained.train_encoder(x, y, (1, 1, 12), 8, 3, 5)(x), first.encoder(x))


def test_the_cache_key_follows_the_data_and_the_settings(cache, trainings):
    x, y = toy_data()
    key = encode(x, y).facts["cache_key"]
    x2 = x.clone()
    x2[0, 0, 0, 0] += 1e-3  # one value of one sample
    other = encode(x2, y)
    assert other.facts["trained"] and other.facts["cache_key"] != key
    assert other.facts["pretraining_fingerprint"] != pretrained.data_fingerprint(x, y)
    assert encode(x, y, steps=6).facts["cache_key"] != key  # a training hyperparameter
    assert len(trainings) == 3


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_cache_file_is_retrained_not_trusted(cache, trainings, damage):
    x, y = toy_data()
    first = encode(x, y)
    path = pretrained.cache_path(first.facts["cache_key"])
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-100] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        blob = bytearray(b"not a cache file")
    path.write_bytes(bytes(blob))
    again = encode(x, y)
    assert again.facts["trained"] and len(trainings) == 2
    assert torch.equal(again.encoder(x), first.encoder(x))
    assert not encode(x, y).facts["trained"]  # rewritten whole


# ----------------------------------------------------------------------------- the pretraining data


def test_the_pretraining_split_is_held_out_before_partitioning_and_hashed_only_when_used():
    labels = np.repeat(np.arange(10), 50)
    plain = make_partition(labels, 5, "dirichlet", seed=3, alpha=0.3)
    assert make_partition(labels, 5, "dirichlet", seed=3, alpha=0.3, pretrain_size=0).hash == plain.hash
    part = make_partition(labels, 5, "dirichlet", seed=3, alpha=0.3, pretrain_size=50)
    assert part.pretrain_size == 50 and part.hash != plain.hash
    assert np.bincount(labels[part.pretrain], minlength=10).tolist() == [5] * 10  # stratified
    held = set(part.pretrain.tolist())
    for c in part.clients:
        assert not held & set(np.concatenate([c.train, c.val, c.test]).tolist())
    both = make_partition(labels, 5, "dirichlet", seed=3, alpha=0.3, pretrain_size=50, public_size=40)
    assert not set(both.public.tolist()) & set(both.pretrain.tolist())
    assert make_partition(labels, 5, "dirichlet", seed=4, alpha=0.3, pretrain_size=50).hash != part.hash
    # the config hash: unchanged at 0 (records before the setting keep theirs), changed above it
    base = dataclasses.asdict(RunConfig())
    assert config_hash({**base, "pretrain_size": 0}) == config_hash({k: v for k, v in base.items()
                                                                     if k != "pretrain_size"})
    assert config_hash({**base, "pretrain_size": 50}) != config_hash(base)


def test_every_method_of_a_comparison_gets_the_same_split():
    a = tiny_federation("digits", 4, pretrain_size=PRETRAIN, method="local")
    b = tiny_federation("digits", 4, pretrain_size=PRETRAIN, method="fedsocket")
    assert np.array_equal(a.partition.pretrain, b.partition.pretrain) and a.partition.hash == b.partition.hash


@pytest.mark.slow  # a brute-force nearest-neighbour scan of 4,000 samples against every sample of the task
def test_the_generators_pretraining_samples_are_none_of_the_tasks(tmp_path):
    x, y = pretraining_arrays()
    assert x.shape == (4000, 1, 1, 40) and np.bincount(y).tolist() == [400] * 10
    task = MNIST1D().load_arrays(tmp_path, False)
    ours = x.reshape(len(x), -1).astype(np.float64)
    theirs = np.concatenate([task[0], task[2]]).reshape(-1, 40).astype(np.float64)
    nearest = min(float(((theirs[:, None, :] - ours[None, s : s + 200]) ** 2).sum(-1).min())
                  for s in range(0, len(ours), 200))
    assert nearest > 1e-3


def run_cli(out, *args):
    result = CliRunner().invoke(app, ["run", *args, "--out", str(out), "--json", "-q"])
    return result


def test_pretrained_without_pretraining_data_is_one_line_and_exit_2(tmp_path, cache):
    result = run_cli(tmp_path, "--method", "fedsocket", "--task", "digits", "--clients", "4", "--rounds", "1")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["error: fedsocket: extractor=pretrained needs pretraining data, and task digits has no "
                     "generator for its input: use --pretrain-size N or --set extractor=random-conv"]


def test_mnist1d_pretrains_on_its_generator_without_a_split(cache):
    fed = tiny_federation("mnist1d", 4)
    method = ready_method("naive-shared", fed, **QUICK)
    facts = method.describe_run(fed)["feature_bank"]["modalities"]["input"]
    assert "generator" in facts["source"] and facts["pretraining_samples"] == 4000
    assert fed.partition.pretrain_size == 0


# ----------------------------------------------------------------------------- the record


def check_bank(record, modalities, trained):
    bank = record["method"]["run_details"]["feature_bank"]
    assert bank["extractor"] == "pretrained" and bank["feature_dim"] == 256
    assert set(bank["modalities"]) == set(modalities)
    for name, facts in bank["modalities"].items():
        assert facts["encoder_version"] == pretrained.ENCODER_VERSION and facts["trained"] is trained
        assert len(facts["pretraining_fingerprint"]) == 16 and facts["pretraining_samples"] > 0
        probe = facts["probe"]
        assert probe["test_samples"] == record["task"]["n_test"]
        assert probe["fit_samples"] == facts["pretraining_samples"]
        # a real signal, far above chance (10 classes), and a percentage
        assert 30 < probe["test_acc"] <= 100, (name, probe)
    return bank


@pytest.mark.slow  # pretrains the encoders, then runs twice
def test_the_record_states_its_feature_bank(tmp_path, cache):
    args = ("--method", "fedsocket", "--task", "digits-mnist1d", "--clients", "4", "--rounds", "1",
            "--pretrain-size", str(PRETRAIN), "--set", "pretrain_steps=50")
    first = run_cli(tmp_path / "a", *args)
    assert first.exit_code == 0, first.output
    record = json.loads(Path(json.loads(first.stdout)["record"]).read_text())
    assert not record_problems(record)
    bank = check_bank(record, ("image", "signal"), trained=True)
    assert "split" in bank["modalities"]["image"]["source"] and bank["modalities"]["image"]["pretraining_samples"] \
        == PRETRAIN == record["partition"]["pretrain_size"]
    assert "generator" in bank["modalities"]["signal"]["source"]
    second = run_cli(tmp_path / "b", *args)  # the same encoders from the cache: the same run
    again = json.loads(Path(json.loads(second.stdout)["record"]).read_text())
    check_bank(again, ("image", "signal"), trained=False)
    assert again["metrics"]["global_acc"] == record["metrics"]["global_acc"]
    ablation = run_cli(tmp_path / "c", *args, "--set", "extractor=random-conv")
    random_bank = json.loads(Path(json.loads(ablation.stdout)["record"]).read_text())["method"]["run_details"]
    assert random_bank["feature_bank"]["extractor"] == "random-conv"
    assert random_bank["feature_bank"]["modalities"]["image"]["probe"]["fit_samples"] == PRETRAIN


# ----------------------------------------------------------------------------- the controls


@pytest.fixture(scope="module")
def fed():
    return tiny_federation("digits", 4, pretrain_size=PRETRAIN)


def test_label_q_never_reads_private_and_its_q_ignores_privates_weights(fed):
    def q_after(q_teacher: str, perturb: bool, calls: list) -> dict:
        f = copy.deepcopy(fed)
        method = ready_method("fedsocket", f, q_teacher=q_teacher, **QUICK)
        model = f.clients[0].model
        if perturb:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))
        hook = model.register_forward_hook(lambda *_: calls.append(1))
        q_copy = copy.deepcopy(method.held[0]).requires_grad_(True)
        fs.teach_q(f, 0, 1, q_copy, method.feats, method.params)
        hook.remove()
        return q_copy.state_dict()

    calls: list = []
    a, b = q_after("none", False, calls), q_after("none", True, calls)
    assert not calls  # Private never ran in the Q stage
    assert all(torch.equal(a[k], b[k]) for k in a)
    taught, taught_perturbed = q_after("private", False, calls), q_after("private", True, calls)
    assert calls and not all(torch.equal(taught[k], taught_perturbed[k]) for k in taught)


def test_no_return_never_updates_private_from_q(fed):
    def private_after(q_return: str, perturb: bool) -> dict:
        f = copy.deepcopy(fed)
        method = ready_method("fedsocket", f, q_return=q_return, **QUICK)
        if perturb:  # another Q held by every client
            with torch.no_grad():
                for q in method.held:
                    for p in q.parameters():
                        p.add_(torch.randn_like(p))
        method.run_round(f, 1, list(range(f.n_clients)))
        return {f"{c.cid}.{k}": v.clone() for c in f.clients for k, v in c.model.state_dict().items()}

    a, b = private_after("off", False), private_after("off", True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    on, on_perturbed = private_after("on", False), private_after("on", True)
    assert not all(torch.equal(on[k], on_perturbed[k]) for k in on)


def test_the_matched_ensemble_shares_nothing_and_keeps_each_clients_own_q(fed):
    f = copy.deepcopy(fed)
    method = ready_method("fedsocket", f, share_q="off", **QUICK)
    assert f.channel.total == 0  # no initial Q sent: each client builds the seeded one itself
    before = copy.deepcopy(method.held[0].state_dict())
    method.run_round(f, 1, list(range(f.n_clients)))
    assert f.channel.total == 0
    assert not torch.equal(method.held[0].head.weight, before["head.weight"])
    assert not torch.equal(method.held[0].head.weight, method.held[1].head.weight)
    # same architecture as the shared Q: matched inference capacity
    shared = ready_method("fedsocket", copy.deepcopy(fed), **QUICK)
    assert [p.shape for p in method.held[0].parameters()] == [p.shape for p in shared.held[0].parameters()]


@pytest.mark.parametrize("control", sorted(fs.CONTROLS))
def test_each_control_runs_from_the_command_line(control, tmp_path, cache):
    sets = [a for k, v in fs.CONTROLS[control].items() for a in ("--set", f"{k}={v}")]
    result = run_cli(tmp_path, "--method", "fedsocket", "--task", "digits-mnist1d", "--clients", "4", "--rounds", "1",
                     "--pretrain-size", str(PRETRAIN), "--set", "pretrain_steps=20", *sets)
    assert result.exit_code == 0, result.output
    record = json.loads(Path(json.loads(result.stdout)["record"]).read_text())
    assert record["status"] == "ok" and not record_problems(record)
    for key, value in fs.CONTROLS[control].items():
        assert record["method"]["hparams"][key] == value
    assert record["method"]["preset"] is None  # a variant of fedsocket in its setting, not a budget of its own
    assert set(record["metrics"]["extra_endpoints"]) == {"private", "q", "joint"}
    assert (record["cost"]["bytes_total"] == 0) == (control == "matched-ensemble")


def test_the_family_reads_one_bank(fed):
    a = ready_method("fedsocket", copy.deepcopy(fed), **QUICK)
    b = ready_method("naive-shared", copy.deepcopy(fed), **QUICK)
    assert torch.equal(a.feats, b.feats)
    fa, fb = a.bank.facts["modalities"]["input"], b.bank.facts["modalities"]["input"]
    assert fa["cache_key"] == fb["cache_key"] and not fb["trained"]  # the second method loads the first's
    assert sp.EXTRACTORS[0] == "pretrained" and fs.FedSocketParams().extractor == "pretrained"
