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
their batch at that step: students with equal-sized batches step together, the others in
their own smaller groups, gathered from and scattered back into the stacks. A student whose
epoch has ended drops out, so the group shrinks toward the end of a round.

When it wins is measured, not assumed (``benchmarks/bench_lockstep.py`` per architecture,
``benchmarks/bench_round.py`` per round): on a 2-core CPU no architecture of the CPU or paper pool
trained faster stacked (0.75-0.89x the loop's speed), so ``--lockstep auto`` leaves it off on every
device until a GPU measurement says otherwise (README, Performance).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.func import functional_call, vmap

from hfl_bench.federation import engine_side
from hfl_bench.graphs import train_students as train_one_by_one
from hfl_bench.training import EpochPlan, Targets, count_work, finite_mean, free_riders, student_loss

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView


def train_students(
    fed: "RoundView", cids: list[int], plans: dict[int, EpochPlan], *,
    targets: dict[int, Targets] | None = None, lam: float = 0.0, temperature: float = 1.0,
) -> list[float]:
    """Train clients ``cids`` over their plans with (1 - lam) CE + lam KD(targets[i]); returns
    their mean training losses in ``cids`` order. ``targets`` may omit a client (plain CE)."""
    targets = targets or {}
    losses: dict[int, float] = {}
    # Only whole-epoch target tensors can be stacked; per-batch target functions (the reference
    # path) train in the loop.
    # A free-rider never trains (``training.fit`` returns at once for it): never stacked either.
    riders = free_riders(fed)
    stackable = [i for i in cids if isinstance(targets.get(i, torch.zeros(0)), torch.Tensor) and i not in riders]
    for group in lockstep_groups(fed, stackable, with_targets=set(targets)) if engine_side(fed).use_lockstep else []:
        losses.update(train_lockstep(fed, group, plans, targets, lam, temperature))
    rest = [i for i in cids if i not in losses]
    losses.update(zip(rest, train_one_by_one(fed, rest, plans, targets=targets, lam=lam, temperature=temperature)))
    return [losses[i] for i in cids]


def lockstep_groups(fed: "RoundView", cids: list[int], with_targets: set[int] = frozenset()) -> list[list[int]]:
    """Groups of two or more students that can train in lockstep: same architecture member,
    plain SGD with equal settings, no stochastic layers (dropout would draw per student), and
    either all with distillation targets (``with_targets``) or none."""
    groups: dict[tuple, list[int]] = {}
    for i in cids:
        client = fed.clients[i]
        settings = _sgd_settings(client.optimizer)
        if settings is None or _stochastic(client.model) or not _plain_float_params(client.model):
            continue
        dtype = next(client.model.parameters()).dtype
        key = (client.arch.model, tuple(sorted(client.arch.kwargs.items())), settings, dtype, i in with_targets)
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


def _plain_float_params(model: nn.Module) -> bool:
    """Every parameter trains and all share one floating dtype (they share one flat tensor)."""
    dtypes = {p.dtype for p in model.parameters()}
    return all(p.requires_grad for p in model.parameters()) and dtypes in ({torch.float32}, {torch.float64})


def _stochastic(model: nn.Module) -> bool:
    for m in model.modules():
        p = getattr(m, "p", None) if isinstance(m, nn.modules.dropout._DropoutNd) else getattr(m, "drop_prob", None)
        if p:
            return True
    return False


class _Stack:
    """G same-architecture models stacked on dim 0. Parameters and SGD momentum are one flat
    [G, P] tensor each, with per-parameter [G, *shape] views into it: clipping and the update are
    a handful of kernels rather than a few per parameter tensor, and a subset of students is
    gathered in one kernel. BatchNorm buffers stay one contiguous [G, *shape] tensor each: the
    vmapped BatchNorm updates them in place through a reshape, which a strided view would turn
    into a copy (and the update would be lost)."""

    def __init__(self, models: list[nn.Module], opts: list[torch.optim.Optimizer]):
        self.models, self.opts = models, opts
        named = [dict(m.named_parameters()) for m in models]
        self.shapes = [(k, p.shape) for k, p in named[0].items()]
        self.flat = _flatten(named, self.shapes)
        # A missing momentum buffer (first step) is zero: SGD's first step sets buf = g, and
        # momentum * 0 + g is exactly g.
        self.momentum = _flatten([{k: _momentum(o, n[k]) for k in n} for o, n in zip(opts, named)], self.shapes)
        bufs = [dict(m.named_buffers()) for m in models]
        self.buffers = {k: torch.stack([b[k] for b in bufs]) for k in bufs[0]}
        self._indices: dict[tuple[int, ...], torch.Tensor] = {}

    def index(self, positions: list[int]) -> torch.Tensor:
        """``positions`` as an index tensor on the device, made once per distinct subset: a fresh
        host-to-device copy at every step would make the host wait for the GPU."""
        key = tuple(positions)
        if key not in self._indices:
            self._indices[key] = torch.tensor(positions, device=self.flat.device)
        return self._indices[key]

    def views(self, flat: torch.Tensor, grad: bool = True) -> dict[str, torch.Tensor]:
        """Per-parameter [G, *shape] views of ``flat`` (leaves autograd differentiates if ``grad``)."""
        views = _views(flat, self.shapes)
        return {k: v.requires_grad_() for k, v in views.items()} if grad else views

    def write_back(self) -> None:
        with torch.no_grad():
            params, momenta = self.views(self.flat, grad=False), self.views(self.momentum, grad=False)
            for g, (model, opt) in enumerate(zip(self.models, self.opts)):
                for k, p in model.named_parameters():
                    p.copy_(params[k][g])
                    if opt.param_groups[0]["momentum"]:
                        opt.state[p]["momentum_buffer"] = momenta[k][g].clone()
                for k, b in model.named_buffers():
                    b.copy_(self.buffers[k][g])


def _flatten(tensors: list[dict[str, torch.Tensor]], shapes: list) -> torch.Tensor:
    """[G, n]: row g holds model g's tensors (in ``shapes`` order), flattened and concatenated."""
    return torch.stack([torch.cat([t[k].detach().reshape(-1) for k, _ in shapes]) for t in tensors])


def _views(flat: torch.Tensor, shapes: list) -> dict[str, torch.Tensor]:
    out, offset = {}, 0
    for k, shape in shapes:
        n = shape.numel()
        out[k] = flat[:, offset : offset + n].view(len(flat), *shape)
        offset += n
    return out


def _momentum(opt: torch.optim.Optimizer, p: torch.Tensor) -> torch.Tensor:
    buf = opt.state.get(p, {}).get("momentum_buffer")
    return torch.zeros_like(p) if buf is None else buf.detach()


def train_lockstep(
    fed: "RoundView", group: list[int], plans: dict[int, EpochPlan], targets: dict[int, torch.Tensor],
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
        for positions in by_size.values():
            ids = [group[g] for g in positions]
            members = stack.index(positions)
            # contiguous: vmapped BatchNorm cannot query a channels-last layout (the CUDA default)
            x = torch.stack([batch(i, t, views) for i in ids]).contiguous()
            y = torch.stack([batch(i, t, labels) for i in ids])
            q = torch.stack([batch(i, t, targets) for i in ids]) if use_targets else None
            losses = _step(stack, members, forward, loss_of, x, y, q, lr, momentum, weight_decay, fed.cfg.grad_clip)
            totals.index_add_(0, members, losses.to(totals.dtype))  # float32 totals, as training.fit
    stack.write_back()
    for g, i in enumerate(group):  # as the loop counts each student's plan (training.fit)
        count_work(fed, plans[i], [i], n_batches[g], len(plans[i]))
    return {i: finite_mean(totals[g], n_batches[g], f"client {i}") for g, i in enumerate(group)}


def _step(stack: _Stack, members: torch.Tensor, forward, loss_of, x, y, q, lr: float, momentum: float,
          weight_decay: float, clip: float) -> torch.Tensor:
    """One SGD step of the stacked students ``members`` (positions in the stack, on the device);
    returns their losses. The whole stack is updated in place; a subset is gathered and scattered."""
    whole = len(members) == len(stack.models)
    flat = stack.flat if whole else stack.flat[members]
    buffers = stack.buffers if whole else {k: v[members] for k, v in stack.buffers.items()}
    params = stack.views(flat)
    logits = vmap(forward)(params, buffers, x)  # BatchNorm updates the buffers in place
    losses = vmap(loss_of, in_dims=(0, 0, None if q is None else 0))(logits, y, q)
    grads = torch.autograd.grad(losses.sum(), list(params.values()))
    with torch.no_grad():
        g = torch.cat([gr.reshape(len(members), -1) for gr in grads], dim=1)
        if clip > 0:  # as nn.utils.clip_grad_norm_, per student
            g.mul_((clip / (g.norm(dim=1, keepdim=True) + 1e-6)).clamp(max=1.0))
        if weight_decay:  # as torch.optim.SGD (no nesterov, no dampening)
            g.add_(flat, alpha=weight_decay)
        if momentum:
            buf = stack.momentum if whole else stack.momentum[members]
            g = buf.mul_(momentum).add_(g)
        flat.add_(g, alpha=-lr)
        if not whole:
            stack.flat[members] = flat
            if momentum:
                stack.momentum[members] = buf
            for k in stack.buffers:
                stack.buffers[k][members] = buffers[k]
    return losses.detach()
