"""The width-sliced sub-model family: one global model, each client trains a slice of its width.

Shared by HeteroFL (static slices: the first ceil(r * C) channels of every hidden layer), FedRolex
(rolling slices: a window of ceil(r * C) channels whose start moves by one channel index each round,
wrapping around) and FjORD (HeteroFL's static slices, each trained at widths sampled below its own).
A client's capacity level is fixed for the run (a seeded draw from the capacity profile: HeteroFL's
'fixed' mode) or, with ``capacity=dynamic`` (HeteroFL's 'dynamic' mode), redrawn every round for
every client from the profile's shares (``draw_rates``). The global model's architecture is the
pool's one member, built at width rate 1, and each client's model is the same architecture built
at its rate (``hfl_bench.width_models``), whose ``width_axes`` say which hidden layer each
parameter dimension slices.

Aggregation: each global parameter entry becomes the weighted mean over the active clients whose
sub-model holds it (weights: training sizes, or uniform as HeteroFL's code counts); an entry no
active client holds keeps its value. Where every active client holds an entry, the weights are the
active clients' normalized weights and the sum is formed as FedAvg forms it, so with every client
at full capacity the family computes exactly what FedAvg computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hfl_bench.capacity import (  # noqa: F401 (re-exported: the family's levels and fixed draw)
    CAPACITY_STREAM,
    LEVELS,
    PROFILE_PART,
    RATE_LEVEL,
    assign_rates,
    parse_profile,
)
from hfl_bench.config import ConfigError, param
from hfl_bench.graphs import train_students
from hfl_bench.metering import SERVER, Payload
from hfl_bench.pools import PoolMember, seeded_model
from hfl_bench.training import derive_seed, make_plan
from hfl_bench.width_models import scaled_width

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

WEIGHTINGS = ("uniform", "samples")
CAPACITIES = ("fixed", "dynamic")

PROFILE_HELP = ("Capacity profile: levels a-e (width rates 1, 1/2, 1/4, 1/8, 1/16) with their shares of the clients, "
                "joined by '-': a1-b1-c1-d1-e1 (equal shares), a1-e1, a1 (every client at full capacity = FedAvg). "
                "Each client's level is a seeded draw, fixed for the run.")
CAPACITY_HELP = ("fixed (HeteroFL's 'fixed' mode): each client's level is a seeded draw kept for the run; dynamic "
                 "(its 'dynamic' mode): every round each client's level is redrawn, independently, with the profile's "
                 "shares as probabilities, seeded by the run's seed and the round.")
WEIGHTING_HELP = ("How the clients holding a parameter entry are averaged: uniform (HeteroFL's and FedRolex's code: "
                  "a plain mean) or samples (weighted by training size, as fedavg is).")


@dataclass
class SubmodelParams:
    profile: str = param("a1-b1-c1-d1-e1", PROFILE_HELP)
    weighting: str = param("uniform", WEIGHTING_HELP)
    capacity: str = param("fixed", CAPACITY_HELP)


SUBMODEL_NOTES = (
    "model: HeteroFL's CNN (conv 3x3 with bias, scaler, static BN without running statistics, ReLU, 2x2 max-pool "
    "after all but the last layer, global average pooling, linear); pool heterofl-cnn at a quarter of the paper's "
    "widths (16-128 channels) for the CPU, heterofl-cnn-paper at 64-512; or (--pool heterofl-resnet18, "
    "heterofl-resnet18-paper) HeteroFL's pre-activation ResNet-18 with the scaler and static BN, each stage one "
    "hidden layer (its blocks add into one residual stream)",
    "static BN: no running statistics, so evaluation normalizes with each evaluation batch's own statistics (the "
    "paper's post-training pass that gathers global statistics is not run)",
    "a hidden layer at rate r keeps ceil(r * C) channels; the first layer's input channels and the classes are "
    "never sliced",
    "capacity levels fixed per client for the run by default (the paper's 'fixed' mode): counts in proportion to "
    "the profile's shares by largest remainder, then a seeded shuffle",
    "capacity=dynamic (the paper's 'dynamic' mode): every round each client's level is an independent draw with "
    "the profile's shares as probabilities (the authors' code: a multinomial draw per user each round), seeded by "
    "the run's seed and the round, so the same in every method and whichever clients are active; a client whose "
    "level changes gets a sub-model built at its new rate, its momentum carried with the entries it keeps (new "
    "entries start at zero; the authors' code starts a fresh optimizer every round); the record's run_details "
    "hold every round's levels (round_levels, one letter per client)",
    "with capacity=dynamic the record's FLOPs and the simulated clock count each client at the width of the "
    "sub-model it holds at the end of the run (the counter measures one model per client)",
    "aggregation: each global entry is the mean over the active clients holding it (uniform by default, as the "
    "authors' code; weighting=samples weights by training size); an entry no active client holds keeps its value",
    "the classifier rows of classes a client does not hold are averaged like any other entry (the authors' "
    "label-split masking of the output layer is not applied)",
    "the server's initial global model is client 0's initialization; every client receives its slice of the new "
    "global model at the end of each round and keeps its optimizer (momentum) across rounds, as fedavg does",
    "headline: each client's own sub-model on its local test half and on the global test set, as for every method; "
    "the paper reports the full global model on the global test set",
)

Indices = dict[int, torch.Tensor]  # hidden layer -> the global channel indices a sub-model holds


def draw_rates(profile: list[tuple[str, int]], n_clients: int, seed: int, rnd: int) -> list[float]:
    """Round ``rnd``'s width rate of every client in dynamic mode: an independent draw per client
    with the profile's shares as probabilities (HeteroFL's code: a multinomial draw per user each
    round), seeded by ``seed`` and the round alone (so the same whatever the method or which
    clients are active)."""
    shares = torch.tensor([float(share) for _, share in profile], dtype=torch.float64)
    gen = torch.Generator().manual_seed(derive_seed(seed, "round", rnd))
    picks = torch.multinomial(shares, n_clients, replacement=True, generator=gen).tolist()
    return [LEVELS[profile[i][0]] for i in picks]


def client_weights(fed: "RoundView", active: list[int], weighting: str) -> list[float]:
    """The active clients' aggregation weights, normalized: training sizes (``samples``, FedAvg's
    weights, summed as FedAvg sums them) or equal (``uniform``, HeteroFL's code)."""
    if weighting == "samples":
        weights = torch.tensor([fed.clients[i].n_train for i in active], dtype=torch.float64)
    else:
        weights = torch.ones(len(active), dtype=torch.float64)
    return (weights / weights.sum()).tolist()


def window(full: int, size: int, start: int) -> torch.Tensor:
    """``size`` channel indices of ``full`` from ``start``, wrapping around."""
    return (torch.arange(size) + start) % full


def dim_indices(axes: tuple[int | None, ...], shape: torch.Size, idx: Indices) -> list[torch.Tensor]:
    return [torch.arange(n) if a is None else idx[a] for a, n in zip(axes, shape)]


def slice_state(state: dict[str, torch.Tensor], axes: dict[str, tuple[int | None, ...]],
                idx: Indices) -> dict[str, torch.Tensor]:
    """The sub-model's state: each tensor of the global ``state`` cut to the indices ``idx``."""
    out = {}
    for key, t in state.items():
        if key in axes:
            for d, ix in enumerate(dim_indices(axes[key], t.shape, idx)):
                if len(ix) != t.shape[d]:
                    t = t.index_select(d, ix.to(t.device))
                elif not torch.equal(ix, torch.arange(len(ix))):
                    t = t.index_select(d, ix.to(t.device))
        out[key] = t.clone()
    return out


def aggregate(state: dict[str, torch.Tensor], axes: dict[str, tuple[int | None, ...]],
              parts: list[tuple[dict[str, torch.Tensor], Indices, float]]) -> dict[str, torch.Tensor]:
    """The new global state (module docstring): ``parts`` are (a client's sub-model state, its indices,
    its weight normalized over the active clients), in the active clients' order."""
    out = {}
    for key, ref in state.items():
        if not ref.is_floating_point() or key not in axes:
            out[key] = ref.clone()
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        weight = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        holders = torch.zeros(ref.shape, dtype=torch.int64, device=ref.device)
        for local, idx, w in parts:
            mesh = torch.meshgrid(*[ix.to(ref.device) for ix in dim_indices(axes[key], ref.shape, idx)],
                                  indexing="ij")
            acc.index_put_(mesh, w * local[key].double(), accumulate=True)
            weight.index_put_(mesh, torch.full(local[key].shape, w, dtype=torch.float64, device=ref.device),
                              accumulate=True)
            holders.index_put_(mesh, torch.ones(local[key].shape, dtype=torch.int64, device=ref.device),
                               accumulate=True)
        new = ref.clone()
        every = holders == len(parts)  # weights already sum to one over these entries: FedAvg's sum
        some = (holders > 0) & ~every  # held by some: renormalized over their holders
        new[every] = acc[every].to(ref.dtype)
        new[some] = (acc[some] / weight[some]).to(ref.dtype)
        out[key] = new
    return out


def move_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module,
                         axes: dict[str, tuple[int | None, ...]], full: dict[str, torch.Size],
                         old: Indices, new: Indices) -> None:
    """Carry a client's optimizer state (momentum) with its entries when its window moves: an entry
    it held before and holds now keeps its state at its new place; an entry new to it starts at 0."""
    for name, p in model.named_parameters():
        state = optimizer.state.get(p)
        if not state or name not in axes:
            continue
        src = torch.meshgrid(*dim_indices(axes[name], full[name], old), indexing="ij")
        dst = torch.meshgrid(*dim_indices(axes[name], full[name], new), indexing="ij")
        for k, v in list(state.items()):
            if torch.is_tensor(v) and v.shape == p.shape:
                whole = torch.zeros(full[name], dtype=v.dtype, device=v.device)
                whole[tuple(i.to(v.device) for i in src)] = v
                state[k] = whole[tuple(i.to(v.device) for i in dst)].contiguous()


