"""Label partitions of a task's training set over clients, and each client's train/val/test split.

A partitioner maps the training labels to one index array per client. Everything is seeded by
a ``numpy.random.Generator``; the resulting ``Partition`` has a stable content hash that every
record carries, so two runs can be checked to have used identical client data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from hfl_bench.errors import PartitionError  # noqa: F401  (re-exported: partitioners raise it)
from hfl_bench.registry import PARTITIONERS


def register_partitioner(name: str):
    return PARTITIONERS.register(name)


def _min_size(n: int, n_clients: int, wanted: int) -> int:
    if n < n_clients:
        raise PartitionError(f"{n_clients} clients but only {n} training samples: use fewer clients")
    return max(1, min(wanted, n // n_clients // 2))


@register_partitioner("dirichlet")
def dirichlet(labels: np.ndarray, n_clients: int, rng: np.random.Generator, alpha: float = 0.3,
              min_size: int = 10) -> list[np.ndarray]:
    """Per class, client shares drawn from Dirichlet(alpha); bounded redraws, then a repair step.

    Small alpha gives strong label skew. A draw that leaves a client with fewer than ``min_size``
    samples is redrawn at most 100 times; after that the smallest clients take random samples
    from the largest ones, so the partitioner always terminates.
    """
    if not alpha > 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    n = len(labels)
    need = _min_size(n, n_clients, min_size)
    classes = np.unique(labels)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    for _ in range(100):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for idx in by_class:
            shares = rng.dirichlet(np.full(n_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for cid, piece in enumerate(np.split(idx, cuts)):
                parts[cid].append(piece)
        shards = [np.concatenate(p) for p in parts]
        if min(len(s) for s in shards) >= need:
            return shards
    return _repair(shards, need, rng)


def _repair(shards: list[np.ndarray], need: int, rng: np.random.Generator) -> list[np.ndarray]:
    shards = [s.copy() for s in shards]
    while True:
        sizes = np.array([len(s) for s in shards])
        small, large = int(sizes.argmin()), int(sizes.argmax())
        if sizes[small] >= need:
            return shards
        take = min(need - sizes[small], sizes[large] - need)
        pick = rng.choice(sizes[large], size=take, replace=False)
        moved = shards[large][pick]
        shards[large] = np.delete(shards[large], pick)
        shards[small] = np.concatenate([shards[small], moved])


@register_partitioner("classes")
def classes(labels: np.ndarray, n_clients: int, rng: np.random.Generator, k: int = 2) -> list[np.ndarray]:
    """Each client holds exactly ``k`` classes (k = 1 included); a class's samples are split evenly
    among the clients that hold it. Classes are dealt round-robin over a seeded class order, so
    every class is held by someone whenever n_clients * k >= number of classes."""
    all_classes = np.unique(labels)
    if not 1 <= k <= len(all_classes):
        raise PartitionError(f"k must be in 1..{len(all_classes)}, got {k}")
    _min_size(len(labels), n_clients, 1)
    order = rng.permutation(all_classes)
    held = [[order[(cid * k + j) % len(order)] for j in range(k)] for cid in range(n_clients)]
    holders: dict[int, list[int]] = {int(c): [] for c in all_classes}
    for cid, cs in enumerate(held):
        for c in cs:
            holders[int(c)].append(cid)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c, who in holders.items():
        if not who:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for cid, piece in zip(who, np.array_split(idx, len(who))):
            parts[cid].append(piece)
    return [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in parts]


@register_partitioner("iid")
def iid(labels: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A uniformly random split into equal-size shards."""
    _min_size(len(labels), n_clients, 1)
    return list(np.array_split(rng.permutation(len(labels)), n_clients))


