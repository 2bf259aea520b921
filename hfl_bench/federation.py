"""Shared types: the federation a method works on, its clients, and round and run results.

``Federation`` is what a method sees. Read it, do not rebuild it: the engine builds it once per
run, evaluates it and checkpoints it. A method may

- read ``cfg`` (the resolved run config), ``info`` (the task's metadata), ``device``,
  ``n_clients``, ``num_classes``, ``val_counts`` / ``val_accs()`` (per-client, per-class validation
  counts and the current models' accuracies), ``public_x`` / ``public_y`` (the public transfer
  set, ``--public-size``), ``data`` (the task's tensors, on the device) and ``pool``;
- train each client's ``model`` with its ``optimizer``, and replace both (FedCC rebuilds every
  model with an extra output): the engine evaluates whatever ``Method.eval_models`` returns;
- send through ``channel`` (the only way bytes are counted; every send declares its payload kind,
  ``hfl_bench.metering.Payload``, and the method uses what ``send`` returns: under message faults
  that is what the receivers get) and time its work with
  ``timer(Phase.TRAINING)`` (named phases only, ``hfl_bench.metering.Phase``).

Everything else (the partition's index tensors, evaluation state) belongs to the engine. The
services a method composes (seeded models, epoch plans, training with a loss the method
supplies, teacher inference) are functions of the building blocks, gathered in
``hfl_bench.method_api``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:  # annotations only: the types below depend on nothing above config
    from hfl_bench.config import RunConfig
    from hfl_bench.data import TaskData, TaskInfo
    from hfl_bench.metering import Channel, PhaseTimer
    from hfl_bench.partition import Partition
    from hfl_bench.pools import ArchPool, PoolMember


@dataclass
class Client:
    cid: int
    arch: "PoolMember"
    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_idx: torch.Tensor  # indices into data.train_x, on the device
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    train_counts: np.ndarray  # per-class training counts
    # The modalities this client observes (a multimodal task); empty for a single-modality task.
    # The others are NaN in every row it holds and in the test inputs it is evaluated on.
    modalities: tuple[str, ...] = ()


@dataclass
class Federation:
    cfg: "RunConfig"
    info: "TaskInfo"
    data: "TaskData"
    partition: "Partition"
    pool: "ArchPool"
    device: torch.device
    clients: list[Client]
    channel: "Channel"
    val_counts: torch.Tensor  # [N, C] per-class validation counts (fixed)
    val_correct: torch.Tensor  # [N, C] per-class correct, current models (updated by evaluation)
    timer: "PhaseTimer"
    # Training indices of the public transfer set (--public-size), on the device; empty if none.
    public_idx: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    # The run's fault plan (--faults; an hfl_bench.faults.FaultPlan, which builds on the training
    # blocks, hence untyped here), None without faults. Methods do not read it: the channel, the
    # training loops and the engine apply it.
    faults: Any = None
    # The run's modality plan (an hfl_bench.modalities.ModalityPlan: recipients, donors, what each
    # client observes), None for a single-modality task. Methods read each client's ``modalities``.
    modality_plan: Any = None

    @property
    def public_x(self) -> torch.Tensor:
        """Inputs of the public transfer set (normalized like all data; never augmented)."""
        return self.data.train_x[self.public_idx]

    @property
    def public_y(self) -> torch.Tensor:
        """Labels of the public transfer set: only for methods that use it labeled (FedMD)."""
        return self.data.train_y[self.public_idx]

    @property
    def recipients(self) -> list[int]:
        """Clients that miss a modality of a multimodal task (none for a single-modality task)."""
        full = len(self.info.modalities)
        return [c.cid for c in self.clients if c.modalities and len(c.modalities) < full]

    @property
    def client_groups(self) -> dict[str, list[int]]:
        """The client groups the record reports besides all clients, the headline's first: the
        honest and faulty clients of a run with faults, the recipients and donors of a multimodal
        run (the two never come together); empty otherwise."""
        if self.faults is not None:
            return {"honest": self.faults.honest, "faulty": list(self.faults.faulty)}
        if self.modality_plan is not None:
            return {"recipients": self.modality_plan.recipients, "donors": self.modality_plan.donors}
        return {}

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    def val_accs(self) -> torch.Tensor:
        """[N, C] each client's current per-class validation accuracy (0 where it has no samples)."""
        return self.val_correct / self.val_counts.clamp_min(1)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The protocol's optimizer (SGD with the run's lr, momentum and weight decay) for ``model``."""
        return torch.optim.SGD(model.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum,
                               weight_decay=self.cfg.weight_decay)

    # Execution choices: read by the building blocks (peer-KD backbone, lockstep), not by methods.

    @property
    def exec_path(self) -> str:
        """``fast`` (teacher-major) or ``reference`` (per batch, as Algorithm 1)."""
        return "fast" if self.cfg.exec == "auto" else self.cfg.exec

    @property
    def use_vmap(self) -> bool:
        """Stacked (vmapped) teacher inference per architecture (``--vmap``): on only when asked
        for; ``auto`` is off (a loop of large-batch calls is the faster default)."""
        return self.cfg.vmap == "on"

    @property
    def use_lockstep(self) -> bool:
        """Same-architecture students train together (``hfl_bench.lockstep``, ``--lockstep``): on
        only when asked for; ``auto`` is off."""
        return self.cfg.lockstep == "on"


@dataclass
class RoundMetrics:
    """Every client's figures after one round (kept for the selected round only)."""

    round: int
    val_acc: np.ndarray  # [N] percent (nan for a client without a validation half)
    local_acc: np.ndarray | None  # [N] percent (nan for a client without a test half); None: no test this round
    global_acc: np.ndarray | None  # [N] percent; None when the global test was skipped this round
    global_class_acc: np.ndarray | None  # [N, C] percent
    endpoints: dict[str, dict[str, float]] = field(default_factory=dict)  # extra endpoints (Method.endpoints)
    # Per client figures of each extra endpoint: {name: {"global_acc": [N], "local_acc": [N]}} (percent,
    # nan where a client has no local test half): the results layer averages them over client groups.
    endpoint_clients: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def mean_val(self) -> float:
        return float(np.nanmean(self.val_acc)) if np.isfinite(self.val_acc).any() else float("nan")


@dataclass
class RunResult:
    """What a finished (or diverged) run hands to the results layer."""

    status: str  # ok | diverged | failed
    error: str | None
    best: RoundMetrics | None
    history: list[dict[str, Any]]
    fed: Federation
    method: Any  # the run's Method instance (hfl_bench.method_api.Method)
    wall_time_s: float
    peak_memory: dict[str, int | None]
    bytes_sent_per_client_round: np.ndarray  # [rounds, N]
    code: dict[str, Any]  # provenance.git_info() when the run started
    resumed_from_rounds: list[int] = field(default_factory=list)
    faults: dict[str, Any] | None = None  # FaultPlan.record(): the record's faults section
    # A multimodal task's modality access (hfl_bench.modalities.ModalityPlan.record()): the record's
    # ``modalities`` section, with the recipients and donors whose figures the record reports.
    modalities: dict[str, Any] | None = None
