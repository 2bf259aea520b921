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
