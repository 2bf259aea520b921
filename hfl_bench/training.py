"""Training building blocks methods compose: plans, one training loop, teacher inference, losses.

A plan fixes an epoch before any training: an ``EpochPlan`` holds a client's batch order and
the augmentation parameters of every sample (both the per-batch reference path and the
teacher-major fast path read views from the same plan, which is what makes them equivalent); a
``TransferPlan`` holds seeded shuffled epochs over a tensor of inputs every client shares.
``fit`` is the one training loop: it walks a plan's batches and steps one or several models
with the losses a method's function returns. Every method trains through it (or through
``graphs.train_students``, which replays a student's steps as CUDA graphs on a GPU and runs this
loop otherwise).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hfl_bench import augment
from hfl_bench.federation import engine_side
from hfl_bench.metering import SERVER, Data
from hfl_bench.registry import METHODS, RegistryError

if TYPE_CHECKING:
    from hfl_bench.federation import ClientView, RoundView

CUDA_CHUNK = 4096
CPU_CHUNK_ELEMENTS = 2**18  # ~1 MB of input per chunk keeps CPU activations in cache (measured)
CPU_TOKEN_WIDTH = 16  # a token id counts as this many input values (it becomes an embedding row)


def inference_chunk(x: torch.Tensor) -> int:
    """Samples per inference call: large on a GPU; on a CPU sized so activations stay in cache
    (for 3x32x32 conv nets, 64-sample chunks ran ~20% faster than 4096; for 8x8 inputs, larger).
    Token ids (integer inputs) count ``CPU_TOKEN_WIDTH`` values each: counted as one, 48 ids made
    4,096-sample chunks, and the text pool's models ran 1.6-5.9x faster at 341 than at 4,096, with
    the same results (``benchmarks/bench_chunk.py``, docs/studies/performance.md)."""
    if x.is_cuda:
        return CUDA_CHUNK
    per_sample = max(1, x[0].numel()) if len(x) else 1
    if not x.is_floating_point():
        per_sample *= CPU_TOKEN_WIDTH
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

    def view(self, fed: "RoundView", start: int = 0, end: int | None = None) -> torch.Tensor:
        """Augmented inputs of positions [start, end) of the epoch."""
        end = len(self.indices) if end is None else end
        x = engine_side(fed).data.train_x[self.indices[start:end]]
        if self.augmentation == "none":
            return x
        return augment.apply(self.augmentation, x, {k: v[start:end] for k, v in self.aug.items()})

    def labels(self, fed: "RoundView", start: int = 0, end: int | None = None) -> torch.Tensor:
        return engine_side(fed).data.train_y[self.indices[start:end]]

    def distinct_view(self, fed: "RoundView") -> tuple[torch.Tensor, torch.Tensor | None]:
        """The epoch's distinct inputs and, for each position, the row of its input (None: the
        rows are ``view()`` itself). Without augmentation every local epoch shows the same samples
        again, so a model that only predicts (a teacher, in eval mode) needs each sample once:
        its outputs on these rows, gathered by the index, are its outputs on ``view()`` (eval-mode
        rows do not depend on each other) at a fraction of the cost (1 / local epochs)."""
        if self.augmentation != "none":
            return self.view(fed), None
        rows, where = torch.unique(self.indices, return_inverse=True)
        return engine_side(fed).data.train_x[rows], where

    def batches(self, fed: "RoundView") -> Iterator["Batch"]:
        for step, (start, end) in enumerate(self.bounds):
            yield Batch(step, start, end, lambda s, e: self.view(fed, s, e), lambda s, e: self.labels(fed, s, e),
                        self.indices[start:end])


@dataclass
class TransferPlan:
    """Seeded shuffled epochs over transfer inputs ``x`` that every client shares (never augmented)."""

    x: torch.Tensor
    order: torch.Tensor  # positions into ``x``, every epoch's permutation in turn
    bounds: list[tuple[int, int]]
    y: torch.Tensor | None = None  # labels of ``x``, for a labeled transfer set
    data: Data = Data.PUBLIC  # what ``x`` is, for the work meter: public inputs or synthetic ones

    def __len__(self) -> int:
        return len(self.order)

    def batches(self, fed: "RoundView") -> Iterator["Batch"]:
        for step, (start, end) in enumerate(self.bounds):
            pos = self.order[start:end]
            yield Batch(step, start, end, lambda s, e, pos=pos: self.x[pos],
                        lambda s, e, pos=pos: None if self.y is None else self.y[pos], pos)


def transfer_plan(fed: "RoundView", x: torch.Tensor, *, epochs: int, seed_parts: tuple,
                  y: torch.Tensor | None = None, batch_size: int | None = None,
                  data: Data | None = None) -> TransferPlan:
    """``epochs`` seeded shuffled epochs over ``x`` at the run's batch size. ``seed_parts``
    (e.g. ``("digest", rnd, cid)``) fix the order independently of any global RNG state.
    ``data`` says what ``x`` is for the work meter; by default what the method's card declares
    it reads (``transfer_data``)."""
    n, batch_size = len(x), batch_size or fed.cfg.batch_size
    gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "transfer", *seed_parts))
    orders, bounds = [], []
    for e in range(epochs if n else 0):
        orders.append(torch.randperm(n, generator=gen))
        bounds += [(s + e * n, t + e * n) for s, t in batch_bounds(n, batch_size)]
    order = torch.cat(orders).to(x.device) if orders else torch.zeros(0, dtype=torch.long, device=x.device)
    return TransferPlan(x, order, bounds, y, transfer_data(fed) if data is None else Data(data))


def transfer_data(fed: "RoundView") -> Data:
    """What a method's transfer inputs are: synthetic for a method whose card declares a synthetic
    transfer set (a generator's output), public otherwise (``--public-size``)."""
    try:
        card = getattr(METHODS.get(fed.cfg.method), "card", None)
    except RegistryError:
        card = None
    return Data.SYNTHETIC if getattr(card, "transfer", None) == "synthetic" else Data.PUBLIC


class Batch:
    """One step of a plan. ``x`` (the inputs, augmented for an epoch plan) and ``y`` (labels; None
    on an unlabeled transfer set) are gathered when first read; ``start:end`` are the step's
    positions within the plan (to slice whole-epoch targets), ``step`` its number, ``idx`` the
    rows it holds (training-set indices for an epoch plan, positions into ``x`` for a transfer plan)."""

    def __init__(self, step: int, start: int, end: int, inputs, labels, idx: torch.Tensor):
        self.step, self.start, self.end, self.idx = step, start, end, idx
        self._inputs, self._labels = inputs, labels

    @cached_property
    def x(self) -> torch.Tensor:
        return self._inputs(self.start, self.end)

    @cached_property
    def y(self) -> torch.Tensor | None:
        return self._labels(self.start, self.end)


def make_plan(fed: "RoundView", cid: int, rnd: int, epochs: int | None = None, purpose: str = "train", *,
              hold_out: int = 0, held: bool = False) -> EpochPlan:
    """The seeded plan of client ``cid``'s local epochs in round ``rnd``. ``hold_out`` sets that
    many of the client's training samples apart (``held_out``: one seeded draw for the whole run,
    e.g. FedL2G's quiz set): the plan walks the other samples, or only the held-out ones (``held``)."""
    epochs = fed.cfg.local_epochs if epochs is None else epochs
    client = engine_side(fed).clients[cid]  # its training indices
    rows = client.train_idx if hold_out <= 0 else held_out(fed, cid, hold_out)[1 if held else 0]
    gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "plan", purpose, rnd, cid))
    n = len(rows)
    orders, bounds = [], []
    for e in range(epochs):
        orders.append(torch.randperm(n, generator=gen))
        bounds += [(s + e * n, t + e * n) for s, t in batch_bounds(n, fed.cfg.batch_size)]
    order = torch.cat(orders).to(client.train_idx.device)
    name = fed.info.augmentation
    # Drawn on the CPU (seeded, device-independent), moved to the data's device once per epoch:
    # a small host-to-device copy per batch would make the host wait for the GPU at every step.
    aug = {k: v.to(order.device) for k, v in augment.draw(name, len(order), fed.info.input_shape, gen).items()}
    return EpochPlan(cid, rows[order], bounds, aug, name)


