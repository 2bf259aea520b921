"""The simulation engine: builds the federation, owns the round loop, evaluation, checkpoint
selection and metering, and writes the record. Methods only implement ``run_round``.
"""

from __future__ import annotations

import dataclasses
import random
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from hfl_bench import config as config_mod
from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.data import TaskData, TaskInfo, get_task
from hfl_bench.method import Method, get_method_class
from hfl_bench.partition import Partition, make_partition
from hfl_bench.pools import ArchPool, PoolMember, build_model, get_pool, n_params
from hfl_bench.training import Diverged, derive_seed, predict_logits, seeded_choice

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


@dataclass
class Client:
    cid: int
    arch: PoolMember
    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    train_counts: np.ndarray  # per-class training counts


@dataclass
class Federation:
    cfg: RunConfig
    info: TaskInfo
    data: TaskData
    partition: Partition
    pool: ArchPool
    device: torch.device
    clients: list[Client]
    channel: Channel
    val_counts: torch.Tensor  # [N, C] per-class validation counts (fixed)
    val_correct: torch.Tensor  # [N, C] per-class correct, current models (updated by evaluation)
    state: dict[str, Any] = field(default_factory=dict)  # method-owned state

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    def val_accs(self) -> torch.Tensor:
        return self.val_correct / self.val_counts.clamp_min(1)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum,
                               weight_decay=self.cfg.weight_decay)

    def exec_path(self) -> str:
        return "fast" if self.cfg.exec == "auto" else self.cfg.exec


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name} asked for, but CUDA is not available here")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_federation(cfg: RunConfig, info: TaskInfo, data: TaskData, device: torch.device) -> Federation:
    labels = data.train_y.numpy()
    params = {"alpha": cfg.alpha, "k": cfg.classes_per_client}
    partition = make_partition(labels, cfg.clients, cfg.partition, seed=cfg.seed,
                               heldout_fraction=cfg.heldout_fraction, **params)
    pool = get_pool(cfg.pool)
    data = data.to(device)
    clients = []
    fed = Federation(cfg, info, data, partition, pool, device, clients, Channel(cfg.clients),
                     torch.zeros(0), torch.zeros(0))
    for cid, (split, arch) in enumerate(zip(partition.clients, pool.assign(cfg.clients))):
        torch.manual_seed(derive_seed(cfg.seed, "init", cid))
        model = build_model(arch, info).to(device)
        as_tensor = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)  # noqa: E731
        clients.append(Client(
            cid, arch, model, fed.make_optimizer(model), as_tensor(split.train), as_tensor(split.val),
            as_tensor(split.test), np.bincount(labels[split.train], minlength=info.num_classes),
        ))
    fed.val_counts = torch.as_tensor(partition.class_counts(labels, info.num_classes, "val"),
                                     dtype=torch.float32, device=device)
    fed.val_correct = torch.zeros_like(fed.val_counts)
    return fed


# ----------------------------------------------------------------------------- evaluation


def class_correct(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    hit = logits.argmax(dim=-1) == y
    return torch.bincount(y[hit], minlength=num_classes).float()


@dataclass
class ClientEval:
    val_correct: torch.Tensor  # [C]
    local_correct: int
    local_total: int
    global_class_correct: torch.Tensor  # [C]


def evaluate_client(fed: Federation, model: nn.Module, client: Client) -> ClientEval:
    """Validation half, local test half and the task's global test set, in large batches."""
    c = fed.num_classes
    local_idx = torch.cat([client.val_idx, client.test_idx])
    local_logits = predict_logits(model, fed.data.train_x[local_idx]) if len(local_idx) else None
    n_val = len(client.val_idx)
    if local_logits is None:
        val_correct, local_correct = torch.zeros(c, device=fed.device), 0
    else:
        y = fed.data.train_y[local_idx]
        val_correct = class_correct(local_logits[:n_val], y[:n_val], c)
        local_correct = int((local_logits[n_val:].argmax(-1) == y[n_val:]).sum())
    global_logits = predict_logits(model, fed.data.test_x)
    return ClientEval(val_correct, local_correct, len(client.test_idx),
                      class_correct(global_logits, fed.data.test_y, c))


@dataclass
class RoundMetrics:
    """Every client's figures after one round (kept for the best round only)."""

    round: int
    val_acc: np.ndarray  # [N] percent
    local_acc: np.ndarray  # [N] percent (nan for a client without a test half)
    global_acc: np.ndarray  # [N] percent
    global_class_acc: np.ndarray  # [N, C] percent

    @property
    def mean_val(self) -> float:
        return float(np.nanmean(self.val_acc))


class Evaluator:
    """Evaluates client models; clients whose model did not change keep their cached figures."""

    def __init__(self, fed: Federation):
        self.fed = fed
        n, c = fed.n_clients, fed.num_classes
        test_counts = torch.bincount(fed.data.test_y, minlength=c).float()
        self.test_class_counts = test_counts.cpu().numpy()
        self.cache: list[ClientEval | None] = [None] * n

    def __call__(self, rnd: int, models: list[nn.Module], changed: list[int]) -> RoundMetrics:
        fed = self.fed
        for cid in changed:
            self.cache[cid] = evaluate_client(fed, models[cid], fed.clients[cid])
            fed.val_correct[cid] = self.cache[cid].val_correct
        evals = self.cache
        val_tot = fed.val_counts.sum(1).cpu().numpy()
        val = np.array([float(e.val_correct.sum()) for e in evals]) / np.maximum(val_tot, 1) * 100
        val[val_tot == 0] = np.nan
        local = np.array([e.local_correct / e.local_total * 100 if e.local_total else np.nan for e in evals])
        cls = torch.stack([e.global_class_correct for e in evals]).cpu().numpy()
        global_class = cls / np.maximum(self.test_class_counts, 1) * 100
        global_acc = cls.sum(1) / max(self.test_class_counts.sum(), 1) * 100
        return RoundMetrics(rnd, val, local, global_acc, global_class)


# ----------------------------------------------------------------------------- the run


@dataclass
class RunResult:
    status: str  # ok | diverged | failed
    error: str | None
    best: RoundMetrics | None
    history: list[dict[str, Any]]
    fed: Federation
    method: Method
    wall_time_s: float
    peak_memory: dict[str, int | None]
    extra: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[int, int, dict[str, Any]], None]


