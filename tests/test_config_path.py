"""A run's config passes each module once, downward (issue: one way to run a cell).

The trace: every Python call made while ``hfl-bench run --config FILE`` runs in this process
(``sys.setprofile``) whose arguments hold the run's settings (a ``RunConfig``, the ``ResolvedRun``
that carries it, or the mapping of settings it is built from) is an *entry* into the called
function's module when the nearest calling frame of the project is in another module. Building or
copying the ``RunConfig`` value itself (its dataclass ``__init__`` and ``__post_init__``) is not
an entry: it is the value, not a module handling it. The test asserts that no module is entered
twice and that every entry goes down the project's layers (``LAYERS``, the dependency order of
the architecture: CLI, then the run path, then resolving and the results layer, the engine, the
method API, the building blocks, config at the bottom).
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import yaml

from hfl_bench.config import FIELDS, RunConfig
from hfl_bench.resolved import ResolvedRun

OURS = ("hfl_bench", "methods", "tasks")

# Rank of a module (longest matching prefix): a call with the config may only go to a higher rank.
# The layers of ``test_imports.LAYERS`` (the import rule), told apart within a layer where a run
# passes its config from one module of the layer to another (the run path to the results layer,
# the commands to their shared options).
LAYERS = {
    "hfl_bench.cli": 0, "hfl_bench.cli.options": 0.5,  # the commands' shared options: under them
    "hfl_bench.api": 1, "hfl_bench.matrix": 1,
    "hfl_bench.runpath": 2,
    "hfl_bench.trackers": 3,
    "hfl_bench.results": 4, "hfl_bench.recording": 4, "hfl_bench.record": 8,
    "hfl_bench.resolved": 4.5, "hfl_bench.engine": 5,
    "hfl_bench.method_api": 6, "methods": 6,
    "hfl_bench.federation": 8, "hfl_bench.modalities": 7, "hfl_bench.faults": 7, "hfl_bench.partition": 7,
    "hfl_bench.clock": 7,
    "hfl_bench.data": 7, "tasks": 7, "hfl_bench.evaluation": 7, "hfl_bench.families": 7,
    "hfl_bench.paths": 8, "hfl_bench.locks": 8, "hfl_bench.registry": 8,
    "hfl_bench.config": 9, "hfl_bench.confighash": 10,
}


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"module {module} has no layer in LAYERS: add it where it belongs")
    return LAYERS[best]


def _holds_settings(value) -> bool:
    if isinstance(value, (RunConfig, ResolvedRun)):
        return True
    # a mapping of settings (what ``hfl-bench run`` builds from --config and its options); a task's
    # defaults (no method, task nor method_params) are not a run's settings
    return (isinstance(value, dict) and all(isinstance(k, str) for k in value) and set(value) <= set(FIELDS)
            and bool({"method", "task", "method_params"} & set(value)))


def _ours(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.split(".", 1)[0] in OURS else None


class EntryTrace:
    """The entries (caller module, callee module, function) of a config into modules."""

    def __init__(self):
        self.entries: list[tuple[str, str, str]] = []

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        module = _ours(frame)
        if module is None:
            return
        code = frame.f_code
        if code.co_name in ("__init__", "__post_init__") and isinstance(frame.f_locals.get("self"), RunConfig):
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if not any(_holds_settings(frame.f_locals.get(n)) for n in names):
            return
        caller = frame.f_back
        while caller is not None and _ours(caller) is None:
            caller = caller.f_back
        if caller is not None and _ours(caller) != module:
            self.entries.append((_ours(caller), module, code.co_name))


def test_a_run_config_passes_each_module_once_and_downward(tmp_path, monkeypatch):
    from hfl_bench import cli

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"method": "local", "task": "digits", "clients": 2, "rounds": 1,
                                      "local_epochs": 1, "checkpoint_every": 0}))
    monkeypatch.setattr(sys, "argv", ["hfl-bench", "run", "--config", str(config), "--out", str(tmp_path / "out"),
                                      "--quiet", "--json"])
    trace = EntryTrace()
    sys.setprofile(trace)
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
    finally:
        sys.setprofile(None)
    assert exit_info.value.code in (0, None)
    assert list((tmp_path / "out").glob("*.json")), "the run wrote no record"
    entered = Counter(callee for _, callee, _ in trace.entries)
    assert entered["hfl_bench.resolved"] == 1 and entered["hfl_bench.engine"] == 1, trace.entries  # the trace sees
    twice = {m: [e for e in trace.entries if e[1] == m] for m, n in entered.items() if n > 1}
    assert not twice, f"modules the config entered more than once: {twice}"
    upward = [e for e in trace.entries if layer(e[0]) >= layer(e[1])]
    assert not upward, f"entries that do not go down the layers: {upward}"
