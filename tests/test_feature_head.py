"""The feature / head split (hfl_bench.families.feature_head): every built-in pool member splits the
way timm's models do, the split model computes what the member computed before, and the
parameter-free width fitting is HtFLlib's ``AdaptiveAvgPool1d``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.families.feature_head import FeatureHeadModel, NearestPrototype, check_split, fit_width
from hfl_bench.pools import build_model
from tests.test_pools import MULTIMODAL_TASKS, TASK_NAMES, TEXT_TASKS, _task_info, _unique_members

# Members without a feature / head split, and why: methods that need one refuse them in one line
# (the test after the next).
NO_SPLIT = {"depthfl_cnn": "DepthFL's model predicts with the mean of its exits' heads: no single head"}


@pytest.mark.parametrize("member", [m for m in _unique_members() if m.model not in NO_SPLIT], ids=lambda m: m.model)
def test_member_splits_into_features_and_head(member):
    """forward == classifier(forward_head(forward_features(x), pre_logits=True)) exactly, and the
    pre-logit features have ``num_features`` values (first task of the member's kind)."""
    info = _task_info(MULTIMODAL_TASKS[0] if member.multimodal else TEXT_TASKS[0] if member.text else TASK_NAMES[0])
    torch.manual_seed(0)
    model = build_model(member, info).eval()
    check_split(model, member.name)
    x = torch.randint(0, 100, (3, *info.input_shape)) if member.text else torch.randn(3, *info.input_shape)
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
        assert features.shape == (3, model.num_features)
        assert torch.equal(model(x), model.get_classifier()(features))
        split = FeatureHeadModel(model, 40, info.num_classes).eval()
        assert split.forward_features(x).shape == (3, 40)
        assert split(x).shape == (3, info.num_classes)
    assert split.get_classifier() is split.head


@pytest.mark.parametrize("name", sorted(NO_SPLIT))
def test_a_member_without_a_split_is_refused_in_one_line(name):
    from hfl_bench.config import ConfigError

    member = next(m for m in _unique_members() if m.model == name)
    model = build_model(member, _task_info(TASK_NAMES[0]))
    with pytest.raises(ConfigError, match="has no feature / head split") as e:
        check_split(model, member.name)
    assert "\n" not in str(e.value)


def test_split_drops_the_member_classifier():
    info = _task_info("digits")
    member = next(m for m in _unique_members() if m.model == "cnn_small")
    model = build_model(member, info)
    old_head = model.get_classifier()
    split = FeatureHeadModel(model, 64, info.num_classes)
    assert all(p is not q for p in split.parameters() for q in old_head.parameters())
    assert isinstance(split.backbone.get_classifier(), nn.Identity)


@pytest.mark.parametrize("native,width", [(32, 128), (128, 128), (512, 128), (100, 512), (96, 64)])
def test_fit_width_is_adaptive_average_pooling(native, width):
    x = torch.randn(5, native)
    expected = nn.AdaptiveAvgPool1d(width)(x.unsqueeze(1)).squeeze(1)
    assert torch.equal(fit_width(x, width), expected)


def test_fit_width_repeats_and_averages():
    x = torch.tensor([[1.0, 2.0]])
    assert fit_width(x, 4).tolist() == [[1.0, 1.0, 2.0, 2.0]]
    assert fit_width(torch.tensor([[1.0, 3.0, 5.0, 7.0]]), 2).tolist() == [[2.0, 6.0]]


def test_a_model_without_the_split_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="no feature / head split"):
        FeatureHeadModel(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), 16, 10)


def test_nearest_prototype_predicts_the_closest_present_class():
    class Identity(nn.Module):
        def forward_features(self, x):
            return x

    protos = torch.tensor([[0.0, 0.0], [10.0, 10.0], [1.0, 1.0]])
    present = torch.tensor([True, True, False])  # class 2 has no prototype: never predicted
    clf = NearestPrototype(Identity(), protos, present)
    logits = clf(torch.tensor([[0.9, 1.1], [9.0, 8.0]]))
    assert logits.argmax(1).tolist() == [0, 1]
    # the lowest finite value, not -inf (an infinity reads as a diverged model)
    assert (logits[:, 2] == torch.finfo(logits.dtype).min).all() and torch.isfinite(logits).all()
