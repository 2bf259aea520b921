"""Faults (hfl_bench.faults): the spec, each corruption by payload kind, the data faults, free-riders
and stragglers, the record, and every built-in method under every fault kind on a tiny federation
(or refusing it, as its card says)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hfl_bench import engine
from hfl_bench import recording as records
from hfl_bench.cli import app
from hfl_bench.config import ConfigError, RunConfig, config_hash
from hfl_bench.families.peer_kd import exchange_snapshots
from hfl_bench.faults import COUNT_FACTOR, CorruptedModel, FaultPlan, canonical_config, corrupt, parse_faults
from hfl_bench.metering import SERVER, Payload, payload_bytes
from hfl_bench.method_api import get_method_class, new_model
from hfl_bench.record.check import problems as record_problems
from hfl_bench.recording import SCHEMA_VERSION, final_figures
from hfl_bench.testing import QUICK, builtin_methods, ready_method, smoke_config, tiny_federation
from hfl_bench.training import predict_logits

SEED = (0, "faults", 1, 2)  # seed parts of a corruption: run seed, purpose, round, sender


# ----------------------------------------------------------------------------- the spec


@pytest.mark.parametrize("text, canonical", [
    ("byzantine:0.2", "byzantine:0.2/random"),
    ("byzantine:0.2/sign-flip", "byzantine:0.2/sign-flip"),
    ("label-noise:0.3", "label-noise:0.3@0.5/symmetric"),
    ("label-noise:0.3@0.25/pair", "label-noise:0.3@0.25/pair"),
    ("free-rider:1", "free-rider:1"),
    ("straggler:[3, 1]@0.5", "straggler:[1,3]@0.5"),
    (" none ", ""),
    ("", ""),
])
def test_specs_parse_to_one_canonical_spelling(text, canonical):
    spec = parse_faults(text)
    assert (spec.canonical if spec else "") == canonical
    if spec:
        assert parse_faults(spec.canonical) == spec


@pytest.mark.parametrize("text, phrase", [
    ("byzantine", "is not a fault spec"),
    ("sleepy:0.2", "unknown fault kind 'sleepy'"),
    ("byzantine:0", "must be in (0, 1]"),
    ("byzantine:1.5", "must be in (0, 1]"),
    ("byzantine:abc", "must be a number"),
    ("byzantine:0.2@0.5", "takes no strength"),
    ("label-noise:0.2@0", "strength of label-noise must be in (0, 1]"),
    ("label-noise:0.2/random", "has no mode 'random'"),
    ("free-rider:0.2/pair", "has no mode 'pair'"),
    ("straggler:[a]", "must hold integers"),
    ("straggler:[-1]", "must be >= 0"),
    ("byzantine:nan", "must be finite"),
])
def test_bad_specs_are_one_clear_config_error(text, phrase):
    with pytest.raises(ConfigError) as e:
        parse_faults(text)
    assert phrase in str(e.value) and "\n" not in str(e.value)


def test_explicit_clients_beyond_the_federation_are_refused():
    with pytest.raises(ConfigError, match="client 7 does not exist"):
        canonical_config(RunConfig(clients=4, seed=0, faults="byzantine:[1,7]"))


def test_the_same_seed_gives_the_same_faulty_clients():
    spec = parse_faults("byzantine:0.3")
    assert spec.faulty_clients(10, 0) == spec.faulty_clients(10, 0)
    assert len(spec.faulty_clients(10, 0)) == 3 and len(spec.faulty_clients(2, 0)) == 1  # at least one
    draws = {tuple(spec.faulty_clients(10, s)) for s in range(8)}
    assert len(draws) > 1  # the draw is seeded, not fixed
    assert parse_faults("byzantine:[1,3]").faulty_clients(10, 5) == [1, 3]


def test_faults_enter_the_config_hash_only_when_set():
    cfg = RunConfig(method="crad", task="digits", clients=4, rounds=2, seed=0)
    plain = config_hash(dict(vars(cfg)))
    assert config_hash({k: v for k, v in vars(cfg).items() if k != "faults"}) == plain  # old records keep theirs
    assert config_hash(dict(vars(cfg), faults="byzantine:0.5/random")) != plain


# ----------------------------------------------------------------------------- corruption by kind


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 5))


def test_every_payload_kind_has_a_byzantine_corruption():
    samples = {Payload.MODEL: _model(), Payload.LOGITS: torch.randn(4, 5), Payload.PROBS: torch.rand(4, 5).softmax(-1),
               Payload.PARAMS: _model().state_dict(), Payload.COUNTS: torch.tensor([3.0, 0.0]),
               Payload.ACCURACIES: torch.tensor([0.5, 0.2]), Payload.GENERATOR: torch.randn(2, 1, 8, 8),
               Payload.FEATURES: torch.rand(3, 16)}
    assert set(samples) == set(Payload)
    for mode in ("random", "sign-flip"):
        for kind, payload in samples.items():
            corrupt(payload, kind, mode, SEED)


def test_byzantine_logits_are_random_of_the_same_shape_or_negated():
    z = torch.randn(32, 10) * 3
    r = corrupt(z, Payload.LOGITS, "random", SEED)
    assert r.shape == z.shape and r.dtype == z.dtype and not torch.allclose(r, z)
    assert abs(float(r.std()) - float(z.std())) < 0.5 * float(z.std())  # matched scale
    assert torch.equal(corrupt(z, Payload.LOGITS, "random", SEED), r)  # seeded
    assert not torch.equal(corrupt(z, Payload.LOGITS, "random", (0, "faults", 2, 2)), r)  # another round
    assert torch.equal(corrupt(z, Payload.LOGITS, "sign-flip", SEED), -z)


def test_byzantine_probabilities_are_valid_and_unrelated_to_the_model():
    fed = tiny_federation(clients=2)
    model = fed.clients[0].model
    probs = torch.softmax(predict_logits(model, fed.data.test_x), dim=-1)
    r = corrupt(probs, Payload.PROBS, "random", SEED)
    assert r.shape == probs.shape and (r >= 0).all()
    assert torch.allclose(r.sum(-1), torch.ones(len(r)), atol=1e-5)
    agree = float((r.argmax(-1) == probs.argmax(-1)).float().mean())
    assert agree < 0.2  # chance is 1/10: the byzantine rows ignore the model
    flipped = corrupt(probs, Payload.PROBS, "sign-flip", SEED)
    assert (flipped >= 0).all() and torch.allclose(flipped.sum(-1), torch.ones(len(r)), atol=1e-5)


def test_byzantine_params_are_sign_flipped_or_random_at_matched_scale():
    state = _model().state_dict()
    flipped = corrupt(state, Payload.PARAMS, "sign-flip", SEED)
    for key, value in state.items():
        if not value.is_floating_point():
            assert torch.equal(flipped[key], value)  # num_batches_tracked
        elif (value < 0).any():
            assert torch.equal(flipped[key], -value)
        else:  # a variance stays a variance
            assert torch.equal(flipped[key], value)
    rand = corrupt(state, Payload.PARAMS, "random", SEED)
    w = state["0.weight"]
    assert rand["0.weight"].shape == w.shape and not torch.allclose(rand["0.weight"], w)
    assert abs(float(rand["0.weight"].std()) - float(w.std())) < 0.3 * float(w.std())
    assert (rand["1.running_var"] >= 0).all()
    assert payload_bytes(rand) == payload_bytes(state)


def test_byzantine_statistics_are_inflated():
    counts, accs = torch.tensor([3.0, 0.0, 7.0]), torch.tensor([0.5, 0.0, 0.9])
    assert torch.equal(corrupt(counts, Payload.COUNTS, "random", SEED), counts * COUNT_FACTOR)
    assert torch.equal(corrupt(accs, Payload.ACCURACIES, "random", SEED), torch.ones(3))
    assert corrupt(12, Payload.COUNTS, "random", SEED) == 12 * COUNT_FACTOR


def test_a_byzantine_snapshot_is_a_wrapper_with_corrupted_outputs_of_the_right_shape():
    model = _model().eval()
    x = torch.randn(6, 8)
    wrapped = corrupt(model, Payload.MODEL, "random", SEED)
    assert isinstance(wrapped, CorruptedModel) and wrapped.inner is model  # a wrapper, not a copy
    out = wrapped(x)
    assert out.shape == model(x).shape and not torch.allclose(out, model(x))
    again = corrupt(model, Payload.MODEL, "random", SEED)
    assert torch.equal(again(x), out)  # seeded: the same calls give the same outputs
    negated = corrupt(model, Payload.MODEL, "sign-flip", SEED)
    assert torch.allclose(negated(x), -model(x))


def test_byzantine_generator_output_and_structured_payloads():
    x = torch.randn(4, 1, 8, 8)
    r = corrupt(x, Payload.GENERATOR, "random", SEED)
    assert r.shape == x.shape and not torch.allclose(r, x)
    payload = {"snapshot": _model(), "counts": torch.tensor([2.0, 1.0]), "accs": torch.tensor([0.5, 1.0])}
    kinds = {"snapshot": Payload.MODEL, "counts": Payload.COUNTS, "accs": Payload.ACCURACIES}
    out = corrupt(payload, kinds, "random", SEED)
    assert isinstance(out["snapshot"], CorruptedModel)
    assert torch.equal(out["counts"], payload["counts"] * COUNT_FACTOR) and torch.equal(out["accs"], torch.ones(2))


def test_unknown_or_mismatched_kinds_are_config_errors_naming_the_method():
    fed = tiny_federation(clients=2)
    with pytest.raises(ConfigError, match="crad sends a payload of unknown kind 'weights'"):
        fed.channel.send(0, 1, torch.zeros(2), "weights")
    with pytest.raises(ConfigError, match="do not match its parts"):
        fed.channel.send(0, 1, {"a": torch.zeros(2)}, {"b": Payload.LOGITS})
    with pytest.raises(ConfigError, match="cannot corrupt it"):
        corrupt(torch.zeros(2), Payload.MODEL, "random", SEED, method="my-kd")


# ----------------------------------------------------------------------------- the channel


def test_the_channel_corrupts_only_faulty_senders_and_meters_the_same_bytes():
    fed = tiny_federation(clients=4, faults="byzantine:[1]")
    plain = tiny_federation(clients=4)
    z = torch.randn(5, 10)
    fed.channel.start_round(1)
    assert fed.channel.send(0, [1, 2], z, Payload.LOGITS) is z  # honest: the very object
    assert fed.channel.send(SERVER, [1, 2], z, Payload.LOGITS) is z  # the server is never corrupted
    bad = fed.channel.send(1, [0, 2], z, Payload.LOGITS)
    assert bad.shape == z.shape and not torch.allclose(bad, z)
    for ch in (plain.channel,):
        ch.send(0, [1, 2], z, Payload.LOGITS)
        ch.send(SERVER, [1, 2], z, Payload.LOGITS)
        ch.send(1, [0, 2], z, Payload.LOGITS)
    assert fed.channel.total == plain.channel.total and (fed.channel.sent == plain.channel.sent).all()


def test_peer_kd_exchange_delivers_corrupted_snapshots_and_statistics_of_faulty_clients_only():
    fed = tiny_federation(clients=4, faults="byzantine:[2]")
    counts, accs = fed.val_counts, fed.val_accs()
    received = exchange_snapshots(fed, [0, 1, 2, 3], torch.stack([counts, accs], dim=1))
    for j in (0, 1, 3):
        assert received[j]["snapshot"] is fed.clients[j].model
        assert torch.equal(received[j]["counts"], counts[j]) and torch.equal(received[j]["accs"], accs[j])
    assert isinstance(received[2]["snapshot"], CorruptedModel) and received[2]["snapshot"].inner is fed.clients[2].model
    assert torch.equal(received[2]["counts"], counts[2] * COUNT_FACTOR) and (received[2]["accs"] == 1).all()


# ----------------------------------------------------------------------------- data, free-riders, stragglers


@pytest.mark.parametrize("mode", ["symmetric", "pair"])
def test_label_noise_flips_the_faulty_clients_training_labels_only(mode):
    clean = tiny_federation(clients=4)
    fed = tiny_federation(clients=4, faults=f"label-noise:[1]@0.5/{mode}")
    before, after = clean.data.train_y, fed.data.train_y
    changed = (before != after).nonzero().flatten()
    train1 = set(fed.clients[1].train_idx.tolist())
    assert set(changed.tolist()) <= train1
    assert len(changed) == fed.faults.flipped[1] == round(0.5 * len(train1))
    for c in fed.clients:  # held-out halves keep their labels
        assert torch.equal(before[c.val_idx], after[c.val_idx]) and torch.equal(before[c.test_idx], after[c.test_idx])
    if mode == "pair":
        assert torch.equal(after[changed], (before[changed] + 1) % fed.num_classes)
    assert fed.clients[1].train_counts.tolist() == np.bincount(after[fed.clients[1].train_idx].numpy(),
                                                               minlength=fed.num_classes).tolist()
    assert torch.equal(tiny_federation(clients=4, faults=f"label-noise:[1]@0.5/{mode}").data.train_y, after)


def test_a_free_riders_snapshot_stays_its_round_0_state():
    fed = tiny_federation(clients=4, faults="free-rider:[1]", pool="cpu-cnn")
    method = ready_method("uniform-kd", fed)
    init = copy.deepcopy(fed.clients[1].model.state_dict())
    honest_init = copy.deepcopy(fed.clients[0].model.state_dict())
    for rnd in (1, 2):
        fed.channel.start_round(rnd)
        method.run_round(fed, rnd, [0, 1, 2, 3])
    sent = exchange_snapshots(fed, [0, 1, 2, 3], None)[1]["snapshot"]
    assert all(torch.equal(v, init[k]) for k, v in sent.state_dict().items())
    expected = new_model(fed, fed.clients[1].arch, "init", 1).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in sent.state_dict().items())
    assert not all(torch.equal(v, honest_init[k]) for k, v in fed.clients[0].model.state_dict().items())


def _run(method: str, faults: str, **extra) -> dict:
    values = dict(method=method, task="digits", clients=4, rounds=2, seed=0, checkpoint_every=0,
                  **smoke_config(method), faults=faults, **QUICK)
    values.update(extra)
    cfg = engine.load_task(RunConfig(**values))[1]
    return records.build_record(cfg, engine.run(cfg))


def test_stragglers_miss_rounds_and_the_record_says_which():
    record = _run("local", "straggler:[0,2]@0.5", rounds=6)
    plan = FaultPlan(parse_faults("straggler:[0,2]@0.5"), 4, 0)
    faults = record["faults"]
    assert faults["faulty_clients"] == [0, 2] and faults["honest_clients"] == [1, 3]
    expected = {str(c): [r for r in range(1, 7) if plan.misses(c, r)] for c in (0, 2)}
    assert faults["missed_rounds"] == expected and any(expected.values())
    assert faults["spec"] == "straggler:[0,2]@0.5"


def test_every_drawn_client_missing_a_round_runs_nothing():
    record = _run("crad", "straggler:1@1")
    assert record["status"] == "ok" and all(h["bytes"] == 0 for h in record["history"])
    assert record["faults"]["selection"] == "all"


# ----------------------------------------------------------------------------- every method, every kind


# Byzantine and free-rider act inside each method's exchange and training: every method runs them.
# Straggler acts on the engine's active set (two clients that always miss: each method runs rounds
# with fewer clients); label-noise acts on the data before any method runs, so it is covered by
# three methods of different families. A kind a method's card refuses is refused, with its reason.
CASES = ([(m, "byzantine:0.5") for m in builtin_methods()] + [(m, "free-rider:0.5") for m in builtin_methods()]
         + [(m, "straggler:[0,1]@1") for m in builtin_methods()]
         + [(m, "label-noise:0.5@0.5/pair") for m in ("crad", "fedavg", "fedmd")]
         + [("crad", "byzantine:0.5/sign-flip"), ("fedgd", "byzantine:0.5/sign-flip")])


@pytest.mark.slow  # every method through real training
@pytest.mark.parametrize("method, faults", CASES, ids=[f"{m}-{f.split(':')[0]}" + ("-flip" if "flip" in f else "")
                                                       for m, f in CASES])
def test_every_method_runs_under_every_fault_kind(method, faults):
    kind = parse_faults(faults).kind
    why = get_method_class(method).card.refuses_faults.get(kind)
    if why is not None:
        with pytest.raises(ConfigError) as refused:
            _run(method, faults)
        assert str(refused.value) == f"method {method} does not run under --faults {kind}: {why}"
        return
    record = _run(method, faults)
    assert record["status"] == "ok", record["error"]
    assert record["schema_version"] == SCHEMA_VERSION
    assert record["faults"]["spec"] == parse_faults(faults).canonical
    assert record["config"]["faults"] == record["faults"]["spec"]
    honest = record["metrics"]["honest"]
    assert honest["n_clients"] == len(record["faults"]["honest_clients"]) and honest["global_acc"] is not None
    # the honest clients' per-round figures: the selected round's is the headline, the last ones the final
    selected = record["history"][record["selection"]["round"]]
    # both rounded to 4 decimals (<= 1e-4 apart); one flipped prediction would move >= 0.07 points
    assert selected["honest"]["global_acc"] == pytest.approx(honest["global_acc"], abs=1e-3)
    assert {"honest", "faulty"} <= set(record["history"][-1])
    assert honest["final"] == final_figures(record["history"], "honest")
    assert record["faults"]["baseline_config_hash"] == config_hash(dict(record["config"], faults=""))
    assert not record_problems(json.loads(json.dumps(record)))


def test_a_record_without_faults_is_what_it_was():
    record = _run("local", "none")
    assert record["schema_version"] == SCHEMA_VERSION == "1.11" and record["config"]["faults"] == ""
    assert "faults" not in record and "honest" not in record["metrics"]


def test_a_peer_kd_method_on_the_reference_path_runs_byzantine_peers():
    assert _run("crad", "byzantine:0.5", exec="reference")["status"] == "ok"


def test_runs_with_faults_are_deterministic():
    a, b = _run("uniform-kd", "byzantine:0.5"), _run("uniform-kd", "byzantine:0.5")
    assert a["history"][-1]["global_acc"] == b["history"][-1]["global_acc"]
    assert a["metrics"]["honest"] == b["metrics"]["honest"]


# ----------------------------------------------------------------------------- the command line


def _stderr(result) -> str:
    try:
        return getattr(result, "stderr", "") or ""
    except ValueError:  # older Click: stderr not captured separately
        return result.output


def test_cli_bad_spec_exits_2_with_one_line(tmp_path):
    result = CliRunner().invoke(app, ["run", "--task", "digits", "--clients", "4", "--rounds", "1", "-q",
                                      "--faults", "byzantine:2", "--out", str(tmp_path)])
    assert result.exit_code == 2
    lines = _stderr(result).strip().splitlines()
    assert len(lines) == 1 and "fraction of faulty clients must be in (0, 1]" in lines[0]
    assert not list(tmp_path.iterdir())


def test_cli_and_yaml_record_carries_the_fault_and_validates(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("faults: label-noise:0.5\n")
    runner = CliRunner()
    result = runner.invoke(app, ["run", "--method", "uniform-kd", "--task", "digits", "--clients", "4", "--rounds",
                                 "2", "--local-epochs", "1", "-q", "--json", "--config", str(config),
                                 "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    path = json.loads(getattr(result, "stdout", result.output))["record"]
    record = json.loads(Path(path).read_text())
    assert record["schema_version"] == SCHEMA_VERSION and record["faults"]["kind"] == "label-noise"
    assert record["config"]["faults"] == "label-noise:0.5@0.5/symmetric"
    assert sum(record["faults"]["flipped_labels"].values()) > 0
    check = runner.invoke(app, ["leaderboard", "validate", path])
    assert check.exit_code == 0, check.output


def test_a_suite_setting_sets_the_fault_of_every_cell(tmp_path):
    from hfl_bench.matrix.suite import parse_suite, suite_cells

    suite = parse_suite({"methods": ["crad", "local"], "tasks": ["digits"], "seeds": [0],
                         "settings": {"faults": "byzantine:0.2"},
                         "method_overrides": {"local": {"faults": "none"}}})
    crad, local = suite_cells(suite, out=tmp_path)
    assert crad.error is None and crad.cfg.faults == "byzantine:0.2/random" and local.cfg.faults == ""
    bad = suite_cells(parse_suite({"methods": ["crad"], "tasks": ["digits"], "seeds": [0],
                                   "settings": {"faults": "byzantine:9"}}), out=tmp_path)[0]
    assert "fraction of faulty clients" in bad.error


def test_run_help_shows_the_faults_flag():
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--faults" in result.output and "KIND:WHO[@STRENGTH][/MODE]" in result.output
