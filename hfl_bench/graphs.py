"""Student steps replayed as CUDA graphs (``--cuda-graphs on``).

Not the default yet: ``auto`` stays on the eager loop until ``benchmarks/gpu_check.sh`` has shown on
a GPU that a run with replayed steps agrees with the eager run within the GPU's own run-to-run
spread and is faster (docs/studies/performance.md). On the CPU the replayed path's bookkeeping is
tested against the eager loop bit for bit (tests/test_graphs.py, through ``EagerRecorder``).

Why: on a GPU a student's SGD step at the protocol's batch size (64) is launch-bound. The
kernels of one ResNet-18 step take a fraction of the time the host needs to launch them one by
one from Python, so ten students trained one after another leave the GPU mostly idle
(docs/studies/performance.md). A CUDA graph records the kernels of one step once and launches
them all with one call.

What is captured: one whole step of one student as ``train_students`` defines it for the loop
(``training.fit`` through ``training.train_on_plan``): zero the gradients, forward, the loss
``training.student_loss`` ((1 - lam) CE + lam KD to whole-epoch targets, or plain CE), backward,
the gradient-norm clip and ``torch.optim.SGD.step``, reading its inputs from static buffers. Each
later batch of that student copies its inputs into the buffers and replays the graph: the same
kernels on the same tensors as the eager step, in the same order (BatchNorm statistics, momentum
buffers and parameters are updated in place, as eagerly).

The plan of a student's steps (``StepPlanner``): its first ``WARMUP`` full-size batches run
eagerly (on a side stream on CUDA, as PyTorch's capture recipe asks: lazy state such as SGD's
momentum buffers and the libraries' handles is made there), the next full-size batch is captured
and replayed, and every later one is replayed. A batch of another size (an epoch's partial last
batch) runs eagerly. A graph is valid while everything it baked in is unchanged (``step_key``:
the optimizer object and its settings, which tensors hold the parameters, buffers and momentum,
the loss settings and the input shapes and layouts); a change starts the student's warm-up again.

Who: a student on CUDA with ``--cuda-graphs on``, trained by the protocol's optimizer (one
group of plain ``torch.optim.SGD``), without stochastic layers (dropout would draw its masks from
the graph's own generator state), not a free-rider (it never steps), with whole-epoch targets or
none (a per-batch target function, the reference path, runs Python per batch). Everyone else, and
every CPU run, trains in the eager loop (``training.train_on_plan``).

All graphs of a run share one memory pool: replays run one at a time on one stream, and a step
reads nothing a previous replay of another graph wrote except the parameters, buffers and
momentum it owns (allocated outside the pool), so one step's activations are held once, not once
per student.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from hfl_bench.federation import engine_side
from hfl_bench.training import (
    EpochPlan,
    Targets,
    count_work,
    finite_mean,
    free_riders,
    student_loss,
    train_on_plan,
)

if TYPE_CHECKING:
    from hfl_bench.federation import ClientView, RoundView

WARMUP = 3  # eager full-size steps of a student before its step is captured (PyTorch's recipe uses 3)

Replay = Callable[[], None]
Step = Callable[[], torch.Tensor]


def sgd_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
             q: torch.Tensor | None, lam: float, temperature: float, clip: float) -> torch.Tensor:
    """One student step, exactly as ``training.fit`` takes it for one trainee; the detached loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = student_loss(model(x), y, q, lam, temperature)
    loss.backward()
    if clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.detach()


# ----------------------------------------------------------------------------- who and when


def plain_sgd(optimizer: torch.optim.Optimizer) -> tuple | None:
    """The settings a captured step bakes in, for one group of plain SGD; None for anything else."""
    if type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1:
        return None
    g = optimizer.param_groups[0]
    if isinstance(g["lr"], torch.Tensor) or g.get("differentiable"):
        return None
    return tuple((k, g.get(k)) for k in ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                                         "foreach", "fused"))


def stochastic(model: nn.Module) -> bool:
    """Whether ``model`` draws random numbers in training (dropout, drop-path)."""
    for m in model.modules():
        p = getattr(m, "p", None) if isinstance(m, nn.modules.dropout._DropoutNd) else getattr(m, "drop_prob", None)
        if p:
            return True
    return False


