"""The depth-sliced sub-model family: one global model of K blocks with an exit classifier after
each; a client of depth d trains the first d blocks and their d exits (DepthFL).

Capacity levels are DepthFL's four client groups, lettered as the width family's levels (a the
largest model) so the same profile string means the same clients; the paper letters them the other
way (its a is the shallowest). Level a holds all K blocks, b K-1, c K-2, d K-3 (on the 4-block CPU
model: depths 4, 3, 2, 1). The profile syntax, the counts per level and the seeded
draw of who gets which level are the width family's (``hfl_bench.families.submodel``:
``parse_profile``, ``assign_rates``), so a profile and a seed give every client the same level in
``heterofl`` and in ``depthfl``.

A sub-model is a subset of the global model's entries by name (``hfl_bench.depth_models``), so
aggregation is per tensor: each global tensor becomes the weighted mean over the active clients
whose sub-model holds it; a tensor no active client holds keeps its value. Where every active
client holds a tensor, the sum is formed as FedAvg forms it (the active clients' normalized weights,
float64, in their order), so a run whose clients all hold the whole model averages exactly as
``fedavg`` does.

Local training (``exit_losses``): the sum over the client's exits of each exit's cross-entropy,
plus the mutual self-distillation of DepthFL's eq.: for each exit k, ``kd / (d - 1)`` times the
sum over the other exits j of T^2 KL(softmax(z_j / T) || softmax(z_k / T)), the teacher z_j
detached (each exit learns from the others, none is pulled back by its students).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from hfl_bench.config import ConfigError, param, require_at_least
from hfl_bench.families.submodel import (
    CAPACITIES,
    CAPACITY_STREAM,
    RATE_LEVEL,
    WEIGHTING_HELP,
    WEIGHTINGS,
    assign_rates,
    client_weights,
    parse_profile,
)
from hfl_bench.metering import SERVER, Payload
from hfl_bench.pools import PoolMember, seeded_model
from hfl_bench.training import Trainee, derive_seed, fit, kd_loss, make_plan, soft_targets

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

DEPTH_LEVELS = "abcd"  # a: every block; each later level one block fewer

PROFILE_HELP = ("Capacity profile: levels a-d (a: all K blocks, b: K-1, c: K-2, d: K-3; depths 4, 3, 2, 1 on "
                "depthfl-cnn) with their shares of the clients, joined by '-': a1-b1-c1-d1 (equal shares), a1-d1, "
                "a1 (every client at full depth). Each client's level is a seeded draw, fixed for the run.")
KD_HELP = ("Weight of the mutual self-distillation among a client's exits (DepthFL's eq.); 0: the summed exits' "
           "cross-entropy alone.")
TEMPERATURE_HELP = "Softmax temperature of the self-distillation (DepthFL's code: 1)."
CAPACITY_HELP = ("fixed: each client's level is a seeded draw kept for the run (DepthFL's fixed client groups; the "
                 "only mode depthfl runs). dynamic (levels redrawn each round, heterofl's) is refused.")


@dataclass
class DepthParams:
    profile: str = param("a1-b1-c1-d1", PROFILE_HELP)
    weighting: str = param("uniform", WEIGHTING_HELP)
    kd: float = param(1.0, KD_HELP)
    temperature: float = param(1.0, TEMPERATURE_HELP)
    capacity: str = param("fixed", CAPACITY_HELP)


def level_depth(level: str, full: int) -> int:
    """The number of blocks a client of ``level`` holds in a model of ``full`` blocks."""
    return full - DEPTH_LEVELS.index(level)


def check_levels(name: str, profile: str, full: int | None = None) -> None:
    """Refuse (one line) a level beyond d, or one that would hold no block of a ``full``-block model."""
    for level, _ in parse_profile(profile):
        if level not in DEPTH_LEVELS:
            raise ConfigError(f"{name}: capacity profile {profile!r} names level {level}; depth levels are a-d "
                              "(a: every block, each later level one block fewer)")
        if full is not None and level_depth(level, full) < 1:
            raise ConfigError(f"{name}: capacity profile {profile!r} names level {level}, but the global model "
                              f"has {full} block(s): levels a-{DEPTH_LEVELS[full - 1]} only")


def assign_depths(profile: str, n_clients: int, seed: int, full: int) -> list[int]:
    """Each client's depth: the width family's seeded draw of levels (``assign_rates``), as depths."""
    rates = assign_rates(parse_profile(profile), n_clients, seed)
    return [level_depth(RATE_LEVEL[r], full) for r in rates]


def exit_losses(outs: list[torch.Tensor], y: torch.Tensor, kd: float, temperature: float) -> torch.Tensor:
    """A client's loss on one batch from its exits' logits ``outs`` (module docstring). With one
    exit it is that exit's cross-entropy, the very tensor plain training computes."""
    loss = F.cross_entropy(outs[0], y)
    for z in outs[1:]:
        loss = loss + F.cross_entropy(z, y)
    if kd > 0 and len(outs) > 1:
        teachers = [soft_targets(z.detach(), temperature) for z in outs]
        for k, z in enumerate(outs):
            for j, q in enumerate(teachers):
                if j != k:
                    loss = loss + kd / (len(outs) - 1) * kd_loss(z, q, temperature)
    return loss


