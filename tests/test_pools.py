"""Architecture pools: every member builds through timm for every built-in task's input shape."""

from __future__ import annotations

import pytest
import timm
import torch

from hfl_bench.data import get_task
from hfl_bench.pools import ArchPool, PoolMember, build_model, get_pool, n_params
from hfl_bench.registry import POOLS, RegistryError
from hfl_bench.testing import builtin_names

TASK_NAMES = ["digits", "mnist1d", "cifar10", "cifar100", "pathmnist", "hapt"]
MULTIMODAL_TASKS = ["digits-mnist1d"]
TEXT_TASKS = ["rotten-tomatoes"]
BATCH = 2


def _unique_members() -> list[PoolMember]:
    seen: dict[tuple, PoolMember] = {}
    for pool in (POOLS.get(n) for n in builtin_names(POOLS)):
        for m in pool.members:
            seen.setdefault((m.model, tuple(sorted(m.kwargs.items()))), m)
    return list(seen.values())


def _task_info(name):
    from hfl_bench.registry import TASKS

    return TASKS.get(name).info  # a class attribute: no data loaded


@pytest.mark.parametrize("member", _unique_members(), ids=lambda m: m.model)
def test_member_builds_and_forwards_for_every_task(member):
    """Every member builds for every task of its kind (one modality, or several; token ids)."""
    assert timm.is_model(member.model)
    for task in (MULTIMODAL_TASKS if member.multimodal else TEXT_TASKS if member.text else TASK_NAMES):
        info = _task_info(task)
        torch.manual_seed(0)
        model = build_model(member, info).eval()
        assert isinstance(model, torch.nn.Module)
        x = (torch.randint(0, 100, (BATCH, *info.input_shape)) if member.text
             else torch.randn(BATCH, *info.input_shape))
        with torch.no_grad():
            y = model(x)
        assert y.shape == (BATCH, info.num_classes), (member.model, task)
        assert torch.isfinite(y).all()


def test_every_pool_member_is_a_timm_model():
    assert {"paper", "cpu", "cpu-cnn", "paper-resnet18"} <= set(POOLS.names())
    for name, pool in ((n, POOLS.get(n)) for n in builtin_names(POOLS)):
        assert isinstance(pool, ArchPool) and pool.name == name
        assert pool.members and pool.description
        for m in pool.members:
            assert timm.is_model(m.model), (name, m.model)


def test_get_task_info_matches_registry_class():
    # The instance from get_task carries the same class-level info the test above uses.
    for task in TASK_NAMES:
        assert get_task(task).info is _task_info(task)


def test_round_robin_assignment():
    for name in ("paper", "cpu"):
        pool = get_pool(name)
        assert len(pool.members) == 3
        got = pool.assign(7)
        assert len(got) == 7
        assert got == [pool.members[i % 3] for i in range(7)]
    single = get_pool("cpu-cnn").assign(5)
    assert len(single) == 5 and all(m is get_pool("cpu-cnn").members[0] for m in single)
    assert get_pool("paper").assign(0) == []


def test_homogeneous():
    assert not get_pool("paper").homogeneous
    assert not get_pool("cpu").homogeneous
    assert get_pool("cpu-cnn").homogeneous
    assert get_pool("paper-resnet18").homogeneous
    same_twice = ArchPool("x", (PoolMember("cnn_small"), PoolMember("cnn_small", label="other")))
    assert same_twice.homogeneous  # the label does not change the architecture
    differing = ArchPool("y", (PoolMember("cnn_small"), PoolMember("cnn_small", kwargs={"foo": 1})))
    assert not differing.homogeneous


def test_member_names():
    names = [m.name for m in get_pool("paper").members]
    assert names == ["resnet18", "resnet18-half", "cnn6"]
    assert PoolMember("cnn6").name == "cnn6"


def test_paper_pool_parameter_counts():
    info = _task_info("cifar10")
    counts = {m.name: n_params(build_model(m, info)) for m in get_pool("paper").members}
    assert 11.0e6 <= counts["resnet18"] <= 11.4e6
    assert 2.6e6 <= counts["resnet18-half"] <= 3.0e6
    assert 0.5e6 <= counts["cnn6"] <= 1.0e6
    assert counts["resnet18"] > counts["resnet18-half"] > counts["cnn6"]


def test_resnet18_at_32x32_eval():
    info = _task_info("cifar100")
    model = build_model(get_pool("paper-resnet18").members[0], info).eval()
    with torch.no_grad():
        out = model(torch.randn(BATCH, 3, 32, 32))
    assert out.shape == (BATCH, 100)


def test_unknown_pool():
    with pytest.raises(RegistryError, match="Did you mean 'paper'"):
        get_pool("papr")
