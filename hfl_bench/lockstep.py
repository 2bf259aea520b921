"""Student training, one model at a time or same-architecture students in lockstep.

``train_students`` is what methods call to train a set of clients on their epoch plans. By
default it loops ``train_on_plan`` over the students. With ``--lockstep on`` students that share
an architecture (and optimizer settings) train together: their parameters, BatchNorm buffers and
SGD momentum are stacked, each step runs one vmapped forward (``torch.func.functional_call`` over
the stacked parameters), one backward of the summed per-student losses, a per-student gradient-
norm clip and the SGD update on the stacks. The students stay independent and the math is the
same as the loop's (same batches, loss, clip and update rule; tested equal within float
tolerance): only the number of kernel launches drops, and the kernels get G times larger.

Client shards differ in size, so students differ in batch count and last-batch size. Padding
would change BatchNorm's batch statistics, so a step instead groups the students by the size of
their batch at that step: students with equal-sized batches step together (all of them, for most
steps), the rest step in their own smaller groups, gathered from and scattered back into the
stacks.

When it wins is measured, not assumed (``benchmarks/bench_round.py --lockstep on``): on this 2-core
CPU the small conv nets are not faster stacked, so ``--lockstep auto`` leaves it off on every
device until a GPU measurement says otherwise (README, Performance).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.func import functional_call, vmap

from hfl_bench.training import EpochPlan, finite_mean, student_loss, train_on_plan

if TYPE_CHECKING:
    from hfl_bench.engine import Federation


def train_students(
    fed: "Federation", cids: list[int], plans: dict[int, EpochPlan], *,
    targets: dict[int, torch.Tensor] | None = None, lam: float = 0.0, temperature: float = 1.0,
) -> list[float]:
    """Train clients ``cids`` over their plans with (1 - lam) CE + lam KD(targets[i]); returns
    their mean training losses in ``cids`` order. ``targets`` may omit a client (plain CE)."""
    targets = targets or {}
    losses: dict[int, float] = {}
    for group in lockstep_groups(fed, cids, with_targets=set(targets)) if fed.use_lockstep else []:
        losses.update(train_lockstep(fed, group, plans, targets, lam, temperature))
    for i in cids:
        if i not in losses:
            losses[i] = train_on_plan(fed, fed.clients[i], plans[i], targets=targets.get(i), lam=lam,
                                      temperature=temperature)
    return [losses[i] for i in cids]


def lockstep_groups(fed: "Federation", cids: list[int], with_targets: set[int] = frozenset()) -> list[list[int]]:
    """Groups of two or more students that can train in lockstep: same architecture member,
    plain SGD with equal settings, no stochastic layers (dropout would draw per student), and
    either all with distillation targets (``with_targets``) or none."""
    groups: dict[tuple, list[int]] = {}
    for i in cids:
        client = fed.clients[i]
        settings = _sgd_settings(client.optimizer)
        if settings is None or _stochastic(client.model):
            continue
        key = (client.arch.model, tuple(sorted(client.arch.kwargs.items())), settings, i in with_targets)
        groups.setdefault(key, []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _sgd_settings(opt: torch.optim.Optimizer) -> tuple | None:
    """(lr, momentum, weight decay) of a single-group plain SGD optimizer, else None."""
    if type(opt) is not torch.optim.SGD or len(opt.param_groups) != 1:
        return None
    g = opt.param_groups[0]
    if g["nesterov"] or g["dampening"] or g.get("maximize"):
        return None
    return float(g["lr"]), float(g["momentum"]), float(g["weight_decay"])


def _stochastic(model: nn.Module) -> bool:
    for m in model.modules():
        p = getattr(m, "p", None) if isinstance(m, nn.modules.dropout._DropoutNd) else getattr(m, "drop_prob", None)
        if p:
            return True
    return False


class _Stack:
    """Parameters, buffers and momentum buffers of G same-architecture models, stacked on dim 0."""

    def __init__(self, models: list[nn.Module], opts: list[torch.optim.Optimizer]):
        self.models, self.opts = models, opts
        named = [dict(m.named_parameters()) for m in models]
        self.names = list(named[0])
        self.params = {k: torch.stack([n[k].detach() for n in named]) for k in self.names}
        bufs = [dict(m.named_buffers()) for m in models]
        self.buffers = {k: torch.stack([b[k] for b in bufs]) for k in bufs[0]}
        # A missing momentum buffer (first step) is zero: SGD's first step sets buf = g, and
        # momentum * 0 + g is exactly g.
        self.momenta = {k: torch.stack([_momentum(o, n[k]) for o, n in zip(opts, named)]) for k in self.names}

    def write_back(self) -> None:
        with torch.no_grad():
            for g, (model, opt) in enumerate(zip(self.models, self.opts)):
                for k, p in model.named_parameters():
                    p.copy_(self.params[k][g])
                    if opt.param_groups[0]["momentum"]:
                        opt.state[p]["momentum_buffer"] = self.momenta[k][g].clone()
                for k, b in model.named_buffers():
                    b.copy_(self.buffers[k][g])


def _momentum(opt: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor:
    buf = opt.state.get(p, {}).get("momentum_buffer")
    return torch.zeros_like(p) if buf is None else buf.detach()


def train_lockstep(
    fed: "Federation", group: list[int], plans: dict[int, EpochPlan], targets: dict[int, torch.Tensor],
    lam: float, temperature: float,
) -> dict[int, float]:
    """Train the same-architecture students ``group`` together; returns their mean losses."""
    models = [fed.clients[i].model for i in group]
    stack = _Stack(models, [fed.clients[i].optimizer for i in group])
    lr, momentum, weight_decay = _sgd_settings(fed.clients[group[0]].optimizer)  # type: ignore[misc]
    base = models[0]
    base.train()
    views = {i: plans[i].view(fed) for i in group}
    labels = {i: plans[i].labels(fed) for i in group}
    totals = torch.zeros(len(group), device=fed.device)
    steps = max(len(plans[i].bounds) for i in group)
    n_batches = [len(plans[i].bounds) for i in group]

    def forward(p, b, x):
        return functional_call(base, (p, b), (x,))

    use_targets = lam > 0 and group[0] in targets  # the same for the whole group (lockstep_groups)

    def loss_of(logits, y, q):
        return student_loss(logits, y, q, lam, temperature)

    def batch(i: int, t: int, source: dict[int, torch.Tensor]) -> torch.Tensor:
        s, e = plans[i].bounds[t]
        return source[i][s:e]

    for t in range(steps):
        by_size: dict[int, list[int]] = {}
        for g, i in enumerate(group):
            if t < n_batches[g]:
                s, e = plans[i].bounds[t]
                by_size.setdefault(e - s, []).append(g)
        for members in by_size.values():
            ids = [group[g] for g in members]
            x = torch.stack([batch(i, t, views) for i in ids])
            y = torch.stack([batch(i, t, labels) for i in ids])
            q = torch.stack([batch(i, t, targets) for i in ids]) if use_targets else None
            totals[members] += _step(stack, members, forward, loss_of, x, y, q, lr, momentum, weight_decay,
                                     fed.cfg.grad_clip)
    stack.write_back()
    return {i: finite_mean(totals[g], n_batches[g], f"client {i}") for g, i in enumerate(group)}


def _step(stack: _Stack, members: list[int], forward, loss_of, x, y, q, lr: float, momentum: float,
          weight_decay: float, clip: float) -> torch.Tensor:
    """One SGD step of the stacked students ``members`` (positions in the stack); returns their
    losses [len(members)]. The whole stack is used in place; a subset is gathered and scattered."""
    whole = len(members) == len(stack.models)
    idx = None if whole else torch.tensor(members, device=x.device)

    def take(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return d if whole else {k: v[idx] for k, v in d.items()}

    params = {k: v.detach().requires_grad_() for k, v in take(stack.params).items()}
    buffers, momenta = take(stack.buffers), take(stack.momenta)  # BatchNorm updates these in place
    logits = vmap(forward)(params, buffers, x)
    losses = vmap(loss_of, in_dims=(0, 0, None if q is None else 0))(logits, y, q)
    grads = torch.autograd.grad(losses.sum(), list(params.values()))
    with torch.no_grad():
        if clip > 0:  # as nn.utils.clip_grad_norm_, per student: norm of the per-tensor norms
            norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)
            coef = (clip / (norms + 1e-6)).clamp(max=1.0)
            grads = [g * coef.view(-1, *[1] * (g.dim() - 1)) for g in grads]
        for k, g in zip(params, grads):  # as torch.optim.SGD (no nesterov, no dampening)
            p = params[k]
            d = g.add(p, alpha=weight_decay) if weight_decay else g
            if momentum:
                d = momenta[k].mul_(momentum).add_(d)
            p.add_(d, alpha=-lr)
        if not whole:
            for k in stack.params:
                stack.params[k][idx] = params[k]
                stack.momenta[k][idx] = momenta[k]
            for k in stack.buffers:
                stack.buffers[k][idx] = buffers[k]
    if whole:
        stack.params = {k: v.detach() for k, v in params.items()}
    return losses.detach()
