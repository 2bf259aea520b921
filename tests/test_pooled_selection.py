"""The pooled selection rule (issue 46): a run whose every client's validation half holds at most
one class (``--partition classes --k 1``) selects its reported round on pooled validation, each
client's model on every client's validation half; every other run keeps the own-validation rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hfl_bench import engine, evaluation
from hfl_bench import recording as records
from hfl_bench.config import POOLED_SELECTION_RULE, SELECTION_RULE, RunConfig
from hfl_bench.evaluation import select_round, selection_rule
from hfl_bench.results.loading import selection_mark
from hfl_bench.testing import QUICK

# fedgen at lr 0.01 (seed 0, 4 clients, one class each): its models learn their own class within a
# few rounds (own validation reaches 100 % at round 3, where the own-validation rule would select)
# while their pooled accuracy peaks before (round 2): the two rules disagree.
K1 = dict(method="fedgen", task="digits", clients=4, seed=0, partition="classes", classes_per_client=1,
          method_params={"g_steps": "5", "hidden_dim": "64"}, **QUICK)
K1_ARGS = ["--method", "fedgen", "--task", "digits", "--clients", "4", "--rounds", "3", "--seed", "0",
           "--partition", "classes", "--k", "1", "--set", "g_steps=5", "--set", "hidden_dim=64",
           "--local-epochs", "1", "--batch-size", "64", "--lr", "0.01", "--heldout-fraction", "0.2"]


def by_round(record: dict, key: str) -> list[list[float]]:
    """A history figure per round, as ``select_round``'s input (a one-client mean is the mean)."""
    return [[np.nan if h.get(key) is None else h[key]] for h in record["history"]]


def test_the_criterion_reads_the_partitions_validation_classes_alone():
    one_each = np.array([[5, 0, 0], [0, 3, 0], [0, 0, 4], [2, 0, 0]])
    assert selection_rule(one_each) == POOLED_SELECTION_RULE
    two_somewhere = one_each.copy()
    two_somewhere[3, 2] = 1
    assert selection_rule(two_somewhere) == SELECTION_RULE
    assert selection_rule(np.ones((3, 10))) == SELECTION_RULE
    assert selection_mark(POOLED_SELECTION_RULE) == "pooled-val" and selection_mark(SELECTION_RULE) == ""


def test_a_one_class_run_records_the_round_of_best_pooled_validation(run_record):
    record = run_record(*K1_ARGS)  # the real CLI; the record validates against its schema
    selection = record["selection"]
    assert selection["rule"] == POOLED_SELECTION_RULE
    pooled = by_round(record, "pooled_val_acc")
    assert selection["round"] == select_round(pooled) == 2
    assert selection["score"] == record["history"][2]["pooled_val_acc"]
    # the own-validation rule would have taken another round: the one where every model knows its class
    assert select_round(by_round(record, "mean_val_acc")) == 3
    assert record["history"][3]["mean_val_acc"] == 100.0
    # the record's validation figures stay each client's own validation
    assert record["metrics"]["mean_val_acc"] == record["history"][2]["mean_val_acc"]
    assert record["history"][2]["global_acc"] == record["metrics"]["global_acc"]


@pytest.fixture
def short_final_window(monkeypatch):
    monkeypatch.setattr(evaluation, "FINAL_ROUNDS", 1)


def test_a_resumed_one_class_run_selects_as_an_uninterrupted_one(tmp_path, short_final_window):
    """Round 2 becomes the best pooled round between test rounds (a test every 3 rounds): the
    checkpoint after it resolves the snapshot and carries the pooled counts."""
    cfg = engine.load_task(RunConfig(**K1, rounds=4, eval_every=3, checkpoint_every=0))[1]
    straight = records.build_record(cfg, engine.run(cfg))
    first = engine.Simulation(cfg)
    for rnd in (1, 2):
        first.step(rnd)
    assert first.evaluator.pending is not None and first.evaluator.pending.round == 2
    # what the method reads stays each client's own validation: one class each, never the pooled set
    fed = first.fed
    assert torch.equal(fed.val_correct * (fed.val_counts == 0), torch.zeros_like(fed.val_correct))
    first.save_checkpoint(tmp_path / "run.ckpt")
    second = engine.Simulation(cfg)
    second.load_checkpoint(tmp_path / "run.ckpt")
    assert np.array_equal(second.evaluator.pooled_correct, first.evaluator.pooled_correct)
    assert second.evaluator.best_val == first.evaluator.best_val
    resumed = records.build_record(cfg, second.run())
    assert resumed["selection"] == straight["selection"]
    assert straight["selection"]["rule"] == POOLED_SELECTION_RULE and straight["selection"]["round"] == 2
    assert resumed["metrics"] == straight["metrics"]
    strip = lambda h: [{k: v for k, v in e.items() if k not in ("seconds", "phases")} for e in h]  # noqa: E731
    assert strip(resumed["history"]) == strip(straight["history"])


def test_a_dirichlet_run_keeps_the_own_validation_rule(tiny_cfg):
    cfg = engine.load_task(tiny_cfg(method="local", checkpoint_every=0))[1]
    sim = engine.Simulation(cfg)
    assert sim.evaluator.rule == SELECTION_RULE and not sim.evaluator.pooled
    record = records.build_record(cfg, sim.run())
    assert record["selection"] == {"rule": SELECTION_RULE, "round": select_round(by_round(record, "mean_val_acc"))}
    assert not any("pooled_val_acc" in h for h in record["history"])


def test_a_run_that_failed_before_its_partition_names_the_rule_its_seeds_ran():
    """A failed record joins its setting's group (the rule is part of the group key)."""
    k1 = records.build_failed_record(RunConfig(**K1, rounds=2), "boom")
    dirichlet = records.build_failed_record(RunConfig(method="local", task="digits", seed=0), "boom")
    assert k1["selection"]["rule"] == POOLED_SELECTION_RULE
    assert dirichlet["selection"]["rule"] == SELECTION_RULE
