"""FLOPs per sample, measured with torch's own counter, and the record's FLOPs from the work meter.

``count(model, x)`` runs ``model`` on a few samples ``x`` under ``torch.utils.flop_counter.
FlopCounterMode`` twice: once forward (eval mode, no gradients) and once as a training step would
(train mode, forward, a cross-entropy loss, backward), and divides each total by the batch size.
The counter counts the matrix products and convolutions (``mm``, ``addmm``, ``bmm``, ``baddbmm``,
the convolutions and their backward; attention through its matrix products: the fused kernels it
does not see are off while counting), 2 FLOPs per multiply-add;
elementwise work (activations, batch norm, pooling, the loss, the optimizer's update) is not
counted. The training figure is forward + backward as autograd runs it: each counted layer's weight
gradient and the input gradient of every layer but the first (the inputs need no gradient), so
a model of one ``nn.Linear(d, k)`` counts 2dk forward and 4dk training.

``per_sample(arch, model, x)`` is ``count`` on a CPU copy of a client's model (under a forked RNG:
the run's models, its RNG streams and its numerics are never touched), cached in memory for the
process by (architecture name, input shape, the model's class and parameter shapes, which hold
the classes). ``record(budget, forward, training)`` turns the work meter's sample counts into
the record's ``cost.flops``: training FLOPs from the samples trained, inference FLOPs from the
samples each client's model processed in forward-only passes (``metering.Budget.watch``: a
forward pre-hook on the model that adds the batch when gradients are off, by the kind of pass:
private, public, synthetic, server, evaluation) times its forward FLOPs per sample.

A building block: imports torch and the metering types only.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hfl_bench.metering import CLIENT_DATA, DATA, INFERENCE, Budget, uncounted

# Samples per counted pass. Every op the counter counts is linear in the batch (a batch of B costs
# B times one sample), so the per-sample figure does not depend on it; more than one sample keeps
# batch norm's training statistics defined (one sample has no variance).
COUNT_BATCH = 4
COUNTER = "torch.utils.flop_counter.FlopCounterMode"  # what the record's ``cost.flops.counter`` names


class PerSample(NamedTuple):
    """FLOPs per sample of one architecture at one input shape."""

    forward: int  # inference: one forward pass in eval mode
    training: int  # one training pass: forward + backward (the optimizer's step is elementwise: not counted)


def _total(run) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        run()
    return int(counter.get_total_flops())


def count(model: nn.Module, x: torch.Tensor) -> PerSample:
    """FLOPs per sample of ``model`` on the batch ``x`` (forward in eval mode; forward + backward of
    a cross-entropy loss in train mode, every parameter trainable), each the counter's total divided
    by ``len(x)``. Runs on a copy under a forked RNG: ``model``, its gradients and buffers and the
    RNG streams are left as they were (dropout draws, batch norm updates its statistics)."""
    if len(x) < 1:
        raise ValueError("count FLOPs on at least one sample")
    return _count_copy(copy.deepcopy(model), x)


def _count_copy(model: nn.Module, x: torch.Tensor) -> PerSample:
    model.requires_grad_(True)  # the whole model's backward, whatever a method froze
    # nn.MultiheadAttention's eval-mode fast path is one fused kernel the counter does not see, and
    # so is the CPU's fused attention kernel: both off while counting, the same products run as
    # counted matrix products (the math backend of scaled dot-product attention)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        # the copy carries the client model's inference hook (``metering.Budget.watch``): not the run's passes
        with sdpa_kernel(SDPBackend.MATH), uncounted():
            return _count(model, x, len(x))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def _count(model: nn.Module, x: torch.Tensor, n: int) -> PerSample:
    with torch.random.fork_rng(devices=[x.device.index or 0] if x.is_cuda else []):
        model.eval()
        with torch.no_grad():
            forward = _total(lambda: model(x))
        model.train()

        def step():
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.float(), torch.zeros(n, dtype=torch.long, device=logits.device))
            loss.backward()

        training = _total(step)
    return PerSample(forward // n, training // n)


_CACHE: dict[tuple, PerSample] = {}


def signature(model: nn.Module) -> tuple:
    """What the counted FLOPs depend on besides the input: the model's class and every parameter's
    name and shape (a method that changes a pool member's head or adds a module counts apart)."""
    return (type(model).__module__, type(model).__qualname__,
            tuple((name, tuple(p.shape)) for name, p in model.named_parameters()))


def per_sample(arch: str, model: nn.Module, x: torch.Tensor) -> PerSample:
    """FLOPs per sample of a client's ``model`` (architecture ``arch``), counted on a copy on the CPU
    on the first ``COUNT_BATCH`` rows of ``x`` (the task's inputs: their dtype and layout, token ids
    for a text task); cached for the process by (architecture, input shape, the model's
    ``signature``, which holds the classes)."""
    key = (arch, tuple(int(d) for d in x.shape[1:]), signature(model))
    if key not in _CACHE:
        # NaN stands for an unobserved modality in a multimodal task's rows: the count reads shapes only
        _CACHE[key] = _count_copy(copy.deepcopy(model).cpu(), x[:COUNT_BATCH].detach().cpu())
    return _CACHE[key]


def record(budget: Budget, forward: Sequence[int], training: Sequence[int]) -> dict[str, Any]:
    """The record's ``cost.flops``: each client's FLOPs per sample (``forward``, ``training``, in
    client order) and its training FLOPs by kind of data: samples trained (``budget``, setup
    included) x training FLOPs per sample of its architecture, as totals per client, totals over
    clients and means per client per round (the budget's divisor: clients x rounds begun). The
    server's own training is not counted (its models are no pool member's)."""
    n = budget.n
    if len(forward) != n or len(training) != n:
        raise ValueError(f"FLOPs per sample of {len(forward)} / {len(training)} clients for a budget of {n}")
    per_sample_training = np.asarray(training, dtype=np.int64)
    rounds = max(budget.round, 1)
    per_client, totals, per_round = {}, {}, {}
    for kind in CLIENT_DATA:
        flops = [int(s) * int(f) for s, f in zip(budget.samples[:n, DATA.index(kind)], per_sample_training)]
        per_client[kind.value] = flops
        totals[kind.value] = sum(flops)
        per_round[kind.value] = round(sum(flops) / n / rounds, 1) if n else 0.0
    return {
        "counter": COUNTER,
        "per_sample": {"forward": [int(f) for f in forward], "training": [int(t) for t in training]},
        "training": {"per_client_round": per_round, "totals": totals, "per_client": per_client},
        "inference": inference(budget, forward),
    }


def inference(budget: Budget, forward: Sequence[int]) -> dict[str, Any]:
    """``cost.flops.inference``: each client's forward-only samples by kind (``metering.INFERENCE``)
    x the forward FLOPs per sample of its model, in the training figure's shape (per client per
    round over clients x rounds begun, totals, per client)."""
    n, rounds = budget.n, max(budget.round, 1)
    per_client, totals, per_round = {}, {}, {}
    for i, kind in enumerate(INFERENCE):
        flops = [int(s) * int(f) for s, f in zip(budget.inference_samples[:n, i], forward)]
        per_client[kind] = flops
        totals[kind] = sum(flops)
        per_round[kind] = round(sum(flops) / n / rounds, 1) if n else 0.0
    return {"per_client_round": per_round, "totals": totals, "per_client": per_client}
