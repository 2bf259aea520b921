"""The simulation engine: builds the federation, owns the round loop, evaluation, selection of
the reported round, metering and checkpoints. Methods implement ``run_round``; the results layer
turns the ``RunResult`` into a record.

One run at a time per process (issue 63): a run draws from process-wide state (torch's, numpy's
and Python's global random streams, which ``seed_everything`` seeds and every client's model
initialization re-seeds, and torch's thread count), so two runs interleaved in one process by
two threads would each compute figures neither would alone, under the config hash of the one
they claim. ``run`` holds ``RUN_LOCK`` for the whole run (so do ``runpath.run_resolved`` and
``hfl_bench.run``, from before resolving to the written record): a second thread's run waits for
the first to end, then runs exactly as it would have run alone. Runs in parallel are processes (a
matrix's worker processes, ``--jobs``). A ``Simulation`` stepped by a driver of its own is not locked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import resource
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from hfl_bench import checkpoint as ckpt
from hfl_bench import config as config_mod
from hfl_bench.capacity import CAPACITY_STREAM
from hfl_bench.clientstate import store_for
from hfl_bench.config import FINAL_ROUNDS, ConfigError, RunConfig
from hfl_bench.data import TaskData, TaskInfo, get_task, task_defaults
from hfl_bench.evaluation import (  # noqa: F401 (re-exported)
    Evaluator,
    class_correct,
    endpoint_means,
    evaluate_global,
    selection_score,
)
from hfl_bench.families.ensemble import with_mean_ensemble
from hfl_bench.faults import FaultPlan, canonical_config, plan_for
from hfl_bench.federation import Client, Federation, RoundMetrics, RunResult
from hfl_bench.metering import CLIENT_DATA, DATA, EVALUATION, Budget, Channel, PhaseTimer
from hfl_bench.method_api import (  # noqa: F401 (re-exported: the run's method is resolved there)
    Method,
    canonical_method,
    check_card_setting,
    check_method_for_task,
    get_method_class,
    make_method,
    method_defaults,
    resolve_method,
)
from hfl_bench.modalities import ModalityPlan, mask_clients
from hfl_bench.modalities import plan_for as modality_plan_for
from hfl_bench.partition import TINY_MIN_SAMPLES, Partition, given_partition, make_partition
from hfl_bench.paths import checkpoint_path, remove_temporaries
from hfl_bench.pools import check_pool_for_task, get_pool, seeded_model
from hfl_bench.provenance import git_info
from hfl_bench.training import Diverged, derive_seed, seeded_choice

log = logging.getLogger(__name__)

# Held by the thread whose run is in progress (see the module's docstring). Reentrant: a progress
# callback may start a run of its own in the same thread, as it could when runs were unlocked.
RUN_LOCK = threading.RLock()


def pick_device(name: str) -> torch.device:
    """The torch device of ``--device``: a name ``config.DEVICE_NAME`` allows and this machine has
    (ConfigError naming the devices valid here otherwise), checked before any data loads."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if config_mod.DEVICE_NAME.fullmatch(name) is None:  # meta, mps, xpu...: not devices a run works on
        raise ConfigError(f"unknown device {name!r}: --device must be {config_mod.DEVICES} "
                          f"(valid here: {', '.join(valid_devices())})")
    if name.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(name.partition(":")[2] or 0)
        if index >= count:
            have = "CUDA is not available here" if not count else f"this machine has {count} CUDA device(s)"
            raise ConfigError(f"--device {name} asked for, but {have} (valid here: {', '.join(valid_devices())})")
    return torch.device(name)


