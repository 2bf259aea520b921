"""Partitioners and client splits on synthetic labels and on the real digits labels."""

from __future__ import annotations

import numpy as np
import pytest

from hfl_bench.partition import (
    PartitionError,
    dirichlet,
    given_partition,
    make_partition,
    partition_hash,
    split_client,
)

# (scheme, params) combinations every generic property is checked on.
SCHEMES = [
    ("dirichlet", {"alpha": 0.3}),
    ("dirichlet", {"alpha": 0.05}),
    ("classes", {"k": 1}),
    ("classes", {"k": 2}),
    ("iid", {}),
]
SCHEME_IDS = [f"{s}-{'-'.join(f'{k}{v}' for k, v in p.items())}" for s, p in SCHEMES]


def synthetic_labels(n=600, classes=6, seed=3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=n)


@pytest.fixture(scope="module")
def digits_labels() -> np.ndarray:
    from hfl_bench.data import get_task

    return get_task("digits").load().train_y.numpy()


@pytest.fixture(params=["synthetic", "digits"])
def labels(request, digits_labels) -> np.ndarray:
    return synthetic_labels() if request.param == "synthetic" else digits_labels


def all_indices(part) -> list[np.ndarray]:
    return [p for c in part.clients for p in (c.train, c.val, c.test)]


def label_entropy(counts: np.ndarray) -> float:
    p = counts / counts.sum()
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


# --------------------------------------------------------------------------- disjoint and complete


@pytest.mark.parametrize("scheme, params", SCHEMES, ids=SCHEME_IDS)
def test_disjoint_and_complete(labels, scheme, params):
    n_clients = 10 if scheme == "classes" and params["k"] == 1 else 7
    part = make_partition(labels, n_clients, scheme, seed=1, **params)
    assert part.n_clients == n_clients
    everything = np.concatenate(all_indices(part))
    assert len(everything) == len(labels)  # no index used twice ...
    assert np.array_equal(np.sort(everything), np.arange(len(labels)))  # ... and none left out
    for c in part.clients:
        assert len(c.train) > 0
        for arr in (c.train, c.val, c.test):
            assert arr.dtype == np.int64
            assert np.all(np.diff(arr) > 0)  # sorted, unique


# --------------------------------------------------------------------------- seeding


@pytest.mark.parametrize("scheme, params", SCHEMES, ids=SCHEME_IDS)
def test_seeded(scheme, params, digits_labels):
    a = make_partition(digits_labels, 10, scheme, seed=7, **params)
    b = make_partition(digits_labels, 10, scheme, seed=7, **params)
    c = make_partition(digits_labels, 10, scheme, seed=8, **params)
    assert a.hash == b.hash
    assert all(np.array_equal(x, y) for x, y in zip(all_indices(a), all_indices(b)))
    assert a.hash != c.hash
    assert not all(np.array_equal(x, y) for x, y in zip(all_indices(a), all_indices(c)))
    assert len(a.hash) == 16 and int(a.hash, 16) >= 0


def test_hash_covers_params_and_heldout():
    y = synthetic_labels()
    base = make_partition(y, 5, "dirichlet", seed=0, alpha=0.3)
    assert make_partition(y, 5, "dirichlet", seed=0, alpha=0.31).hash != base.hash
    assert make_partition(y, 5, "dirichlet", seed=0, alpha=0.3, heldout_fraction=0.3).hash != base.hash
    assert partition_hash("dirichlet", {"alpha": 0.3}, base.clients) != partition_hash(
        "dirichlet", {"alpha": 0.4}, base.clients)


def test_unused_params_are_dropped_and_defaults_recorded():
    y = synthetic_labels()
    part = make_partition(y, 5, "iid", seed=0, alpha=0.3, k=2)
    assert part.params == {}
    # alpha/k are irrelevant to iid: they must not change the hash either.
    assert part.hash == make_partition(y, 5, "iid", seed=0).hash
    assert make_partition(y, 5, "dirichlet", seed=0).params == {"alpha": 0.3, "min_size": 10}
    assert make_partition(y, 5, "classes", seed=0).params == {"k": 2}


# --------------------------------------------------------------------------- dirichlet


