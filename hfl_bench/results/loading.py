"""Reading records in bulk: the one walker over files and folders, and the one reader behind the
leaderboard, the plots and ``leaderboard validate``. Files that are not records are reported with
a reason, never dropped in silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from hfl_bench.config import POOLED_SELECTION_RULE, SELECTION_RULE
from hfl_bench.paths import in_tracker_output
from hfl_bench.record.io import NotARecord, load_record

# The rule that selected a record run with --faults before selection under faults read every
# client's validation (``faults.selection: "honest"``): the honest clients' mean validation
# accuracy, which no server can know. Such records are never grouped with, nor ranked against,
# records of ``config.SELECTION_RULE`` (``grouping``, ``SettingGroup.protocol``).
HONEST_SELECTION = "best_mean_honest_val"
# How a group id, a protocol label and the setting column mark a rule other than SELECTION_RULE.
# A pooled-validation record (one class per client's validation half) is its own protocol anyway.
SELECTION_MARKS = {HONEST_SELECTION: "honest-val", POOLED_SELECTION_RULE: "pooled-val"}


def selection_mark(rule: str) -> str:
    """"" for ``config.SELECTION_RULE``; a short name for any other rule (``honest-val``, ``pooled-val``)."""
    return "" if rule == SELECTION_RULE else SELECTION_MARKS.get(rule, rule)


class ResultsError(ValueError):
    """Bad input to the results layer (a path that does not exist, nothing to draw); the message
    is meant for the user."""


@dataclass
class Loaded:
    """One record file that was read, with the fields the results layer groups and labels by."""

    path: Path
    record: dict[str, Any] = field(repr=False)

    def _block(self, name: str) -> dict[str, Any]:
        value = self.record.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def record_id(self) -> str:
        return str(self.record.get("record_id"))

    @property
    def task(self) -> str:
        return str(self._block("task").get("name"))

    @property
    def method(self) -> str:
        return str(self._block("method").get("name"))

    @property
    def method_version(self) -> Optional[str]:
        """The method's version (schema 1.2); None in an older record ("unversioned")."""
        version = self._block("method").get("version")
        return version if isinstance(version, str) else None

    @property
    def selection_rule(self) -> str:
        """The rule that selected the reported round: ``selection.rule``, except a record run with
        faults whose ``faults.selection`` is ``honest`` (``HONEST_SELECTION``: written before the
        rule under faults was every client's validation, ``config.SELECTION_RULE``)."""
        if self._block("faults").get("selection") == "honest":
            return HONEST_SELECTION
        rule = self._block("selection").get("rule")
        return rule if isinstance(rule, str) else "unknown"

    @property
    def commit(self) -> Optional[str]:
        """The git commit the run's code was at (None when it ran outside a checkout)."""
        sha = self._block("code").get("git_sha")
        return sha if isinstance(sha, str) else None

    @property
    def config_hash(self) -> Optional[str]:
        """The config hash, in canonical form (an older record's is mapped by its upgrade,
        ``record.identity``)."""
        value = self.record.get("config_hash")
        return value if isinstance(value, str) else None

    @property
    def seed(self) -> Any:
        """The run seed: the config's, else the python seed, else -1 (a record that names none)."""
        return self._block("config").get("seed", self._block("seeds").get("python", -1))

    @property
    def partition_hash(self) -> Optional[str]:
        return self._block("partition").get("hash")

    @property
    def status(self) -> Any:
        return self.record.get("status")

    @property
    def kind(self) -> str:
        """reproduced (a run of this suite) or published (a figure from a paper)."""
        return self._block("source").get("kind", "reproduced")

    @property
    def date(self) -> str:
        return str(self.record.get("date") or "")


@dataclass
class Skipped:
    """A file or record left out, and why."""

    path: str
    reason: str  # short; the path is shown beside it
    message: str = ""  # the full sentence, path included; the reason when empty
    task: Optional[str] = None  # None: not a record, so it belongs to no task

    def line(self) -> str:
        return self.message or f"{self.path}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "reason": self.reason}


# The sidecar ``plot`` writes beside each figure (``KIND__TASK.png.sources.json``): not a record.
SIDECAR_SUFFIX = ".sources.json"


def record_files(paths: Iterable[str | Path]) -> list[Path]:
    """The JSON files named, or found (recursively) under folders, each once, in a stable order;
    a folder's plot sidecars and the experiment trackers' files (``trackers/<tracker>/`` below it:
    ``paths.in_tracker_output``, which hold copies of records) are left out (a file named explicitly
    is read). Raises ResultsError for a path that does not exist."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(q for q in p.rglob("*.json") if q.is_file() and not q.name.endswith(SIDECAR_SUFFIX)
                            and not in_tracker_output(q.relative_to(p).parts[:-1]))
        elif p.is_file():
            files.append(p)
        else:
            raise ResultsError(f"no such file or folder: {p}")
    seen: set[Path] = set()
    unique = []
    for f in files:  # a file named twice (or under two named folders) would count twice
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append(f)
    return unique


def read_records(files: Iterable[Path]) -> tuple[list[Loaded], list[Skipped]]:
    """Every file that holds a record, and one Skipped per file that does not."""
    loaded: list[Loaded] = []
    skipped: list[Skipped] = []
    for f in files:
        try:
            loaded.append(Loaded(f, load_record(f)))
        except NotARecord as e:
            skipped.append(Skipped(str(f), e.reason, str(e)))
    return loaded, skipped


def load_records(paths: Iterable[str | Path]) -> tuple[list[Loaded], list[Skipped]]:
    """The records under ``paths`` (files or folders) and the files skipped."""
    return read_records(record_files(paths))