def valid_devices() -> list[str]:
    """The ``--device`` values this machine can run on."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["auto", "cpu", *(["cuda", *(f"cuda:{i}" for i in range(count))] if count else [])]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_federation(cfg: RunConfig, info: TaskInfo, data: TaskData, device: torch.device,
                     plans: tuple[ModalityPlan | None, FaultPlan | None] | None = None) -> Federation:
    """The federation of a resolved config; ``plans`` are its modality and fault plans when the
    caller already built them (``resolved.resolve_run``), else built here."""
    labels = data.train_y.numpy()
    modal, faults = plans if plans is not None else (modality_plan_for(cfg, info), plan_for(cfg))
    partition = partition_for(cfg, info, data)
    pool = get_pool(cfg.pool)
    check_pool_for_task(pool, info)
    if modal is not None:  # recipients never see their missing modality: NaN in every row they hold
        check_modality_setting(cfg, modal)
        rows = [torch.as_tensor(np.concatenate([c.train, c.val, c.test]), dtype=torch.long) for c in partition.clients]
        data = dataclasses.replace(data, train_x=mask_clients(data.train_x, info, modal, rows))
    data = data.to(device)
    cuda = device.type == "cuda"
    if cuda:  # channels-last convolutions are faster on tensor cores; indexing keeps the layout
        # No cudnn.benchmark: client shards give many batch shapes, and re-tuning each new one
        # made partially participating rounds ~3x slower on an H200 (README, Performance).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        data = dataclasses.replace(data, train_x=_channels_last(data.train_x), test_x=_channels_last(data.test_x))
    if faults is not None:  # label-noise flips the faulty clients' training labels (a copy), before training
        data = dataclasses.replace(data, train_y=faults.apply_label_noise(
            data.train_y, [c.train for c in partition.clients], info.num_classes))
        labels = data.train_y.cpu().numpy()
    clients = []
    channel = Channel(cfg.clients, tamper=None if faults is None else faults.tamper, method=cfg.method)
    fed = Federation(cfg, info, data, partition, pool, device, clients, channel,
                     torch.zeros(0), torch.zeros(0), PhaseTimer(device), faults=faults, modality_plan=modal)
    for cid, (split, arch) in enumerate(zip(partition.clients, pool.assign(cfg.clients, cfg.capacity_profile,
                                                                            derive_seed(cfg.seed, CAPACITY_STREAM)))):
        observed = modal.observed[cid] if modal is not None else ()
        if modal is not None:  # a recipient's architecture has encoders for what it observes only
            arch = arch.observing(observed, modal.names)
        model = seeded_model(arch, info, derive_seed(cfg.seed, "init", cid), device, keep_global_rng=False)
        as_tensor = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)  # noqa: E731
        clients.append(Client(
            cid, arch, model, fed.make_optimizer(model), as_tensor(split.train), as_tensor(split.val),
            as_tensor(split.test), np.bincount(labels[split.train], minlength=info.num_classes), observed,
        ))
    fed.budget = Budget(len(clients))
    fed.public_idx = torch.as_tensor(partition.public, dtype=torch.long, device=device)
    fed.val_counts = torch.as_tensor(partition.class_counts(labels, info.num_classes, "val"),
                                     dtype=torch.float32, device=device)
    fed.val_correct = torch.zeros_like(fed.val_counts)
    return fed


def check_modality_setting(cfg: RunConfig, plan: ModalityPlan) -> None:
    """Settings a missing-modality run cannot combine with yet (one clear line each)."""
    if cfg.faults:
        raise ConfigError("--faults on a task with missing modalities is not supported yet: run faults on a "
                          "single-modality task, or drop --faults")
    if cfg.public_size and plan.recipients:
        raise ConfigError("--public-size on a task with missing modalities would hand recipients the modality "
                          "they miss (a public sample holds every modality): drop --public-size")


def partition_for(cfg: RunConfig, info: TaskInfo, data: TaskData) -> Partition:
    """The run's client partition: drawn by the configured partitioner, or made of the groups the
    task ships (partition ``given``: its users, movies or files, one client each or ``--clients``
    of them packed into whole-group clients)."""
    labels = data.train_y.numpy()
    if data.client_indices is None or cfg.partition != "given":
        if data.client_indices is None and cfg.partition == "given":
            raise ConfigError(f"task {info.name} ships no client partition: --partition given needs one "
                              f"(use dirichlet, classes or iid)")

        def draw(n_clients: int) -> Partition:
            return make_partition(labels, n_clients, cfg.partition, seed=cfg.seed,
                                  heldout_fraction=cfg.heldout_fraction, public_size=cfg.public_size,
                                  pretrain_size=cfg.pretrain_size, alpha=cfg.alpha,
                                  k=cfg.classes_per_client)

        partition = draw(cfg.clients)
        if clients_without_heldout(partition):
            raise ConfigError(heldout_message(info, cfg, partition, draw))
        return partition
    n = len(data.client_indices)
    if cfg.pretrain_size:
        raise ConfigError(f"task {info.name}: a pretraining split is not held out of a given partition: drop "
                          f"--pretrain-size, or draw the clients (--partition dirichlet)")
    if cfg.clients > n:
        raise ConfigError(f"task {info.name}: --clients {cfg.clients}, but its data holds {n} natural clients: "
                          f"pass --clients {n} or fewer (fewer: clients made of whole ones)")
    partition = given_partition(data.client_indices, labels, seed=cfg.seed, heldout_fraction=cfg.heldout_fraction,
                                n_clients=cfg.clients, public_size=cfg.public_size)
    if clients_without_heldout(partition):
        raise ConfigError(heldout_message(info, cfg, partition, None))
    return partition


def clients_without_heldout(partition: Partition) -> list[int]:
    """Clients with no validation or no local test sample: selection and local accuracy need both."""
    return [cid for cid, c in enumerate(partition.clients) if len(c.val) == 0 or len(c.test) == 0]


def heldout_message(info: TaskInfo, cfg: RunConfig, partition: Partition,
                    draw: Callable[[int], Partition] | None) -> str:
    """Why the partition cannot be evaluated, and the largest --clients that can (when drawn)."""
    empty = clients_without_heldout(partition)
    first = partition.clients[empty[0]]
    size = len(first.train) + len(first.val) + len(first.test)
    why = (f"{info.name}: {len(empty)} of {partition.n_clients} clients get no validation or local test sample "
           f"(client {empty[0]} holds {size} samples, held-out fraction {cfg.heldout_fraction})")
    if cfg.heldout_fraction == 0:
        return why + "; set heldout_fraction above 0"
    if draw is None:
        return why + "; raise heldout_fraction or use a folder with larger client shards"
    # A client needs two held-out samples, which a shard of three or more always gets
    # (``partition.split_client``), and shards hold n / N samples on average: no N above n / 3 can
    # work, so the search starts there (drawing hundreds of shards takes seconds).
    n = sum(len(c.train) + len(c.val) + len(c.test) for c in partition.clients)
    fits = largest_clients_with_heldout(draw, min(partition.n_clients, n // TINY_MIN_SAMPLES + 1))
    return why + (f"; --clients {fits} gives every client both" if fits else "")


def largest_clients_with_heldout(draw: Callable[[int], Partition], n: int) -> int | None:
    """A client count below ``n`` whose partition gives every client validation and test samples,
    near the largest: a binary search for the boundary, checked downward (seeded draws need not
    be monotone)."""
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if clients_without_heldout(draw(mid)):
            hi = mid
        else:
            lo = mid
    for candidate in range(lo, max(lo - 20, 0), -1):
        if not clients_without_heldout(draw(candidate)):
            return candidate
    return None


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


# ----------------------------------------------------------------------------- the run


ProgressFn = Callable[[int, int, dict[str, Any]], None]
# What resolving a run built (``resolved.resolve_run``): its method, modality plan and fault plan.
Built = tuple[Method, "ModalityPlan | None", "FaultPlan | None"]


def load_task(cfg: RunConfig):
    """The config's task and the config resolved as a run resolves it (``resolved.resolve_run``)
    but without building its method: for drivers and tests that build a ``Simulation`` themselves."""
    cfg = config_mod.resolve_settings(cfg, task_defaults, method_defaults)
    task = get_task(cfg.task)
    modality_plan_for(cfg, task.info)  # a modality setting that does not fit the task: before any data loads
    return task, canonical_method(canonical_config(cfg))  # the fault spec checked and spelled one way


def peak_memory(device: torch.device) -> dict[str, int | None]:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"cpu_rss_bytes": int(rss), "cuda_bytes": cuda}


class Simulation:
    """One run, stepped round by round: ``run`` for the whole budget, ``step`` for drivers such
    as benchmarks. Building it loads the data, partitions it, builds every client and evaluates
    the initial models (round 0)."""

    def __init__(self, cfg: RunConfig, code: dict[str, Any] | None = None, built: Built | None = None):
        self.cfg = cfg
        self.code = git_info() if code is None else code  # the code version when the run starts
        device = pick_device(cfg.device)
        task = get_task(cfg.task)
        self.method = make_method(cfg) if built is None else built[0]
        data = task.load(cfg.data_dir, cfg.download)
        seed_everything(cfg.seed)
        self.fed = fed = build_federation(cfg, task.info, data, device, None if built is None else built[1:])
        check_card_setting(self.method.card, fed)
        self.method.check(fed)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.t0 = time.perf_counter()
        self.method.setup(fed)
        self.clock = build_clock(cfg, fed)  # after setup: a method may change a member's head there
        self.store = store_for(cfg.client_state, cfg.out, cfg.client_state_dir,
                               f"{cfg.task}-{cfg.method}-seed{cfg.seed}")
        if self.store is not None:  # after setup: a method may replace its clients' models there
            try:
                self.store.attach(fed, cfg.method)
            except ConfigError:
                self.store.close()
                raise
        self.evaluator = Evaluator(fed, fed.timer, cfg.eval_every)
        self.all_clients = list(range(fed.n_clients))
        fed.budget.watch(fed.clients)  # after setup, which may replace models (setup's own passes: before)
        models, endpoints = self.eval_modules()
        with fed.budget.inference(EVALUATION):
            initial = self.evaluator(0, models, self.all_clients, endpoints=endpoints)
        self.offload()
        self.groups = fed.client_groups
        self.history = [_history_entry(initial, 0, 0.0, {}, fed.timer.pop(), self.groups)]
        self.best: RoundMetrics | None = None
        self.sent: list[np.ndarray] = []
        self.resumed_from: list[int] = []  # rounds of the checkpoints this run was resumed from

    def eval_modules(self) -> tuple[list[nn.Module], dict[str, list[nn.Module]]]:
        """The models the evaluator measures and the extra endpoints' predictors, listed without
        bringing an offloaded client back (the evaluator brings back those it measures)."""
        with self.store.lazy() if self.store is not None else contextlib.nullcontext():
            models = self.method.eval_models(self.fed)
            return models, self.endpoints(models)

    def offload(self) -> None:
        """Every client's state off the device (``--client-state`` host or disk) until it is used."""
        if self.store is not None:
            self.store.offload_all()

    def close(self) -> None:
        """Every client back, and a disk store's folder removed (the run is over)."""
        if self.store is not None:
            self.store.close()

    def endpoints(self, models: list[nn.Module]) -> dict[str, list[nn.Module]]:
        """The method's extra endpoints, and with ``--ensemble`` the plain ensemble of ``models``
        (the clients' evaluated models; ``families.ensemble``)."""
        endpoints = self.method.endpoints(self.fed)
        return with_mean_ensemble(endpoints, models, self.fed) if self.cfg.ensemble else endpoints

    def drawn_clients(self, rnd: int) -> list[int]:
        """The clients drawn for round ``rnd`` (all of them without --clients-per-round)."""
        k = self.cfg.clients_per_round or self.cfg.clients
        if k >= self.fed.n_clients:
            return self.all_clients
        return seeded_choice(self.cfg.seed, self.fed.n_clients, k, "active", rnd)

    def active_clients(self, rnd: int) -> list[int]:
        """The drawn clients less the stragglers that miss this round (--faults straggler:...)."""
        drawn = self.drawn_clients(rnd)
        faults = self.fed.faults
        return drawn if faults is None else [c for c in drawn if not faults.misses(c, rnd)]

    def step(self, rnd: int) -> dict[str, Any]:
        """Run round ``rnd`` and evaluate; raises ``Diverged`` (a loss, or a model's logits at
        evaluation, ``evaluation.NonFiniteOutputs``, not finite: the round is not recorded)."""
        fed, method = self.fed, self.method
        active, dropped = self.active_clients(rnd), []
        if self.clock is not None:  # a deadline drops late clients as a straggler is dropped; else none
            active, dropped = self.clock.admit(active, self.history)
        fed.channel.start_round(rnd)
        fed.budget.start_round(rnd)
        samples_before = fed.budget.samples.copy()
        t_round = time.perf_counter()
        fed.budget.watch(fed.clients)  # the models the clients hold now (a method may have replaced one)
        if active:
            scalars = method.run_round(fed, rnd, active) or {}
            changed = sorted(set(method.changed_clients(fed, active)))
        else:  # every drawn client missed this round (a straggler, the deadline): nothing runs
            scalars, changed = {}, []
        clock_entry = None if self.clock is None else self.clock_entry(active, dropped, samples_before)
        fed.budget.watch(fed.clients)
        models, endpoints = self.eval_modules()
        with fed.budget.inference(EVALUATION):
            metrics = self.evaluator(rnd, models, changed, last=rnd == self.cfg.rounds, endpoints=endpoints)
        self.offload()
        seconds = time.perf_counter() - t_round
        self.sent.append(fed.channel.sent.copy())
        nbytes = int(fed.channel.sent.sum() + fed.channel.server_sent)
        entry = _history_entry(metrics, nbytes, seconds, scalars, fed.timer.pop(), self.groups)
        if rnd > self.cfg.rounds - FINAL_ROUNDS:
            entry.update(_client_entry(metrics))
        if clock_entry is not None:
            entry["clock"] = clock_entry
        self.history.append(entry)
        # the selected round: ``evaluation.select_round`` round by round, on every client's validation
        # (own or pooled, the evaluator's ``rule``)
        score = selection_score(metrics.selection_acc)
        if np.isfinite(score) and (self.best is None or score > selection_score(self.best.selection_acc)):
            self.best = metrics
        return entry

    def clock_entry(self, ran: list[int], dropped: list[int], samples_before: np.ndarray) -> dict[str, Any]:
        """The round's simulated time (``clock.Clock.round_entry``): each client's training FLOPs
        this round (the samples it trained, every kind of client data, x its training FLOPs per
        sample) and its bytes sent and received, as the channel metered them."""
        fed = self.fed
        trained = (fed.budget.samples - samples_before)[: fed.n_clients, [DATA.index(k) for k in CLIENT_DATA]].sum(1)
        flops = [float(t) * f for t, f in zip(trained, self.clock.training_flops)]
        return self.clock.round_entry(ran, dropped, flops, fed.channel.sent.astype(float),
                                      fed.channel.received.astype(float), self.history)

    def run(self, progress: ProgressFn | None = None, checkpoint: str | Path | None = None) -> RunResult:
        """Run the remaining rounds; with ``checkpoint``, save there every ``checkpoint_every`` rounds."""
        status, error = "ok", None
        for rnd in range(len(self.history), self.cfg.rounds + 1):
            try:
                entry = self.step(rnd)
                every = self.cfg.checkpoint_every
                if checkpoint and every and rnd % every == 0 and rnd < self.cfg.rounds:
                    self.try_checkpoint(checkpoint, rnd)  # may test a deferred round: may diverge
                    self.offload()  # the checkpoint read every client
            except Diverged as e:
                status, error = "diverged", diverged_error(e, rnd)
                break
            if progress:
                progress(rnd, self.cfg.rounds, entry)
        return self.result(status, error)

    def resolve_pending(self) -> None:
        """Compute the test figures of the best round if they were deferred (``Evaluator``) and
        put them in the history, so the selected round is complete."""
        with self.fed.budget.inference(EVALUATION):
            metrics = self.evaluator.resolve()
        if metrics is not None:
            self.best = metrics
            self.history[metrics.round].update(_test_entry(metrics, self.groups))

    def save_checkpoint(self, path: str | Path) -> None:
        """Write everything needed to continue after the last completed round (atomically)."""
        self.resolve_pending()  # a checkpoint holds no deferred evaluation
        if self.store is not None:  # whatever holds the models, the checkpoint reads them all
            self.store.restore_all()
        ckpt.write(path, ckpt.simulation_state(self))

    def try_checkpoint(self, path: str | Path, rnd: int) -> None:
        """Save a checkpoint; any failure (disk full, folder gone, a value it cannot store) is a
        one-line warning and the run goes on: a checkpoint only shortens a rerun, a crash here
        would lose the run. Not only OSError: torch's zip writer turns ENOSPC into a RuntimeError."""
        # evaluation, not the write: its errors are the run's own (and a failed resolve drops the
        # pending round, which a warning here would hide)
        self.resolve_pending()
        try:
            self.save_checkpoint(path)
        except Exception as e:  # noqa: BLE001 - see above; Ctrl-C and SystemExit still stop the run
            cause = _os_error_in(e) or e  # torch's "unexpected pos 704 vs 598" hides the ENOSPC it caught
            log.warning("checkpoint after round %d not written (%s: %s); the run goes on without it",
                        rnd, type(cause).__name__, _one_line(cause))

    def load_checkpoint(self, path: str | Path) -> int:
        """Continue from a checkpoint of this exact config; returns the round it was written at.
        Call it on a freshly built simulation, before any ``step``."""
        if self.store is not None:  # loaded into every model, through whatever holds it
            self.store.restore_all()
        ckpt.restore_simulation(self, ckpt.read(path), f"checkpoint {path}")
        self.offload()
        return len(self.history) - 1

    def result(self, status: str = "ok", error: str | None = None) -> RunResult:
        """The run's result. A deferred selected round whose test gives non-finite logits is never
        scored: the run is diverged and its record has no selected figures (``metrics`` null)."""
        fed = self.fed
        try:
            self.resolve_pending()
        except Diverged as e:
            late = diverged_error(e, len(self.history) - 1)
            status, error = "diverged", late if error is None else f"{error}; {late}"
            if self.best is not None and self.best.global_acc is None:
                self.best = None
        sent = np.stack(self.sent) if self.sent else np.zeros((0, fed.n_clients))
        faults = None if fed.faults is None else fed.faults.record(len(self.history) - 1, self.drawn_clients)
        modal = fed.modality_plan
        best, pooled = self.best, self.evaluator.pooled
        peak = peak_memory(fed.device)  # before the store brings every client back for the record
        self.close()
        return RunResult(status, error, best, self.history, fed, self.method, time.perf_counter() - self.t0,
                         peak, sent, self.code, list(self.resumed_from), faults,
                         None if modal is None else modal.record(), self.evaluator.rule,
                         selection_score(best.pooled_val_acc) if pooled and best is not None else None,
                         None if self.clock is None else self.clock.record(self.history))


