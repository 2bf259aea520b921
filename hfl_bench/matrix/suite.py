"""Suite files: parsing and checking one, and expanding it into cells (one resolved RunConfig
each, so a cell's record path is known before it runs). The format is in the package docstring.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from hfl_bench import config as config_mod
from hfl_bench import paths
from hfl_bench.config import ConfigError, RunConfig, read_yaml_mapping
from hfl_bench.matrix.cells import error_text
from hfl_bench.resolved import ResolvedRun, resolve_run

SUITE_KEYS = ("name", "description", "out", "methods", "tasks", "seeds", "faults", "settings",
              "task_overrides", "method_overrides", "trackers")
# Set by the suite's axes and its ``out``, so not allowed among the settings.
AXIS_FIELDS = ("method", "task", "seed", "out")
SETTING_KEYS = tuple(k for k in config_mod.FIELDS if k not in AXIS_FIELDS)


@dataclass
class Suite:
    """A parsed suite file: the axes, shared settings and overrides. ``faults`` is the optional
    fault axis: canonical specs, ``""`` for no faults; ``[None]`` when the suite has no such axis
    (a ``faults`` setting, if any, then applies as any other setting)."""

    name: str
    methods: list[str]
    tasks: list[str]
    seeds: list[Optional[int]]
    faults: list[Optional[str]] = field(default_factory=lambda: [None])
    out: str = "runs"
    description: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    task_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A method's override, or its variants: a list of overrides, each one run of the method per
    # task, seed and fault setting (``variants``).
    method_overrides: dict[str, dict[str, Any] | list[dict[str, Any]]] = field(default_factory=dict)
    # Experiment trackers every cell's record is logged to (``hfl_bench.trackers``; never hashed).
    trackers: list[str] = field(default_factory=list)

    def variants(self, method: str) -> list[dict[str, Any]]:
        """The method's overrides, one per variant: ``[override]`` (``[{}]`` without one), or its list."""
        override = self.method_overrides.get(method, {})
        return list(override) if isinstance(override, list) else [override]


