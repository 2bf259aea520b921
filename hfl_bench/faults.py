"""Faults: unreliable and adversarial clients, applied the same way to every method.

One fault per run, ``--faults KIND:WHO[@STRENGTH][/MODE]`` (``faults:`` in a run YAML or a
suite's settings). WHO is a fraction in (0, 1] of the clients (``round(fraction * N)``, at
least 1, a seeded draw: ``derive_seed(seed, "faults", kind)``) or an explicit list ``[1,3]``.

- ``label-noise`` (data fault; strength = share of the faulty client's training labels flipped,
  default 0.5; mode ``symmetric``, the default: to a uniformly drawn other class, or ``pair``:
  class c to c + 1 mod C): applied once to the training halves after the partition, before
  training (validation and test halves keep their labels);
- ``byzantine`` (message fault; mode ``random``, the default, or ``sign-flip``): whatever a faulty
  client sends through the channel is replaced, by payload kind (``metering.Payload``; table in
  ``corrupt``);
- ``free-rider``: the client never takes an optimizer step (``training.fit`` skips it, and
  ``graphs.train_students`` leaves it to ``fit``; setup-time training included), so what it
  sends comes from its initial state, except where a method overwrites its model with a
  download (FedAvg, FML's meme, FedSocket's Q copy: it sends back what it received, untrained);
- ``straggler`` (strength = probability of missing each round, default 0.5, drawn per client and
  round from ``derive_seed(seed, "faults", "straggler", round, client)``): a client that misses
  a round is dropped from the round's active clients by the engine, so it trains nothing and
  sends nothing. A broadcast that a method writes into every client's model (FedAvg, FML) still
  reaches it: the channel meters the download, the method loads it.

Message faults act in ``Channel.send`` on what a faulty client sends (the server's messages are
never corrupted); the channel returns what the receivers get, and methods use that return value.
Every corruption is seeded from ``(seed, "faults", round, src, part)``: runs are deterministic.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from hfl_bench.config import ConfigError, RunConfig
from hfl_bench.metering import SERVER, Payload, check_kind
from hfl_bench.training import derive_seed, seeded_choice

KINDS = ("label-noise", "byzantine", "free-rider", "straggler")
MODES = {"label-noise": ("symmetric", "pair"), "byzantine": ("random", "sign-flip")}
DEFAULT_STRENGTH = {"label-noise": 0.5, "straggler": 0.5}
COUNT_FACTOR = 10  # byzantine counts are multiplied by this
GRAMMAR = "KIND:WHO[@STRENGTH][/MODE], e.g. byzantine:0.2, label-noise:0.3@0.5/pair, straggler:[1,3]@0.5"
_SPEC = re.compile(r"^(?P<kind>[a-z-]+):(?P<who>\[[^\]]*\]|[^@/]+)(?:@(?P<strength>[^/]+))?(?:/(?P<mode>[a-z-]+))?$")


@dataclass(frozen=True)
class FaultSpec:
    """One parsed fault: its kind, who (a fraction or explicit client ids), strength and mode."""

    kind: str
    fraction: float | None = None
    clients: tuple[int, ...] | None = None
    strength: float | None = None
    mode: str | None = None

    @property
    def canonical(self) -> str:
        """The one spelling of this fault (defaults written out): what the config and the hash hold."""
        who = f"[{','.join(map(str, self.clients))}]" if self.clients is not None else _num(self.fraction)
        text = f"{self.kind}:{who}"
        if self.strength is not None:
            text += f"@{_num(self.strength)}"
        if self.mode is not None:
            text += f"/{self.mode}"
        return text

    def faulty_clients(self, n_clients: int, seed: int) -> list[int]:
        """The faulty client ids: the explicit list, or a seeded draw of round(fraction * N), >= 1."""
        if self.clients is not None:
            bad = [c for c in self.clients if c >= n_clients]
            if bad:
                raise ConfigError(f"--faults {self.canonical}: client {bad[0]} does not exist "
                                  f"(clients are 0..{n_clients - 1})")
            return sorted(self.clients)
        k = min(n_clients, max(1, round(self.fraction * n_clients)))
        return seeded_choice(seed, n_clients, k, "faults", self.kind)


def _num(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def parse_faults(text: str | None) -> FaultSpec | None:
    """The fault ``text`` describes; None for no faults (``""`` or ``none``). ConfigError (one line)
    for a spec that does not parse or is out of range."""
    text = (text or "").strip()
    if text.lower() in ("", "none"):
        return None
    where = f"--faults {text!r}"
    m = _SPEC.match(text.replace(" ", ""))
    if not m:
        raise ConfigError(f"{where} is not a fault spec: use {GRAMMAR}")
    kind, who, strength, mode = m.group("kind", "who", "strength", "mode")
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    fraction, clients = None, None
    if who.startswith("["):
        try:
            clients = tuple(sorted({int(c) for c in who[1:-1].split(",")}))
        except ValueError:
            raise ConfigError(f"{where}: the client list must hold integers, e.g. [1,3]") from None
        if any(c < 0 for c in clients):
            raise ConfigError(f"{where}: client ids must be >= 0")
    else:
        fraction = _float(who, where, "the fraction of faulty clients")
        if not 0 < fraction <= 1:
            raise ConfigError(f"{where}: the fraction of faulty clients must be in (0, 1], got {who}")
    if strength is not None:
        if kind not in DEFAULT_STRENGTH:
            raise ConfigError(f"{where}: {kind} takes no strength (@...)")
        value = _float(strength, where, "the strength")
        if not 0 < value <= 1:
            raise ConfigError(f"{where}: the strength of {kind} must be in (0, 1], got {strength}")
    else:
        value = DEFAULT_STRENGTH.get(kind)
    if mode is not None and mode not in MODES.get(kind, ()):
        allowed = ", ".join(MODES.get(kind, ())) or "none"
        raise ConfigError(f"{where}: {kind} has no mode {mode!r} (modes: {allowed})")
    if mode is None and kind in MODES:
        mode = MODES[kind][0]
    return FaultSpec(kind, fraction, clients, value, mode)


def _float(text: str, where: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {what} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {what} must be finite, got {text!r}")
    return value


def canonical_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its fault spec checked and written canonically ("" without faults): the config
    hash and the record then do not depend on how the spec was spelled. ConfigError for a bad
    spec, or for explicit client ids beyond ``cfg.clients``."""
    spec = parse_faults(cfg.faults)
    if spec is not None and cfg.clients is not None and cfg.seed is not None:
        spec.faulty_clients(cfg.clients, cfg.seed)
    canonical = "" if spec is None else spec.canonical
    return cfg if canonical == cfg.faults else dataclasses.replace(cfg, faults=canonical)