def carry_optimizer_state(old: torch.optim.Optimizer, old_model: nn.Module, new: torch.optim.Optimizer,
                          new_model: nn.Module, axes: dict[str, tuple[int | None, ...]],
                          full: dict[str, torch.Size], old_idx: Indices, new_idx: Indices) -> None:
    """A client's optimizer state carried from its sub-model ``old_model`` (holding ``old_idx``) to
    the one of another width, ``new_model`` (holding ``new_idx``): an entry held by both keeps its
    state at its new place, an entry new to it starts at 0; a scalar (Adam's step) is kept."""
    targets = dict(new_model.named_parameters())
    for name, p in old_model.named_parameters():
        state = old.state.get(p)
        if not state or name not in axes:
            continue
        q = targets[name]
        src = torch.meshgrid(*dim_indices(axes[name], full[name], old_idx), indexing="ij")
        dst = torch.meshgrid(*dim_indices(axes[name], full[name], new_idx), indexing="ij")
        moved = {}
        for k, v in state.items():
            if torch.is_tensor(v) and v.shape == p.shape:
                whole = torch.zeros(full[name], dtype=v.dtype, device=v.device)
                whole[tuple(i.to(v.device) for i in src)] = v
                moved[k] = whole[tuple(i.to(v.device) for i in dst)].contiguous()
            else:
                moved[k] = v.clone() if torch.is_tensor(v) else v
        new.state[q] = moved


