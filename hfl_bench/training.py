"""Engine primitives methods compose: epoch plans, local training, teacher inference, losses.

An ``EpochPlan`` fixes a client's epoch before any training: the batch order and the
augmentation parameters of every sample. Both the per-batch reference path and the
teacher-major fast path read views from the same plan, which is what makes them equivalent.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench import augment

if TYPE_CHECKING:
    from hfl_bench.engine import Client, Federation

CUDA_CHUNK = 4096
CPU_CHUNK_ELEMENTS = 2**18  # ~1 MB of input per chunk keeps CPU activations in cache (measured)


def inference_chunk(x: torch.Tensor) -> int:
    """Samples per inference call: large on a GPU; on a CPU sized so activations stay in cache
    (for 3x32x32 conv nets, 64-sample chunks ran ~20% faster than 4096; for 8x8 inputs, larger)."""
    if x.is_cuda:
        return CUDA_CHUNK
    per_sample = max(1, x[0].numel()) if len(x) else 1
    return int(min(4096, max(32, CPU_CHUNK_ELEMENTS // per_sample)))


class Diverged(RuntimeError):
    """A loss became NaN or infinite; the engine records the run as diverged."""


def derive_seed(*parts) -> int:
    """A stable 63-bit seed from any parts (run seed, round, client, purpose)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """Consecutive batches; a trailing batch of one sample joins the previous one (BatchNorm
    cannot train on a single sample)."""
    bounds = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2] = (bounds[-2][0], n)
        bounds.pop()
    return bounds


@dataclass
class EpochPlan:
    cid: int
    indices: torch.Tensor  # global train indices in training order, on the data's device
    bounds: list[tuple[int, int]]  # batch boundaries (positions within ``indices``)
    aug: augment.AugParams  # per-position augmentation parameters (on the data's device)
    augmentation: str

    def __len__(self) -> int:
        return len(self.indices)

    def view(self, fed: "Federation", start: int = 0, end: int | None = None) -> torch.Tensor:
        """Augmented inputs of positions [start, end) of the epoch."""
        end = len(self.indices) if end is None else end
        x = fed.data.train_x[self.indices[start:end]]
        if self.augmentation == "none":
            return x
        return augment.apply(self.augmentation, x, {k: v[start:end] for k, v in self.aug.items()})

    def labels(self, fed: "Federation", start: int = 0, end: int | None = None) -> torch.Tensor:
        return fed.data.train_y[self.indices[start:end]]


def make_plan(fed: "Federation", cid: int, rnd: int, epochs: int | None = None, purpose: str = "train") -> EpochPlan:
    """The seeded plan of client ``cid``'s local epochs in round ``rnd``."""
    epochs = fed.cfg.local_epochs if epochs is None else epochs
    client = fed.clients[cid]
    gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "plan", purpose, rnd, cid))
    n = len(client.train_idx)
    orders, bounds = [], []
    for e in range(epochs):
        orders.append(torch.randperm(n, generator=gen))
        bounds += [(s + e * n, t + e * n) for s, t in batch_bounds(n, fed.cfg.batch_size)]
    order = torch.cat(orders).to(client.train_idx.device)
    name = fed.info.augmentation
    # Drawn on the CPU (seeded, device-independent), moved to the data's device once per epoch:
    # a small host-to-device copy per batch would make the host wait for the GPU at every step.
    aug = {k: v.to(order.device) for k, v in augment.draw(name, len(order), fed.info.input_shape, gen).items()}
    return EpochPlan(cid, client.train_idx[order], bounds, aug, name)


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, chunk: int | None = None, bf16: bool = False) -> torch.Tensor:
    """Eval-mode logits in large chunks; the model's train/eval mode is restored afterwards.

    ``bf16`` runs the forward under CUDA bf16 autocast (teacher inference on a GPU); logits
    come back as float32 either way.
    """
    chunk = chunk or inference_chunk(x)
    was_training = model.training
    model.eval()
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and x.is_cuda):
            outs = [model(x[i : i + chunk]).float() for i in range(0, len(x), chunk)]
    finally:
        model.train(was_training)
    return torch.cat(outs) if outs else x.new_zeros((0,))


