"""FjORD (Horváth, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and Accurate
Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS 2021).

Ordered Dropout on HeteroFL's family: a client at maximum width p_max (its capacity level) holds the
static slice of the first ceil(p_max * C) channels of every hidden layer, as HeteroFL's. In each
local step it draws a width p uniformly from the levels of the set P that are <= p_max (seeded by
the run's seed, round, client and step) and trains the nested sub-model of the first ceil(p * C)
channels only; with ``kd`` (the paper's self-distillation, section 3.3) the p_max forward of the
same step teaches the width-p forward. It sends its p_max sub-model, which the server averages
entry by entry over the holders as the family does (``hfl_bench.families.submodel``). Every choice:
``docs/reference/method-notes/fjord.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from hfl_bench.checkpoint import pack_attrs
from hfl_bench.families.submodel import (
    LEVELS,
    SUBMODEL_NOTES,
    WEIGHTING_HELP,
    SubmodelParams,
    SubmodelRounds,
    parse_profile,
)
from hfl_bench.method_api import (
    Batch,
    ConfigError,
    Method,
    MethodCard,
    RoundView,
    SmokeSettings,
    Trainee,
    derive_seed,
    fit,
    make_plan,
    new_model,
    param,
    register_method,
    soft_targets,
    student_loss,
)
from hfl_bench.pools import PoolMember
from hfl_bench.width_models import scaled_width

WIDTHS_HELP = ("The set P of widths a client samples from (uniformly, among those <= its own level's rate): "
               "'profile' (the levels the profile names, the default) or levels a-e joined by '-' (a-b-c-d-e: "
               "all five); it must hold every level of the profile.")
KD_HELP = ("Self-distillation (the paper's section 3.3): in a step at a width p below the client's own, the "
           "p_max forward (trained with CE) teaches the width-p forward. on (default) or off.")
KD_WEIGHT_HELP = "alpha: the width-p loss is (1 - alpha) CE + alpha T^2 KL(p_max || p); 1 = soft targets alone."
TEMPERATURE_HELP = "T of the self-distillation's softmax."


@dataclass
class FjORDParams(SubmodelParams):
    weighting: str = param("samples", WEIGHTING_HELP + " FjORD's default: samples, as FedAvg and Flower's FjORD.")
    widths: str = param("profile", WIDTHS_HELP)
    kd: str = param("on", KD_HELP)
    kd_weight: float = param(1.0, KD_WEIGHT_HELP)
    temperature: float = param(1.0, TEMPERATURE_HELP)


def width_set(widths: str, profile: str) -> list[float]:
    """The set P as rates, widest first: the profile's levels, or the levels ``widths`` names
    (ConfigError, one line, for a bad level or one that leaves out a level of the profile)."""
    named = [level for level, _ in parse_profile(profile)]
    if widths != "profile":
        parts = [p.strip() for p in str(widths).split("-")]
        if any(p not in LEVELS for p in parts) or len(set(parts)) != len(parts):
            raise ConfigError(f"fjord: widths {widths!r} must be 'profile' or distinct levels a-e joined by '-' "
                              "(e.g. a-b-c-d-e)")
        missing = [level for level in named if level not in parts]
        if missing:
            raise ConfigError(f"fjord: widths {widths!r} leave out level {missing[0]} of profile {profile!r}: "
                              "a client's own width must be in the set it samples from")
        named = parts
    return sorted({LEVELS[level] for level in named}, reverse=True)


def sample_widths(seed: int, rnd: int, cid: int, steps: int, levels: list[float], p_max: float) -> list[float]:
    """The width p of each of client ``cid``'s ``steps`` local steps in round ``rnd``: uniform over
    the levels <= ``p_max``, one seeded draw per step (the run's seed, round, client: the same
    steps draw the same widths whatever else the run does)."""
    allowed = [p for p in levels if p <= p_max]
    gen = torch.Generator().manual_seed(derive_seed(seed, "fjord-width", rnd, cid))
    return [allowed[i] for i in torch.randint(len(allowed), (steps,), generator=gen).tolist()]


def leading(t: torch.Tensor, dims: tuple[int | None, ...], keep: dict[int, int]) -> torch.Tensor:
    """The view of ``t`` holding the first ``keep[layer]`` entries of each sliced dimension: a view,
    so a gradient through it lands on those entries of ``t`` alone."""
    for d, layer in enumerate(dims):
        if layer is not None and keep[layer] < t.shape[d]:
            t = t.narrow(d, 0, keep[layer])
    return t


def leading_mask(shape: torch.Size, dims: tuple[int | None, ...], keep: dict[int, int],
                 device: torch.device) -> torch.Tensor:
    """True on the entries ``leading`` keeps."""
    mask = torch.ones(shape, dtype=torch.bool, device=device)
    for d, layer in enumerate(dims):
        if layer is not None:
            line = torch.arange(shape[d], device=device) < keep[layer]
            mask &= line.view(*[-1 if i == d else 1 for i in range(len(shape))])
    return mask


def held(hidden: tuple[int, ...], p: float) -> dict[int, int]:
    """How many leading channels of each hidden layer the width-p sub-model holds: ceil(p * C)."""
    return {layer: scaled_width(full, p) for layer, full in enumerate(hidden)}


def narrow_forward(template: nn.Module, model: nn.Module, axes: dict[str, tuple[int | None, ...]],
                   keep: dict[int, int], x: torch.Tensor) -> torch.Tensor:
    """The width-p sub-model's logits: ``template`` (the network built at rate p) run on the leading
    views of ``model``'s parameters, so the backward reaches those entries of ``model`` alone."""
    views = {n: leading(t, axes[n], keep) if n in axes else t for n, t in model.named_parameters()}
    return functional_call(template, views, (x,))


