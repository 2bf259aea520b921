"""The Python API, re-exported from ``hfl_bench``: run a method on a task from a script or a
notebook and read records back, on the same code paths as the command line.

- ``run(method=..., task=..., **settings)`` (or ``run(config=RunConfig(...))``) is ``hfl-bench run``:
  the same resolved run (``hfl_bench.resolved``) on the same run path (``hfl_bench.runpath``: the
  claim, the same-data check, the atomic write), the same record file with the same name and
  config hash, and the project's own exceptions with the same one-line messages (``ConfigError``
  and its kin). It returns a ``RunRecord``.
- ``load_records(folder)``: the records under a folder (or file), as ``RunRecord``s.
- ``group(records)``: the leaderboard's groups (one setting and method version over its seeds);
  ``compare(records, against=...)``: the leaderboard's paired comparison (``leaderboard compare``).
- ``plot(folder, kind="curves", out=...)``: ``hfl-bench plot``'s figures.
- ``RunRecord.to_frame()``, ``Records.to_frame()`` and ``comparison_frame(tables)``: pandas frames,
  where pandas is installed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from hfl_bench.config import ConfigError, RunConfig


class RecordNotSaved(ConfigError):
    """A run finished but its record could be written nowhere; ``record`` holds it."""

    def __init__(self, message: str, record: dict[str, Any]):
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class Selected:
    """The figures at the selected round (the round with the best mean validation accuracy)."""

    round: Optional[int]
    global_acc: Optional[float]
    local_acc: Optional[float]
    mean_val_acc: Optional[float]


@dataclass(frozen=True)
class ClientFigures:
    """One client's figures at the selected round."""

    cid: int
    arch: Optional[str]
    global_acc: Optional[float]
    local_acc: Optional[float]
    val_acc: Optional[float]


class RunRecord:
    """A typed view of one record (the dict is ``data``, as written; nothing is copied or
    recomputed): its headline, selected-round and per-client figures and its history."""

    def __init__(self, data: dict[str, Any], path: Optional[Path] = None):
        self.data = data
        self.path = Path(path) if path is not None else None

    def _block(self, name: str) -> dict[str, Any]:
        value = self.data.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def status(self) -> Optional[str]:
        return self.data.get("status")

    @property
    def error(self) -> Optional[str]:
        return self.data.get("error")

    @property
    def method(self) -> Optional[str]:
        return self._block("method").get("name")

    @property
    def method_version(self) -> Optional[str]:
        return self._block("method").get("version")

    @property
    def task(self) -> Optional[str]:
        return self._block("task").get("name")

    @property
    def seed(self) -> Any:
        return self._block("config").get("seed")

    @property
    def config_hash(self) -> Optional[str]:
        return self.data.get("config_hash")

    @property
    def config(self) -> dict[str, Any]:
        return self._block("config")

    @property
    def headline(self) -> Optional[float]:
        """The headline global accuracy (%): the mean over the final evaluated rounds of the headline's
        clients (all; the honest ones under faults; the recipients of a multimodal run), as every
        leaderboard view shows it (``results.headline``)."""
        from hfl_bench.results.figures import headline_value

        return headline_value(self.data)

    @property
    def headline_clients(self) -> str:
        """Whose figure the headline is: all, honest or recipients."""
        from hfl_bench.results.figures import headline_of

        return headline_of(self.data)

    @property
    def selected(self) -> Selected:
        m = self._block("metrics")
        return Selected(self._block("selection").get("round"), m.get("global_acc"), m.get("local_acc"),
                        m.get("mean_val_acc"))

    @property
    def per_client(self) -> list[ClientFigures]:
        rows = self._block("metrics").get("per_client") or []
        return [ClientFigures(c.get("cid"), c.get("arch"), c.get("global_acc"), c.get("local_acc"), c.get("val_acc"))
                for c in rows if isinstance(c, dict)]

    @property
    def history(self) -> list[dict[str, Any]]:
        """The per-round entries (round 0 is the initial models)."""
        history = self.data.get("history")
        return history if isinstance(history, list) else []

    def curve(self, figure: str = "global_acc") -> list[tuple[int, float]]:
        """``(round, value)`` of each round whose history entry has ``figure`` (a test round, for
        the test figures)."""
        return [(e["round"], e[figure]) for e in self.history
                if isinstance(e, dict) and isinstance(e.get(figure), (int, float)) and isinstance(e.get("round"), int)]

    @property
    def bytes_per_client_per_round(self) -> Optional[float]:
        return self._block("cost").get("bytes_sent_per_client_per_round")

    def to_frame(self):
        """The history as a pandas DataFrame, one row per round (needs pandas)."""
        pd = _pandas()
        return pd.DataFrame([{k: v for k, v in e.items() if not isinstance(v, (dict, list))}
                             for e in self.history if isinstance(e, dict)])

    def __repr__(self) -> str:
        headline = f"{self.headline:.2f}" if isinstance(self.headline, (int, float)) else "-"
        return (f"RunRecord({self.method} on {self.task}, seed {self.seed}, {self.status}, "
                f"headline {headline}, {self.path or 'not written'})")


