"""Client state that scales (``--client-state``): where a client's model, optimizer state and
gradients wait between the rounds it is drawn for.

- ``resident`` (the default): every client's state stays on the run's device for the whole run.
- ``host``: after each round (and after its evaluation) every client's tensors are copied to host
  memory and the device's copies freed; a GPU run's device memory then holds the clients a round
  uses. On a CPU run this is a copy in the same memory (it saves nothing; it runs the same path).
- ``disk``: the same, into one file per client under a temporary folder of ``--client-state-dir``
  (default ``<out>/.client-state``), removed when the run ends. Each file is written whole to a
  temporary name and renamed (atomic), and read back only if its size and SHA-256 are the ones
  written (kept in memory): a file changed or cut meanwhile stops the run in one line.

A client's state comes back on first use: reading ``client.model`` or ``client.optimizer`` (a
method's hooks, the checkpoint, the record) or calling the model (a forward pre-hook: a predictor
that holds the model itself), and the evaluator brings back the models it is about to measure
(``ensure``). The tensors come back as they left (same values, dtype, strides and device, the same
``Parameter`` objects, so optimizers keep their references): results are bit-identical to
``resident`` (``tests/test_scale.py``). While the engine lists the models to evaluate
(``lazy``), reading ``client.model`` does not bring a client back, so an evaluation of K sampled
clients restores K.

What is offloaded is what the client object holds: its model's parameters, gradients and buffers
and its optimizer's state, and the same of the second models a method keeps with the client
(``Client.hold``: FML's memes, the shared-predictor family's Q), which also come back when their
``state_dict`` is read or loaded. State a method keeps outside the client object (FedProto's global
prototypes, a method's per-client tables) stays where the method keeps it: correct, only not
offloaded. Clients whose models share a tensor (a shared head or predictor) cannot be
offloaded one by one: ``attach`` refuses them in one line (use ``resident``). An offloaded
tensor is left empty (zero elements) on its device, so code that reads one without going through
its client (a list of models a method kept) fails on the shape rather than compute on nothing;
checkpoints are written and read with every client back (``restore_all``). Under host or disk
state the evaluator keeps no per-client copy of the clients' validation and local test rows either:
it gathers a client's rows when it measures the client (``Evaluator._val_rows``, ``_test_rows``).

**Pins** (the evaluator's snapshot of a best round, ``hfl_bench.evaluation``): the state an
offloaded client holds can be *pinned* instead of copied (``pin``). A pinned state is never
overwritten or removed: the client's next offload writes a new file (disk) and its next restore
reads a copy (host), so the pinned state stays what it was when pinned until ``release``, and
``pinned`` puts it back in the client's model for a block (the resolution of the snapshot, a few
clients at a time). So a snapshot costs the memory of the clients that were resident when it was
taken, not of every client. The snapshot reads and writes module tensors directly, not through
``state_dict``, so a pinned client's held modules stay offloaded too (their hooks would bring it back).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import torch
from torch import nn

from hfl_bench.config import ConfigError
from hfl_bench.regularfile import read_regular

if TYPE_CHECKING:
    from hfl_bench.federation import Client, Federation


class ClientStateError(RuntimeError):
    """A client's offloaded state that cannot be trusted (a file changed, cut or gone)."""


class OutsideChunk(RuntimeError):
    """A client kept out of a ``ClientStore.pinned`` block was brought back in it (a predictor that
    runs other clients' models): the block's measurement cannot be taken a chunk at a time."""


def client_modules(client: "Client") -> list[nn.Module]:
    """The client's model, then the second models a method keeps with it (``Client.hold``)."""
    return [client._model, *(m for m, _ in client.extras)]


def _slots(client: "Client") -> list[tuple[torch.Tensor, str]]:
    """Every tensor a client's models hold, in a fixed order: (owner, what) where ``what`` names
    which of the owner's tensors is meant (its data, or its gradient)."""
    out: list[tuple[torch.Tensor, str]] = []
    for model in client_modules(client):
        for p in model.parameters():
            out.append((p, "data"))
            out.append((p, "grad"))
        out.extend((b, "data") for b in model.buffers())
    return out


