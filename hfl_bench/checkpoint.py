"""Checkpoints of a running simulation, so that an interrupted run can be resumed.

A checkpoint holds everything a round reads that the deterministic rebuild (``Simulation(cfg)``:
data, partition, client models, ``Method.setup``) does not restore by itself: every client's model
and optimizer, the method's state (``Method.state_dict``), the evaluator's cached
figures, the history so far, the channel's counters and the RNG states of python, numpy and torch.
Loading it into a freshly built simulation continues the run exactly where the checkpoint left it.

The file holds only tensors, numbers, strings, None and containers of them, so it loads with
``torch.load(path, weights_only=True)``: opening a checkpoint never runs code from the file.
Objects that are not plain data are stored as tagged dicts (``{"__ckpt__": kind, ...}``).
"""

from __future__ import annotations

import dataclasses
import io
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from hfl_bench.aggregation import run_version
from hfl_bench.config import ConfigError, config_hash, without_legacy
from hfl_bench.federation import RoundMetrics
from hfl_bench.paths import unseal, write_sealed
from hfl_bench.regularfile import NotRegularFile, open_regular

if TYPE_CHECKING:
    from hfl_bench.federation import RoundView

FORMAT = 2  # 2: the work meter (``budget``); a format-1 checkpoint cannot say what its rounds trained
TAG = "__ckpt__"
# A checkpoint file's first line: this, then the SHA-256 (hex) of the rest of the file (``write``).
MAGIC = b"hfl-bench checkpoint sha256="
# Settings that may differ between the interrupted and the resuming process: where things are,
# how often checkpoints are written, and where clients' state waits (it changes no figure).
# Everything else must match.
MAY_DIFFER = ("checkpoint_every", "data_dir", "download", "out", "client_state", "client_state_dir")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be resumed from; the message is meant for the user."""


class _Skip:
    """Marks a value the walk does not store (setup rebuilds it)."""


SKIP = _Skip()
MISSING = object()


# ----------------------------------------------------------------------------- the generic walk


def module_tensor_ids(modules: list[nn.Module]) -> set[int]:
    """Ids of the parameters and buffers of ``modules``: a later walk stores them only once."""
    return {id(t) for m in modules for t in m.state_dict(keep_vars=True).values()}


def pack(value: Any, seen: set[int]) -> Any:
    """``value`` as plain data (tensors, numbers, strings, None, lists, tuples, dicts), or SKIP.

    ``seen`` holds the ids of module tensors already stored elsewhere (the client models, or an
    earlier module of the same walk); a module that wraps them (e.g. a joint predictor around a
    client's model) stores only its own tensors.
    """
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, nn.Module):
        return _pack_module(value, seen)
    if isinstance(value, torch.optim.Optimizer):
        return {TAG: "optimizer", "state": value.state_dict()}
    if isinstance(value, torch.Tensor):
        if id(value) in seen:  # a model's parameter held by reference: restored with the model
            return {TAG: "shared"}
        return _detached(value)
    if isinstance(value, np.ndarray):
        return _pack_array(value)
    if isinstance(value, torch.Generator):
        return {TAG: "torch_generator", "state": value.get_state(), "device": str(value.device)}
    if isinstance(value, np.random.Generator):
        return {TAG: "numpy_generator", "state": value.bit_generator.state}
    if isinstance(value, random.Random):
        return {TAG: "python_random", "state": _pack_python_rng(value.getstate())}
    if isinstance(value, (set, frozenset)):
        items = [pack(v, seen) for v in sorted(value, key=repr)]
        return SKIP if any(v is SKIP for v in items) else {TAG: "set", "items": items}
    if isinstance(value, (list, tuple)):
        items = [pack(v, seen) for v in value]
        if any(v is SKIP for v in items):
            return SKIP  # a container holding objects setup rebuilds: rebuilt whole
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        if not all(k is None or type(k) in (bool, int, float, str) for k in value):
            return SKIP
        items = {k: pack(v, seen) for k, v in value.items()}
        return SKIP if any(v is SKIP for v in items.values()) else items
    return SKIP  # callables, dataclasses and other objects: rebuilt deterministically by setup


def _pack_module(module: nn.Module, seen: set[int]) -> dict[str, Any]:
    state, shared = {}, []
    for name, t in module.state_dict(keep_vars=True).items():
        if id(t) in seen:
            shared.append(name)
        else:
            seen.add(id(t))
            state[name] = _detached(t)
    return {
        TAG: "module", "state": state, "shared": shared,
        # train/eval mode and frozen parameters are state too: a round may rely on them
        "training": [m.training for m in module.modules()],
        "requires_grad": {name: p.requires_grad for name, p in module.named_parameters()},
    }


def _detached(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    # torch.save writes a view's whole storage: store a small slice of a big tensor on its own
    whole = t.untyped_storage().nbytes()
    return t.clone() if whole > t.numel() * t.element_size() else t


def _pack_array(a: np.ndarray) -> Any:
    if a.dtype == object:
        return SKIP
    try:
        return {TAG: "ndarray", "data": torch.from_numpy(np.ascontiguousarray(a)).clone()}
    except TypeError:  # a dtype torch lacks
        return {TAG: "ndarray", "list": a.tolist(), "dtype": str(a.dtype), "shape": list(a.shape)}


def unpack(saved: Any, current: Any, where: str, device: torch.device) -> Any:
    """The value to hold after loading ``saved`` over ``current`` (what a fresh setup built,
    or MISSING). Modules, optimizers, generators and containers are loaded in place."""
    if isinstance(saved, dict) and TAG in saved:
        return _unpack_tagged(saved, current, where, device)
    if isinstance(saved, torch.Tensor):
        return saved.to(current.device if isinstance(current, torch.Tensor) else device)
    if isinstance(saved, dict):
        target = current if isinstance(current, dict) else {}
        for k in [k for k in target if k not in saved]:
            del target[k]
        for k, v in saved.items():
            target[k] = unpack(v, target.get(k, MISSING), f"{where}[{k!r}]", device)
        return target
    if isinstance(saved, (list, tuple)):
        fresh = current if isinstance(current, (list, tuple)) else ()
        items = [unpack(v, fresh[i] if i < len(fresh) else MISSING, f"{where}[{i}]", device)
                 for i, v in enumerate(saved)]
        if isinstance(saved, tuple):
            return tuple(items)
        if isinstance(current, list):
            current[:] = items  # keep the list object: something else may hold it
            return current
        return items
    return saved


def _unpack_tagged(saved: dict[str, Any], current: Any, where: str, device: torch.device) -> Any:
    kind = saved[TAG]
    if kind == "module":
        if not isinstance(current, nn.Module):
            raise CheckpointError(
                f"{where}: the checkpoint holds a model that a fresh setup() does not create; the method "
                "must override state_dict/load_state_dict to create it (see CONTRIBUTING.md)")
        load_module(current, saved, where)
        return current
    if kind == "optimizer":
        if not isinstance(current, torch.optim.Optimizer):
            raise CheckpointError(
                f"{where}: the checkpoint holds an optimizer that a fresh setup() does not create; the "
                "method must override state_dict/load_state_dict to create it (see CONTRIBUTING.md)")
        current.load_state_dict(saved["state"])
        return current
    if kind == "shared":
        if current is MISSING:
            raise CheckpointError(f"{where}: a model tensor held by reference is missing after setup()")
        return current
    if kind == "ndarray":
        if "data" in saved:
            return saved["data"].numpy().copy()
        return np.array(saved["list"], dtype=saved["dtype"]).reshape(saved["shape"])
    if kind == "set":
        return {unpack(v, MISSING, where, device) for v in saved["items"]}
    if kind == "torch_generator":
        gen = current if isinstance(current, torch.Generator) else torch.Generator(saved["device"])
        gen.set_state(saved["state"])
        return gen
    if kind == "numpy_generator":
        gen = current if isinstance(current, np.random.Generator) else \
            np.random.Generator(getattr(np.random, saved["state"]["bit_generator"])())
        gen.bit_generator.state = saved["state"]
        return gen
    if kind == "python_random":
        gen = current if isinstance(current, random.Random) else random.Random()
        gen.setstate(_unpack_python_rng(saved["state"]))
        return gen
    raise CheckpointError(f"{where}: unknown entry kind {kind!r} (a checkpoint from a newer hfl-bench?)")


def load_module(module: nn.Module, saved: dict[str, Any], where: str) -> None:
    missing, unexpected = module.load_state_dict(saved["state"], strict=False)
    wrong = sorted(set(missing) - set(saved["shared"])) + sorted(unexpected)
    if wrong:
        raise CheckpointError(f"{where}: the model built by setup() does not match the checkpoint "
                              f"(differing entries: {', '.join(wrong[:5])})")
    for m, training in zip(module.modules(), saved["training"]):
        m.training = training
    for name, p in module.named_parameters():
        p.requires_grad_(saved["requires_grad"].get(name, p.requires_grad))


def plain(value: Any, what: str) -> Any:
    """``pack`` for the engine's own data, which must be stored whole."""
    packed = pack(value, set())
    if packed is SKIP:
        raise TypeError(f"{what} holds a value a checkpoint cannot store")
    return packed


def pack_attrs(obj: Any, fed: "RoundView", skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object's attributes as plain data (see ``pack``); the client models are stored by the
    engine, so tensors of theirs that the object holds are stored as references."""
    seen = module_tensor_ids([c.model for c in fed.clients])
    out = {}
    for name, value in vars(obj).items():
        packed = SKIP if name in skip else pack(value, seen)
        if packed is not SKIP:
            out[name] = packed
    return out


def load_attrs(obj: Any, state: dict[str, Any], fed: "RoundView", where: str) -> None:
    """Load ``pack_attrs`` output into an object that a fresh setup has just built."""
    for name, saved in state.items():
        setattr(obj, name, unpack(saved, getattr(obj, name, MISSING), f"{where}.{name}", fed.device))


# ----------------------------------------------------------------------------- RNG states


def _pack_python_rng(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _unpack_python_rng(state: list) -> tuple:
    version, internal, gauss = state
    return version, tuple(internal), gauss


def rng_states(device: torch.device) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": _pack_python_rng(random.getstate()),
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
    }


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(_unpack_python_rng(states["python"]))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"][: torch.cuda.device_count()])


# ----------------------------------------------------------------------------- the simulation


def simulation_state(sim: Any) -> dict[str, Any]:
    """Everything needed to continue ``sim`` after its last completed round."""
    fed, ev = sim.fed, sim.evaluator
    cfg_dict = dataclasses.asdict(sim.cfg)
    return {
        "format": FORMAT,
        "config_hash": config_hash(cfg_dict),
        "config": plain(cfg_dict, "the config"),
        "data_fingerprint": fed.data.fingerprint,
        "versions": implementation_versions(sim),
        "code": plain(sim.code, "the code version"),
        "round": len(sim.history) - 1,
        "elapsed_s": time.perf_counter() - sim.t0,
        "resumed_from_rounds": list(sim.resumed_from),
        "rng": rng_states(fed.device),
        "clients": [{"model": _pack_module(c.model, set()), "optimizer": c.optimizer.state_dict()}
                    for c in fed.clients],
        "val_correct": fed.val_correct,
        "method": sim.method.state_dict(fed),
        "budget": fed.budget.state(),  # a resumed run's budget counts on from here
        "channel": {"sent": torch.from_numpy(fed.channel.sent.copy()),
                    "received": torch.from_numpy(fed.channel.received.copy()),
                    "server_sent": int(fed.channel.server_sent), "total": int(fed.channel.total)},
        "evaluator": {"local_correct": torch.from_numpy(ev.local_correct.copy()),
                      "global_correct": torch.from_numpy(ev.global_correct.copy()),
                      "global_stale": sorted(ev.global_stale), "best_val": float(ev.best_val),
                      "pooled_correct": torch.from_numpy(ev.pooled_correct.copy())},
        "history": plain(sim.history, "the history"),
        "best": None if sim.best is None else plain(dataclasses.asdict(sim.best), "the best round"),
        "sent": torch.from_numpy(np.stack(sim.sent)) if sim.sent else None,
    }


def restore_simulation(sim: Any, state: dict[str, Any], where: str) -> None:
    """Load ``simulation_state`` output into a freshly built ``Simulation`` of the same config.

    A checkpoint that loads but does not fit (a tensor of the wrong shape, missing or unexpected
    entries: a hand-edited file, or one from a different build of a model) is a CheckpointError
    naming the file, never a traceback from deep inside torch."""
    check_compatible(sim, state, where)
    try:
        _restore(sim, state, where)
    except CheckpointError:
        raise
    except (RuntimeError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{where} does not fit this run ({type(e).__name__}: {reason[:200]}); "
                              "delete it to start over") from None


def _restore(sim: Any, state: dict[str, Any], where: str) -> None:
    fed, ev, dev = sim.fed, sim.evaluator, sim.fed.device
    if len(state["clients"]) != fed.n_clients:
        raise CheckpointError(f"{where} does not fit this run: it holds {len(state['clients'])} clients, the run "
                              f"has {fed.n_clients}; delete it to start over")
    sim.method.prepare_resume(fed, int(state["round"]))  # models whose shape changes by round: as saved
    for client, saved in zip(fed.clients, state["clients"]):
        load_module(client.model, saved["model"], f"client {client.cid} model")
        client.optimizer.load_state_dict(saved["optimizer"])
    fed.val_correct.copy_(state["val_correct"])
    sim.method.load_state_dict(state["method"], fed)
    ch = state["channel"]
    fed.channel.sent[:], fed.channel.received[:] = ch["sent"].numpy(), ch["received"].numpy()
    fed.channel.server_sent, fed.channel.total = ch["server_sent"], ch["total"]
    fed.budget.load(state["budget"])
    e = state["evaluator"]
    ev.local_correct, ev.global_correct = e["local_correct"].numpy().copy(), e["global_correct"].numpy().copy()
    ev.global_stale, ev.best_val = set(e["global_stale"]), e["best_val"]
    if "pooled_correct" in e:
        ev.pooled_correct = e["pooled_correct"].numpy().copy()
    elif ev.pooled:  # its best_val is of the own-validation rule, and the pooled counts are not in it
        raise CheckpointError(f"{where} was written before runs with one class per validation half selected "
                              "on pooled validation: rerun without --resume to start over")
    sim.history = list(state["history"])
    sim.best = None if state["best"] is None else RoundMetrics(**unpack(state["best"], MISSING, "best", dev))
    sim.sent = [] if state["sent"] is None else list(state["sent"].numpy().copy())
    sim.resumed_from = [*state["resumed_from_rounds"], state["round"]]
    sim.t0 = time.perf_counter() - state["elapsed_s"]  # the record's wall time covers both processes
    set_rng_states(state["rng"])  # last: building the simulation drew from the global RNGs


def check_compatible(sim: Any, state: dict[str, Any], where: str) -> None:
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{where} has checkpoint format {state.get('format')!r}; this hfl-bench "
                              f"reads format {FORMAT}: rerun without --resume")
    cfg = dataclasses.asdict(sim.cfg)
    saved = without_legacy(state["config"])  # one written before vmap and lockstep were removed
    differ = [k for k in sorted(set(cfg) | set(saved)) if k not in MAY_DIFFER and cfg.get(k) != saved.get(k)]
    if differ or state["config_hash"] != config_hash(cfg):
        changes = ", ".join(f"{k}: {saved.get(k)!r} -> {cfg.get(k)!r}" for k in differ) or "config hash"
        raise CheckpointError(f"{where} was written for a different configuration ({changes}); "
                              "rerun without --resume to start over")
    saved_data, data = state.get("data_fingerprint"), sim.fed.data.fingerprint
    if saved_data and data and saved_data != data:
        raise CheckpointError(f"{where} was written for other data (fingerprint {saved_data}, the data now "
                              f"loaded is {data}): point --data-dir at the data it was made on, or use another --out")
    check_versions(state, implementation_versions(sim), where)
    old, new = (state.get("code") or {}).get("git_sha"), (sim.code or {}).get("git_sha")
    if old and new and old != new:
        raise CheckpointError(f"{where} was written by code at commit {old[:12]}, but the code is now at "
                              f"{new[:12]}: resume with that commit, or rerun without --resume")


def implementation_versions(sim: Any) -> dict[str, Any]:
    """The method's and the task's versions: a checkpoint resumes only under the same ones (the
    git commit says nothing for an installed wheel, and is not in the config hash).

    The method's version is the one its record carries (``aggregation.run_version``: its card's,
    and its aggregation rule's past "1.0"): a class may not declare ``version`` itself
    (``method_api.CARD_ATTRIBUTES``), so reading it off the class gave None on both sides and let
    any version resume any other's checkpoint."""
    method = run_version(type(sim.method).card.version, sim.method.hparams())
    return {"method": method, "task": sim.fed.info.version}


def check_versions(state: dict[str, Any], now: dict[str, Any], where: str) -> None:
    """CheckpointError (one line) when the checkpoint was written by another version of the method
    or of the task, or does not say (written before checkpoints recorded them)."""
    saved = state.get("versions")
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where} does not record the method and task versions it was written by "
                              "(an older hfl-bench): rerun without --resume to start over")
    for what in ("method", "task"):
        if saved.get(what) != now[what]:
            raise CheckpointError(f"{where} was written by {what} version {saved.get(what)!r}, but this code's is "
                                  f"{now[what]!r}: rerun without --resume to start over")