# ----------------------------------------------------------------------------- the plan


class FaultPlan:
    """Which clients are faulty and how, for one run: built by the engine with the federation."""

    def __init__(self, spec: FaultSpec, n_clients: int, seed: int, method: str = ""):
        self.spec, self.n, self.seed, self.method = spec, n_clients, seed, method
        self.faulty = spec.faulty_clients(n_clients, seed)
        self.flipped: dict[int, int] = {}  # label-noise: client -> labels flipped

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def honest(self) -> list[int]:
        bad = set(self.faulty)
        return [c for c in range(self.n) if c not in bad]

    @property
    def free_riders(self) -> frozenset[int]:
        return frozenset(self.faulty) if self.kind == "free-rider" else frozenset()

    def misses(self, cid: int, rnd: int) -> bool:
        """Whether straggler ``cid`` misses round ``rnd`` (always False for other kinds)."""
        if self.kind != "straggler" or cid not in self.faulty or rnd < 1:
            return False
        rng = np.random.default_rng(derive_seed(self.seed, "faults", "straggler", rnd, cid))
        return bool(rng.random() < self.spec.strength)

    # -- data fault

    def apply_label_noise(self, train_y: torch.Tensor, train_idx: list[np.ndarray], num_classes: int) -> torch.Tensor:
        """A copy of ``train_y`` with each faulty client's training labels flipped (label-noise)."""
        if self.kind != "label-noise":
            return train_y
        y = train_y.clone()
        for cid in self.faulty:
            idx = np.asarray(train_idx[cid], dtype=np.int64)
            k = int(round(self.spec.strength * len(idx)))
            rng = np.random.default_rng(derive_seed(self.seed, "faults", "label-noise", cid))
            chosen = np.sort(rng.choice(len(idx), size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)
            rows = torch.as_tensor(idx[chosen], dtype=torch.long, device=y.device)
            old = y[rows]
            if self.spec.mode == "pair":
                new = (old + 1) % num_classes
            else:  # symmetric: a uniformly drawn other class
                shift = torch.as_tensor(rng.integers(1, num_classes, size=k), dtype=old.dtype, device=y.device)
                new = (old + shift) % num_classes
            y[rows] = new
            self.flipped[cid] = int((new != old).sum())
        return y

    # -- message fault

    def tamper(self, src: int, payload: Any, kind: Any, rnd: int) -> Any:
        """What the receivers of ``src``'s ``payload`` get (the channel's hook)."""
        if self.kind != "byzantine" or src == SERVER or src not in self.faulty:
            return payload
        return corrupt(payload, kind, self.spec.mode, (self.seed, "faults", rnd, src), self.method)

    def record(self, rounds_run: int, active_of) -> dict[str, Any]:
        """The record's ``faults`` section (``active_of(rnd)``: the clients drawn for a round)."""
        out: dict[str, Any] = {
            "spec": self.spec.canonical, "kind": self.kind, "strength": self.spec.strength, "mode": self.spec.mode,
            "fraction": self.spec.fraction, "faulty_clients": list(self.faulty), "honest_clients": self.honest,
        }
        if self.kind == "straggler":
            out["missed_rounds"] = {str(c): [r for r in range(1, rounds_run + 1)
                                             if c in active_of(r) and self.misses(c, r)] for c in self.faulty}
        if self.kind == "label-noise":
            out["flipped_labels"] = {str(c): self.flipped.get(c, 0) for c in self.faulty}
        return out


def resolve(cfg: RunConfig) -> tuple[RunConfig, FaultPlan | None]:
    """A run's faults worked out once: ``cfg`` with its spec in the one hashed form
    (``canonical_config``) and the run's fault plan (``plan_for``; None without faults)."""
    cfg = canonical_config(cfg)
    return cfg, plan_for(cfg)


def plan_for(cfg: RunConfig, method: str | None = None) -> FaultPlan | None:
    spec = parse_faults(cfg.faults)
    return None if spec is None else FaultPlan(spec, cfg.clients, cfg.seed, method or cfg.method)


# ----------------------------------------------------------------------------- corruption


def _gen(seed_parts: tuple, *more) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*seed_parts, *more))