def why_eager(client: "ClientView", targets: Targets | None, riders: frozenset[int]) -> str | None:
    """Why ``client`` trains in the eager loop rather than by replayed steps; None: it can replay."""
    if client.cid in riders:
        return "free-rider"
    if targets is not None and not isinstance(targets, torch.Tensor):
        return "per-batch targets"
    if plain_sgd(client.optimizer) is None:
        return "not the protocol's SGD"
    if stochastic(client.model):
        return "stochastic layers"
    if not all(p.requires_grad for p in client.model.parameters()):
        return "frozen parameters"
    return None


def _layout(t: torch.Tensor | None) -> tuple:
    return () if t is None else (tuple(t.shape), t.stride(), t.dtype)


def state_key(model: nn.Module, optimizer: torch.optim.Optimizer, lam: float, temperature: float,
              clip: float) -> tuple:
    """What a captured step bakes in of the student and its loss: the optimizer and its settings,
    which tensors hold the parameters, buffers and momentum, the loss settings."""
    params = list(model.parameters())
    momenta = [optimizer.state.get(p, {}).get("momentum_buffer") for p in params]
    return (
        id(optimizer), plain_sgd(optimizer),
        tuple(p.data_ptr() for p in params),
        tuple(b.data_ptr() for b in model.buffers()),
        tuple(None if m is None else m.data_ptr() for m in momenta),
        (float(lam), float(temperature), float(clip)),
    )


def step_key(state: tuple, x: torch.Tensor, y: torch.Tensor, q: torch.Tensor | None) -> tuple:
    """Everything a captured step bakes in (``state_key`` and the inputs' layouts): if any of it
    differs, the graph would be stale."""
    return (state, _layout(x), _layout(y), _layout(q))


@dataclass
class StepPlanner:
    """One student's progress towards a captured step: eager warm-up steps under one key, then
    capture, then replays. Pure bookkeeping (no tensors), so the plan is tested without a GPU."""

    warmup: int = WARMUP
    key: tuple | None = None
    warm: int = 0
    captured: bool = False

    def next(self, key: tuple, full: bool) -> str:
        """What a step does: ``eager`` (a batch of another size), ``warmup``, ``capture`` or ``replay``."""
        if not full:
            return "eager"
        if key != self.key:
            self.key, self.warm, self.captured = key, 0, False
        if self.captured:
            return "replay"
        if self.warm < self.warmup:
            self.warm += 1
            return "warmup"
        self.captured = True
        return "capture"


# ----------------------------------------------------------------------------- recording


class CudaRecorder:
    """Captures steps as CUDA graphs into one memory pool and runs warm-ups on a side stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def capture(self, step: Step) -> tuple[Replay, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()
        return graph.replay, out  # the bound method keeps the graph alive

    @contextlib.contextmanager
    def side(self):
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            yield
        main.wait_stream(self.stream)


class EagerRecorder:
    """A stand-in for ``CudaRecorder`` where CUDA graphs do not exist: ``capture`` records the step
    without running it (as a CUDA capture does not run the kernels) and each replay runs it again,
    writing its loss into the one output tensor. The buffers, the plan and the keys are the
    replayed path's own, so a CPU run through it must equal the eager loop exactly (the tests)."""

    def capture(self, step: Step) -> tuple[Replay, torch.Tensor]:
        out = torch.zeros(())

        def replay() -> None:
            out.copy_(step())

        return replay, out

    def side(self):
        return contextlib.nullcontext()


@dataclass
class _Captured:
    replay: Replay
    loss: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    q: torch.Tensor | None


@dataclass
class _Student:
    model: weakref.ref
    planner: StepPlanner = field(default_factory=StepPlanner)
    graph: _Captured | None = None