@dataclass
class Cell:
    """One run of the matrix. ``cfg`` is resolved against the task's defaults and ``run`` is its
    ``ResolvedRun`` (``hfl_bench.resolved``: what the run path takes); when resolution failed (an
    unknown task or method, a bad setting) ``run`` is None, ``cfg`` is as far as it resolved and
    ``error`` says why."""

    cfg: RunConfig
    error: Optional[str] = None
    # The method's variant (``variant_text`` of its override) when the suite lists several; else "".
    variant: str = ""
    run: Optional[ResolvedRun] = None

    @property
    def label(self) -> str:
        variant = f" [{self.variant}]" if self.variant else ""
        faults = f", faults {self.cfg.faults}" if self.cfg.faults else ""
        return f"{self.cfg.method}{variant} on {self.cfg.task}, seed {self.cfg.seed}{faults}"

    def record_path(self) -> Path:
        return self.run.record_path if self.run is not None else paths.record_path(self.cfg)


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; raises ConfigError with a one-line message."""
    path = Path(path)
    data = read_yaml_mapping(path, "suite file", f"(keys: {', '.join(SUITE_KEYS)})")
    return parse_suite(data, default_name=path.stem, where=str(path))


def parse_suite(data: dict[str, Any], default_name: str = "suite", where: str = "suite") -> Suite:
    _check_keys(data, SUITE_KEYS, where)
    methods = _names(data, "methods", where)
    tasks = _names(data, "tasks", where)
    seeds = _seeds(data.get("seeds"), where)
    faults = _faults(data.get("faults"), where)
    axis = faults != [None]
    settings = _settings(data.get("settings"), f"{where}: settings", faults_axis=axis)
    task_overrides = _overrides(data, "task_overrides", tasks, "tasks", where, faults_axis=axis)
    method_overrides = _overrides(data, "method_overrides", methods, "methods", where, faults_axis=axis)
    out = data.get("out", "runs")
    if not isinstance(out, str) or not out.strip():
        raise ConfigError(f"{where}: out must be a folder path, got {out!r}")
    trackers = data.get("trackers") or []
    if not isinstance(trackers, (list, str)):
        raise ConfigError(f"{where}: trackers must be a list of tracker names, got {trackers!r}")
    from hfl_bench.trackers import check_names

    return Suite(name=str(data.get("name") or default_name), methods=methods, tasks=tasks, seeds=seeds,
                 faults=faults, out=out, description=str(data.get("description") or ""), settings=settings,
                 task_overrides=task_overrides, method_overrides=method_overrides,
                 trackers=check_names(trackers, f"{where}: trackers"))


def _check_keys(data: dict[str, Any], known: Iterable[str], where: str) -> None:
    known = tuple(known)
    unknown = sorted(str(k) for k in set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}. Known: {', '.join(known)}")


def _names(data: dict[str, Any], key: str, where: str) -> list[str]:
    names = data.get(key)
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{where}: {key} must be a non-empty list of names, got {names!r}")
    _no_duplicates(names, key, where)
    for name in names:  # each becomes part of a record's file name: refuse x/../../elsewhere here
        try:
            paths.check_name(name, key[:-1])
        except paths.UnsafePathError as e:
            raise ConfigError(f"{where}: {key}: {e}") from None
    return names


SEED_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")
# At most this many seeds in a suite (ranges and lists together), and cells in a matrix: checked
# before a seed list or a cell is built. ``0-99999999`` (a typo for 0-9) would otherwise build a
# hundred million cells, gigabytes of memory, before anything could be refused.
MAX_SEEDS = 10_000
MAX_CELLS = 100_000


def _too_many_seeds(n: int, where: str, text: Any) -> ConfigError:
    return ConfigError(f"{where}: {n:,} seeds ({text!r}) is more than the {MAX_SEEDS:,} a suite may have: "
                       "a typo (0-99999999 for 0-9)? Split a larger study into several suites")


def parse_seeds(text: str, where: str = "--seeds") -> list[int]:
    """Seeds written as a range ``0-9`` (inclusive), a comma list ``0,1,2``, or a mix ``0-4,7``;
    at most ``MAX_SEEDS`` of them, counted before any range is expanded."""
    spans: list[tuple[int, int]] = []
    for part in str(text).split(","):
        if (m := SEED_RANGE.fullmatch(part)) and int(m.group(1)) <= int(m.group(2)):
            spans.append((int(m.group(1)), int(m.group(2))))
        elif part.strip().isdigit():
            spans.append((int(part), int(part)))
        else:
            raise ConfigError(f"{where}: seeds must be a range such as 0-9, a list such as 0,1,2 or both "
                              f"(0-4,7), got {text!r}")
    count = sum(last - first + 1 for first, last in spans)
    if count > MAX_SEEDS:
        raise _too_many_seeds(count, where, text)
    seeds = [seed for first, last in spans for seed in range(first, last + 1)]
    _no_duplicates(seeds, "seeds", where)
    return seeds


def _seeds(seeds: Any, where: str) -> list[Optional[int]]:
    if seeds is None:
        return [None]  # each task's default seed
    if isinstance(seeds, str):  # a range: 0-9
        return list(parse_seeds(seeds, f"{where}: seeds"))
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds):
        raise ConfigError(f"{where}: seeds must be a non-empty list of integers, got {seeds!r}")
    if len(seeds) > MAX_SEEDS:
        raise _too_many_seeds(len(seeds), where, f"a list of {len(seeds)}")
    _no_duplicates(seeds, "seeds", where)
    return seeds


def _faults(specs: Any, where: str) -> list[Optional[str]]:
    """The fault axis: a list of fault specs (``none`` for no faults), each checked and written
    canonically (README Faults); ``[None]`` when the suite has none."""
    if specs is None:
        return [None]
    from hfl_bench.faults import parse_faults  # here: reading a suite without faults loads no torch

    if isinstance(specs, str):
        specs = [specs]
    if not isinstance(specs, list) or not specs or not all(isinstance(x, str) or x is None for x in specs):
        raise ConfigError(f"{where}: faults must be a non-empty list of fault specs (none for no faults), "
                          f"got {specs!r}")
    canonical = []
    for text in specs:
        spec = parse_faults(text)  # ConfigError, one line, naming the spec
        canonical.append("" if spec is None else spec.canonical)
    _no_duplicates([c or "none" for c in canonical], "faults", where)
    return canonical


def _no_duplicates(items: list, key: str, where: str) -> None:
    counts = Counter(items)  # linear: a long list costs no quadratic scan
    repeated = sorted({str(x) for x, n in counts.items() if n > 1})
    if repeated:
        raise ConfigError(f"{where}: {key} lists {', '.join(repeated)} more than once")


def _settings(values: Any, where: str, faults_axis: bool = False) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping of run settings, got {values!r}")
    for axis in AXIS_FIELDS + (("faults",) if faults_axis else ()):
        if axis in values:
            hint = ("the suite's top-level out" if axis == "out" else "the suite's faults list" if axis == "faults"
                    else f"the suite's {axis}s list")
            raise ConfigError(f"{where}: {axis!r} is set by {hint}, not here")
    _check_keys(values, SETTING_KEYS, where)
    config_mod.empty_faults_as_none(values)
    params = values.get("method_params")
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"{where}: method_params must be a mapping, got {params!r}")
    return dict(values)


def _overrides(data: dict[str, Any], key: str, names: list[str], axis: str, where: str,
               faults_axis: bool = False) -> dict[str, dict]:
    raw = data.get(key) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {key} must map names to settings, got {raw!r}")
    stray = sorted(set(raw) - set(names))
    if stray:  # most likely a typo: an override that would never apply
        raise ConfigError(f"{where}: {key} names {', '.join(map(str, stray))}, not in the suite's {axis} "
                          f"({', '.join(names)})")
    if key != "method_overrides":
        return {name: _settings(values, f"{where}: {key}.{name}", faults_axis) for name, values in raw.items()}
    return {name: _variants(values, f"{where}: {key}.{name}", faults_axis) if isinstance(values, list)
            else _settings(values, f"{where}: {key}.{name}", faults_axis) for name, values in raw.items()}


def _variants(values: list, where: str, faults_axis: bool) -> list[dict[str, Any]]:
    """A method's variants: a non-empty list of overrides (``{}`` or an empty entry: the method as
    the other layers leave it), each listed once."""
    if not values:
        raise ConfigError(f"{where}: a list of variants must hold at least one override ({{}}: the method as is)")
    variants = [_settings(v, f"{where}[{i}]", faults_axis) for i, v in enumerate(values)]
    _no_duplicates([variant_text(v) for v in variants], "variants", where)
    return variants


def variant_text(override: dict[str, Any]) -> str:
    """An override in one line, for the summary's variant column: ``key=value`` for each setting and
    each hyperparameter (``eval=current, wsm=false``); ``defaults`` for an empty one."""
    items = [(k, v) for k, v in override.items() if k != "method_params"]
    items += list((override.get("method_params") or {}).items())
    shown = [f"{k}={'true' if v is True else 'false' if v is False else 'none' if v is None else v}" for k, v in items]
    return ", ".join(shown) or "defaults"


def merge_settings(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; ``method_params`` mappings are merged key by key."""
    merged: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "method_params":
                params.update(value or {})
            else:
                merged[key] = value
    merged["method_params"] = params
    return merged


