"""The one rule that says which records are the seeds of one setting (leaderboard rows and plot
series both use it, so a figure and a row never disagree).

A **group** is every reproduced record of one setting: the same config hash (method, its
hyperparameters, task, pool, partition scheme and parameters, clients, rounds, optimizer; the
fields of ``config.NON_SEMANTIC`` such as seed, paths, device and checkpointing excluded) and the
same **method version** (``method.version``; records written before versions existed are
"unversioned", a version of their own) on the same data: numbers from two implementations of a
method are never averaged together, and the same **selection rule** (``Loaded.selection_rule``:
records run with faults before the reported round was selected on every client's validation were
selected on the honest clients' only, an oracle; their group id ends in ``!honest-val``). The
config hash leaves the data folder out and the partition hash changes with the
seed (the partition is drawn from the run seed), so neither alone says "same data": a group is
keyed on the config hash plus the data identity: task name, version, train / test sizes and the
**data fingerprint** (``task.data_fingerprint``, a hash of exactly the data the run loaded).
Records with different fingerprints never share a group; a record without one (written before
fingerprints were recorded) has the identity "unknown data" and is grouped only with records that
also lack it. If two records of one key still have the same seed but different partition hashes
(same config, different data), the key is split by partition hash. A record that failed before
its data loaded (no train size) joins its config's only data identity, or stays apart when the
config ran on several.

Within a group, the records with status ok give one seed each. A seed recorded more than once (a
seed run twice, in one folder or in two suites' folders, or one record copied: the same
``record_id``) counts once, by this rule: the **earliest-written** record (the oldest ``date``,
ISO 8601, compared as instants; a date that does not parse counts as newest), and among equal
dates the one whose file has the **lexicographically smallest resolved path**. The others are
duplicates, never averaged in. The first run of a seed stands: a later run of the same config and
version (another suite that reruns it, on another host, say) can neither replace nor pick its
outcome, and a view that reads one folder and a view that reads every folder give the group the
same figure whenever the first run is in the folder read alone (``copies_note`` says, in every
view, which copy counted and where the others are). The rule depends on neither the order the
files are found or named in nor the order of the arguments. Failed and diverged records are
counted, never averaged in.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from hfl_bench.results.loading import Loaded, selection_mark

NOT_OK = ("failed", "diverged")


def seed_order(seed: Any) -> tuple:
    """Sort key for seeds: numbers first, in order, then anything else by its text."""
    return (0, seed, "") if isinstance(seed, (int, float)) else (1, 0, str(seed))


def data_identity(r: Loaded) -> Optional[tuple]:
    """The data a run saw, as far as its record says (None for a run that failed before loading).
    The fingerprint is None in a record that has none: "unknown data", equal only to itself."""
    task = r.record.get("task") or {}
    if task.get("n_train") is None:
        return None
    return (task.get("name"), task.get("version"), task.get("n_train"), task.get("n_test"),
            task.get("data_fingerprint"))


def precedence(r: Loaded) -> tuple:
    """Sort key of the duplicate rule (module docstring): the smallest is the record that counts
    (the earliest written, then the smallest resolved path)."""
    try:
        when = dt.datetime.fromisoformat(r.date.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        instant = when.timestamp()
    except (ValueError, OverflowError, OSError):
        instant = float("inf")
    return (instant, str(Path(r.path).resolve()))


def copies_note(method: str, kept: list[Loaded], duplicates: list[Loaded]) -> str:
    """One line, the same in every view: which copy of a seed recorded twice counted, where the
    others are, and why (the duplicate rule, module docstring); "" where no seed was recorded twice."""
    if not duplicates:
        return ""
    seeds = {r.seed for r in duplicates}
    counted = sorted({_folder(r) for r in kept if r.seed in seeds})
    left = sorted({_folder(r) for r in duplicates})
    return (f"{method}: {len(duplicates)} later cop{'y' if len(duplicates) == 1 else 'ies'} of seeds recorded "
            f"twice not counted ({', '.join(left)}); each seed's earliest-written record counts "
            f"({', '.join(counted)})")


def _folder(r: Loaded) -> str:
    """A record's folder as the view was given it (relative where the path was), never resolved,
    so no machine path is printed."""
    return Path(r.path).parent.as_posix()


def group_key(r: Loaded, data: Optional[tuple], by_partition: bool) -> tuple:
    """The key of the group ``r`` belongs to: config hash and data identity, and the partition hash
    where the setting has to be split by it. ``data`` is ``r``'s data identity, or the one its
    config ran on when ``r`` failed before loading; ``group_seeds`` works both out."""
    return (r.config_hash, r.method_version, data, by_partition, r.partition_hash if by_partition else None,
            r.selection_rule)


@dataclass
class SeedGroup:
    """The reproduced records of one setting and the seeds they give."""

    # the config hash, "@<method version>", "!<selection mark>" (another rule) and "/<partition hash>"
    # (when split by it) appended
    group_id: str
    records: list[Loaded]  # every member, any status
    split_by_partition: bool
    ok: list[Loaded] = field(default_factory=list)  # one per seed (the newest), in seed order
    duplicates: list[Loaded] = field(default_factory=list)  # older runs (or copies) of an ok seed
    n_failed: int = 0
    n_diverged: int = 0

    @property
    def config_hash(self) -> Optional[str]:
        return self.records[0].config_hash

    @property
    def method_version(self) -> Optional[str]:
        return self.records[0].method_version

    @property
    def selection_rule(self) -> str:
        return self.records[0].selection_rule

    @property
    def seeds(self) -> list[Any]:
        return [r.seed for r in self.ok]

    def describing(self) -> Loaded:
        """A record that ran, to describe the setting by (a failed one may lack partition and
        federation blocks)."""
        return next((r for r in self.records if r.record.get("partition")), self.records[0])

    def kept_for(self, duplicate: Loaded) -> Loaded:
        """The record that stands for ``duplicate``'s seed."""
        return next(r for r in self.ok if r.seed == duplicate.seed)