class Records(list):
    """``RunRecord``s read from files, with the files that were not records (``skipped``: one
    line each, why)."""

    def __init__(self, records: Iterable[RunRecord] = (), skipped: Iterable[str] = ()):
        super().__init__(records)
        self.skipped = list(skipped)

    def to_frame(self):
        """One row per record: method, version, task, seed, status, config hash, headline, the
        selected round and its figures, bytes per client per round, file (needs pandas)."""
        pd = _pandas()
        return pd.DataFrame([{"method": r.method, "version": r.method_version, "task": r.task, "seed": r.seed,
                              "status": r.status, "config_hash": r.config_hash, "headline": r.headline,
                              "selected_round": r.selected.round, "selected_global_acc": r.selected.global_acc,
                              "selected_local_acc": r.selected.local_acc,
                              "bytes_per_client_per_round": r.bytes_per_client_per_round,
                              "path": str(r.path) if r.path else None} for r in self])


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("to_frame needs pandas: pip install pandas") from None
    return pandas


def run(config: Optional[RunConfig] = None, *, trackers: Iterable[str] = (), resume: bool = False,
        threads: Optional[int] = None, progress: Optional[Callable[[int, int, dict[str, Any]], None]] = None,
        **settings: Any) -> RunRecord:
    """Run one method on one task and write one record, as ``hfl-bench run`` does.

    ``settings`` are ``RunConfig``'s fields (``method``, ``task``, ``rounds``, ``out``,
    ``method_params={...}``, ...), over ``config`` when both are given. ``trackers``: tracker names
    (``tensorboard``, ``mlflow``, ``wandb``; ``hfl_bench.trackers``). ``threads``: torch threads
    for the run (default as the command line's: 1 unless the models are large and cores idle),
    restored afterwards. ``progress(round, rounds, entry)`` is called after each round.

    Bad input raises ``ConfigError`` (or a subclass, or ``RegistryError``, ``DatasetError``) with
    the command line's one-line message. A finished run returns its record, whatever its status
    (``ok``, ``diverged``, or ``failed`` when the record could not be built); a record that could
    be written only to a fallback folder is returned with that path and a warning; one that could
    be written nowhere raises ``RecordNotSaved``, which holds it.

    Runs in one process run one at a time: ``run`` called from several threads (a thread pool
    over a sweep) waits while another thread's run is in progress, then runs exactly as it would
    have run alone, so each record holds the figures a sequential run gives. A run draws from
    process-wide state (torch's and numpy's global random streams, torch's thread count), so
    interleaved runs would each compute figures neither computes alone (``engine.RUN_LOCK``). For
    runs in parallel use processes: a suite's matrix with worker processes
    (``hfl-bench matrix SUITE --jobs N``), or one process per run."""
    import warnings

    from hfl_bench import runpath
    from hfl_bench.engine import RUN_LOCK
    from hfl_bench.resolved import resolve_run
    from hfl_bench.trackers import Trackers

    if config is not None and not isinstance(config, RunConfig):
        raise ConfigError(f"config must be a RunConfig, got {type(config).__name__}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be >= 1, got {threads}")
    chosen = Trackers(trackers)
    # resolving builds the method (its constructor may draw from the global streams): in the lock too
    with RUN_LOCK:
        # the settings over the config's; checked, resolved and named once (an unknown one: ConfigError)
        resolved = resolve_run({**(dataclasses.asdict(config) if config is not None else {}), **settings})
        saved = runpath.run_resolved(resolved, progress=progress, resume=resume, trackers=chosen,
                                     threads=threads).saved
    if saved.path is None:
        raise RecordNotSaved(f"the record {saved.problem}", saved.record)
    if saved.fallback:
        warnings.warn(f"the record {saved.problem}", RuntimeWarning, stacklevel=2)
    return RunRecord(saved.record, saved.path)