def width_masks(model: nn.Module, axes: dict[str, tuple[int | None, ...]],
                keep: dict[int, int]) -> dict[str, torch.Tensor]:
    """For each sliced parameter of ``model``, True on the entries the width-p sub-model holds."""
    return {n: leading_mask(t.shape, axes[n], keep, t.device) for n, t in model.named_parameters() if n in axes}


class NestedStep:
    """A client's optimizer that steps only the entries of the width its current batch trained:
    the other entries, and their optimizer state (momentum, Adam's moments), stay as they were, so
    weight decay and momentum never move a channel the step's sub-model did not hold. ``masks``
    None: the whole model (the client's own width), a plain step."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module):
        self.optimizer, self.model = optimizer, model
        self.masks: dict[str, torch.Tensor] | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        if self.masks is None:
            self.optimizer.step()
            return
        params = dict(self.model.named_parameters())
        kept = {}
        for name, mask in self.masks.items():
            p = params[name]
            state = self.optimizer.state.get(p, {})
            kept[name] = (p.detach().clone(), {k: v.clone() for k, v in state.items()
                                               if torch.is_tensor(v) and v.shape == p.shape})
        self.optimizer.step()
        with torch.no_grad():
            for name, mask in self.masks.items():
                p = params[name]
                old, old_state = kept[name]
                p.copy_(torch.where(mask, p, old))
                for k, v in self.optimizer.state.get(p, {}).items():
                    if torch.is_tensor(v) and v.shape == p.shape:
                        v.copy_(torch.where(mask, v, old_state.get(k, torch.zeros_like(v))))


@register_method
class FjORD(SubmodelRounds, Method):
    card = MethodCard(
        name="fjord", version="1.0", fidelity="reconstructed", topology="server",
        citation="Horváth, Laskaridis, Almeida, Leontiadis, Venieris, Lane, FjORD: Fair and Accurate Federated "
                 "Learning under heterogeneous targets with Ordered Dropout, NeurIPS 2021",
        summary="Ordered dropout: each step a client trains the leading channels of a width drawn up to its "
                "capacity level, distilled from its widest; the server averages each entry over its holders.",
        submodels=True, pool="heterofl-cnn",
        why_single_modality="it slices one global image model, which has no encoder per modality",
        why_not_tokens="its global model is HeteroFL's CNN, which reads images or signals",
        smoke=SmokeSettings(),
        notes=SUBMODEL_NOTES + (
            "slices: static and nested (ordered dropout): a client's own sub-model is its level's first "
            "ceil(p_max * C) channels, as heterofl's; each local step trains the first ceil(p * C)",
            "the set P is the capacity levels (a-e: 1, 1/2, 1/4, 1/8, 1/16; by default those the profile names), "
            "not the paper's 0.2-spaced widths; each step draws p uniformly from the levels <= p_max, seeded by "
            "the run's seed, round, client and step",
            "self-distillation on by default (kd=on; our reading of the paper's main results, which report "
            "FjORD with KD; the paper gives no alpha or T that we could find): the p_max forward trains with "
            "CE and teaches the width-p forward, (1 - alpha) CE + alpha T^2 KL with alpha = 1, T = 1 (Flower's "
            "baseline: soft targets alone); a step that draws p_max trains CE alone (distilling into itself has "
            "zero gradient); the step's loss (CE + KD) is the round's train_loss",
            "the width-p sub-model is the same network built at rate p: its scaler divides by p, as HeteroFL's "
            "sub-model at p does (the paper's OD has no scaler)",
            "batch norm: the family's static BN keeps no running statistics, so no statistics per width are "
            "needed (the paper and Flower's baseline keep BN statistics per width, the affine shared); the "
            "affine entries are sliced like the channels",
            "without kd, a step at width p moves only the entries it holds: the others keep their values and "
            "their optimizer state (weight decay and momentum do not touch them; with Adam the step count still "
            "advances for the whole tensor); with kd the step also trains the p_max forward, so the whole "
            "sub-model steps",
            "the record's FLOPs count each local step as a training step of the client's p_max sub-model: a "
            "narrower step costs less, a self-distillation step (both forwards and backwards) more",
            "aggregation weighted by training size by default (weighting=samples: Flower's FjORD and FedAvg); "
            "every client receives its p_max slice of the new global model",
        ),
    )
    Params = FjORDParams

    def __init__(self, params: Any = None):
        super().__init__(params)
        self.levels = width_set(self.params.widths, self.params.profile)
        if self.params.kd not in ("on", "off"):
            raise ConfigError(f"fjord: kd must be on or off, got {self.params.kd!r}")
        if not 0 <= self.params.kd_weight <= 1:
            raise ConfigError(f"fjord: kd_weight must be in [0, 1], got {self.params.kd_weight}")
        if not self.params.temperature > 0:
            raise ConfigError(f"fjord: temperature must be > 0, got {self.params.temperature}")

    def start(self, rnd: int, full: int, size: int) -> int:
        return 0

    def setup(self, fed: RoundView) -> None:
        super().setup(fed)
        # One network per width narrower than some client's own, built at that rate: the shape of the
        # width-p sub-model (its scaler divides by p). It holds no weights of its own that are used:
        # each forward runs it on the leading views of the client's parameters.
        # (dynamic capacity: any level of the profile may be a client's own in some round)
        top = max(LEVELS[level] for level, _ in parse_profile(self.params.profile)) if self.dynamic else max(self.rates)
        arch = fed.clients[0].arch
        self.templates: dict[float, nn.Module] = {}
        for p in self.levels:
            if p < top:
                member = PoolMember(arch.model, {**arch.kwargs, "rate": p}, arch.label)
                self.templates[p] = new_model(fed, member, "fjord-template", p).train()

    def state_dict(self, fed: RoundView) -> dict[str, Any]:
        return pack_attrs(self, fed, skip=("params", "templates"))  # setup rebuilds them; no state

    def train_clients(self, fed: RoundView, rnd: int, active: list[int]) -> list[float]:
        return [self.train_client(fed, rnd, cid) for cid in active]

    def train_client(self, fed: RoundView, rnd: int, cid: int) -> float:
        client = fed.clients[cid]
        model, p_max = client.model, self.rates[cid]
        plan = make_plan(fed, cid, rnd)
        draws = sample_widths(fed.cfg.seed, rnd, cid, len(plan.bounds), self.levels, p_max)
        stepper = NestedStep(client.optimizer, model)
        kd = self.params.kd == "on"
        alpha, temperature = self.params.kd_weight, self.params.temperature
        masks: dict[float, dict[str, torch.Tensor]] = {}

        def loss_fn(b: Batch) -> list[torch.Tensor]:
            p = draws[b.step]
            if p >= p_max:  # the client's own width: the whole model, a plain step
                stepper.masks = None
                return [F.cross_entropy(model(b.x), b.y)]
            narrow = narrow_forward(self.templates[p], model, self.axes, held(self.hidden, p), b.x)
            if not kd:  # only the width-p sub-model trains: the step moves its entries alone
                if p not in masks:
                    masks[p] = width_masks(model, self.axes, held(self.hidden, p))
                stepper.masks = masks[p]
                return [F.cross_entropy(narrow, b.y)]
            # the p_max forward trains with CE and teaches the width-p forward: the whole model steps
            stepper.masks = None
            wide = model(b.x)
            teacher = soft_targets(wide.detach(), temperature)
            return [F.cross_entropy(wide, b.y) + student_loss(narrow, b.y, teacher, alpha, temperature)]

        trainee = Trainee(model, stepper, f"client {cid}", cid)  # type: ignore[arg-type]
        return fit(fed, plan, [trainee], loss_fn)[0]

    def describe_run(self, fed: RoundView) -> dict[str, Any]:
        return {**super().describe_run(fed), "widths": list(self.levels)}