def write(path: str | Path, state: dict[str, Any]) -> None:
    """Save atomically (``paths.write_sealed``): never half a file. The file is one header line
    that holds the SHA-256 of what follows, then torch's archive: ``read`` checks the digest before
    it trusts a byte (torch's zip reader does not check its members, so one flipped bit in a weight
    would resume in silence)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_sealed(path, MAGIC, buffer.getvalue())


def read(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: plain data only, no code runs.

    Only a regular file is read (``regularfile.open_regular``: opened non-blocking, checked on the
    open descriptor): a FIFO would block the open (and the run) forever, a device or a folder is no
    checkpoint."""
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except NotRegularFile as e:
        raise CheckpointError(f"checkpoint {path} is not a regular file (a {e.kind}): "
                              "delete it or rerun without --resume") from None
    except OSError as e:  # no permission, a socket (ENXIO)
        raise CheckpointError(f"cannot read checkpoint {path} ({type(e).__name__}: {e.strerror or e}); "
                              "delete it or rerun without --resume") from None
    with f:
        state = _load(io.BytesIO(_verified(f.read(), path)), path)
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(f"{path} is not an hfl-bench checkpoint")
    return state


def _verified(data: bytes, path: str | Path) -> bytes:
    """The archive after a checkpoint's digest line, once its SHA-256 matches the line's; a file
    without the line (an older hfl-bench's, or no checkpoint) or with another digest (damaged) is
    refused."""
    payload, problem = unseal(data, MAGIC)
    if problem == "unsealed":
        raise CheckpointError(f"checkpoint {path} has no digest line (written by an older hfl-bench, or not a "
                              "checkpoint): delete it or rerun without --resume")
    if payload is None:
        raise CheckpointError(f"checkpoint {path} is damaged (its content does not match its SHA-256): "
                              "delete it or rerun without --resume")
    return payload


def _load(f: Any, path: str | Path) -> Any:
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, foreign or unsafe file: torch raises several kinds
        raise CheckpointError(f"cannot read checkpoint {path} ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); "
                              "delete it or rerun without --resume") from None