def load_records(*paths: str | Path) -> Records:
    """The records in the given files and under the given folders (recursively), as ``RunRecord``s;
    files that are not records are listed in ``skipped``. A path that does not exist raises
    ``ResultsError`` (one line)."""
    from hfl_bench.results.loading import load_records as load

    loaded, skipped = load(paths)
    return Records((RunRecord(r.record, r.path) for r in loaded), (s.line() for s in skipped))


def _loaded(records: Iterable[RunRecord]):
    from hfl_bench.results.board import board_records
    from hfl_bench.results.loading import Loaded

    items = [r if not isinstance(r, RunRecord) else Loaded(r.path or Path(f"<{r.method} seed {r.seed}>"), r.data)
             for r in records]
    valid, _ = board_records(items)
    return valid


def group(records: Iterable[RunRecord]) -> list:
    """The leaderboard's groups of ``records`` (``results.setting.SettingGroup``: one setting and
    method version, its ok seeds as ``ok``, the headline statistics by ``results.headline``);
    records that fail validation are left out, as the leaderboard leaves them."""
    from hfl_bench.results.board import build_groups

    return build_groups(_loaded(records))


def compare(records: Iterable[RunRecord], against: str, methods: Iterable[str] = (),
            figure: Optional[str] = None) -> list:
    """``hfl-bench leaderboard compare --against``: each method's group paired by seed against the
    ``against`` method's group in each protocol where it ran (mean difference, 95% interval,
    sign-flip p, Holm's adjustment): a list of ``results.paired.Table``; ``Table.as_dict()`` is the
    command's JSON. ``ComparisonError`` when ``against`` ran nowhere."""
    from hfl_bench.results.paired import ComparisonError
    from hfl_bench.results.paired import against as paired_against

    groups = group(records)
    if not any(g.method == against for g in groups):  # say what is there and what to run (a notebook's first compare)
        held = ", ".join(sorted({g.method for g in groups})) or "none"
        raise ComparisonError(f"no records of {against} to compare against (the records hold: {held}); run "
                              f"{against} on the same task and seeds first, e.g. hfl_bench.run(method={against!r}, "
                              "task=..., seed=..., out=...)")
    return paired_against(groups, against, methods, figure)


def plot(*paths: str | Path, kind: str = "curves", out: str | Path = "plots", tasks: Iterable[str] = (),
         methods: Iterable[str] = ()) -> list[Path]:
    """``hfl-bench plot KIND PATHS --out OUT``: one PNG per kind, task and setting drawn from the
    records under ``paths`` (``curves``: the global accuracy per round, mean and band over the
    seeds; ``per-class``, ``per-arch``, ``seen-unseen``, ``bytes``, ``robustness``, ``cd``, ``all``).
    Returns the PNG paths; ``PlotError`` (one line) for bad input."""
    from hfl_bench.results.plots import make_plots

    written, _ = make_plots(kind, [Path(p) for p in paths], Path(out), list(tasks), list(methods))
    return [w.png for w in written]


def comparison_frame(tables: list) -> Any:
    """The comparisons of ``compare`` as a pandas frame, one row per compared group: the columns of
    ``leaderboard compare --json`` (``a``, ``b``, ``n``, ``mean_difference``, ``ci95``, ``p_sign_flip``,
    ``p_holm``, ``verdict`` ...) less the pairing details, with the table's task and protocol (needs pandas)."""
    pd = _pandas()
    rows = []
    for t in tables:
        for c in t.as_dict()["comparisons"]:
            rows.append({"task": t.task, "protocol": t.protocol, "reference": t.reference.label,
                         **{k: v for k, v in c.items() if k != "pairing"}})
    return pd.DataFrame(rows)
