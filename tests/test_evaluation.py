"""The evaluation policy (hfl_bench.evaluation): tests only at the rounds the record needs, yet the
selected round's figures are exactly those of testing every round."""

from __future__ import annotations

import copy

import pytest
import torch

from hfl_bench import engine, evaluation
from hfl_bench import recording as records
from hfl_bench.config import FINAL_ROUNDS, RunConfig
from hfl_bench.testing import QUICK, builtin_methods, smoke_config, tiny_federation
from hfl_bench.training import predict_logits

from helpers import ready_method

# lr 0.5 makes the validation curve jump, so best rounds fall between test rounds; six rounds,
# a test every 3 and a one-round final window: test rounds 0, 3 and 6, the others deferred.
NOISY = {**QUICK, "lr": 0.5}
ROUNDS, EVERY = 6, 3


@pytest.fixture
def short_final_window(monkeypatch):
    monkeypatch.setattr(evaluation, "FINAL_ROUNDS", 1)


def run(method: str, eval_every: int, **extra) -> dict:
    values = dict(method=method, task="digits", clients=4, rounds=ROUNDS, seed=0, checkpoint_every=0,
                  **smoke_config(method), eval_every=eval_every, **{**NOISY, **extra})
    cfg = engine.load_task(RunConfig(**values))[1]
    return records.build_record(cfg, engine.run(cfg))


def selected(record: dict) -> dict:
    """The selected round and its figures (the final windows are not part of the comparison)."""
    # the headline block reads the final window too (schema 1.7)
    metrics = {k: v for k, v in record["metrics"].items() if k not in ("final", "headline")}
    if "seen_unseen" in metrics:
        metrics["seen_unseen"] = {k: v for k, v in metrics["seen_unseen"].items() if k != "final"}
    return {"selection": record["selection"], "status": record["status"], "metrics": metrics}


@pytest.mark.slow  # every method through real training
@pytest.mark.parametrize("method", builtin_methods())
def test_the_default_policy_selects_the_same_round_with_the_same_figures(method, short_final_window):
    every_round = run(method, 1)
    policy = run(method, EVERY)
    assert selected(policy) == selected(every_round)
    tested = {h["round"] for h in policy["history"] if h["global_acc"] is not None}
    assert tested == {0, 3, 6, policy["selection"]["round"]}
    for h in policy["history"]:
        full = every_round["history"][h["round"]]
        if h["round"] in tested:
            assert (h["global_acc"], h["local_acc"]) == (full["global_acc"], full["local_acc"])
            assert (h["seen_acc"], h["unseen_acc"]) == (full["seen_acc"], full["unseen_acc"])
        else:
            assert h["global_acc"] is None and h["local_acc"] is None and h["seen_acc"] is None


def test_a_best_round_between_test_rounds_is_evaluated_from_its_snapshot(short_final_window):
    record = run("local", EVERY)
    best = record["selection"]["round"]
    assert best % EVERY != 0 and best != ROUNDS  # the deferred path ran (a noisy curve, seed 0)
    assert record["history"][best]["global_acc"] == record["metrics"]["global_acc"]


def test_a_deferred_best_round_is_tested_as_it_was_through_a_predictor_without_state():
    fed = tiny_federation(rounds=50)  # round 1 is no test round
    evaluator = evaluation.Evaluator(fed, fed.timer, eval_every=100)
    # CountingMean holds its model in a plain list, as FedCC's KnownClasses does: no state of its own
    wrapped = [CountingMean([c.model]) for c in fed.clients]
    everyone = list(range(fed.n_clients))
    evaluator(0, wrapped, everyone)
    assert evaluator(1, wrapped, everyone).global_acc is None and evaluator.pending is not None
    then = evaluator.endpoint(wrapped)  # the figures of round 1's models
    torch.manual_seed(0)
    with torch.no_grad():  # the clients train on after the snapshot
        for c in fed.clients:
            for p in c.model.parameters():
                p.add_(torch.randn_like(p))
    assert evaluator.endpoint(wrapped)["global_acc"].tolist() != then["global_acc"].tolist()
    resolved = evaluator.resolve()
    assert resolved.round == 1
    assert resolved.global_acc.tolist() == then["global_acc"].tolist()
    assert resolved.local_acc.tolist() == then["local_acc"].tolist()


