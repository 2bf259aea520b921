"""Metering: the one channel everything a method sends passes through, and phase timers.

Every send declares what its payload is (``Payload``): the channel meters bytes the same way for
every kind, and a run with message faults (``hfl_bench.faults``) corrupts each kind as that kind
must be corrupted. A dict payload holding several kinds (a snapshot with its statistics, a state
dict with counts) declares a mapping of its keys to kinds.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from enum import Enum
from typing import Any, Callable, Mapping, Union

import numpy as np
import torch
from torch import nn

from hfl_bench.config import ConfigError

SERVER = -1


class Payload(str, Enum):
    """What a message holds, as far as a fault must know to corrupt it (README, Faults)."""

    MODEL = "model"  # a module a peer will run (a white-box snapshot)
    LOGITS = "logits"  # pre-softmax predictions [..., C]
    PROBS = "probs"  # predictions on the simplex [..., C]
    PARAMS = "params"  # parameter tensors: state dicts, weights, updates
    COUNTS = "counts"  # statistics that count: per-class or sample counts
    ACCURACIES = "accuracies"  # statistics in [0, 1]: per-class accuracies
    GENERATOR = "generator"  # synthetic inputs made by a generator
    FEATURES = "features"  # feature vectors in a model's feature space: class prototypes [..., d]


Kind = Union[Payload, Mapping[str, "Kind"]]


def check_kind(payload: Any, kind: Any, method: str = "") -> None:
    """``kind`` must be a ``Payload``, or for a dict payload a mapping with exactly its keys;
    ConfigError naming the method and the kind otherwise (a send never passes unknown data)."""
    who = method or "a method"
    if isinstance(kind, Payload):
        return
    if isinstance(kind, Mapping):
        if not isinstance(payload, dict) or set(kind) != set(payload):
            keys = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
            raise ConfigError(f"{who} sends a payload whose kinds {sorted(kind)} do not match its parts {keys}")
        for key, value in payload.items():
            check_kind(value, kind[key], method)
        return
    raise ConfigError(f"{who} sends a payload of unknown kind {kind!r}: every send declares a "
                      f"hfl_bench.metering.Payload ({', '.join(p.name for p in Payload)})")


def payload_bytes(obj: Any) -> int:
    """Bytes of what would cross the network: tensors by storage size, containers summed."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, nn.Module):
        return payload_bytes(obj.state_dict())
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    if isinstance(obj, (int, float, bool)):
        return 8
    if obj is None:
        return 0
    raise TypeError(f"cannot meter a payload of type {type(obj).__name__}")


# tamper(src, payload, kind, round) -> what the receivers get (hfl_bench.faults.FaultPlan.tamper)
Tamper = Callable[[int, Any, Kind, int], Any]


class Channel:
    """The one metered path for everything a method sends. ``send`` returns what the receivers
    get: the payload itself, or, from a faulty client under message faults, its corrupted form
    (``tamper``); methods use that return value, never the sender's object."""

    def __init__(self, n_clients: int, tamper: Tamper | None = None, method: str = ""):
        self.n = n_clients
        self.sent = np.zeros(n_clients, dtype=np.int64)  # this round, per client
        self.received = np.zeros(n_clients, dtype=np.int64)
        self.server_sent = 0
        self.total = 0
        self.round = 0
        self.tamper = tamper
        self.method = method

    def send(self, src: int, dsts: int | list[int], payload: Any, kind: Kind) -> Any:
        """Send ``payload`` (of ``kind``, a ``Payload`` or a mapping of a dict payload's keys to
        kinds) from ``src`` (``SERVER`` or a client) to ``dsts``; returns what they receive."""
        check_kind(payload, kind, self.method)
        dsts = [dsts] if isinstance(dsts, int) else list(dsts)
        nbytes = payload_bytes(payload)
        for dst in dsts:
            if src == SERVER:
                self.server_sent += nbytes
            else:
                self.sent[src] += nbytes
            if dst != SERVER:
                self.received[dst] += nbytes
            self.total += nbytes
        if self.tamper is not None and src != SERVER:
            return self.tamper(src, payload, kind, self.round)
        return payload

    def start_round(self, rnd: int = 0) -> None:
        self.round = rnd
        self.sent[:] = 0
        self.received[:] = 0
        self.server_sent = 0


class Data(str, Enum):
    """What a training step ran on, as the work meter (``Budget``) splits it."""

    PRIVATE = "private"  # a client's own training shard (an epoch plan)
    PUBLIC = "public"  # the public transfer set (--public-size)
    SYNTHETIC = "synthetic"  # inputs a generator made
    SERVER = "server"  # a model the server (coordinator) trains, whatever its data