@register_partitioner("given")
def given(labels: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The client partition a task ships (pfl-npz: one client per file), kept exactly as it is.

    Only a task whose data carries ``client_indices`` supports it; the engine then builds the
    partition with ``given_partition``. It cannot be drawn from labels, so calling it is an error."""
    raise PartitionError("partition 'given' cannot be drawn from labels: it keeps the client partition a task "
                         "ships (pfl-npz), which only a run builds; other tasks take dirichlet, classes or iid")


@dataclass(frozen=True)
class ClientSplit:
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


@dataclass(frozen=True)
class Partition:
    scheme: str
    params: dict[str, Any]
    seed: int
    heldout_fraction: float
    clients: tuple[ClientSplit, ...]
    hash: str
    # Training indices held out as the public transfer set (``--public-size``); no client's data.
    public: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Training indices held out as the pretraining split (``--pretrain-size``): no client's data,
    # read only to train a frozen feature encoder (hfl_bench.families.pretrained).
    pretrain: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def public_size(self) -> int:
        return len(self.public)

    @property
    def pretrain_size(self) -> int:
        return len(self.pretrain)

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    def class_counts(self, labels: np.ndarray, num_classes: int, part: str = "train") -> np.ndarray:
        """[n_clients, num_classes] label counts of one part (train / val / test / all)."""
        out = np.zeros((self.n_clients, num_classes), dtype=np.int64)
        for cid, split in enumerate(self.clients):
            idx = np.concatenate([split.train, split.val, split.test]) if part == "all" else getattr(split, part)
            out[cid] = np.bincount(labels[idx], minlength=num_classes)
        return out


# A shard of at least this many samples always gets ``MIN_HELDOUT`` validation and local test
# samples (``split_client``): one to train on, one to select with, one to test.
TINY_MIN_SAMPLES, MIN_HELDOUT = 3, 1


def split_client(idx: np.ndarray, labels: np.ndarray, heldout_fraction: float,
                 rng: np.random.Generator) -> ClientSplit:
    """Per class, hold out ``heldout_fraction`` of a shard and split it evenly into val and test
    (val takes the odd sample). Stratifying keeps every class's validation count meaningful.

    A tiny shard (50 samples over ten classes: each class's share rounds to zero held out) would
    get no validation or no local test sample, which selection and local accuracy need. Such a
    shard of at least ``TINY_MIN_SAMPLES`` samples (with ``heldout_fraction`` > 0) gets one each
    (``MIN_HELDOUT``): the last training sample of its largest class (fewest label first on ties)
    moves to the empty part. No random draw is made for it, so only shards the rule above leaves
    empty change, and every other partition (and its hash) is as it was."""
    train, val, test = [], [], []
    for c in np.unique(labels[idx]):
        members = rng.permutation(idx[labels[idx] == c])
        n_held = int(round(len(members) * heldout_fraction))
        n_val = (n_held + 1) // 2
        val.append(members[:n_val])
        test.append(members[n_val:n_held])
        train.append(members[n_held:])
    if heldout_fraction > 0 and len(idx) >= TINY_MIN_SAMPLES:
        for part in (val, test):
            if sum(len(p) for p in part) < MIN_HELDOUT:
                largest = int(np.argmax([len(t) for t in train]))  # first of the largest: fewest label
                part[largest] = np.append(part[largest], train[largest][-1])
                train[largest] = train[largest][:-1]

    def cat(parts):
        return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)

    return ClientSplit(cat(train), cat(val), cat(test))


def partition_hash(scheme: str, params: dict[str, Any], clients: tuple[ClientSplit, ...]) -> str:
    h = hashlib.sha256(f"{scheme}|{sorted(params.items())}".encode())
    for split in clients:
        for part in (split.train, split.val, split.test):
            h.update(np.int64(len(part)).tobytes())
            h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def partition_params(scheme: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters a partitioner actually takes, with its defaults filled in."""
    fn = PARTITIONERS.get(scheme)
    sig = inspect.signature(fn)
    accepted = {n: p.default for n, p in sig.parameters.items()
                if n not in ("labels", "n_clients", "rng") and p.default is not inspect.Parameter.empty}
    return {name: params.get(name, default) for name, default in accepted.items()}


# The salts of the two held-out sets' generators (``hold_out_public``).
PUBLIC_SALT, PRETRAIN_SALT = 0x5EED_9B, 0x5EED_A7


def hold_out_public(labels: np.ndarray, size: int, seed: int, among: np.ndarray | None = None,
                    salt: int = PUBLIC_SALT, flag: str = "--public-size") -> tuple[np.ndarray, np.ndarray]:
    """A stratified set of exactly ``size`` training indices (of ``among``, default all) and the
    remaining indices, both sorted. Each class gives its share of ``size`` (largest remainders round
    up), drawn by a generator of its own (``salt``: the public set's or the pretraining split's), so
    the client partition's random stream is untouched."""
    labels = np.asarray(labels)
    among = np.arange(len(labels)) if among is None else np.asarray(among, dtype=np.int64)
    if not 0 < size < len(among):
        raise PartitionError(f"{flag} must be between 1 and {len(among) - 1} (the training set has "
                             f"{len(among)} samples to hold out of), got {size}")
    classes, counts = np.unique(labels[among], return_counts=True)
    exact = counts * size / len(among)
    take = np.floor(exact).astype(int)
    for c in np.argsort(-(exact - take), kind="stable")[: size - take.sum()]:
        take[c] += 1
    rng = np.random.default_rng([seed, salt])
    held = np.concatenate([rng.permutation(among[labels[among] == c])[:k] for c, k in zip(classes, take)])
    held = np.sort(held).astype(np.int64)
    return held, np.setdiff1d(among, held).astype(np.int64)


def make_partition(labels: np.ndarray, n_clients: int, scheme: str = "dirichlet", seed: int = 0,
                   heldout_fraction: float = 0.2, public_size: int = 0, pretrain_size: int = 0,
                   **params) -> Partition:
    """Partition the training labels over clients; with ``pretrain_size`` > 0 a stratified
    pretraining split is held out first, then with ``public_size`` > 0 a stratified public set of
    the rest, and only what remains is partitioned (the held-out indices are in the hash)."""
    if n_clients < 1:
        raise PartitionError(f"need at least one client, got {n_clients}")
    if not 0 <= heldout_fraction < 1:
        raise PartitionError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    labels = np.asarray(labels)
    fn = PARTITIONERS.get(scheme)
    used = partition_params(scheme, params)
    pretrain, rest = (hold_out_public(labels, pretrain_size, seed, salt=PRETRAIN_SALT, flag="--pretrain-size")
                      if pretrain_size else (np.zeros(0, np.int64), None))
    public, private = (hold_out_public(labels, public_size, seed, among=rest) if public_size
                       else (np.zeros(0, np.int64), np.arange(len(labels)) if rest is None else rest))
    rng = np.random.default_rng(seed)
    shards = [private[s] for s in fn(labels[private], n_clients, rng, **used)]
    clients = tuple(split_client(s, labels, heldout_fraction, rng) for s in shards)
    empty = [cid for cid, s in enumerate(clients) if len(s.train) == 0]
    if empty:
        raise PartitionError(f"clients {empty} got no training samples: use fewer clients or another partition")
    key = dict(used, heldout_fraction=heldout_fraction, seed=seed)
    hashed = clients
    none = np.zeros(0, np.int64)
    # Without a held-out set the key (and so the hash) is what it always was.
    if public_size:
        key["public_size"] = public_size
        hashed = hashed + (ClientSplit(public, none, none),)
    if pretrain_size:
        key["pretrain_size"] = pretrain_size
        hashed = hashed + (ClientSplit(pretrain, none, none),)
    return Partition(scheme, used, seed, heldout_fraction, clients, partition_hash(scheme, key, hashed), public,
                     pretrain)


def pack_groups(groups: list[np.ndarray], n_clients: int) -> list[np.ndarray]:
    """``n_clients`` index arrays, each made of whole groups (a task's natural units: users, movies):
    groups by decreasing size (ties: the lower group first), each to the client with the fewest
    samples so far (ties: the lower client), so the clients' sizes are about equal; each client's
    indices sorted. Deterministic: no seed, so every seed runs the same clients."""
    if not 1 <= n_clients <= len(groups):
        raise PartitionError(f"cannot make {n_clients} clients of {len(groups)} whole groups")
    sizes = [0] * n_clients
    members: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for g in sorted(range(len(groups)), key=lambda g: (-len(groups[g]), g)):
        c = min(range(n_clients), key=lambda c: (sizes[c], c))
        members[c].append(groups[g])
        sizes[c] += len(groups[g])
    return [np.sort(np.concatenate(m)).astype(np.int64) if m else np.zeros(0, np.int64) for m in members]


def given_partition(indices: list[np.ndarray], labels: np.ndarray, seed: int = 0,
                    heldout_fraction: float = 0.2, n_clients: int | None = None,
                    public_size: int = 0) -> Partition:
    """A partition whose clients are a task's own groups ``indices`` (one client each, or, with
    ``n_clients`` below their number, ``pack_groups`` of them), each split into train / val / test
    by the usual seeded per-class ``split_client``. With ``public_size`` > 0 a stratified public set
    is held out of all groups' samples first (``hold_out_public``, as for a drawn partition) and the
    groups keep the rest. The hash also covers the labels: shards are given, not drawn, so their
    sizes alone do not identify the data."""
    labels = np.asarray(labels)
    if not indices:
        raise PartitionError("the given partition has no clients")
    if not 0 <= heldout_fraction < 1:
        raise PartitionError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    shards = [np.asarray(s, dtype=np.int64).reshape(-1) for s in indices]
    joined = np.concatenate(shards)
    if len(joined) and (joined.min() < 0 or joined.max() >= len(labels)):
        raise PartitionError("the given client index arrays point outside the training set")
    if len(np.unique(joined)) < len(joined):
        raise PartitionError("the given client index arrays overlap")
    public = np.zeros(0, np.int64)
    if public_size:
        public, _ = hold_out_public(labels, public_size, seed, among=np.sort(joined))
        shards = [s[~np.isin(s, public)] for s in shards]
    if n_clients is not None and n_clients != len(shards):
        shards = pack_groups(shards, n_clients)
    rng = np.random.default_rng(seed)
    clients = tuple(split_client(s, labels, heldout_fraction, rng) for s in shards)
    empty = [cid for cid, s in enumerate(clients) if len(s.train) == 0]
    if empty:
        raise PartitionError(f"clients {empty} of the given partition have no training samples")
    digest = hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64).tobytes()).hexdigest()[:16]
    key: dict[str, Any] = {"heldout_fraction": heldout_fraction, "seed": seed, "labels": digest}
    hashed = clients
    if public_size:  # without a public set the key (and so the hash) is what it always was
        key["public_size"] = public_size
        hashed = hashed + (ClientSplit(public, np.zeros(0, np.int64), np.zeros(0, np.int64)),)
    return Partition("given", {}, seed, heldout_fraction, clients, partition_hash("given", key, hashed), public)