def _pools(suite: Suite) -> list[tuple[str, str]]:
    """Every architecture pool the suite names, with where: its settings, a task's or a method's
    override (or one of a method's variants)."""
    layers = [("settings", suite.settings)]
    layers += [(f"task_overrides: {t}", o) for t, o in suite.task_overrides.items()]
    for m, o in suite.method_overrides.items():
        layers += [(f"method_overrides: {m}", v) for v in (o if isinstance(o, list) else [o])]
    return [(where, layer["pool"]) for where, layer in layers if isinstance(layer.get("pool"), str)]


def check_names(suite: Suite, where: str = "") -> None:
    """Every method, task and pool the suite names is registered: the first that is not is one
    ConfigError with the registry's did-you-mean line, before any cell runs or any record is
    written (a typo is a bad command line, not a column of failed cells)."""
    from hfl_bench.registry import METHODS, POOLS, TASKS

    where = f"{where or 'suite ' + suite.name}: "
    named = [("methods", METHODS, n) for n in suite.methods] + [("tasks", TASKS, n) for n in suite.tasks]
    named += [(f"{w}: pool", POOLS, n) for w, n in _pools(suite)]
    for key, registry, name in named:
        if name not in registry:
            raise ConfigError(f"{where}{key}: {registry.unknown_message(name)}")