def held_out(fed: "RoundView", cid: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rest, the held-out ``size``) of client ``cid``'s training indices: a seeded draw that
    depends only on the run seed, the client and ``size`` (the same in every round)."""
    idx = engine_side(fed).clients[cid].train_idx
    gen = torch.Generator().manual_seed(derive_seed(fed.cfg.seed, "hold-out", cid, size))
    perm = torch.randperm(len(idx), generator=gen).to(idx.device)
    return idx[perm[size:]], idx[perm[:size]]


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


def soft_targets(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def kd_loss(student_logits: torch.Tensor, target_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(target || softmax(z / T)), averaged over the batch."""
    log_p = F.log_softmax(student_logits / temperature, dim=-1)
    # F.kl_div(log_p, q, reduction="batchmean") written out (same values).
    kl = (torch.xlogy(target_probs, target_probs) - target_probs * log_p).sum() / log_p.shape[0]
    return kl * temperature**2


def student_loss(logits: torch.Tensor, y: torch.Tensor, q: torch.Tensor | None, lam: float,
                 temperature: float) -> torch.Tensor:
    """(1 - lam) CE + lam KD(q) on one batch; plain CE without targets. The eager loop and the
    steps captured as CUDA graphs (``hfl_bench.graphs``) share this one definition of the loss."""
    loss = F.cross_entropy(logits, y)
    if q is None or lam <= 0:
        return loss
    return (1 - lam) * loss + lam * kd_loss(logits, q, temperature)


