"""A small model every client holds a copy of, next to its own (FML's meme, FedKD's mentee, FedMRL's
shared model).

Its architecture is one the whole federation agrees on: by default the pool's smallest member by
parameter count, the one every client can afford (a method's parameter names another: a pool
member's label or any timm model name). Every client's copy starts from one seeded initialization,
so clients that share the seed need no initial download. ``weighted_average`` is the server's
average of the copies it receives.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.families.feature_head import FeatureHeadModel, split_model
from hfl_bench.pools import ArchPool, PoolMember, build_model, n_params, seeded_model, timm_module
from hfl_bench.training import derive_seed

if TYPE_CHECKING:
    from hfl_bench.data import TaskInfo
    from hfl_bench.federation import RoundView


def param_count(member: PoolMember, info: "TaskInfo") -> int:
    """Parameters of ``member`` on this task, built on the meta device (no memory, no RNG draws)."""
    with torch.device("meta"):
        return n_params(build_model(member, info))


def smallest_member(pool: ArchPool, info: "TaskInfo") -> PoolMember:
    """The pool's smallest member by parameter count (the first one on a tie)."""
    sizes = [param_count(m, info) for m in pool.members]
    return pool.members[sizes.index(min(sizes))]


def resolve_meme_arch(name: str, pool: ArchPool, info: "TaskInfo", who: str = "fml",
                      setting: str = "meme_arch") -> PoolMember:
    """The shared architecture ``name`` names: 'auto' (the smallest member), a pool member's label
    or model, or a timm model name. ``who`` and ``setting`` name the method and its parameter in
    the one-line refusal of anything else."""
    if name == "auto":
        return smallest_member(pool, info)
    for member in pool.members:  # a member keeps its kwargs
        if name in (member.name, member.model):
            return member
    if not timm_module().is_model(name):  # timm imported here, not at start-up
        known = ", ".join(m.name for m in pool.members)
        raise ConfigError(f"{who}: {setting} {name!r} is neither a member of pool {pool.name!r} ({known}) "
                          "nor a registered timm model; use 'auto' for the smallest member")
    return PoolMember(name)


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Weighted mean of floating-point entries (in float64); other entries (e.g. BatchNorm's
    num_batches_tracked) are taken from the first state."""
    total = sum(weights)
    avg = {}
    for key, ref in states[0].items():
        if ref.is_floating_point():
            avg[key] = sum((w / total) * s[key].double() for w, s in zip(weights, states)).to(ref.dtype)
        else:
            avg[key] = ref.clone()
    return avg


def split_shared_model(fed: "RoundView", member: PoolMember, feature_dim: int, tag: str) -> FeatureHeadModel:
    """The shared model split to ``feature_dim`` features and a new head, from one seeded
    initialization (body from ``(tag, "init")``, head from ``(tag, "head")``; the run's global
    RNG stream is left alone)."""
    body = seeded_model(member, fed.info, derive_seed(fed.cfg.seed, tag, "init"), fed.device, keep_global_rng=True)
    return split_model(fed, body, feature_dim, tag, "head")


def client_copies(model: nn.Module, n: int) -> list[nn.Module]:
    """``n`` independent copies of ``model`` (one per client), all equal to it."""
    return [copy.deepcopy(model) for _ in range(n)]
