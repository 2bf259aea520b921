"""Shared types: the federation a method works on, its clients, and round and run results.

``Federation`` is the engine's whole federation: it builds it once per run, evaluates it and
checkpoints it. A method sees it through ``RoundView`` (and each client through ``ClientView``),
the typed list of what a method may read and do during a round; every hook of
``hfl_bench.method_api.Method`` takes ``fed: RoundView``, and ``tests/test_method_view.py`` fails
on a method that reads anything else of it. In short, a method may

- read the run config, the task's metadata, the device, the pool, the client count and classes,
  the per-client per-class validation counts and current accuracies, the public transfer set
  (``public_x`` / ``public_y``, ``--public-size``) and the recipients of a multimodal task;
- train each client's ``model`` with its ``optimizer``, and replace both (FedCC rebuilds every
  model with an extra output): the engine evaluates whatever ``Method.eval_models`` returns;
- send through ``channel`` (the only way bytes are counted; every send declares its payload kind,
  ``hfl_bench.metering.Payload``, and the method uses what ``send`` returns: under message faults
  that is what the receivers get) and time its work with
  ``timer(Phase.TRAINING)`` (named phases only, ``hfl_bench.metering.Phase``);
- count on ``budget`` the optimizer steps it takes outside the training building blocks (FedGD's
  generator): every step of ``fit``, ``train_client`` and ``train_students`` is counted already.

The task's data tensors, the partition's index tensors, the fault and modality plans and the
evaluation state are not in the view: they belong to the engine and to the building blocks,
which read them on a method's behalf (``engine_side``). The services a method composes (seeded
models, epoch plans, training with a loss the method supplies, teacher inference, evaluation of
a shared predictor) are functions of the building blocks, gathered in ``hfl_bench.method_api``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence, cast

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:  # annotations only: the types below depend on nothing above config
    from hfl_bench.config import RunConfig
    from hfl_bench.data import TaskData, TaskInfo
    from hfl_bench.metering import Budget, Channel, PhaseTimer
    from hfl_bench.partition import Partition
    from hfl_bench.pools import ArchPool, PoolMember


class Client:
    """One client: its model and optimizer, its rows of the task's data (index tensors on the
    device) and its per-class training counts. With ``--client-state host`` or ``disk`` the engine's
    store (``hfl_bench.clientstate``) may hold its state elsewhere between its rounds: reading
    ``model`` or ``optimizer`` (or calling the model) brings it back first, bit for bit."""

    def __init__(self, cid: int, arch: "PoolMember", model: nn.Module, optimizer: torch.optim.Optimizer,
                 train_idx: torch.Tensor, val_idx: torch.Tensor, test_idx: torch.Tensor, train_counts: np.ndarray,
                 modalities: tuple[str, ...] = ()):
        self.cid, self.arch = cid, arch
        self._model, self._optimizer = model, optimizer
        self.train_idx = train_idx  # indices into data.train_x, on the device
        self.val_idx, self.test_idx = val_idx, test_idx
        self.train_counts = train_counts  # per-class training counts
        # The modalities this client observes (a multimodal task); empty for a single-modality task.
        # The others are NaN in every row it holds and in the test inputs it is evaluated on.
        self.modalities = modalities
        self.store: Any = None  # the store holding this client's state while it is offloaded, else None
        # a method's second models of this client's own, with their optimizers (``hold``)
        self.extras: list[tuple[nn.Module, torch.optim.Optimizer | None]] = []

    def _resident(self) -> None:
        if self.store is not None:
            self.store.on_access(self)

    @property
    def model(self) -> nn.Module:
        self._resident()
        return self._model

    @model.setter
    def model(self, value: nn.Module) -> None:
        self._resident()
        self._model = value

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        self._resident()
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value: torch.optim.Optimizer) -> None:
        self._resident()
        self._optimizer = value

    @property
    def n_train(self) -> int:
        """How many training samples the client holds (its sample weight in an average)."""
        return len(self.train_idx)

    def hold(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Keep ``module`` (a method's second model of this client's own: FML's meme) and its
        optimizer with the client: under ``--client-state`` they wait where the client's model
        waits, and calling it or reading or loading its ``state_dict`` brings the client back."""
        self._resident()
        self.extras.append((module, optimizer))