def make_method(cfg: RunConfig) -> Method:
    cls = get_method_class(cfg.method)
    params = config_mod.coerce_params(cls.Params, cfg.method_params, cfg.method)
    return cls(params)


def load_task(cfg: RunConfig):
    task = get_task(cfg.task)
    return task, config_mod.resolve(cfg, task.info.defaults)


def peak_memory(device: torch.device) -> dict[str, int | None]:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"cpu_rss_bytes": int(rss), "cuda_bytes": cuda}


def run(cfg: RunConfig, progress: ProgressFn | None = None) -> RunResult:
    """Run one method on one task under the standard protocol. ``cfg`` must be resolved."""
    device = pick_device(cfg.device)
    task = get_task(cfg.task)
    method = make_method(cfg)
    data = task.load(cfg.data_dir, cfg.download)
    seed_everything(cfg.seed)
    fed = build_federation(cfg, task.info, data, device)
    method.check(fed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    method.setup(fed)
    evaluator = Evaluator(fed)
    all_clients = list(range(fed.n_clients))
    initial = evaluator(0, method.eval_models(fed), all_clients)
    history = [_history_entry(initial, 0, 0.0, {})]
    best: RoundMetrics | None = None
    status, error = "ok", None
    per_round_sent = []
    k = cfg.clients_per_round or cfg.clients
    for rnd in range(1, cfg.rounds + 1):
        active = all_clients if k >= fed.n_clients else seeded_choice(cfg.seed, fed.n_clients, k, "active", rnd)
        fed.channel.start_round()
        t_round = time.perf_counter()
        try:
            scalars = method.run_round(fed, rnd, active) or {}
        except Diverged as e:
            status, error = "diverged", f"round {rnd}: {e}"
            break
        changed = sorted(set(method.changed_clients(fed, active)))
        metrics = evaluator(rnd, method.eval_models(fed), changed)
        seconds = time.perf_counter() - t_round
        per_round_sent.append(fed.channel.sent.copy())
        entry = _history_entry(metrics, int(fed.channel.sent.sum() + fed.channel.server_sent), seconds, scalars)
        history.append(entry)
        if not np.isfinite(metrics.mean_val):
            pass
        elif best is None or metrics.mean_val > best.mean_val:
            best = metrics
        if progress:
            progress(rnd, cfg.rounds, entry)
    wall = time.perf_counter() - t0
    sent = np.stack(per_round_sent) if per_round_sent else np.zeros((0, fed.n_clients))
    extra = {"bytes_sent_per_client_round": sent}
    return RunResult(status, error, best, history, fed, method, wall, peak_memory(device), extra)


def _history_entry(m: RoundMetrics, nbytes: int, seconds: float, scalars: dict[str, float]) -> dict[str, Any]:
    entry = {
        "round": m.round,
        "mean_val_acc": _round(m.mean_val),
        "local_acc": _round(float(np.nanmean(m.local_acc))),
        "global_acc": _round(float(np.mean(m.global_acc))),
        "bytes": int(nbytes),
        "seconds": round(seconds, 4),
    }
    entry.update({k: _round(float(v)) for k, v in scalars.items()})
    return entry


def _round(x: float, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)