def _optimizer_tensors(client: "Client") -> list[tuple[dict, str]]:
    """(state dict, key) of every tensor of the client's optimizers' state, in parameter order."""
    out = []
    for opt in [client._optimizer, *(o for _, o in client.extras if o is not None)]:
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p)
                if state:
                    out.extend((state, k) for k in sorted(state) if isinstance(state[k], torch.Tensor))
    return out


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; absent elsewhere (musl, macOS)
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).
    The host copies of offloaded clients' tensors are freed in many small blocks that the allocator
    would otherwise keep: measured at N = 1,000 clients, the resident memory after the build fell
    from 2.7 to 1.6 GiB (docs/studies/performance.md)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@dataclasses.dataclass(eq=False)
class Held:
    """One offloaded state of a client: host tensors (host) or ``(path, size, sha256)`` (disk), the
    devices its tensors came from, the model it belongs to, how many of its tensors are the model's
    (the optimizer's follow), and how many snapshots pin it."""

    stored: object
    devices: list
    model_id: int
    n_model: int
    pins: int = 0


class ClientStore:
    """Holds the state of offloaded clients (``mode`` host or disk) and brings it back on use."""

    def __init__(self, mode: str, folder: Path | None = None):
        if mode not in ("host", "disk"):
            raise ValueError(mode)
        self.mode = mode
        self.folder = folder
        self._lazy = 0
        self._held: dict[int, Held] = {}  # cid -> its offloaded state
        self._pinned: dict[int, Held] = {}  # id -> a pinned state (held now or not)
        self._kept_out: frozenset[int] = frozenset()  # clients a ``pinned`` block must not bring back
        self._lent: list["Client"] | None = None  # clients a ``lent`` block brought back
        self._clients: list["Client"] = []
        self._hooks: dict[int, tuple[tuple[int, ...], list]] = {}  # cid -> (ids of the models hooked, their handles)

    # -- setup and teardown

    def attach(self, fed: "Federation", method_name: str) -> None:
        """Take charge of ``fed``'s clients (after the method's setup, which may replace models).
        Refuses clients that share a tensor: offloading one would take it from the others."""
        seen: dict[int, int] = {}
        for c in fed.clients:
            tensors = [t for m in client_modules(c) for t in (*m.parameters(), *m.buffers())]
            for t in {id(t): t for t in tensors}.values():
                other = seen.setdefault(id(t), c.cid)
                if other != c.cid:
                    raise ConfigError(f"--client-state {self.mode}: {method_name}'s clients {other} and {c.cid} share "
                                      f"model tensors, which cannot be offloaded one client at a time: use "
                                      f"--client-state resident")
        self._clients = list(fed.clients)
        fed.client_store = self

    def _forward_hook(self, client: "Client"):
        def hook(module: nn.Module, *args):
            if client.store is not None:
                self.restore(client)
        return hook

    def _hook(self, client: "Client", module: nn.Module) -> list:
        """Calling ``module`` brings the client back; for a second model (``Client.hold``) also
        reading or loading its ``state_dict`` (a method's upload, or the broadcast it receives)."""
        hook = self._forward_hook(client)
        handles = [module.register_forward_pre_hook(hook)]
        if module is not client._model:
            handles += [module.register_state_dict_pre_hook(hook), module.register_load_state_dict_pre_hook(hook)]
        return handles

    def restore_all(self) -> None:
        """Every client back (a checkpoint is written or read through whatever holds the models)."""
        for c in self._clients:
            if c.store is not None:
                self.restore(c)

    def close(self) -> None:
        """Bring every client back (the record reads them all) and remove the disk folder."""
        self.restore_all()
        for _, handles in self._hooks.values():
            for handle in handles:
                handle.remove()
        self._hooks = {}
        if self.mode == "disk" and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- when state comes back

    def on_access(self, client: "Client") -> None:
        """``client.model`` or ``client.optimizer`` read: bring the client back unless listing (``lazy``)."""
        if not self._lazy:
            self.restore(client)

    @contextlib.contextmanager
    def lazy(self) -> Iterator[None]:
        """Reading ``client.model`` in the block does not bring a client back (the engine listing
        the models to evaluate); using one does (its forward hook, ``ensure``)."""
        self._lazy += 1
        try:
            yield
        finally:
            self._lazy -= 1

    def ensure(self, modules: list[nn.Module]) -> None:
        """Bring back every offloaded client whose model is one of ``modules`` or inside one (a
        predictor wrapping it): before anything reads their parameters."""
        # the models the clients hold now (a method may have replaced one since the last round)
        owner = {id(m): c for c in self._clients if c.store is not None for m in client_modules(c)}
        for module in {id(m): m for m in modules}.values():
            for sub in module.modules():
                client = owner.get(id(sub))
                if client is not None and client.store is not None:
                    self.restore(client)

    @contextlib.contextmanager
    def lent(self) -> Iterator[None]:
        """Clients brought back in the block are offloaded again after it (a chunk of a
        measurement): the cost is the clients it brought back, not the federation's size."""
        self._lent = []
        try:
            yield
        finally:
            lent, self._lent = self._lent, None
            for client in lent:
                if client.store is None:
                    self.offload(client)

    # -- moving state

    def offload_all(self) -> None:
        """Every client's state off the device (after a round and its evaluation)."""
        moved = [self.offload(c) for c in self._clients if c.store is None]
        if moved:
            trim_heap()


    def offload(self, client: "Client") -> None:
        if client.store is not None:
            return
        hooked = self._hooks.get(client.cid)
        ids = tuple(id(m) for m in client_modules(client))
        if hooked is None or hooked[0] != ids:  # calling the model brings it back
            for handle in hooked[1] if hooked is not None else ():
                handle.remove()
            self._hooks[client.cid] = (ids, [h for m in client_modules(client) for h in self._hook(client, m)])
        slots, opt_slots = _slots(client), _optimizer_tensors(client)
        values = [getattr(t, what) for t, what in slots] + [state[k] for state, k in opt_slots]
        host = [None if v is None else v.detach().to("cpu", copy=True) for v in values]
        devices = [None if v is None else v.device for v in values]
        stored = self._write(client.cid, host) if self.mode == "disk" else host
        self._vacate(client)
        self._held[client.cid] = Held(stored, devices, id(client._model), len(slots))

    def _vacate(self, client: "Client") -> None:
        """Free the device's copies of the client's tensors, keeping the tensor objects."""
        for t, what in _slots(client):
            if what == "grad":
                t.grad = None
            else:
                t.data = t.data.new_empty(0)
        for state, k in _optimizer_tensors(client):
            state[k] = state[k].new_empty(0)
        client.store = self

    def restore(self, client: "Client") -> None:
        if client.cid in self._kept_out:
            raise OutsideChunk(client.cid)
        held = self._held.pop(client.cid)
        client.store = None
        if self._lent is not None:
            self._lent.append(client)
        self._install(client, held)
        if self.mode == "disk" and not held.pins:  # back in memory and pinned by no snapshot
            with contextlib.suppress(OSError):
                os.unlink(held.stored[0])

    def _install(self, client: "Client", held: Held, model_only: bool = False) -> None:
        """``held`` into the client's tensors (a pinned state is read as a copy: it stays as it was);
        ``model_only``: its model's tensors alone (a snapshot's measurement: the optimizer may have
        gained state since the pin, when the client trained again)."""
        if held.model_id != id(client._model):
            raise ClientStateError(f"client {client.cid}'s offloaded state belongs to a model the client no longer "
                                   f"holds")
        host = self._read(client.cid, held.stored) if self.mode == "disk" else held.stored
        slots, opt_slots = _slots(client), _optimizer_tensors(client)
        if model_only:
            host, opt_slots = host[:held.n_model], []
        if len(slots) != held.n_model or len(host) != len(slots) + len(opt_slots):
            raise ClientStateError(f"client {client.cid}'s offloaded state holds {len(host)} tensors, its model "
                                   f"and optimizer {len(slots) + len(opt_slots)}")
        copy = held.pins > 0 and self.mode == "host"  # training would write into the pinned tensors
        back = [None if v is None else v.to(d, copy=copy) for v, d in zip(host, held.devices)]
        for (t, what), v in zip(slots, back):
            if what == "grad":
                t.grad = v
            else:
                t.data = v
        for (state, k), v in zip(opt_slots, back[len(slots):]):
            state[k] = v

    # -- pins (a snapshot's clients, kept without a copy)

    def pin(self, cid: int) -> Held | None:
        """Pin client ``cid``'s offloaded state (None if the client is resident: copy it instead)."""
        held = self._held.get(cid)
        if held is not None:
            held.pins += 1
            self._pinned[id(held)] = held
        return held

    def release(self, pins: list[Held]) -> None:
        """Unpin; a state neither pinned nor held any more is removed (its file, on disk)."""
        held_now = {id(h) for h in self._held.values()}
        for held in pins:
            held.pins -= 1
            if held.pins == 0:
                del self._pinned[id(held)]
                if self.mode == "disk" and id(held) not in held_now:
                    with contextlib.suppress(OSError):
                        os.unlink(held.stored[0])

    @contextlib.contextmanager
    def pinned(self, states: dict["Client", Held], kept_out: frozenset[int] = frozenset()) -> Iterator[None]:
        """Each client with its pinned state in its model for the block (the model's tensors: its
        optimizer's stay offloaded); as it was (offloaded with its current state) afterwards.
        Bringing back a client of ``kept_out`` in the block raises ``OutsideChunk`` (its current
        state is not the one the block measures)."""
        current: list[tuple["Client", Held]] = []
        self._kept_out = kept_out
        try:
            for client, held in states.items():
                self.offload(client)  # the current state waits like any offloaded one
                current.append((client, self._held.pop(client.cid)))
                client.store = None
                self._install(client, held, model_only=True)
            yield
        finally:
            self._kept_out = frozenset()
            for client, held in current:
                self._vacate(client)
                self._held[client.cid] = held

    def _write(self, cid: int, host: list[torch.Tensor | None]) -> tuple[Path, int, str]:
        buffer = io.BytesIO()
        torch.save(host, buffer)
        data = buffer.getvalue()
        pinned = {h.stored[0] for h in self._pinned.values()}
        path, version = self.folder / f"client-{cid}.pt", 0
        while path in pinned:  # a pinned file stays as it was: the new state goes beside it
            version += 1
            path = self.folder / f"client-{cid}.{version}.pt"
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".client-{cid}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # whole or not at all: a reader never sees half a file
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path, len(data), hashlib.sha256(data).hexdigest()

    def _read(self, cid: int, stored: tuple[Path, int, str]) -> list[torch.Tensor | None]:
        path, size, digest = stored
        try:
            data = read_regular(path, size)
        except OSError as e:
            raise ClientStateError(f"client {cid}'s state file {path.name} cannot be read back ({e})") from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise ClientStateError(f"client {cid}'s state file {path.name} is not the one written (size or SHA-256 "
                                   f"differs): the run stops rather than train on it")
        return torch.load(io.BytesIO(data), weights_only=True)


def store_for(mode: str, out: str | Path, folder: str | Path | None, tag: str) -> ClientStore | None:
    """The store of ``--client-state`` (None for resident): for disk, a fresh temporary folder under
    ``folder`` (default ``<out>/.client-state``) named after ``tag`` (task, method and seed) and unique."""
    if mode == "resident":
        return None
    if mode == "host":
        return ClientStore("host")
    parent = Path(folder) if folder is not None else Path(out) / ".client-state"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        made = Path(tempfile.mkdtemp(dir=parent, prefix=f"{tag}-"))
    except OSError as e:
        raise ConfigError(f"--client-state disk: cannot make a folder under {parent} ({e.strerror or e})") from None
    return ClientStore("disk", made)
