"""Capacity profiles: HeteroFL's levels a-e and the seeded draw of a level per client.

Below both the sub-model family (``hfl_bench.families.submodel``, which slices one global model at
each client's rate) and the architecture pools (``hfl_bench.pools``: a levels pool gives each
client, as its own architecture, the model built at the rate the family would give it under the
same profile and seed, ``--capacity-profile``), so the two meet on the same clients. No torch at
import: the run's settings are checked (``config.validate``) before torch loads.
"""

from __future__ import annotations

import re

from hfl_bench.errors import ConfigError

# HeteroFL's capacity levels a-e: width rates 1, 1/2, 1/4, 1/8, 1/16 (ratio 0.5 apart).
LEVELS = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}
RATE_LEVEL = {rate: level for level, rate in LEVELS.items()}
PROFILE_PART = re.compile(r"([a-e])([0-9]+)")
# The purpose the fixed draw's seed is derived under (``training.derive_seed(run_seed, CAPACITY_STREAM)``):
# one stream, so the family and a levels pool give client i the same level for one run seed.
CAPACITY_STREAM = "capacity"


def parse_profile(text: str) -> list[tuple[str, int]]:
    """``a1-b1-c1-d1-e1`` -> [(level, share)]: each level a-e at most once, shares >= 1 (ConfigError, one
    line, otherwise)."""
    parts = [p.strip() for p in str(text).split("-")]
    out: list[tuple[str, int]] = []
    for part in parts:
        m = PROFILE_PART.fullmatch(part)
        if m is None or int(m.group(2)) < 1:
            raise ConfigError(f"capacity profile {text!r}: each part is a level a-e and a share >= 1, joined by '-' "
                              f"(e.g. a1-b1-c1-d1-e1 or a1-e1); got {part!r}")
        if any(level == m.group(1) for level, _ in out):
            raise ConfigError(f"capacity profile {text!r} names level {m.group(1)} twice")
        out.append((m.group(1), int(m.group(2))))
    return out


def assign_rates(profile: list[tuple[str, int]], n_clients: int, seed: int) -> list[float]:
    """Each client's width rate: the levels' counts in proportion to their shares (largest remainder,
    ties to the earlier level), then a seeded shuffle of who gets which."""
    import torch  # here: the settings' checks import this module without torch

    total = sum(share for _, share in profile)
    exact = [n_clients * share / total for _, share in profile]
    counts = [int(x) for x in exact]
    order = sorted(range(len(profile)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:n_clients - sum(counts)]:
        counts[i] += 1
    rates = [LEVELS[level] for (level, _), k in zip(profile, counts) for _ in range(k)]
    perm = torch.randperm(n_clients, generator=torch.Generator().manual_seed(seed)).tolist()
    return [rates[p] for p in perm]
