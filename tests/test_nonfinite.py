"""Non-finite logits at evaluation (issue 47, row 8): a model whose outputs hold a NaN is never
scored (argmax would read it as class 0); the run ends diverged, naming the round, the client
and the evaluation, and the round has no figure in the record."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hfl_bench import engine, evaluation
from hfl_bench import recording as records
from hfl_bench.config import FINAL_ROUNDS, resolve
from hfl_bench.data import get_task
from hfl_bench.evaluation import NonFiniteOutputs
from hfl_bench.methods.local import Local

from helpers import cpu_federation, ready_method


def poison_after(monkeypatch, rnd: int, cid: int) -> None:
    """``local`` trains as usual, then fills client ``cid``'s weights with NaN after round ``rnd``."""
    real = Local.run_round

    def run_round(self, fed, r, active):
        scalars = real(self, fed, r, active)
        if r == rnd:
            with torch.no_grad():
                for p in fed.clients[cid].model.parameters():
                    p.fill_(float("nan"))
        return scalars

    monkeypatch.setattr(Local, "run_round", run_round)


def config(tiny_cfg, **overrides):
    return resolve(tiny_cfg(method="local", **overrides), get_task("digits").info.defaults)


def test_nan_weights_in_the_last_round_make_the_run_diverged_through_the_cli(monkeypatch, run_record):
    """The issue's case: NaN weights in one client in the last round were an "ok" run with 10.03 %
    for that client (every row predicted class 0). Through the real CLI (``run_record`` checks the
    exit code 0 and the schema): a diverged record naming the client, the round and the evaluation,
    with no figure of that round."""
    poison_after(monkeypatch, 2, cid=2)
    record = run_record("--method", "local", "--task", "digits", "--clients", "4", "--rounds", "2", "--seed", "0",
                        "--local-epochs", "1", "--batch-size", "64")
    assert record["status"] == "diverged"
    assert record["error"] == "round 2: non-finite logits (NaN or infinite), not scored: client 2 at the validation"
    assert [h["round"] for h in record["history"]] == [0, 1]  # round 2 is not scored
    assert record["selection"]["round"] == 1 and record["metrics"]["selected"]["round"] == 1
    assert all(c["global_acc"] is not None for c in record["metrics"]["per_client"])  # round 1's, finite


def test_nan_at_validation_in_a_middle_round_stops_the_run_there(tiny_cfg, monkeypatch):
    poison_after(monkeypatch, 2, cid=1)
    cfg = config(tiny_cfg, rounds=4, eval_every=100)  # round 1 deferred: its snapshot is resolved at the end
    result = engine.run(cfg)
    assert result.status == "diverged"
    assert result.error == "round 2: non-finite logits (NaN or infinite), not scored: client 1 at the validation"
    assert len(result.history) == 2  # rounds 0 and 1
    assert result.best is not None and result.best.round == 1 and result.best.global_acc is not None
    record = records.build_record(cfg, result)
    assert record["status"] == "diverged" and record["selection"]["round"] == 1


class Poisoned(nn.Module):
    """A predictor that is ``model`` until ``state["nan"]``, then gives NaN logits."""

    def __init__(self, model: nn.Module, state: dict):
        super().__init__()
        self.model, self.state = model, state

    def forward(self, x):
        out = self.model(x)
        return out * float("nan") if self.state["nan"] else out


def test_an_endpoint_with_nan_outputs_makes_the_run_diverged(tiny_cfg):
    """An extra endpoint (as FedCC's ensemble or FML's meme) is checked like the models: its tests
    run at the test rounds only, so the NaN is found at its global test."""
    state = {"nan": False}

    class LocalWithEndpoint(Local):
        def run_round(self, fed, rnd, active):
            state["nan"] = rnd == 2
            return super().run_round(fed, rnd, active)

        def endpoints(self, fed):
            return {"shadow": [Poisoned(c.model, state) if c.cid == 3 else c.model for c in fed.clients]}

    sim = engine.Simulation(config(tiny_cfg))
    sim.method = LocalWithEndpoint()
    result = sim.run()
    assert result.status == "diverged"
    assert result.error == ("round 2: non-finite logits (NaN or infinite), not scored: client 3 at the global test "
                            "of endpoint shadow; client 3 at the local test of endpoint shadow")
    assert len(result.history) == 2 and result.best.round == 1


def test_a_shared_predictor_names_every_client_it_serves(tiny_cfg):
    fed = cpu_federation(tiny_cfg(method="local"))
    ready_method("local", fed)
    evaluator = evaluation.Evaluator(fed, fed.timer)
    shared = Poisoned(fed.clients[0].model, {"nan": True})
    with pytest.raises(NonFiniteOutputs) as e:
        evaluator.endpoint([shared] * fed.n_clients, "ensemble")
    found = e.value.found
    assert ([0, 1, 2, 3], "global test of endpoint ensemble") in found
    assert "clients 0, 1, 2, 3 at the global test of endpoint ensemble" in str(e.value)
    # the flags were read and cleared: a finite evaluation afterwards is scored as usual
    figures = evaluator.endpoint([c.model for c in fed.clients], "fine")
    assert (figures["global_acc"] > 0).all()


def test_inf_logits_are_not_scored_either(tiny_cfg):
    fed = cpu_federation(tiny_cfg(method="local"))
    ready_method("local", fed)
    evaluator = evaluation.Evaluator(fed, fed.timer)
    models = [c.model for c in fed.clients]
    with torch.no_grad():
        next(fed.clients[1].model.parameters()).fill_(float("inf"))
    with pytest.raises(NonFiniteOutputs) as e:
        evaluator(3, models, [1])
    assert e.value.round == 3 and e.value.found == [([1], "validation")]
    assert str(e.value) == "non-finite logits (NaN or infinite), not scored: client 1 at the validation"


def test_a_deferred_round_that_cannot_be_scored_leaves_no_selected_figures(tiny_cfg):
    """The selected round's tests run at the end when it was deferred (``Evaluator``): an endpoint
    whose outputs are NaN there (its tests run at test rounds only) makes the run diverged at that
    round, and the record has no selected figures, never a class-0 score."""
    state = {"nan": False}

    class LocalWithEndpoint(Local):
        def run_round(self, fed, rnd, active):
            state["nan"] = True
            return super().run_round(fed, rnd, active)

        def endpoints(self, fed):
            return {"shadow": [Poisoned(c.model, state) for c in fed.clients]}

    cfg = config(tiny_cfg, rounds=FINAL_ROUNDS + 2, eval_every=100)  # round 1 is no test round
    sim = engine.Simulation(cfg)
    sim.method = LocalWithEndpoint()
    sim.step(1)
    assert sim.evaluator.pending is not None and sim.best.round == 1 and sim.best.global_acc is None
    result = sim.result()
    assert result.status == "diverged"
    assert result.error == ("round 1: non-finite logits (NaN or infinite), not scored: clients 0, 1, 2, 3 at the "
                            "global test of endpoint shadow; clients 0, 1, 2, 3 at the local test of endpoint shadow")
    assert result.best is None
    record = records.build_record(cfg, result)
    assert record["metrics"] is None and record["status"] == "diverged"