def test_a_checkpoint_resolves_the_deferred_best_and_resume_gives_the_same_record(tmp_path, short_final_window):
    ckpt = tmp_path / "run.ckpt"
    cfg = engine.load_task(RunConfig(method="local", task="digits", clients=4, rounds=ROUNDS, seed=0,
                                     eval_every=EVERY, checkpoint_every=0, **NOISY))[1]
    straight = records.build_record(cfg, engine.run(cfg))
    first = engine.Simulation(cfg)
    for rnd in range(1, 5):
        first.step(rnd)
    assert first.evaluator.pending is not None  # round 4 is the best so far and not a test round
    first.save_checkpoint(ckpt)
    assert first.evaluator.pending is None
    second = engine.Simulation(cfg)
    second.load_checkpoint(ckpt)
    resumed = records.build_record(cfg, second.run())
    assert selected(resumed) == selected(straight)
    assert [h["global_acc"] for h in resumed["history"]] == [h["global_acc"] for h in straight["history"]]


def test_identical_models_are_evaluated_once(monkeypatch):
    fed = tiny_federation(method="fml")
    method = ready_method("fml", fed)
    method.run_round(fed, 1, list(range(fed.n_clients)))
    evaluator = evaluation.Evaluator(fed, fed.timer)
    calls = []
    real = evaluator.global_class_correct
    monkeypatch.setattr(evaluator, "global_class_correct", lambda m, cid: calls.append(m) or real(m, cid))
    # four equal modules (each client's copy of the broadcast meme, as FML held them before it
    # evaluated the server's meme for every client)
    memes = [copy.deepcopy(method.server) for _ in fed.clients]
    figures = evaluator.endpoint(memes)
    assert len(calls) == 1  # four memes, one broadcast state
    separately = [float(evaluation.evaluate_global(fed, m).sum()) for m in memes]
    assert figures["global_acc"].tolist() == [separately[0] / len(fed.data.test_y) * 100] * len(memes)
    # a changed parameter makes a different model
    with torch.no_grad():
        next(memes[1].parameters()).add_(1.0)
    reps, index = evaluation.distinct(memes)
    assert len(reps) == 2 and index == [0, 1, 0, 0]


class CountingMean(torch.nn.Module):
    """A parameter-free predictor (the mean of some models' logits) that counts the rows it is asked."""

    def __init__(self, models):
        super().__init__()
        self._models, self.rows = list(models), 0

    def forward(self, x):
        self.rows += len(x)
        return torch.stack([predict_logits(m, x) for m in self._models]).mean(0)


def test_a_predictor_shared_by_every_client_is_evaluated_once_per_test_set():
    fed = tiny_federation()
    evaluator = evaluation.Evaluator(fed, fed.timer)
    models = [c.model for c in fed.clients]
    shared = CountingMean(models)
    figures = evaluator.endpoint([shared] * fed.n_clients)
    local_rows = sum(len(c.test_idx) for c in fed.clients)
    assert shared.rows == len(fed.data.test_y) + local_rows  # the global test set once, not once per client
    copies = [CountingMean(models) for _ in fed.clients]  # distinct parameter-free objects: each on its own
    separately = evaluator.endpoint(copies)
    assert [c.rows for c in copies] == [len(fed.data.test_y) + len(c.test_idx) for c in fed.clients]
    for name in ("global_acc", "local_acc"):
        assert figures[name].tolist() == separately[name].tolist()
    assert len(set(figures["global_acc"].tolist())) == 1