class StepGraphs:
    """A run's captured student steps (one per model; the engine keeps one per run)."""

    def __init__(self, recorder: CudaRecorder | EagerRecorder, warmup: int = WARMUP):
        self.recorder, self.warmup = recorder, warmup
        self.students: dict[int, _Student] = {}
        self.counts = {"eager": 0, "warmup": 0, "capture": 0, "replay": 0}

    def _student(self, model: nn.Module) -> _Student:
        s = self.students.get(id(model))
        if s is None or s.model() is not model:  # a new model (or an old id reused)
            s = self.students[id(model)] = _Student(weakref.ref(model), StepPlanner(self.warmup))
        return s

    def train(self, fed: "RoundView", client: "ClientView", plan: EpochPlan, targets: torch.Tensor | None,
              lam: float, temperature: float) -> float:
        """Train ``client`` over ``plan`` as ``training.train_on_plan`` does; the mean loss."""
        model, opt, clip = client.model, client.optimizer, fed.cfg.grad_clip
        model.train()
        student = self._student(model)
        x_all, y_all = plan.view(fed), plan.labels(fed)  # the epoch's views at once: the same rows as per batch
        q_all = targets if targets is not None and lam > 0 else None
        total = torch.zeros((), device=x_all.device)
        state = state_key(model, opt, lam, temperature, clip)
        for s, e in plan.bounds:
            x, y = x_all[s:e], y_all[s:e]
            q = None if q_all is None else q_all[s:e]
            kind = student.planner.next(step_key(state, x, y, q), e - s == fed.cfg.batch_size)
            self.counts[kind] += 1
            if kind in ("eager", "warmup"):
                with self.recorder.side() if kind == "warmup" else contextlib.nullcontext():
                    loss = sgd_step(model, opt, x, y, q, lam, temperature, clip)
                total += loss
                # an eager step may make state (SGD's momentum buffers, on its first step); a replay
                # never does, so the key's walk over the student's tensors stays off the replayed path
                state = state_key(model, opt, lam, temperature, clip)
            else:
                if kind == "capture":
                    student.graph = self._capture(model, opt, x, y, q, lam, temperature, clip)
                g = student.graph
                g.x.copy_(x)
                g.y.copy_(y)
                if q is not None:
                    g.q.copy_(q)
                g.replay()
                total += g.loss
        count_work(fed, plan, [client.cid], len(plan.bounds), len(plan))
        return finite_mean(total, len(plan.bounds), f"client {client.cid}")

    def _capture(self, model, opt, x, y, q, lam, temperature, clip) -> _Captured:
        static_x, static_y = torch.empty_like(x), torch.empty_like(y)
        static_q = None if q is None else torch.empty_like(q)
        replay, loss = self.recorder.capture(
            lambda: sgd_step(model, opt, static_x, static_y, static_q, lam, temperature, clip))
        return _Captured(replay, loss, static_x, static_y, static_q)


def step_graphs(fed: "RoundView") -> StepGraphs | None:
    """The run's captured steps, made on first use; None where steps are not replayed (a CPU run,
    ``--cuda-graphs`` off or auto: ``Federation.use_cuda_graphs``)."""
    side = engine_side(fed)
    if not side.use_cuda_graphs:
        return None
    if side.step_graphs is None:
        side.step_graphs = StepGraphs(CudaRecorder(side.device))
    return side.step_graphs


def train_students(
    fed: "RoundView", cids: list[int], plans: dict[int, EpochPlan], *,
    targets: dict[int, Targets] | None = None, lam: float = 0.0, temperature: float = 1.0,
) -> list[float]:
    """Train clients ``cids`` over their plans with (1 - lam) CE + lam KD(targets[i]), one after
    another; returns their mean training losses in ``cids`` order. ``targets`` may omit a client
    (plain CE). On CUDA a student's steps are replayed as CUDA graphs where it can be (module
    docstring); otherwise, and on a CPU, each trains in the eager loop (``training.train_on_plan``)."""
    targets = targets or {}
    graphs = step_graphs(fed)
    riders = free_riders(fed) if graphs is not None else frozenset()
    losses = []
    for i in cids:
        client, t = fed.clients[i], targets.get(i)
        if graphs is not None and why_eager(client, t, riders) is None:
            losses.append(graphs.train(fed, client, plans[i], t, lam, temperature))
        else:
            losses.append(train_on_plan(fed, client, plans[i], targets=t, lam=lam, temperature=temperature))
    return losses