class SubmodelRounds:
    """The family's round (module docstring), mixed into a method before ``Method``
    (``class HeteroFL(SubmodelRounds, Method)``): the method says where each client's window starts
    (``start``) and declares its card and ``Params`` (``SubmodelParams``)."""

    def start(self, rnd: int, full: int, size: int) -> int:
        """Where a client's window of ``size`` of a layer's ``full`` channels starts in round ``rnd``."""
        raise NotImplementedError

    def __init__(self, params: Any = None):
        super().__init__(params)
        parse_profile(self.params.profile)  # a bad profile is refused before any data loads
        if self.params.weighting not in WEIGHTINGS:
            raise ConfigError(f"{self.card.name}: weighting must be {' or '.join(WEIGHTINGS)}, "
                              f"got {self.params.weighting!r}")
        if self.params.capacity not in CAPACITIES:
            raise ConfigError(f"{self.card.name}: capacity must be {' or '.join(CAPACITIES)}, "
                              f"got {self.params.capacity!r}")

    @property
    def dynamic(self) -> bool:
        return self.params.capacity == "dynamic"

    def rate(self, cid: int, rnd: int) -> float:
        """Client ``cid``'s width rate in round ``rnd``: its fixed level, or the round's draw."""
        if not self.dynamic:
            return self.rates[cid]
        return draw_rates(parse_profile(self.params.profile), self.n_clients, self.seed, rnd)[cid]

    def check(self, fed: "RoundView") -> None:
        model = fed.clients[0].model
        if not fed.pool.homogeneous or not hasattr(model, "width_axes"):
            raise ConfigError(f"{self.card.name} slices the width of one global model; pool {fed.pool.name!r} is not "
                              "one width-scalable model. Use its default, --pool heterofl-cnn (or heterofl-cnn-paper, "
                              "heterofl-resnet18, heterofl-resnet18-paper)")

    def indices(self, fed: "RoundView", cid: int, rnd: int) -> Indices:
        """The global channel indices client ``cid``'s sub-model holds in round ``rnd``, per hidden layer."""
        rate = self.rate(cid, rnd)
        out = {}
        for layer, full in enumerate(self.hidden):
            size = scaled_width(full, rate)
            out[layer] = window(full, size, self.start(rnd, full, size) if size < full else 0)
        return out

    def setup(self, fed: "RoundView") -> None:
        first = fed.clients[0].model
        self.hidden = tuple(first.full_hidden)
        self.axes = first.width_axes()
        self.n_clients, self.seed = fed.n_clients, derive_seed(fed.cfg.seed, CAPACITY_STREAM)
        profile = parse_profile(self.params.profile)
        # the rates of the sub-models the clients hold now: for the run, or (dynamic) for round 1
        self.rates = (draw_rates(profile, fed.n_clients, self.seed, 1) if self.dynamic
                      else assign_rates(profile, fed.n_clients, self.seed))
        self.round_levels: list[str] = []  # dynamic: each round's levels, a letter per client
        # The server's global model is client 0's initialization, as FedAvg's is.
        self.global_state = {k: v.detach().clone() for k, v in first.state_dict().items()}
        self.shapes = {k: v.shape for k, v in self.global_state.items()}
        for c in fed.clients:
            if self.rates[c.cid] < 1:  # a full-capacity client keeps the model and optimizer it was built with
                self.rebuild(fed, c.cid, self.rates[c.cid])
        self.broadcast(fed, 1, list(range(fed.n_clients)))

    def rebuild(self, fed: "RoundView", cid: int, rate: float) -> None:
        """Client ``cid``'s model rebuilt at width ``rate``, with a new optimizer (its values are
        the global model's slice, loaded by ``broadcast``)."""
        c = fed.clients[cid]
        member = PoolMember(c.arch.model, {**c.arch.kwargs, "rate": rate}, c.arch.label)
        c.model = seeded_model(member, fed.info, derive_seed(fed.cfg.seed, "submodel", cid), fed.device,
                               keep_global_rng=True)
        c.optimizer = fed.make_optimizer(c.model)

    def prepare_resume(self, fed: "RoundView", rnd: int) -> None:
        """Dynamic: the clients' sub-models rebuilt at the widths they held after round ``rnd``
        (those of round ``rnd + 1``), so the checkpoint's models and optimizer states fit them."""
        if self.dynamic:
            for c in fed.clients:
                rate = self.rate(c.cid, rnd + 1)
                if rate != self.rates[c.cid]:
                    self.rebuild(fed, c.cid, rate)
                    self.rates[c.cid] = rate

    def broadcast(self, fed: "RoundView", rnd: int, clients: list[int]) -> None:
        """Each client gets its slice of the global model for round ``rnd``."""
        for cid in clients:
            sub = slice_state(self.global_state, self.axes, self.indices(fed, cid, rnd))
            got = fed.channel.send(SERVER, [cid], sub, Payload.PARAMS)
            fed.clients[cid].model.load_state_dict(got)

    def train_clients(self, fed: "RoundView", rnd: int, active: list[int]) -> list[float]:
        """Train the active clients' sub-models for round ``rnd`` (their mean losses, in ``active``
        order): plain CE over each client's plan; FjORD trains at sampled narrower widths instead."""
        return train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})

    def run_round(self, fed: "RoundView", rnd: int, active: list[int]) -> dict[str, float]:
        if self.dynamic:
            self.round_levels.append("".join(RATE_LEVEL[r] for r in self.rates))
        losses = self.train_clients(fed, rnd, active)
        states = [fed.channel.send(i, SERVER, fed.clients[i].model.state_dict(), Payload.PARAMS) for i in active]
        weights = client_weights(fed, active, self.params.weighting)
        parts = [(s, self.indices(fed, i, rnd), w) for i, s, w in zip(active, states, weights)]
        self.global_state = aggregate(self.global_state, self.axes, parts)
        for c in fed.clients:  # a moved window carries the client's momentum with its entries
            old, new = self.indices(fed, c.cid, rnd), self.indices(fed, c.cid, rnd + 1)
            rate = self.rate(c.cid, rnd + 1)
            if rate != self.rates[c.cid]:  # dynamic: a new level, a sub-model of another width
                model, optimizer = c.model, c.optimizer
                self.rebuild(fed, c.cid, rate)
                carry_optimizer_state(optimizer, model, c.optimizer, c.model, self.axes, self.shapes, old, new)
                self.rates[c.cid] = rate
            elif any(not torch.equal(old[k], new[k]) for k in old):
                move_optimizer_state(c.optimizer, c.model, self.axes, self.shapes, old, new)
        self.broadcast(fed, rnd + 1, list(range(fed.n_clients)))
        return {"train_loss": sum(losses) / len(losses)}

    def changed_clients(self, fed: "RoundView", active: list[int]) -> list[int]:
        return list(range(fed.n_clients))

    def describe_run(self, fed: "RoundView") -> dict[str, Any]:
        """Each client's width rate (its capacity level) and its sub-model's parameter count; with
        capacity=dynamic, those of the sub-model it holds at the end (the draw for the round after
        the last, whose slice the final evaluation reads), and every round's levels (a letter a-e
        per client, in client order, active or not)."""
        return {"capacity_profile": self.params.profile,
                "client_rates": list(self.rates),
                "client_params": [sum(p.numel() for p in c.model.parameters()) for c in fed.clients],
                **({"capacity": "dynamic", "round_levels": list(self.round_levels)} if self.dynamic else {})}