def test_channels_last_evaluation_puts_back_the_very_tensors():
    fed = tiny_federation(pool="cpu-cnn")
    model = fed.clients[0].model
    before = {name: (p.data_ptr(), p.clone()) for name, p in model.named_parameters()}
    with evaluation.channels_last([model], enabled=True):
        conv = [p for p in model.parameters() if p.dim() == 4]
        assert conv and all(p.is_contiguous(memory_format=torch.channels_last) for p in conv)
    for name, p in model.named_parameters():
        assert p.data_ptr() == before[name][0] and torch.equal(p, before[name][1]) and p.is_contiguous()


def test_snapshot_state_is_a_copy():
    fed = tiny_federation()
    model = fed.clients[0].model
    states = evaluation._module_states([model, model])
    assert len(states) == 1
    kept = copy.deepcopy(states[0][1])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert all(torch.equal(states[0][1][k], kept[k]) for k in kept)


def test_a_tensor_held_by_several_predictors_is_copied_once_and_restored_in_each():
    # FedSocket's shape: one frozen extractor inside every client's predictor, each predictor also
    # wrapped by a second one beside the client's own model
    shared = torch.nn.Linear(4, 3)
    wrappers = [torch.nn.Sequential(shared, torch.nn.Linear(3, 2)) for _ in range(3)]
    outer = [torch.nn.Sequential(w) for w in wrappers]
    states = evaluation._module_states([*wrappers, *outer])
    assert len(states) == 6
    copies = [state[key] for _, state in states for key in state if key.endswith("0.weight") and "1." not in key]
    assert len(copies) == 6 and all(c is copies[0] for c in copies)  # one copy, shared by the six states
    assert copies[0] is not shared.weight and torch.equal(copies[0], shared.weight)
    saved = {id(m): {k: v.clone() for k, v in m.state_dict().items()} for m in wrappers}
    with torch.no_grad():
        shared.weight.add_(1.0)
        for w in wrappers:
            w[1].bias.add_(2.0)
    moved = shared.weight.detach().clone()
    with evaluation.loaded(states):
        assert all(torch.equal(w.state_dict()[k], saved[id(w)][k]) for w in wrappers for k in saved[id(w)])
    assert torch.equal(shared.weight, moved)  # put back as it was before the block
    assert all(torch.equal(w[1].bias, saved[id(w)]["1.bias"] + 2.0) for w in wrappers)



def test_a_test_round_retests_only_the_models_changed_since_the_last_test(monkeypatch):
    """With one client of four active per round, a test round runs the global test only for the
    clients trained since the last test round (the others' figures are cached), in the final
    window too; the selected and final figures are exactly those of testing every round."""
    calls: list[torch.nn.Module] = []  # the models run on the global test set
    real = evaluation.Evaluator.global_class_correct
    monkeypatch.setattr(evaluation.Evaluator, "global_class_correct",
                        lambda self, model, cid: calls.append(model) or real(self, model, cid))
    rounds = FINAL_ROUNDS + 4  # rounds 1-4 before the final window: a test at round 3 only

    def config(eval_every: int):
        return engine.load_task(RunConfig(method="local", task="digits", clients=4, rounds=rounds, seed=0,
                                          checkpoint_every=0, eval_every=eval_every, clients_per_round=1,
                                          **NOISY))[1]

    cfg = config(EVERY)
    sim = engine.Simulation(cfg)
    trained, partial = set(), False
    for rnd in range(1, rounds + 1):
        trained |= set(sim.active_clients(rnd))
        before = len(calls)
        sim.step(rnd)
        if sim.evaluator.is_test_round(rnd, rnd == rounds):
            tested = sorted(next(c.cid for c in sim.fed.clients if c.model is m) for m in calls[before:])
            assert tested == sorted(trained), f"round {rnd}"
            partial |= len(trained) < cfg.clients
            trained = set()
        else:
            assert len(calls) == before, f"round {rnd}"
    assert partial  # test rounds skipped clients: the cache was used
    policy = records.build_record(cfg, sim.result())
    every_round = records.build_record(config(1), engine.run(config(1)))
    assert policy["selection"] == every_round["selection"]
    assert policy["metrics"] == every_round["metrics"]  # the final window's figures included