def _scale(x: torch.Tensor) -> float:
    """The spread random values are drawn at: the tensor's std (1 for a constant or scalar tensor)."""
    if x.numel() < 2:
        return float(x.abs().mean()) if x.numel() and float(x.abs().mean()) > 0 else 1.0
    s = float(x.float().std())
    return s if math.isfinite(s) and s > 0 else 1.0


def random_like(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Normal noise of ``x``'s shape, mean and std (matched scale, unrelated values)."""
    noise = torch.randn(x.shape, generator=gen, dtype=torch.float32)
    mean = float(x.float().mean()) if x.numel() else 0.0
    out = noise * _scale(x) + (mean if math.isfinite(mean) else 0.0)
    return out.to(dtype=x.dtype, device=x.device)


def random_probs(shape: torch.Size, gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """Rows drawn uniformly from the simplex (Dirichlet(1)): non-negative, summing to 1."""
    e = -torch.rand(shape, generator=gen, dtype=torch.float64).clamp_min(1e-12).log()
    return (e / e.sum(-1, keepdim=True)).to(dtype=like.dtype, device=like.device)


def _params(x: Any, mode: str, gen: torch.Generator) -> Any:
    """PARAMS: floating tensors replaced (random: N(mean, std) of the tensor; sign-flip: negated);
    a tensor with no negative entry (a BatchNorm variance) stays non-negative (random: |.|;
    sign-flip: left as it is); integer tensors and other values pass unchanged."""
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            return x
        non_negative = x.numel() > 0 and bool((x >= 0).all())
        if mode == "sign-flip":
            return x if non_negative else -x
        out = random_like(x, gen)
        return out.abs() if non_negative else out
    if isinstance(x, dict):
        return type(x)((k, _params(v, mode, gen)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return type(x)(_params(v, mode, gen) for v in x)
    return x


def _counts(x: Any) -> Any:
    if isinstance(x, bool):
        return x
    if isinstance(x, (int, float, np.integer, np.floating)):
        return type(x)(x * COUNT_FACTOR)
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return x * COUNT_FACTOR
    raise TypeError(type(x).__name__)


def _accuracies(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.ones_like(x)
    if isinstance(x, np.ndarray):
        return np.ones_like(x)
    if isinstance(x, (int, float)):
        return type(x)(1)
    raise TypeError(type(x).__name__)


class CorruptedModel(nn.Module):
    """What a byzantine client's model snapshot becomes: a wrapper (never a copy) whose forward
    runs the wrapped model and returns corrupted outputs of its shape: seeded random logits (normal
    at the outputs' scale, per call) in ``random`` mode, negated logits in ``sign-flip`` mode. The
    returned tensor stays attached to the wrapped model's graph (with zero gradient in random mode),
    so a method that backpropagates through a teacher still can."""

    def __init__(self, inner: nn.Module, mode: str, seed: int):
        super().__init__()
        self.inner, self.mode, self.seed = inner, mode, seed
        self.calls = 0

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        if self.mode == "sign-flip":
            return -out
        self.calls += 1
        gen = torch.Generator().manual_seed(derive_seed(self.seed, self.calls))
        noise = torch.randn(out.shape, generator=gen, dtype=torch.float32) * _scale(out.detach())
        return noise.to(dtype=out.dtype, device=out.device) + (out - out.detach())


def corrupt(payload: Any, kind: Any, mode: str, seed_parts: tuple, method: str = "", part: str = "") -> Any:
    """A byzantine ``payload`` of ``kind`` (a ``Payload``, or a mapping of them for a dict payload):

    ============  ====================================================================
    MODEL         ``CorruptedModel`` wrapper (random or negated logits)
    LOGITS        random: N(mean, std) of the logits, same shape; sign-flip: negated
    PROBS         random: rows drawn uniformly from the simplex; sign-flip: (1 - p) / (C - 1)
    PARAMS        random: N(mean, std) per floating tensor; sign-flip: negated (``_params``)
    COUNTS        multiplied by ``COUNT_FACTOR`` (10), both modes
    ACCURACIES    set to 1 (the maximum), both modes
    GENERATOR     random: N(mean, std) inputs of the same shape; sign-flip: negated
    FEATURES      random: N(mean, std) vectors of the same shape; sign-flip: negated
    ============  ====================================================================
    """
    check_kind(payload, kind, method)
    if isinstance(kind, dict):
        return type(payload)((k, corrupt(v, kind[k], mode, seed_parts, method, f"{part}/{k}"))
                             for k, v in payload.items())
    gen = _gen(seed_parts, part, kind.value)
    try:
        if kind is Payload.MODEL:
            if not isinstance(payload, nn.Module):
                raise TypeError(type(payload).__name__)
            return CorruptedModel(payload, mode, derive_seed(*seed_parts, part, "model"))
        if kind is Payload.PARAMS:
            return _params(payload, mode, gen)
        if kind is Payload.COUNTS:
            return _counts(payload)
        if kind is Payload.ACCURACIES:
            return _accuracies(payload)
        if not isinstance(payload, torch.Tensor):
            raise TypeError(type(payload).__name__)
        if kind in (Payload.LOGITS, Payload.GENERATOR, Payload.FEATURES):
            return -payload if mode == "sign-flip" else random_like(payload, gen)
        if kind is Payload.PROBS:
            if mode == "sign-flip":
                c = payload.shape[-1]
                return (1 - payload) / max(c - 1, 1)
            return random_probs(payload.shape, gen, payload)
    except TypeError as e:
        raise ConfigError(f"{method or 'a method'} sends a {e} as payload kind {kind.name}: byzantine faults "
                          f"cannot corrupt it") from None
    raise ConfigError(f"{method or 'a method'}: payload kind {kind!r} is not known to the byzantine fault")
