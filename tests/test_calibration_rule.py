"""benchmarks/calibrate.py's rule on `local`'s curves: rule 3, its 3b amendment for a curve that
still creeps up, and the committed summary read back through the same functions (no run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibrate as cal  # noqa: E402

SUMMARY = json.loads((ROOT / "benchmarks" / "results" / "calibration.json").read_text())


def _curve(n: int, level, rounds: int) -> tuple[list[int], list[float]]:
    return list(range(1, rounds + 1)), [level(r) for r in range(1, rounds + 1)][:n]


def test_a_flat_curve_passes_rule_3_just_after_its_knee():
    rounds, val = _curve(100, lambda r: min(r, 20) * 4.0, 100)  # rises to 80 by round 20, then flat
    # the 5-round trailing mean is within a point of 80 at round 23 (76, 80, 80, 80, 80: 79.2)
    assert cal.converged(rounds, val, 100) == (23, "3")


def test_a_creeping_curve_fails_rule_3_at_every_length_but_keeps_one_plateau_round():
    # A fast rise to 60 by round 30, then 0.75 points every 50 rounds: within a point of the end's
    # best only in the study's last 67 rounds, whatever its length.
    def level(r: int) -> float:
        return min(r, 30) * 2.0 + max(0, r - 30) * 0.015

    seen = set()
    for length in (150, 200, 300):
        rounds, val = _curve(length, level, length)
        conv, rule = cal.converged(rounds, val, length)
        assert cal.convergence_round(rounds, val) > length // 2  # rule 3 alone never passes
        assert rule == "3b"
        seen.add(conv)
    assert len(seen) == 1  # the plateau round does not move with the study's length
    (plateau,) = seen
    assert 30 <= plateau <= 35  # the knee (the 5-round trailing mean reaches it a few rounds late)


def test_the_plateau_window_must_fit_in_the_study():
    rounds, val = _curve(60, lambda r: min(r, 10) * 5.0 + r * 0.05, 60)  # creeps 2.5 points in 50 rounds
    assert cal.plateau_round(rounds, val) is None
    rounds, val = _curve(40, lambda r: min(r, 10) * 5.0, 40)  # flat, but no 50-round window fits
    assert cal.plateau_round(rounds, val) is None
    assert cal.converged(rounds, val, 40) == (13, "3")  # rule 3 needs no window (45, 50, 50, 50, 50: 49)


def test_a_curve_still_climbing_passes_neither():
    rounds, val = _curve(100, lambda r: r * 0.5, 100)  # a point every two rounds, to the end
    conv, rule = cal.converged(rounds, val, 100)
    assert rule is None and conv > 50


@pytest.mark.parametrize("task", sorted(SUMMARY["tasks"]))
def test_the_committed_summary_is_what_the_rule_says(task):
    """Every configuration's convergence round, verdict and the task's choice and rounds, recomputed
    from the curves the summary holds."""
    entry, study = SUMMARY["tasks"][task], SUMMARY["rule"]["study_rounds"][task]
    assert SUMMARY["rule"]["plateau_window"] == cal.PLATEAU_WINDOW
    for row in entry["configs"]:
        val = row["val_curve"]
        assert len(val) == study
        conv, rule = cal.converged(list(range(1, study + 1)), val, study)
        assert (conv, rule) == (row["convergence_round"], row["converged_by_rule"])
        assert row["passes"]["converged"] is (rule is not None)
    chosen = cal.choose(entry["configs"])
    keys = ("batch_size", "lr", "local_epochs", "heldout_fraction")
    assert (None if chosen is None else {k: chosen[k] for k in keys}) == entry["chosen"]
    assert (None if chosen is None else cal.rounds_for(chosen["convergence_round"])) == entry["rounds"]


@pytest.mark.parametrize("task", sorted(SUMMARY["tasks"]))
def test_rule_3b_changes_no_choice_rule_3_had_made(task):
    """Rule 3 alone (3b's passes taken away) against the amended rule: every task rule 3 calibrated
    keeps its configuration and rounds; only a task rule 3 left undecided gains a choice."""
    entry = SUMMARY["tasks"][task]
    rule3_only = [{**r, "passes": {**r["passes"], "converged": r["converged_by_rule"] == "3"}}
                  for r in entry["configs"]]
    before, after = cal.choose(rule3_only), cal.choose(entry["configs"])
    if before is None:
        assert task == "cifar10-jpg-full"  # the one study rule 3 never passed (docs/studies/calibration.md)
        assert after is not None and after["converged_by_rule"] == "3b"
    else:
        keys = ("batch_size", "lr", "local_epochs", "heldout_fraction", "convergence_round")
        assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
        assert after["converged_by_rule"] == "3"


@pytest.mark.parametrize("task", sorted(SUMMARY["tasks"]))
def test_each_task_defaults_to_what_its_calibration_chose(task):
    from hfl_bench.data import get_task

    entry, defaults = SUMMARY["tasks"][task], get_task(task).info.defaults
    assert entry["rounds"] == defaults["rounds"]
    assert entry["chosen"] == {k: defaults[k] for k in ("batch_size", "lr", "local_epochs", "heldout_fraction")}
