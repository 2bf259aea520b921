"""Device profiles and the simulated clock (issue 65): how long each round would take on devices.

A profile is a few device classes, each with a compute speed (``flops_per_s``: training FLOPs per
second), link bandwidths (``up_bytes_per_s``, ``down_bytes_per_s``), a latency (``latency_s``, once
per round), a ``share`` of the clients (default: equal shares) and an optional availability trace in
FedScale's layout (``{"active": [...], "inactive": [...], "finish_time": ...}``, seconds). It is a
named preset (``PRESETS``) or a YAML/JSON file (``--devices FILE``; ``load_profile``). Clients get
devices by share (largest remainder); which client gets which by ``--device-assignment``: ``random``
(a seeded shuffle) or ``by-size`` (clients by training FLOPs per sample, largest first, to devices
by speed, fastest first). The ``mixed-phones`` preset draws each client's numbers around its class
(a seeded log-normal jitter, sd ``JITTER``); ``uniform`` gives every client the same device.

The clock: an active client's round time = its training FLOPs that round / speed + its bytes up /
up-bandwidth + its bytes down / down-bandwidth + latency; the server's time is not modelled (0).
A round lasts as long as its slowest active client. Without ``--deadline`` nothing about training
changes: the clock only observes. With ``--deadline S`` (``RULE``), a drawn client is dropped from
the round before it starts, as a straggler fault drops one (it trains and sends nothing), when its
expected time exceeds S (its measured time the last round it ran; before it has run, its local
epochs over its private training samples at its training FLOPs per sample / speed + latency, bytes
unknown: a lower bound) or, where its device has an availability trace, when it is unavailable at
the round's simulated start; a round that dropped a client lasts at least S (the server waits).

Each round's entry records, beside each client's time, what it was computed from (its FLOPs and
bytes, ``INPUTS``): without a deadline these do not depend on the devices, so ``Clock.replay``
times a recorded run again on other devices exactly, as a run on them would (``hfl-bench reclock``,
``hfl_bench.reclock``).

A building block: numpy and the standard library only (no torch).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from hfl_bench.config import ConfigError

ASSIGNMENTS = ("random", "by-size")
RULE = ("deadline: a drawn client whose expected round time (its last measured round time; before its "
        "first round, local epochs x private training samples x training FLOPs per sample / speed + latency) "
        "exceeds the deadline, or whose device is unavailable at the round's simulated start, is dropped "
        "before the round (trains and sends nothing); a round that dropped a client lasts at least the deadline")
SERVER = "not modelled: the server's computation takes no simulated time"
JITTER = 0.2  # mixed-phones: sd of the log of each client's factor around its class (illustrative)
MAX_PROFILE_BYTES = 1 << 20
FIELDS = ("name", "flops_per_s", "up_bytes_per_s", "down_bytes_per_s", "latency_s", "share", "availability")
TRACE_FIELDS = ("active", "inactive", "finish_time")
# What a round's clock entry records of each client that ran, beside its time: what the time was
# computed from (``Device.seconds``), so the round can be timed again on other devices (``replay``).
INPUTS = ("flops", "up_bytes", "down_bytes")


@dataclass(frozen=True)
class Device:
    """One device class (or one client's device)."""

    name: str
    flops_per_s: float
    up_bytes_per_s: float
    down_bytes_per_s: float
    latency_s: float = 0.0
    share: float = 1.0
    availability: dict[str, Any] | None = None  # FedScale's layout: active, inactive, finish_time

    def seconds(self, flops: float, up: float, down: float) -> float:
        """This device's time for ``flops`` training FLOPs, ``up`` bytes sent, ``down`` received."""
        return flops / self.flops_per_s + up / self.up_bytes_per_s + down / self.down_bytes_per_s + self.latency_s

    def available(self, t: float) -> bool:
        """Whether the device is available at simulated time ``t`` (always, without a trace)."""
        return self.availability is None or trace_active(self.availability, t)

    def as_record(self) -> dict[str, Any]:
        return {"name": self.name, "flops_per_s": self.flops_per_s, "up_bytes_per_s": self.up_bytes_per_s,
                "down_bytes_per_s": self.down_bytes_per_s, "latency_s": self.latency_s,
                "availability": self.availability is not None}


# Illustrative numbers, not measurements: sustained training throughput of a phone-class device
# (a small fraction of its peak), and a mobile uplink slower than its downlink. The three
# mixed-phones tiers are a factor ~3 apart in speed, the spread FedScale's device traces and
# AI-Benchmark's phone scores span between low- and high-end phones, roughly.
PRESETS: dict[str, list[Device]] = {
    "uniform": [Device("phone", 3e10, 1e6, 5e6, 0.05)],
    "mixed-phones": [Device("phone-high", 1e11, 2e6, 1e7, 0.03), Device("phone-mid", 3e10, 1e6, 5e6, 0.05),
                     Device("phone-low", 1e10, 5e5, 2e6, 0.1)],
}
JITTERED = {"mixed-phones"}


def _where(source: str) -> str:
    return f"--devices {source}"


def _number(value: Any, where: str, what: str, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: {what} must be a finite number, got {value!r}")
    if (value <= 0) if positive else (value < 0):
        raise ConfigError(f"{where}: {what} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def check_trace(trace: Any, where: str) -> dict[str, Any]:
    """One client's availability trace in FedScale's ``client_behave_trace`` layout: ``active`` and
    ``inactive`` (times in seconds at which it becomes available / unavailable, increasing and
    alternating: active[i] < inactive[i] <= active[i + 1]) and ``finish_time`` (the trace's length:
    it repeats). ConfigError (one line) otherwise."""
    if not isinstance(trace, dict) or set(trace) - set(TRACE_FIELDS) or set(TRACE_FIELDS) - set(trace):
        raise ConfigError(f"{where}: an availability trace is an object of exactly {', '.join(TRACE_FIELDS)}")
    active, inactive = trace["active"], trace["inactive"]
    if not isinstance(active, list) or not isinstance(inactive, list) or not active or len(active) != len(inactive):
        raise ConfigError(f"{where}: a trace's active and inactive are non-empty lists of the same length")
    finish = _number(trace["finish_time"], where, "finish_time")
    times = [_number(t, where, "a trace time", positive=False) for pair in zip(active, inactive) for t in pair]
    pairs = range(len(active))
    if any(b < a for a, b in zip(times, times[1:])) or any(times[2 * i + 1] <= times[2 * i] for i in pairs):
        raise ConfigError(f"{where}: a trace's times must alternate active < inactive <= next active")
    if times[-1] > finish:
        raise ConfigError(f"{where}: a trace's times must be within finish_time ({finish})")
    return {"active": [float(t) for t in active], "inactive": [float(t) for t in inactive], "finish_time": finish}


def trace_active(trace: dict[str, Any], t: float) -> bool:
    """Whether a FedScale-layout trace is available at time ``t`` (the trace repeats every
    ``finish_time``, as FedScale's client reads it): within some [active[i], inactive[i])."""
    x = t % trace["finish_time"]
    return any(a <= x < b for a, b in zip(trace["active"], trace["inactive"]))


def load_trace(path: str | Path) -> dict[str, dict[str, Any]]:
    """A FedScale availability trace as JSON: an object of client key -> trace (``check_trace``).
    FedScale publishes it as a pickle, which is never read here (a pickle runs code): convert it
    first (``benchmarks/fedscale_trace_to_json.py``)."""
    where = f"availability trace {Path(path).name}"
    data = _read_json_or_yaml(Path(path), where)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{where}: must be a non-empty object of client -> trace")
    return {str(k): check_trace(v, f"{where}, client {k}") for k, v in data.items()}


def _read_json_or_yaml(path: Path, where: str) -> Any:
    try:
        if path.stat().st_size > MAX_PROFILE_BYTES:
            raise ConfigError(f"{where}: larger than {MAX_PROFILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: is not UTF-8 text") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{where}: not JSON ({e})") from None
    from hfl_bench.config import read_yaml_mapping

    return read_yaml_mapping(path, where, "of devices")


@dataclass(frozen=True)
class Profile:
    """A profile: its source (a preset's name or a file's name), its device classes, its digest."""

    source: str
    classes: tuple[Device, ...]
    jitter: float = 0.0
    digest: str | None = None  # a file's SHA-256 (None: a preset)
    traces: tuple[dict[str, Any], ...] = field(default=())  # a trace file's traces, by client id modulo


def load_profile(spec: str) -> Profile:
    """The profile ``--devices`` names: a preset (``PRESETS``) or a YAML/JSON file of
    ``devices: [{name, flops_per_s, up_bytes_per_s, down_bytes_per_s, latency_s, share?,
    availability?}]`` and an optional ``traces: FILE`` (a FedScale trace as JSON, relative to the
    profile: client c gets its c-th trace modulo their number, as FedScale assigns them, over its
    device's own). ConfigError (one line) for anything else."""
    if spec in PRESETS:
        return Profile(spec, tuple(PRESETS[spec]), JITTER if spec in JITTERED else 0.0)
    path = Path(spec)
    where = _where(path.name)
    if not path.is_file():
        raise ConfigError(f"--devices {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
    data = _read_json_or_yaml(path, where)
    if not isinstance(data, dict) or set(data) - {"devices", "traces"} or "devices" not in data:
        raise ConfigError(f"{where}: a profile is an object with 'devices' (a list) and optionally 'traces'")
    items = data["devices"]
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{where}: 'devices' must be a non-empty list of devices")
    classes = []
    for i, item in enumerate(items):
        at = f"{where}, device {i}"
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: must be an object of {', '.join(FIELDS)}")
        unknown = sorted(set(item) - set(FIELDS))
        missing = [k for k in ("name", "flops_per_s", "up_bytes_per_s", "down_bytes_per_s") if k not in item]
        if unknown or missing:
            raise ConfigError(f"{at}: {'unknown field ' + unknown[0] if unknown else 'missing ' + missing[0]} "
                              f"(fields: {', '.join(FIELDS)})")
        if not isinstance(item["name"], str) or not item["name"]:
            raise ConfigError(f"{at}: name must be a non-empty string")
        availability = item.get("availability")
        classes.append(Device(
            item["name"], *(_number(item[k], at, k) for k in ("flops_per_s", "up_bytes_per_s", "down_bytes_per_s")),
            _number(item.get("latency_s", 0.0), at, "latency_s", positive=False),
            _number(item.get("share", 1.0), at, "share"),
            None if availability is None else check_trace(availability, at)))
    traces: tuple[dict[str, Any], ...] = ()
    if "traces" in data:
        if not isinstance(data["traces"], str):
            raise ConfigError(f"{where}: 'traces' must name a JSON trace file")
        loaded = load_trace(path.parent / data["traces"])
        traces = tuple(loaded[k] for k in sorted(loaded, key=_trace_key))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Profile(path.name, tuple(classes), 0.0, digest, traces)


def canonical_config(cfg):
    """``cfg`` with ``devices`` "none" written as "" (no clock), its profile checked (ConfigError,
    one line, for a bad preset name or file) before any data loads."""
    import dataclasses

    spec = cfg.devices.strip()
    if spec.lower() in ("", "none"):
        return cfg if cfg.devices == "" else dataclasses.replace(cfg, devices="")
    load_profile(spec)
    return cfg if spec == cfg.devices else dataclasses.replace(cfg, devices=spec)


def _trace_key(key: str) -> tuple:
    return (0, int(key), "") if key.lstrip("-").isdigit() else (1, 0, key)


def _rng(seed: int, *tags: str) -> np.random.Generator:
    digest = hashlib.sha256(json.dumps([seed, "devices", *tags]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def counts(shares: Sequence[float], n: int) -> list[int]:
    """``n`` clients split by ``shares`` (largest remainder; ties to the earlier class)."""
    total = sum(shares)
    exact = [s / total * n for s in shares]
    out = [int(math.floor(x)) for x in exact]
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: n - sum(out)]:
        out[i] += 1
    return out


def generate(profile: Profile, n: int, seed: int) -> list[Device]:
    """``n`` devices from ``profile``: its classes by share, each jittered (a seeded log-normal factor
    per client on speed and bandwidths) where the preset jitters; in class order."""
    devices = [d for d, k in zip(profile.classes, counts([d.share for d in profile.classes], n)) for _ in range(k)]
    if profile.jitter:
        factors = np.exp(_rng(seed, profile.source, "jitter").normal(0.0, profile.jitter, size=(n, 3)))
        devices = [Device(d.name, _round(d.flops_per_s * f[0], 4), _round(d.up_bytes_per_s * f[1], 4),
                          _round(d.down_bytes_per_s * f[2], 4), d.latency_s, d.share, d.availability)
                   for d, f in zip(devices, factors)]
    return devices


def assign(devices: list[Device], rule: str, seed: int, training_flops: Sequence[int]) -> list[Device]:
    """Each client's device (client order): ``random``, a seeded shuffle; ``by-size``, clients by
    training FLOPs per sample (largest first, ties by id) to devices by speed (fastest first)."""
    n = len(devices)
    if rule == "random":
        order = _rng(seed, "assign").permutation(n)
        return [devices[int(i)] for i in order]
    if rule != "by-size":
        raise ConfigError(f"--device-assignment must be {' or '.join(ASSIGNMENTS)}, got {rule!r}")
    fastest = sorted(range(n), key=lambda i: (-devices[i].flops_per_s, i))
    largest = sorted(range(n), key=lambda c: (-int(training_flops[c]), c))
    out: list[Device | None] = [None] * n
    for c, d in zip(largest, fastest):
        out[c] = devices[d]
    return out  # type: ignore[return-value]


class Clock:
    """One run's devices and its simulated time, rebuilt from the history (so a resumed run goes on
    where it stopped): ``admit`` before a round, ``round_entry`` after it."""

    def __init__(self, profile: Profile, devices: list[Device], assignment: str, seed: int,
                 deadline: float | None, first_estimate: Sequence[float], training_flops: Sequence[int] = ()):
        self.profile, self.devices, self.assignment, self.seed = profile, devices, assignment, seed
        self.training_flops = list(training_flops)  # each client's training FLOPs per sample
        self.deadline = deadline
        self.first_estimate = list(first_estimate)  # before a client has run: its private training's time

    @staticmethod
    def entries(history: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return [h["clock"] for h in history if isinstance(h.get("clock"), dict)]

    def now(self, history: Iterable[dict[str, Any]]) -> float:
        """The simulated time at which the next round starts: the rounds so far, added up."""
        return float(sum(e["seconds"] for e in self.entries(history)))

    def estimates(self, history: Iterable[dict[str, Any]]) -> list[float]:
        """Each client's expected round time: its last measured one, else ``first_estimate``."""
        out = list(self.first_estimate)
        for e in self.entries(history):
            for c, t in enumerate(e["clients"]):
                if t is not None:
                    out[c] = t
        return out

    def admit(self, active: list[int], history: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        """The clients that run this round and those dropped by the deadline (``RULE``); without a
        deadline every active client runs."""
        if self.deadline is None:
            return active, []
        start, expected = self.now(history), self.estimates(history)
        dropped = [c for c in active if expected[c] > self.deadline or not self.devices[c].available(start)]
        return [c for c in active if c not in dropped], dropped

    def round_entry(self, ran: list[int], dropped: list[int], flops: Sequence[float], up: Sequence[float],
                    down: Sequence[float], history: list[dict[str, Any]]) -> dict[str, Any]:
        """A round's ``clock`` history entry: its start, each client's time (null: did not run), the
        clients the deadline dropped and the round's time (the slowest, at least the deadline when
        one was dropped); and what each client's time was computed from (``flops``, ``up_bytes``,
        ``down_bytes``; null: did not run), so ``replay`` can time the round again on other devices."""
        n = len(self.devices)
        times: list[float | None] = [None] * n
        inputs: dict[str, list[float | None]] = {k: [None] * n for k in INPUTS}
        for c in ran:
            times[c] = _round(self.devices[c].seconds(flops[c], up[c], down[c]))
            for key, values in zip(INPUTS, (flops, up, down)):
                inputs[key][c] = float(values[c])
        slowest = max([t for t in times if t is not None], default=0.0)
        seconds = max(slowest, self.deadline) if dropped and self.deadline is not None else slowest
        return {"start_s": _round(self.now(history)), "seconds": _round(seconds), "clients": times,
                "dropped": sorted(dropped), **inputs}

    def replay(self, entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rounds of ``entries`` (``history[].clock`` of a run without a deadline) timed again on
        this clock's devices, by ``round_entry`` from the inputs each entry recorded: the clients
        that ran, their training FLOPs and bytes. Without a deadline these inputs do not depend on
        the devices (nobody is dropped), so the result is what a run on these devices records.
        ValueError for an entry without its inputs (written before they were recorded) or with a
        deadline's drops."""
        if self.deadline is not None:
            raise ValueError("a clock with a deadline cannot replay rounds: it would drop clients the run trained")
        done: list[dict[str, Any]] = []
        for r, e in enumerate(entries):
            if any(not isinstance(e.get(k), list) or len(e[k]) != len(self.devices) for k in (*INPUTS, "clients")):
                raise ValueError(f"round {r + 1}'s clock entry does not hold each client's FLOPs and bytes "
                                 f"({', '.join(INPUTS)}) for {len(self.devices)} clients")
            if e.get("dropped"):
                raise ValueError(f"round {r + 1} dropped clients at a deadline")
            ran = [c for c, t in enumerate(e["clients"]) if t is not None]
            if any(e[k][c] is None for k in INPUTS for c in ran):
                raise ValueError(f"round {r + 1}'s clock entry lacks the FLOPs or bytes of a client that ran")
            zero = [0.0] * len(self.devices)
            flops, up, down = ([zero[c] if v is None else v for c, v in enumerate(e[k])] for k in INPUTS)
            done.append(self.round_entry(ran, [], flops, up, down, [{"clock": d} for d in done]))
        return done

    def record(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The record's ``clock`` section."""
        per_round = [e["seconds"] for e in self.entries(history)]
        return {
            "profile": self.profile.source, "preset": self.profile.source in PRESETS,
            "profile_sha256": self.profile.digest, "seed": self.seed, "assignment": self.assignment,
            "deadline_s": self.deadline, "rule": RULE if self.deadline is not None else None, "server": SERVER,
            "devices": [d.as_record() for d in self.devices],
            "per_round_s": per_round, "total_s": _round(sum(per_round)),
        }


def _round(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def build(devices_spec: str, assignment: str, deadline: float | None, seed: int,
          training_flops: Sequence[int], first_flops: Sequence[float]) -> Clock:
    """A run's clock: the profile, ``n`` devices generated and assigned, traces laid over them
    (client c gets trace c modulo their number); ``first_flops``: each client's first-round FLOPs
    estimate (its local epochs over its private training samples)."""
    profile = load_profile(devices_spec)
    n = len(training_flops)
    devices = assign(generate(profile, n, seed), assignment, seed, training_flops)
    if profile.traces:
        devices = [Device(d.name, d.flops_per_s, d.up_bytes_per_s, d.down_bytes_per_s, d.latency_s, d.share,
                          profile.traces[c % len(profile.traces)]) for c, d in enumerate(devices)]
    first = [d.seconds(f, 0.0, 0.0) for d, f in zip(devices, first_flops)]
    return Clock(profile, devices, assignment, seed, deadline, first, training_flops)