class ClientView(Protocol):
    """What a method reads of one client (``fed.clients[cid]``), and the two things it may replace.
    The client's index tensors into the task's data are not in it: plans (``make_plan``) and the
    building blocks gather a client's samples."""

    model: nn.Module  # the client's model: trained in place, or replaced in setup (with its optimizer)
    optimizer: torch.optim.Optimizer  # the optimizer of ``model``, kept across rounds

    @property
    def cid(self) -> int:
        """The client's index, 0 .. n_clients - 1."""

    @property
    def arch(self) -> "PoolMember":
        """The pool member (architecture) the client's model was built from."""

    @property
    def train_counts(self) -> np.ndarray:
        """[C] the client's per-class training-sample counts (its label distribution)."""

    @property
    def n_train(self) -> int:
        """How many training samples the client holds."""

    @property
    def modalities(self) -> tuple[str, ...]:
        """The modalities the client observes on a multimodal task; empty on a single-modality task."""

    def hold(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Keep a second model of the client's own and its optimizer with the client (offloaded and
        brought back with it under ``--client-state``); call it in setup."""


class RoundView(Protocol):
    """What a method may read and use of the federation during a round: the ``fed`` every hook of
    ``hfl_bench.method_api.Method`` receives (the engine passes its ``Federation``, which has all
    of it). Data tensors and partition indices are deliberately absent: use the services of
    ``hfl_bench.method_api`` (plans, the public set below, the family building blocks)."""

    @property
    def cfg(self) -> "RunConfig":
        """The resolved run config (``seed`` for ``derive_seed``, ``local_epochs``, ``grad_clip``, ...)."""

    @property
    def info(self) -> "TaskInfo":
        """The task's metadata: ``num_classes``, ``input_shape``, ``modalities``, ``name``."""

    @property
    def device(self) -> torch.device:
        """The device every model and tensor of the run lives on."""

    @property
    def pool(self) -> "ArchPool":
        """The architecture pool the clients' models come from."""

    @property
    def clients(self) -> Sequence[ClientView]:
        """Every client, indexed by ``cid``."""

    @property
    def n_clients(self) -> int:
        """How many clients the federation has."""

    @property
    def num_classes(self) -> int:
        """How many classes the task has (C)."""

    @property
    def channel(self) -> "Channel":
        """The metered channel: ``send(src, dsts, payload, kind)`` returns what the receivers get."""

    @property
    def timer(self) -> "PhaseTimer":
        """``with fed.timer(Phase.X):`` times a named phase of the method's work."""

    @property
    def budget(self) -> "Budget":
        """The work meter (``hfl_bench.metering.Budget``): the training building blocks count every
        step they run; ``budget.add(SERVER, Data.SERVER, steps, samples)`` counts a server step
        the method takes itself (an optimizer it steps outside them)."""

    @property
    def val_counts(self) -> torch.Tensor:
        """[N, C] each client's per-class validation-sample counts (fixed for the run)."""

    def val_accs(self) -> torch.Tensor:
        """[N, C] each client's current per-class validation accuracy (0 where it has no samples)."""

    @property
    def public_x(self) -> torch.Tensor:
        """Inputs of the public transfer set (``--public-size``; empty if none), never augmented."""

    @property
    def public_y(self) -> torch.Tensor:
        """Labels of the public transfer set: only for a method that uses it labeled (FedMD)."""

    @property
    def recipients(self) -> list[int]:
        """Clients that miss a modality of a multimodal task (none for a single-modality task)."""

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The run's optimizer for ``model`` (``--optimizer``: the protocol's SGD with the run's lr,
        momentum and weight decay, or Adam at the run's lr)."""


def _members(protocol: type) -> frozenset[str]:
    return frozenset(n for n in (*vars(protocol), *protocol.__annotations__) if not n.startswith("_"))


# What each view offers, by name: tests/test_method_view.py holds every method to them.
ROUND_VIEW = _members(RoundView)
CLIENT_VIEW = _members(ClientView)


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
    # The work meter (optimizer steps and samples per client and kind of data), fed by the
    # training building blocks; built with the clients (``engine.build_federation``).
    budget: "Budget" = None  # type: ignore[assignment]
    # The run's captured student steps (an hfl_bench.graphs.StepGraphs, made on first use on CUDA).
    step_graphs: Any = None
    # Where inactive clients' state waits (``--client-state``): a ``clientstate.ClientStore``, or
    # None when every client stays resident on the device.
    client_store: Any = None

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
        """The run's optimizer for ``model`` (``--optimizer``): the protocol's SGD with the run's lr,
        momentum and weight decay, or Adam at the run's lr without weight decay."""
        if self.cfg.optimizer == "adam":
            return torch.optim.Adam(model.parameters(), lr=self.cfg.lr)
        return torch.optim.SGD(model.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum,
                               weight_decay=self.cfg.weight_decay)

    # Execution choices: read by the building blocks (peer-KD backbone, student training), not by
    # methods.

    @property
    def exec_path(self) -> str:
        """``fast`` (teacher-major) or ``reference`` (per batch, as Algorithm 1)."""
        return "fast" if self.cfg.exec == "auto" else self.cfg.exec

    @property
    def use_cuda_graphs(self) -> bool:
        """Student steps replayed as CUDA graphs (``hfl_bench.graphs``, ``--cuda-graphs``): on CUDA
        only when asked for; ``auto`` is the eager loop until a GPU measurement shows the replayed
        steps agree with it and are faster (docs/studies/performance.md). Never on a CPU."""
        return self.device.type == "cuda" and self.cfg.cuda_graphs == "on"


def engine_side(fed: RoundView) -> Federation:
    """The whole ``Federation`` behind a method's view: for the building blocks (training plans,
    student training, the families, evaluation), which read the data tensors, partition indices
    and execution choices on a method's behalf. Never called from a method
    (tests/test_method_view.py). The engine hands methods its Federation, so this only narrows
    the static type."""
    return cast(Federation, fed)


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
    # [N] percent: each client's global test accuracy on the test samples of the classes it holds
    # in training (seen) and of the classes it lacks (unseen); nan where a client has no such test
    # sample (no class lacking). None where the round ran no global test.
    seen_acc: np.ndarray | None = None
    unseen_acc: np.ndarray | None = None
    # [N] percent: each client's model on every client's validation half pooled, measured only
    # under the pooled selection rule (``config.POOLED_SELECTION_RULE``); None otherwise.
    pooled_val_acc: np.ndarray | None = None

    @property
    def mean_val(self) -> float:
        return float(np.nanmean(self.val_acc)) if np.isfinite(self.val_acc).any() else float("nan")

    @property
    def selection_acc(self) -> np.ndarray:
        """[N] the figures the run's selection rule scores (``evaluation.selection_score``): pooled
        validation where it was measured, else each client's own validation."""
        return self.val_acc if self.pooled_val_acc is None else self.pooled_val_acc


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
    # The rule that selected ``best`` (``evaluation.selection_rule``; None: ``config.SELECTION_RULE``)
    # and, under the pooled rule, the selected round's score (mean pooled validation accuracy).
    selection_rule: str | None = None
    selection_score: float | None = None
    clock: dict[str, Any] | None = None  # clock.Clock.record(): the record's ``clock`` section (--devices)
