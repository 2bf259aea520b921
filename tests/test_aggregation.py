"""Aggregation rules against hand-computed cases, including CRAD's edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from hfl_bench.aggregation import AGGREGATORS, get_aggregator, masked_median

ALL_RULES = ["uniform", "entropy", "crad", "crad-accuracy", "crad-support", "crad-softmax", "crad-lcb",
             "crad-inv-sigma", "crad-ce"]


def precision(a: float, n: float) -> float:
    a_s = (a * n + 2) / (n + 4)
    return 1.0 / (a_s * (1 - a_s) / (n + 4) + 1e-8)


def test_every_rule_is_registered():
    assert set(ALL_RULES) <= set(AGGREGATORS.names())


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
