"""Evaluation: what each round measures, computed no more often than the record needs.

The policy (``Evaluator``):

- **Validation** (every client's validation half) runs every round, for the clients whose model
  changed: it drives the selection of the reported round (``select_round``: the round of best
  mean validation accuracy over *all* clients, faults or not: what a server can know; it is
  given nothing that says which clients are faulty). Which validation accuracy is decided once
  per run from the partition alone (``selection_rule``): each client's model on its own
  validation half (``config.SELECTION_RULE``), unless every client's half holds at most one
  class (``--partition classes --classes-per-client 1``), where any model that predicts its
  client's one class scores 100 % and round 1 would always be selected; such a run scores each
  client's model on the union of every client's validation half (**pooled validation**,
  ``config.POOLED_SELECTION_RULE``). Pooled validation is the evaluator's own: what a method
  reads (``fed.val_correct``, ``fed.val_accs()``) is each client's own validation either way.
- The **test figures** (global test set, every client's local test half and the method's extra
  endpoints) are computed at the *test rounds*: round 0, every ``eval_every`` rounds, and each of
  the last ``FINAL_ROUNDS`` rounds (the window the record's final figures average over).
- **Sampled evaluation** (``--eval-clients K``): a test round outside the final window tests a
  seeded draw of K clients (``sample``: the run seed and the round, a generator of its own, so no
  other random stream moves) and its history entry reports their means; the final window and the
  last round test every client. Such a round that becomes the best so far is also snapshotted
  (below), so the selected round's figures always cover every client.
- A round that becomes the best so far by mean validation accuracy but is not a test round is
  **snapshotted** (the state of every model and predictor the evaluation would run and of every
  client's model, copied in memory), and its test figures are computed only if it is still the
  best when the run ends or a checkpoint is written. So the selected round always has exact
  figures, computed once, and a run does not pay a full test for every round that is briefly the
  best. Under ``--client-state`` host or disk, an offloaded client's state is not copied but
  *pinned* in the store (``ClientStore.pin``: kept as it was, never brought back), and the
  snapshot's figures are computed ``RESOLVE_CHUNK`` clients at a time, each with its pinned state
  put back for the chunk: a snapshot costs the memory of the clients resident when it is taken
  (the round's active and tested ones), not of every client. The figures are the same.

Whatever the policy:

- a model is evaluated only when it may have changed since its last evaluation (``changed``);
- models and predictors with identical parameters (FML's memes after a broadcast) are evaluated
  once, and so is a predictor shared by every client (the same module in each client's place, as
  FedCC's ensemble: once per distinct set of global test inputs, not once per client);
- a model several clients hold (FedAvg's server model) validates all their rows in one call,
  unless its figures depend on which rows share a batch (``rows_apart``: a static batch norm);
- under ``--client-state`` host or disk, validation runs ``RESOLVE_CHUNK`` clients at a time, and
  the clients it brings back go back after their chunk, so memory stays bounded when every
  client's predictor changes each round (FedProto's);
- each client's held-out rows are gathered once per run, and on a CPU convolutional models run with
  channels-last weights and inputs (measured faster, ``benchmarks/bench_inference.py``; the
  model's own tensors are put back afterwards).

**Non-finite outputs.** A model (or an extra endpoint's predictor) whose logits hold a NaN or an
infinity at any evaluation (validation, pooled validation, the local or global test, an endpoint's
tests) is never scored: argmax would read such a row as class 0 and the model would get a figure
it did not earn. The evaluator raises ``NonFiniteOutputs`` (a ``training.Diverged``) naming the
round, the clients and the evaluation, before any count of that round is kept, and the engine ends
the run as diverged like a training divergence. The check costs no host read of its own: each
model's ``torch.isfinite(logits).all()`` stays on the device and is read in the copy that already
brings that phase's counts to the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from hfl_bench.clientstate import OutsideChunk, client_modules
from hfl_bench.config import FINAL_ROUNDS, HELD_MIN_TRAIN_COUNT, POOLED_SELECTION_RULE, SELECTION_RULE
from hfl_bench.federation import RoundMetrics
from hfl_bench.metering import Phase, PhaseTimer
from hfl_bench.modalities import mask
from hfl_bench.training import Diverged, predict_logits, seeded_choice

if TYPE_CHECKING:
    from hfl_bench.clientstate import Held
    from hfl_bench.federation import Federation

# Clients whose pinned state is put back at once when a snapshot is resolved (``Evaluator.resolve``):
# bounds the memory of that step; identical models are still measured once within a chunk.
RESOLVE_CHUNK = 64


def accuracy(correct: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Percent of ``total`` that is ``correct``, element by element (nan where ``total`` is 0):
    every per-client accuracy the evaluator computes from its counts."""
    total = np.asarray(total)
    return np.where(total > 0, correct / np.maximum(total, 1) * 100, np.nan)


