"""Aggregation rules against hand-computed cases, including CRAD's edge cases."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hfl_bench.aggregation import (
    AGGREGATORS,
    FIRST_VERSION,
    aggregator_version,
    get_aggregator,
    masked_median,
    register_aggregator,
    run_version,
)
from hfl_bench.recording import registered_version
from hfl_bench.testing import builtin_names

# The rules hfl-bench registers, each named here so that a removed one fails below; the tests that
# run every rule enumerate the registry (ALL_RULES), so a new rule runs them without being listed.
NAMED_RULES = ["uniform", "entropy", "crad", "crad-accuracy", "crad-support", "crad-softmax", "crad-lcb",
               "crad-inv-sigma", "crad-ce", "crad-stage1", "crad-no-agreement-filter", "crad-support-filter-only"]
ALL_RULES = builtin_names(AGGREGATORS)


def precision(a: float, n: float) -> float:
    a_s = (a * n + 2) / (n + 4)
    return 1.0 / (a_s * (1 - a_s) / (n + 4) + 1e-8)


def test_every_rule_is_registered():
    assert set(NAMED_RULES) <= set(ALL_RULES) <= set(AGGREGATORS.names())


def test_uniform_is_the_mean():
    probs = torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]])
    q = get_aggregator("uniform")(probs, None, None)
    assert torch.allclose(q, torch.tensor([[0.7, 0.3]]))


def test_entropy_weights_hand_computed():
    probs = torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]])
    h = [-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)), math.log(2)]
    w0 = math.exp(-h[0]) / (math.exp(-h[0]) + math.exp(-h[1]))
    expected = torch.tensor([[w0 * 0.9 + (1 - w0) * 0.5, w0 * 0.1 + (1 - w0) * 0.5]])
    q = get_aggregator("entropy")(probs, None, None)
    # float32 probabilities (<= 1) from a few elementwise ops and sums over <= 3 teachers, against a float64
    # hand computation: rounding <= ~10 x 6e-8 < 1e-6 (the same atol below)
    assert torch.allclose(q, expected, atol=1e-6)


def test_crad_hand_computed_case():
    # Three teachers, one sample, two classes.
    probs = torch.tensor([[[0.9, 0.1]], [[0.6, 0.4]], [[0.2, 0.8]]])
    counts = torch.tensor([[10.0, 10.0], [1.0, 10.0], [10.0, 10.0]])
    accs = torch.tensor([[0.8, 0.5], [1.0, 0.9], [0.5, 0.7]])
    # Class 0: teacher 1 has a single validation sample -> dropped by the support filter.
    # Survivors 0 and 2 deviate equally from their mean (0.55), so both pass the median filter.
    w0, w2 = precision(0.8, 10), precision(0.5, 10)
    q0 = (w0 * 0.9 + w2 * 0.2) / (w0 + w2 + 1e-8)
    # Class 1: all supported; mean 0.4333; deviations 0.333, 0.033, 0.367; median 0.333 keeps 0 and 1.
    v0, v1 = precision(0.5, 10), precision(0.9, 10)
    q1 = (v0 * 0.1 + v1 * 0.4) / (v0 + v1 + 1e-8)
    expected = torch.tensor([[q0, q1]]) / (q0 + q1)
    q = get_aggregator("crad")(probs, counts, accs)
    assert torch.allclose(q, expected.float(), atol=1e-6)
    # The uniform mean differs: the test can tell the rules apart.
    assert not torch.allclose(q, probs.mean(0), atol=1e-3)


def test_crad_falls_back_to_plain_mean_for_unsupported_class():
    probs = torch.tensor([[[0.7, 0.3]], [[0.1, 0.9]]])
    counts = torch.tensor([[5.0, 1.0], [5.0, 0.0]])  # nobody has >= 2 samples of class 1
    accs = torch.tensor([[1.0, 1.0], [0.2, 0.0]])
    q = get_aggregator("crad")(probs, counts, accs)
    w0, w1 = precision(1.0, 5), precision(0.2, 5)
    # class 0: both supported, deviations equal (0.3) -> both kept, precision-weighted
    q0 = (w0 * 0.7 + w1 * 0.1) / (w0 + w1 + 1e-8)
    q1 = (0.3 + 0.9) / 2  # fallback: plain mean of all teachers
    assert torch.allclose(q, torch.tensor([[q0, q1]]) / (q0 + q1), atol=1e-6)


def test_crad_min_support_is_a_hyperparameter():
    probs = torch.tensor([[[0.7, 0.3]], [[0.1, 0.9]]])
    counts = torch.tensor([[3.0, 3.0], [1.0, 1.0]])
    accs = torch.ones(2, 2)
    strict = get_aggregator("crad", min_support=2)(probs, counts, accs)
    # teacher 1 is dropped everywhere -> teacher 0 alone
    assert torch.allclose(strict, probs[0], atol=1e-6)
    loose = get_aggregator("crad", min_support=1)(probs, counts, accs)
    assert not torch.allclose(loose, probs[0], atol=1e-3)


def test_masked_median_even_and_odd_counts():
    values = torch.tensor([[1.0], [4.0], [2.0], [8.0]])
    everyone = torch.ones_like(values, dtype=torch.bool)
    assert masked_median(values, everyone).item() == pytest.approx(3.0)
    three = torch.tensor([[True], [True], [True], [False]])
    assert masked_median(values, three).item() == pytest.approx(2.0)
    nobody = torch.zeros_like(values, dtype=torch.bool)
    assert math.isinf(masked_median(values, nobody).item())


def test_crad_agreement_filter_keeps_half_of_four():
    # Four supported teachers on class 0 with distinct deviations: the median keeps exactly two.
    p0 = torch.tensor([0.50, 0.55, 0.70, 0.05])
    probs = torch.stack([p0, 1 - p0], dim=-1).unsqueeze(1)  # [4, 1, 2]
    counts = torch.full((4, 2), 50.0)
    accs = torch.full((4, 2), 0.9)
    q = get_aggregator("crad")(probs, counts, accs)
    # equal weights; class 0 mean 0.45 -> deviations .05 .10 .25 .40 -> keep teachers 0, 1
    # class 1 values .50 .45 .30 .95, mean .55 -> deviations .05 .10 .25 .40 -> keep 0, 1
    q0, q1 = (0.50 + 0.55) / 2, (0.50 + 0.45) / 2
    assert torch.allclose(q, torch.tensor([[q0, q1]]) / (q0 + q1), atol=1e-6)


@pytest.mark.parametrize("rule", ALL_RULES)
def test_every_rule_returns_a_distribution(rule):
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(6, 17, 5, generator=gen) * 3, dim=-1)
    counts = torch.randint(0, 6, (6, 5), generator=gen).float()
    counts[:, 2] = 0  # a class nobody holds
    accs = torch.rand(6, 5, generator=gen)
    accs[0] = 0.0  # accuracy-only weights can vanish
    q = get_aggregator(rule)(probs, counts, accs)
    assert q.shape == (17, 5)
    assert torch.isfinite(q).all()
    assert (q >= 0).all()
    # a float32 renormalized distribution over 5 classes sums to 1 within a few eps (6e-8 each); 1e-5 leaves
    # margin for the rules' weights (up to ~1e8 before normalizing), which only scale, never reorder
    assert torch.allclose(q.sum(-1), torch.ones(17), atol=1e-5)


@pytest.mark.parametrize("rule", ALL_RULES)
def test_single_teacher_is_returned_unchanged(rule):
    probs = torch.softmax(torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(0)), dim=-1)
    q = get_aggregator(rule)(probs, torch.full((1, 3), 9.0), torch.full((1, 3), 0.7))
    assert torch.allclose(q, probs[0], atol=1e-6)


def test_table4_weightings_differ_from_precision():
    gen = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(8, 32, 4, generator=gen) * 2, dim=-1)
    counts = torch.randint(2, 60, (8, 4), generator=gen).float()
    accs = torch.rand(8, 4, generator=gen)
    base = get_aggregator("crad")(probs, counts, accs)
    for rule in ["crad-accuracy", "crad-support", "crad-lcb", "crad-inv-sigma", "crad-ce"]:
        other = get_aggregator(rule)(probs, counts, accs)
        # rounding is ~1e-7 here, so a rule that agrees within 1e-4 would be the same rule
        assert not torch.allclose(base, other, atol=1e-4), rule


# --------------------------------------------------------------------------- the filter ablations

# The hand-computed case of test_crad_hand_computed_case: three teachers, one sample, two classes.
# Class 0: teacher 1 holds one validation sample (dropped by the support filter); teachers 0 and 2
# deviate equally from their mean and both pass the agreement filter. Class 1: every teacher is
# supported; teacher 2 (0.8) deviates most from the mean 0.433 and only the agreement filter drops it.
CASE_PROBS = torch.tensor([[[0.9, 0.1]], [[0.6, 0.4]], [[0.2, 0.8]]])
CASE_COUNTS = torch.tensor([[10.0, 10.0], [1.0, 10.0], [10.0, 10.0]])
CASE_ACCS = torch.tensor([[0.8, 0.5], [1.0, 0.9], [0.5, 0.7]])


def _case(rule: str) -> torch.Tensor:
    return get_aggregator(rule)(CASE_PROBS, CASE_COUNTS, CASE_ACCS)


def _normalized(q0: float, q1: float) -> torch.Tensor:
    return torch.tensor([[q0, q1]]) / (q0 + q1)


def test_stage1_gives_the_survivors_equal_weights():
    # crad's survivors (class 0: teachers 0, 2; class 1: teachers 0, 1), each counted once
    expected = _normalized((0.9 + 0.2) / 2, (0.1 + 0.4) / 2)
    assert torch.allclose(_case("crad-stage1"), expected.float(), atol=1e-6)
    # crad weights the same survivors by precision: the two differ here
    assert not torch.allclose(_case("crad"), _case("crad-stage1"), atol=1e-3)


def test_no_agreement_filter_keeps_the_disagreeing_teacher():
    w0, w2 = precision(0.8, 10), precision(0.5, 10)
    q0 = (w0 * 0.9 + w2 * 0.2) / (w0 + w2 + 1e-8)  # class 0: as crad (the support filter still drops teacher 1)
    v0, v1, v2 = precision(0.5, 10), precision(0.9, 10), precision(0.7, 10)
    q1 = (v0 * 0.1 + v1 * 0.4 + v2 * 0.8) / (v0 + v1 + v2 + 1e-8)  # class 1: teacher 2 keeps its mass
    q = _case("crad-no-agreement-filter")
    assert torch.allclose(q, _normalized(q0, q1).float(), atol=1e-6)
    assert q[0, 1] > _case("crad")[0, 1] + 0.05  # teacher 2's 0.8 pulls class 1 up


def test_support_filter_only_is_the_mean_of_the_supported_teachers():
    expected = _normalized((0.9 + 0.2) / 2, (0.1 + 0.4 + 0.8) / 3)
    assert torch.allclose(_case("crad-support-filter-only"), expected.float(), atol=1e-6)
    # with every teacher supported it is the uniform mean, whatever the accuracies
    counts = torch.full((3, 2), 10.0)
    q = get_aggregator("crad-support-filter-only")(CASE_PROBS, counts, CASE_ACCS)
    assert torch.allclose(q, CASE_PROBS.mean(0), atol=1e-6)


def test_the_ablations_keep_the_shared_fallback_and_min_support():
    # nobody holds >= 2 samples of class 1: every rule takes the plain mean of all teachers there
    probs = torch.tensor([[[0.7, 0.3]], [[0.1, 0.9]]])
    counts = torch.tensor([[5.0, 1.0], [5.0, 0.0]])
    accs = torch.tensor([[1.0, 1.0], [0.2, 0.0]])
    for rule in ("crad-stage1", "crad-no-agreement-filter", "crad-support-filter-only"):
        q = get_aggregator(rule)(probs, counts, accs)
        w0, w1 = (precision(1.0, 5), precision(0.2, 5)) if rule == "crad-no-agreement-filter" else (1.0, 1.0)
        q0 = (w0 * 0.7 + w1 * 0.1) / (w0 + w1 + 1e-8)
        assert torch.allclose(q, _normalized(q0, (0.3 + 0.9) / 2).float(), atol=1e-6), rule
        # min_support reaches them as it reaches crad (what the peer-KD methods pass)
        strict = get_aggregator(rule, min_support=6)(probs, counts, accs)
        assert torch.allclose(strict, probs.mean(0), atol=1e-6), rule


# --------------------------------------------------------------------------- weights that vanish


def test_accuracy_weights_all_zero_keep_the_class_mass():
    # Round 1: no teacher got a validation sample of class 1 right. Accuracy-only weights are 0 for
    # every survivor; 1.0 gave class 1 no target mass (q = 0 / eps), so students were distilled away
    # from it. The class takes its survivors' uniform mean instead.
    probs = torch.tensor([[[0.5, 0.5]], [[0.25, 0.75]], [[0.75, 0.25]]])  # exact in binary: no rounding ties
    counts = torch.full((3, 2), 10.0)
    accs = torch.tensor([[0.9, 0.0], [0.8, 0.0], [0.6, 0.0]])
    q = get_aggregator("crad-accuracy")(probs, counts, accs)
    # class 0: mean .5, deviations 0 .25 .25, the median .25 keeps all three, weighted by accuracy
    q0 = (0.9 * 0.5 + 0.8 * 0.25 + 0.6 * 0.75) / (0.9 + 0.8 + 0.6 + 1e-8)
    # class 1: likewise all three survive, all at accuracy 0: their uniform mean
    q1 = (0.5 + 0.75 + 0.25) / (3 + 1e-8)
    assert torch.allclose(q, _normalized(q0, q1).float(), atol=1e-6)
    assert q[0, 1] > 0.4
    # one survivor with a positive accuracy takes all the weight: the fallback is only for all-zero
    accs[1, 1] = 0.1
    q = get_aggregator("crad-accuracy")(probs, counts, accs)
    assert torch.allclose(q, _normalized(q0, 0.75).float(), atol=1e-6)


def test_support_weights_all_zero_keep_the_class_mass():
    # min_support=0 keeps teachers without a sample of a class; support-only weights of 0 for all
    probs = torch.tensor([[[0.6, 0.4]], [[0.2, 0.8]]])
    counts = torch.tensor([[10.0, 0.0], [10.0, 0.0]])
    q = get_aggregator("crad-support", min_support=0)(probs, counts, torch.ones(2, 2))
    assert torch.allclose(q, probs.mean(0), atol=1e-6)


def test_precision_weights_never_vanish_so_crad_is_unchanged():
    # the fallback replaces nothing where a weight is positive: crad's own case, for the record
    q = get_aggregator("crad")(CASE_PROBS, CASE_COUNTS, torch.zeros(3, 2))
    w0, w2 = precision(0.0, 10), precision(0.0, 10)
    assert w0 > 0 and w2 > 0
    assert torch.isfinite(q).all() and (q > 0).all()


# --------------------------------------------------------------------------- versions


def test_rules_have_versions_and_a_fixed_rule_moves_its_runs_version():
    assert aggregator_version("crad") == FIRST_VERSION == "1.0"
    assert {aggregator_version(name) for name in ("crad-accuracy", "crad-support")} == {"1.1"}
    for name in ("crad-stage1", "crad-no-agreement-filter", "crad-support-filter-only", "uniform", "entropy"):
        assert aggregator_version(name) == FIRST_VERSION, name
    # a run records its rule's version in its method version once the rule is past 1.0
    assert run_version("1.0", {"aggregator": "crad"}) == "1.0"
    assert run_version("1.0", {"aggregator": "crad-accuracy"}) == "1.0+crad-accuracy-1.1"
    assert run_version("2.3", {"lam": 0.7}) == "2.3"  # a method without an aggregation rule
    assert run_version("1.0", {"aggregator": "no-such-rule"}) == "1.0"  # refused by the method itself
    # what run, matrix resume and check_same_data compare a record against: from the run's --set values
    assert registered_version("crad") == "1.0"
    assert registered_version("crad", {"aggregator": "crad-accuracy"}) == "1.0+crad-accuracy-1.1"
    assert registered_version("uniform-kd", {"aggregator": "crad-support"}) == "1.0+crad-support-1.1"
    assert registered_version("local") == "1.0"


def test_a_rule_declares_a_version_in_digits_and_dots():
    with pytest.raises(ValueError, match="digits and dots"):
        register_aggregator("test-bad-version", version="1.0-beta")
    assert "test-bad-version" not in AGGREGATORS.names()


def test_a_record_of_a_rules_earlier_numerics_is_not_this_codes_result(tmp_path):
    """A finished crad-accuracy record written before the fix (method version 1.0) is neither this
    code's result nor overwritten (``check_same_data``, which ``run`` and matrix resume share);
    crad's own records, whose rule is unchanged, stay this code's."""
    from hfl_bench.config import ConfigError, RunConfig
    from hfl_bench.recording import check_same_data

    path = tmp_path / "record.json"
    for params, recorded, refused in [({"aggregator": "crad-accuracy"}, "1.0", True),
                                      ({"aggregator": "crad-accuracy"}, "1.0+crad-accuracy-1.1", False),
                                      ({}, "1.0", False)]:
        record = {"schema_version": "1.6", "status": "ok", "method": {"name": "crad", "version": recorded}}
        path.write_text(json.dumps(record))
        cfg = RunConfig(method="crad", task="digits", method_params=params)
        if refused:
            with pytest.raises(ConfigError, match=r"from crad 1\.0, but this code's crad is 1\.0\+crad-accuracy-1\.1"):
                check_same_data(cfg, path)
        else:
            check_same_data(cfg, path)
