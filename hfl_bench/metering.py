"""Metering: the one channel everything a method sends passes through, and phase timers."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch import nn

SERVER = -1


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


class Channel:
    """The one metered path for everything a method sends. ``send`` returns the payload."""

    def __init__(self, n_clients: int):
        self.n = n_clients
        self.sent = np.zeros(n_clients, dtype=np.int64)  # this round, per client
        self.received = np.zeros(n_clients, dtype=np.int64)
        self.server_sent = 0
        self.total = 0

    def send(self, src: int, dsts: int | list[int], payload: Any) -> Any:
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
        return payload

    def start_round(self) -> None:
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