def group_seeds(records: Iterable[Loaded]) -> list[SeedGroup]:
    """Group the reproduced records (published ones are left out), in order of first appearance."""
    members: dict[tuple, list[Loaded]] = defaultdict(list)
    for same_config in _by_config(records):
        data = _data_identities(same_config)
        split = _needs_partition_split(same_config, data)
        for r in same_config:
            members[group_key(r, data[id(r)], split[data[id(r)]])].append(r)
    return [_seed_group(rs, split=by_partition) for (_, _, _, by_partition, _, _), rs in members.items()]


def _by_config(records: Iterable[Loaded]) -> list[list[Loaded]]:
    by_config: dict[Any, list[Loaded]] = defaultdict(list)
    for r in records:
        if r.kind == "reproduced":
            by_config[(r.config_hash, r.method_version)].append(r)
    return list(by_config.values())


def _data_identities(same_config: list[Loaded]) -> dict[int, Optional[tuple]]:
    """Each record's data identity; a record that failed before its data loaded has none and
    takes the only identity its config ran on, or stays apart when there are several."""
    own = {id(r): data_identity(r) for r in same_config}
    known = {d for d in own.values() if d is not None}
    only = next(iter(known)) if len(known) == 1 else None
    return {key: (d if d is not None else only) for key, d in own.items()}


def _needs_partition_split(same_config: list[Loaded], data: dict[int, Optional[tuple]]) -> dict:
    """Per data identity: does one seed appear with two partition hashes (different data that
    the record cannot otherwise tell apart)?"""
    hashes: dict[tuple, set] = defaultdict(set)
    for r in same_config:
        if r.partition_hash is not None:
            hashes[(data[id(r)], r.seed)].add(r.partition_hash)
    split: dict[Optional[tuple], bool] = defaultdict(bool)
    for (identity, _seed), seen in hashes.items():
        split[identity] |= len(seen) > 1
    return split


def _seed_group(records: list[Loaded], split: bool) -> SeedGroup:
    g = SeedGroup(group_id="", records=records, split_by_partition=split)
    first = g.describing()
    version = f"@{first.method_version}" if first.method_version else ""
    mark = f"!{m}" if (m := selection_mark(first.selection_rule)) else ""
    g.group_id = (first.config_hash or "?") + version + mark + (f"/{first.partition_hash}" if split else "")
    counted: dict[Any, Loaded] = {}
    for r in records:
        if r.status in NOT_OK:
            g.n_failed += r.status == "failed"
            g.n_diverged += r.status == "diverged"
            continue
        if r.status != "ok":  # no status the schema knows: neither a seed nor a failure
            continue
        kept = counted.get(r.seed)  # a seed recorded twice: keep the earliest written, then the smallest path
        if kept is not None and precedence(r) >= precedence(kept):
            g.duplicates.append(r)
            continue
        if kept is not None:
            g.duplicates.append(kept)
        counted[r.seed] = r
    g.ok = [counted[s] for s in sorted(counted, key=seed_order)]
    return g
