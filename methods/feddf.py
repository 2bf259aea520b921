"""FedDF: ensemble distillation for model fusion (Lin, Kong, Stich, Jaggi, NeurIPS 2020).

Per round the active clients train on their private data and upload their models. The server
averages them per architecture prototype (FedAvg within each group, weighted by training size),
then distills into each prototype's average the ensemble of every active client's model (the mean
of their logits, all architectures together) on the unlabelled public set: KL at temperature T,
Adam with cosine annealing, stopped early when a held-out slice of the public set stops improving,
and broadcasts each prototype's model to the clients of its architecture. On a one-architecture
pool it is FedAvg followed by distillation; with ``distill_steps=0`` it is per-architecture FedAvg.

Fidelity: reconstructed (the paper's text is not among the suite's sources; defaults from the paper
and its public code). The algorithm and every choice: ``docs/reference/method-notes/feddf.md``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from hfl_bench.families.shared_model import weighted_average
from hfl_bench.families.transfer import transfer_logits
from hfl_bench.method_api import (
    SERVER,
    ConfigError,
    Data,
    Diverged,
    Method,
    MethodCard,
    Payload,
    Phase,
    RoundView,
    SmokeSettings,
    derive_seed,
    kd_loss,
    make_plan,
    new_model,
    param,
    register_method,
    require_at_least,
    soft_targets,
    train_students,
)


@dataclass
class FedDFParams:
    distill_steps: int = param(10000, "Server distillation steps per prototype and round at most (paper: 10^4; "
                                      "0: per-architecture FedAvg).")
    distill_lr: float = param(1e-3, "Adam's learning rate for the server distillation (paper: 1e-3), annealed by "
                                    "a cosine over distill_steps.")
    distill_batch_size: int = param(128, "Public samples per distillation step (the authors' code: 128).")
    temperature: float = param(1.0, "Softmax temperature of the KL between the ensemble and the student "
                                    "(the authors' code: 1).")
    patience: int = param(1000, "Early stopping: stop once this many steps pass without a better held-out "
                                "loss (paper: 10^3).")
    eval_every: int = param(100, "Steps between two held-out evaluations (the authors' code: 100).")
    val_fraction: float = param(0.2, "Share of the public set held out (a seeded draw) to stop the distillation "
                                     "early; the rest is distilled on.")


def architecture_groups(fed: RoundView) -> dict[str, list[int]]:
    """Every client grouped by architecture prototype (pool members of one model and arguments), in
    order of first appearance, each group named by its member's display name (numbered when two
    prototypes share one)."""
    groups: dict[tuple, list[int]] = {}
    names: dict[tuple, str] = {}
    for c in fed.clients:
        key = (c.arch.model, repr(sorted(c.arch.kwargs.items())))
        groups.setdefault(key, []).append(c.cid)
        names.setdefault(key, c.arch.name)
    shared = [n for n in names.values() if list(names.values()).count(n) > 1]
    return {f"{names[k]}#{i}" if names[k] in shared else names[k]: cids for i, (k, cids) in enumerate(groups.items())}


def ensemble_teacher(logits: list[torch.Tensor]) -> torch.Tensor:
    """The ensemble's logits: the unweighted mean of the models' logits (the paper's Algorithm 1)."""
    return torch.stack([z.float() for z in logits]).mean(dim=0)


def split_public(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded split of ``n`` public positions into (distill, held-out); at least one of each when
    ``n >= 2`` and ``val_fraction > 0``, else nothing held out."""
    n_val = min(n - 1, max(1, round(n * val_fraction))) if val_fraction > 0 and n >= 2 else 0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_val:].sort().values, perm[:n_val].sort().values


def batches(n: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Positions of endless seeded shuffled epochs over ``n`` samples (a trailing batch is kept, as a
    data loader without drop_last gives it; one of a single sample joins the previous batch)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(n, generator=gen)
        starts = list(range(0, n, batch_size))
        if len(starts) > 1 and n - starts[-1] == 1:
            starts.pop()
        for i, s in enumerate(starts):
            yield perm[s:starts[i + 1] if i + 1 < len(starts) else n]


@register_method
class FedDF(Method):
    card = MethodCard(
        name="feddf", version="1.0", fidelity="reconstructed", topology="server",
        citation=("Lin, Kong, Stich, Jaggi, Ensemble Distillation for Robust Model Fusion in Federated Learning, "
                  "NeurIPS 2020 (arXiv 2006.07242)"),
        summary="FedAvg per architecture, then server distillation of all clients' logit ensemble on the public set.",
        transfer="public-unlabelled",
        why_single_modality="it needs a public set, and a public sample would hand recipients the modality they miss",
        # a patience as long as the steps: a smoke run's server work is the same whatever the early stop sees
        smoke=SmokeSettings(method_params={"distill_steps": "20", "eval_every": "5", "patience": "20"}),
        notes=(
            "public set used unlabelled (its labels are never read)",
            "each round: the active clients' private CE (the config's local epochs, their own optimizer), upload of "
            "their parameters, FedAvg per architecture prototype weighted by training size, distillation into each "
            "prototype's average, broadcast of each prototype to every client of its architecture",
            "prototype: pool members of one model and arguments; a prototype with no active client this round is "
            "neither averaged nor distilled (its clients keep their models)",
            "before round 1 each prototype's clients start from one model: the first such client's initialization",
            "teacher: the unweighted mean of the logits of every active client's model (every architecture), "
            "eval mode, computed once per round on the unaugmented public set (the paper's Algorithm 1; the "
            "authors' code defaults to averaging per-teacher KL losses instead)",
            "loss: T^2 KL(softmax(teacher / T) || softmax(student / T)), T = 1 (the authors' code)",
            "optimizer: a fresh Adam per prototype and round at lr 1e-3, cosine-annealed over distill_steps "
            "whatever the early stop (paper and code); no gradient clipping; student in train mode",
            "batches: seeded shuffled epochs of distill_batch_size over the distillation part of the public set "
            "(the authors' code: 128; the paper distils on a large unlabelled set, here the held-out public set)",
            "early stopping: the paper stops when a labelled validation set's accuracy plateaus for 10^3 of 10^4 "
            "steps; with the public set unlabelled, the criterion is the KL to the teacher on a seeded held-out "
            "val_fraction of the public set (the same every round), evaluated every eval_every steps and at the "
            "last step; the distillation stops patience steps after the best evaluation, and the best evaluated "
            "model is kept",
            "a public set too small to hold out (one sample) distils on all of it without early stopping",
            "server steps are counted as server work (kind server); teacher inference is not",
        ),
    )
    Params = FedDFParams

    def check(self, fed: RoundView) -> None:
        p = self.params
        require_at_least("feddf", p, ("distill_steps",), 0)
        require_at_least("feddf", p, ("distill_batch_size", "patience", "eval_every"), 1)
        if not p.distill_lr > 0:
            raise ConfigError(f"feddf: distill_lr must be > 0, got {p.distill_lr}")
        if not p.temperature > 0:
            raise ConfigError(f"feddf: temperature must be > 0, got {p.temperature}")
        if not 0 <= p.val_fraction < 1:
            raise ConfigError(f"feddf: val_fraction must be in [0, 1), got {p.val_fraction}")

    def setup(self, fed: RoundView) -> None:
        self.groups = architecture_groups(fed)
        # Each prototype's server model starts as its first client's initialization.
        for cids in self.groups.values():
            if len(cids) > 1:
                first = fed.channel.send(SERVER, cids[1:], fed.clients[cids[0]].model.state_dict(), Payload.PARAMS)
                for cid in cids[1:]:
                    fed.clients[cid].model.load_state_dict(first)

    def received_models(self, fed: RoundView, states: dict[int, dict]) -> dict[int, nn.Module]:
        """The server's copy of each uploaded model (what arrived, which a fault may have changed)."""
        models = {}
        for cid, state in states.items():
            model = new_model(fed, fed.clients[cid].arch, "feddf-server", cid)
            model.load_state_dict(state)
            models[cid] = model
        return models

    def run_round(self, fed: RoundView, rnd: int, active: list[int]) -> dict[str, float]:
        with fed.timer(Phase.TRAINING):
            losses = train_students(fed, active, {i: make_plan(fed, i, rnd) for i in active})
        received = {i: fed.channel.send(i, SERVER, fed.clients[i].model.state_dict(), Payload.PARAMS) for i in active}
        teachers = self.received_models(fed, received)
        students: dict[str, nn.Module] = {}
        with fed.timer(Phase.AGGREGATION):
            for name, cids in self.groups.items():
                here = [i for i in cids if i in received]
                if here:  # a prototype with no active client keeps its model
                    student = copy.deepcopy(teachers[here[0]])
                    student.load_state_dict(weighted_average([received[i] for i in here],
                                                             [float(fed.clients[i].n_train) for i in here]))
                    students[name] = student
        out = {"train_loss": sum(losses) / len(losses)}
        if self.params.distill_steps > 0 and len(fed.public_x) > 0:
            x = fed.public_x
            teacher = ensemble_teacher(list(transfer_logits(fed, teachers, x).values()))
            stats = [self.distill(fed, rnd, name, student, x, teacher) for name, student in students.items()]
            out["distill_loss"] = sum(s[0] for s in stats) / len(stats)
            out["distill_steps"] = sum(s[1] for s in stats) / len(stats)
        with fed.timer(Phase.AGGREGATION):
            for name, student in students.items():
                cids = self.groups[name]
                state = fed.channel.send(SERVER, cids, student.state_dict(), Payload.PARAMS)
                for cid in cids:
                    fed.clients[cid].model.load_state_dict(state)
        return out

    def distill(self, fed: RoundView, rnd: int, name: str, student: nn.Module, x: torch.Tensor,
                teacher: torch.Tensor) -> tuple[float, int]:
        """Distil the ensemble ``teacher`` (logits on ``x``) into ``student`` in place: the best
        held-out model is kept. Returns the mean training loss and the steps taken."""
        p = self.params
        train_pos, val_pos = split_public(len(x), p.val_fraction, derive_seed(fed.cfg.seed, "feddf-split"))
        train_pos, val_pos = train_pos.to(x.device), val_pos.to(x.device)
        targets = soft_targets(teacher, p.temperature)
        opt = torch.optim.Adam(student.parameters(), lr=p.distill_lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=p.distill_steps)
        best_loss, best_step, best_state = math.inf, 0, None
        total, steps, samples = torch.zeros((), device=x.device), 0, 0
        student.train()
        with fed.timer(Phase.AGGREGATION):
            for pos in batches(len(train_pos), p.distill_batch_size, derive_seed(fed.cfg.seed, "feddf", rnd, name)):
                pos = train_pos[pos.to(x.device)]
                loss = kd_loss(student(x[pos]), targets[pos], p.temperature)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                total += loss.detach()
                steps, samples = steps + 1, samples + len(pos)
                if len(val_pos) and (steps % p.eval_every == 0 or steps == p.distill_steps):
                    held_out = self.held_out_loss(student, x[val_pos], targets[val_pos], p.temperature)
                    if not math.isfinite(held_out):
                        raise Diverged(f"feddf: the distillation of prototype {name} diverged at step {steps}")
                    if held_out < best_loss:
                        best_loss, best_step = held_out, steps
                        best_state = {k: v.detach().clone() for k, v in student.state_dict().items()}
                    elif steps - best_step >= p.patience:
                        break
                if steps >= p.distill_steps:
                    break
        fed.budget.add(SERVER, Data.SERVER, steps, samples)
        mean = float(total) / steps
        if not math.isfinite(mean):
            raise Diverged(f"feddf: the distillation of prototype {name} diverged (loss {mean})")
        if best_state is not None:
            student.load_state_dict(best_state)
        return mean, steps

    @staticmethod
    @torch.no_grad()
    def held_out_loss(student: nn.Module, x: torch.Tensor, targets: torch.Tensor, temperature: float) -> float:
        was_training = student.training
        student.eval()
        try:
            return float(kd_loss(student(x), targets, temperature))
        finally:
            student.train(was_training)

    def changed_clients(self, fed: RoundView, active: list[int]) -> list[int]:
        # every client of a prototype with an active client downloads its new model
        return sorted(c for cids in self.groups.values() if set(cids) & set(active) for c in cids)