DATA = tuple(Data)
CLIENT_DATA = (Data.PRIVATE, Data.PUBLIC, Data.SYNTHETIC)
# What a forward-only pass of a client's model ran for (``Budget.inference``): the kinds of data,
# ``server`` (a client model teaching inside the server's own training) and ``evaluation`` (the
# engine measuring the models), counted apart.
EVALUATION = "evaluation"
INFERENCE = (*(k.value for k in DATA), EVALUATION)
_uncounted = [0]  # > 0: forward passes are not the run's own (``flops.count`` on a copy)


@contextmanager
def uncounted():
    """Forward passes in the block are not counted as the run's inference (FLOP counting on a copy,
    which carries the copied model's hook)."""
    _uncounted[0] += 1
    try:
        yield
    finally:
        _uncounted[0] -= 1


def _batch_len(x: Any) -> int:
    """The samples of a forward's first argument: a tensor's first dimension, else a container's
    first tensor's (a multimodal task's inputs); 0 where there is none."""
    if isinstance(x, torch.Tensor):
        return int(x.shape[0]) if x.dim() else 0
    values = x.values() if isinstance(x, Mapping) else x if isinstance(x, (list, tuple)) else ()
    return next((_batch_len(v) for v in values if isinstance(v, torch.Tensor)), 0)


class Budget:
    """The work meter: optimizer steps and samples processed, per client and per kind of data.

    The building blocks feed it where training happens (``training.fit``, the CUDA-graph steps of
    ``hfl_bench.graphs``): a step is one training iteration of a client, one batch that updates
    every model the client trains on it (FML's private model and meme stepped on one batch are
    one step; FedSocket's separate pass of its Q copy over the same shard is more steps). The
    server's own training is row ``SERVER`` (kind ``Data.SERVER``). What was trained before
    round 1 (``Method.setup``: warm-up, pre-training) is kept apart as the setup share of the
    totals.
    """

    def __init__(self, n_clients: int):
        self.n = n_clients
        shape = (n_clients + 1, len(DATA))  # one row per client, the server's last
        self.steps = np.zeros(shape, dtype=np.int64)
        self.samples = np.zeros(shape, dtype=np.int64)
        self.setup_steps = np.zeros(shape, dtype=np.int64)
        self.setup_samples = np.zeros(shape, dtype=np.int64)
        self.round = 0
        # samples each client's model processed in forward-only passes (gradients off), by
        # ``INFERENCE`` kind: counted by a forward pre-hook on the model (``watch``)
        self.inference_samples = np.zeros((n_clients, len(INFERENCE)), dtype=np.int64)
        self._scope: int | None = None  # the ``INFERENCE`` kind forward-only passes count as now
        self._hooks: dict[int, tuple[int, Any]] = {}  # cid -> (id of the model hooked, the handle)

    @contextmanager
    def inference(self, kind: "Data | str"):
        """Forward-only passes of the clients' models in the block count as ``kind`` (a ``Data``
        or ``EVALUATION``); outside any block they count as private (a client's own data)."""
        before, self._scope = self._scope, INFERENCE.index(Data(kind).value if kind != EVALUATION else kind)
        try:
            yield
        finally:
            self._scope = before

    def watch(self, clients: Any) -> None:
        """Hook each client's current model (once per model object: a method may replace one): a
        call with gradients off adds its batch to the client's forward-only samples. A copy of the
        model (a snapshot a peer or the server runs) carries the hook and counts as its owner's."""
        for c in clients:
            model = c._model
            hooked = self._hooks.get(c.cid)
            if hooked is not None and hooked[0] == id(model):
                continue
            if hooked is not None:
                hooked[1].remove()
            self._hooks[c.cid] = (id(model), model.register_forward_pre_hook(self._forward_hook(c.cid)))

    def _forward_hook(self, cid: int):
        counts = self.inference_samples  # one array for the run (``load`` writes into it)

        def hook(module: nn.Module, args: tuple) -> None:
            # one check and one add per call: training forwards (gradients on) are the work meter's
            if torch.is_grad_enabled() or _uncounted[0] or not args:
                return
            counts[cid, 0 if self._scope is None else self._scope] += _batch_len(args[0])
        return hook

    def add(self, cid: int, kind: Data, steps: int, samples: int) -> None:
        """Count ``steps`` optimizer steps over ``samples`` samples of ``kind`` data by client
        ``cid`` (``SERVER``: the server's own training, of kind ``Data.SERVER``)."""
        kind = Data(kind)
        if (cid == SERVER) != (kind is Data.SERVER):
            raise ValueError(f"budget: server work is of kind 'server' and only the server's ({cid}, {kind.value})")
        if not (cid == SERVER or 0 <= cid < self.n):
            raise ValueError(f"budget: no client {cid} (the federation has {self.n})")
        row = self.n if cid == SERVER else cid
        self.steps[row, DATA.index(kind)] += int(steps)
        self.samples[row, DATA.index(kind)] += int(samples)

    def start_round(self, rnd: int) -> None:
        """Round ``rnd`` begins: at round 1, what was counted so far is the setup's."""
        if rnd >= 1 and self.round == 0:
            self.setup_steps[:] = self.steps
            self.setup_samples[:] = self.samples
        self.round = max(self.round, rnd)

    def state(self) -> dict[str, Any]:
        """The meter as plain data, for a checkpoint (a resumed run counts on from it)."""
        return {"steps": torch.from_numpy(self.steps.copy()), "samples": torch.from_numpy(self.samples.copy()),
                "setup_steps": torch.from_numpy(self.setup_steps.copy()),
                "setup_samples": torch.from_numpy(self.setup_samples.copy()), "round": int(self.round),
                "inference_samples": torch.from_numpy(self.inference_samples.copy())}

    def load(self, state: dict[str, Any]) -> None:
        for name in ("steps", "samples", "setup_steps", "setup_samples"):
            getattr(self, name)[:] = state[name].numpy()
        self.round = int(state["round"])
        if "inference_samples" in state:  # a checkpoint written before inference was counted: from 0
            self.inference_samples[:] = state["inference_samples"].numpy()

    def record(self) -> dict[str, Any]:
        """The record's ``cost.budget``: per-client-per-round means over every client and every
        round begun (a diverged run's last round included; the setup's work too), the server's per
        round, totals, the setup's share of them and each client's totals."""
        rounds = self.round
        def pair(steps, samples) -> dict[str, Any]:
            return {"steps": steps, "samples": samples}

        def per_kind(steps: np.ndarray, samples: np.ndarray, kinds=DATA) -> dict[str, Any]:
            return {k.value: pair(int(steps[:, DATA.index(k)].sum()), int(samples[:, DATA.index(k)].sum()))
                    for k in kinds}

        r, clients = max(rounds, 1), self.steps[: self.n]
        server = DATA.index(Data.SERVER)
        return {
            "rounds": int(rounds),
            "per_client_round": {k.value: pair(_mean(clients[:, DATA.index(k)], r),
                                               _mean(self.samples[: self.n, DATA.index(k)], r))
                                 for k in CLIENT_DATA},
            "server_per_round": pair(round(float(self.steps[self.n, server]) / r, 4),
                                     round(float(self.samples[self.n, server]) / r, 4)),
            "totals": per_kind(self.steps, self.samples),
            "setup": per_kind(self.setup_steps, self.setup_samples),
            "per_client": {k.value: pair(clients[:, DATA.index(k)].tolist(),
                                         self.samples[: self.n, DATA.index(k)].tolist())
                           for k in CLIENT_DATA},
        }