TargetFn = Callable[[int, int, torch.Tensor], torch.Tensor]
# A student's distillation targets: a whole-epoch tensor [len(plan), C] computed before training
# (fast path) or a function (start, end, x) -> [B, C] evaluated per batch (reference path).
Targets = torch.Tensor | TargetFn


def batch_targets(targets: Targets, b: "Batch") -> torch.Tensor:
    """The targets of batch ``b``, from either form of ``Targets``."""
    return targets[b.start : b.end] if isinstance(targets, torch.Tensor) else targets(b.start, b.end, b.x)


def finite_mean(total: torch.Tensor | float, batches: int, who: str) -> float:
    """Mean of summed losses; raises ``Diverged`` if it is not finite. Callers sum losses on the
    device and call this once per epoch, so a GPU never waits on each step."""
    mean = float(total) / max(batches, 1)
    if not math.isfinite(mean):
        raise Diverged(f"{who}: loss became {mean}")
    return mean


class Trainee(NamedTuple):
    """A model ``fit`` steps, with its optimizer, a name for error messages and the client that
    owns it (``cid``; None: found by identity among the clients' models, else nobody's). A
    free-rider's trainees are never stepped (``--faults free-rider:...``)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    who: str
    cid: int | None = None


def free_riders(fed: "RoundView") -> frozenset[int]:
    """The clients that never train (--faults free-rider:...); empty without such faults."""
    faults = getattr(engine_side(fed), "faults", None)
    return faults.free_riders if faults is not None else frozenset()


def free_riding(fed: "RoundView", trainees: Sequence[Trainee]) -> list[bool]:
    """For each trainee, whether a free-rider owns it (then ``fit`` leaves it untouched)."""
    riders = free_riders(fed)
    if not riders:
        return [False] * len(trainees)
    return [owner in riders for owner in owners(fed, trainees)]


def owners(fed: "RoundView", trainees: Sequence[Trainee]) -> list[int]:
    """The client that owns each trainee: its ``cid``, else the client whose model it is, else
    ``SERVER`` (a model no client holds: the server's)."""
    out = []
    for t in trainees:
        owner = t.cid
        if owner is None:
            owner = next((c.cid for c in fed.clients if c.model is t.model), SERVER)
        out.append(owner)
    return out


def plan_data(plan: "Plan") -> Data:
    """What a plan trains on: a client's shard (an epoch plan) or its transfer inputs."""
    return Data.PRIVATE if isinstance(plan, EpochPlan) else plan.data


def count_work(fed: "RoundView", plan: "Plan", owner_ids: Sequence[int], steps: int, samples: int) -> None:
    """Count a pass of ``steps`` batches over ``samples`` samples of ``plan`` for each distinct
    owner (one step per batch per client, however many of its models the batch updates); the
    server's training is of kind server whatever its data."""
    meter = engine_side(fed).budget
    for owner in dict.fromkeys(owner_ids):
        meter.add(owner, Data.SERVER if owner == SERVER else plan_data(plan), steps, samples)


Plan = EpochPlan | TransferPlan
LossFn = Callable[[Batch], Sequence[torch.Tensor]]  # one loss per trainee, in order


def fit(fed: "RoundView", plan: Plan, trainees: Sequence[Trainee], loss_fn: LossFn, *,
        clip: float | None = None) -> list[float]:
    """Train ``trainees`` together over ``plan``: for each batch, ``loss_fn(batch)`` returns one
    loss per trainee; one backward of their sum (a loss that reads another trainee's output
    detaches it, so each model gets exactly its own loss's gradient), then each trainee's
    gradient norm is clipped (``clip``, default the run's) and its optimizer steps.

    Returns each trainee's mean loss; raises ``Diverged`` if one is not finite. Losses are summed
    on the device and read once per call, so a GPU never waits on a step.
    """
    clip = fed.cfg.grad_clip if clip is None else clip
    idle = free_riding(fed, trainees)
    if all(idle):  # free-riders only: nothing trains, nothing runs (and nothing is counted)
        return [0.0] * len(trainees)
    # A free-rider's model may still teach the others (its forward runs), but it is never
    # stepped and its buffers (BatchNorm statistics) are put back afterwards.
    kept = [{k: v.clone() for k, v in t.model.named_buffers()} if i else None for t, i in zip(trainees, idle)]
    stepped = [t for t, i in zip(trainees, idle) if not i]
    for t in trainees:
        t.model.train()
    device = plan.indices.device if isinstance(plan, EpochPlan) else plan.x.device
    totals = torch.zeros(len(trainees), device=device)
    steps = 0
    owner_ids = owners(fed, trainees)
    # a teacher's forward-only passes inside the loss run on the plan's data (the server's: server)
    kind = Data.SERVER if all(o == SERVER for o in owner_ids) else plan_data(plan)
    with engine_side(fed).budget.inference(kind):
        for batch in plan.batches(fed):
            losses = list(loss_fn(batch))
            for t in stepped:
                t.optimizer.zero_grad(set_to_none=True)
            (losses[0] if len(losses) == 1 else sum(losses)).backward()
            for t in stepped:
                if clip > 0:
                    nn.utils.clip_grad_norm_(t.model.parameters(), clip)
                t.optimizer.step()
            totals += torch.stack([loss.detach() for loss in losses])
            steps += 1
    count_work(fed, plan, [o for o, i in zip(owner_ids, idle) if not i], steps, len(plan))
    for t, buffers in zip(trainees, kept):
        if buffers is not None:
            with torch.no_grad():
                for name, value in t.model.named_buffers():
                    value.copy_(buffers[name])
            for q in t.model.parameters():
                q.grad = None
    return [finite_mean(total, steps, t.who) for total, t in zip(totals.tolist(), trainees)]


ClientLoss = Callable[[Batch, torch.Tensor], torch.Tensor]  # (batch, the model's logits) -> loss


def cross_entropy(batch: Batch, logits: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, batch.y)


def train_client(fed: "RoundView", client: "ClientView", plan: Plan, loss: ClientLoss = cross_entropy, *,
                 model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 who: str | None = None) -> float:
    """Train one client's model (or ``model`` with ``optimizer``, e.g. a second model the client
    keeps) over ``plan`` with ``loss(batch, logits)``; plain CE by default. Returns the mean loss."""
    model = client.model if model is None else model
    optimizer = client.optimizer if optimizer is None else optimizer
    trainee = Trainee(model, optimizer, who or f"client {client.cid}", client.cid)
    return fit(fed, plan, [trainee], lambda b: [loss(b, model(b.x))])[0]


def distillation_loss(targets: Targets | None, lam: float, temperature: float) -> ClientLoss:
    """(1 - lam) CE + lam KD_T(targets) (either form of ``Targets``)."""

    def loss(b: Batch, logits: torch.Tensor) -> torch.Tensor:
        q = batch_targets(targets, b) if targets is not None and lam > 0 else None
        return student_loss(logits, b.y, q, lam, temperature)

    return loss


def train_on_plan(fed: "RoundView", client: "ClientView", plan: EpochPlan, *,
                  targets: Targets | None = None, lam: float = 0.0, temperature: float = 1.0) -> float:
    """Train ``client`` over its plan with (1 - lam) CE + lam * KD(targets); the mean loss."""
    return train_client(fed, client, plan, distillation_loss(targets, lam, temperature))


def state_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def seeded_choice(seed: int, n: int, k: int, *parts) -> list[int]:
    rng = np.random.default_rng(derive_seed(seed, *parts))
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))