def suite_cells(suite: Suite, out: str | Path | None = None) -> list[Cell]:
    """Every cell, task by task, fault setting by fault setting (in the suite's order, so the
    runs without faults, listed first, finish first), method by method, seed by seed (the
    summary's order). An unregistered method, task or pool is refused first (``check_names``)."""
    check_names(suite)
    folder = str(out if out is not None else suite.out)
    n = len(suite.tasks) * len(suite.faults) * len(suite.methods) * len(suite.seeds)
    if n > MAX_CELLS:  # before any cell is built (each resolves its task)
        raise ConfigError(f"the matrix has {n:,} cells ({len(suite.tasks)} tasks x {len(suite.faults)} fault "
                          f"settings x {len(suite.methods)} methods x {len(suite.seeds)} seeds), more than "
                          f"{MAX_CELLS:,}: split it into several suites")
    cells = []
    for task in suite.tasks:
        for faults in suite.faults:
            for method in suite.methods:
                variants = suite.variants(method)
                for override in variants:  # a method's variants in the listed order
                    values = merge_settings(suite.settings, suite.task_overrides.get(task, {}), override)
                    if faults is not None:
                        values["faults"] = faults
                    variant = variant_text(override) if isinstance(suite.method_overrides.get(method), list) else ""
                    for seed in suite.seeds:
                        cell = resolve_cell(dict(values, method=method, task=task, seed=seed, out=folder))
                        cell.variant = variant
                        cells.append(cell)
    _one_cell_per_record(suite, cells)
    return cells


def _one_cell_per_record(suite: Suite, cells: list[Cell]) -> None:
    """Refuse two cells that are one run (the same record path: the same config once resolved, e.g.
    a variant that sets a hyperparameter to its default beside the plain method)."""
    seen: dict[Path, Cell] = {}
    for cell in cells:
        if cell.error is not None:
            continue
        try:
            path = cell.record_path()
        except ValueError:  # a name that cannot be a file name: that cell fails on its own
            continue
        if path in seen:
            raise ConfigError(f"suite {suite.name}: {seen[path].label} and {cell.label} are the same run (one "
                              f"config, one record {path.name}); list each variant once")
        seen[path] = cell


def resolve_cell(values: dict[str, Any]) -> Cell:
    """Resolve one cell (``resolve_run``: the task's defaults, the method and its hyperparameters,
    the record path); a failure is kept on the cell, not raised, so the matrix can record it as a
    failed cell and go on. Its record is then named by the config as far as it resolves."""
    from hfl_bench import engine

    cfg = RunConfig(**values)
    try:
        run = resolve_run(cfg)
    except Exception as e:  # noqa: BLE001 - any cell problem becomes that cell's failed record
        try:
            _, cfg = engine.load_task(cfg)  # e.g. an unknown method: the task's defaults still apply
        except Exception:  # noqa: BLE001
            pass
        return Cell(cfg, error_text(e, with_traceback=False))
    return Cell(run.cfg, run=run)


def expected_filename(cfg: RunConfig) -> str:
    """The file name ``write_record`` will give this config's record."""
    return paths.record_path(cfg).name
