"""The method API: the registry refuses what is not a Method, and the services methods compose
(seeded models, the one training loop, named timer phases) do what they say."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from hfl_bench.metering import Phase
from hfl_bench.method_api import (
    Diverged,
    Method,
    MethodCard,
    SmokeSettings,
    Trainee,
    fit,
    make_plan,
    new_model,
    register_method,
    seeded_init,
    train_client,
    transfer_plan,
)
from hfl_bench.method_card import card_problems
from hfl_bench.registry import METHODS, RegistryError

from helpers import cpu_federation


def card(**fields) -> MethodCard:
    """A valid card, with ``fields`` changed."""
    values = dict(name="demo", version="1.0", fidelity="original", topology="none", citation="",
                  summary="A demo method.")
    return MethodCard(**{**values, **fields})


def method_class(**attrs) -> type:
    return type("Demo", (Method,), {"run_round": lambda self, fed, rnd, active: {}, **attrs})


def test_register_method_refuses_a_class_that_is_not_a_method():
    with pytest.raises(RegistryError, match="subclass of hfl_bench.method_api.Method"):
        @register_method
        class Plain:  # noqa: F841
            card = MethodCard(name="not-a-method", version="1.0", fidelity="original", topology="none",
                              citation="", summary="Not a method.")

            def run_round(self, fed, rnd, active):
                return {}

    assert "not-a-method" not in METHODS


def test_register_method_refuses_a_method_without_run_round():
    with pytest.raises(RegistryError, match="does not implement run_round"):
        @register_method
        class NoRound(Method):  # noqa: F841
            card = MethodCard(name="no-round", version="1.0", fidelity="original", topology="none",
                              citation="", summary="No round.")


def test_register_method_takes_the_name_from_the_card():
    with pytest.raises(RegistryError, match="takes the name from the class's card: write @register_method"):
        register_method("named-twice")
    with pytest.raises(RegistryError, match="declares no card: set card = MethodCard"):
        register_method(method_class())
    with pytest.raises(RegistryError, match="sets version, notes on the class: declare them in its card"):
        register_method(method_class(card=card(name="stray"), version="1.0", notes=()))
    for name in ("named-twice", "stray", "Demo"):
        assert name not in METHODS


@pytest.mark.parametrize("fields, problem", [
    ({"fidelity": "vibes"}, "fidelity must be one of paper, reconstructed, original, got 'vibes'"),
    ({"topology": "mesh"}, "topology must be one of p2p, server, none"),
    ({"transfer": "public"}, "transfer must be one of none, public-unlabelled, public-labelled, synthetic"),
    ({"summary": ""}, "summary must be one line of text"),
    ({"summary": "two\nlines"}, "summary must be one line of text"),
    ({"missing_modalities": 1}, "missing_modalities must be True or False"),
    ({"why_single_modality": ""}, "why_single_modality must say in one line why"),
    ({"why_not_tokens": "two\nlines"}, "why_not_tokens must be one line"),
    ({"refuses_faults": {"meteor": "why"}}, "refuses_faults: unknown fault kind 'meteor'"),
    ({"refuses_faults": {"byzantine": ""}}, "refuses_faults: say in one line why it refuses byzantine"),
    ({"notes": "one note"}, "notes must be a tuple of strings"),
    ({"predictor": "oracle"}, "predictor must be one of live model, stored snapshot, prototype classifier"),
    ({"predictor": "Live model"}, "predictor must be one of live model,"),
    ({"peer_data": "yes"}, "peer_data must be True or False, got 'yes'"),
    ({"peer_data": 1}, "peer_data must be True or False, got 1"),
    ({"single_architecture": True}, "a single-architecture method names a homogeneous smoke.pool"),
    ({"transfer": "public-labelled", "smoke": SmokeSettings(public_size=0)}, "smoke.public_size is 0, but"),
    ({"smoke": SmokeSettings(method_params={"rounds": 2})}, "smoke.method_params must map names to strings"),
    ({"changelog": "1.1: faster"}, "changelog must be a tuple of (version, what changed) pairs"),
    ({"changelog": (("1.1",),)}, "changelog must be a tuple of (version, what changed) pairs"),
    ({"version": "1.1", "changelog": (("v1.1", "faster"),)}, "changelog: a version is a string like \"1.1\""),
    ({"version": "1.1", "changelog": (("1.1", "two\nlines"),)}, "changelog: say in one line what 1.1 changed"),
    ({"version": "1.2", "changelog": (("1.2", "b"), ("1.1", "a"))}, "changelog: versions must increase, oldest "
                                                                    "first, got 1.2, 1.1"),
    ({"version": "1.10", "changelog": (("1.2", "b"), ("1.10", "c"), ("1.10", "d"))}, "versions must increase"),
    ({"version": "1.2", "changelog": (("1.1", "a"),)}, "changelog: the last entry is 1.1, but the card's version "
                                                       "is 1.2; add what this version changed"),
])
def test_register_method_refuses_a_card_with_a_problem(fields, problem):
    with pytest.raises(RegistryError) as refused:
        register_method(method_class(card=card(**fields)))
    assert str(refused.value).startswith("method 'demo': ") and problem in str(refused.value)
    assert "demo" not in METHODS


def test_a_changelog_in_version_order_ending_at_the_cards_version_is_accepted():
    # Numeric order, not text order: 1.10 comes after 1.9.
    ok = card(version="1.10", changelog=[("1.1", "a"), ("1.9", "b"), ("1.10", "c")])
    assert card_problems(ok, "demo") == []
    assert ok.changelog == (("1.1", "a"), ("1.9", "b"), ("1.10", "c"))  # a list is kept as a tuple
    assert card_problems(card(), "demo") == []  # a card at 1.0 needs no changelog
    assert card_problems(card(version="1.1"), "demo") == []  # nor one whose history is not written


def test_a_card_must_name_the_method_it_is_registered_as():
    # an entry point naming a class registers it under the entry point's name
    with pytest.raises(RegistryError, match="its card names 'demo', but it is registered as 'other'"):
        METHODS.register("other", method_class(card=card()))
    # a subclass of a registered method inherits its parent's card: it must declare its own
    with pytest.raises(RegistryError, match="its card names 'crad', but it is registered as 'crad-variant'"):
        METHODS.register("crad-variant", type("Variant", (METHODS.get("crad"),), {}))


def test_a_card_is_frozen_hashable_and_its_dict_is_json():
    c = card(transfer="public-unlabelled", refuses_faults={"straggler": "it needs every client each round"},
             smoke=SmokeSettings(method_params={"epochs": "1"}), notes=["a choice"])
    assert hash(c) == hash(card(transfer="public-unlabelled", notes=("a choice",),
                                refuses_faults={"straggler": "it needs every client each round"},
                                smoke=SmokeSettings(method_params={"epochs": "1"})))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.version = "2.0"
    with pytest.raises(TypeError):
        c.refuses_faults["byzantine"] = "no"
    assert c.needs_public and not card(transfer="synthetic").needs_public
    assert json.loads(json.dumps(c.as_dict())) == {
        "name": "demo", "version": "1.0", "citation": "", "fidelity": "original", "topology": "none",
        "summary": "A demo method.", "transfer": "public-unlabelled", "peer_data": False,
        "predictor": "live model", "needs_public": True,
        "single_architecture": False, "submodels": False, "pool": None, "missing_modalities": False,
        "why_single_modality": "it was written for inputs of one modality", "why_not_tokens": "",
        "refuses_faults": {"straggler": "it needs every client each round"},
        "smoke": {"method_params": {"epochs": "1"}, "pool": None, "public_size": 100}, "presets": {},
        "notes": ["a choice"], "changelog": []}
    logged = card(version="1.1", changelog=(("1.1", "faster"),))
    assert hash(logged) == hash(card(version="1.1", changelog=[["1.1", "faster"]]))
    assert logged.as_dict()["changelog"] == [{"version": "1.1", "change": "faster"}]


def test_the_registry_refuses_an_object_an_entry_point_would_register():
    # An entry point naming an object registers it under the entry point's name: checked too.
    with pytest.raises(RegistryError, match="must be a subclass"):
        METHODS.register("entry-point-object", lambda fed: None)
    assert "entry-point-object" not in METHODS


def test_new_model_reproduces_a_clients_initialization_without_touching_the_global_rng(tiny_cfg):
    torch.manual_seed(123)
    fed = cpu_federation(tiny_cfg())  # the engine initializes client 2 from ("init", 2)
    state = torch.random.get_rng_state()
    rebuilt = new_model(fed, fed.clients[2].arch, "init", 2)
    assert torch.equal(torch.random.get_rng_state(), state)
    initial = cpu_federation(tiny_cfg()).clients[2].model.state_dict()
    for key, value in rebuilt.state_dict().items():
        assert torch.equal(value, initial[key]), key
    with seeded_init(fed, "anything"):
        a = torch.rand(3)
    with seeded_init(fed, "anything"):
        b = torch.rand(3)
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), state)


def test_train_client_is_the_plain_sgd_loop(tiny_cfg):
    fed = cpu_federation(tiny_cfg())
    client = fed.clients[1]
    plan = make_plan(fed, 1, 1)
    model = copy.deepcopy(client.model).train()
    opt = torch.optim.SGD(model.parameters(), lr=fed.cfg.lr, momentum=fed.cfg.momentum,
                          weight_decay=fed.cfg.weight_decay)
    by_hand = []
    for start, end in plan.bounds:
        loss = F.cross_entropy(model(plan.view(fed, start, end)), plan.labels(fed, start, end))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), fed.cfg.grad_clip)
        opt.step()
        by_hand.append(float(loss.detach()))
    mean = train_client(fed, client, plan)
    # the same batch losses; train_client sums them in float32 on the device, by_hand in float64:
    # <= n_batches (~3) x 6e-8 relative, within rel=1e-6
    assert mean == pytest.approx(sum(by_hand) / len(by_hand), rel=1e-6)
    for key, value in model.state_dict().items():
        assert torch.equal(value, client.model.state_dict()[key]), key


def test_fit_steps_each_trainee_on_its_own_loss(tiny_cfg):
    """Two models trained together with detached cross terms end where each would alone."""
    fed = cpu_federation(tiny_cfg())
    plan = make_plan(fed, 0, 1)
    a, b = fed.clients[0].model, fed.clients[1].model
    a_alone, b_alone = copy.deepcopy(a), copy.deepcopy(b)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (a, b, a_alone, b_alone)]

    def losses(batch):
        za, zb = a(batch.x), b(batch.x)
        return [F.cross_entropy(za, batch.y) + 0.0 * zb.detach().sum(), F.cross_entropy(zb, batch.y)]

    together = fit(fed, plan, [Trainee(a, opts[0], "a"), Trainee(b, opts[1], "b")], losses)
    alone = [fit(fed, plan, [Trainee(m, o, n)], lambda batch, m=m: [F.cross_entropy(m(batch.x), batch.y)])[0]
             for m, o, n in ((a_alone, opts[2], "a"), (b_alone, opts[3], "b"))]
    # the same float32 losses accumulated alike (the states below are bitwise equal): rel=1e-6 is a few eps
    assert together == pytest.approx(alone, rel=1e-6)
    for trained, reference in ((a, a_alone), (b, b_alone)):
        for key, value in trained.state_dict().items():
            assert torch.equal(value, reference.state_dict()[key]), key


def test_fit_names_the_trainee_that_diverged(tiny_cfg):
    fed = cpu_federation(tiny_cfg())
    model = fed.clients[0].model
    plan = transfer_plan(fed, fed.data.train_x[:40], epochs=1, seed_parts=("test",))
    trainee = Trainee(model, torch.optim.SGD(model.parameters(), lr=0.1), "client 0 (meme)")
    with pytest.raises(Diverged, match=r"client 0 \(meme\)"):
        fit(fed, plan, [trainee], lambda batch: [model(batch.x).sum() * float("nan")])


def test_transfer_plan_covers_every_input_once_per_epoch(tiny_cfg):
    fed = cpu_federation(tiny_cfg())
    x = fed.data.train_x[:50]
    plan = transfer_plan(fed, x, epochs=2, seed_parts=("test",))
    batches = list(plan.batches(fed))
    seen = torch.cat([b.idx for b in batches])
    assert sorted(seen[:50].tolist()) == list(range(50)) and sorted(seen[50:].tolist()) == list(range(50))
    assert torch.equal(batches[0].x, x[batches[0].idx]) and batches[0].y is None
    again = transfer_plan(fed, x, epochs=2, seed_parts=("test",))
    assert torch.equal(plan.order, again.order)


def test_timer_accepts_named_phases_only(tiny_cfg):
    fed = cpu_federation(tiny_cfg())
    with fed.timer(Phase.TRAINING):
        pass
    assert "training" in fed.timer.pop()
    with pytest.raises(TypeError, match="Phase"):
        with fed.timer("trainign"):
            pass


@pytest.mark.parametrize("version", ["", None, 1.0, "v1", "1.0 beta"])
def test_register_method_refuses_a_method_without_a_version(version):
    with pytest.raises(RegistryError, match="version must be a string like"):
        register_method(method_class(card=card(version=version)))
    assert "demo" not in METHODS


def test_every_registered_method_states_its_regime():
    """Every registered card passes ``card_problems`` with a predictor of the vocabulary, and so
    does what ``Method.predictor`` answers at the defaults; DFML alone trains models on peers' data."""
    from hfl_bench.method_card import PREDICTORS, card_problems

    for name, cls in METHODS.items():
        assert card_problems(cls.card, name) == [], name
        assert cls.card.predictor in PREDICTORS and cls().predictor() == cls.card.predictor, name
    assert {name for name, cls in METHODS.items() if cls.card.peer_data} == {"dfml"}
    expected = {"dfml": "stored snapshot", "fedproto": "prototype classifier", "fedtgp": "prototype classifier",
                "fedmrl": "live + shared"}
    assert {name: cls.card.predictor for name, cls in METHODS.items() if cls.card.predictor != "live model"} == expected


@pytest.mark.parametrize("method, params, predictor", [
    ("dfml", {}, "stored snapshot"),
    ("dfml", {"eval": "current"}, "live model"),
    ("fedsocket", {}, "live model"),
    ("fedsocket", {"endpoint": "joint"}, "joint"),
    ("naive-shared", {"endpoint": "joint"}, "joint"),
])
def test_a_hyperparameter_changes_the_evaluated_predictor(method, params, predictor):
    from hfl_bench.config import coerce_params

    cls = METHODS.get(method)
    assert cls(coerce_params(cls.Params, params, method)).predictor() == predictor