def aggregate(state: dict[str, torch.Tensor],
              parts: list[tuple[dict[str, torch.Tensor], float]]) -> dict[str, torch.Tensor]:
    """The new global state (module docstring): ``parts`` are (a client's sub-model state, its
    weight normalized over the active clients), in the active clients' order."""
    out = {}
    for key, ref in state.items():
        held = [(s[key], w) for s, w in parts if key in s]
        if not held:
            out[key] = ref.clone()
        elif not ref.is_floating_point():
            out[key] = held[0][0].clone()  # e.g. BatchNorm's num_batches_tracked: the first holder's, as fedavg
        elif len(held) == len(parts):  # weights already sum to one: FedAvg's sum, term for term
            out[key] = sum(w * t.double() for t, w in held).to(ref.dtype)
        else:
            out[key] = (sum(w * t.double() for t, w in held) / sum(w for _, w in held)).to(ref.dtype)
    return out


class DepthRounds:
    """The family's round (module docstring), mixed into a method before ``Method``
    (``class DepthFL(DepthRounds, Method)``); the method declares its card and ``Params``
    (``DepthParams``)."""

    def __init__(self, params: Any = None):
        super().__init__(params)
        check_levels(self.card.name, self.params.profile)  # refused before any data loads
        if self.params.weighting not in WEIGHTINGS:
            raise ConfigError(f"{self.card.name}: weighting must be {' or '.join(WEIGHTINGS)}, "
                              f"got {self.params.weighting!r}")
        if self.params.capacity not in CAPACITIES:
            raise ConfigError(f"{self.card.name}: capacity must be {' or '.join(CAPACITIES)}, "
                              f"got {self.params.capacity!r}")
        if self.params.capacity == "dynamic":
            raise ConfigError(f"{self.card.name}: capacity=dynamic is not built for the depth family (DepthFL's client "
                              "groups keep their depth for the run); use capacity=fixed")
        require_at_least(self.card.name, self.params, ("kd",), 0.0)
        if not self.params.temperature > 0:
            raise ConfigError(f"{self.card.name}: temperature must be > 0, got {self.params.temperature!r}")

    def check(self, fed: "RoundView") -> None:
        model = fed.clients[0].model
        if not fed.pool.homogeneous or not hasattr(model, "exit_logits"):
            raise ConfigError(f"{self.card.name} slices the depth of one global model with exits; pool "
                              f"{fed.pool.name!r} is not one depth-scalable model. Use its default, --pool depthfl-cnn")
        check_levels(self.card.name, self.params.profile, model.full_depth)

    def setup(self, fed: "RoundView") -> None:
        first = fed.clients[0].model
        self.full_depth = first.full_depth
        self.depths = assign_depths(self.params.profile, fed.n_clients, derive_seed(fed.cfg.seed, CAPACITY_STREAM),
                                    self.full_depth)
        # The server's global model is client 0's initialization, as FedAvg's is.
        self.global_state = {k: v.detach().clone() for k, v in first.state_dict().items()}
        for c in fed.clients:
            # a full-depth client keeps the model and optimizer it was built with
            if self.depths[c.cid] < self.full_depth:
                member = PoolMember(c.arch.model, {**c.arch.kwargs, "depth": self.depths[c.cid]}, c.arch.label)
                c.model = seeded_model(member, fed.info, derive_seed(fed.cfg.seed, "submodel", c.cid), fed.device,
                                       keep_global_rng=True)
                c.optimizer = fed.make_optimizer(c.model)
        self.broadcast(fed, list(range(fed.n_clients)))

    def broadcast(self, fed: "RoundView", clients: list[int]) -> None:
        """Each client gets the global tensors its sub-model holds."""
        for cid in clients:
            model = fed.clients[cid].model
            sub = {k: self.global_state[k].clone() for k in model.state_dict()}
            model.load_state_dict(fed.channel.send(SERVER, [cid], sub, Payload.PARAMS))

    def run_round(self, fed: "RoundView", rnd: int, active: list[int]) -> dict[str, float]:
        kd, temperature = self.params.kd, self.params.temperature
        losses = []
        for i in active:
            c = fed.clients[i]
            model = c.model
            losses += fit(fed, make_plan(fed, i, rnd), [Trainee(model, c.optimizer, f"client {i}", i)],
                          lambda b, m=model: [exit_losses(m.exit_logits(b.x), b.y, kd, temperature)])
        states = [fed.channel.send(i, SERVER, fed.clients[i].model.state_dict(), Payload.PARAMS) for i in active]
        weights = client_weights(fed, active, self.params.weighting)
        self.global_state = aggregate(self.global_state, list(zip(states, weights)))
        self.broadcast(fed, list(range(fed.n_clients)))
        return {"train_loss": sum(losses) / len(losses)}

    def changed_clients(self, fed: "RoundView", active: list[int]) -> list[int]:
        return list(range(fed.n_clients))

    def describe_run(self, fed: "RoundView") -> dict[str, Any]:
        """Each client's depth (its capacity level) and its sub-model's parameter count."""
        return {"capacity_profile": self.params.profile,
                "client_depths": list(self.depths),
                "client_params": [sum(p.numel() for p in c.model.parameters()) for c in fed.clients]}