def _mean(per_client: np.ndarray, rounds: int) -> float:
    """The mean over clients of each one's total, per round."""
    return round(float(per_client.mean()) / rounds, 4) if per_client.size else 0.0


class Phase(str, Enum):
    """The phases a round's wall time is split into (the ``phases`` of each history entry)."""

    TRAINING = "training"
    TEACHER_INFERENCE = "teacher_inference"
    AGGREGATION = "aggregation"
    TRAINING_WITH_TEACHERS = "training_with_teachers"  # the reference path interleaves the three above
    EVALUATION = "evaluation"
    INITIALIZATION = "initialization"  # before round 1 (FedMD's transfer learning)
    PSEUDO_LABELS = "pseudo_labels"  # FedCC
    GENERATOR = "generator"  # FedGD's coordinator
    FEATURE_EXTRACTION = "feature_extraction"  # FedSocket's frozen extractor
    CALIBRATION = "calibration"  # FedSocket's Joint rho selection


class PhaseTimer:
    """Wall time per named phase (``Phase``: teacher inference, aggregation, training, evaluation, ...).

    On CUDA the device is synchronized at phase boundaries, so GPU work is charged to the phase
    that launched it. Timing is for records and benchmarks, never for test assertions.
    """

    def __init__(self, device: torch.device):
        self.sync = device.type == "cuda"
        self.round: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: Phase):
        if not isinstance(phase, Phase):
            raise TypeError(f"timer phases are hfl_bench.metering.Phase members, got {phase!r}")
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.round[phase.value] += time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        out = {k: round(v, 5) for k, v in self.round.items()}
        self.round.clear()
        return out
