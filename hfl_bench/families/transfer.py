"""Shared machinery of the methods that exchange predictions on a transfer set (FedMD, FedGD,
MSFKD, FedCC): every client predicts on the same inputs, the predictions cross the metered
channel, targets are formed from them, and each client trains on the transfer set.

The transfer set is the public hold-out (``fed.public_x``, from ``--public-size``) or a set a
method synthesizes (FedGD). It is never augmented: every client must predict on identical inputs
for the per-sample aggregation to mean anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from hfl_bench.metering import SERVER, Kind, Phase
from hfl_bench.training import Trainee, engine_side, fit, predict_logits, transfer_data, transfer_plan

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

# loss_fn(logits [B, C'], batch positions [B] into the transfer set) -> scalar loss
TransferLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def transfer_logits(fed: "RoundView", models: dict[int, nn.Module], x: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each model's eval-mode logits on the transfer inputs ``x`` ([M, C'] per client), in
    large batches. On CUDA the forward runs in bf16 autocast like every teacher inference."""
    bf16 = fed.device.type == "cuda"
    with fed.timer(Phase.TEACHER_INFERENCE), engine_side(fed).budget.inference(transfer_data(fed)):
        return {cid: predict_logits(model, x, bf16=bf16) for cid, model in models.items()}


def share_all_to_all(fed: "RoundView", outputs: dict[int, torch.Tensor], kind: Kind) -> dict[int, torch.Tensor]:
    """Decentralized exchange: every client sends its output matrix (of ``kind``: logits or
    probabilities) to every other client in ``outputs`` (what a server-free FedMD / MSFKD puts on
    the network). Returns what the receivers got from each sender; methods form their targets
    from it."""
    senders = list(outputs)
    return {cid: fed.channel.send(cid, [j for j in senders if j != cid], out, kind) for cid, out in outputs.items()}


def upload(fed: "RoundView", outputs: dict[int, torch.Tensor], kind: Kind) -> dict[int, torch.Tensor]:
    """Server exchange, first half: each client uploads its output matrix; what the server got."""
    return {cid: fed.channel.send(cid, SERVER, out, kind) for cid, out in outputs.items()}


def broadcast(fed: "RoundView", aggregate: torch.Tensor, receivers: list[int], kind: Kind) -> torch.Tensor:
    """Server exchange, second half: the server broadcasts one aggregate to ``receivers``."""
    return fed.channel.send(SERVER, receivers, aggregate, kind)


def train_on_transfer(
    fed: "RoundView", model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, loss_fn: TransferLoss, *,
    epochs: int, seed_parts: tuple, who: str, clip: float | None = None,
) -> float:
    """Train ``model`` on the transfer inputs ``x`` for ``epochs`` seeded shuffled epochs at the
    run's batch size (``training.transfer_plan``); ``loss_fn`` gets the logits and the batch's
    positions in ``x`` (to index its targets). Returns the mean loss (0 when there is nothing to
    train on); raises ``Diverged`` if it is not finite."""
    if len(x) == 0 or epochs <= 0:
        return 0.0
    plan = transfer_plan(fed, x, epochs=epochs, seed_parts=seed_parts)
    return fit(fed, plan, [Trainee(model, opt, who)], lambda b: [loss_fn(model(b.x), b.idx)], clip=clip)[0]