def build_clock(cfg: RunConfig, fed: Federation):
    """The run's simulated clock (``hfl_bench.clock``; None without ``--devices``), its devices
    assigned by each client's training FLOPs per sample (counted on a copy: ``flops.per_sample``
    leaves the run's models and random streams as they were, so training does not change)."""
    if cfg.devices.strip().lower() in ("", "none"):
        return None
    from hfl_bench import clock, flops

    per = [flops.per_sample(c.arch.name, c.model, fed.data.train_x).training for c in fed.clients]
    first = [p * cfg.local_epochs * c.n_train for p, c in zip(per, fed.clients)]
    return clock.build(cfg.devices, cfg.device_assignment, cfg.deadline, cfg.seed, per, first)


def run(cfg: RunConfig, progress: ProgressFn | None = None, resume: bool = False,
        checkpoint: str | Path | None = None, code: dict[str, Any] | None = None,
        built: Built | None = None) -> RunResult:
    """Run one method on one task under the standard protocol. ``cfg`` must be resolved.
    Checkpoints go to ``checkpoint`` (default ``paths.checkpoint_path(cfg)``); ``resume``
    continues from the one there. ``code`` is the provenance to record (default: git now);
    ``built`` the method instance and the modality and fault plans resolution made (``Built``),
    else made here. Holds ``RUN_LOCK``: a run started meanwhile by another thread of this process
    waits for this one to end."""
    with RUN_LOCK:
        sim = Simulation(cfg, code, built)
        path = Path(checkpoint) if checkpoint is not None else checkpoint_path(cfg)
        # a run killed while writing its checkpoint left the temporary file: this run of the same
        # config (one at a time: the CLI and the matrix hold its claim) removes it, or each kill adds one
        for stale in remove_temporaries(path):
            log.info("removed %s, left by a checkpoint write that was interrupted", stale)
        try:
            if resume and path.exists():
                sim.load_checkpoint(path)
            return sim.run(progress, checkpoint=path)
        finally:
            sim.close()  # a disk store's folder goes with the run, however it ends