@pytest.mark.parametrize("source", ["synthetic", "digits"])
def test_small_alpha_skews_labels(source, digits_labels):
    y = synthetic_labels(n=2000, classes=10) if source == "synthetic" else digits_labels

    def stats(alpha):
        part = make_partition(y, 10, "dirichlet", seed=0, alpha=alpha)
        counts = part.class_counts(y, 10, "all")
        return np.mean([label_entropy(c) for c in counts]), np.mean((counts > 0).sum(1))

    skew_entropy, skew_held = stats(0.05)
    flat_entropy, flat_held = stats(100.0)
    assert skew_entropy < flat_entropy - 0.5
    assert skew_held < flat_held
    assert flat_held == 10  # near-uniform shares: every client sees every class
    assert flat_entropy > 0.95 * np.log(10)


def test_dirichlet_terminates_with_min_size_on_tiny_data():
    y = synthetic_labels(n=200, classes=10, seed=0)
    n_clients = 50
    need = min(10, 200 // n_clients // 2)  # the documented cap on min_size: half the mean shard
    for seed in range(3):
        rng = np.random.default_rng(seed)
        shards = dirichlet(y, n_clients, rng, alpha=0.01)
        assert len(shards) == n_clients
        assert min(len(s) for s in shards) >= need
        joined = np.concatenate(shards)
        assert np.array_equal(np.sort(joined), np.arange(200))
    part = make_partition(y, n_clients, "dirichlet", seed=0, alpha=0.01, min_size=2)
    assert all(len(c.train) + len(c.val) + len(c.test) >= 2 for c in part.clients)
    assert np.array_equal(np.sort(np.concatenate(all_indices(part))), np.arange(200))


def test_dirichlet_min_size_honored_when_feasible(digits_labels):
    part = make_partition(digits_labels, 10, "dirichlet", seed=0, alpha=0.05, min_size=40)
    sizes = [len(c.train) + len(c.val) + len(c.test) for c in part.clients]
    assert min(sizes) >= 40


@pytest.mark.parametrize("scheme", ["dirichlet", "classes", "iid"])
def test_more_clients_than_samples_raises(scheme):
    y = np.arange(20) % 4
    with pytest.raises(PartitionError, match="21 clients but only 20"):
        make_partition(y, 21, scheme, seed=0, k=1)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan")])
def test_nonpositive_alpha_raises(alpha):
    with pytest.raises(PartitionError, match="alpha must be > 0"):
        make_partition(synthetic_labels(), 5, "dirichlet", seed=0, alpha=alpha)


def test_bad_arguments_raise():
    y = synthetic_labels()
    with pytest.raises(PartitionError):
        make_partition(y, 0, "iid")
    with pytest.raises(PartitionError):
        make_partition(y, 3, "iid", heldout_fraction=1.0)
    with pytest.raises(PartitionError):
        make_partition(y, 3, "classes", k=0)
    with pytest.raises(PartitionError):
        make_partition(y, 3, "classes", k=7)  # only 6 classes
    assert issubclass(PartitionError, ValueError)


# --------------------------------------------------------------------------- classes


@pytest.mark.parametrize("k", [1, 2, 3])
def test_classes_each_client_holds_exactly_k(labels, k):
    n_classes = len(np.unique(labels))
    part = make_partition(labels, 10, "classes", seed=2, k=k)
    counts = part.class_counts(labels, n_classes, "all")
    assert ((counts > 0).sum(1) == k).all()
    # 10 clients x k >= number of classes: every class is held by someone, all samples used.
    assert (counts.sum(0) > 0).all()
    assert counts.sum() == len(labels)


# --------------------------------------------------------------------------- iid


def test_iid_equal_sizes(digits_labels):
    part = make_partition(digits_labels, 7, "iid", seed=0, heldout_fraction=0.0)
    sizes = [len(c.train) for c in part.clients]
    assert max(sizes) - min(sizes) <= 1
    assert all(len(c.val) == len(c.test) == 0 for c in part.clients)


# --------------------------------------------------------------------------- val/test halves


@pytest.mark.parametrize("heldout", [0.2, 0.3])
@pytest.mark.parametrize("scheme, params", SCHEMES, ids=SCHEME_IDS)
def test_val_test_halves(labels, scheme, params, heldout):
    part = make_partition(labels, 10, scheme, seed=4, heldout_fraction=heldout, **params)
    assert part.heldout_fraction == heldout
    total_held = total = 0
    for c in part.clients:
        shard = np.concatenate([c.train, c.val, c.test])
        assert not set(c.val) & set(c.test) and not set(c.train) & (set(c.val) | set(c.test))
        held = [int(round(int((labels[shard] == cls).sum()) * heldout)) for cls in np.unique(labels[shard])]
        rule_val, rule_test = sum((h + 1) // 2 for h in held), sum(h // 2 for h in held)
        if not (rule_val and rule_test):  # a tiny shard: one of each from its training part (split_client)
            assert (len(c.val), len(c.test)) == (max(rule_val, 1), max(rule_test, 1)) and len(shard) >= 3
            continue
        for cls in np.unique(labels[shard]):
            n_c = int((labels[shard] == cls).sum())
            n_val = int((labels[c.val] == cls).sum())
            n_test = int((labels[c.test] == cls).sum())
            assert n_val + n_test == int(round(n_c * heldout))  # stratified per class
            assert n_val - n_test in (0, 1)  # val takes the odd sample
        assert len(c.val) >= len(c.test)
        total_held += len(c.val) + len(c.test)
        total += len(shard)
    assert abs(total_held / total - heldout) < 0.03


def test_split_client_direct():
    y = np.array([0] * 10 + [1] * 5 + [2] * 1)
    idx = np.arange(16)
    s = split_client(idx, y, 0.2, np.random.default_rng(0))
    assert len(s.val) == 1 + 1 + 0 and len(s.test) == 1 + 0 + 0
    assert len(s.train) == 16 - 3
    assert np.array_equal(np.sort(np.concatenate([s.train, s.val, s.test])), idx)


# --------------------------------------------------------------------------- a task's own groups

def test_pack_groups_makes_clients_of_whole_groups_of_about_equal_size():
    from hfl_bench.partition import pack_groups

    groups = [np.arange(0, 5), np.arange(5, 14), np.arange(14, 16), np.arange(16, 20), np.arange(20, 23)]
    # by decreasing size, each to the smaller client: 9 -> c0; 5 -> c1; 4 -> c1 (5 < 9); 3 -> c0 (9 = 9: the
    # lower client); 2 -> c1 (9 < 12)
    packed = pack_groups(groups, 2)
    assert [sorted(p.tolist()) for p in packed] == [list(range(5, 14)) + [20, 21, 22],
                                                    list(range(0, 5)) + [14, 15] + list(range(16, 20))]
    assert [len(p) for p in pack_groups(groups, 5)] == [9, 5, 4, 3, 2]  # one group each, largest first
    with pytest.raises(PartitionError, match="cannot make 6 clients of 5 whole groups"):
        pack_groups(groups, 6)


def test_given_partition_holds_a_stratified_public_set_out_of_the_groups_first():
    labels = np.repeat(np.arange(4), 50)[np.random.default_rng(0).permutation(200)]
    groups = [np.arange(i, i + 40) for i in range(0, 200, 40)]
    base = given_partition(groups, labels, seed=3)
    part = given_partition(groups, labels, seed=3, public_size=20)
    assert len(part.public) == 20 and np.bincount(labels[part.public]).tolist() == [5, 5, 5, 5]
    owned = np.concatenate([np.concatenate([c.train, c.val, c.test]) for c in part.clients])
    assert not np.isin(part.public, owned).any() and len(owned) == 180
    assert part.hash != base.hash and base.public_size == 0
    # each client keeps its own group's other samples
    for group, client in zip(groups, part.clients):
        mine = np.concatenate([client.train, client.val, client.test])
        assert set(mine.tolist()) == set(group.tolist()) - set(part.public.tolist())
    # packed: three clients of whole groups; the same packing every seed
    packed = [given_partition(groups, labels, seed=s, n_clients=3) for s in (0, 1)]
    sizes = [[len(c.train) + len(c.val) + len(c.test) for c in p.clients] for p in packed]
    assert sizes[0] == sizes[1] == [80, 80, 40]
    assert given_partition(groups, labels, seed=3, n_clients=5).hash == base.hash  # one group each: as before