def row_hits(model: nn.Module, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Which rows ``model`` got right: ``argmax == y``, or the predictor's own rule where it has a
    ``hits(logits, y)`` method (an extra endpoint scored by a paper's rule: FedCC's open-set one)."""
    rule = getattr(model, "hits", None)
    return rule(logits, y) if callable(rule) else logits.argmax(dim=-1) == y


def class_correct(logits: torch.Tensor, y: torch.Tensor, num_classes: int,
                  model: nn.Module | None = None) -> torch.Tensor:
    hit = row_hits(model, logits, y)  # no model (or no rule of its own): argmax == y
    return torch.bincount(y[hit], minlength=num_classes).float()


def held_classes(train_counts: np.ndarray, min_count: int = HELD_MIN_TRAIN_COUNT) -> np.ndarray:
    """[N, C] whether each client holds each class: at least ``min_count`` training samples of it."""
    return np.asarray(train_counts) >= min_count


def seen_unseen_acc(correct: np.ndarray, test_counts: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each client's global test accuracy (percent) on the test samples of the classes it holds
    and on those of the classes it lacks, from its per-class correct counts ``correct`` [N, C],
    the test set's class counts ``test_counts`` [C] and ``held`` [N, C]: the same predictions as
    its global accuracy, restricted; nan where a client has no test sample of that kind."""
    def restricted(mask: np.ndarray) -> np.ndarray:
        total = (mask * test_counts).sum(1)
        hits = (mask * correct).sum(1)
        return np.where(total > 0, hits / np.maximum(total, 1) * 100, np.nan)
    held = np.asarray(held, dtype=bool)
    return restricted(held), restricted(~held)


def evaluate_global(fed: Federation, model: nn.Module) -> torch.Tensor:
    """Per-class correct counts on the task's standard test set, in large batches."""
    return class_correct(predict_logits(model, fed.data.test_x), fed.data.test_y, fed.num_classes)


class NonFiniteOutputs(Diverged):
    """Logits with a NaN or an infinity at evaluation: the round is not scored and the run is
    diverged. ``found``: (clients, evaluation) of each model that gave them (a model shared by
    several clients, or identical to theirs, names all of them); ``round``: the round evaluated
    (set by ``Evaluator.__call__`` and ``Evaluator.resolve``)."""

    def __init__(self, found: list[tuple[list[int], str]], round: int | None = None):
        super().__init__(found, round)
        self.found, self.round = found, round

    def __str__(self) -> str:
        by_what: dict[str, set[int]] = {}
        for cids, what in self.found:
            by_what.setdefault(what, set()).update(cids)
        where = "; ".join(f"{_clients(sorted(cids))} at the {what}" for what, cids in by_what.items())
        return f"non-finite logits (NaN or infinite), not scored: {where}"


def _clients(cids: list[int], shown: int = 5) -> str:
    if len(cids) == 1:
        return f"client {cids[0]}"
    names = ", ".join(map(str, cids[:shown]))
    return f"clients {names}" + (f" ... ({len(cids)} in all)" if len(cids) > shown else "")


# ----------------------------------------------------------------------------- speed helpers


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


@contextlib.contextmanager
def channels_last(modules: list[nn.Module], enabled: bool) -> Iterator[None]:
    """Run ``modules`` with channels-last 4-D weights for the block, then put back the very
    tensors they had (same storage, same values): evaluation only, training never sees it."""
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    if enabled:
        seen: set[int] = set()
        for module in modules:
            for t in _tensors(module):
                if t.dim() == 4 and id(t) not in seen and not t.is_contiguous(memory_format=torch.channels_last):
                    seen.add(id(t))
                    saved.append((t, t.data))
                    t.data = t.data.contiguous(memory_format=torch.channels_last)
    try:
        yield
    finally:
        for t, data in saved:
            t.data = data


def rows_apart(model: nn.Module) -> bool:
    """Whether ``model`` in eval mode computes each row of a batch from that row alone: false where
    a batch norm keeps no running statistics (HeteroFL's static batch norm normalizes with the
    batch's own), whose figures then depend on which rows are evaluated together."""
    return not any(isinstance(m, nn.modules.batchnorm._NormBase) and not m.track_running_stats
                   for m in model.modules())


def _fingerprints(modules: list[nn.Module]) -> list[tuple | None]:
    """Cheap keys under which modules with equal parameters collide (None: never shared), read from
    the device in one copy: a host read per tensor is a wait on the GPU per tensor, which costs
    little alone but a scheduling slice each when several runs share a GPU."""
    tensors = [_tensors(m) if any(True for _ in m.parameters()) else None for m in modules]
    # a parameter-free wrapper may compute anything (None): evaluated on its own
    sums = [t.detach().reshape(-1)[:: max(1, t.numel() // 8)].double().sum() for ts in tensors if ts for t in ts]
    values = iter(_read(sums))
    return [None if ts is None else (type(m), tuple(tuple(t.shape) for t in ts), tuple(next(values) for _ in ts))
            for m, ts in zip(modules, tensors)]


def _read(values: list[torch.Tensor]) -> list:
    """0-d tensors (on one device or several) as Python numbers, in one host copy."""
    return torch.stack([v.to(values[0].device) for v in values]).tolist() if values else []


def _equal(a: nn.Module, b: nn.Module) -> bool:
    """Every parameter and buffer of ``a`` and ``b`` equal (as torch.equal), read in one host copy."""
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb) or any(x.shape != y.shape or x.dtype != y.dtype or x.device != y.device
                                 for x, y in zip(ta, tb)):
        return False
    return not ta or bool(torch.stack([(x == y).all() for x, y in zip(ta, tb)]).all())


def distinct(modules: list[nn.Module]) -> tuple[list[nn.Module], list[int]]:
    """The distinct modules of ``modules`` and, for each input, the index of its representative.
    Two modules are the same when they are the same object (a predictor shared by every client,
    with or without parameters of its own), or of the same class with every parameter and buffer
    equal: they compute the same function, so one evaluation serves both."""
    reps: list[nn.Module] = []
    by_key: dict[tuple, list[int]] = {}
    by_id: dict[int, int] = {}
    index = []
    unique = list({id(m): m for m in modules}.values())
    keys = dict(zip(map(id, unique), _fingerprints(unique)))
    for module in modules:
        found = by_id.get(id(module))
        if found is not None:
            index.append(found)
            continue
        key = keys[id(module)]
        if key is not None:
            for r in by_key.get(key, []):
                if _equal(reps[r], module):
                    found = r
                    break
        if found is None:
            found = len(reps)
            reps.append(module)
            if key is not None:
                by_key.setdefault(key, []).append(found)
        by_id[id(module)] = found
        index.append(found)
    return reps, index


# ----------------------------------------------------------------------------- the selection rule


def selection_rule(val_counts: np.ndarray) -> str:
    """The run's selection rule, from the partition alone (``val_counts`` [N, C]: each client's
    per-class validation counts), so it is the same for every method on the partition:
    ``config.POOLED_SELECTION_RULE`` when every client's validation half holds at most one
    class (its own half cannot tell a model that knows that class from one that predicts
    nothing else), else ``config.SELECTION_RULE``."""
    classes = (np.asarray(val_counts) > 0).sum(1)
    return POOLED_SELECTION_RULE if classes.max(initial=0) <= 1 else SELECTION_RULE


def selection_score(val_acc: np.ndarray) -> float:
    """Mean validation accuracy over every client (nan when none has a figure): of each client's
    own validation half, or of the pooled one under ``config.POOLED_SELECTION_RULE``."""
    val = np.asarray(val_acc, dtype=float)
    return float(np.nanmean(val)) if np.isfinite(val).any() else float("nan")


def select_round(val_by_round: Sequence[np.ndarray]) -> int | None:
    """The round a record reports, from each round's per-client validation accuracy (index =
    round; round 0, the initial models, is never selected): the first round of highest
    ``selection_score``; None when no round after 0 has a figure. Its only input is every
    client's validation figures (own or pooled, as the run's ``selection_rule`` says,
    ``RoundMetrics.selection_acc``): it cannot know, and is never told, which clients are
    faulty. ``Evaluator`` and ``Simulation.step`` apply the same rule round by round."""
    best, best_score = None, -np.inf
    for rnd, val in enumerate(val_by_round):
        score = selection_score(val)
        if rnd > 0 and np.isfinite(score) and score > best_score:
            best, best_score = rnd, score
    return best


# ----------------------------------------------------------------------------- the policy


@dataclass
class Snapshot:
    """A best-so-far round whose test figures are not computed yet: the state of every module
    its evaluation would run, with the evaluator's caches as they were after that round."""

    round: int
    val_acc: np.ndarray
    pooled_val_acc: np.ndarray | None
    models: list[nn.Module]
    endpoints: dict[str, list[nn.Module]]
    stale: set[int]
    local_correct: np.ndarray
    global_correct: np.ndarray
    states: list[tuple[nn.Module, dict[str, torch.Tensor]]]
    pins: dict[int, "Held"] = dataclasses.field(default_factory=dict)  # cid -> its pinned offloaded state


def _module_states(modules: list[nn.Module], skip: frozenset[int] = frozenset()
                   ) -> list[tuple[nn.Module, dict[str, torch.Tensor]]]:
    """A copy of each module's state (its parameters and persistent buffers, by ``state_dict``'s
    names), less the submodules whose id is in ``skip`` (pinned clients' models and the modules
    they hold, kept by the store). A tensor that several modules hold (a predictor wrapping a
    client's model, one frozen extractor inside every client's predictor) is copied once."""
    out: list[tuple[nn.Module, dict[str, torch.Tensor]]] = []
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for m in {id(m): m for m in modules}.values():
        if id(m) not in skip:
            out.append((m, {k: _copy_once(v, copies) for k, v in _state_tensors(m, skip).items()}))
    return out


def _state_tensors(module: nn.Module, skip: frozenset[int] = frozenset()) -> dict[str, torch.Tensor]:
    """``module``'s parameters and persistent buffers by their ``state_dict`` names, read without
    calling ``state_dict``: a module a client holds (``Client.hold``) brings its client back when its
    ``state_dict`` is read, and a skipped (pinned) one must stay where it is."""
    out: dict[str, torch.Tensor] = {}
    cut: list[str] = []
    for prefix, sub in module.named_modules():
        if any(prefix.startswith(c) for c in cut):  # inside a skipped module
            continue
        if id(sub) in skip:
            cut.append(prefix + ".")
            continue
        dot = prefix + "." if prefix else ""
        out.update((dot + k, p) for k, p in sub._parameters.items() if p is not None)
        out.update((dot + k, b) for k, b in sub._buffers.items()
                   if b is not None and k not in sub._non_persistent_buffers_set)
    return out


def _copy_once(tensor: torch.Tensor, copies: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A detached copy of ``tensor``, shared with every earlier request for the same tensor object
    (``copies`` keeps the original alive too, so no other tensor can take its id meanwhile)."""
    if id(tensor) not in copies:
        copies[id(tensor)] = (tensor, tensor.detach().clone())
    return copies[id(tensor)][1]


@contextlib.contextmanager
def loaded(states: list[tuple[nn.Module, dict[str, torch.Tensor]]]) -> Iterator[None]:
    """Modules in a saved state for the block; their current state is restored afterwards
    (in place: the same parameter tensors, so optimizers and caches keep their references). A
    state may cover part of its module (``_module_states`` with ``skip``): the rest is left as is,
    and no module's hooks run (a pinned client's modules stay where the store keeps them)."""
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    lives = [_state_tensors(m) for m, _ in states]
    current = [{k: _copy_once(live[k], copies) for k in state} for live, (_, state) in zip(lives, states)]
    try:
        _write(lives, [state for _, state in states])
        yield
    finally:
        _write(lives, current)


@torch.no_grad()
def _write(lives: list[dict[str, torch.Tensor]], values: list[dict[str, torch.Tensor]]) -> None:
    """Copy each saved value into the module's own tensor of that name (as ``load_state_dict`` does)."""
    for live, state in zip(lives, values):
        for k, v in state.items():
            live[k].copy_(v)


class Evaluator:
    """Evaluates the clients' models each round under the policy in the module docstring."""

    def __init__(self, fed: Federation, timer: PhaseTimer, eval_every: int = 1):
        self.fed, self.timer, self.eval_every = fed, timer, eval_every
        n, c = fed.n_clients, fed.num_classes
        self.test_class_counts = torch.bincount(fed.data.test_y, minlength=c).float().cpu().numpy()
        self.local_correct = np.zeros(n)
        self.local_total = np.array([len(cl.test_idx) for cl in fed.clients])
        self.global_correct = np.zeros((n, c))
        self.global_stale: set[int] = set(range(n))  # clients whose test figures are out of date
        self.held = held_classes(fed.partition.class_counts(fed.data.train_y.cpu().numpy(), c, "train"))
        self.best_val = -np.inf  # the best selection score so far (``select_round``, round by round)
        self.rule = selection_rule(fed.val_counts.cpu().numpy())
        self.pooled = self.rule == POOLED_SELECTION_RULE
        # each client's model's hits on the pooled validation set: the pooled rule's counts, kept like
        # ``fed.val_correct`` (updated for the clients whose model changed), never in the method's view
        self.pooled_correct = np.zeros(n)
        self.pending: Snapshot | None = None
        # each model's finite-logits flag (on the device), its clients and which evaluation, since
        # the last host read (``_checked``): read with that phase's counts, never on its own
        self._checks: list[tuple[torch.Tensor, list[int], str]] = []
        self._endpoint: str | None = None  # the extra endpoint being evaluated, for the checks' names
        self.fast_layout = fed.device.type == "cpu" and fed.data.test_x.dim() == 4
        # Each client's validation and local test rows, laid out for evaluation: prepared once per
        # run while every client stays resident; under --client-state (a large federation) gathered
        # when a client is measured, so their memory follows the clients measured, not N (at
        # N = 1,000 of 50 images, the copies were 120 MiB). The same values and layout either way.
        self._prepared = fed.client_store is None
        # every client's validation rows in one index (a model shared by many clients validates them
        # in one call, ``shared_val_correct``), each client's rows a slice of it
        sizes = [len(cl.val_idx) for cl in fed.clients]
        self._val_idx = torch.cat([cl.val_idx for cl in fed.clients])
        self._val_y = fed.data.train_y[self._val_idx]
        self._val_owner = torch.repeat_interleave(torch.arange(n, device=fed.device),
                                                  torch.tensor(sizes, device=fed.device))
        self._val_ends = [(e - k, e) for e, k in zip(np.cumsum(sizes).tolist(), sizes)]
        if self._prepared:
            self._val_x = self._rows(self._val_idx)[0]
            self._val = [(self._val_x[a:b], self._val_y[a:b]) for a, b in self._val_ends]
            self._test = [self._rows(cl.test_idx) for cl in fed.clients]
        # A client is tested through the modalities it observes: the global test set with the
        # others NaN (hfl_bench.modalities), one copy per distinct set of observed modalities.
        full = tuple(m.name for m in fed.info.modalities)
        self._input_key = [cl.modalities if cl.modalities != full else () for cl in fed.clients]
        self._global_inputs = self._inputs_by_key(fed.data.test_x)
        if self.pooled:  # every client's validation rows, each client through its modalities
            rows = torch.cat([cl.val_idx for cl in fed.clients])
            self._pooled_inputs = self._inputs_by_key(fed.data.train_x[rows])
            self._pooled_y = fed.data.train_y[rows]

    def _inputs_by_key(self, x: torch.Tensor) -> dict[tuple[str, ...], torch.Tensor]:
        """``x`` as each set of observed modalities sees it (``_input_key``), laid out for evaluation."""
        fed = self.fed
        return {key: self._layout(x if not key else mask(x, fed.info, key)) for key in dict.fromkeys(self._input_key)}

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.fast_layout else x

    def _rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training-set rows ``idx`` laid out for evaluation, and their labels."""
        return self._layout(self.fed.data.train_x[idx]), self.fed.data.train_y[idx]

    def _val_rows(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._prepared:
            return self._val[cid]
        a, b = self._val_ends[cid]
        return self._rows(self._val_idx[a:b])

    def _test_rows(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._prepared:
            return self._test[cid]
        return self._rows(self.fed.clients[cid].test_idx)

    def is_test_round(self, rnd: int, last: bool = False) -> bool:
        return rnd % self.eval_every == 0 or last or rnd > self.fed.cfg.rounds - FINAL_ROUNDS

    def sample(self, rnd: int, last: bool = False) -> list[int] | None:
        """The clients test round ``rnd`` tests under ``--eval-clients K`` (a seeded draw of K, sorted),
        or None for every client: without the option, in the final window and at the last round."""
        cfg, n = self.fed.cfg, self.fed.n_clients
        k = getattr(cfg, "eval_clients", None)
        if k is None or k >= n or last or rnd > cfg.rounds - FINAL_ROUNDS:
            return None
        return seeded_choice(cfg.seed, n, k, "eval", rnd)

    def _resident(self, modules: list[nn.Module]) -> None:
        """Bring back offloaded clients whose models ``modules`` are or hold (``--client-state``)."""
        store = self.fed.client_store
        if store is not None:
            store.ensure(modules)

    @staticmethod
    def selection_score(val_acc: np.ndarray) -> float:
        """``selection_score``: every client's mean validation accuracy (no fault plan is read)."""
        return selection_score(val_acc)

    # -- the per-model measurements

    def _logits(self, model: nn.Module, x: torch.Tensor, cid: int | list[int], what: str) -> torch.Tensor:
        """``model``'s logits on ``x`` (client ``cid``'s rows, or several clients'), with its finite
        flag kept for the next ``_checked`` read."""
        logits = predict_logits(model, x)
        if self._endpoint is not None:
            what = f"{what} of endpoint {self._endpoint}"
        self._checks.append((torch.isfinite(logits).all(), cid if isinstance(cid, list) else [cid], what))
        return logits

    def _checked(self, values: torch.Tensor) -> np.ndarray:
        """``values`` (1-D, on the device) on the host, with every finite flag kept since the last
        read in the same copy; raises ``NonFiniteOutputs`` (round unset) if one is false."""
        checks, self._checks = self._checks, []
        if not checks:
            return values.cpu().numpy()
        flags = torch.stack([f.to(values.device) for f, _, _ in checks]).to(values.dtype)
        read = torch.cat([values.reshape(-1), flags]).cpu().numpy()
        n = values.numel()
        bad = [(cids, what) for (_, cids, what), ok in zip(checks, read[n:]) if not ok]
        if bad:
            raise NonFiniteOutputs(bad)
        return read[:n]

    def val_correct(self, model: nn.Module, cid: int) -> torch.Tensor:
        x, y = self._val_rows(cid)
        if len(y) == 0:
            return torch.zeros(self.fed.num_classes, device=self.fed.device)
        return class_correct(self._logits(model, x, cid, "validation"), y, self.fed.num_classes, model)

    def shared_val_correct(self, model: nn.Module, cids: list[int]) -> torch.Tensor:
        """[len(cids), C] ``val_correct`` of one ``model`` held by every client in ``cids``, in one
        call on their rows together (FedAvg's server model is every client's: one call, not N)."""
        fed, c = self.fed, self.fed.num_classes
        position = torch.full((fed.n_clients,), -1, dtype=torch.long, device=fed.device)
        position[cids] = torch.arange(len(cids), device=fed.device)
        where = position[self._val_owner]
        if len(cids) == fed.n_clients:  # every client's rows: the whole tensor, no copy if prepared
            x = self._val_x if self._prepared else self._rows(self._val_idx)[0]
            y = self._val_y
        else:
            rows = (where >= 0).nonzero().squeeze(1)
            x = self._val_x[rows] if self._prepared else self._rows(self._val_idx[rows])[0]
            y, where = self._val_y[rows], where[rows]
        if not len(y):
            return torch.zeros(len(cids), c, device=fed.device)
        hit = row_hits(model, self._logits(model, x, list(cids), "validation"), y)
        return torch.bincount((where * c + y)[hit], minlength=len(cids) * c).float().view(len(cids), c)

    def _validate(self, models: list[nn.Module], changed: list[int]) -> np.ndarray | None:
        """Validation of the ``changed`` clients' models into ``fed.val_correct``: one call per
        model however many clients hold it (where its rows are computed apart, ``rows_apart``);
        under ``--client-state`` ``RESOLVE_CHUNK`` clients at a time, those brought back for a
        chunk offloaded again after it (memory bounded as the federation grows). Returns each
        client's pooled-validation hits under the pooled rule."""
        fed, store = self.fed, self.fed.client_store
        size = max(len(changed), 1) if store is None else RESOLVE_CHUNK
        hits: list[np.ndarray] = []
        for start in range(0, len(changed), size):
            chunk = changed[start:start + size]
            # lent: the clients it brings back are offloaded again after channels_last has put
            # their tensors back (the inner block)
            with store.lent() if store is not None else contextlib.nullcontext():
                self._resident([models[cid] for cid in chunk])
                with channels_last([models[cid] for cid in chunk], self.fast_layout):
                    by_model: dict[int, list[int]] = {}
                    for cid in chunk:
                        by_model.setdefault(id(models[cid]), []).append(cid)
                    for cids in by_model.values():
                        if len(cids) == 1 or not rows_apart(models[cids[0]]):
                            for cid in cids:  # each client's rows alone: its own batch, as ever
                                fed.val_correct[cid] = self.val_correct(models[cid], cid)
                        else:
                            fed.val_correct[cids] = self.shared_val_correct(models[cids[0]], cids)
                    if self.pooled:
                        hits += self.per_distinct(self.pooled_val_hits, [models[c] for c in chunk], chunk)
        return np.array(hits) if self.pooled else None

    def local_test_correct(self, model: nn.Module, cid: int) -> int:
        return int(self.local_test_hits(model, cid))

    def local_test_hits(self, model: nn.Module, cid: int) -> torch.Tensor:
        """Correct predictions of ``model`` on client ``cid``'s local test half, on the device."""
        x, y = self._test_rows(cid)
        if not len(y):
            return torch.zeros((), dtype=torch.long, device=self.fed.device)
        return row_hits(model, self._logits(model, x, cid, "local test"), y).sum()

    def global_class_correct(self, model: nn.Module, cid: int) -> torch.Tensor:
        """Per-class correct counts of ``model`` on the global test set as client ``cid`` sees it
        (on the device: callers read many at once)."""
        logits = self._logits(model, self._global_inputs[self._input_key[cid]], cid, "global test")
        return class_correct(logits, self.fed.data.test_y, self.fed.num_classes, model)

    def pooled_val_hits(self, model: nn.Module, cid: int) -> torch.Tensor:
        """Correct predictions of ``model`` on the pooled validation set as client ``cid`` sees it
        (on the device)."""
        logits = self._logits(model, self._pooled_inputs[self._input_key[cid]], cid, "pooled validation")
        return row_hits(model, logits, self._pooled_y).sum()

    def global_counts(self, models: list[nn.Module], cids: list[int]) -> list[np.ndarray]:
        """``global_class_correct`` of ``models[i]`` for client ``cids[i]`` (``per_distinct``)."""
        return self.per_distinct(self.global_class_correct, models, cids)

    def per_distinct(self, measure: Callable[[nn.Module, int], torch.Tensor], models: list[nn.Module],
                     cids: list[int]) -> list[np.ndarray]:
        """``measure`` of ``models[i]`` for client ``cids[i]``, computed once per distinct model among
        the clients that see the same inputs, read from the device in one copy."""
        out: list = [None] * len(cids)
        by_input: dict[tuple[str, ...], list[int]] = {}
        for i, cid in enumerate(cids):
            by_input.setdefault(self._input_key[cid], []).append(i)
        for positions in by_input.values():
            reps, index = distinct([models[i] for i in positions])
            per_rep = []
            for r, m in enumerate(reps):
                start = len(self._checks)
                per_rep.append(measure(m, cids[positions[0]]))
                # the flag of a model evaluated once for several clients names all of them
                shared = [cids[i] for i, k in zip(positions, index) if k == r]
                self._checks[start:] = [(f, shared, what) for f, _, what in self._checks[start:]]
            for i, r in zip(positions, index):
                out[i] = per_rep[r]
        return list(torch.stack(out).cpu().numpy()) if out else []

    # -- one round

    def __call__(self, rnd: int, models: list[nn.Module], changed: list[int], last: bool = False,
                 endpoints: dict[str, list[nn.Module]] | None = None) -> RoundMetrics:
        self._checks = []  # flags of measurements made outside a round (a benchmark's) are not this round's
        try:
            return self._round(rnd, models, changed, last, endpoints or {})
        except NonFiniteOutputs as e:
            e.round = rnd
            raise
        finally:
            self._checks, self._endpoint = [], None

    def _round(self, rnd: int, models: list[nn.Module], changed: list[int], last: bool,
               endpoints: dict[str, list[nn.Module]]) -> RoundMetrics:
        fed = self.fed
        with self.timer(Phase.EVALUATION):
            hits = self._validate(models, changed)
            val = self._val_acc()  # raises NonFiniteOutputs before any figure of the round is kept
            if self.pooled:
                self.pooled_correct[changed] = hits
            self.global_stale.update(changed)
            pooled = accuracy(self.pooled_correct, len(self._pooled_y)) if self.pooled else None
            score = self.selection_score(val if pooled is None else pooled)
            score = score if np.isfinite(score) else -np.inf
            improves = rnd > 0 and score > self.best_val  # round 0 (initial models) is never selected
            if improves:
                self.best_val = score
            sample = self.sample(rnd, last) if self.is_test_round(rnd, last) else None
            if self.is_test_round(rnd, last) and sample is None:
                self._test_figures(models, self.global_stale, self.local_correct, self.global_correct)
                self.global_stale.clear()
                metrics = self._metrics(rnd, val, pooled, models, endpoints, self.local_correct, self.global_correct)
                if improves:  # this round's figures are exact: an older snapshot is no longer the best
                    self.release()  # (only now: a round not scored leaves the snapshot to the record)
                return metrics
            metrics = RoundMetrics(rnd, val, None, None, None, {}, pooled_val_acc=pooled)
            if sample is not None:  # the sample's figures for the curve; the selected round gets every client's
                due = self.global_stale & set(sample)
                self._test_figures(models, due, self.local_correct, self.global_correct)
                self.global_stale -= due
                metrics = self._metrics(rnd, val, pooled, models, endpoints, self.local_correct, self.global_correct,
                                        sample)
            if improves:
                # The clients' own models too: a predictor may hold them outside its own state (FedCC's
                # wrappers keep theirs in a plain list), and its snapshot would then keep nothing.
                store = fed.client_store
                with store.lazy() if store is not None else contextlib.nullcontext():
                    kept = [*models, *(p for ps in endpoints.values() for p in ps), *(c.model for c in fed.clients)]
                self.release()
                # an offloaded client's state is pinned in the store, not copied (the module docstring)
                pins = {} if store is None else {c.cid: h for c in fed.clients if (h := store.pin(c.cid)) is not None}
                skip = frozenset(id(m) for cid in pins for m in client_modules(fed.clients[cid]))
                self.pending = Snapshot(rnd, val, pooled, list(models), dict(endpoints), set(self.global_stale),
                                        self.local_correct.copy(), self.global_correct.copy(),
                                        _module_states(kept, skip), pins)
        return metrics

    def release(self) -> None:
        """Drop the pending snapshot (a newer best round, or its figures computed): its pins too."""
        snap, self.pending = self.pending, None
        if snap is not None and snap.pins:
            self.fed.client_store.release(list(snap.pins.values()))

    def resolve(self) -> RoundMetrics | None:
        """The pending best round's full figures, computed from its snapshot (None if none)."""
        snap = self.pending
        if snap is None:
            return None
        self._checks = []
        try:
            # the clients whose state was copied back in memory (a pinned one stays where it is till its chunk)
            owners = {id(m): m for c in self.fed.clients if c.cid not in snap.pins for m in client_modules(c)}
            self._resident([sub for m, _ in snap.states for sub in m.modules() if id(sub) in owners])
            with self.timer(Phase.EVALUATION), loaded(snap.states):
                if not snap.pins:
                    self._test_figures(snap.models, snap.stale, snap.local_correct, snap.global_correct)
                    return self._metrics(snap.round, snap.val_acc, snap.pooled_val_acc, snap.models, snap.endpoints,
                                         snap.local_correct, snap.global_correct)
                return self._resolve_pinned(snap)
        except NonFiniteOutputs as e:
            e.round = snap.round
            raise
        finally:
            self._checks, self._endpoint = [], None
            self.release()

    def _resolve_pinned(self, snap: Snapshot) -> RoundMetrics:
        """A snapshot's figures, ``RESOLVE_CHUNK`` clients at a time, each chunk's pinned clients with
        their pinned state (``ClientStore.pinned``), offloaded again after it. A predictor that runs
        other clients' models too (``--ensemble``'s) brings back a client outside the chunk
        (``OutsideChunk``): then every client is measured in one chunk."""
        wanted = sorted(set(range(self.fed.n_clients)) if snap.endpoints else snap.stale)  # endpoints: every client
        try:
            return self._resolve_chunks(snap, wanted, RESOLVE_CHUNK)
        except OutsideChunk:
            return self._resolve_chunks(snap, wanted, max(len(wanted), 1))

    def _resolve_chunks(self, snap: Snapshot, wanted: list[int], size: int) -> RoundMetrics:
        store = self.fed.client_store
        figures = {name: {"global_acc": np.full(len(ps), np.nan), "local_acc": np.full(len(ps), np.nan)}
                   for name, ps in snap.endpoints.items()}
        for start in range(0, len(wanted), size):
            chunk = wanted[start:start + size]
            self._checks = []
            with store.pinned({self.fed.clients[c]: snap.pins[c] for c in chunk if c in snap.pins},
                              frozenset(snap.pins) - set(chunk)):
                self._test_figures(snap.models, snap.stale & set(chunk), snap.local_correct, snap.global_correct)
                for name, predictors in snap.endpoints.items():
                    mine = [c for c in chunk if c < len(predictors)]
                    for key, values in self.endpoint(predictors, name, mine).items():
                        figures[name][key][mine] = values[mine]
        return self._metrics(snap.round, snap.val_acc, snap.pooled_val_acc, snap.models, snap.endpoints,
                             snap.local_correct, snap.global_correct, endpoint_figures=figures)

    def _val_acc(self) -> np.ndarray:
        """Every client's validation accuracy (the finite flags kept since the last read come with it)."""
        fed = self.fed
        return accuracy(self._checked(fed.val_correct.sum(1)), fed.val_counts.sum(1).cpu().numpy())

    def _test_figures(self, models: list[nn.Module], stale: set[int], local_correct: np.ndarray,
                      global_correct: np.ndarray) -> None:
        """Fill the local and global correct counts of the ``stale`` clients (in place)."""
        cids = sorted(stale)
        self._resident([models[c] for c in cids])
        with channels_last([models[c] for c in cids], self.fast_layout):
            hits = [self.local_test_hits(models[cid], cid) for cid in cids]
            counts = self.global_counts([models[c] for c in cids], cids)
        for cid, hit in zip(cids, self._checked(self._stacked(hits)).tolist()):
            local_correct[cid] = hit
        for cid, count in zip(cids, counts):
            global_correct[cid] = count

    def _metrics(self, rnd: int, val: np.ndarray, pooled: np.ndarray | None, models: list[nn.Module],
                 endpoints: dict[str, list[nn.Module]], local_correct: np.ndarray,
                 global_correct: np.ndarray, sample: list[int] | None = None,
                 endpoint_figures: dict[str, dict[str, np.ndarray]] | None = None) -> RoundMetrics:
        """A test round's figures, every client's, or with ``sample`` the sampled clients' (nan for
        the others, which the means skip); ``endpoint_figures``: the endpoints' figures, measured."""
        local = accuracy(local_correct, self.local_total)
        global_class = global_correct / np.maximum(self.test_class_counts, 1) * 100
        global_acc = global_correct.sum(1) / max(self.test_class_counts.sum(), 1) * 100
        per_client = endpoint_figures if endpoint_figures is not None else {
            name: self.endpoint(predictors, name, sample) for name, predictors in endpoints.items()}
        extra = {name: endpoint_means(figures) for name, figures in per_client.items()}
        seen, unseen = seen_unseen_acc(global_correct, self.test_class_counts, self.held)
        if sample is not None:
            out = np.setdiff1d(np.arange(self.fed.n_clients), sample)
            local, global_acc, global_class, seen, unseen = (
                _unmeasured(a, out) for a in (local, global_acc, global_class, seen, unseen))
        return RoundMetrics(rnd, val, local, global_acc, global_class, extra, per_client, seen, unseen, pooled)

    def endpoint(self, predictors: list[nn.Module], name: str | None = None,
                 sample: list[int] | None = None) -> dict[str, np.ndarray]:
        """Each client's global and local test accuracy (percent; nan without a local test half)
        with an extra endpoint's predictor (``name``: the endpoint's, for a ``NonFiniteOutputs``);
        with ``sample``, the sampled clients' only (nan for the others)."""
        total = float(max(self.test_class_counts.sum(), 1))
        cids = list(range(len(predictors))) if sample is None else list(sample)
        used = [predictors[cid] for cid in cids]
        self._endpoint = name if name is not None else "(unnamed)"
        self._resident(used)
        try:
            with channels_last(used, self.fast_layout):
                counts = self.global_counts(used, cids)
                hits = [self.local_test_hits(p, cid) for cid, p in zip(cids, used)]
        finally:
            self._endpoint = None
        hits = self._checked(self._stacked(hits)).tolist()
        g = np.full(len(predictors), np.nan)
        local = np.full(len(predictors), np.nan)
        for cid, count, hit in zip(cids, counts, hits):
            g[cid] = float(count.sum()) / total * 100
            local[cid] = hit / self.local_total[cid] * 100 if self.local_total[cid] else np.nan
        return {"global_acc": g, "local_acc": local}

    def _stacked(self, values: list[torch.Tensor]) -> torch.Tensor:
        """0-d counts (on one device or several) as one 1-D tensor, on the first one's device."""
        if not values:
            return torch.zeros(0, dtype=torch.long, device=self.fed.device)
        return torch.stack([v.to(values[0].device) for v in values])


def _unmeasured(values: np.ndarray, clients: np.ndarray) -> np.ndarray:
    """``values`` (one row per client) with the rows of ``clients`` nan: not measured this round."""
    out = np.array(values, dtype=float, copy=True)
    out[clients] = np.nan
    return out


def endpoint_means(figures: dict[str, np.ndarray], clients: Sequence[int] | None = None) -> dict[str, float | None]:
    """An extra endpoint's figures over ``clients`` (all when None): the mean global accuracy (every
    client has the global test) and the mean local accuracy over the clients with a local test half;
    None where no client of them has a figure. The one rule for a round's history entry, the
    selected round's figures and a client group's (records: ``metrics.extra_endpoints``,
    ``metrics.<group>.endpoints``, ``history[i].endpoints``)."""
    def pick(key: str) -> np.ndarray | None:
        values = figures.get(key)
        if values is None:
            return None
        v = np.asarray(values, dtype=float)
        return v if clients is None else v[np.asarray(clients, dtype=int)]

    def mean(v: np.ndarray | None) -> float | None:
        return round(float(np.nanmean(v)), 4) if v is not None and np.isfinite(v).any() else None

    return {"global_acc": mean(pick("global_acc")), "local_acc": mean(pick("local_acc"))}