def diverged_error(e: Diverged, rnd: int) -> str:
    """A diverged run's ``error``: the round (a ``NonFiniteOutputs``'s own, which may be a deferred
    round's, else ``rnd``) and what diverged."""
    known = getattr(e, "round", None)
    return f"round {rnd if known is None else known}: {e}"


def _os_error_in(e: BaseException) -> OSError | None:
    """The OSError ``e`` was raised while handling, or caused by (torch's zip writer raises a
    RuntimeError of its own while handling the file's ENOSPC), if any."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _one_line(e: BaseException, limit: int = 200) -> str:
    """An exception's reason on one line: an OSError's strerror, else the first line of its message
    (torch's writer errors run over several lines)."""
    text = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:limit]


def _history_entry(m: RoundMetrics, nbytes: int, seconds: float, scalars: dict[str, float],
                   phases: dict[str, float], groups: dict[str, list[int]]) -> dict[str, Any]:
    entry = {
        "round": m.round,
        "mean_val_acc": _round(m.mean_val),
        # the pooled selection rule's per-round score (``Evaluator``), only in a run that applies it
        **({} if m.pooled_val_acc is None else {"pooled_val_acc": _round(selection_score(m.pooled_val_acc))}),
        **_test_entry(m, groups),
        "bytes": int(nbytes),
        "seconds": round(seconds, 4),
        "phases": phases,
    }
    entry.update({k: _round(float(v)) for k, v in scalars.items()})
    return entry