@torch.no_grad()
def predict_logits_stacked(models: list[nn.Module], x: torch.Tensor, chunk: int | None = None,
                           bf16: bool = False) -> torch.Tensor:
    """Logits of several same-architecture models on the same inputs [G, len(x), C] in one
    vmapped call over their stacked parameters (torch.func); eval mode, like predict_logits."""
    from torch.func import functional_call, stack_module_state

    chunk = chunk or inference_chunk(x)
    params, buffers = stack_module_state(models)
    base = models[0]
    was_training = base.training
    base.eval()

    def one(p, b, xb):
        return functional_call(base, (p, b), (xb,))

    try:
        batched = torch.func.vmap(one, in_dims=(0, 0, None))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and x.is_cuda):
            outs = [batched(params, buffers, x[i : i + chunk]).float() for i in range(0, len(x), chunk)]
    finally:
        base.train(was_training)
    return torch.cat(outs, dim=1)


def soft_targets(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def kd_loss(student_logits: torch.Tensor, target_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(target || softmax(z / T)), averaged over the batch."""
    log_p = F.log_softmax(student_logits / temperature, dim=-1)
    # F.kl_div(log_p, q, reduction="batchmean") written out (same values): it has no vmap
    # batching rule, and lockstep training maps this loss over stacked students.
    kl = (torch.xlogy(target_probs, target_probs) - target_probs * log_p).sum() / log_p.shape[0]
    return kl * temperature**2


def student_loss(logits: torch.Tensor, y: torch.Tensor, q: torch.Tensor | None, lam: float,
                 temperature: float) -> torch.Tensor:
    """(1 - lam) CE + lam KD(q) on one batch; plain CE without targets. Lockstep training maps
    this same function over stacked students, so both paths share one definition of the loss."""
    loss = F.cross_entropy(logits, y)
    if q is None or lam <= 0:
        return loss
    return (1 - lam) * loss + lam * kd_loss(logits, q, temperature)


TargetFn = Callable[[int, int, torch.Tensor], torch.Tensor]


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, clip: float) -> None:
    """One update: backward, clip the global gradient norm (if clip > 0), step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()


def finite_mean(total: torch.Tensor | float, batches: int, who: str) -> float:
    """Mean of summed losses; raises ``Diverged`` if it is not finite. Callers sum losses on the
    device and call this once per epoch, so a GPU never waits on each step."""
    mean = float(total) / max(batches, 1)
    if not math.isfinite(mean):
        raise Diverged(f"{who}: loss became {mean}")
    return mean


def train_on_plan(
    fed: "Federation",
    client: "Client",
    plan: EpochPlan,
    *,
    targets: torch.Tensor | TargetFn | None = None,
    lam: float = 0.0,
    temperature: float = 1.0,
    extra_loss: Callable[[int, int, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """Train ``client`` over its plan with (1 - lam) CE + lam * KD(targets).

    ``targets`` is either one tensor for the whole epoch ([len(plan), C], fast path) or a
    function ``(start, end, x_view) -> [B, C]`` evaluated per batch (reference path).
    ``extra_loss(start, end, x_view, logits)`` adds a method-specific term.
    Returns the mean training loss; raises ``Diverged`` if it is not finite.
    """
    model, opt = client.model, client.optimizer
    model.train()
    total = torch.zeros((), device=plan.indices.device)  # summed on the device: no sync per step
    batches = 0
    for start, end in plan.bounds:
        x = plan.view(fed, start, end)
        y = plan.labels(fed, start, end)
        logits = model(x)
        q = None
        if targets is not None and lam > 0:
            q = targets[start:end] if isinstance(targets, torch.Tensor) else targets(start, end, x)
        loss = student_loss(logits, y, q, lam, temperature)
        if extra_loss is not None:
            loss = loss + extra_loss(start, end, x, logits)
        optimizer_step(model, opt, loss, fed.cfg.grad_clip)
        total += loss.detach()
        batches += 1
    return finite_mean(total, batches, f"client {client.cid}")


def state_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def seeded_choice(seed: int, n: int, k: int, *parts) -> list[int]:
    rng = np.random.default_rng(derive_seed(seed, *parts))
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))