def _client_entry(m: RoundMetrics) -> dict[str, Any]:
    """Each client's global and local test accuracy in a round of the final window (None for a
    client without the figure): the record's per-client final figures (``metrics.final.per_client``,
    which a fault's drop pairs client by client) average them."""
    if m.global_acc is None:
        return {}
    local = m.local_acc if m.local_acc is not None else np.full(len(m.global_acc), np.nan)
    return {"client_global_acc": [_round(float(v)) for v in m.global_acc],
            "client_local_acc": [_round(float(v)) for v in local]}


def _test_entry(m: RoundMetrics, groups: dict[str, list[int]]) -> dict[str, Any]:
    """A round's mean local, global, seen-class and unseen-class test accuracy over all clients and
    over each client group (``Federation.client_groups``: a headline's per-round curve); None where
    the round ran no test (or a group has no clients, or none of them has the figure)."""
    entry = {**_test_means(m, None), **_endpoint_entry(m, None)}
    entry.update({name: {**_test_means(m, clients), **_endpoint_entry(m, clients)} for name, clients in groups.items()})
    return entry


def _endpoint_entry(m: RoundMetrics, clients: list[int] | None) -> dict[str, Any]:
    """A test round's figures of each extra endpoint (``evaluation.endpoint_means``), over all clients
    or a client group, as ``{"endpoints": {name: {global_acc, local_acc}}}`` (schema 1.7: the
    endpoints' curves and final figures); {} for a method without endpoints or a round without test."""
    if m.global_acc is None or not m.endpoint_clients:
        return {}
    return {"endpoints": {name: endpoint_means(per, clients) for name, per in m.endpoint_clients.items()}}


def _test_means(m: RoundMetrics, clients: list[int] | None) -> dict[str, float | None]:
    def pick(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=float) if clients is None else np.asarray(values, dtype=float)[clients]
    local = None if m.local_acc is None else pick(m.local_acc)  # nan: a client without a test half
    glob = None if m.global_acc is None else pick(m.global_acc)
    return {"local_acc": _finite_mean(local),
            # nan: a client a sampled test round did not test (--eval-clients)
            "global_acc": (_round(float(np.mean(glob))) if np.isfinite(glob).all() else _finite_mean(glob))
            if glob is not None and glob.size else None,
            # seen / unseen-class accuracy: over the clients that have such test samples (nan: none)
            "seen_acc": _finite_mean(None if m.seen_acc is None else pick(m.seen_acc)),
            "unseen_acc": _finite_mean(None if m.unseen_acc is None else pick(m.unseen_acc))}


def _finite_mean(values: np.ndarray | None) -> float | None:
    """The mean of the finite ``values`` (nan: a client without the figure); None when there is none."""
    return _round(float(np.nanmean(values))) if values is not None and np.isfinite(values).any() else None


def _round(x: float, nd: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)
